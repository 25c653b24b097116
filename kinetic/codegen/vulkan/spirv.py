"""A small SPIR-V binary emitter: typed helpers for compute shaders, written straight to words.

Owns: spelling SPIR-V (types, constants, variables, storage buffers with their Block layout, the
compute entry point, arithmetic, subgroup operations, barriers and structured control flow) so the
kernel renderers read as arithmetic. It knows nothing about devices, quant types or ops.

The numbers (opcodes, enums) live in spirv_spec.py with their sources in the SPIR-V specification;
the layout of a module follows the specification's section 2.4 (Logical Layout of a Module) and its
binary form section 3.1-3.2. No code was copied. This module builds the module (types, constants,
variables, the entry point, the binary); `spirv_function.Function` builds the entry point's body;
`spirv_types` holds the records both use. Kernels import all of it from here.

Modules target SPIR-V 1.3 (Vulkan 1.1): subgroup operations and 16-bit storage are core there;
8-bit storage needs `SPV_KHR_8bit_storage`. Every float add, subtract and multiply is decorated
`NoContraction` by default, so no driver may fuse them into an fma behind our back: the order and
rounding of every float operation is the kernel's, written out.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from kinetic.codegen.vulkan.spirv_function import Function
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
from kinetic.codegen.vulkan.spirv_types import Buffer, Shared, TypeInfo, string_words
from kinetic.codegen.vulkan.spirv_types import instruction as _words

__all__ = ["GLSL", "Buffer", "BuiltIn", "Capability", "Decoration", "Function", "GroupOperation", "Module", "Op",
           "Scope", "Semantics", "Shared", "StorageClass", "TypeInfo", "string_words"]


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
