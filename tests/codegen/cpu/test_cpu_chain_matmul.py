"""The quantized matmul kernels of Q8_0, Q4_1, Q5_0 and Q5_1 in the "block_chain" order (issue 23's
fast numerics mode) against numerics.matmul(..., order="block_chain"), bit for bit, on every path:
16-row lane tiles (matmul_b32_lanes_ir), rows-as-lanes tiles of 8 and column quads (decode, and rows
left below a tile in groups of 4, 3, 2 sharing each decoded block)."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_kernel_helpers import HOST_VARIANTS, assert_bits, chain_case, chain_reference, random_weight, variant_params
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.matmul import quantized_matmul
from kinetic.codegen.cpu.matmul_ir import render_matmul
from kinetic.codegen.cpu.target import host

CHAIN = [Q.Q8_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
ROWS = (1, 2, 3, 4, 5, 7, 15, 16, 17, 33)  # decode, the quads' row groups, a tile of 16 and one past it, two and one past
BEST = host().best_variant()


@pytest.mark.parametrize("variant", variant_params)
@pytest.mark.parametrize("wtype", CHAIN, ids=lambda t: t.name)
def test_every_row_count_equals_the_reference_bit_for_bit(jit, wtype, variant):
    """For K in 32 .. 2048 (the host's best variant; 64 and 576 on the others) and M rows in 1, 2, 3,
    4, 5, 7, 15, 16, 17, 33, every output is the reference's block_chain value, bit for bit."""
    ks = (32, 64, 576, 1536, 2048) if variant == BEST else (64, 576)
    for k in ks:
        x, w = chain_case(wtype, 37, k, max(ROWS))
        want = chain_reference(x, w, wtype)
        for m in ROWS:
            got = quantized_matmul(x[:m], w, wtype, jit=jit, variant=variant, order="block_chain")
            assert_bits(got, want[:m], f"{variant} K={k} M={m}")


@pytest.mark.parametrize("wtype", CHAIN, ids=lambda t: t.name)
def test_a_prompt_of_512_rows_over_threads_equals_the_reference(jit, wtype):
    """512 rows (32 lane tiles) of a weight with an odd column count, split over 1, 2 and 3 threads,
    give the reference's bits: the threads' column ranges and the chunks never change a value."""
    x, w = chain_case(wtype, 301, 576, 512, seed=1)
    want = chain_reference(x, w, wtype)
    for threads in (1, 2, 3):
        assert_bits(quantized_matmul(x, w, wtype, jit=jit, threads=threads, order="block_chain"), want,
                     f"{threads} threads")


@pytest.mark.parametrize("wtype", CHAIN, ids=lambda t: t.name)
def test_one_row_over_column_ranges_of_any_width_equals_the_reference(jit, wtype):
    """One row (decode: eight columns a block step) over N = 1 .. 23 columns split over 1, 2 and 3
    threads (ranges shorter than, equal to and past eight) gives the reference's bits for every output."""
    for n in (1, 5, 8, 9, 16, 23):
        x, w = chain_case(wtype, n, 96, 1, seed=4)
        want = chain_reference(x, w, wtype)
        for threads in (1, 2, 3):
            got = quantized_matmul(x, w, wtype, jit=jit, threads=threads, order="block_chain")
            assert_bits(got, want, f"N={n} threads={threads}")


@pytest.mark.parametrize("wtype", [Q.Q8_0, Q.Q4_1], ids=lambda t: t.name)
def test_a_long_row_equals_the_reference(jit, wtype):
    """K = 8192 (256 blocks in one chain, Gemma's and larger models' FFN widths), 17 rows."""
    x, w = chain_case(wtype, 9, 8192, 17, seed=2)
    assert_bits(quantized_matmul(x, w, wtype, jit=jit, order="block_chain"), chain_reference(x, w, wtype), "K=8192")


@pytest.mark.parametrize("wtype", CHAIN, ids=lambda t: t.name)
def test_tiles_and_the_narrow_path_give_the_same_bits(jit, wtype):
    """Tiles of 1, 4, 8 and 16 rows, with and without the 16-row lane tiles, give the same bits for
    every row: the tile is a speed choice (kinetic compile --tune) and never a value."""
    x, w = chain_case(wtype, 45, 640, 37, seed=3)
    base = quantized_matmul(x, w, wtype, jit=jit, tile=1, order="block_chain")
    for tile in (4, 8, 16):
        for wide in (True, False):
            got = quantized_matmul(x, w, wtype, jit=jit, tile=tile, wide=wide, order="block_chain")
            assert_bits(got, base, f"tile {tile} wide {wide}")


def test_extreme_blocks_equal_the_reference_in_every_variant(jit):
    """Weights at their extremes (Q8_0 bytes -128 and 127; Q4_1, Q5_0, Q5_1 quants all 0 or all at
    their maximum) against activations of +-127: no variant's integer sums clip (VNNI reads Q8_0 as
    q + 128 and takes 128 * sum(x) back, Q5_0's 16 likewise)."""
    k = 64
    x = np.where(np.arange(k) % 2 == 0, 1.0, -1.0).astype(np.float32)[None, :].repeat(17, 0)
    x[1::2] = 1.0
    quants_at = {Q.Q8_0: 2, Q.Q4_1: 4, Q.Q5_0: 2, Q.Q5_1: 4}  # the bytes after the f16 scales
    fills = {Q.Q8_0: (128, 127)}
    for wtype in CHAIN:
        w = random_weight(np.random.default_rng(4), wtype, 8, k)
        blocks = w.reshape(8, k // 32, -1)
        for n, value in enumerate(fills.get(wtype, (0, 255)) * 4):
            blocks[n, :, quants_at[wtype]:] = value
        for variant in HOST_VARIANTS:
            got = quantized_matmul(x, w, wtype, jit=jit, variant=variant, order="block_chain")
            assert_bits(got, chain_reference(x, w, wtype), f"{wtype.name} {variant}")


def test_the_ggml_order_by_name_is_the_default_kernel():
    """order=None and the type's ggml order by name render the same kernel; "block_chain" renders
    another (its own name, so both can live in one JIT)."""
    default = render_matmul(Q.Q4_1, 576, "vnni", 8)
    assert render_matmul(Q.Q4_1, 576, "vnni", 8, order="lanes8") == default
    chain = render_matmul(Q.Q4_1, 576, "vnni", 8, order="block_chain")
    assert chain[1] != default[1]
    assert render_matmul(Q.Q4_K, 256, "vnni", 8, order="block_chain") == render_matmul(Q.Q4_K, 256, "vnni", 8)


@pytest.mark.parametrize("wtype,order", [(Q.Q4_K, "lanes8"), (Q.Q6_K, "lanes64"), (Q.Q8_0, "lanes64")])
def test_an_order_the_kernels_do_not_follow_is_refused(jit, wtype, order):
    """A type asked for an order its kernels do not build raises ValueError instead of summing in another."""
    with pytest.raises(ValueError, match="order"):
        render_matmul(wtype, 256, "vnni", 8, order=order)


GRAPH = """
%0 = input() {{name="tokens"}} : i32[T]
%1 = input() {{name="output_rows"}} : i32[R]
%2 = param() {{tensor="token_embd.weight"}} : q8_0[24,{k}]
%3 = embed(%2, %0) : f32[T,{k}]
%4 = param() {{tensor="w"}} : {wtype}[{n},{k}]
%5 = matmul(%3, %4) {{activations="q8"}} : f32[T,{n}]
%6 = take_rows(%5, %1) : f32[R,{n}]
output logits = %6
"""


class _Weights:
    def __init__(self, wtype: Q, n: int, k: int):
        from tests.random_tensors import random_tensor

        rng = np.random.default_rng(5)
        self.arrays = {"token_embd.weight": random_tensor(rng, Q.Q8_0, (24, k)), "w": random_tensor(rng, wtype, (n, k))}

    def tensor(self, name: str) -> np.ndarray:
        return self.arrays[name]


@pytest.mark.parametrize("wtype", CHAIN, ids=lambda t: t.name)
def test_the_compiled_step_in_fast_numerics_is_the_reference(wtype):
    """A graph optimized in the fast numerics mode (its matmul ordered "block_chain") gives on the
    CPU's compiled step the reference interpreter's bits, for a pass of 17 rows: lowering hands the
    node's order to the kernel."""
    from kinetic.ir.ops import Op
    from kinetic.ir.rows import PassRows
    from kinetic.ir.text import parse_graph
    from kinetic.passes import PassOptions, run_pipeline
    from kinetic.runtime.engine import Engine

    n, k = 40, 576
    graph = run_pipeline(parse_graph(GRAPH.format(k=k, n=n, wtype=wtype.name.lower())), PassOptions(numerics="fast"))
    assert [node.attrs.order for node in graph.nodes if node.op is Op.MATMUL] == ["block_chain"]
    tokens = np.random.default_rng(6).integers(0, 24, 17).tolist()
    logits = {}
    for device in ("reference", "cpu"):
        engine = Engine(graph, _Weights(wtype, n, k), n_ctx=32, batch=32, device=device, threads=2)
        try:
            logits[device] = engine.forward(PassRows.chain(tokens, 0, outputs="all"), {0: engine.new_sequence()})
        finally:
            engine.close()
    assert_bits(logits["cpu"], logits["reference"], "cpu vs reference")


def test_the_op_by_op_executor_follows_the_node_order():
    """The CPU's op-by-op interpreter (CpuInterpreter, the MoE steps' and segments' matmuls) gives a
    block_chain matmul node the reference's block_chain bits, not the ggml order's."""
    from kinetic.codegen.cpu.executor import CpuInterpreter
    from kinetic.ir.ops import Op
    from kinetic.ir.text import parse_graph
    from kinetic.passes import PassOptions, run_pipeline

    n, k = 40, 576
    graph = run_pipeline(parse_graph(GRAPH.format(k=k, n=n, wtype="q4_1")), PassOptions(numerics="fast"))
    node = next(node for node in graph.nodes if node.op is Op.MATMUL)
    weights = _Weights(Q.Q4_1, n, k)
    x = np.random.default_rng(7).standard_normal((5, k)).astype(np.float32)
    got = CpuInterpreter(weights).matmul(x, graph.node(node.inputs[1]), node.attrs)
    assert_bits(got, chain_reference(x, weights.tensor("w").reshape(n, -1), Q.Q4_1), "executor")


def test_the_shortlist_head_scores_in_the_output_matmul_order():
    """Shortlist's exact rescoring of the output layer (shortlist.OutputHead) calls the kernel of the
    output matmul's order: in the fast mode a Q8_0 head's block_chain kernel, so the logits it gives
    are the full layer's."""
    from kinetic.codegen.cpu.shortlist import open_head
    from kinetic.codegen.cpu.step_kernels import StepKernels
    from kinetic.ir.text import parse_graph
    from kinetic.passes import PassOptions, run_pipeline

    text = GRAPH.format(k=576, n=40, wtype="q8_0").replace(
        "%6 = take_rows(%5, %1) : f32[R,40]\noutput logits = %6", "output logits = %5")
    kernels = StepKernels()
    for mode, order in (("ggml", None), ("fast", "block_chain")):
        graph = run_pipeline(parse_graph(text), PassOptions(numerics=mode))
        head = open_head(graph, _Weights(Q.Q8_0, 40, 576), threads=1)
        assert head is not None and head._exact == kernels.matmul(Q.Q8_0, 576, order), mode
    assert kernels.matmul(Q.Q8_0, 576, "block_chain") != kernels.matmul(Q.Q8_0, 576)
