"""The Vulkan `concat` kernel (kinetic/codegen/vulkan/concat.py) against the reference interpreter
bit for bit, and the table's row for it and for a prediction block's `hidden.<width>` input."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from vulkan_helpers import bits, spirv_val

from kinetic.codegen.vulkan import concat
from kinetic.codegen.vulkan.kernels import unsupported
from kinetic.ir.text import parse_graph
from tests.codegen import kernel_cases as cases


def test_the_module_is_valid_spirv():
    """The concat module passes spirv-val (Vulkan 1.2 rules)."""
    spirv_val(concat.render_concat(*cases.CONCATS[1]).spirv)


@pytest.mark.parametrize("widths", cases.CONCATS)
def test_concat_puts_each_rows_two_parts_side_by_side(ops, widths):
    """concat gives the reference's rows (a's values, then b's) bit for bit, NaN payloads and signed
    zeros included, for every row of the pass."""
    a, b, expected = cases.concat_case(62, *widths)
    got = ops._run(concat.render_concat(*widths), [a, b], expected.shape,
                   -(-expected.size // concat.WORKGROUP), struct.pack("<I", len(a)))
    assert np.array_equal(bits(got), bits(expected))


def test_the_table_runs_concat_of_hidden_rows():
    """A graph concatenating a pass's hidden rows is accepted by Vulkan's table."""
    assert unsupported(parse_graph(cases.CONCAT_GRAPH)) is None
