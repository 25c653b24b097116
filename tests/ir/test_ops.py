"""The op table: one spec per op, read by the verifier, the text form and the interpreter."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kinetic.ir import ops
from kinetic.ir.graph import GraphBuilder
from kinetic.ir.interpreter import Interpreter, evaluate
from kinetic.ir.ops import OPS, Group, Op, ScaleAttrs, VerifyError, infer_type
from kinetic.ir.rows import PassRows
from kinetic.ir.text import parse_graph, print_graph
from kinetic.ir.types import f32


def test_every_op_has_one_spec():
    """Every op has a spec with a frozen attribute dataclass, a reference function, and an `infer`
    function unless it is a leaf that carries its type."""
    assert set(OPS) == set(Op)
    for op, spec in OPS.items():
        assert dataclasses.is_dataclass(spec.attrs) and spec.attrs.__dataclass_params__.frozen, op
        assert callable(spec.reference), op
        assert spec.infer is not None or Group.LEAF in spec.groups, op


def test_op_sets_come_from_the_spec_groups():
    """LEAVES, ELEMENTWISE and REDUCE are the ops whose spec names the group, and nothing else."""
    assert ops.LEAVES == {Op.INPUT, Op.PARAM, Op.STATE, Op.RECURRENT_STATE}
    assert ops.REDUCE == {Op.MATMUL, Op.RMS_NORM, Op.ATTENTION, Op.ADD_RMS_NORM, Op.LAYER_NORM, Op.MOE_MATMUL}
    assert ops.ELEMENTWISE == {Op.ADD, Op.MUL, Op.SCALE, Op.SILU, Op.SIGMOID, Op.GELU, Op.SOFTCAP, Op.SWIGLU,
                               Op.GEGLU}


def test_add_bias_takes_a_vector_of_the_row_width():
    """add_bias(x f32[T,n], bias f32[n]) is f32[T,n]; a bias of another width or type is refused."""
    x = f32("T", 8)
    assert infer_type(Op.ADD_BIAS, [x, f32(8)], ops.NoAttrs()) == x
    for bias in (f32(4), f32("T", 8)):
        with pytest.raises(VerifyError, match="bias must be f32\\[8\\]"):
            infer_type(Op.ADD_BIAS, [x, bias], ops.NoAttrs())


def test_columns_takes_a_range_within_the_row():
    """columns(x f32[T,n]) {start, count} is f32[T,count] when the range lies within the row, and its
    value is those columns; a range past the row's end, or empty, is refused."""
    x = f32("T", 8)
    assert infer_type(Op.COLUMNS, [x], ops.ColumnsAttrs(2, 6)) == f32("T", 6)
    for start, count in ((3, 6), (0, 0), (-1, 2)):
        with pytest.raises(VerifyError, match="not within the 8"):
            infer_type(Op.COLUMNS, [x], ops.ColumnsAttrs(start, count))
    values = np.arange(16, dtype=np.float32).reshape(2, 8)
    assert np.array_equal(evaluate(Op.COLUMNS, [values], ops.ColumnsAttrs(5, 3)), values[:, 5:8])


def test_leaves_that_carry_their_type_are_not_inferred():
    """A weight's or a cache's type is the node's own: asking to infer it raises."""
    with pytest.raises(VerifyError, match="carry their type"):
        infer_type(Op.PARAM, [], ops.ParamAttrs("w"))


def test_wrong_attributes_are_refused():
    """An op given another op's attribute dataclass is a VerifyError naming the one it needs."""
    with pytest.raises(VerifyError, match="ScaleAttrs"):
        infer_type(Op.SCALE, [f32("T", 8)], ops.NoAttrs())


def _add_graph():
    b = GraphBuilder()
    tokens = b.add(Op.INPUT, attrs=ops.InputAttrs("tokens"))
    table = b.param("t", f32(4, 8))
    x = b.add(Op.EMBED, (table, tokens))
    b.output("y", b.add(Op.ADD, (x, x)))
    return b.build()


class _Weights:
    def tensor(self, name):
        return np.arange(32, dtype=np.float32).reshape(4, 8)


def test_the_interpreter_runs_each_node_by_its_specs_reference(monkeypatch):
    """Replacing an op's reference in the table changes what the interpreter computes: its dispatch
    is the table, not a list of its own."""
    graph = _add_graph()
    rows = PassRows.chain([1, 3], 0, outputs="all")
    before = Interpreter(_Weights()).run(graph, rows, kv=None).outputs["y"]
    np.testing.assert_array_equal(before, 2 * np.arange(32, dtype=np.float32).reshape(4, 8)[[1, 3]])
    zeros = dataclasses.replace(OPS[Op.ADD], reference=lambda ev, node, x: np.zeros_like(x[0]))
    monkeypatch.setitem(OPS, Op.ADD, zeros)
    after = Interpreter(_Weights()).run(graph, rows, kv=None).outputs["y"]
    assert not after.any()


@dataclasses.dataclass(frozen=True)
class _OtherScaleAttrs:
    factor: float
    extra: int = 7


def test_the_text_form_reads_attributes_from_the_spec(monkeypatch):
    """The parser builds a node's attributes with the dataclass its op's spec names (defaults
    filled in), and the printer writes them back: both read the table."""
    other = dataclasses.replace(OPS[Op.SCALE], attrs=_OtherScaleAttrs)
    monkeypatch.setitem(OPS, Op.SCALE, other)
    text = '%0 = input() {name="tokens"} : i32[T]\n%1 = scale(%0) {factor=2} : i32[T]\n'
    graph = parse_graph(text, check_types=False)
    assert graph.node(1).attrs == _OtherScaleAttrs(2.0, 7)
    assert "{factor=2.0, extra=7}" in print_graph(graph)


@pytest.mark.parametrize("op", sorted(ops.ELEMENTWISE, key=lambda o: o.value))
def test_evaluate_is_the_interpreters_value(op):
    """evaluate(op, values) (what kernel tests compare against) is the interpreter's result for a
    graph of that one op, bit for bit."""
    rng = np.random.default_rng(5)
    a, c = (rng.standard_normal((3, 16)) * 3).astype(np.float32), rng.standard_normal((3, 16)).astype(np.float32)
    attrs = {Op.SCALE: ScaleAttrs(0.3), Op.SOFTCAP: ops.SoftcapAttrs(5.0)}.get(op)
    binary = op in (Op.ADD, Op.MUL, Op.SWIGLU, Op.GEGLU)

    class Values:
        def tensor(self, name):
            return {"a": a, "c": c}[name]

    b = GraphBuilder()
    ids = b.add(Op.INPUT, attrs=ops.InputAttrs("tokens"))
    xs = [b.add(Op.EMBED, (b.param(name, f32(3, 16)), ids)) for name in ("a", "c")]
    b.output("y", b.add(op, tuple(xs[: 1 + binary]), attrs))
    rows = PassRows.chain([0, 1, 2], 0, outputs="all")
    want = Interpreter(Values()).run(b.build(), rows, kv=None).outputs["y"]
    got = evaluate(op, [a, c] if binary else [a], attrs)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
