"""Machine-level primitives for numba-compiled code: calls through addresses, atomics, f16 bits.

Owns: the few numba intrinsics the compiled step needs and numba does not offer — calling a
generated (llvmlite) kernel given its address, raw pointers from integer addresses, array views that
hold no reference (`unowned`), 64-bit atomics
(compare-and-swap included), the spin-wait hint and the futex call of the step's phase waits
(step_ops.py), a read prefetch hint (Shortlist's scattered bound reads, shortlist_rows.py), and
IEEE f32 <-> f16 conversion (LLVM's fptrunc / fpext: round to nearest even,
what numpy's astype(float16) does). Written by hand because numba has
no public API for these; each is a handful of LLVM instructions.
"""

from __future__ import annotations

import ctypes
import platform

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_I64 = ir.IntType(64)
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


@intrinsic
def call_kernel(typingctx, addr, *args):
    """kernel(*args) for a generated kernel at `addr` returning nothing. Every argument goes as an
    int64: the kernels take pointers and 64-bit integers, which the x86-64 and AArch64 C calling
    conventions pass alike (general registers, then the stack), so one intrinsic serves them all."""
    flat = args[0] if len(args) == 1 and isinstance(args[0], types.BaseTuple) else args
    sig = types.void(types.int64, types.StarArgTuple.from_types([types.int64] * len(flat)))

    def codegen(context, builder, signature, llargs):
        values = [builder.extract_value(llargs[1], i) for i in range(len(flat))]
        fnty = ir.FunctionType(ir.VoidType(), [_I64] * len(flat))
        builder.call(builder.inttoptr(llargs[0], fnty.as_pointer()), values)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def call_void(typingctx, addr):
    """A C function `int f(void)` at `addr`, its result dropped (sched_yield)."""
    sig = types.void(types.int64)

    def codegen(context, builder, signature, args):
        fn = builder.inttoptr(args[0], ir.FunctionType(ir.IntType(32), []).as_pointer())
        builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def unowned(typingctx, arr):
    """The array `arr` as a view that holds no reference (its meminfo null), for arrays the caller
    keeps alive while a compiled function runs. numba counts references to an array's memory with an
    atomic increment and decrement around every view it makes (a tape row, a slice of the arena), and
    the compiled step makes millions of them a second: on a null meminfo they are skipped (a test and
    a branch). Not for an array the function returns or stores beyond the call."""
    if not isinstance(arr, types.Array):
        return None
    sig = arr(arr)

    def codegen(context, builder, signature, args):
        view = context.make_array(signature.args[0])(context, builder, value=args[0])
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()

    return sig, codegen


def _pointer_intrinsic(dtype):
    @intrinsic
    def as_pointer(typingctx, addr):
        sig = types.CPointer(dtype)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return sig, codegen

    return as_pointer


u16_ptr = _pointer_intrinsic(types.uint16)
i32_ptr = _pointer_intrinsic(types.int32)
i8_ptr = _pointer_intrinsic(types.int8)
f32_ptr = _pointer_intrinsic(types.float32)
i64_ptr = _pointer_intrinsic(types.int64)
u8_ptr = _pointer_intrinsic(types.uint8)
f64_ptr = _pointer_intrinsic(types.float64)


@intrinsic
def atomic_add(typingctx, addr, value):
    """*(int64*)addr += value, sequentially consistent; returns the old value."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        p = builder.inttoptr(args[0], _I64.as_pointer())
        return builder.atomic_rmw("add", p, args[1], "seq_cst")

    return sig, codegen


@intrinsic
def atomic_load(typingctx, addr):
    sig = types.int64(types.int64)

    def codegen(context, builder, signature, args):
        p = builder.inttoptr(args[0], _I64.as_pointer())
        return builder.load_atomic(p, "seq_cst", 8)

    return sig, codegen


@intrinsic
def atomic_store(typingctx, addr, value):
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        p = builder.inttoptr(args[0], _I64.as_pointer())
        builder.store_atomic(args[1], p, "seq_cst", 8)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def atomic_cas(typingctx, addr, expected, value):
    """*(int64*)addr = value if it holds `expected`, sequentially consistent; True if it did."""
    sig = types.boolean(types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        p = builder.inttoptr(args[0], _I64.as_pointer())
        pair = builder.cmpxchg(p, args[1], args[2], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return sig, codegen


@intrinsic
def spin_pause(typingctx):
    """The x86 `pause` hint inside a spin loop (nothing elsewhere)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch(typingctx, addr):
    """A read prefetch of the cache line at addr (int64), into every cache level: a hint, no result."""
    sig = types.void(types.int64)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.inttoptr(args[0], ir.IntType(8).as_pointer()), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def fma32(typingctx, a, b, c):
    """float32 a*b + c rounded once (llvm.fma: the hardware instruction, or libm's exact fmaf)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


@intrinsic
def f16_bits(typingctx, x):
    """float32 -> the bits of the nearest f16 (ties to even, overflow to inf)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@intrinsic
def f16_value(typingctx, bits):
    """The bits of an f16 -> its value as float32 (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def pow2_f64(typingctx, n):
    """2.0 ** n as float64 for an integer n in [-1022, 1023], built from its bits."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        bits = builder.shl(builder.add(args[0], ir.Constant(_I64, 1023)), ir.Constant(_I64, 52))
        return builder.bitcast(bits, ir.DoubleType())

    return sig, codegen


@njit(cache=True, inline="always")
def round_f16(x):
    return f16_value(f16_bits(x))


def sched_yield_address() -> int:
    """The address of the C library's sched_yield (0 where there is none: the barrier only spins)."""
    try:
        return ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value or 0
    except (OSError, AttributeError):
        return 0


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (rdtsc on x86): cheap timing inside compiled code."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, []), "llvm.readcyclecounter")
        return builder.call(fn, [])

    return sig, codegen


@njit(cache=True)
def cycle_count():
    return cycles()


# Linux futex through the C library's syscall(): FUTEX_WAIT_PRIVATE / FUTEX_WAKE_PRIVATE on the 32-bit
# word at an address (the low half of a little-endian int64). Elsewhere waits spin, then yield.
_FUTEX_SYSCALL = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower(), 0)
FUTEX_WAIT, FUTEX_WAKE = 128, 129
FUTEX_TIMEOUT = np.array([0, 1_000_000], np.int64)  # struct timespec: a sleeper rechecks at least every 1 ms


def futex_syscall() -> tuple[int, int]:
    """(the address of the C library's syscall(), the futex call's number), or (0, 0) where there is
    none. glibc's syscall() only moves its integer arguments into registers, so it is called as a
    plain function of int64 arguments (call_kernel)."""
    if not _FUTEX_SYSCALL or platform.system() != "Linux":
        return 0, 0
    try:
        return ctypes.cast(ctypes.CDLL(None).syscall, ctypes.c_void_p).value or 0, _FUTEX_SYSCALL
    except (OSError, AttributeError):
        return 0, 0
