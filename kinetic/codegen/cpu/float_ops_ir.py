"""The vector operations of the float-weight matmul kernels (float_matmul_ir), spelled for a weight type
and an instruction-set variant.

Owns: `FloatOps` (16-lane fma, f16 widening with or without F16C, bf16 halves with vdpbf16ps's
reading of subnormals as zero and its flushing of subnormal results, vdpbf16ps itself or its
emulation) and `hsum16` (_mm512_reduce_add_ps's order). Every variant gives each lane the same
operations on the same operands, so all are bit-identical. Does not own loops or the order of the sum.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, f32_literal, splat

V16 = "<16 x float>"
_TINY = f32_literal(2.0**-126)


class FloatOps:
    """The vector operations of one kernel, spelled for its type and variant."""

    def __init__(self, fn: Function, wtype: Q, variant: str):
        self.fn, self.wtype, self.variant = fn, wtype, variant

    def fma(self, a: str, b: str, c: str) -> str:
        return self.fn.v(f"call {V16} @llvm.fma.v16f32({V16} {a}, {V16} {b}, {V16} {c})")

    def widen_f16(self, ptr: str) -> str:
        """16 f16 values at ptr -> <16 x float> (exact)."""
        fn = self.fn
        if self.variant != "generic":
            return fn.v(f"fpext <16 x half> {fn.load('<16 x half>', ptr, 2)} to {V16}")
        # generic: the f16 magnitude bits shifted into an f32's place and scaled by 2^112 (exact for
        # normal and subnormal values), inf/nan given the all-ones exponent, the sign put back
        h = fn.v(f"zext <16 x i16> {fn.load('<16 x i16>', ptr, 2)} to <16 x i32>")
        mag = fn.v(f"and <16 x i32> {h}, {splat('i32', 0x7FFF)}")
        shifted = fn.v(f"shl <16 x i32> {mag}, {splat('i32', 13)}")
        as_float = fn.v(f"bitcast <16 x i32> {shifted} to {V16}")
        scaled = fn.v(f"fmul {V16} {as_float}, {splat('float', f32_literal(2.0**112))}")
        special = fn.v(f"icmp uge <16 x i32> {mag}, {splat('i32', 0x7C00)}")
        inf_nan = fn.v(f"or <16 x i32> {shifted}, {splat('i32', 0x7F800000)}")
        normal = fn.v(f"bitcast {V16} {scaled} to <16 x i32>")
        bits = fn.v(f"select <16 x i1> {special}, <16 x i32> {inf_nan}, <16 x i32> {normal}")
        sign_bit = fn.v(f"and <16 x i32> {h}, {splat('i32', 0x8000)}")
        sign = fn.v(f"shl <16 x i32> {sign_bit}, {splat('i32', 16)}")
        signed = fn.v(f"or <16 x i32> {bits}, {sign}")
        return fn.v(f"bitcast <16 x i32> {signed} to {V16}")

    def weights(self, ptr: str) -> str:
        """F16 / F32: 16 weights as <16 x float>."""
        if self.wtype is Q.F16:
            return self.widen_f16(ptr)
        return self.fn.load(V16, ptr, 4)

    def bf16_halves(self, ptr: str) -> tuple[str, str]:
        """32 bf16 values at ptr -> (odd elements, even elements) as <16 x float>, subnormals read as
        zero (vdpbf16ps's DAZ): the odd element of each 32-bit word is its high half."""
        fn = self.fn
        words = fn.load("<16 x i32>", ptr, 2)
        odd = fn.v(f"and <16 x i32> {words}, {splat('i32', 0xFFFF0000)}")
        even = fn.v(f"shl <16 x i32> {words}, {splat('i32', 16)}")
        return self._daz(odd), self._daz(even)

    def _daz(self, bits: str) -> str:
        fn = self.fn
        exp = fn.v(f"and <16 x i32> {bits}, {splat('i32', 0x7F800000)}")
        zero_exp = fn.v(f"icmp eq <16 x i32> {exp}, zeroinitializer")
        signed_zero = fn.v(f"and <16 x i32> {bits}, {splat('i32', 0x80000000)}")
        kept = fn.v(f"select <16 x i1> {zero_exp}, <16 x i32> {signed_zero}, <16 x i32> {bits}")
        return fn.v(f"bitcast <16 x i32> {kept} to {V16}")

    def flush(self, v: str) -> str:
        """Subnormal lanes to zero of the same sign (vdpbf16ps's FTZ)."""
        fn = self.fn
        mag = fn.v(f"call {V16} @llvm.fabs.v16f32({V16} {v})")
        tiny = fn.v(f"fcmp olt {V16} {mag}, {splat('float', _TINY)}")
        bits = fn.v(f"bitcast {V16} {v} to <16 x i32>")
        sign = fn.v(f"and <16 x i32> {bits}, {splat('i32', 0x80000000)}")
        zero = fn.v(f"bitcast <16 x i32> {sign} to {V16}")
        return fn.v(f"select <16 x i1> {tiny}, {V16} {zero}, {V16} {v}")

    def dpbf16(self, acc: str, w_ptr: str, x_ptr: str | tuple[str, str]) -> str:
        """acc + the 32 bf16 pairs at w_ptr and x_ptr, vdpbf16ps's way (x_ptr: a pointer, or the
        activations' (odd, even) halves already split for the emulation)."""
        fn = self.fn
        if self.variant == "avx512bf16":
            w = fn.load("<32 x bfloat>", w_ptr, 2)
            x = fn.load("<32 x bfloat>", x_ptr, 2)
            pairs = f"<32 x bfloat> {w}, <32 x bfloat> {x}"
            return fn.v(f"call {V16} @llvm.x86.avx512bf16.dpbf16ps.512({V16} {acc}, {pairs})")
        w_odd, w_even = self.bf16_halves(w_ptr)
        x_odd, x_even = x_ptr
        acc = self.flush(self.fma(w_odd, x_odd, acc))
        return self.flush(self.fma(w_even, x_even, acc))


def hsum16(fn: Function, v: str) -> str:
    """_mm512_reduce_add_ps: 16 -> 8 -> 4 lanes by halves, then (l0+l2) + (l1+l3)."""
    def half(src: str, n: int, start: int) -> str:
        mask = const_vec("i32", range(start, start + n // 2))
        return fn.v(f"shufflevector <{n} x float> {src}, <{n} x float> poison, {mask}")

    v8 = fn.v(f"fadd <8 x float> {half(v, 16, 8)}, {half(v, 16, 0)}")
    v4 = fn.v(f"fadd <4 x float> {half(v8, 8, 4)}, {half(v8, 8, 0)}")
    e = [fn.v(f"extractelement <4 x float> {v4}, i64 {i}") for i in range(4)]
    return fn.v(f"fadd float {fn.v(f'fadd float {e[0]}, {e[2]}')}, {fn.v(f'fadd float {e[1]}, {e[3]}')}")
