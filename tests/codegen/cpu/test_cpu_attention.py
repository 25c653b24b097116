"""What the compiled attention (step_attention.py, attention_ir.py) relies on: numba's float32
math.exp/math.tanh are the C library's expf/tanhf that the reference reaches through ctypes, and
the f32 -> f16 -> f32 rounding (LLVM fptrunc/fpext) is numpy's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit

from kinetic.codegen.cpu.native import round_f16
from kinetic.ir import numerics

pytestmark = pytest.mark.skipif(numerics._LIBM is None, reason="the C library cannot be loaded")


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


@njit
def _exp_all(x, out):
    for i in range(x.size):
        out[i] = np.float32(math.exp(x[i]))


@njit
def _tanh_all(x, out):
    for i in range(x.size):
        out[i] = np.float32(math.tanh(x[i]))


@njit
def _f16_all(x, out):
    for i in range(x.size):
        out[i] = round_f16(x[i])


def _special_inputs() -> np.ndarray:
    values = [0.0, -0.0, np.inf, -np.inf, 88.72283, 88.72284, 88.7229, -87.33654, -103.972, -104.0, 1e-30, -1e-30]
    return np.array(values + [20.0, -20.0, 9.0, -9.0], np.float32)


def test_numba_expf_is_libm_expf():
    """math.exp on float32 in numba calls the process's expf: checked against the reference's
    ctypes expf on two million arguments covering its range, including underflow and overflow."""
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-110, 90, 1_000_000), -rng.exponential(4.0, 1_000_000)]).astype(np.float32)
    x = np.concatenate([x, _special_inputs()])
    got = np.empty_like(x)
    _exp_all(x, got)
    assert np.array_equal(_bits(got), _bits(numerics.libm_f32("expf", x)))


def test_numba_tanhf_is_libm_tanhf():
    rng = np.random.default_rng(12)
    x = np.concatenate([rng.standard_normal(500_000) * 3, rng.uniform(-12, 12, 500_000)]).astype(np.float32)
    x = np.concatenate([x, _special_inputs()])
    got = np.empty_like(x)
    _tanh_all(x, got)
    assert np.array_equal(_bits(got), _bits(numerics.libm_f32("tanhf", x)))


def test_f16_rounding_is_numpys():
    """The accumulator's f32 -> f16 -> f32 rounding against numpy: random bit patterns and every f16
    value's neighbourhood (ties, just above/below ties, overflow, subnormals, signed zeros)."""
    rng = np.random.default_rng(13)
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    offsets = [0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, -1, -0x1000, -0x1001]
    near = np.concatenate([(h.astype(np.int64) + d) & 0xFFFFFFFF for d in offsets]).astype(np.uint32)
    b = rng.integers(0, 2**32, 4_000_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([b, near]).view(np.float32)
    with np.errstate(all="ignore"):
        ref = x.astype(np.float16).astype(np.float32)
    got = np.empty_like(x)
    _f16_all(x, got)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(_bits(got)[~nan], _bits(ref)[~nan])
