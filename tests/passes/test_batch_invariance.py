"""The batch-invariance pass: every reduction gets its reference's per-row order as an attribute
(IR in, IR out, idempotent, numbers unchanged), a reduction without a named order is refused, and
after the whole pipeline every reduction of the real models carries one, shown by --dump-ir."""

from __future__ import annotations

from collections import Counter
from functools import partial

import pytest

import kinetic.ir.ops as ops
from kinetic.ir.ops import REDUCE, Op, VerifyError
from kinetic.ir.text import parse_graph
from kinetic.passes import PIPELINE, PassOptions, run_pipeline
from kinetic.passes.batch_invariance import assign_reduction_orders

# ggml's orders, whatever the default mode: a graph without orders computes its specs' (ggml's) orders,
# so only these leave the numbers as they were (the fast mode's are tested in test_numerics_mode.py)
assign_ggml_orders = partial(assign_reduction_orders, numerics="ggml")

LAYER = """
%3 = param() {tensor="attn_norm"} : f32[8]
%4 = rms_norm(%2, %3) {eps=1e-05} : f32[T,8]
%5 = param() {tensor="wq"} : f32[8,8]
%6 = matmul(%4, %5) {activations="f32"} : f32[T,8]
%7 = param() {tensor="wk"} : f32[4,8]
%8 = matmul(%4, %7) {activations="q8"} : f32[T,4]
%9 = state() {name="kv.0", layer=0, n_kv_head=1, head_dim=4} : kv[]
%10 = attention(%6, %8, %8, %9) {n_head=2, n_kv_head=1, head_dim=4, scale=0.5} : f32[T,8]
%11 = rms_norm(%10) {eps=1e-06, group=4} : f32[T,8]
%12 = silu(%11) : f32[T,8]
output out = %12
"""

ORDERED = """
%3 = param() {tensor="attn_norm"} : f32[8]
%4 = rms_norm(%2, %3) {eps=1e-05, order="f64_sum"} : f32[T,8]
%5 = param() {tensor="wq"} : f32[8,8]
%6 = matmul(%4, %5) {activations="f32", order="dequant_matvec"} : f32[T,8]
%7 = param() {tensor="wk"} : f32[4,8]
%8 = matmul(%4, %7) {activations="q8", order="lanes64"} : f32[T,4]
%9 = state() {name="kv.0", layer=0, n_kv_head=1, head_dim=4} : kv[]
%10 = attention(%6, %8, %8, %9) {n_head=2, n_kv_head=1, head_dim=4, scale=0.5, order="key_chain_f16"} : f32[T,8]
%11 = rms_norm(%10) {eps=1e-06, group=4, order="f64_sum"} : f32[T,8]
%12 = silu(%11) : f32[T,8]
output out = %12
"""


def test_every_reduction_gets_its_order(check, prelude):
    """Norms get f64_sum, the float path's matmul dequant_matvec, an F32 weight's 8-bit-path matmul
    ggml's 64 lanes, attention over an f16 cache its key chain; nothing else changes."""
    check(assign_ggml_orders, prelude + LAYER, prelude + ORDERED)


def test_an_assigned_graph_is_left_as_it_is(check, prelude):
    """Orders already written are the ones the pass would write: it returns the same graph."""
    check(assign_ggml_orders, prelude + ORDERED, prelude + ORDERED)


def test_a_reduction_whose_spec_names_no_order_is_refused(prelude, monkeypatch):
    """A reducing op added without an order function stops the pass, naming the op."""
    from dataclasses import replace

    monkeypatch.setitem(ops.OPS, Op.RMS_NORM, replace(ops.OPS[Op.RMS_NORM], order=None))
    with pytest.raises(VerifyError, match="rms_norm reduces but its spec names no order"):
        assign_reduction_orders(parse_graph(prelude + LAYER))


def test_the_pipeline_ends_with_the_batch_invariance_phase():
    """It runs last, after fusion, so reductions a fusion makes get their order too."""
    assert PIPELINE[-1].name == "batch_invariance" and PIPELINE[-1].option is None


@pytest.mark.parametrize("fixture,numerics,orders", [
    ("smollm2_path", "ggml", {"lanes8", "f64_sum", "key_chain_f16"}),  # Q4_1 and Q8_0 weights
    ("gemma_path", "ggml", {"lanes8", "block_chain", "f64_sum", "key_chain_f16"}),  # Q5_0, Q8_0, Q6_K; Q4_K
    ("smollm2_path", "fast", {"block_chain", "f64_sum", "key_chain_f16_acc32"}),
    ("gemma_path", "fast", {"block_chain", "f64_sum", "key_chain_f16_acc32"}),
])
def test_real_models_carry_an_order_on_every_reduction(fixture, numerics, orders, request):
    """After the pipeline in each numerics mode every matmul, norm and attention of the real models
    has a non-empty order, and the orders are those of their weight types in that mode."""
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower

    graph = run_pipeline(lower(open_gguf(request.getfixturevalue(fixture))), PassOptions(numerics=numerics))
    reductions = [n for n in graph.nodes if n.op in REDUCE]
    assert reductions and all(n.attrs.order for n in reductions)
    assert set(Counter(n.attrs.order for n in reductions)) == orders


def test_dump_ir_shows_the_orders(smollm2_path, tmp_path, capsys):
    """`kinetic compile --dump-ir`: the fusion dump has no order, the batch-invariance dump (the last
    for the reference, which has no device phase) has one on every matmul, rms_norm and attention line."""
    from kinetic.cli.main import main

    assert main(["compile", str(smollm2_path), "--dump-ir", str(tmp_path), "--device", "reference"]) == 0
    dumps = sorted(tmp_path.glob("*.ir"))
    assert dumps[-1].name.endswith("-batch_invariance.ir")
    assert "order=" not in dumps[-2].read_text()
    lines = [ln for ln in dumps[-1].read_text().splitlines() if " = matmul(" in ln or " = rms_norm(" in ln
             or " = attention(" in ln]
    assert lines and all('order="' in ln for ln in lines)
