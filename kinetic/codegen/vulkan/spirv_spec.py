"""The numbers of SPIR-V that the emitter (spirv.py) uses, by name.

From the SPIR-V specification (Khronos, "SPIR-V Specification", version 1.6 revision 2, section 3
"Binary Form": 3.2 physical layout, 3.5 Execution Model, 3.6 Execution Mode, 3.11 Storage Class,
3.20 Decoration, 3.21 BuiltIn, 3.25 Memory Semantics, 3.27 Scope, 3.28 Group Operation,
3.31 Capability, 3.42 Instructions) and "GLSL.std.450 Extended Instructions" (version 1.00
revision 4). Only what is used is listed; tests/codegen/vulkan/test_vulkan_spirv.py checks each
against the machine-readable grammar where `spirv-headers` is installed.
"""

from __future__ import annotations

import enum

MAGIC = 0x07230203
VERSION_1_3 = 0x00010300
GENERATOR = 0  # no registered generator id (spec 3.2: 0 is allowed for unregistered tools)


class Op(enum.IntEnum):
    """Opcodes (spec 3.42), only those the emitter uses."""

    Name = 5
    MemberName = 6
    Extension = 10
    ExtInstImport = 11
    ExtInst = 12
    MemoryModel = 14
    EntryPoint = 15
    ExecutionMode = 16
    Capability = 17
    TypeVoid = 19
    TypeBool = 20
    TypeInt = 21
    TypeFloat = 22
    TypeVector = 23
    TypeArray = 28
    TypeRuntimeArray = 29
    TypeStruct = 30
    TypePointer = 32
    TypeFunction = 33
    ConstantTrue = 41
    ConstantFalse = 42
    Constant = 43
    ConstantComposite = 44
    Function = 54
    FunctionEnd = 56
    Variable = 59
    Load = 61
    Store = 62
    AccessChain = 65
    Decorate = 71
    MemberDecorate = 72
    CompositeConstruct = 80
    CompositeExtract = 81
    ConvertFToU = 109
    ConvertFToS = 110
    ConvertSToF = 111
    ConvertUToF = 112
    UConvert = 113
    SConvert = 114
    FConvert = 115
    Bitcast = 124
    SNegate = 126
    FNegate = 127
    IAdd = 128
    FAdd = 129
    ISub = 130
    FSub = 131
    IMul = 132
    FMul = 133
    UDiv = 134
    SDiv = 135
    FDiv = 136
    UMod = 137
    LogicalEqual = 164
    LogicalNotEqual = 165
    LogicalOr = 166
    LogicalAnd = 167
    LogicalNot = 168
    Select = 169
    IEqual = 170
    INotEqual = 171
    UGreaterThan = 172
    SGreaterThan = 173
    UGreaterThanEqual = 174
    SGreaterThanEqual = 175
    ULessThan = 176
    SLessThan = 177
    ULessThanEqual = 178
    SLessThanEqual = 179
    FOrdEqual = 180
    FOrdLessThan = 184
    FOrdGreaterThan = 186
    FOrdLessThanEqual = 188
    FOrdGreaterThanEqual = 190
    FUnordNotEqual = 183
    ShiftRightLogical = 194
    ShiftRightArithmetic = 195
    ShiftLeftLogical = 196
    BitwiseOr = 197
    BitwiseXor = 198
    BitwiseAnd = 199
    Not = 200
    BitFieldSExtract = 202
    BitFieldUExtract = 203
    ControlBarrier = 224
    MemoryBarrier = 225
    LoopMerge = 246
    SelectionMerge = 247
    Label = 248
    Branch = 249
    BranchConditional = 250
    Return = 253
    GroupNonUniformElect = 333
    GroupNonUniformBroadcastFirst = 338
    GroupNonUniformShuffleXor = 346
    GroupNonUniformIAdd = 349
    GroupNonUniformFAdd = 350
    GroupNonUniformFMax = 358


class Capability(enum.IntEnum):
    """spec 3.31"""

    Shader = 1
    Float16 = 9
    Float64 = 10
    Int64 = 11
    Int16 = 22
    Int8 = 39
    GroupNonUniform = 61
    GroupNonUniformVote = 62
    GroupNonUniformArithmetic = 63
    GroupNonUniformBallot = 64
    GroupNonUniformShuffle = 65
    GroupNonUniformShuffleRelative = 66
    StorageBuffer16BitAccess = 4433
    StorageBuffer8BitAccess = 4448


class StorageClass(enum.IntEnum):
    """spec 3.11"""

    UniformConstant = 0
    Input = 1
    Uniform = 2
    Output = 3
    Workgroup = 4
    Private = 6
    Function = 7
    PushConstant = 9
    StorageBuffer = 12


class Decoration(enum.IntEnum):
    """spec 3.20"""

    Block = 2
    ArrayStride = 6
    BuiltIn = 11
    Restrict = 19
    NonWritable = 24
    NonReadable = 25
    Binding = 33
    DescriptorSet = 34
    Offset = 35
    NoContraction = 42


class BuiltIn(enum.IntEnum):
    """spec 3.21"""

    NumWorkgroups = 24
    WorkgroupId = 26
    LocalInvocationId = 27
    GlobalInvocationId = 28
    LocalInvocationIndex = 29
    SubgroupSize = 36
    NumSubgroups = 38
    SubgroupId = 40
    SubgroupLocalInvocationId = 41


class Scope(enum.IntEnum):
    """spec 3.27"""

    Device = 1
    Workgroup = 2
    Subgroup = 3


class Semantics(enum.IntFlag):
    """Memory semantics, spec 3.25"""

    NONE = 0
    AcquireRelease = 0x8
    UniformMemory = 0x40
    WorkgroupMemory = 0x100


class GroupOperation(enum.IntEnum):
    """spec 3.28"""

    Reduce = 0
    InclusiveScan = 1
    ExclusiveScan = 2


class GLSL(enum.IntEnum):
    """GLSL.std.450 extended instruction numbers."""

    RoundEven = 2
    Trunc = 3
    FAbs = 4
    Floor = 8
    Sqrt = 31
    FMin = 37
    UMin = 38
    SMin = 39
    FMax = 40
    UMax = 41
    SMax = 42
    FClamp = 43
    Fma = 50
    Ldexp = 53


EXECUTION_MODEL_GLCOMPUTE = 5  # spec 3.5
EXECUTION_MODE_LOCAL_SIZE = 17  # spec 3.6
ADDRESSING_LOGICAL = 0  # spec 3.6 (Addressing Model)
MEMORY_MODEL_GLSL450 = 1  # spec 3.7
