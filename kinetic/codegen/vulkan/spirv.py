"""A small SPIR-V binary emitter: typed helpers for compute shaders, written straight to words.

Owns: spelling SPIR-V (types, constants, variables, storage buffers with their Block layout, the
compute entry point, arithmetic, subgroup operations, barriers and structured control flow) so the
kernel renderers read as arithmetic. It knows nothing about devices, quant types or ops.

The numbers (opcodes, enums) live in spirv_spec.py with their sources in the SPIR-V specification;
the layout of a module follows the specification's section 2.4 (Logical Layout of a Module) and its
binary form section 3.1-3.2. No code was copied.

Modules target SPIR-V 1.3 (Vulkan 1.1): subgroup operations and 16-bit storage are core there;
8-bit storage needs `SPV_KHR_8bit_storage`. Every float add, subtract and multiply is decorated
`NoContraction` by default, so no driver may fuse them into an fma behind our back: the order and
rounding of every float operation is the kernel's, written out.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from kinetic.codegen.vulkan.spirv_spec import (  # re-exported: kernels spell spirv.Op, spirv.BuiltIn ...
    ADDRESSING_LOGICAL,
    EXECUTION_MODE_LOCAL_SIZE,
    EXECUTION_MODEL_GLCOMPUTE,
    GENERATOR,
    GLSL,
    MAGIC,
    MEMORY_MODEL_GLSL450,
    VERSION_1_3,
    BuiltIn,
    Capability,
    Decoration,
    GroupOperation,
    Op,
    Scope,
    Semantics,
    StorageClass,
)


def _words(op: int, operands: Sequence[int]) -> list[int]:
    """One instruction: word count and opcode in the first word (spec 3.2)."""
    return [((len(operands) + 1) << 16) | int(op), *(int(x) & 0xFFFFFFFF for x in operands)]


def string_words(text: str) -> list[int]:
    """A literal string: UTF-8, nul-terminated, padded with nul bytes to whole words (spec 2.2.1)."""
    data = text.encode() + b"\0"
    data += b"\0" * (-len(data) % 4)
    return list(struct.unpack(f"<{len(data) // 4}I", data))


@dataclass(frozen=True)
class TypeInfo:
    """What a type id is: kind is void, bool, int, float, vector, array, struct, pointer or function."""

    kind: str
    width: int = 0
    signed: bool = False
    elem: int = 0  # element / pointee type id
    count: int = 0  # vector size or array length (0: runtime array)
    storage: int = -1  # pointer storage class


@dataclass(frozen=True)
class Buffer:
    """A storage-buffer binding: `var` points to a Block struct whose member 0 is a runtime array."""

    var: int
    elem: int  # element type id
    binding: int
    readonly: bool


@dataclass(frozen=True)
class Shared:
    """A workgroup (shared-memory) array."""

    var: int
    elem: int
    count: int


class Module:
    """A SPIR-V module under construction. Types and constants are deduplicated; ids are handed out
    in order; `to_bytes()` writes the sections in the order the specification requires."""

    def __init__(self):
        self._bound = 1
        self.capabilities: list[int] = [Capability.Shader]
        self.extensions: list[str] = []
        self._imports: list[int] = []
        self._entry: list[int] = []
        self._modes: list[int] = []
        self._debug: list[int] = []
        self._annotations: list[int] = []
        self._globals: list[int] = []
        self._functions: list[int] = []
        self._interface: list[int] = []  # Input variables (SPIR-V 1.3 lists only Input/Output)
        self._types: dict[tuple, int] = {}
        self._consts: dict[tuple, int] = {}
        self._glsl = 0
        self.type_info: dict[int, TypeInfo] = {}
        self.type_of: dict[int, int] = {}  # value id -> its type id
        self._builtins: dict[int, int] = {}

    # ---- ids, capabilities, debug names -------------------------------------------------------
    def new_id(self) -> int:
        self._bound += 1
        return self._bound - 1

    def capability(self, cap: Capability) -> None:
        if cap not in self.capabilities:
            self.capabilities.append(cap)

    def extension(self, name: str) -> None:
        if name not in self.extensions:
            self.extensions.append(name)

    def name(self, target: int, text: str) -> None:
        self._debug += _words(Op.Name, [target, *string_words(text)])

    def decorate(self, target: int, decoration: Decoration, *literals: int) -> None:
        self._annotations += _words(Op.Decorate, [target, decoration, *literals])

    def glsl(self) -> int:
        """The id of the GLSL.std.450 extended instruction set, imported once."""
        if not self._glsl:
            self._glsl = self.new_id()
            self._imports += _words(Op.ExtInstImport, [self._glsl, *string_words("GLSL.std.450")])
        return self._glsl

    # ---- types --------------------------------------------------------------------------------
    def _type(self, key: tuple, info: TypeInfo, op: Op, operands: Sequence[int]) -> int:
        if key not in self._types:
            tid = self.new_id()
            self._globals += _words(op, [tid, *operands])
            self._types[key] = tid
            self.type_info[tid] = info
        return self._types[key]

    def void(self) -> int:
        return self._type(("void",), TypeInfo("void"), Op.TypeVoid, [])

    def bool_(self) -> int:
        return self._type(("bool",), TypeInfo("bool"), Op.TypeBool, [])

    def int_(self, width: int = 32, signed: bool = False, storage_only: bool = False) -> int:
        """An integer type. 8/16/64-bit widths declare Int8/Int16/Int64 (arithmetic on them) unless
        storage_only: loads, stores and conversions of 8/16-bit values need only the storage
        capabilities a buffer of them declares."""
        if not storage_only:
            cap = {8: Capability.Int8, 16: Capability.Int16, 64: Capability.Int64}.get(width)
            if cap is not None:
                self.capability(cap)
        return self._type(("int", width, signed), TypeInfo("int", width, signed), Op.TypeInt, [width, int(signed)])

    def float_(self, width: int = 32, storage_only: bool = False) -> int:
        """A float type; 16 and 64 bits declare Float16 / Float64 unless storage_only (16-bit only)."""
        if width == 64 or (width == 16 and not storage_only):
            self.capability(Capability.Float64 if width == 64 else Capability.Float16)
        return self._type(("float", width), TypeInfo("float", width), Op.TypeFloat, [width])

    @property
    def u32(self) -> int:
        return self.int_(32, False)

    @property
    def i32(self) -> int:
        return self.int_(32, True)

    @property
    def f32(self) -> int:
        return self.float_(32)

    def vector(self, elem: int, n: int) -> int:
        return self._type(("vec", elem, n), TypeInfo("vector", elem=elem, count=n), Op.TypeVector, [elem, n])

    def array(self, elem: int, n: int, stride: int = 0) -> int:
        key = ("array", elem, n, stride)
        if key not in self._types:
            tid = self.new_id()
            self._globals += _words(Op.TypeArray, [tid, elem, self.const(self.u32, n)])
            self._types[key] = tid
            self.type_info[tid] = TypeInfo("array", elem=elem, count=n)
            if stride:
                self.decorate(tid, Decoration.ArrayStride, stride)
        return self._types[key]

    def runtime_array(self, elem: int, stride: int) -> int:
        key = ("rtarray", elem, stride)
        if key not in self._types:
            tid = self._type(key, TypeInfo("array", elem=elem), Op.TypeRuntimeArray, [elem])
            self.decorate(tid, Decoration.ArrayStride, stride)
        return self._types[key]

    def struct(self, members: Sequence[int], offsets: Sequence[int], block: bool = False) -> int:
        """A struct with explicit member offsets. A Block (a buffer's or the push constants' type)
        is never shared between variables: each gets its own id."""
        if block:
            tid = self.new_id()
            self._globals += _words(Op.TypeStruct, [tid, *members])
            self.type_info[tid] = TypeInfo("struct")
            self.decorate(tid, Decoration.Block)
        else:
            tid = self._type(("struct", tuple(members), tuple(offsets)), TypeInfo("struct"), Op.TypeStruct, members)
        for i, off in enumerate(offsets):
            self._annotations += _words(Op.MemberDecorate, [tid, i, Decoration.Offset, off])
        return tid

    def pointer(self, storage: StorageClass, pointee: int) -> int:
        info = TypeInfo("pointer", elem=pointee, storage=storage)
        return self._type(("ptr", storage, pointee), info, Op.TypePointer, [storage, pointee])

    def function_type(self, ret: int, params: Sequence[int] = ()) -> int:
        key = ("fn", ret, tuple(params))
        return self._type(key, TypeInfo("function"), Op.TypeFunction, [ret, *params])

    def byte_size(self, tid: int) -> int:
        info = self.type_info[tid]
        if info.kind in ("int", "float"):
            return info.width // 8
        if info.kind == "vector":
            return self.byte_size(info.elem) * info.count
        raise ValueError(f"no plain size for a {info.kind} type")

    # ---- constants ----------------------------------------------------------------------------
    def const(self, tid: int, value: float | int | bool) -> int:
        info = self.type_info[tid]
        key = ("const", tid, repr(value) if info.kind == "float" else int(value))
        if key in self._consts:
            return self._consts[key]
        cid = self.new_id()
        if info.kind == "bool":
            self._globals += _words(Op.ConstantTrue if value else Op.ConstantFalse, [tid, cid])
        else:
            self._globals += _words(Op.Constant, [tid, cid, *_literal_words(info, value)])
        self._consts[key] = cid
        self.type_of[cid] = tid
        return cid

    def u(self, value: int) -> int:
        return self.const(self.u32, value)

    def i(self, value: int) -> int:
        return self.const(self.i32, value)

    def f(self, value: float) -> int:
        """An f32 constant; the value is rounded to float32 (give exact float32 values)."""
        return self.const(self.f32, float(struct.unpack("<f", struct.pack("<f", value))[0]))

    # ---- variables ----------------------------------------------------------------------------
    def global_var(self, storage: StorageClass, pointee: int, name: str = "") -> int:
        ptr = self.pointer(storage, pointee)
        vid = self.new_id()
        self._globals += _words(Op.Variable, [ptr, vid, storage])
        self.type_of[vid] = ptr
        if storage in (StorageClass.Input, StorageClass.Output):
            self._interface.append(vid)
        if name:
            self.name(vid, name)
        return vid

    def builtin(self, which: BuiltIn) -> int:
        """An Input builtin variable (uvec3 for ids and counts, uint for subgroup values)."""
        if which not in self._builtins:
            vec3 = {BuiltIn.NumWorkgroups, BuiltIn.WorkgroupId, BuiltIn.LocalInvocationId, BuiltIn.GlobalInvocationId}
            t = self.vector(self.u32, 3) if which in vec3 else self.u32
            if which in (BuiltIn.SubgroupSize, BuiltIn.SubgroupLocalInvocationId, BuiltIn.SubgroupId,
                         BuiltIn.NumSubgroups):
                self.capability(Capability.GroupNonUniform)
            vid = self.global_var(StorageClass.Input, t, which.name)
            self.decorate(vid, Decoration.BuiltIn, which)
            self._builtins[which] = vid
        return self._builtins[which]

    def storage_buffer(self, binding: int, elem: int, readonly: bool = False, name: str = "",
                       descriptor_set: int = 0) -> Buffer:
        """A storage buffer binding holding a runtime array of `elem` (tightly packed). 8- and 16-bit
        elements declare the storage capabilities they need (8-bit through SPV_KHR_8bit_storage)."""
        size = self.byte_size(elem)
        info = self.type_info[elem]
        scalar_width = self.type_info[info.elem].width if info.kind == "vector" else info.width
        if scalar_width == 8:
            self.capability(Capability.StorageBuffer8BitAccess)
            self.extension("SPV_KHR_8bit_storage")
        elif scalar_width == 16:
            self.capability(Capability.StorageBuffer16BitAccess)
        arr = self.runtime_array(elem, size)
        block = self.struct([arr], [0], block=True)
        var = self.global_var(StorageClass.StorageBuffer, block, name)
        self.decorate(var, Decoration.DescriptorSet, descriptor_set)
        self.decorate(var, Decoration.Binding, binding)
        if readonly:
            self.decorate(var, Decoration.NonWritable)
        return Buffer(var, elem, binding, readonly)

    def shared_array(self, elem: int, count: int, name: str = "") -> Shared:
        var = self.global_var(StorageClass.Workgroup, self.array(elem, count), name)
        return Shared(var, elem, count)

    def push_constants(self, members: Sequence[int], name: str = "params") -> tuple[int, list[int]]:
        """A push-constant Block of 4-byte scalars: returns the variable and each member's offset."""
        offsets = [4 * i for i in range(len(members))]
        block = self.struct(list(members), offsets, block=True)
        return self.global_var(StorageClass.PushConstant, block, name), offsets

    # ---- entry point and output ---------------------------------------------------------------
    def compute_entry(self, local_size: tuple[int, int, int], name: str = "main") -> Function:
        """Begin the one compute entry point; write its body through the returned Function, then
        call `Function.end()`."""
        fid = self.new_id()
        self._entry_fid, self._entry_name, self._local_size = fid, name, local_size
        self.name(fid, name)
        return Function(self, fid)

    def to_words(self) -> list[int]:
        words = [MAGIC, VERSION_1_3, GENERATOR, self._bound, 0]
        for cap in self.capabilities:
            words += _words(Op.Capability, [cap])
        for ext in self.extensions:
            words += _words(Op.Extension, string_words(ext))
        words += self._imports
        words += _words(Op.MemoryModel, [ADDRESSING_LOGICAL, MEMORY_MODEL_GLSL450])
        words += _words(Op.EntryPoint, [EXECUTION_MODEL_GLCOMPUTE, self._entry_fid,
                                        *string_words(self._entry_name), *self._interface])
        words += _words(Op.ExecutionMode, [self._entry_fid, EXECUTION_MODE_LOCAL_SIZE, *self._local_size])
        return words + self._debug + self._annotations + self._globals + self._functions

    def to_bytes(self) -> bytes:
        words = self.to_words()
        return struct.pack(f"<{len(words)}I", *words)


def _literal_words(info: TypeInfo, value) -> list[int]:
    """A numeric literal in as many words as its type's width (spec 2.2.1, low-order word first)."""
    if info.kind == "float":
        if info.width == 64:
            return list(struct.unpack("<2I", struct.pack("<d", value)))
        if info.width == 16:
            return [struct.unpack("<H", struct.pack("<e", value))[0]]
        return [struct.unpack("<I", struct.pack("<f", value))[0]]
    mask = (1 << info.width) - 1
    v = int(value) & mask
    return [v & 0xFFFFFFFF, v >> 32] if info.width == 64 else [v]


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
