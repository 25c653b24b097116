"""A whole model in the fast numerics mode keeps the exactness contract on the CPU: the same logits as
the reference interpreter bit for bit, each row of a pass as alone, drafted decoding as plain (the
CPU runs what it has no fast kernel for as the reference defines it, so this holds at every stage of
the kernels' work)."""

from __future__ import annotations

import pytest

from kinetic.compiler import compile_graph
from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import open_gguf
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.device_checks import check_drafted_equals_plain, check_greedy_equals, check_row_in_a_pass_equals_row_alone


@pytest.fixture(scope="module")
def fast_engines(smollm2_path):
    gguf = open_gguf(smollm2_path)
    graph = compile_graph(gguf, Options(numerics="fast"))
    assert any(n.attrs.order == "block_chain" for n in graph.nodes if hasattr(n.attrs, "order"))
    weights = GGUFWeights(gguf)
    return (Engine(graph, weights, n_ctx=64, device="cpu", threads=2),
            Engine(graph, weights, n_ctx=64, device="reference"))


def test_fast_cpu_equals_the_reference(fast_engines):
    """Greedy tokens, every step's logits and the cache: the CPU's bits are the reference's."""
    cpu, reference = fast_engines
    check_greedy_equals(cpu, reference, n=2)


def test_fast_rows_in_a_pass_equal_rows_alone(fast_engines):
    """A prompt in one pass gives each row its bits decoded alone (the fast orders are per row)."""
    check_row_in_a_pass_equals_row_alone(fast_engines[0])


def test_fast_drafted_equals_plain(fast_engines):
    """Drafted greedy decoding gives plain decoding's tokens and cache in the fast mode too."""
    check_drafted_equals_plain(fast_engines[0])
