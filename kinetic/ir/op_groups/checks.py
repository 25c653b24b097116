"""The checks every op group's shape inference uses, and the error they raise.

Owns: `VerifyError` (an op's inputs or attributes do not fit its spec; kinetic.ir.ops re-exports it),
`check`, `activation` (an f32[rows, width] operand) and `n_inputs`. Does not own any op.
"""

from __future__ import annotations

from kinetic.ir.types import TensorType


class VerifyError(ValueError):
    """An op's inputs or attributes do not fit its spec."""


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise VerifyError(msg)


def activation(t: TensorType, what: str) -> tuple:
    check(t.dtype == "f32" and len(t.shape) == 2, f"{what} must be f32[rows, width], got {t}")
    return t.shape


def n_inputs(ins: list[TensorType], n: int, op: str) -> None:
    """`op` (its name in the text form) takes exactly n inputs."""
    check(len(ins) == n, f"{op} takes {n} inputs, got {len(ins)}")
