"""The generated vector expf (expf_ir.py) gives the C library's expf bit for bit, and the guard
falls back to the C library wherever it would not. The full proof, all 2^32 inputs, is
benchmarks/expf_exhaustive.py; these check a few million inputs, every edge, in seconds."""

from __future__ import annotations

import logging
import platform
import struct
from decimal import Decimal, localcontext
from functools import cache

import numpy as np
import pytest

from kinetic.codegen.common.libm import render_libm_map
from kinetic.codegen.cpu import expf_ir
from kinetic.codegen.cpu.expf_ir import (
    POLY,
    SSE2_DIFFERS,
    TABLE,
    agrees,
    compiled_map,
    differences,
    guard_inputs,
    render_expf_map,
    use_vector_expf,
)
from kinetic.codegen.cpu.target import host
from kinetic.ir import numerics

pytestmark = pytest.mark.skipif(numerics._LIBM is None, reason="the C library cannot be loaded")


def _glibc_fma_host() -> bool:
    """glibc 2.27+ picks its FMA build of expf on a CPU with FMA and AVX2: the one emit_expf renders."""
    name, version = platform.libc_ver()
    major_minor = tuple(int(p) for p in version.split(".")[:2]) if version else (0, 0)
    return name == "glibc" and major_minor >= (2, 27) and {"fma", "avx2"} <= host().flags


needs_glibc_fma = pytest.mark.skipif(not _glibc_fma_host(), reason="the host's expf is not glibc's FMA build")


@cache
def _libm():
    return compiled_map(render_libm_map("expf"))


@cache
def _vector(lanes: int, fused: bool = True):
    return compiled_map(render_expf_map(lanes, fused))


def _bit_range(lo: float, hi: float, step: int) -> np.ndarray:
    """Every step-th float32 bit pattern with lo <= x <= hi (0 <= lo or hi <= 0)."""
    a, b = (int(np.float32(v).view(np.uint32)) for v in (lo, hi))
    a, b = min(a, b), max(a, b)
    return np.arange(a, b + 1, step, dtype=np.uint64).astype(np.uint32)


def _edges() -> np.ndarray:
    f = np.float32
    specials = [0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 88.0, -88.0, 88.72283, 88.7229, -87.33654, -103.28,
                -103.972, -103.97208, -104.0, 1e-30, -1e-30, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38]
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FC12345, 0xFFFFFFFF],
                    np.uint32)
    thresholds = [float.fromhex(h) for h in ("0x1.62e42ep6", "-0x1.9fe368p6", "-0x1.9d1d9ep6")] + [88.0, -88.0]
    near = (np.array(thresholds, f).view(np.uint32)[:, None].astype(np.int64) + np.arange(-3000, 3001)).reshape(-1)
    k = np.arange(-150 * 32, 128 * 32 + 1)
    ln2_32 = np.log(2) / 32
    multiples = np.concatenate([(k * ln2_32).astype(f), ((k + 0.5) * ln2_32).astype(f)]).view(np.uint32)
    multiples = (multiples[:, None].astype(np.int64) + np.arange(-4, 5)).reshape(-1)
    subnormal_inputs = np.concatenate([np.arange(0, 2**23, 997), np.arange(2**31, 2**31 + 2**23, 997)])
    bits = np.concatenate([np.array(specials, f).view(np.uint32), nans, near.astype(np.uint32),
                           multiples.astype(np.uint32), subnormal_inputs.astype(np.uint32),
                           np.array(SSE2_DIFFERS, np.uint32)])
    return bits.view(np.float32)


def test_table_is_two_to_the_i_over_32():
    """TABLE[i] = bits(2^(i/32) rounded to nearest double) - (i << 47), and the constants are
    glibc's (the hex of 32/ln2, 1.5 * 2^52 and the polynomial divided by 32^3, 32^2, 32)."""
    with localcontext() as ctx:
        ctx.prec = 60
        for i, t in enumerate(TABLE):
            exact = float(Decimal(2) ** (Decimal(i) / 32))  # str -> float rounds to nearest
            assert t == struct.unpack("<Q", struct.pack("<d", exact))[0] - (i << 47)
    hexes = ["0x1.c6af84b912394p-5", "0x1.ebfce50fac4f3p-3", "0x1.62e42ff0c52d6p-1"]
    for c, h, k in zip(POLY, hexes, (3, 2, 1), strict=True):
        assert struct.unpack("<d", struct.pack("<Q", int(c, 16)))[0] == float.fromhex(h) / 32**k
    inv_ln2_n, shift = (struct.unpack("<d", struct.pack("<Q", int(h, 16)))[0]
                        for h in (expf_ir.INV_LN2_N, expf_ir.SHIFT))
    assert inv_ln2_n == float.fromhex("0x1.71547652b82fep0") * 32 and shift == 1.5 * 2**52


@needs_glibc_fma
@pytest.mark.parametrize("lanes", [16, 8])
def test_vector_expf_on_the_range_that_is_neither_0_nor_inf(lanes):
    """Every 499th float in [-104, 89] (4.5 million, stepping through every exponent), and every
    float whose expf is subnormal, [-103.98, -87.33]: the C library's bits."""
    x = np.concatenate([_bit_range(0.0, 89.0, 499), _bit_range(-0.0, -104.0, 499),
                        _bit_range(-87.33, -103.98, 1)]).view(np.float32)
    assert x.size > 6_000_000
    assert differences(_vector(lanes), _libm(), x).size == 0


@needs_glibc_fma
@pytest.mark.parametrize("lanes", [16, 8])
def test_vector_expf_on_edges_and_random_bits(lanes):
    """Signed zeros, infinities, NaNs (quiet, signalling, with payloads: x + x as glibc returns
    them), subnormal inputs, each special-case threshold and 3000 floats either side, the points
    near k ln2/32 and (k + 1/2) ln2/32 where the table index and round(x * 32/ln2) change, and 2
    million random bit patterns."""
    rng = np.random.default_rng(7)
    random_bits = rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([_edges(), random_bits.view(np.float32)])
    assert differences(_vector(lanes), _libm(), x).size == 0


@needs_glibc_fma
def test_compiled_libm_is_ctypes_libm_on_the_edges():
    """The comparisons above use compiled calls of expf; on the edge inputs they are the reference's
    ctypes calls (numerics.libm_f32), and so is the vector expf."""
    x = _edges()[::7]
    want = numerics.libm_f32("expf", x).view(np.uint32)
    assert np.array_equal(_libm()(x).view(np.uint32), want)
    assert np.array_equal(_vector(16)(x).view(np.uint32), want)


@needs_glibc_fma
def test_odd_lengths_touch_only_their_elements():
    """The map's masked last vector reads and writes nothing past n."""
    x = np.linspace(-5, 5, 40, dtype=np.float32)
    kernel = _vector(16).kernel
    for n in (0, 1, 7, 8, 9, 15, 16, 17, 33):
        y = np.full(40, np.float32(-7.0))
        kernel(x.ctypes.data, y.ctypes.data, n)
        assert np.array_equal(y[:n].view(np.uint32), _libm()(x[:n]).view(np.uint32))
        assert np.all(y[n:] == np.float32(-7.0))


@needs_glibc_fma
def test_guard_accepts_this_host_and_rejects_glibcs_sse2_build(caplog):
    """On glibc's FMA build the guard says yes; an expf that differs on even two inputs of 2^32
    (glibc's own SSE2 build, rendered unfused) is refused, with a debug log saying so."""
    assert use_vector_expf()
    assert agrees(_vector(16), _libm(), guard_inputs())
    with caplog.at_level(logging.DEBUG, logger="kinetic.codegen.cpu.expf_ir"):
        assert not agrees(_vector(16, fused=False), _libm(), guard_inputs())
    assert "differs from the C library's on 2 of" in caplog.text


def test_guard_inputs_cover_the_edges():
    """The guard's fixed set holds NaNs, both infinities, zeros, subnormals and the SSE2 inputs."""
    x = guard_inputs()
    assert 80_000 < x.size < 150_000
    assert np.isnan(x).any() and np.isposinf(x).any() and np.isneginf(x).any()
    assert (x == 0).any() and ((np.abs(x) < np.finfo(np.float32).tiny) & (x != 0)).any()
    assert set(SSE2_DIFFERS) <= set(x.view(np.uint32).tolist())


def test_softmax_follows_the_guard(monkeypatch):
    """render_softmax asks the guard by default: where it says no, the kernel calls the C library's
    expf lane by lane (the `_libm` kernel) and carries no vector expf."""
    from kinetic.codegen.cpu.attention_ir import render_softmax

    monkeypatch.setattr(expf_ir, "use_vector_expf", lambda: False)
    ir, name = render_softmax(64, 2, False)
    assert name.endswith("_libm") and "call float @expf" in ir and expf_ir.TABLE_GLOBAL not in ir
    monkeypatch.setattr(expf_ir, "use_vector_expf", lambda: True)
    ir, name = render_softmax(64, 2, False)
    assert not name.endswith("_libm") and "call float @expf" not in ir and expf_ir.TABLE_GLOBAL in ir


@pytest.mark.parametrize("n", [1, 7, 37, 300])
def test_softmax_is_the_same_with_8_lanes(monkeypatch, n):
    """An AVX2 host renders the softmax's first pass 8 keys a block, not 16: the same bits (ms, vs
    and outputs), with holes in the visibility and a masked last block."""
    import ctypes

    from kinetic.codegen.cpu.attention_ir import render_softmax
    from kinetic.codegen.cpu.jit import default_jit

    rng = np.random.default_rng(n)
    hd, heads = 64, 3
    scores = (rng.standard_normal(heads * n) * 4).astype(np.float32)
    vis = (rng.random(n) < 0.8).astype(np.uint8)
    vals = rng.standard_normal((n, hd)).astype(np.float16)
    signature = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 5 + [ctypes.c_int64] * 6))
    results = []
    for lanes in (16, 8):
        monkeypatch.setattr(expf_ir, "expf_lanes", lambda lanes=lanes: lanes)
        kernel = signature(default_jit().address(*render_softmax(hd, heads, False, True)))
        out, work = np.empty(heads * hd, np.float32), np.full(2 * heads * n, np.nan, np.float32)
        kernel(scores.ctypes.data, vis.ctypes.data, vals.ctypes.data, out.ctypes.data, work.ctypes.data, hd, 0, n,
               int(np.float32(0.125).view(np.uint32)), 0, n)
        results.append(np.concatenate([out, work]).view(np.uint32))
    assert np.array_equal(results[0], results[1])
