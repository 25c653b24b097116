"""The Vulkan kernels of the recurrent families' stateless ops (kinetic/codegen/vulkan/recurrent.py:
qwen35's sigmoid and head_columns) against the reference (kinetic/ir/delta_reference.py), and the
table's rows for the recurrent ops (their kernels: test_vulkan_recurrent_scan.py)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from vulkan_helpers import assert_reference, bits, spirv_val

from kinetic.codegen.vulkan import recurrent
from kinetic.codegen.vulkan.attention import expf_table_words
from kinetic.codegen.vulkan.kernels import unsupported
from kinetic.ir.numerics import recurrent as rnum
from kinetic.ir.text import parse_graph
from tests.codegen import kernel_cases as cases

F32 = np.float32


def test_the_modules_are_valid_spirv():
    """The sigmoid and head_columns modules pass spirv-val (Vulkan 1.2 rules)."""
    for kernel in (recurrent.render_sigmoid(), recurrent.render_head_columns(*cases.HEAD_COLUMNS[2])):
        spirv_val(kernel.spirv)


def _sigmoid_inputs() -> np.ndarray:
    """Values across expf's whole range: random of every scale, the overflow and underflow edges,
    signed zeros, infinities and subnormals."""
    rng = np.random.default_rng(60)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 88.72, -88.72, 103.9, -103.9, 87.0, -87.5, 1e-40, -1e-40,
                        20.0, -20.0], F32)
    scaled = rng.standard_normal(3000) * np.float32(10) ** rng.integers(-6, 3, 3000)
    return np.concatenate([special, scaled.astype(F32)])


def test_sigmoid_equals_the_reference(ops, device):
    """sigmoid gives numerics.recurrent.sigmoid's bits (glibc's expf, an add and a divide) on CPU
    devices, whose division is exact; within an ulp or two elsewhere (Vulkan's 2.5-ulp division)."""
    x = _sigmoid_inputs()
    groups = -(-x.size // recurrent.WORKGROUP)
    got = ops._run(recurrent.render_sigmoid(), [x, expf_table_words()], x.shape, groups, struct.pack("<I", x.size))
    with np.errstate(over="ignore"):
        expected = rnum.sigmoid(x)
    assert_reference(got, expected, exact=device.caps.is_cpu and device.target.fma_mode != "unfused", rtol=5e-7)


@pytest.mark.parametrize("shape", cases.HEAD_COLUMNS)
def test_head_columns_copies_each_heads_slice(ops, shape):
    """head_columns gives each head's columns start .. start + count - 1, heads side by side, bit for
    bit (NaN payloads and signed zeros included)."""
    x, expected = cases.head_columns_case(61, *shape)
    got = ops._run(recurrent.render_head_columns(*shape), [x], expected.shape,
                   -(-expected.size // recurrent.WORKGROUP), struct.pack("<I", len(x)))
    assert np.array_equal(bits(got), bits(expected))


GRAPH = """
%0 = input() {name="tokens"} : i32[T]
%1 = param() {tensor="token_embd.weight"} : q8_0[24,64]
%2 = embed(%1, %0) : f32[T,64]
%3 = head_columns(%2) {n_head=2, stride=32, start=16, count=16} : f32[T,32]
%4 = sigmoid(%3) : f32[T,32]
output y = %4
"""


CONV = """
%5 = param() {tensor="conv.weight"} : f32[32,3]
%6 = scale(%5) {factor=2.0} : f32[32,3]
%7 = recurrent_state() {name="conv.0", layer=0} : rs[2,32]
%8 = short_conv(%4, TAPS, %7) : f32[T,32]
output z = %8
"""


def test_the_table_runs_the_recurrent_ops_and_refuses_a_weight_it_cannot_read():
    """A graph of sigmoid, head_columns and a short convolution over its recurrent state is accepted
    (the runner keeps each sequence's state: pass_states.py); a conv whose taps are not an f32 weight
    (computed in the graph) is refused naming the op."""
    assert unsupported(parse_graph(GRAPH)) is None
    assert unsupported(parse_graph(GRAPH + CONV.replace("TAPS", "%5"))) is None
    reason = unsupported(parse_graph(GRAPH + CONV.replace("TAPS", "%6")))
    assert reason is not None and reason.startswith("short_conv reads input 1 as an f32 weight")
