"""Synthetic models whose attention sums in the fast order "key_chain_f16_acc32" (an f32 value
accumulator over the f16 cache) run on the compiled CPU step bit for bit as the reference interpreter
runs them in that order: prompts, decode, sliding windows, 64- and 128-wide heads, any thread count
and chunking. The graphs keep ggml's matmul orders, so only attention's order differs from the
default (the fast matmul orders are tested with their kernels)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kinetic.codegen.cpu.step import CompiledStep
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.graph import Graph
from kinetic.ir.ops import Op, mode_order
from kinetic.ir.rows import PassRows
from kinetic.passes import PassOptions, run_pipeline
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.synthetic import synthetic_path

FAST = "key_chain_f16_acc32"


def _fast_attention(graph: Graph) -> Graph:
    """The graph with every attention node in its fast-mode order (the verifier accepts either mode's)."""
    def fast(node):
        if node.op is not Op.ATTENTION:
            return node
        order = mode_order(node.op, [graph.node(i).type for i in node.inputs], node.attrs, "fast")
        return replace(node, attrs=replace(node.attrs, order=order))

    return Graph(tuple(fast(n) for n in graph.nodes), graph.outputs, graph.meta)


def _models(arch: str):
    gguf = open_gguf(synthetic_path(arch))
    ggml = run_pipeline(lower(gguf), PassOptions(numerics="ggml"))
    return gguf, ggml, _fast_attention(ggml)


@pytest.fixture(scope="module", params=["llama", "gemma3", "gemma3-gqa"])
def synthetic(request):
    return _models(request.param)


def _engine(gguf, graph, device="cpu", **kw) -> Engine:
    return Engine(graph, GGUFWeights(gguf), n_ctx=64, device=device, **kw)


def _logits(engine: Engine, tokens: list[int], chunk: int) -> np.ndarray:
    """Every position's logits, the tokens fed `chunk` at a time."""
    seq = engine.new_sequence()
    out = []
    for start in range(0, len(tokens), chunk):
        rows = PassRows.chain(tokens[start: start + chunk], seq.cache.length, outputs="all")
        out.extend(engine.forward(rows, {0: seq}))
    return np.stack(out)


TOKENS = [(7 * i + 3) % 200 for i in range(21)]  # past gemma3's windows of 8 and 4


def test_the_graph_asks_for_the_fast_attention_order(synthetic):
    """The fast mode gives attention over an f16 cache the f32-accumulator order, and the CPU runs
    such a graph compiled (not through a fallback)."""
    gguf, _ggml, fast = synthetic
    assert {n.attrs.order for n in fast.nodes if n.op is Op.ATTENTION} == {FAST}
    assert isinstance(_engine(gguf, fast).runner, CompiledStep)


def test_compiled_fast_attention_equals_the_reference(synthetic):
    """A prompt in one pass, and the same tokens one at a time and in chunks of 5: every position's
    logits equal the reference interpreter's in the fast order, bit for bit."""
    gguf, _ggml, fast = synthetic
    want = _logits(_engine(gguf, fast, device="reference"), TOKENS, len(TOKENS))
    for threads, chunk in ((2, len(TOKENS)), (1, 1), (3, 5)):
        got = _logits(_engine(gguf, fast, threads=threads, batch=max(chunk, 2)), TOKENS, chunk)
        assert np.array_equal(got, want), (threads, chunk)


def test_the_fast_order_is_not_the_ggml_order(synthetic):
    """The f32 accumulator changes some logits bits against ggml's f16 one (so the test above checks
    the order the graph names, not the default one)."""
    gguf, ggml, fast = synthetic
    assert not np.array_equal(_logits(_engine(gguf, fast), TOKENS, 21), _logits(_engine(gguf, ggml), TOKENS, 21))
