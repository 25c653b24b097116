"""The float primitives the reference builds on: the C library's float functions and a true fma.

Owns: loading the C library's tanhf, cosf, sinf, expf, logf and powf (ggml calls them; numpy's float32
versions differ in the last bit often enough to matter) and `fma_f32`, a fused multiply-add that
rounds once as the hardware's does. Does not own any op's meaning (the sibling modules do).
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

F32 = np.float32


def _load_libm():
    """The C library's float functions (ggml calls tanhf, cosf, sinf, powf; numpy's own float32
    versions differ from them in the last bit often enough to matter). None where unavailable."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        for name in ("tanhf", "cosf", "sinf", "expf", "logf"):
            getattr(lib, name).restype = ctypes.c_float
            getattr(lib, name).argtypes = [ctypes.c_float]
        lib.powf.restype = ctypes.c_float
        lib.powf.argtypes = [ctypes.c_float, ctypes.c_float]
        return lib
    except (OSError, AttributeError):
        return None


_LIBM = _load_libm()


def libm_f32(name: str, x: np.ndarray) -> np.ndarray:
    """Apply the C library's float function `name` (tanhf, cosf, sinf) elementwise; numpy's float32
    function where the C library cannot be loaded."""
    x = np.asarray(x, F32)
    if _LIBM is None:
        return {"tanhf": np.tanh, "cosf": np.cos, "sinf": np.sin, "expf": np.exp}[name](x).astype(F32)
    fn = getattr(_LIBM, name)
    return np.fromiter((fn(float(v)) for v in x.reshape(-1)), F32, x.size).reshape(x.shape)


def powf(base: float, exponent: float) -> np.float32:
    if _LIBM is None:
        return F32(np.power(np.float64(F32(base)), np.float64(F32(exponent))))
    return F32(_LIBM.powf(float(F32(base)), float(F32(exponent))))


def logf(x: float) -> np.float32:
    """The C library's logf of one float32 (ggml's YaRN arithmetic)."""
    if _LIBM is None:
        return F32(np.log(F32(x)))
    return F32(_LIBM.logf(float(F32(x))))


# FLT_MAX plus half its ulp: a sum at or past it rounds to infinity, one below it to FLT_MAX
_OVERFLOW_EDGE = float.fromhex("0x1.ffffffp+127")
_F32_MAX = np.finfo(F32).max


def fma_f32(a, b, c) -> np.ndarray:
    """A true fused multiply-add of float32 operands: a*b + c rounded once to float32, as the
    hardware's fma (and ggml's compiled code) gives it, overflow to +-inf included. a*b is exact in
    float64; the float64 sum s is corrected by its exact error e (TwoSum), which matters only when s
    lies exactly halfway between two float32 values: then the true sum is on e's side of that
    midpoint. Past the largest float the midpoint is the overflow edge (FLT_MAX + half an ulp): a
    sum rounded to infinity is FLT_MAX only when s is exactly the edge and e points back below it."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c64 = np.asarray(c, np.float64)
    with np.errstate(all="ignore"):
        s = p + c64
        bb = s - p
        e = (p - (s - bb)) + (c64 - bb)
        r = s.astype(F32)
        overflow = np.isinf(r) & np.isfinite(s)  # no float lies past FLT_MAX to be a tie's other side
        d = s - r.astype(np.float64)
        toward = np.nextafter(r, np.where(d > 0, F32(np.inf), F32(-np.inf)).astype(F32))
        tie = (d != 0) & ~overflow & (np.abs(d) * 2 == np.abs(toward.astype(np.float64) - r.astype(np.float64)))
        fix = tie & (e != 0) & ((e > 0) == (d > 0))
        below_edge = overflow & (np.abs(s) == _OVERFLOW_EDGE) & (e != 0) & ((e > 0) != (s > 0))
    r = np.where(fix, toward, r)
    return np.where(below_edge, np.copysign(_F32_MAX, s), r).astype(F32)
