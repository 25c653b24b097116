"""The `concat` op as CUDA C: each row of two f32 tensors side by side (a prediction block's embedded
token and trunk row, kinetic/frontend/mtp_block.py).

Owns: `concat`, specialized to the two widths: one thread per value of an output row, one block row
per pass row; the values' bits are copied as they are (NaN payloads included), as the reference
(kinetic/ir/reference.py's `concat`, numpy's concatenate) does. Does not own the op's meaning or
type (kinetic/ir/op_groups/lookups.py), nor where its buffers live (plan.py).
"""

from __future__ import annotations

from kinetic.codegen.cuda.kernel import Kernel, Param

CONCAT_THREADS = 256  # one thread per value of an output row


def concat(width_a: int, width_b: int) -> Kernel:
    """out f32 [rows, width_a + width_b] = row `row` of a f32 [rows, width_a], then of b f32 [rows,
    width_b]."""
    params = (Param("a", "const float*"), Param("b", "const float*"), Param("out", "float*"))
    width = width_a + width_b
    body = f"""\
  enum {{ WA = {width_a}, WB = {width_b}, W = {width} }};
BODY
  LANES {{
    const int i = BX * {CONCAT_THREADS} + TID;
    if (i < WA) ST(u32, out, (long)BY * W + i, LD(u32, a, (long)BY * WA + i));
    else if (i < W) ST(u32, out, (long)BY * W + i, LD(u32, b, (long)BY * WB + i - WA));
  }}
"""
    return Kernel(f"concat_a{width_a}_b{width_b}", "gather", CONCAT_THREADS, -(-width // CONCAT_THREADS),
                  params, body)
