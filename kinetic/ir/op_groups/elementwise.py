"""The op group of elementwise ops: the binary ones (add, mul, swiglu, geglu: equal operands), the
unary ones (scale, silu, sigmoid, gelu, softcap) and add_bias (a bias row added to every row).

Owns: their attribute dataclasses and shape inference (`binary(name)`, `unary(name)`,
`infer_add_bias`). Does not own: the table that binds them to ops and references (kinetic/ir/ops.py,
the import surface for every name here).
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.ir.op_groups.checks import activation, check, n_inputs
from kinetic.ir.types import TensorType, f32


@dataclass(frozen=True)
class ScaleAttrs:
    factor: float


@dataclass(frozen=True)
class SoftcapAttrs:
    cap: float  # cap * tanh(x / cap)


def binary(op: str):
    """The inference of the binary op named `op`: two f32 rows of one type, which the output keeps."""

    def infer(ins, a) -> TensorType:
        n_inputs(ins, 2, op)
        activation(ins[0], f"{op} input")
        check(ins[0] == ins[1], f"{op} operands differ: {ins[0]} vs {ins[1]}")
        return ins[0]

    return infer


def infer_add_bias(ins, a) -> TensorType:
    n_inputs(ins, 2, "add_bias")
    _, width = activation(ins[0], "add_bias input")
    check(ins[1] == f32(width), f"add_bias bias must be f32[{width}], got {ins[1]}")
    return ins[0]


def unary(op: str):
    """The inference of the unary op named `op`: one f32 operand, whose type the output keeps."""

    def infer(ins, a) -> TensorType:
        n_inputs(ins, 1, op)
        activation(ins[0], f"{op} input")
        return ins[0]

    return infer
