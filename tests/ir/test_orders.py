"""Reduction orders in the op table: every reduction's spec names its order and its attributes carry
it, the order follows the reference's branches, the verifier refuses an order that is not the
reference's, and the text form round-trips it."""

from __future__ import annotations

from dataclasses import fields

import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.ir.graph import verify
from kinetic.ir.ops import OPS, REDUCE, Group, Op, VerifyError, mode_order, reduction_order
from kinetic.ir.orders import ORDERS, weight_order
from kinetic.ir.quants import QUANT_TYPES
from kinetic.ir.text import IRParseError, parse_graph, print_graph
from kinetic.ir.types import f32, param_type


def test_every_reduction_names_its_order_and_nothing_else_does():
    """An op reduces exactly when its spec names an order function and its attributes end with an
    `order` field that defaults to "" (not assigned yet)."""
    assert {Op.MATMUL, Op.RMS_NORM, Op.ATTENTION} <= REDUCE
    for op, spec in OPS.items():
        names = [f.name for f in fields(spec.attrs)]
        if Group.REDUCE in spec.groups:
            assert spec.order is not None, op
            assert names[-1] == "order" and spec.attrs.__dataclass_fields__["order"].default == "", op
        else:
            assert spec.order is None and "order" not in names, op


@pytest.mark.parametrize("wtype,want", [
    (Q.Q8_0, "lanes8"), (Q.Q4_1, "lanes8"), (Q.Q5_0, "lanes8"), (Q.Q5_1, "lanes8"), (Q.Q6_K, "lanes8"),
    (Q.Q3_K, "lanes8"), (Q.Q5_K, "lanes8"), (Q.IQ4_XS, "lanes8"),
    (Q.Q4_0, "block_chain"), (Q.Q4_K, "block_chain"), (Q.Q2_K, "block_chain"), (Q.IQ4_NL, "block_chain"),
    (Q.MXFP4, "block_chain"),
    (Q.F16, "lanes64"), (Q.F32, "lanes64"), (Q.BF16, "bf16_pairs"),
    (Q.IQ2_XS, "dequant_matvec"), (Q.TQ1_0, "dequant_matvec"),
], ids=lambda v: getattr(v, "name", v))
def test_a_matmul_order_follows_the_reference_branch_of_its_weight_type(wtype, want):
    """dots.matmul's branch for each weight type with 8-bit (own-format) activations, and the float
    path (activations="f32") is the dequantized product for every type."""
    assert weight_order(wtype) == want
    assert weight_order(wtype, "f32") == "dequant_matvec"


def test_every_order_a_spec_can_give_is_named():
    """Whatever the weight type or cache type, the order given is one ORDERS describes."""
    given = {weight_order(t, a) for t in QUANT_TYPES for a in ("q8", "f32")}
    given |= {OPS[Op.RMS_NORM].order([f32("T", 8)], None), OPS[Op.LAYER_NORM].order([f32("T", 8)], None)}
    given |= {reduction_order(Op.ATTENTION, [], OPS[Op.ATTENTION].attrs(1, 1, 4, 0.5, kv_dtype=d))
              for d in ("f16", "f32")}
    given |= {mode_order(Op.ATTENTION, [], OPS[Op.ATTENTION].attrs(1, 1, 4, 0.5, kv_dtype=d), "fast")
              for d in ("f16", "f32")}  # "key_chain_f16_acc32": the fast mode's over an f16 cache
    assert given == set(ORDERS)


def test_non_reductions_have_no_order():
    """reduction_order is None for an op that does not sum (elementwise, rotary, lookups)."""
    assert reduction_order(Op.ADD, [f32("T", 8)] * 2, OPS[Op.ADD].attrs()) is None
    assert reduction_order(Op.EMBED, [param_type(Q.F32, (16, 8)), f32("T")], OPS[Op.EMBED].attrs()) is None


MATMUL = """
%0 = input() {name="tokens"} : i32[T]
%1 = param() {tensor="token_embd.weight"} : f32[16,64]
%2 = embed(%1, %0) : f32[T,64]
%3 = param() {tensor="w"} : q8_0[8,64]
%4 = matmul(%2, %3) {activations="q8"ORDER} : f32[T,8]
output out = %4
"""


def test_the_verifier_refuses_an_order_that_is_not_the_references():
    """A q8_0 matmul written with order="lanes64" (F16's) is refused at its line, naming the orders it
    may have (ggml's and the fast mode's); those two and an empty one (not assigned yet) are accepted."""
    with pytest.raises(IRParseError, match=r"line 6: matmul order 'lanes64' .*\('block_chain', 'lanes8'\)"):
        parse_graph(MATMUL.replace("ORDER", ', order="lanes64"'))
    with pytest.raises(VerifyError, match="lanes64"):
        verify(parse_graph(MATMUL.replace("ORDER", ', order="lanes64"'), check_types=False))
    for order in ("lanes8", "block_chain"):
        assert parse_graph(MATMUL.replace("ORDER", f', order="{order}"')).node(4).attrs.order == order
    assert parse_graph(MATMUL.replace("ORDER", "")).node(4).attrs.order == ""


def test_the_text_form_prints_an_assigned_order_and_leaves_out_an_empty_one():
    """An assigned order prints and reads back; an empty one (before the batch-invariance pass) is not
    printed, so lowered dumps read as before."""
    assigned = parse_graph(MATMUL.replace("ORDER", ', order="lanes8"'))
    text = print_graph(assigned)
    assert '{activations="q8", order="lanes8"}' in text
    assert parse_graph(text) == assigned
    empty = print_graph(parse_graph(MATMUL.replace("ORDER", "")))
    assert "order" not in empty and '{activations="q8"}' in empty
