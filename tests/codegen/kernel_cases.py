"""The kernel cases CUDA's and Vulkan's tests share, so each device is held to the same inputs and
expected values: concat's widths, rows and graph (test_*_concat.py); the recurrent ops' shapes, a
tree pass of two sequences, and for each walking op its random inputs with the reference's outputs
and states after each row (test_cuda_recurrent.py, test_vulkan_recurrent*.py).

Owns: inputs and expected values only, from the reference (kinetic/ir/reference.py; the recurrent
ops from kinetic/ir/numerics/recurrent.py walked along each row's path as kinetic/ir/recurrence.py
does); no device, no assertion.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kinetic.ir import reference
from kinetic.ir.numerics import recurrent as rnum
from kinetic.ir.numerics.floats import libm_f32

F32 = np.float32
# concat's widths: a prediction block's two 256s; a first part ending inside a workgroup (64 on
# Vulkan, a block of 256 threads on CUDA), a row past one; widths less than a warp
CONCATS = [(256, 256), (300, 40), (7, 5)]
CONCAT_GRAPH = """
%0 = input() {name="hidden.40"} : f32[T,40]
%1 = input() {name="hidden.40"} : f32[T,40]
%2 = concat(%0, %1) : f32[T,80]
output y = %2
"""
HEAD_COLUMNS = [(4, 96, 0, 48), (4, 96, 48, 48), (3, 100, 7, 90)]  # n_head, stride, start, count
# channels, taps: lfm2's 3 (all fmas), Mamba-2's 4, 20 (a chunk of 16, then fmas) and 27 (16, 8, 3);
# channels past one workgroup (64 on Vulkan, 256 threads on CUDA), the last one partial
SHORT_CONVS = [(300, 3), (64, 4), (40, 20), (33, 27)]
# n_head, head_dim, n_group, d_state: two chunks of 64 and none; groups shared by heads; a tail of 32
SSM_SCANS = [(4, 8, 2, 128), (3, 5, 1, 16), (2, 4, 2, 96)]
# n_k_head, n_v_head, S: one chunk; a tail of 32 (rounded 16s) and of 12 (8 rounded, 4 fmas); 44: no chunk
DELTA_RULES = [(2, 4, 64), (1, 2, 96), (2, 2, 76), (1, 3, 44)]
# a pass of two sequences: sequence 0's chain 0-1 with a branch 2, 3 off row 1; sequence 1's rows 4, 5
PARENTS = np.array([-1, 0, 1, 1, -1, 4], np.int32)
SEQS = np.array([0, 0, 0, 0, 1, 1], np.int32)
PATH = [0, 1, 3]  # row 3's path in the tree pass; alone, its parents are [-1, 0, 1]


def any_floats(rng, shape: tuple[int, ...]) -> np.ndarray:
    """f32 of random bit patterns: NaN payloads, infinities, signed zeros and subnormals among them."""
    return rng.integers(0, 2**32, shape, dtype=np.uint32).view(F32)


def concat_case(seed: int, wa: int, wb: int, rows: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a f32 [rows, wa], b f32 [rows, wb], the reference's concat of them), of any bits."""
    rng = np.random.default_rng(seed)
    a, b = any_floats(rng, (rows, wa)), any_floats(rng, (rows, wb))
    return a, b, reference.concat(None, None, [a, b])


def head_columns_case(seed: int, n_head: int, stride: int, start: int, count: int,
                      rows: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """(x f32 [rows, n_head * stride] of any bits, each head's columns start .. start + count - 1,
    heads side by side: f32 [rows, n_head * count])."""
    x = any_floats(np.random.default_rng(seed), (rows, n_head * stride))
    return x, x.reshape(rows, n_head, stride)[:, :, start:start + count].reshape(rows, -1)


class Case(NamedTuple):
    """One walking op's pass: its inputs in binding order (before the states), each row's committed
    state (NaN where a row has a parent: never read), and the reference's output and state after
    each row."""

    inputs: list[np.ndarray]
    committed: np.ndarray
    out: np.ndarray
    after: np.ndarray


def walk(committed: np.ndarray, parents: np.ndarray, step) -> tuple[np.ndarray, np.ndarray]:
    """The reference's walk: each row steps (step(state, row) -> (out, new state)) from its parent's
    state, or its own committed one; (outputs [rows, -1], states after each row)."""
    outs, afters = [], []
    for r, parent in enumerate(parents):
        out, new = step(afters[parent] if parent >= 0 else committed[r], r)
        outs.append(out.reshape(-1))
        afters.append(new)
    return np.stack(outs), np.stack(afters)


def random_committed(rng, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """Each sequence's committed state in its parentless rows of PARENTS; NaN where a row has a parent."""
    per_seq = (rng.standard_normal((2, *shape)) * scale).astype(F32)
    return np.where((PARENTS < 0).reshape(-1, *[1] * len(shape)), per_seq[SEQS], F32(np.nan)).astype(F32)


def short_conv_case(seed: int, channels: int, taps: int) -> Case:
    """x f32 [rows, channels] (signed zeros in row 0), w f32 [channels, taps]; the state is the last
    taps - 1 rows of the window, f32 [taps - 1, channels]."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((len(PARENTS), channels)).astype(F32)
    x[0, :3] = [0.0, -0.0, -0.0]  # signed zeros through the taps
    w = rng.standard_normal((channels, taps)).astype(F32)
    committed = random_committed(rng, (taps - 1, channels))

    def step(state, r):
        window = np.concatenate([state, x[r:r + 1]])
        return rnum.short_conv_row(window, w), window[1:]

    return Case([x, w], committed, *walk(committed, PARENTS, step))


def ssm_scan_case(seed: int, n_head: int, head_dim: int, n_group: int, d_state: int) -> Case:
    """x, dt, A, B, C, D (Mamba-2's scan); the output is numerics.ssm_scan_row's plus x * D (two
    roundings); dt spans softplus's both branches (above 20 and below)."""
    rng = np.random.default_rng(seed)
    n, channels = len(PARENTS), n_head * head_dim
    x = rng.standard_normal((n, channels)).astype(F32)
    dt = (rng.standard_normal((n, n_head)) * 8).astype(F32)
    dt[0, 0] = 25.0
    a = -np.abs(rng.standard_normal(n_head)).astype(F32)
    d = rng.standard_normal(n_head).astype(F32)
    b, c = (rng.standard_normal((n, n_group * d_state)).astype(F32) for _ in range(2))
    committed = random_committed(rng, (channels, d_state))
    group_of = np.arange(n_head) // (n_head // n_group)

    def step(state, r):
        heads = x[r].reshape(n_head, head_dim)
        bs, cs = (t[r].reshape(n_group, d_state)[group_of] for t in (b, c))
        y, new = rnum.ssm_scan_row(state.reshape(n_head, head_dim, d_state), heads, dt[r], a, bs, cs)
        return (y + (heads * d[:, None]).astype(F32)).astype(F32), new.reshape(channels, d_state)

    return Case([x, dt, a, b, c, d], committed, *walk(committed, PARENTS, step))


def delta_rule_case(seed: int, n_k_head: int, n_v_head: int, head_dim: int) -> Case:
    """q, k, v, alpha, beta, A (the gated delta rule): the decay expf(softplus(alpha) * A), the
    strength sigmoid(beta), numerics.delta_rule_row; value head h reads key head h % n_k_head."""
    rng = np.random.default_rng(seed)
    n, s = len(PARENTS), head_dim
    q, k = (rng.standard_normal((n, n_k_head * s)).astype(F32) / F32(4) for _ in range(2))
    v = rng.standard_normal((n, n_v_head * s)).astype(F32)
    alpha, beta = ((rng.standard_normal((n, n_v_head)) * 3).astype(F32) for _ in range(2))
    a = -np.abs(rng.standard_normal(n_v_head)).astype(F32)
    committed = random_committed(rng, (n_v_head * s, s), scale=0.1)
    key_head = np.arange(n_v_head) % n_k_head
    decays = libm_f32("expf", (rnum.softplus(alpha) * a).astype(F32))
    strengths = rnum.sigmoid(beta)

    def step(state, r):
        qs, ks = (t[r].reshape(n_k_head, s)[key_head] for t in (q, k))
        o, new = rnum.delta_rule_row(state.reshape(n_v_head, s, s), qs, ks, v[r].reshape(n_v_head, s),
                                     decays[r], strengths[r])
        return o, new.reshape(n_v_head * s, s)

    return Case([q, k, v, alpha, beta, a], committed, *walk(committed, PARENTS, step))

