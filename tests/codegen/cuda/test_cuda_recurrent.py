"""The kernels of the recurrent families (kinetic/codegen/cuda/recurrent.py and recurrent_scan.py:
short_conv, ssm_scan, delta_rule, softplus through the C library's logf, sigmoid and head_columns) on
the host emulation, in both thread orders, against the reference bit for bit, each row of a tree pass
continuing its parent's state; and the renderer's rows for them."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import host_programs

from kinetic.codegen.cuda import recurrent, recurrent_scan
from kinetic.codegen.cuda.renderer import KERNELS, CudaRenderer
from kinetic.ir.numerics import recurrent as rnum
from kinetic.ir.ops import Op
from kinetic.ir.text import parse_graph
from tests.codegen import kernel_cases as cases
from tests.device_checks import same_bits

SIGMOID_WIDTHS = (300, 32)  # not a multiple of a block's 256 threads; less than one warp's worth per block
SOFTPLUS_WIDTH = 1 << 16

def _kernels() -> list:
    return ([recurrent.sigmoid(w) for w in SIGMOID_WIDTHS] + [recurrent.head_columns(*h) for h in cases.HEAD_COLUMNS]
            + [recurrent.short_conv(*c) for c in cases.SHORT_CONVS] + [recurrent.softplus(SOFTPLUS_WIDTH)]
            + [recurrent_scan.ssm_scan(*c) for c in cases.SSM_SCANS]
            + [recurrent_scan.delta_rule(*c) for c in cases.DELTA_RULES])


prog = host_programs(_kernels, "cuda-rec")  # the kernels on the host, in both orders


def _sigmoid_inputs(width: int) -> np.ndarray:
    """Values across expf's whole range: random of every scale, its overflow and underflow edges,
    signed zeros, infinities, subnormals and NaN, in rows of `width`."""
    rng = np.random.default_rng(50)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, -88.72, 103.9, -103.9, 87.0, -87.5,
                        1e-40, -1e-40, 20.0, -20.0], np.float32)
    scaled = (rng.standard_normal(4 * width - special.size) * np.float32(10) ** rng.integers(-6, 3, 4 * width
                                                                                             - special.size))
    return np.concatenate([special, scaled.astype(np.float32)]).reshape(4, width)


@pytest.mark.parametrize("width", SIGMOID_WIDTHS)
def test_sigmoid_equals_the_reference(prog, width):
    """sigmoid gives numerics.recurrent.sigmoid's bits (the C library's expf, three f32 roundings) on
    every value, edge values of expf included."""
    x = _sigmoid_inputs(width)
    out = np.zeros_like(x)
    with np.errstate(over="ignore"):
        expected = rnum.sigmoid(x)
    prog.launch(f"sigmoid_w{width}", x.shape[0], x, out)
    assert same_bits(out, expected)


@pytest.mark.parametrize("shape", cases.HEAD_COLUMNS)
def test_head_columns_copies_each_heads_slice(prog, shape):
    """head_columns gives each head's columns start .. start + count - 1, heads side by side, bit for
    bit (NaN payloads and signed zeros included): the reference's slice."""
    x, expected = cases.head_columns_case(51, *shape)
    out = np.zeros_like(expected)
    prog.launch(recurrent.head_columns(*shape).name, len(x), x, out)
    assert same_bits(out, expected)


GRAPH = """
%0 = input() {name="tokens"} : i32[T]
%1 = param() {tensor="token_embd.weight"} : q8_0[24,192]
%2 = embed(%1, %0) : f32[T,192]
%3 = head_columns(%2) {n_head=4, stride=48, start=24, count=24} : f32[T,96]
%4 = sigmoid(%3) : f32[T,96]
output y = %4
"""


def test_the_renderer_has_a_row_for_every_recurrent_op():
    """sigmoid and head_columns render to their kernels at the node's shape, and every recurrent op
    (the state leaf, short_conv, ssm_scan, delta_rule) has a row: no recurrent graph is refused."""
    graph = parse_graph(GRAPH)
    rendering = CudaRenderer().render(graph)
    assert not rendering.unsupported
    assert [k.name for k in rendering.kernels[3]] == ["head_columns_h4_s48_o24_c24"]
    assert [k.name for k in rendering.kernels[4]] == ["sigmoid_w96"]
    assert {Op.RECURRENT_STATE, Op.SHORT_CONV, Op.SSM_SCAN, Op.DELTA_RULE} <= set(KERNELS)


def _launch_walk(prog, name: str, case, out_width: int):
    """Launch a walking kernel on the case's pass (one block row walks the rows): (out, state after
    each row)."""
    n = len(cases.PARENTS)
    after = np.zeros_like(case.committed)
    out = np.zeros((n, out_width), np.float32)
    prog.launch(name, 1, *case.inputs, case.committed, cases.PARENTS, after, out, n)
    return out, after


@pytest.mark.parametrize("channels, taps", cases.SHORT_CONVS)
def test_short_conv_follows_each_rows_path(prog, channels, taps):
    """short_conv gives numerics.short_conv_row's bits for every row of a pass holding two sequences
    and a branch, each row continuing its parent's state (or its sequence's committed one), and
    leaves in `after` each row's window's last taps - 1 rows, bit for bit."""
    case = cases.short_conv_case(52, channels, taps)
    out, after = _launch_walk(prog, recurrent.short_conv(channels, taps).name, case, channels)
    assert same_bits(out, case.out)
    assert same_bits(after, case.after)


@pytest.mark.parametrize("channels, taps", cases.SHORT_CONVS[:2])
def test_short_conv_row_in_a_pass_equals_the_row_alone(prog, channels, taps):
    """Batch invariance: row 3 of the tree pass (a branch off row 1) gives the bits of its path (rows
    0, 1, 3) run as a pass of its own."""
    rng = np.random.default_rng(53)
    x = rng.standard_normal((6, channels)).astype(np.float32)
    w = rng.standard_normal((channels, taps)).astype(np.float32)
    committed = rng.standard_normal((6, taps - 1, channels)).astype(np.float32)
    name = recurrent.short_conv(channels, taps).name

    def run(xs, starts, parents):
        after = np.zeros((len(parents), taps - 1, channels), np.float32)
        out = np.zeros((len(parents), channels), np.float32)
        prog.launch(name, 1, xs, w, starts, parents, after, out, len(parents))
        return out, after

    out, after = run(x, committed, cases.PARENTS)
    alone_out, alone_after = run(np.ascontiguousarray(x[cases.PATH]), np.ascontiguousarray(committed[cases.PATH]),
                                 np.array([-1, 0, 1], np.int32))
    assert same_bits(out[3], alone_out[2]) and same_bits(after[3], alone_after[2])


def test_softplus_equals_the_reference(prog):
    """softplus gives numerics.recurrent.softplus's bits (the C library's expf, then its logf of 1 +
    that) on half a million x: every scale from 1e-8 to 1e3 of both signs, 20 and its neighbours (the
    pass-through edge), expf's overflow and underflow, signed zeros, infinities and NaN. (logf alone
    was also checked on 84M inputs spread over [1, 2^29), softplus's whole range: no difference.)"""
    rng = np.random.default_rng(54)
    special = np.array([0.0, -0.0, 20.0, np.nextafter(np.float32(20), np.float32(0)), 20.5, -np.inf, np.inf,
                        np.nan, -88.0, -104.0, 1e-30, -1e-30, 88.7], np.float32)
    scaled = rng.standard_normal(SOFTPLUS_WIDTH * 8 - special.size) * np.float32(10) ** rng.integers(
        -8, 3, SOFTPLUS_WIDTH * 8 - special.size)
    x = np.concatenate([special, scaled.astype(np.float32)]).reshape(8, SOFTPLUS_WIDTH)
    out = np.zeros_like(x)
    prog.launch(f"softplus_w{SOFTPLUS_WIDTH}", x.shape[0], x, out)
    with np.errstate(over="ignore", invalid="ignore"):
        assert same_bits(out, rnum.softplus(x))


@pytest.mark.parametrize("n_head, head_dim, n_group, d_state", cases.SSM_SCANS)
def test_ssm_scan_follows_each_rows_path(prog, n_head, head_dim, n_group, d_state):
    """ssm_scan gives numerics.ssm_scan_row's bits plus x * D (the reference's two roundings) for every
    row of a pass of two sequences and a branch, each continuing its parent's state, and leaves each
    row's state in `after`, bit for bit; dt spans softplus's both branches (above 20 and below)."""
    case = cases.ssm_scan_case(55, n_head, head_dim, n_group, d_state)
    name = recurrent_scan.ssm_scan(n_head, head_dim, n_group, d_state).name
    out, after = _launch_walk(prog, name, case, n_head * head_dim)
    assert same_bits(out, case.out)
    assert same_bits(after, case.after)


@pytest.mark.parametrize("n_k_head, n_v_head, head_dim", cases.DELTA_RULES)
def test_delta_rule_follows_each_rows_path(prog, n_k_head, n_v_head, head_dim):
    """delta_rule gives the reference's bits (kinetic/ir/delta_reference.py's step: the decay
    expf(softplus(alpha) * A), sigmoid(beta), numerics.delta_rule_row) for every row of a pass of two
    sequences and a branch, each continuing its parent's state, and leaves each row's state in
    `after`, bit for bit; value heads read key head h % n_k_head."""
    case = cases.delta_rule_case(56, n_k_head, n_v_head, head_dim)
    name = recurrent_scan.delta_rule(n_k_head, n_v_head, head_dim).name
    out, after = _launch_walk(prog, name, case, n_v_head * head_dim)
    assert same_bits(out, case.out)
    assert same_bits(after, case.after)
