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
from tests.device_checks import same_bits

SIGMOID_WIDTHS = (300, 32)  # not a multiple of a block's 256 threads; less than one warp's worth per block
HEAD_COLUMNS = [(4, 96, 0, 48), (4, 96, 48, 48), (3, 100, 7, 90)]  # n_head, stride, start, count
# channels, taps: lfm2's 3 (all fmas), Mamba-2's 4, 20 (a chunk of 16, then fmas) and 27 (16, 8, 3);
# channels past one block of 256 threads, the last block partial
SHORT_CONVS = [(300, 3), (64, 4), (40, 20), (33, 27)]
# a pass of two sequences: sequence 0's chain 0-1 with a branch 2, 3 off row 1; sequence 1's rows 4, 5
SOFTPLUS_WIDTH = 1 << 16
# n_head, head_dim, n_group, d_state: two chunks of 64 and none; groups shared by heads; a tail of 32
SSM_SCANS = [(4, 8, 2, 128), (3, 5, 1, 16), (2, 4, 2, 96)]
# n_k_head, n_v_head, S: one chunk; a tail of 32 (rounded 16s) and of 12 (8 rounded, 4 fmas); 44: no chunk
DELTA_RULES = [(2, 4, 64), (1, 2, 96), (2, 2, 76), (1, 3, 44)]
PARENTS = np.array([-1, 0, 1, 1, -1, 4], np.int32)
SEQS = np.array([0, 0, 0, 0, 1, 1], np.int32)


def _kernels() -> list:
    return ([recurrent.sigmoid(w) for w in SIGMOID_WIDTHS] + [recurrent.head_columns(*h) for h in HEAD_COLUMNS]
            + [recurrent.short_conv(*c) for c in SHORT_CONVS] + [recurrent.softplus(SOFTPLUS_WIDTH)]
            + [recurrent_scan.ssm_scan(*c) for c in SSM_SCANS] + [recurrent_scan.delta_rule(*c) for c in DELTA_RULES])


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


@pytest.mark.parametrize("shape", HEAD_COLUMNS)
def test_head_columns_copies_each_heads_slice(prog, shape):
    """head_columns gives each head's columns start .. start + count - 1, heads side by side, bit for
    bit (NaN payloads and signed zeros included): the reference's slice."""
    n_head, stride, start, count = shape
    rng = np.random.default_rng(51)
    x = rng.integers(0, 2**32, (5, n_head * stride), dtype=np.uint32).view(np.float32)
    out = np.zeros((5, n_head * count), np.float32)
    prog.launch(recurrent.head_columns(*shape).name, 5, x, out)
    expected = x.reshape(5, n_head, stride)[:, :, start:start + count].reshape(5, -1)
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


def _conv_along_paths(x, w, committed, parents):
    """The reference's walk (kinetic/ir/recurrence.py): each row's window continues its parent's
    state, or its own committed one; numerics.short_conv_row per row."""
    outs, afters = [], []
    for r, parent in enumerate(parents):
        state = afters[parent] if parent >= 0 else committed[r]
        window = np.concatenate([state, x[r:r + 1]])
        outs.append(rnum.short_conv_row(window, w))
        afters.append(window[1:])
    return np.stack(outs), np.stack(afters)


@pytest.mark.parametrize("channels, taps", SHORT_CONVS)
def test_short_conv_follows_each_rows_path(prog, channels, taps):
    """short_conv gives numerics.short_conv_row's bits for every row of a pass holding two sequences
    and a branch, each row continuing its parent's state (or its sequence's committed one), and
    leaves in `after` each row's window's last taps - 1 rows, bit for bit."""
    rng = np.random.default_rng(52)
    n = len(PARENTS)
    x = rng.standard_normal((n, channels)).astype(np.float32)
    w = rng.standard_normal((channels, taps)).astype(np.float32)
    per_seq = rng.standard_normal((2, taps - 1, channels)).astype(np.float32)
    committed = np.where((PARENTS < 0)[:, None, None], per_seq[SEQS], np.float32(np.nan)).astype(np.float32)
    after = np.zeros((n, taps - 1, channels), np.float32)
    out = np.zeros((n, channels), np.float32)
    prog.launch(recurrent.short_conv(channels, taps).name, 1, x, w, committed, PARENTS, after, out, n)
    expected_out, expected_after = _conv_along_paths(x, w, committed, PARENTS)
    assert same_bits(out, expected_out)
    assert same_bits(after, expected_after)


@pytest.mark.parametrize("channels, taps", SHORT_CONVS[:2])
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

    out, after = run(x, committed, PARENTS)
    path = [0, 1, 3]
    alone_out, alone_after = run(np.ascontiguousarray(x[path]), np.ascontiguousarray(committed[path]),
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


def _walk(committed, parents, step):
    """The reference's walk: each row steps from its parent's state, or its own committed one."""
    outs, afters = [], []
    for r, parent in enumerate(parents):
        out, new = step(afters[parent] if parent >= 0 else committed[r], r)
        outs.append(out.reshape(-1))
        afters.append(new)
    return np.stack(outs), np.stack(afters)


def _random_committed(rng, shape, scale=1.0):
    per_seq = (rng.standard_normal((2, *shape)) * scale).astype(np.float32)
    return np.where((PARENTS < 0).reshape(-1, *[1] * len(shape)), per_seq[SEQS], np.float32(np.nan)).astype(np.float32)


@pytest.mark.parametrize("n_head, head_dim, n_group, d_state", SSM_SCANS)
def test_ssm_scan_follows_each_rows_path(prog, n_head, head_dim, n_group, d_state):
    """ssm_scan gives numerics.ssm_scan_row's bits plus x * D (the reference's two roundings) for every
    row of a pass of two sequences and a branch, each continuing its parent's state, and leaves each
    row's state in `after`, bit for bit; dt spans softplus's both branches (above 20 and below)."""
    rng = np.random.default_rng(55)
    n, channels = len(PARENTS), n_head * head_dim
    x = rng.standard_normal((n, channels)).astype(np.float32)
    dt = (rng.standard_normal((n, n_head)) * 8).astype(np.float32)
    dt[0, 0] = 25.0
    a = -np.abs(rng.standard_normal(n_head)).astype(np.float32)
    d = rng.standard_normal(n_head).astype(np.float32)
    b, c = (rng.standard_normal((n, n_group * d_state)).astype(np.float32) for _ in range(2))
    committed = _random_committed(rng, (channels, d_state))
    after = np.zeros((n, channels, d_state), np.float32)
    out = np.zeros((n, channels), np.float32)
    prog.launch(recurrent_scan.ssm_scan(n_head, head_dim, n_group, d_state).name, 1, x, dt, a, b, c, d,
                committed, PARENTS, after, out, n)
    group_of = np.arange(n_head) // (n_head // n_group)

    def step(state, r):
        heads = x[r].reshape(n_head, head_dim)
        bs, cs = (t[r].reshape(n_group, d_state)[group_of] for t in (b, c))
        y, new = rnum.ssm_scan_row(state.reshape(n_head, head_dim, d_state), heads, dt[r], a, bs, cs)
        return (y + (heads * d[:, None]).astype(np.float32)).astype(np.float32), new.reshape(channels, d_state)

    expected_out, expected_after = _walk(committed, PARENTS, step)
    assert same_bits(out, expected_out)
    assert same_bits(after, expected_after)


@pytest.mark.parametrize("n_k_head, n_v_head, head_dim", DELTA_RULES)
def test_delta_rule_follows_each_rows_path(prog, n_k_head, n_v_head, head_dim):
    """delta_rule gives the reference's bits (kinetic/ir/delta_reference.py's step: the decay
    expf(softplus(alpha) * A), sigmoid(beta), numerics.delta_rule_row) for every row of a pass of two
    sequences and a branch, each continuing its parent's state, and leaves each row's state in
    `after`, bit for bit; value heads read key head h % n_k_head."""
    rng = np.random.default_rng(56)
    n, s = len(PARENTS), head_dim
    q, k = (rng.standard_normal((n, n_k_head * s)).astype(np.float32) / np.float32(4) for _ in range(2))
    v = rng.standard_normal((n, n_v_head * s)).astype(np.float32)
    alpha, beta = ((rng.standard_normal((n, n_v_head)) * 3).astype(np.float32) for _ in range(2))
    a = -np.abs(rng.standard_normal(n_v_head)).astype(np.float32)
    committed = _random_committed(rng, (n_v_head * s, s), scale=0.1)
    after = np.zeros((n, n_v_head * s, s), np.float32)
    out = np.zeros((n, n_v_head * s), np.float32)
    prog.launch(recurrent_scan.delta_rule(n_k_head, n_v_head, head_dim).name, 1, q, k, v, alpha, beta, a,
                committed, PARENTS, after, out, n)
    key_head = np.arange(n_v_head) % n_k_head
    decays = rnum.libm_f32("expf", (rnum.softplus(alpha) * a).astype(np.float32))
    strengths = rnum.sigmoid(beta)

    def step(state, r):
        qs, ks = (t[r].reshape(n_k_head, s)[key_head] for t in (q, k))
        o, new = rnum.delta_rule_row(state.reshape(n_v_head, s, s), qs, ks, v[r].reshape(n_v_head, s),
                                     decays[r], strengths[r])
        return o, new.reshape(n_v_head * s, s)

    expected_out, expected_after = _walk(committed, PARENTS, step)
    assert same_bits(out, expected_out)
    assert same_bits(after, expected_after)
