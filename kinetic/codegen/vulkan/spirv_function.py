"""The body of a SPIR-V compute entry point: one method per instruction, each returning its result id.

Owns: `Function` (plumbing, memory access, float arithmetic decorated `NoContraction` unless asked
otherwise, integer and logical operations, conversions, subgroup operations and barriers, and
structured control flow: `if_` with its selection merge, counted `loop` with its loop merge and
continue block). Does not own types, constants, variables or the binary layout (spirv.py: Module,
which hands out a Function from `compute_entry`); kernels import it from spirv.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kinetic.codegen.vulkan.spirv_spec import (
    GLSL,
    BuiltIn,
    Capability,
    Decoration,
    GroupOperation,
    Op,
    Scope,
    Semantics,
    StorageClass,
)
from kinetic.codegen.vulkan.spirv_types import Buffer, Shared, TypeInfo
from kinetic.codegen.vulkan.spirv_types import instruction as _words

if TYPE_CHECKING:
    from kinetic.codegen.vulkan.spirv import Module


class Function:
    """The body of the entry point: each method emits one instruction into the current block and
    returns its result id. Function-local variables are gathered at the top of the first block, as
    the specification requires."""

    def __init__(self, module: Module, fid: int):
        self.m = module
        self.fid = fid
        self._locals: list[int] = []
        self._body: list[int] = []
        self._first_label = module.new_id()

    # ---- plumbing -----------------------------------------------------------------------------
    def emit(self, op: Op, result_type: int, *operands: int) -> int:
        rid = self.m.new_id()
        self._body += _words(op, [result_type, rid, *operands])
        self.m.type_of[rid] = result_type
        return rid

    def do(self, op: Op, *operands: int) -> None:
        self._body += _words(op, list(operands))

    def type_of(self, value: int) -> int:
        return self.m.type_of[value]

    def _scalar(self, value: int) -> TypeInfo:
        info = self.m.type_info[self.type_of(value)]
        return self.m.type_info[info.elem] if info.kind == "vector" else info

    def _float_op(self, op: Op, a: int, b: int, exact: bool) -> int:
        rid = self.emit(op, self.type_of(a), a, b)
        if exact:
            self.m.decorate(rid, Decoration.NoContraction)
        return rid

    def ext(self, inst: GLSL, result_type: int, *operands: int) -> int:
        return self.emit(Op.ExtInst, result_type, self.m.glsl(), inst, *operands)

    def end(self) -> None:
        """Close the function and append it to the module."""
        self.do(Op.Return)
        m = self.m
        words = _words(Op.Function, [m.void(), self.fid, 0, m.function_type(m.void())])
        words += _words(Op.Label, [self._first_label]) + self._locals + self._body
        words += _words(Op.FunctionEnd, [])
        m._functions += words

    # ---- memory -------------------------------------------------------------------------------
    def local(self, tid: int, init: int | None = None) -> int:
        """A Function-storage variable (registers, after the driver's promotion)."""
        ptr = self.m.pointer(StorageClass.Function, tid)
        vid = self.m.new_id()
        self._locals += _words(Op.Variable, [ptr, vid, StorageClass.Function])
        self.m.type_of[vid] = ptr
        if init is not None:
            self.store(vid, init)
        return vid

    def load(self, pointer: int) -> int:
        pointee = self.m.type_info[self.type_of(pointer)].elem
        return self.emit(Op.Load, pointee, pointer)

    def store(self, pointer: int, value: int) -> None:
        self.do(Op.Store, pointer, value)

    def buf_ptr(self, buf: Buffer, index: int) -> int:
        ptr = self.m.pointer(StorageClass.StorageBuffer, buf.elem)
        return self.emit(Op.AccessChain, ptr, buf.var, self.m.u(0), index)

    def buf_load(self, buf: Buffer, index: int) -> int:
        return self.load(self.buf_ptr(buf, index))

    def buf_store(self, buf: Buffer, index: int, value: int) -> None:
        self.store(self.buf_ptr(buf, index), value)

    def shared_ptr(self, arr: Shared, index: int) -> int:
        return self.emit(Op.AccessChain, self.m.pointer(StorageClass.Workgroup, arr.elem), arr.var, index)

    def push(self, var: int, member: int, tid: int) -> int:
        """Load member `member` (of type `tid`) of a push-constant block."""
        ptr = self.emit(Op.AccessChain, self.m.pointer(StorageClass.PushConstant, tid), var, self.m.u(member))
        return self.load(ptr)

    def builtin(self, which: BuiltIn, component: int | None = None) -> int:
        value = self.load(self.m.builtin(which))
        return value if component is None else self.emit(Op.CompositeExtract, self.m.u32, value, component)

    # ---- float arithmetic (NoContraction unless exact=False) ----------------------------------
    def fadd(self, a: int, b: int, exact: bool = True) -> int:
        return self._float_op(Op.FAdd, a, b, exact)

    def fsub(self, a: int, b: int, exact: bool = True) -> int:
        return self._float_op(Op.FSub, a, b, exact)

    def fmul(self, a: int, b: int, exact: bool = True) -> int:
        return self._float_op(Op.FMul, a, b, exact)

    def fdiv(self, a: int, b: int) -> int:
        return self._float_op(Op.FDiv, a, b, True)

    def fneg(self, a: int) -> int:
        return self.emit(Op.FNegate, self.type_of(a), a)

    def fma(self, a: int, b: int, c: int) -> int:
        """GLSL.std.450 Fma: a*b + c. Whether it rounds once is the device's (see device.py's probe)."""
        return self.ext(GLSL.Fma, self.type_of(a), a, b, c)

    def glsl1(self, inst: GLSL, a: int) -> int:
        return self.ext(inst, self.type_of(a), a)

    def glsl2(self, inst: GLSL, a: int, b: int) -> int:
        return self.ext(inst, self.type_of(a), a, b)

    def fcmp(self, op: Op, a: int, b: int) -> int:
        return self.emit(op, self.m.bool_(), a, b)

    # ---- integer arithmetic -------------------------------------------------------------------
    def iadd(self, a: int, b: int) -> int:
        return self.emit(Op.IAdd, self.type_of(a), a, b)

    def isub(self, a: int, b: int) -> int:
        return self.emit(Op.ISub, self.type_of(a), a, b)

    def imul(self, a: int, b: int) -> int:
        return self.emit(Op.IMul, self.type_of(a), a, b)

    def udiv(self, a: int, b: int) -> int:
        return self.emit(Op.UDiv, self.type_of(a), a, b)

    def umod(self, a: int, b: int) -> int:
        return self.emit(Op.UMod, self.type_of(a), a, b)

    def shr(self, a: int, b: int) -> int:
        """Logical shift right (arithmetic for signed operands)."""
        op = Op.ShiftRightArithmetic if self._scalar(a).signed else Op.ShiftRightLogical
        return self.emit(op, self.type_of(a), a, b)

    def shl(self, a: int, b: int) -> int:
        return self.emit(Op.ShiftLeftLogical, self.type_of(a), a, b)

    def band(self, a: int, b: int) -> int:
        return self.emit(Op.BitwiseAnd, self.type_of(a), a, b)

    def bor(self, a: int, b: int) -> int:
        return self.emit(Op.BitwiseOr, self.type_of(a), a, b)

    def bxor(self, a: int, b: int) -> int:
        return self.emit(Op.BitwiseXor, self.type_of(a), a, b)

    def bits_s(self, value: int, offset: int | None, count: int, offset_id: int | None = None) -> int:
        """Signed bit-field extract: bits offset .. offset+count-1 of value, sign-extended (offset a
        literal, or an id given as offset_id)."""
        off = offset_id if offset_id is not None else self.m.u(offset)
        return self.emit(Op.BitFieldSExtract, self.type_of(value), value, off, self.m.u(count))

    def bits_u(self, value: int, offset: int | None, count: int, offset_id: int | None = None) -> int:
        off = offset_id if offset_id is not None else self.m.u(offset)
        return self.emit(Op.BitFieldUExtract, self.type_of(value), value, off, self.m.u(count))

    def icmp(self, op: Op, a: int, b: int) -> int:
        return self.emit(op, self.m.bool_(), a, b)

    def select(self, cond: int, a: int, b: int) -> int:
        return self.emit(Op.Select, self.type_of(a), cond, a, b)

    def logical_and(self, a: int, b: int) -> int:
        return self.emit(Op.LogicalAnd, self.m.bool_(), a, b)

    def logical_or(self, a: int, b: int) -> int:
        return self.emit(Op.LogicalOr, self.m.bool_(), a, b)

    def logical_not(self, a: int) -> int:
        return self.emit(Op.LogicalNot, self.m.bool_(), a)

    def logical_eq(self, a: int, b: int) -> int:
        return self.emit(Op.LogicalEqual, self.m.bool_(), a, b)

    # ---- conversions --------------------------------------------------------------------------
    def convert(self, value: int, to: int) -> int:
        """Numeric conversion between int and float types, choosing the opcode from both types."""
        src, dst = self._scalar(value), self.m.type_info[to]
        if src.kind == "float" and dst.kind == "float":
            op = Op.FConvert
        elif src.kind == "float":
            op = Op.ConvertFToS if dst.signed else Op.ConvertFToU
        elif dst.kind == "float":
            op = Op.ConvertSToF if src.signed else Op.ConvertUToF
        else:
            op = Op.SConvert if src.signed else Op.UConvert
        return self.emit(op, to, value)

    def bitcast(self, value: int, to: int) -> int:
        return self.emit(Op.Bitcast, to, value)

    # ---- subgroups and barriers ---------------------------------------------------------------
    def shuffle_xor(self, value: int, mask: int) -> int:
        """The value of the invocation whose subgroup lane is this one's xor `mask`."""
        self.m.capability(Capability.GroupNonUniformShuffle)
        return self.emit(Op.GroupNonUniformShuffleXor, self.type_of(value), self.m.u(Scope.Subgroup), value,
                         self.m.u(mask))

    def subgroup_add(self, value: int) -> int:
        """A subgroup reduction whose order is the implementation's (kernels that need a fixed order
        build a butterfly from shuffle_xor instead)."""
        self.m.capability(Capability.GroupNonUniformArithmetic)
        op = Op.GroupNonUniformFAdd if self._scalar(value).kind == "float" else Op.GroupNonUniformIAdd
        return self.emit(op, self.type_of(value), self.m.u(Scope.Subgroup), GroupOperation.Reduce, value)

    def workgroup_barrier(self) -> None:
        """Execution and workgroup-memory barrier (GLSL's barrier() in a compute shader)."""
        sem = Semantics.AcquireRelease | Semantics.WorkgroupMemory
        self.do(Op.ControlBarrier, self.m.u(Scope.Workgroup), self.m.u(Scope.Workgroup), self.m.u(sem))

    # ---- structured control flow --------------------------------------------------------------
    def _label(self, lid: int) -> None:
        self._body += _words(Op.Label, [lid])

    @contextmanager
    def if_(self, cond: int) -> Iterator[None]:
        """`if (cond) { body }` with its selection merge."""
        then, merge = self.m.new_id(), self.m.new_id()
        self.do(Op.SelectionMerge, merge, 0)
        self.do(Op.BranchConditional, cond, then, merge)
        self._label(then)
        yield
        self.do(Op.Branch, merge)
        self._label(merge)

    @contextmanager
    def loop(self, start: int, stop: int, step: int = 1) -> Iterator[int]:
        """`for (i = start; i < stop; i += step) { body }` over u32 ids (start/stop ids, step a literal),
        with its loop merge and continue block; yields the id of i inside the body."""
        counter = self.local(self.m.u32, start)
        header, cond_block, body, cont, merge = (self.m.new_id() for _ in range(5))
        self.do(Op.Branch, header)
        self._label(header)
        self.do(Op.LoopMerge, merge, cont, 0)
        self.do(Op.Branch, cond_block)
        self._label(cond_block)
        i = self.load(counter)
        self.do(Op.BranchConditional, self.icmp(Op.ULessThan, i, stop), body, merge)
        self._label(body)
        yield i
        self.do(Op.Branch, cont)
        self._label(cont)
        self.store(counter, self.iadd(i, self.m.u(step)))
        self.do(Op.Branch, header)
        self._label(merge)
