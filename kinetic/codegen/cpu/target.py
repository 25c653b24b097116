"""The CPU renderer's capabilities as data: which int8 dot variant a host runs, and how each is spelled.

Owns: `CAPABILITIES`, what the CPU declares to the passes and the runtime in the shape every device
shares (kinetic/codegen/runner.py: the fused ops its op-to-kernel table lowers; no row limit, the
compiled step grows its buffers; its device phase's `FUSIONS`: one quantization of a row per format,
shared by the matmuls of the `BIT_EXACT` weight types that read it), reading the host's CPU
features from llvmlite, the list of variants (`vnni`, `avx2`, `generic`), and the one primitive
every quantized kernel is built on,
`dot8`: 32 weight bytes times 32 int8 activations -> 8 int32 lanes, lane i holding the exact sum of
elements 4i..4i+3 (`dot8_acc` adds them to a starting vector, free with `vpdpbusd`).

Every variant produces the same lanes exactly (integer arithmetic, no saturation is reachable: AVX2's
`pmaddubsw` pairs stay below 2 * 128 * 127 because signed weights go through abs/sign and activations
lie in [-127, 127]), so the float code after it, which is shared text, gives bit-identical results
whichever variant runs. It does not own kernels or block layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.runner import Capabilities
from kinetic.ir.ops import Op
from kinetic.ir.orders import weight_order
from kinetic.passes.device_fusion import Fusions

# Types whose kernels sum in exactly the reference's order (the kernels llama.cpp runs for a decode
# row on x86: the block-32 vec-dots, the repacked Q2_K / Q4_K / IQ4_NL / MXFP4 gemvs, the Q3_K / Q5_K /
# Q6_K / IQ4_XS vec-dots), so the CPU gives bit for bit what the reference interpreter gives
# (tests/codegen/cpu/test_cpu_bit_exact.py, test_cpu_executor.py). Their matmuls read q8 rows.
BIT_EXACT = frozenset({Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
                       Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4})
# the orders the tape's reductions sum in (kinetic/ir/orders.py), the reference's: generated kernels for
# the exact and float weight types, the reference between segments for the rest ("dequant_matvec");
# attention over an f32 cache ("key_chain_f32") is the op-by-op executor's
REDUCTION_ORDERS = frozenset({"lanes8", "block_chain", "lanes64", "bf16_pairs", "dequant_matvec", "f64_sum",
                              "key_chain_f16", "key_chain_f16_acc32", "mean_var_f64"})
# BIT_EXACT types whose generated matmul kernel also follows the fast numerics mode's "block_chain"
# (kinetic/ir/orders.py) where their ggml order is "lanes8" (matmul_ir.render_matmul's `order`)
FAST_CHAIN_KERNELS: frozenset[Q] = frozenset({Q.Q8_0, Q.Q5_0, Q.Q4_1, Q.Q5_1, Q.Q6_K, Q.Q5_K, Q.Q3_K, Q.IQ4_XS})


def kernel_orders(wtype: Q) -> frozenset[str]:
    """The orders the CPU's generated matmul kernel for `wtype` (q8 activations) follows: its ggml order,
    and "block_chain" for FAST_CHAIN_KERNELS. A matmul in any other order is not given to the kernel
    (matmul_ops.refuse_matmul, executor.CpuInterpreter run it as the reference defines it)."""
    return frozenset({weight_order(wtype)} | ({"block_chain"} if wtype in FAST_CHAIN_KERNELS else set()))


# the device phase makes one quantize node per (row, format) before the q8 matmuls of the exact types
# (their kernels read it); nothing else: each other op is one tape instruction of its own
FUSIONS = Fusions(quantized_matmuls=BIT_EXACT)
# the fused ops of the IR that lowering.LOWERINGS has rows for (a test keeps the two in step)
CAPABILITIES = Capabilities("cpu", fused_ops=frozenset({Op.SWIGLU, Op.GEGLU, Op.QUANTIZE}), max_rows=None,
                            fusions=FUSIONS, reduction_orders=REDUCTION_ORDERS, max_sequences=None,
                            numerics=frozenset({"ggml", "fast"}))  # fast: kernel_orders per type, else the reference

VARIANTS = ("vnni", "avx2", "generic")

_NEEDS = {
    "vnni": ("avx2", "avx512vnni", "avx512vl", "avx512bw"),
    "avx2": ("avx2", "fma"),
    "generic": (),
}


@cache
def _init_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@dataclass(frozen=True)
class Host:
    """What the JIT targets: triple, CPU name and feature string (all part of the cache key)."""

    triple: str
    cpu: str
    features: str
    flags: frozenset[str]

    def supports(self, variant: str) -> bool:
        return all(f in self.flags for f in _NEEDS[variant])

    def best_variant(self) -> str:
        return next(v for v in VARIANTS if self.supports(v))


@cache
def host() -> Host:
    _init_llvm()
    feats = llvm.get_host_cpu_features()
    flags = frozenset(k for k, on in feats.items() if on)
    return Host(llvm.get_process_triple(), llvm.get_host_cpu_name(), feats.flatten(), flags)


DECLARATIONS = {
    "avx2": [
        "declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)",
        "declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)",
        "declare <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8>, <32 x i8>)",
        "declare <32 x i8> @llvm.abs.v32i8(<32 x i8>, i1)",
    ],
    "vnni": [
        "declare <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32>, <32 x i8>, <32 x i8>)",
        "declare <8 x i32> @llvm.x86.avx512.vpdpwssd.256(<8 x i32>, <16 x i16>, <16 x i16>)",
        "declare <16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32>, <32 x i16>, <32 x i16>)",
        "declare <32 x i16> @llvm.x86.avx512.pmaddubs.w.512(<64 x i8>, <64 x i8>)",
        "declare <64 x i8> @llvm.x86.avx512.pshuf.b.512(<64 x i8>, <64 x i8>)",
        "declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)",
        "declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)",
        "declare <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8>, <32 x i8>)",
        "declare <32 x i8> @llvm.abs.v32i8(<32 x i8>, i1)",
    ],
    "generic": [],
}


def _unsigned_operands(fn: Function, w: str, x: str, signed: bool) -> tuple[str, str]:
    """(u8, s8) operands with the same products: w*x = |w| * (x with w's sign)."""
    if not signed:
        return w, x
    a = fn.v(f"call <32 x i8> @llvm.abs.v32i8(<32 x i8> {w}, i1 false)")
    b = fn.v(f"call <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8> {x}, <32 x i8> {w})")
    return a, b


def _dot8_generic(fn: Function, w: str, x: str, signed: bool) -> str:
    ext = "sext" if signed else "zext"
    a = fn.v(f"{ext} <32 x i8> {w} to <32 x i32>")
    b = fn.v(f"sext <32 x i8> {x} to <32 x i32>")
    p = fn.v(f"mul <32 x i32> {a}, {b}")
    parts = [
        fn.v(f"shufflevector <32 x i32> {p}, <32 x i32> poison, {const_vec('i32', range(k, 32, 4))}")
        for k in range(4)
    ]
    lo = fn.v(f"add <8 x i32> {parts[0]}, {parts[1]}")
    hi = fn.v(f"add <8 x i32> {parts[2]}, {parts[3]}")
    return fn.v(f"add <8 x i32> {lo}, {hi}")


def dot8(fn: Function, variant: str, w: str, x: str, signed: bool) -> str:
    """<32 x i8> weights (signed or unsigned) . <32 x i8> activations -> <8 x i32> lane sums of 4."""
    if variant == "generic":
        return _dot8_generic(fn, w, x, signed)
    a, b = _unsigned_operands(fn, w, x, signed)
    if variant == "vnni":
        return fn.v(
            f"call <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32> zeroinitializer, <32 x i8> {a}, <32 x i8> {b})"
        )
    p16 = fn.v(f"call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> {a}, <32 x i8> {b})")
    return fn.v(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {p16}, <16 x i16> {splat('i16', 1)})")


def dot8_acc(fn: Function, variant: str, acc: str, w: str, x: str, signed: bool) -> str:
    """acc + dot8(w, x): `vpdpbusd` accumulates for free on VNNI, the others add."""
    if variant == "vnni":
        a, b = _unsigned_operands(fn, w, x, signed)
        return fn.v(f"call <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32> {acc}, <32 x i8> {a}, <32 x i8> {b})")
    return fn.v(f"add <8 x i32> {acc}, {dot8(fn, variant, w, x, signed)}")


def dot8_scaled(fn: Function, variant: str, acc: str, w: str, x: str, scale16: str) -> str | None:
    """acc + scale * dot8(w, x) for unsigned weights below 64 (k-quants), or None for `generic`.

    `scale16` holds lane l's scale at 16-bit pairs 2l and 2l+1: `pmaddubsw` gives the exact pair sums
    (|pair| <= 2 * 63 * 128 < 2^15), `vpdpwssd` (or `pmaddwd` + add) multiplies each pair by the scale
    and adds the two into lane l, the same integer as dot8 times the lane scale."""
    if variant == "generic":
        return None
    p16 = fn.v(f"call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> {w}, <32 x i8> {x})")
    if variant == "vnni":
        return fn.v(
            f"call <8 x i32> @llvm.x86.avx512.vpdpwssd.256(<8 x i32> {acc}, <16 x i16> {p16}, <16 x i16> {scale16})"
        )
    p = fn.v(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {p16}, <16 x i16> {scale16})")
    return fn.v(f"add <8 x i32> {acc}, {p}")
