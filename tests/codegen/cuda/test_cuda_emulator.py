"""The host emulation itself: its arithmetic equals the reference's roundings, and it catches the
mistakes it claims to catch (out-of-bounds and misaligned accesses, writes to inputs, thread-index use
in warp-uniform code, a missing barrier)."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.cuda import emulator
from kinetic.codegen.cuda.kernel import Kernel, Param
from kinetic.ir import numerics

pytestmark = pytest.mark.skipif(emulator.unavailable_reason() is not None,
                                reason=emulator.unavailable_reason() or "")

N_VALUES = 4 * 65536


def _kernel(name: str, body: str, params: list[tuple[str, str]], threads: int = 256, blocks: int = 1) -> Kernel:
    return Kernel(name, "pointwise", threads, blocks, tuple(Param(n, t) for n, t in params), body)


ARITH = _kernel("arith", f"""\
  enum {{ N = {N_VALUES} }};
BODY
  LANES {{
    const long i = (long)BX * 256 + TID;
    if (i < N) {{
      const float v = LD(float, x, i);
      ST(u32, to_half, i, (u32)k_f2h(v));
      ST(float, from_half, i, k_h2f(LD(u16, halves, i)));
      ST(float, expf, i, k_expf_ggml(v));
      ST(float, libc, i, k_expf_libc(v));
      ST(int, rint, i, k_rint(v));
      ST(int, dp4a, i, k_dp4a(LD(int, a, i), LD(int, b, i), 7));
    }}
  }}
""", [("x", "const float*"), ("halves", "const u16*"), ("a", "const float*"), ("b", "const float*"),
      ("to_half", "float*"), ("from_half", "float*"), ("expf", "float*"), ("rint", "float*"), ("dp4a", "float*"),
      ("libc", "float*")],
    blocks=N_VALUES // 256)

READ_PAST_END = _kernel("read_past_end", """\
BODY
  LANES { ST(float, out, TID, LD(float, x, TID + 1)); }
""", [("x", "const float*"), ("out", "float*")], threads=32)

MISALIGNED = _kernel("misaligned", """\
BODY
  LANES { if (TID == 0) ST(float, out, 0, (float)LDB(u32, x, 2)); }
""", [("x", "const float*"), ("out", "float*")], threads=32)

WRITES_INPUT = _kernel("writes_input", """\
BODY
  LANES { ST(float, x, TID, 1.0f); }
""", [("x", "const float*"), ("out", "float*")], threads=32)

# warp 1 reads what warp 0 wrote to shared memory: right only with the barrier between
_SHARED_EXCHANGE = """\
  SHARED(float, box, 32);
BODY
  LANES {{ if (WARP == 0) box[LANE_ID] = LD(float, x, LANE_ID); }}
  {barrier}
  LANES {{ if (WARP == 1) ST(float, out, LANE_ID, box[LANE_ID]); }}
"""
WITH_BARRIER = _kernel("with_barrier", _SHARED_EXCHANGE.format(barrier="BARRIER();"),
                       [("x", "const float*"), ("out", "float*")], threads=64)
WITHOUT_BARRIER = _kernel("without_barrier", _SHARED_EXCHANGE.format(barrier=""),
                          [("x", "const float*"), ("out", "float*")], threads=64)

KERNELS = [ARITH, READ_PAST_END, MISALIGNED, WRITES_INPUT, WITH_BARRIER, WITHOUT_BARRIER]


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    cache = tmp_path_factory.mktemp("emulator")
    return {fwd: emulator.HostProgram(KERNELS, forward=fwd, cache_dir=cache) for fwd in (False, True)}


def _f16_ties_and_more(rng) -> np.ndarray:
    """Every finite f16 value as f32, the midpoints between neighbours (ties), and random floats."""
    h = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)  # 0 .. 65504
    mid = ((h[:-1].astype(np.float64) + h[1:]) / 2).astype(np.float32)  # exact in f32
    both = np.concatenate([h, mid])
    both = np.concatenate([both, -both])[: N_VALUES - 4096]
    extra = rng.standard_normal(N_VALUES - both.size).astype(np.float32) * 30
    return np.ascontiguousarray(np.concatenate([both, extra]).astype(np.float32))


def test_arithmetic_equals_reference_roundings(programs):
    """f32 -> f16 rounds to nearest even (every f16 tie included), f16 -> f32 is exact for all 65536
    patterns, rint rounds half to even, dp4a is the signed byte dot."""
    rng = np.random.default_rng(0)
    x = _f16_ties_and_more(rng)
    halves = np.tile(np.arange(65536, dtype=np.uint16), N_VALUES // 65536)
    a = rng.integers(-(2**31), 2**31, N_VALUES, dtype=np.int64).astype(np.int32).view(np.float32)
    b = rng.integers(-(2**31), 2**31, N_VALUES, dtype=np.int64).astype(np.int32).view(np.float32)
    outs = [np.zeros(N_VALUES, np.float32) for _ in range(6)]
    programs[False].launch("arith", 1, x, halves, a, b, *outs)
    to_half, from_half, _, rint, dp4a, _ = outs
    with np.errstate(over="ignore"):
        assert np.array_equal(to_half.view(np.uint32), x.astype(np.float16).view(np.uint16).astype(np.uint32))
    ref = halves.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(from_half.view(np.uint32)[~nan], ref.view(np.uint32)[~nan]) and np.isnan(from_half[nan]).all()
    small = np.abs(x) < 2e9
    assert np.array_equal(rint.view(np.int32)[small], np.rint(x[small]).astype(np.int32))
    ai, bi = a.view(np.int8).reshape(-1, 4).astype(np.int32), b.view(np.int8).reshape(-1, 4).astype(np.int32)
    assert np.array_equal(dp4a.view(np.int32), (ai * bi).sum(axis=1) + 7)


def test_exp_polynomial_equals_reference(programs):
    """k_expf_ggml (SiLU's exp) equals numerics.expf_ggml bit for bit over [-110, 110], across the
    saturation at |n| = 192 and into the subnormal results."""
    x = np.ascontiguousarray(np.linspace(-110, 110, N_VALUES, dtype=np.float32))
    outs = [np.zeros(N_VALUES, np.float32) for _ in range(6)]
    zeros = np.zeros(N_VALUES, np.float32)
    programs[False].launch("arith", 1, x, np.zeros(N_VALUES, np.uint16), zeros, zeros, *outs)
    with np.errstate(all="ignore"):
        assert np.array_equal(outs[2].view(np.uint32), numerics.expf_ggml(x).view(np.uint32))


@pytest.mark.parametrize("kernel,what", [("read_past_end", "outside every buffer"), ("misaligned", "misaligned"),
                                         ("writes_input", "a write to an input")])
def test_bad_accesses_raise(programs, kernel, what):
    """A read past a buffer's end, a misaligned 4-byte load and a write through an input pointer each
    raise EmulationError naming the buffer."""
    x, out = np.zeros(32, np.float32), np.zeros(32, np.float32)
    with pytest.raises(emulator.EmulationError, match=what):
        programs[False].launch(kernel, 1, x, out)


def test_missing_barrier_shows_as_order_dependence(programs):
    """Warp 1 reading warp 0's shared-memory writes gets them in both thread orders with a barrier
    between, and misses them in one order without it: the order comparison catches missing barriers."""
    x = np.arange(32, dtype=np.float32) + 1
    results = {}
    for name in ("with_barrier", "without_barrier"):
        for fwd, prog in programs.items():
            out = np.zeros(32, np.float32)
            prog.launch(name, 1, x, out)
            results[name, fwd] = out
    assert np.array_equal(results["with_barrier", False], x) and np.array_equal(results["with_barrier", True], x)
    assert not np.array_equal(results["without_barrier", False], results["without_barrier", True])


def test_thread_index_in_uniform_code_does_not_compile(tmp_path):
    """A loop bound that depends on the thread index (divergent control flow around a shuffle) is
    rejected by the host compiler: TID is only defined inside LANES."""
    bad = _kernel("divergent", """\
  LANE(float, v);
BODY
  for (int i = 0; i < TID; ++i) { SHFL_XOR(v, v, 1); }
""", [("out", "float*")], threads=32)
    with pytest.raises(emulator.EmulationError, match="rejected"):
        emulator.HostProgram([bad], cache_dir=tmp_path)


def test_barrier_inside_a_loop_is_refused():
    """A barrier inside a loop (which the lockstep emulation cannot order) is refused when the kernel is
    made."""
    with pytest.raises(ValueError, match="top level"):
        _kernel("looped_barrier", """\
BODY
  for (int i = 0; i < 2; ++i) { BARRIER(); }
""", [("out", "float*")], threads=64)


def test_shuffle_inside_lanes_does_not_compile(tmp_path):
    """A shuffle written inside a LANES block (where the host would run it lane by lane) is rejected by
    the host compiler."""
    bad = _kernel("shuffle_in_lanes", """\
  LANE(float, v);
BODY
  LANES { SHFL_XOR(v, v, 1); }
""", [("out", "float*")], threads=32)
    with pytest.raises(emulator.EmulationError, match="rejected"):
        emulator.HostProgram([bad], cache_dir=tmp_path)


def test_libc_expf_equals_the_c_library(programs):
    """k_expf_libc (attention's exp) equals the process's C library expf, which the reference calls, on
    a dense sweep of [-110, 100] plus glibc's thresholds, infinities and the two inputs where glibc's
    non-FMA build differs."""
    x = np.linspace(-110, 100, N_VALUES - 16, dtype=np.float32)
    special = [np.inf, -np.inf, 88.72283, 88.72284, -103.97207, -103.278931, -104.0, 0.0, -0.0, 1e-30]
    special += [np.uint32(0x4202422F).view(np.float32), np.uint32(0xC27C65D9).view(np.float32)]
    x = np.ascontiguousarray(np.concatenate([x, np.array(special + [1.0] * (16 - len(special)), np.float32)]))
    outs = [np.zeros(N_VALUES, np.float32) for _ in range(6)]
    zeros = np.zeros(N_VALUES, np.float32)
    programs[False].launch("arith", 1, x, np.zeros(N_VALUES, np.uint16), zeros, zeros, *outs)
    assert np.array_equal(outs[5].view(np.uint32), numerics.libm_f32("expf", x).view(np.uint32))
