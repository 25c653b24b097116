"""The Vulkan `concat` kernel (kinetic/codegen/vulkan/concat.py) against the reference interpreter
bit for bit, and the table's row for it and for a prediction block's `hidden.<width>` input."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from vulkan_helpers import bits, spirv_val

from kinetic.codegen.vulkan import concat
from kinetic.codegen.vulkan.kernels import unsupported
from kinetic.ir import reference
from kinetic.ir.text import parse_graph

F32 = np.float32
# widths: a prediction block's two 256s; a first part ending inside a workgroup, a row past one
# workgroup; widths smaller than a workgroup
CONCATS = [(256, 256), (300, 40), (7, 5)]


def test_the_module_is_valid_spirv():
    """The concat module passes spirv-val (Vulkan 1.2 rules)."""
    spirv_val(concat.render_concat(*CONCATS[1]).spirv)


@pytest.mark.parametrize("widths", CONCATS)
def test_concat_puts_each_rows_two_parts_side_by_side(ops, widths):
    """concat gives the reference's rows (a's values, then b's) bit for bit, NaN payloads and signed
    zeros included, for every row of the pass."""
    wa, wb = widths
    rows = 5
    rng = np.random.default_rng(62)
    a = rng.integers(0, 2**32, (rows, wa), dtype=np.uint32).view(F32)
    b = rng.integers(0, 2**32, (rows, wb), dtype=np.uint32).view(F32)
    got = ops._run(concat.render_concat(wa, wb), [a, b], (rows, wa + wb),
                   -(-rows * (wa + wb) // concat.WORKGROUP), struct.pack("<I", rows))
    assert np.array_equal(bits(got), bits(reference.concat(None, None, [a, b])))


GRAPH = """
%0 = input() {name="hidden.40"} : f32[T,40]
%1 = input() {name="hidden.40"} : f32[T,40]
%2 = concat(%0, %1) : f32[T,80]
output y = %2
"""


def test_the_table_runs_concat_of_hidden_rows():
    """A graph concatenating a pass's hidden rows is accepted by Vulkan's table."""
    assert unsupported(parse_graph(GRAPH)) is None
