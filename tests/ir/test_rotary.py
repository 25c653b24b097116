"""Rotary scaling in the reference (kinetic/ir/numerics/rotary.py): YaRN's correction dimensions and
magnitude, frequency factors, and the whole rotation bit for bit what llama.cpp's own CPU backend
computes (ggml_rope_ext through ctypes, where a llama.cpp build is at hand)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from kinetic.ir import numerics as nx
from kinetic.ir.interpreter import evaluate
from kinetic.ir.ops import Op, RopeAttrs
from tests.rotary_cases import SCALINGS, scaled

F32 = np.float32
LLAMA_CPP_LIB = Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin"


def test_yarn_corr_dims_are_ggmls_for_a_small_original_context():
    """n_rot 64, base 10000, original context 64, betas 32 / 1: the ramp runs from pair
    max(0, floor(-3.97)) = 0 to ceil(8.07) = 9 (ggml_rope_yarn_corr_dims, by hand in float64 here)."""
    r = nx.Rotary(64, 10000.0, 0.25, 1.0, 1.0, 64, 32.0, 1.0)
    low, high = nx.yarn_corr_dims(r)
    dim = lambda beta: 64 * np.log(64 / (beta * 2 * np.pi)) / (2 * np.log(10000.0))  # noqa: E731
    assert (float(low), float(high)) == (max(0.0, np.floor(dim(32.0))), np.ceil(dim(1.0))) == (0.0, 9.0)


def test_yarn_mixes_extrapolation_below_the_ramp_and_interpolation_above():
    """Pairs below the ramp keep the unscaled angle (mix 1), pairs past it the scaled one (mix 0)."""
    r = nx.Rotary(64, 10000.0, 0.25, 1.0, 1.0, 64)
    plain = nx.rope_angles(np.array([40]), nx.Rotary(64, 10000.0))[0]
    linear = nx.rope_angles(np.array([40]), nx.Rotary(64, 10000.0, 0.25))[0]
    yarn = nx.rope_angles(np.array([40]), r)[0]
    assert yarn[0] == plain[0] and np.array_equal(yarn[9:], linear[9:])
    assert np.all((yarn[1:9] > linear[1:9]) & (yarn[1:9] < plain[1:9]))


def test_huge_frequency_factors_leave_pairs_unrotated():
    """A factor of 1e30 (Gemma 4's proportional rotary) makes the angle about 1e-27: cos exactly 1,
    sin below 1e-20, so those pairs come out as they went in up to that."""
    r = nx.Rotary(8, 10000.0, freq_factors=(1.0, 1.0, 1e30, 1e30))
    cos, sin = nx.rope_cos_sin(np.array([1000]), r)
    assert np.all(cos[0, 2:] == 1) and np.all(np.abs(sin[0, 2:]) < 1e-20)
    assert np.array_equal(cos[0, :2], nx.rope_cos_sin(np.array([1000]), nx.Rotary(8, 10000.0))[0][0, :2])


def test_yarn_magnitude_is_the_attention_factor_times_ggmls_own():
    """mscale = attn_factor * fma(0.1, logf(1/freq_scale), 1) with YaRN, attn_factor alone without."""
    assert nx.rope_mscale(nx.Rotary(64, 1e4, 0.25, 0.0, 0.75)) == F32(0.75)
    want = F32(F32(0.75) * F32(1 + 0.1 * float(nx.logf(4.0))))
    assert nx.rope_mscale(nx.Rotary(64, 1e4, 0.25, 1.0, 0.75, 64)) == want


# -- llama.cpp's own CPU backend, where a build is at hand -------------------------------------------


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class _GgmlRope:
    """ggml_rope_ext on ggml's CPU backend through its C API (ctypes), one thread."""

    def __init__(self, lib_dir: Path):
        libs = [ctypes.CDLL(str(lib_dir / name), mode=ctypes.RTLD_GLOBAL)
                for name in ("libggml-base.so", "libggml.so", "libggml-cpu.so")]
        p, i64, i, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
        sig = {"ggml_init": (p, [_InitParams]), "ggml_free": (None, [p]),
               "ggml_new_tensor_1d": (p, [p, i, i64]), "ggml_new_tensor_3d": (p, [p, i, i64, i64, i64]),
               "ggml_rope_ext": (p, [p, p, p, p, i, i, i, f, f, f, f, f, f]), "ggml_get_data": (p, [p]),
               "ggml_new_graph": (p, [p]), "ggml_build_forward_expand": (None, [p, p]),
               "ggml_graph_compute_with_ctx": (i, [p, p, i])}
        for name, (res, args) in sig.items():
            fn = next(getattr(lib, name) for lib in reversed(libs) if hasattr(lib, name))
            fn.restype, fn.argtypes = res, args
            setattr(self, name.removeprefix("ggml_"), fn)

    def rope(self, x: np.ndarray, positions: np.ndarray, a: RopeAttrs) -> np.ndarray:
        rows = x.shape[0]
        ctx = self.init(_InitParams(64 << 20, None, False))
        try:
            xt = self.new_tensor_3d(ctx, 0, a.head_dim, a.n_head, rows)  # GGML_TYPE_F32
            pt = self.new_tensor_1d(ctx, 26, rows)  # GGML_TYPE_I32
            ft = self.new_tensor_1d(ctx, 0, a.n_rot // 2) if a.freq_factors else None
            _put(self.get_data(xt), np.ascontiguousarray(x, F32))
            _put(self.get_data(pt), np.ascontiguousarray(positions, np.int32))
            if ft:
                _put(self.get_data(ft), np.asarray(a.freq_factors, F32))
            y = self.rope_ext(ctx, xt, pt, ft, a.n_rot, 2 if a.neox else 0, a.yarn_orig_ctx, a.theta, a.freq_scale,
                              a.yarn_ext_factor, a.yarn_attn_factor, a.yarn_beta_fast, a.yarn_beta_slow)
            graph = self.new_graph(ctx)
            self.build_forward_expand(graph, y)
            assert self.graph_compute_with_ctx(ctx, graph, 1) == 0
            out = np.empty_like(x, F32)
            ctypes.memmove(out.ctypes.data, self.get_data(y), out.nbytes)
            return out
        finally:
            self.free(ctx)


def _put(address: int, values: np.ndarray) -> None:
    ctypes.memmove(address, values.ctypes.data, values.nbytes)


@pytest.fixture(scope="module")
def ggml():
    if not (LLAMA_CPP_LIB / "libggml-cpu.so").exists():
        pytest.skip(f"no llama.cpp build in {LLAMA_CPP_LIB}")
    return _GgmlRope(LLAMA_CPP_LIB)


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_reference_rope_is_llama_cpps_own_cpu_result(ggml, scaling, neox):
    """Each scaling, both layouts, partial rotation, positions across YaRN's original context: the
    reference's rope is bit for bit ggml_rope_ext on llama.cpp's CPU backend. Needs a llama.cpp build."""
    a = scaled(RopeAttrs(n_head=3, head_dim=64, n_rot=48, theta=10000.0, neox=neox), scaling)
    rng = np.random.default_rng(5)
    positions = np.array([0, 1, 5, 63, 64, 200, 1000, 4095, 32767], np.int32)
    x = (rng.standard_normal((len(positions), 3 * 64)) * 4).astype(F32)
    want = ggml.rope(x, positions, a)
    got = evaluate(Op.ROPE, [x, positions], a)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_frequency_factors_round_trip_through_the_text_form_and_are_checked():
    """A rope node's freq_factors print as a bracketed list that reads back to the same floats (1e30
    included), and the verifier refuses a list of the wrong length or a factor that is not positive."""
    from kinetic.ir.ops import VerifyError
    from kinetic.ir.text import parse_graph, print_graph

    factors = "[1.0, 2.5, 8.0, 1e+30]"
    text = f"""
%0 = input() {{name="tokens"}} : i32[T]
%1 = input() {{name="positions"}} : i32[T]
%2 = param() {{tensor="token_embd.weight"}} : q8_0[24,32]
%3 = embed(%2, %0) : f32[T,32]
%4 = rope(%3, %1) {{n_head=4, head_dim=8, n_rot=8, theta=10000.0, neox=true, freq_factors={factors}}} : f32[T,32]
output y = %4
"""
    graph = parse_graph(text)
    assert graph.node(4).attrs.freq_factors == (1.0, 2.5, 8.0, 1e30)
    assert parse_graph(print_graph(graph)) == graph
    for bad in ("[1.0, 2.0]", "[1.0, 2.0, 0.0, 1.0]", "[1.0, 2.0, nan, 1.0]"):
        with pytest.raises((VerifyError, ValueError)):
            parse_graph(text.replace(factors, bad))
