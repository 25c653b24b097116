"""The Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS and MXFP4 references (kinetic/ir/quant_dots.py + numerics):
their integer parts are gguf's dequantization, their dots equal the dequantized dot to rounding, and,
where a llama.cpp build is at hand, they are llama.cpp's own CPU results bit for bit."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from kinetic.ir import numerics, quant_dots
from kinetic.ir.quants import dequantize

F32 = np.float32
TYPES = [Q.Q2_K, Q.Q3_K, Q.Q5_K, Q.IQ4_XS, Q.IQ4_NL, Q.MXFP4, Q.Q4_0]
F16_AT = {Q.Q4_0: (0,), Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q5_K: (0, 2), Q.IQ4_XS: (0,), Q.IQ4_NL: (0,), Q.MXFP4: (),
          Q.Q4_K: (0, 2), Q.Q6_K: (208,), Q.Q8_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,)}
LLAMA_CPP_LIB = Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin"
ids = [t.name for t in TYPES]


def random_raw(rng: np.random.Generator, wtype: Q, n: int, k: int, scale: float = 0.02) -> np.ndarray:
    """u8 [n, row_bytes]: random bytes with N(0, scale) f16 scales (MXFP4: exponents for 2^-14 .. 2^-3)."""
    block, block_bytes = GGML_QUANT_SIZES[wtype]
    blocks = rng.integers(0, 256, (n, k // block, block_bytes), dtype=np.uint8)
    for off in F16_AT[wtype]:
        d = (rng.standard_normal(blocks.shape[:2]) * scale).astype(np.float16)
        blocks[:, :, off : off + 2] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
    if wtype is Q.MXFP4:
        blocks[:, :, 0] = rng.integers(114, 126, blocks.shape[:2])
    return blocks.reshape(n, -1)


def _k(wtype: Q) -> int:
    return 768 if GGML_QUANT_SIZES[wtype][0] == 256 else 352


@pytest.mark.parametrize("wtype", TYPES, ids=ids)
def test_integer_parts_are_gguf_dequantization(wtype):
    """d * weights - dmin * mins, put back in block order, is gguf's dequantized weight to float
    rounding (a wrong nibble, bit plane, scale or lane permutation would be off by whole steps)."""
    raw = random_raw(np.random.default_rng(int(wtype)), wtype, 9, _k(wtype))
    parts = quant_dots.integer_parts(raw, wtype)
    want = dequantize(raw, wtype).reshape(9, -1).astype(np.float64)
    got = quant_dots.values(parts)
    assert np.all(np.abs(got - want) <= 1e-6 * np.abs(want).max(axis=1, keepdims=True))


@pytest.mark.parametrize("wtype", TYPES, ids=ids)
def test_matmul_is_the_dequantized_dot_to_rounding(wtype):
    """numerics.matmul equals the float64 dot of gguf's dequantized weight with the quantized
    activations within 1e-6 of the sum of |products|, and each row alone gives the same bits."""
    rng = np.random.default_rng([3, int(wtype)])
    k = _k(wtype)
    raw = random_raw(rng, wtype, 23, k)
    x = rng.standard_normal((5, k)).astype(F32)
    got = numerics.matmul(x, numerics.DequantizedWeight(raw, wtype))
    xq = numerics.quantized_activations(x, numerics.activation_format(wtype)).astype(np.float64)
    values = dequantize(raw, wtype).reshape(23, -1).astype(np.float64)
    assert np.all(np.abs(got - xq @ values.T) <= 1e-6 * (np.abs(xq) @ np.abs(values).T) + 1e-30)
    for r in range(5):
        w = numerics.DequantizedWeight(raw, wtype)
        assert np.array_equal(numerics.matmul(x[r : r + 1], w)[0].view(np.uint32), got[r].view(np.uint32))


def test_iq4_nl_follows_the_repacked_gemv_order():
    """IQ4_NL (repacked on x86, ggml_gemv_iq4_nl_8x8_q8_0): per block the whole integer dot, then
    acc = fma(f32(dot), d_w * d_x, acc) with one float per output, no lanes."""
    rng = np.random.default_rng(5)
    raw = random_raw(rng, Q.IQ4_NL, 1, 96)
    x = rng.standard_normal((1, 96)).astype(F32)
    qx, dx = numerics.quantize_q8_0(x)
    blocks = raw.reshape(3, 18)
    acc = F32(0)
    for b in range(3):
        nib = np.concatenate([blocks[b, 2:] & 15, blocks[b, 2:] >> 4])
        dot = int((quant_dots.IQ4NL_VALUES[nib].astype(np.int64) * qx[0, b]).sum())
        d = blocks[b, 0:2].copy().view(np.float16)[0].astype(F32)
        acc = numerics.fma_f32(F32(dot), F32(d * dx[0, b]), acc)
    got = numerics.matmul(x, numerics.DequantizedWeight(raw, Q.IQ4_NL))[0, 0]
    assert got.view(np.uint32) == F32(acc).view(np.uint32)


def test_e8m0_half_is_ggmls():
    """MXFP4's scale: 2^(e - 128), with e = 0 and 1 the float32 subnormals 2^-128 and 2^-127."""
    e = np.arange(256, dtype=np.uint8)
    got = quant_dots.e8m0_half(e).astype(np.float64)
    assert got[0] == 2.0**-128 and got[1] == 2.0**-127
    assert np.array_equal(got[2:], 2.0 ** (e[2:].astype(np.float64) - 128))


# -- llama.cpp's own CPU backend, where a build is at hand -------------------------------------------


class _Ggml:
    """Just enough of ggml's C API (through ctypes) to run one mul_mat on the CPU backend, with the
    weight in the repacking buffer type (as llama.cpp loads weights) or a plain CPU buffer."""

    def __init__(self, lib_dir: Path):
        self.base = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.ggml = ctypes.CDLL(str(lib_dir / "libggml.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(str(lib_dir / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        p, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
        sig = {
            "ggml_init": (p, [_InitParams]), "ggml_new_tensor_2d": (p, [p, ctypes.c_int, i64, i64]),
            "ggml_mul_mat": (p, [p, p, p]), "ggml_new_graph": (p, [p]), "ggml_build_forward_expand": (None, [p, p]),
            "ggml_nbytes": (sz, [p]), "ggml_free": (None, [p]),
            "ggml_backend_cpu_init": (p, []), "ggml_backend_cpu_set_n_threads": (None, [p, ctypes.c_int]),
            "ggml_backend_cpu_reg": (p, []), "ggml_backend_reg_dev_get": (p, [p, sz]),
            "ggml_backend_reg_get_proc_address": (p, [p, ctypes.c_char_p]),
            "ggml_backend_buft_name": (ctypes.c_char_p, [p]), "ggml_backend_cpu_buffer_type": (p, []),
            "ggml_backend_alloc_ctx_tensors_from_buft": (p, [p, p]),
            "ggml_backend_tensor_set": (None, [p, p, sz, sz]), "ggml_backend_tensor_get": (None, [p, p, sz, sz]),
            "ggml_gallocr_new": (p, [p]), "ggml_gallocr_alloc_graph": (ctypes.c_bool, [p, p]),
            "ggml_backend_graph_compute": (ctypes.c_int, [p, p]), "ggml_backend_buffer_free": (None, [p]),
            "ggml_gallocr_free": (None, [p]), "ggml_backend_free": (None, [p]),
        }
        for name, (res, args) in sig.items():
            fn = next(getattr(lib, name) for lib in (self.cpu, self.ggml, self.base) if hasattr(lib, name))
            fn.restype, fn.argtypes = res, args
            setattr(self, name.removeprefix("ggml_"), fn)

    def repack_buffer_type(self):
        reg = self.backend_cpu_reg()
        getter = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(
            self.backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts"))
        bufts = getter(self.backend_reg_dev_get(reg, 0))
        i = 0
        while bufts[i]:
            if b"REPACK" in self.backend_buft_name(bufts[i]):
                return bufts[i]
            i += 1
        return None

    def matmul_rows(self, x: np.ndarray, raw: np.ndarray, wtype: Q, repack: bool) -> np.ndarray:
        """Each activation row alone through ggml_mul_mat (llama.cpp's decode path), 1 thread."""
        n, (m, k) = raw.shape[0], x.shape
        backend = self.backend_cpu_init()
        self.backend_cpu_set_n_threads(backend, 1)
        ctx_w = self.init(_InitParams(1 << 20, None, True))
        w = self.new_tensor_2d(ctx_w, int(wtype), k, n)
        buft = self.repack_buffer_type() if repack else self.backend_cpu_buffer_type()
        wbuf = self.backend_alloc_ctx_tensors_from_buft(ctx_w, buft)
        raw = np.ascontiguousarray(raw)
        assert self.nbytes(w) == raw.nbytes
        self.backend_tensor_set(w, raw.ctypes.data, 0, raw.nbytes)
        ctx = self.init(_InitParams(1 << 20, None, True))
        xt = self.new_tensor_2d(ctx, 0, k, 1)  # GGML_TYPE_F32
        y = self.mul_mat(ctx, w, xt)
        graph = self.new_graph(ctx)
        self.build_forward_expand(graph, y)
        galloc = self.gallocr_new(self.backend_cpu_buffer_type())
        assert self.gallocr_alloc_graph(galloc, graph)
        out = np.empty((m, n), F32)
        for r in range(m):
            row = np.ascontiguousarray(x[r], F32)
            self.backend_tensor_set(xt, row.ctypes.data, 0, row.nbytes)
            assert self.backend_graph_compute(backend, graph) == 0
            self.backend_tensor_get(y, out[r].ctypes.data, 0, out[r].nbytes)
        self.gallocr_free(galloc)
        self.free(ctx)
        self.backend_buffer_free(wbuf)
        self.free(ctx_w)
        self.backend_free(backend)
        return out


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@pytest.fixture(scope="module")
def ggml():
    if not (LLAMA_CPP_LIB / "libggml-cpu.so").exists():
        pytest.skip(f"no llama.cpp build in {LLAMA_CPP_LIB}")
    return _Ggml(LLAMA_CPP_LIB)


# the types llama.cpp repacks on AVX2 / AVX-512 machines (ggml-cpu/repack.cpp,
# ggml_repack_get_optimal_repack_type; Q2_K needs AVX-512), when the row count is a multiple of 8
REPACKED = {Q.Q2_K, Q.Q4_0, Q.IQ4_NL, Q.MXFP4, Q.Q4_K}


@pytest.mark.parametrize("wtype", TYPES + [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q4_1, Q.Q5_0], ids=lambda t: t.name)
def test_reference_is_llama_cpps_own_cpu_result(ggml, wtype):
    """Random weights and activations of mixed magnitudes: numerics.matmul is bit for bit what
    llama.cpp's CPU backend computes for each row alone (its decode path), weights loaded as
    llama.cpp loads them (repacked where it repacks). Needs a llama.cpp build for this host."""
    if wtype is Q.Q2_K and "avx512f" not in _host_flags():
        pytest.skip("llama.cpp repacks Q2_K only with AVX-512")
    rng = np.random.default_rng([17, int(wtype)])
    block = GGML_QUANT_SIZES[wtype][0]
    k = 1024 if block == 256 else 352
    raw = random_raw(rng, wtype, 64, k, scale=0.05)
    x = (rng.standard_normal((6, k)) * np.float32(10.0) ** rng.integers(-3, 3, (6, 1))).astype(F32)
    want = ggml.matmul_rows(x, raw, wtype, repack=wtype in REPACKED)
    got = numerics.matmul(x, numerics.DequantizedWeight(raw, wtype))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def _host_flags() -> set[str]:
    from kinetic.codegen.cpu.target import host

    return set(host().flags)
