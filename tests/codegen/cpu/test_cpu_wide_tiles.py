"""The 512-bit prompt tiles on VNNI (matmul_wide_ir: R rows x 4 columns of the block-32 lanes types;
matmul_q{2..6}k_lanes_ir: Q2_K .. Q6_K with 16 rows as lanes) give the reference's bits
for every row count, tile and thread split, and the same bits as the 256-bit tiles they replace."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_kernel_helpers import random_weight
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu import (
    matmul_k_lanes_ir,
    matmul_q2k_lanes_ir,
    matmul_q3k_lanes_ir,
    matmul_q4k_lanes_ir,
    matmul_q5k_lanes_ir,
    matmul_q6k_lanes_ir,
    matmul_wide_ir,
)
from kinetic.codegen.cpu.matmul import quantized_matmul
from kinetic.codegen.cpu.matmul_ir import render_matmul
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import host
from kinetic.ir import numerics

WIDE_TYPES = [Q.Q8_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
LANE_TYPES = {Q.Q2_K: matmul_q2k_lanes_ir, Q.Q3_K: matmul_q3k_lanes_ir, Q.Q4_K: matmul_q4k_lanes_ir,
              Q.Q5_K: matmul_q5k_lanes_ir, Q.Q6_K: matmul_q6k_lanes_ir}
needs_vnni = pytest.mark.skipif(not host().supports("vnni"), reason="host CPU lacks AVX-512 VNNI")


def _case(wtype: Q, n: int, k: int, m: int, seed: int):
    rng = np.random.default_rng([seed, n, k, m, int(wtype)])
    return rng.standard_normal((m, k)).astype(np.float32), random_weight(rng, wtype, n, k)


def _differ(got: np.ndarray, want: np.ndarray) -> int:
    return int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))


def test_wide_tiles_serve_the_block32_lanes_types_only():
    """The wide path takes the block-32 lanes-order types with a pair decoder on VNNI up to MAX_K,
    nothing else."""
    taken = {t for t, lay in LAYOUTS.items() if matmul_wide_ir.applies(lay, "vnni", 8, 4096)}
    assert taken == set(WIDE_TYPES)
    assert not any(matmul_wide_ir.applies(LAYOUTS[t], v, 8, 4096) for t in WIDE_TYPES for v in ("avx2", "generic"))
    assert not matmul_wide_ir.applies(LAYOUTS[Q.Q4_1], "vnni", 3, 4096)
    assert not matmul_wide_ir.applies(LAYOUTS[Q.Q4_1], "vnni", 8, matmul_wide_ir.MAX_K + 32)


@needs_vnni
@pytest.mark.parametrize("wtype", WIDE_TYPES, ids=lambda t: t.name)
def test_wide_kernel_uses_512_bit_dots(wtype):
    """The default kernel of a wide type on VNNI runs vpdpbusd on 512 bits (the tests below exercise it)."""
    ir, name = render_matmul(wtype, 96, "vnni", 8)
    assert name.endswith("w") and "@llvm.x86.avx512.vpdpbusd.512(" in ir


@needs_vnni
@pytest.mark.parametrize("tile", [8, 4])
@pytest.mark.parametrize("wtype", WIDE_TYPES, ids=lambda t: t.name)
def test_every_row_count_and_thread_split_gives_reference_bits(jit, wtype, tile):
    """M = 1 .. 2 tiles + 3 rows, 1-3 threads, N odd (a column quad past the end repeats the last
    column): every output is numerics.matmul's bits."""
    m_max = 2 * tile + 3
    x, w = _case(wtype, 37, 96, m_max, seed=7)
    want = numerics.matmul(x, numerics.DequantizedWeight(w, wtype))
    for m in range(1, m_max + 1):
        for threads in (1, 2, 3):
            got = quantized_matmul(x[:m], w, wtype, jit=jit, tile=tile, threads=threads)
            assert _differ(got, want[:m]) == 0, f"{wtype.name} {tile=} {m=} {threads=}"


@needs_vnni
@pytest.mark.parametrize("wtype", [*WIDE_TYPES, *LANE_TYPES], ids=lambda t: t.name)
def test_wide_equals_narrow_over_several_column_chunks(jit, wtype):
    """Weights over several ~128 KB column chunks, 35 rows: the wide tiles give the 256-bit tiles' bits
    under every thread count, and row 11 alone gives its batch bits."""
    x, w = _case(wtype, 1001, 2048, 35, seed=8)
    narrow = quantized_matmul(x, w, wtype, jit=jit, wide=False)
    for threads in (1, 2, 3):
        got = quantized_matmul(x, w, wtype, jit=jit, threads=threads)
        assert _differ(got, narrow) == 0, f"{wtype.name} {threads=}"
    assert _differ(quantized_matmul(x[11:12], w, wtype, jit=jit), narrow[11:12]) == 0


@pytest.mark.parametrize("wtype", list(LANE_TYPES), ids=lambda t: t.name)
def test_lane_tiles_serve_their_type_on_vnni_only(wtype):
    """Each 16-row lanes module takes its own type on VNNI at the default tile up to MAX_K, nothing
    else."""
    lanes = LANE_TYPES[wtype]
    taken = {t for t, lay in LAYOUTS.items() if lanes.applies(lay, "vnni", 8, 4096)}
    assert taken == {wtype}
    assert not lanes.applies(LAYOUTS[wtype], "avx2", 8, 4096)
    assert not lanes.applies(LAYOUTS[wtype], "vnni", 4, 4096)
    assert not lanes.applies(LAYOUTS[wtype], "vnni", 8, matmul_k_lanes_ir.MAX_K + 256)


@needs_vnni
@pytest.mark.parametrize("wtype", list(LANE_TYPES), ids=lambda t: t.name)
def test_lanes_every_row_count_and_thread_split_gives_reference_bits(jit, wtype):
    """M = 1 .. 2 lane tiles + an 8-row tile + 3 rows (43), 1-3 threads, N odd: numerics.matmul's bits."""
    m_max = 2 * matmul_k_lanes_ir.ROWS + 8 + 3
    x, w = _case(wtype, 37, 512, m_max, seed=9)
    want = numerics.matmul(x, numerics.DequantizedWeight(w, wtype))
    for m in range(1, m_max + 1):
        for threads in (1, 2, 3):
            got = quantized_matmul(x[:m], w, wtype, jit=jit, threads=threads)
            assert _differ(got, want[:m]) == 0, f"{wtype.name} {m=} {threads=}"


@needs_vnni
@pytest.mark.parametrize("wtype", list(LANE_TYPES), ids=lambda t: t.name)
def test_lanes_at_max_k_equal_narrow(jit, wtype):
    """K = MAX_K (the largest scratch: a chunk of a few columns decoded once, 64 super-blocks laid out
    per tile), 17 rows, 21 columns (2 or 3 chunks): the lane tiles give the 256-bit tiles' bits."""
    k = matmul_k_lanes_ir.MAX_K
    x, w = _case(wtype, 21, k, 17, seed=10)
    narrow = quantized_matmul(x, w, wtype, jit=jit, wide=False)
    for threads in (1, 2):
        assert _differ(quantized_matmul(x, w, wtype, jit=jit, threads=threads), narrow) == 0, f"{threads=}"


@needs_vnni
@pytest.mark.parametrize("wtype", [Q.Q4_K, Q.Q5_K], ids=lambda t: t.name)
def test_q4k_q5k_extreme_blocks_give_reference_bits(jit, wtype):
    """Largest quants, scales and mins against +-127 activations (Q4_K's + 128 flip and its correction
    at their extremes, integer sums past 2^24): the reference's bits, wide = narrow."""
    n, k = 8, 512
    blocks = np.full((n, k // 256, LAYOUTS[wtype].block_bytes), 0xFF, np.uint8)
    blocks[:, :, 0:4] = np.array([1.0, 1.0], np.float16).view(np.uint8)
    blocks[4:, :, 16:] = 0  # quants 0: only the correction and the minimum remain
    raw = blocks.reshape(n, -1)
    x = np.full((17, k), 127.0, np.float32)
    x[1::3] = -127.0
    x[2::3, ::2] = -127.0
    want = numerics.matmul(x, numerics.DequantizedWeight(raw, wtype))
    assert _differ(quantized_matmul(x, raw, wtype, jit=jit), want) == 0
    assert _differ(quantized_matmul(x, raw, wtype, jit=jit, wide=False), want) == 0


def _q6k_blocks(n: int, k: int, *, quant: int, scale: int) -> np.ndarray:
    """Q6_K rows whose every quant is `quant` (0..63), every scale `scale`, d = 1."""
    blocks = np.zeros((n, k // 256, LAYOUTS[Q.Q6_K].block_bytes), np.uint8)
    blocks[:, :, 0:128] = (quant & 15) * 17  # both nibbles
    high = quant >> 4
    blocks[:, :, 128:192] = high | high << 2 | high << 4 | high << 6
    blocks[:, :, 192:208] = np.array(scale, np.int8).view(np.uint8)
    blocks[:, :, 208:210] = np.array([1.0], np.float16).view(np.uint8)
    return blocks.reshape(n, -1)


@needs_vnni
def test_q6k_extreme_blocks_give_reference_bits(jit):
    """Quants 63 and 0 (all weights -32), scales 127 and -128, against activations quantized to -127
    everywhere or +-127 mixed (each 4-weight dot near its 16-bit extreme, sums past 2^24): the
    reference's bits, wide = narrow."""
    k = 512
    raw = np.concatenate([_q6k_blocks(2, k, quant=q, scale=s) for q in (63, 0) for s in (127, -128)])
    x = np.full((17, k), 127.0, np.float32)  # Q8_K (scale -127 / the largest value): all -127
    x[1::3] = -127.0  # all -127 too, with d_x of the other sign
    x[2::3, ::2] = -127.0  # -127 and +127 alternating
    x[3] = np.where(np.arange(k) % 3 == 0, -127.0, 126.0)
    want = numerics.matmul(x, numerics.DequantizedWeight(raw, Q.Q6_K))
    assert _differ(quantized_matmul(x, raw, Q.Q6_K, jit=jit), want) == 0
    assert _differ(quantized_matmul(x, raw, Q.Q6_K, jit=jit, wide=False), want) == 0
