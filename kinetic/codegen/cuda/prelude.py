"""The two preludes that make one generated kernel text compile both as CUDA C and as host C++.

Owns: the small lockstep SIMT language every CUDA kernel here is written in, as macros, and its two
meanings. Does not own: any kernel (gemv.py, pointwise.py, attention.py render them) or how a
program is compiled (nvrtc.py, emulator.py).

A kernel is written as warp-uniform code (loops, `if`s, shuffles, barriers) around `LANES { ... }`
blocks of per-thread code. Values that live across a uniform statement are declared at the top with
`LANE(type, name)` and read as `L(name)`:

    KERNEL(name, threads, params...)     kernel signature; `threads` per block, a multiple of 32
      LANE(float, acc);                  per-thread values that outlive one LANES block
      SHARED(double, part, 4);           shared memory
    BODY
      for (int b = 0; b < 4; ++b) {      uniform: no thread index in here
        LANES { L(acc) = k_add(L(acc), ...); }
      }
      SHFL_XOR(tmp, acc, 4);             every lane of the warp reads acc of lane ^ 4 into tmp
      BARRIER();                         block barrier; only at the top level of BODY
    END_KERNEL

A LANE value may be a small array, `LANE(float, acc[8])`, read `L(acc[r])` and shuffled as `acc[r]`
(the GEMM's per-row sums); indexed only by loop counters of fully unrolled loops (`#pragma unroll`,
constant bounds), so that CUDA keeps it in registers (the compile test fails a kernel with a stack
frame).

On CUDA the macros vanish (`L(x)` is `x`, `LANES` is nothing, `SHFL_XOR` is `__shfl_xor_sync`).
On the host (emulator.py) the grid's blocks run one after another; between two barriers each warp
runs alone, its 32 lanes in lockstep: every `LANES` block is a loop over the 32 lanes, every
`LANE` value an array over the block's threads, every shuffle an exchange between array entries
after all lanes have finished the statement before it. So a shuffle reads exactly what the
hardware's would, and the host compiler itself rejects a thread index in uniform code (`_t` is only
declared inside `LANES`) and a barrier inside a loop or branch (its braces no longer balance).

Arithmetic goes through `k_*` functions whose rounding is stated: on CUDA the `_rn` intrinsics and
PTX conversions (never contracted into fmas, whatever --fmad says), on the host the IEEE operations
of the C++ compiler with contraction off and software f16 conversions. Global memory is read and
written through `LD`/`LDB`/`ST`, which the host checks against the buffers the launch registered
(bounds, alignment of the access, writes only to output buffers).
"""

from __future__ import annotations

from kinetic.codegen.common import expf

# Definitions shared by both targets (written with the macros and k_* functions below).
COMMON = r"""
// ---- shared helpers: the same text for CUDA and the host ----
DEV float k_sub(float a, float b) { return k_add(a, -b); }
DEV float k_abs(float a) { return k_bits2f(k_f2bits(a) & 0x7fffffffu); }
DEV float k_max(float a, float b) { return a > b ? a : b; }

// correctly rounded a * 2^n for |n| <= 192 and a in [0.5, 2): two exact steps of at most 2^96,
// the second rounds once (also into the subnormal range)
DEV float k_ldexp(float a, int n) {
    const int n1 = n / 2, n2 = n - n1;
    return k_mul(k_mul(a, k_bits2f((u32)(n1 + 127) << 23)), k_bits2f((u32)(n2 + 127) << 23));
}

// ggml_v_expf (vec.h, AVX-512): a degree-5 polynomial on the reduced argument, every step an fma;
// numerics.expf_ggml is the reference
DEV float k_expf_ggml(float x) {
    const float r = 0x1.8p23f;
    const float z = k_fma(x, 0x1.715476p+0f, r);
    const float n = k_sub(z, r);
    const float b = k_fma(-n, 0x1.7f7d1cp-20f, k_fma(-n, 0x1.62e4p-1f, x));
    const float u = k_mul(b, b);
    const float j = k_fma(k_fma(k_fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, k_fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                          u, k_fma(0x1.ffffecp-1f, b, 1.0f));
    if (n > 192.0f) return k_bits2f(0x7f800000u);
    if (n < -192.0f) return 0.0f;
    return k_ldexp(j, (int)n);
}

// SiLU as ggml: x / (1 + ggml_v_expf(-x))
DEV float k_silu(float x) { return k_div(x, k_add(1.0f, k_expf_ggml(k_sub(0.0f, x)))); }

// GELU as ggml's f16 table (numerics.gelu_ggml): 0 at or below -10, x at or above 10
DEV float k_gelu(float x, const u16* __restrict__ table) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return k_h2f(LD(u16, table, k_f2h(x)));
}

// two 16-bit loads as one little-endian 32-bit value (a block field aligned to 2 bytes only)
DEV u32 k_ld_u16x2(const u8* p, long off) { return (u32)LDB(u16, p, off) | ((u32)LDB(u16, p, off + 2) << 16); }

// Q4_K / Q5_K 6-bit scale and minimum j of the 12 packed bytes at q (ggml get_scale_min_k4)
DEV int k_scale_k4(const u8* q, int j) {
    return j < 4 ? (LDB(u8, q, j) & 63) : ((LDB(u8, q, j + 4) & 15) | ((LDB(u8, q, j - 4) >> 6) << 4));
}
DEV int k_min_k4(const u8* q, int j) {
    return j < 4 ? (LDB(u8, q, j + 4) & 63) : ((LDB(u8, q, j + 4) >> 4) | ((LDB(u8, q, j) >> 6) << 4));
}

// a float's subnormals flushed to zero of the same sign (vdpbf16ps's inputs and results)
DEV float k_flush(float v) { return k_abs(v) < 0x1p-126f ? k_mul(v, 0.0f) : v; }
// ggml_compute_fp32_to_bf16, as f32: round half to even to the top 16 bits, a NaN kept quiet
DEV float k_bf16_round(float x) {
    const u32 b = k_f2bits(x);
    if (x != x) return k_bits2f((b & 0xffff0000u) | 0x400000u);
    return k_bits2f((b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u);
}

// Q3_K scale j (of 16, one per 16 values) of the 12 packed bytes at q, its offset 32 removed: the low
// 4 bits in nibble j >> 3 of byte j & 7, the high 2 in crumb j >> 2 of byte 8 + (j & 3)
DEV int k_scale_q3_k(const u8* q, int j) {
    const int low = (LDB(u8, q, j & 7) >> (4 * (j >> 3))) & 15, high = (LDB(u8, q, 8 + (j & 3)) >> (2 * (j >> 2))) & 3;
    return (low | (high << 4)) - 32;
}
"""

CUDA = r"""
// ---- kinetic CUDA prelude: header-free, for NVRTC ----
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define KERNEL(name, threads, ...) extern "C" __global__ void __launch_bounds__(threads) name(__VA_ARGS__) {
#define BODY
#define BARRIER() __syncthreads()
#define END_KERNEL }
#define LANE(type, name) type name
#define SHARED(type, name, n) __shared__ type name[n]
#define L(x) (x)
#define LANES
#define TID ((int)threadIdx.x)
#define LANE_ID ((int)threadIdx.x & 31)
#define WARP ((int)threadIdx.x >> 5)
#define BX ((int)blockIdx.x)
#define BY ((int)blockIdx.y)
#define SHFL_XOR(dst, src, mask) (dst) = __shfl_xor_sync(0xffffffffu, (src), (mask))
#define SHFL_IDX(dst, src, lane) (dst) = __shfl_sync(0xffffffffu, (src), (lane))
#define LD(T, p, i) (((const T*)(p))[i])
#define LDB(T, p, off) (*(const T*)((const u8*)(p) + (off)))
#define ST(T, p, i, v) (((T*)(p))[i] = (v))
#define DEV static __device__ __forceinline__
#define KCONST static __constant__ const

DEV float k_add(float a, float b) { return __fadd_rn(a, b); }
DEV float k_mul(float a, float b) { return __fmul_rn(a, b); }
DEV float k_div(float a, float b) { return __fdiv_rn(a, b); }
DEV float k_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
DEV float k_sqrt(float a) { return __fsqrt_rn(a); }
DEV double k_dadd(double a, double b) { return __dadd_rn(a, b); }
DEV double k_ddiv(double a, double b) { return __ddiv_rn(a, b); }
DEV double k_dmul(double a, double b) { return __dmul_rn(a, b); }
DEV double k_dfma(double a, double b, double c) { return __fma_rn(a, b, c); }
DEV u64 k_d2bits(double a) { return (u64)__double_as_longlong(a); }
DEV double k_bits2d(u64 a) { return __longlong_as_double((long long)a); }
DEV float k_d2f(double a) { return __double2float_rn(a); }
DEV int k_rint(float a) { return __float2int_rn(a); }
DEV float k_i2f(int a) { return __int2float_rn(a); }
DEV int k_dp4a(int a, int b, int c) { return __dp4a(a, b, c); }
DEV u32 k_f2bits(float a) { return __float_as_uint(a); }
DEV float k_bits2f(u32 a) { return __uint_as_float(a); }
DEV float k_h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
DEV u16 k_f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
"""

HOST = r"""
// ---- kinetic host emulation of the CUDA prelude (g++ / clang++, C++17) ----
#include <cmath>
#include <cstdint>
#include <cstring>
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// order of warps and lanes: reversed by default, so that code relying on an order the hardware
// does not promise gives another answer when compiled with KEMU_FORWARD
#ifdef KEMU_FORWARD
#define KEMU_ORDER(i, n) (i)
#else
#define KEMU_ORDER(i, n) ((n) - 1 - (i))
#endif

#define KERNEL(name, threads, ...) extern "C" void name(int _gx, int _gy, __VA_ARGS__) { \
    enum { _NT = (threads), _NW = (threads) / 32 }; static_assert((threads) % 32 == 0, "whole warps"); \
    for (int _by = 0; _by < _gy; ++_by) for (int _bx = 0; _bx < _gx; ++_bx) {
#define BODY for (int _wi = 0; _wi < _NW; ++_wi) { const int _w = KEMU_ORDER(_wi, _NW); const KemuUniform _uniform{};
#define BARRIER() } ++kemu_barriers; for (int _wi = 0; _wi < _NW; ++_wi) { \
    const int _w = KEMU_ORDER(_wi, _NW); const KemuUniform _uniform{};
#define END_KERNEL } } }
#define LANE(type, name) type name[_NT]
#define SHARED(type, name, n) type name[n]
#define L(x) (x)[_t]
#define LANES for (int _li = 0; _li < 32; ++_li) \
    for (int _l = KEMU_ORDER(_li, 32), _t = _w * 32 + _l, _once = 1, _uniform = 0; _once; _once = 0)
#define TID _t
#define LANE_ID _l
#define WARP _w
#define BX _bx
#define BY _by
#define SHFL_XOR(dst, src, mask) kemu_shfl_xor((dst), (src), _w, (mask), _uniform)
#define SHFL_IDX(dst, src, lane) kemu_shfl_idx((dst), (src), _w, (lane), _uniform)
#define LD(T, p, i) kemu_ld<T>((const void*)(p), (long)(i) * (long)sizeof(T))
#define LDB(T, p, off) kemu_ld<T>((const void*)(p), (long)(off))
#define ST(T, p, i, v) kemu_st<T>((void*)(p), (long)(i) * (long)sizeof(T), (v))
#define DEV static inline
#define KCONST static const

// ---- global memory: registered buffers, checked accesses ----
struct KemuBuffer { const char* lo; const char* hi; int writable; };
static KemuBuffer kemu_buffers[16];
static int kemu_nbuffers = 0;
static int kemu_error_kind = 0;  // 1 outside every buffer, 2 misaligned, 3 write to an input
static const char* kemu_error_at = nullptr;
static long kemu_barriers = 0;

extern "C" void kemu_reset() { kemu_nbuffers = 0; kemu_error_kind = 0; kemu_error_at = nullptr; kemu_barriers = 0; }
extern "C" int kemu_register(const void* p, long nbytes, int writable) {
    if (kemu_nbuffers == 16) return -1;
    kemu_buffers[kemu_nbuffers++] = KemuBuffer{(const char*)p, (const char*)p + nbytes, writable};
    return 0;
}
extern "C" int kemu_error() { return kemu_error_kind; }
extern "C" const void* kemu_error_address() { return kemu_error_at; }
extern "C" long kemu_barrier_count() { return kemu_barriers; }

static inline bool kemu_check(const char* p, long n, long align, bool write) {
    int kind = 1;
    for (int i = 0; i < kemu_nbuffers; ++i) {
        if (p >= kemu_buffers[i].lo && p + n <= kemu_buffers[i].hi) {
            kind = ((uintptr_t)p % (uintptr_t)align) ? 2 : (write && !kemu_buffers[i].writable) ? 3 : 0;
            break;
        }
    }
    if (kind && !kemu_error_kind) { kemu_error_kind = kind; kemu_error_at = p; }
    return kind == 0;
}
template <class T> static inline T kemu_ld(const void* base, long off) {
    const char* p = (const char*)base + off;
    T v{};
    if (kemu_check(p, sizeof(T), alignof(T), false)) std::memcpy(&v, p, sizeof(T));
    return v;
}
template <class T> static inline void kemu_st(void* base, long off, T v) {
    char* p = (char*)base + off;
    if (kemu_check(p, sizeof(T), alignof(T), true)) std::memcpy(p, &v, sizeof(T));
}

// ---- warp exchanges: every lane has finished the statement before; all read, then all write ----
// the last argument is the phase's KemuUniform: inside LANES an int of that name hides it, so a shuffle
// written there (where the lanes would run it one by one) does not compile
struct KemuUniform {};
template <class T> static inline void kemu_shfl_xor(T* dst, const T* src, int w, int mask, const KemuUniform&) {
    T tmp[32];
    for (int l = 0; l < 32; ++l) tmp[l] = src[w * 32 + (l ^ mask)];
    for (int l = 0; l < 32; ++l) dst[w * 32 + l] = tmp[l];
}
template <class T> static inline void kemu_shfl_idx(T* dst, const T* src, int w, int lane, const KemuUniform&) {
    const T v = src[w * 32 + lane];
    for (int l = 0; l < 32; ++l) dst[w * 32 + l] = v;
}

// ---- arithmetic: IEEE single and double, round to nearest even, no contraction ----
DEV float k_add(float a, float b) { return a + b; }
DEV float k_mul(float a, float b) { return a * b; }
DEV float k_div(float a, float b) { return a / b; }
DEV float k_fma(float a, float b, float c) { return std::fma(a, b, c); }
DEV float k_sqrt(float a) { return std::sqrt(a); }
DEV double k_dadd(double a, double b) { return a + b; }
DEV double k_ddiv(double a, double b) { return a / b; }
DEV double k_dmul(double a, double b) { return a * b; }
DEV double k_dfma(double a, double b, double c) { return std::fma(a, b, c); }
DEV u64 k_d2bits(double a) { u64 u; std::memcpy(&u, &a, 8); return u; }
DEV double k_bits2d(u64 u) { double a; std::memcpy(&a, &u, 8); return a; }
DEV float k_d2f(double a) { return (float)a; }
DEV float k_i2f(int a) { return (float)a; }
DEV u32 k_f2bits(float a) { u32 u; std::memcpy(&u, &a, 4); return u; }
DEV float k_bits2f(u32 u) { float a; std::memcpy(&a, &u, 4); return a; }
// cvt.rni.s32.f32: nearest even, saturating, NaN to 0
DEV int k_rint(float a) {
    const float r = std::nearbyint(a);
    if (r != r) return 0;
    if (r >= 2147483648.0f) return 2147483647;
    if (r <= -2147483648.0f) return (-2147483647 - 1);
    return (int)r;
}
// __dp4a with signed bytes
DEV int k_dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(i8)(a >> (8 * i)) * (int)(i8)(b >> (8 * i));
    return c;
}
DEV float k_h2f(u16 h) {
    const u32 sign = (u32)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0) { const float v = std::ldexp((float)m, -24); return sign ? -v : v; }
    if (e == 31) return k_bits2f(sign | 0x7f800000u | (m << 13));
    return k_bits2f(sign | ((e + 112u) << 23) | (m << 13));
}
// cvt.rn.f16.f32: round to nearest even, overflow to infinity
DEV u16 k_f2h(float f) {
    const u32 x = k_f2bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (u16)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) return (u16)(sign | 0x7c00u);
    if (ax < 0x38800000u) return (u16)(sign | (u32)std::nearbyint(k_bits2f(ax) * 16777216.0f));
    u32 h = (((ax >> 23) - 112u) << 10) | ((ax >> 13) & 1023u);
    const u32 rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return (u16)(sign | h);
}
"""


def _libc_expf() -> str:
    """glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, __expf_fma) with the operations its x86-64 FMA
    build fuses, from glibc's constants (codegen/common/expf.py; codegen/cpu/expf_ir.py proved its
    evaluation bit-identical on all 2^32 inputs):
    the reference's attention calls the C library's expf, so the GPU computes exactly that."""
    table = ", ".join(f"0x{t:016X}ull" for t in expf.TABLE)
    c0, c1, c2 = (f"k_bits2d({c}ull)" for c in expf.POLY)
    return f"""
// ---- the C library's expf (glibc, FMA build), in double precision as glibc evaluates it ----
KCONST u64 k_expf_tab[32] = {{{table}}};
DEV float k_expf_libc(float x) {{
    if (x != x) return k_add(x, x);
    if (x > 0x1.62e42ep+6f) return k_bits2f(0x7f800000u);   // glibc's overflow threshold
    if (x < -0x1.9fe368p+6f) return 0.0f;                  // underflow to zero
    if (x < -0x1.9d1d9ep+6f) return k_bits2f(1u);          // glibc's errno path: the smallest subnormal
    const double xd = (double)x;
    const double inv_ln2_n = k_bits2d({expf.INV_LN2_N}ull), shift = k_bits2d({expf.SHIFT}ull);
    const double shifted = k_dfma(inv_ln2_n, xd, shift);   // k + shift, k = round(x * 32/ln2)
    const u64 ki = k_d2bits(shifted);
    const double kd = shifted - shift;
    const double r = k_dfma(inv_ln2_n, xd, -kd);           // x * 32/ln2 - k, rounded once
    const double s = k_bits2d(k_expf_tab[ki & 31] + (ki << 47));
    const double cubic = k_dfma(r, {c0}, {c1});
    const double linear = k_dfma(r, {c2}, 1.0);
    const double poly = k_dfma(cubic, k_dmul(r, r), linear);
    return k_d2f(k_dmul(poly, s));
}}
"""


def prelude(target: str) -> str:
    """The text placed before the kernels: `cuda` (NVRTC) or `host` (the emulator's C++ compiler)."""
    if target == "cuda":
        return CUDA + COMMON + _libc_expf()
    if target == "host":
        return HOST + COMMON + _libc_expf()
    raise ValueError(f"unknown target {target!r}")
