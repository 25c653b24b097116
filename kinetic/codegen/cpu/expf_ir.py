"""A vector expf bit for bit the C library's (glibc 2.27+ on x86-64 with FMA), and the guard that
decides whether this process may use it.

Owns: `emit_expf(fn, x, lanes)`, which writes into a kernel being rendered the instructions of expf
on `<lanes x float>` (16 lanes on AVX-512, 8 on AVX2: `expf_lanes()`); `render_expf_map(lanes)`, a
kernel y[i] = expf(x[i]) built on it (for the tests and the guard); and `use_vector_expf()`, the
guard. It does not own where expf is called (attention_ir.py).

The algorithm is glibc's `__expf` (sysdeps/ieee754/flt-32/e_expf.c, from ARM's optimized-routines),
evaluated in double precision:

    z = x * 32/ln2;  k = round(z) (ties to even, through the shift 0x1.8p52);  r = z - k
    expf(x) = 2^(k/32) * 2^(r/32) ~= s * (C0 r^3 + C1 r^2 + C2 r + 1),   s = 2^((k mod 32)/32) * 2^(k div 32)

with s put together from a 32-entry table (`TABLE`) plus k shifted into the exponent field, and the
result rounded once to float. The table and constants are kinetic/codegen/common/expf.py's, which
the CUDA and Vulkan kernels read too. Bit-identity needs glibc's exact operations. x86-64 glibc picks by
ifunc `__expf_fma` when the CPU has FMA and AVX2; disassembling this host's libm.so.6 (Debian glibc
2.36) shows which operations GCC fused there, and this file fuses the same ones:

    kd + shift = fma(InvLn2N, x, shift)     r = fma(InvLn2N, x, -kd)     (z itself is never rounded)
    fma(r, C0, C1);  r2 = r * r;  fma(r, C2, 1);  fma(that, r2, this);  times s;  to float

and its special cases for |x| >= 88 (expf(-inf) = 0, NaN -> x + x, x > 0x1.62e42ep6 -> inf, x <
-0x1.9fe368p6 -> 0, x < -0x1.9d1d9ep6 -> 0x1.4p-75f * 0x1.4p-75f = the smallest subnormal: glibc's
errno-setting underflow paths). No fast-math flags: LLVM must not contract or reorder anything.

Proof: benchmarks/expf_exhaustive.py compares all 2^32 float bit patterns with the host's expf (no
difference on this machine); tests/codegen/cpu/test_cpu_expf.py checks a few million in CI. The
guard repeats a ~100k-value check at first use, since another C library (musl, an older glibc) or
a CPU without FMA (glibc then runs its SSE2 build, which rounds z) gives other last bits: where any
value differs, kernels call the C library's expf instead. The exactness contract beats speed.
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache

import numpy as np

from kinetic.codegen.common import expf
from kinetic.codegen.common.expf import INV_LN2_N, POLY, SHIFT, SSE2_DIFFERS, TABLE
from kinetic.codegen.cpu.llvm_ir import Function, const_vec, f32_literal, module

log = logging.getLogger(__name__)

# glibc's table and constants (kinetic/codegen/common/expf.py, shared with the CUDA and Vulkan
# kernels); the thresholds spelled as LLVM float literals
OVERFLOW = f32_literal(expf.OVERFLOW)  # above: inf
UNDERFLOW = f32_literal(expf.UNDERFLOW)  # below: 0
MAY_UNDERFLOW = f32_literal(expf.MAY_UNDERFLOW)  # below: the smallest subnormal
TABLE_GLOBAL = "@kin_expf_tab"


def declarations(lanes: int) -> list[str]:
    """What a module using `emit_expf(..., lanes)` must declare (the table is private: every kernel
    module carries its own copy, so two never clash in the JIT)."""
    table = ", ".join(f"i64 {t}" for t in TABLE)
    return [
        f"{TABLE_GLOBAL} = private unnamed_addr constant [32 x i64] [{table}], align 64",
        f"declare <{lanes} x double> @llvm.fma.v{lanes}f64(<{lanes} x double>, <{lanes} x double>, <{lanes} x double>)",
        f"declare <{lanes} x i64> @llvm.masked.gather.v{lanes}i64.v{lanes}p0(<{lanes} x ptr>, <{lanes} x i1>, "
        f"<{lanes} x i64>)",
    ] + ([PERMUTE_DECLARATION] if _table_in_registers(lanes) else [])


def expf_lanes() -> int:
    """16 lanes where the host has AVX-512, else 8 (the width changes speed, never a value)."""
    from kinetic.codegen.cpu.target import host

    return 16 if "avx512f" in host().flags else 8


def emit_expf(fn: Function, x: str, lanes: int, fused: bool = True) -> str:
    """Write expf of x (`<lanes x float>`) into fn, glibc's operations lane by lane; returns the
    result (`<lanes x float>`). fused=False: the operations of glibc's SSE2 build (no FMA), which
    differ from the FMA build's on two inputs of 2^32 (`SSE2_DIFFERS`); only the tests use it."""
    d = f"<{lanes} x double>"
    i64 = f"<{lanes} x i64>"

    def fma(a: str, b: str, c: str) -> str:  # a * b + c, operands untyped
        if not fused:
            return fn.v(f"fadd {d} {fn.v(f'fmul {d} {a}, {b}')}, {c}")
        return fn.v(f"call {d} @llvm.fma.v{lanes}f64({d} {a}, {d} {b}, {d} {c})")

    def const(value: str) -> str:
        return f"splat (double {value})"

    xd = fn.v(f"fpext <{lanes} x float> {x} to {d}")
    shifted = fma(const(INV_LN2_N), xd, const(SHIFT))  # k + shift, k = round(x * 32/ln2)
    ki = fn.v(f"bitcast {d} {shifted} to {i64}")
    kd = fn.v(f"fsub {d} {shifted}, {const(SHIFT)}")
    r = fma(const(INV_LN2_N), xd, fn.v(f"fneg {d} {kd}"))  # x * 32/ln2 - k, rounded once
    tab = _table_entries(fn, fn.v(f"and {i64} {ki}, splat (i64 31)"), lanes)
    exponent = fn.v(f"shl {i64} {ki}, splat (i64 47)")  # k div 32 lands in the exponent field
    s = fn.v(f"bitcast {i64} {fn.v(f'add {i64} {tab}, {exponent}')} to {d}")
    c0, c1, c2 = (const(c) for c in POLY)
    cubic = fma(r, c0, c1)
    r2 = fn.v(f"fmul {d} {r}, {r}")
    linear = fma(r, c2, const("1.0"))
    poly = fma(cubic, r2, linear)
    y = fn.v(f"fptrunc {d} {fn.v(f'fmul {d} {poly}, {s}')} to <{lanes} x float>")
    return _special_cases(fn, x, y, lanes)


PERMUTE_DECLARATION = "declare <8 x i64> @llvm.x86.avx512.vpermi2var.q.512(<8 x i64>, <8 x i64>, <8 x i64>)"


def _table_in_registers(lanes: int) -> bool:
    """Whether `_table_entries` permutes the table in registers (AVX-512 hosts) rather than gathers."""
    from kinetic.codegen.cpu.target import host

    return lanes % 8 == 0 and "avx512f" in host().flags


def _table_entries(fn: Function, slot: str, lanes: int) -> str:
    """TABLE[slot] for each lane (slot <lanes x i64> in 0..31). On AVX-512 the 32 entries are four
    registers of 8: per 8 lanes two two-register permutes (`vpermi2q`, entries 0-15 and 16-31 by
    the slot's low 4 bits) and a select on its bit 4, the same values as a gather at a fraction of
    its cost (a zmm gather is microcoded: ~8% of SmolLM2's prompt attention tile); elsewhere a gather."""
    i64 = f"<{lanes} x i64>"
    if not _table_in_registers(lanes):
        at = fn.v(f"getelementptr inbounds i64, ptr {TABLE_GLOBAL}, {i64} {slot}")
        return fn.v(f"call {i64} @llvm.masked.gather.v{lanes}i64.v{lanes}p0(<{lanes} x ptr> align 8 {at}, "
                    f"<{lanes} x i1> splat (i1 true), {i64} poison)")
    quarters = [const_vec("i64", TABLE[8 * t: 8 * t + 8]) for t in range(4)]
    eights = []
    for h in range(lanes // 8):
        idx = fn.v(f"shufflevector {i64} {slot}, {i64} poison, {const_vec('i32', range(8 * h, 8 * h + 8))}")
        low, high = (fn.v(f"call <8 x i64> @llvm.x86.avx512.vpermi2var.q.512({a}, <8 x i64> {idx}, {b})")
                     for a, b in ((quarters[0], quarters[1]), (quarters[2], quarters[3])))
        upper = fn.v(f"icmp ne <8 x i64> {fn.v(f'and <8 x i64> {idx}, splat (i64 16)')}, zeroinitializer")
        eights.append(fn.v(f"select <8 x i1> {upper}, <8 x i64> {high}, <8 x i64> {low}"))
    width = 8
    while len(eights) > 1:  # side by side: 8 + 8 -> 16 lanes (lanes a power of two)
        eights = [fn.v(f"shufflevector <{width} x i64> {a}, <{width} x i64> {b}, {const_vec('i32', range(2 * width))}")
                  for a, b in zip(eights[0::2], eights[1::2], strict=True)]
        width *= 2
    return eights[0]


def _special_cases(fn: Function, x: str, y: str, lanes: int) -> str:
    """glibc's results for |x| >= 88 where they are not the formula's (each decided by x alone;
    later selects win, as glibc tests -inf and NaN first)."""
    f = f"<{lanes} x float>"
    for cmp, bound, value in (("olt", MAY_UNDERFLOW, f32_literal(2.0**-149)), ("olt", UNDERFLOW, "0.0"),
                              ("ogt", OVERFLOW, "0x7FF0000000000000")):
        hit = fn.v(f"fcmp {cmp} {f} {x}, splat (float {bound})")
        y = fn.v(f"select <{lanes} x i1> {hit}, {f} splat (float {value}), {f} {y}")
    nan = fn.v(f"fcmp uno {f} {x}, zeroinitializer")
    return fn.v(f"select <{lanes} x i1> {nan}, {f} {fn.v(f'fadd {f} {x}, {x}')}, {f} {y}")


def lane_mask(fn: Function, idx: str, n: str, lanes: int) -> str:
    """<lanes x i1>: lane t is idx + t < n."""
    base = fn.v(f"insertelement <{lanes} x i64> poison, i64 {idx}, i64 0")
    wide = fn.v(f"shufflevector <{lanes} x i64> {base}, <{lanes} x i64> poison, <{lanes} x i32> zeroinitializer")
    steps = "<" + ", ".join(f"i64 {t}" for t in range(lanes)) + ">"
    at = fn.v(f"add <{lanes} x i64> {wide}, {steps}")
    limit = fn.v(f"insertelement <{lanes} x i64> poison, i64 {n}, i64 0")
    limits = fn.v(f"shufflevector <{lanes} x i64> {limit}, <{lanes} x i64> poison, <{lanes} x i32> zeroinitializer")
    return fn.v(f"icmp slt <{lanes} x i64> {at}, {limits}")


def masked_declarations(lanes: int, elems: tuple[str, ...]) -> list[str]:
    """Declarations of llvm.masked.load/store for <lanes x elem> vectors."""
    out = []
    for e in elems:
        suffix = {"float": "f32", "i8": "i8"}[e]
        v = f"<{lanes} x {e}>"
        out += [f"declare {v} @llvm.masked.load.v{lanes}{suffix}.p0(ptr, <{lanes} x i1>, {v})",
                f"declare void @llvm.masked.store.v{lanes}{suffix}.p0({v}, ptr, <{lanes} x i1>)"]
    return out


def masked_load(fn: Function, elem: str, lanes: int, ptr: str, mask: str, align: int) -> str:
    suffix = {"float": "f32", "i8": "i8"}[elem]
    v = f"<{lanes} x {elem}>"
    return fn.v(f"call {v} @llvm.masked.load.v{lanes}{suffix}.p0(ptr align {align} {ptr}, <{lanes} x i1> {mask}, "
                f"{v} zeroinitializer)")


def masked_store(fn: Function, elem: str, lanes: int, value: str, ptr: str, mask: str, align: int) -> None:
    suffix = {"float": "f32", "i8": "i8"}[elem]
    fn.do(f"call void @llvm.masked.store.v{lanes}{suffix}.p0(<{lanes} x {elem}> {value}, ptr align {align} {ptr}, "
          f"<{lanes} x i1> {mask})")


def render_expf_map(lanes: int, fused: bool = True) -> tuple[str, str]:
    """kin_expf_map_v{lanes}(x, y, n): y[i] = expf(x[i]) for i < n, `lanes` at a time (the last
    vector masked)."""
    fn = Function(f"kin_expf_map_v{lanes}" + ("" if fused else "_sse2"), [("ptr", "x"), ("ptr", "y"), ("i64", "n")])

    def body(i: str, _carried: list[str]) -> list[str]:
        mask = lane_mask(fn, i, "%n", lanes)
        x = masked_load(fn, "float", lanes, fn.gep("%x", i, "float"), mask, 4)
        masked_store(fn, "float", lanes, emit_expf(fn, x, lanes, fused), fn.gep("%y", i, "float"), mask, 4)
        return []

    fn.loop(0, "%n", [], body, step=lanes)
    fn.do("ret void")
    return module([fn], declarations(lanes) + masked_declarations(lanes, ("float",))), fn.name


MAP_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def compiled_map(ir_and_name: tuple[str, str]):
    """A rendered map kernel (x, y, n) compiled and wrapped for numpy float32 arrays."""
    from kinetic.codegen.cpu.jit import default_jit

    kernel = MAP_SIGNATURE(default_jit().address(*ir_and_name))

    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        y = np.empty_like(x)
        kernel(x.ctypes.data, y.ctypes.data, x.size)
        return y

    run.kernel = kernel  # keeps the ctypes wrapper alive with the closure
    return run


def guard_inputs() -> np.ndarray:
    """~100k float32 values: every 2^16th bit pattern (all exponents, subnormals, inf, NaNs), a
    dense sweep of [-104, 89], both sides of each special-case threshold, the points where
    round(x * 32/ln2) changes (x near (k + 1/2) ln2/32), and the two inputs that tell glibc's FMA
    build from its SSE2 build."""
    patterns = np.arange(0, 2**32, 2**16 + 1, dtype=np.uint64).astype(np.uint32)
    sweep = np.linspace(-104, 89, 40_000, dtype=np.float32).view(np.uint32)
    thresholds = np.array([88.0, -88.0] + [float.fromhex(h) for h in ("0x1.62e42ep6", "-0x1.9fe368p6",
                                                                       "-0x1.9d1d9ep6")], np.float32).view(np.uint32)
    near = (thresholds[:, None].astype(np.int64) + np.arange(-200, 201)[None, :]).reshape(-1).astype(np.uint32)
    k = np.arange(-150 * 32, 128 * 32, 3)
    ties = ((k + 0.5) * (np.log(2) / 32)).astype(np.float32).view(np.uint32)
    ties = (ties[:, None].astype(np.int64) + np.array([-1, 0, 1])[None, :]).reshape(-1).astype(np.uint32)
    specials = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
                         0x00000001, 0x807FFFFF, *SSE2_DIFFERS], np.uint32)  # zeros, infinities, NaNs, subnormals
    return np.concatenate([patterns, sweep, near, ties, specials]).view(np.float32)


def differences(vector_expf, libm_expf, x: np.ndarray) -> np.ndarray:
    """The inputs where two expf implementations (array -> array) give different bits."""
    got, want = vector_expf(x).view(np.uint32), libm_expf(x).view(np.uint32)
    return x[got != want]


def agrees(vector_expf, libm_expf, x: np.ndarray) -> bool:
    """Whether a vector expf gives libm's bits on every x; says why not in the debug log."""
    bad = differences(vector_expf, libm_expf, x)
    if bad.size:
        log.debug("vector expf differs from the C library's on %d of %d values (first x = %r): kernels call "
                  "the C library's expf", bad.size, x.size, float(bad[0]))
    return not bad.size


@cache
def use_vector_expf() -> bool:
    """Whether this process's kernels may evaluate expf with `emit_expf`: true where it gives the C
    library's expf bit for bit on `guard_inputs()`, checked once per process (~2 ms once compiled)."""
    from kinetic.codegen.common.libm import render_libm_map

    lanes = expf_lanes()
    try:
        vector, libm = compiled_map(render_expf_map(lanes)), compiled_map(render_libm_map("expf"))
    except Exception as e:  # no JIT or no C library: keep the calls
        log.debug("vector expf not checked (%s): kernels call the C library's expf", e)
        return False
    if not agrees(vector, libm, guard_inputs()):
        return False
    log.debug("vector expf (%d lanes) matches the C library's expf: kernels use it", lanes)
    return True
