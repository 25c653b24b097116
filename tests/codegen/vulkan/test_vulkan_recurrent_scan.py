"""The Vulkan kernels of the ops that carry a recurrent state (kinetic/codegen/vulkan/recurrent_scan.py:
short_conv, ssm_scan, delta_rule) and the C library's logf and a rounding-once float64 fma they rest on
(logf.py), against the reference bit for bit, each row of a tree pass continuing its parent's state."""

from __future__ import annotations

import struct
from fractions import Fraction

import numpy as np
import pytest
from vulkan_helpers import bits, spirv_val

from kinetic.codegen.vulkan import logf, recurrent_scan
from kinetic.codegen.vulkan.attention import expf_table_words
from kinetic.codegen.vulkan.device import Dispatch, Kernel
from kinetic.codegen.vulkan.elementwise import flat_index
from kinetic.codegen.vulkan.spirv import Module, Op
from kinetic.ir.numerics import recurrent as rnum
from kinetic.ir.numerics.floats import libm_f32

F32 = np.float32
# channels, taps: lfm2's 3 (all fmas), Mamba-2's 4, 20 (a chunk of 16, then fmas) and 27 (16, 8, 3);
# channels past one workgroup of 64, the last partial
SHORT_CONVS = [(300, 3), (64, 4), (40, 20), (33, 27)]
# n_head, head_dim, n_group, d_state: two chunks of 64 and none; groups shared by heads; a tail of 32
SSM_SCANS = [(4, 8, 2, 128), (3, 5, 1, 16), (2, 4, 2, 96)]
# n_k_head, n_v_head, S: one chunk; a tail of 32 (rounded 16s) and of 12 (8 rounded, 4 fmas); 44: no chunk
DELTA_RULES = [(2, 4, 64), (1, 2, 96), (2, 2, 76), (1, 3, 44)]
# a pass of two sequences: sequence 0's chain 0-1 with a branch 2, 3 off row 1; sequence 1's rows 4, 5
PARENTS = np.array([-1, 0, 1, 1, -1, 4], np.int32)
SEQS = np.array([0, 0, 0, 0, 1, 1], np.int32)


def _walk_run(device, kernel: Kernel, inputs: list[np.ndarray], committed: np.ndarray, parents: np.ndarray,
              rows_total: int, out_width: int) -> tuple[np.ndarray, np.ndarray]:
    """Run a walking kernel on one pass: its inputs, the parents, the walk buffer (the committed
    states, then room for the states after each row) and out; returns (out, the states after)."""
    n = len(parents)
    size = committed[0].size
    walk = np.concatenate([committed.reshape(n, size), np.zeros((n, size), F32)])
    arrays = [*inputs, parents.view(np.uint32), walk]
    bufs = [device.upload(np.ascontiguousarray(a)) for a in arrays]
    out = device.buffer(n * out_width * 4)
    try:
        groups = -(-rows_total // recurrent_scan.WORKGROUP)
        device.run([Dispatch(kernel, [*bufs, out], (groups, 1, 1), struct.pack("<I", n))])
        after = bufs[-1].read(F32, 2 * n * size)[n * size:].reshape(committed.shape)
        return out.read(F32, n * out_width).reshape(n, out_width), after
    finally:
        for b in [*bufs, out]:
            device.free(b)


def _walk(committed, parents, step):
    """The reference's walk (kinetic/ir/recurrence.py): each row steps from its parent's state, or its
    own committed one."""
    outs, afters = [], []
    for r, parent in enumerate(parents):
        out, new = step(afters[parent] if parent >= 0 else committed[r], r)
        outs.append(out.reshape(-1))
        afters.append(new)
    return np.stack(outs), np.stack(afters)


def _random_committed(rng, shape, scale=1.0):
    """Each sequence's committed state in its parentless rows; NaN where a row has a parent (never read)."""
    per_seq = (rng.standard_normal((2, *shape)) * scale).astype(F32)
    return np.where((PARENTS < 0).reshape(-1, *[1] * len(shape)), per_seq[SEQS], F32(np.nan)).astype(F32)


def test_the_modules_are_valid_spirv(device):
    """Each walking kernel and the logf / softplus windows pass spirv-val (Vulkan 1.2 rules)."""
    t = device.target
    for kernel in (recurrent_scan.render_short_conv(t, 33, 27), recurrent_scan.render_ssm_scan(t, 2, 4, 2, 96),
                   recurrent_scan.render_delta_rule(t, 2, 2, 76), logf.render_map("softplus")):
        spirv_val(kernel.spirv)


def _render_fma_f64_map() -> Kernel:
    m = Module()
    f64 = m.float_(64)
    a, b, c = (m.storage_buffer(i, f64, readonly=True, name=n) for i, n in enumerate("abc"))
    y = m.storage_buffer(3, f64, name="y")
    params, _ = m.push_constants([m.u32])
    fn = m.compute_entry((64, 1, 1))
    i = flat_index(fn, 64)
    with fn.if_(fn.icmp(Op.ULessThan, i, fn.push(params, 0, m.u32))):
        fn.buf_store(y, i, logf.fma_f64(fn, fn.buf_load(a, i), fn.buf_load(b, i), fn.buf_load(c, i)))
    fn.end()
    return Kernel("fma_f64_map", m.to_bytes(), (True, True, True, False), (64, 1, 1), push_size=4)


def test_fma_f64_rounds_once(device):
    """fma_f64 gives a*b + c rounded once (the exact value by fractions, correctly rounded) on 4000
    random doubles of mixed scales and signs, sums that cancel to a few bits, and ties that only the
    product's rounding error breaks."""
    if not device.caps.shader_float64:
        pytest.skip("no float64 on this device")
    rng = np.random.default_rng(70)
    n = 4000
    a = rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)
    b = rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)
    c = rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)
    c[: n // 4] = -(a[: n // 4] * b[: n // 4])  # the product's rounding error is all that is left
    c[n // 4: n // 2] = -(a[n // 4: n // 2] * b[n // 4: n // 2]) * (1 + 2.0 ** -40)
    # a product within 2^-107 of 2^-53 (rounded: exactly 2^-53, half an ulp of c in [1, 2)): c plus it is
    # a tie the product's tiny error must break (only the rounding to odd keeps that error)
    tie = slice(n // 2, 3 * n // 4)
    a[tie] = 1 + rng.integers(1, 1 << 20, n // 4) * 2.0 ** -26
    b[tie] = 2.0 ** -53 / a[tie]
    c[tie] = rng.uniform(1, 2, n // 4)
    bufs = [device.upload(np.ascontiguousarray(v)) for v in (a, b, c)]
    y = device.buffer(n * 8)
    try:
        device.run([Dispatch(_render_fma_f64_map(), [*bufs, y], (-(-n // 64), 1, 1), struct.pack("<I", n))])
        got = y.read(np.float64, n)
    finally:
        for buf in [*bufs, y]:
            device.free(buf)
    exact = np.array([float(Fraction(x) * Fraction(z) + Fraction(w)) for x, z, w in zip(a, b, c, strict=True)])
    assert np.array_equal(got.view(np.uint64), exact.view(np.uint64))


def _run_map(device, which: str, x: np.ndarray) -> np.ndarray:
    from kinetic.codegen.vulkan.ops import VulkanOps

    return VulkanOps(device)._run(logf.render_map(which), [x, expf_table_words()], x.shape,
                                  -(-x.size // logf.WORKGROUP), struct.pack("<I", x.size))


def test_logf_and_softplus_equal_the_c_library(device):
    """logf_libc gives the C library's logf bit for bit on 2^18 inputs spread over [1, 2^29) (softplus's
    whole range), 2^18 of every float bit pattern and the edges (1, zeros, infinities, NaN, subnormals,
    negatives); softplus gives numerics.recurrent.softplus's bits on 2^18 x of every scale from 1e-8 to
    1e3 of both signs, 20 and its neighbours (the pass-through edge) and expf's overflow and underflow."""
    if not device.caps.shader_float64:
        pytest.skip("no float64 on this device")
    rng = np.random.default_rng(71)
    n = 1 << 18
    special = np.array([1.0, 0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 1e-40, 1e-45, 2.0, 0.5, 3.4e38], F32)
    x = np.concatenate([special, (2.0 ** rng.uniform(0, 29, n)).astype(F32),
                        rng.integers(0, 2**32, n, dtype=np.uint32).view(F32)])
    with np.errstate(all="ignore"):
        assert np.array_equal(bits(_run_map(device, "logf", x)), bits(libm_f32("logf", x)))
    edges = np.array([20.0, np.nextafter(F32(20), F32(0)), 20.5, -np.inf, np.inf, np.nan, -88.0, -104.0, 1e-30,
                      -1e-30, 88.7, 0.0, -0.0], F32)
    v = np.concatenate([edges, (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 3, n)).astype(F32)])
    with np.errstate(all="ignore"):
        assert np.array_equal(bits(_run_map(device, "softplus", v)), bits(rnum.softplus(v)))


@pytest.mark.parametrize("channels, taps", SHORT_CONVS)
def test_short_conv_follows_each_rows_path(device, channels, taps):
    """short_conv gives numerics.short_conv_row's bits for every row of a pass holding two sequences
    and a branch, each row continuing its parent's state (or its sequence's committed one), and
    leaves each row's window's last taps - 1 rows, bit for bit."""
    rng = np.random.default_rng(72)
    n = len(PARENTS)
    x = rng.standard_normal((n, channels)).astype(F32)
    x[0, :3] = [0.0, -0.0, -0.0]  # signed zeros through the taps
    w = rng.standard_normal((channels, taps)).astype(F32)
    committed = _random_committed(rng, (taps - 1, channels))
    kernel = recurrent_scan.render_short_conv(device.target, channels, taps)
    out, after = _walk_run(device, kernel, [x, w], committed, PARENTS, channels, channels)

    def step(state, r):
        window = np.concatenate([state, x[r:r + 1]])
        return rnum.short_conv_row(window, w), window[1:]

    expected_out, expected_after = _walk(committed, PARENTS, step)
    assert np.array_equal(bits(out), bits(expected_out))
    assert np.array_equal(bits(after), bits(expected_after))


def test_a_row_in_a_pass_equals_the_row_alone(device):
    """Batch invariance: row 3 of the tree pass (a branch off row 1) gives the bits of its path (rows
    0, 1, 3) run as a pass of its own, output and state."""
    rng = np.random.default_rng(73)
    channels, taps = 64, 4
    x = rng.standard_normal((6, channels)).astype(F32)
    w = rng.standard_normal((channels, taps)).astype(F32)
    committed = rng.standard_normal((6, taps - 1, channels)).astype(F32)
    kernel = recurrent_scan.render_short_conv(device.target, channels, taps)
    out, after = _walk_run(device, kernel, [x, w], committed, PARENTS, channels, channels)
    path = [0, 1, 3]
    alone_out, alone_after = _walk_run(device, kernel, [x[path], w], committed[path], np.array([-1, 0, 1], np.int32),
                                       channels, channels)
    assert np.array_equal(bits(out[3]), bits(alone_out[2])) and np.array_equal(bits(after[3]), bits(alone_after[2]))


@pytest.mark.parametrize("n_head, head_dim, n_group, d_state", SSM_SCANS)
def test_ssm_scan_follows_each_rows_path(device, n_head, head_dim, n_group, d_state):
    """ssm_scan gives numerics.ssm_scan_row's bits plus x * D for every row of a pass of two sequences
    and a branch, each continuing its parent's state, and leaves each row's state, bit for bit; dt
    spans softplus's both branches (above 20 and below)."""
    rng = np.random.default_rng(74)
    n, channels = len(PARENTS), n_head * head_dim
    x = rng.standard_normal((n, channels)).astype(F32)
    dt = (rng.standard_normal((n, n_head)) * 8).astype(F32)
    dt[0, 0] = 25.0
    a = -np.abs(rng.standard_normal(n_head)).astype(F32)
    d = rng.standard_normal(n_head).astype(F32)
    b, c = (rng.standard_normal((n, n_group * d_state)).astype(F32) for _ in range(2))
    committed = _random_committed(rng, (channels, d_state))
    kernel = recurrent_scan.render_ssm_scan(device.target, n_head, head_dim, n_group, d_state)
    out, after = _walk_run(device, kernel, [x, dt, a, b, c, d, expf_table_words()], committed, PARENTS, channels,
                           channels)
    group_of = np.arange(n_head) // (n_head // n_group)

    def step(state, r):
        heads = x[r].reshape(n_head, head_dim)
        bs, cs = (t[r].reshape(n_group, d_state)[group_of] for t in (b, c))
        y, new = rnum.ssm_scan_row(state.reshape(n_head, head_dim, d_state), heads, dt[r], a, bs, cs)
        return (y + (heads * d[:, None]).astype(F32)).astype(F32), new.reshape(channels, d_state)

    expected_out, expected_after = _walk(committed, PARENTS, step)
    assert np.array_equal(bits(out), bits(expected_out))
    assert np.array_equal(bits(after), bits(expected_after))


@pytest.mark.parametrize("n_k_head, n_v_head, head_dim", DELTA_RULES)
def test_delta_rule_follows_each_rows_path(device, n_k_head, n_v_head, head_dim):
    """delta_rule gives the reference's bits (the decay expf(softplus(alpha) * A), sigmoid(beta),
    numerics.delta_rule_row) for every row of a pass of two sequences and a branch, each continuing its
    parent's state, and leaves each row's state, bit for bit; value heads read key head h % n_k_head."""
    rng = np.random.default_rng(75)
    n, s = len(PARENTS), head_dim
    q, k = (rng.standard_normal((n, n_k_head * s)).astype(F32) / F32(4) for _ in range(2))
    v = rng.standard_normal((n, n_v_head * s)).astype(F32)
    alpha, beta = ((rng.standard_normal((n, n_v_head)) * 3).astype(F32) for _ in range(2))
    a = -np.abs(rng.standard_normal(n_v_head)).astype(F32)
    committed = _random_committed(rng, (n_v_head * s, s), scale=0.1)
    kernel = recurrent_scan.render_delta_rule(device.target, n_k_head, n_v_head, head_dim)
    out, after = _walk_run(device, kernel, [q, k, v, alpha, beta, a, expf_table_words()], committed, PARENTS,
                           n_v_head * s, n_v_head * s)
    key_head = np.arange(n_v_head) % n_k_head
    decays = libm_f32("expf", (rnum.softplus(alpha) * a).astype(F32))
    strengths = rnum.sigmoid(beta)

    def step(state, r):
        qs, ks = (t[r].reshape(n_k_head, s)[key_head] for t in (q, k))
        o, new = rnum.delta_rule_row(state.reshape(n_v_head, s, s), qs, ks, v[r].reshape(n_v_head, s),
                                     decays[r], strengths[r])
        return o, new.reshape(n_v_head * s, s)

    expected_out, expected_after = _walk(committed, PARENTS, step)
    assert np.array_equal(bits(out), bits(expected_out))
    assert np.array_equal(bits(after), bits(expected_after))
