"""Helpers for pass tests: Before/Expected IR text, idempotence, and a numeric check through the
reference interpreter with random weights (f32, or quantized blocks with small f16 scales) and an
empty KV cache."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.ir.graph import Graph, verify
from kinetic.ir.interpreter import Interpreter
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassRows
from kinetic.ir.text import parse_graph, print_graph
from tests.random_tensors import random_tensor


class RandomWeights:
    """A WeightSource: a fixed random tensor for every parameter of a graph, stored as a GGUF file
    holds it (f32 values; quantized types as raw blocks [rows, row_bytes] with small f16 scales)."""

    def __init__(self, graph: Graph, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.arrays = {n.attrs.tensor: random_tensor(rng, n.type.ggml_type, n.type.shape) for n in graph.params()}

    def tensor(self, name: str) -> np.ndarray:
        return self.arrays[name]


class EmptyKV:
    """A KVView of sequences with nothing committed yet."""

    def __init__(self, graph: Graph):
        self.width = {n.attrs.layer: n.attrs.n_kv_head * n.attrs.head_dim for n in graph.nodes if n.op is Op.STATE}

    def committed(self, seq: int, layer: int):
        w = self.width[layer]
        return np.zeros((0, w), np.float16), np.zeros((0, w), np.float16), np.zeros(0, np.int32)


def run_reference(graph: Graph, weights: RandomWeights, n_tokens: int = 5, seed: int = 1) -> dict:
    """The graph's outputs on random tokens (every row an output row)."""
    embed = next(n for n in graph.nodes if n.op is Op.EMBED)
    vocab = graph.node(embed.inputs[0]).type.shape[0]
    tokens = np.random.default_rng(seed).integers(0, vocab, n_tokens)
    rows = PassRows.chain(tokens, 0, outputs="all")
    return Interpreter(weights).run(graph, rows, EmptyKV(graph)).outputs


def assert_same_numbers(before: Graph, after: Graph) -> None:
    """Both graphs give bit for bit the same outputs on the same random weights and tokens."""
    weights = RandomWeights(before)
    want, got = run_reference(before, weights), run_reference(after, weights)
    assert want.keys() == got.keys()
    for name in want:
        assert want[name].dtype == got[name].dtype
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"output {name}")


def check_rewrite(run_pass, before_text: str, expected_text: str, *, numeric: bool = True) -> Graph:
    """Before/Expected: the pass turns `before` into `expected` (compared as printed IR), the
    result verifies, running the pass again changes nothing, and the numbers agree."""
    before = parse_graph(before_text)
    verify(before)
    after = run_pass(before)
    verify(after)
    assert print_graph(after) == print_graph(parse_graph(expected_text))
    assert run_pass(after) == after, "the pass is not idempotent"
    if numeric:
        assert_same_numbers(before, after)
    return after


# The start of most test graphs: token ids through an f32 embedding table, so activations are random.
PRELUDE = """
%0 = input() {name="tokens"} : i32[T]
%1 = param() {tensor="token_embd.weight"} : f32[16,8]
%2 = embed(%1, %0) : f32[T,8]
"""


@pytest.fixture
def check():
    return check_rewrite


@pytest.fixture
def same_numbers():
    return assert_same_numbers


@pytest.fixture
def prelude():
    return PRELUDE
