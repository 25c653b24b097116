"""The SPIR-V emitter: its numbers agree with the Khronos grammar, and every module the renderers
produce passes spirv-val. None of these tests needs a Vulkan device."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from vulkan_helpers import spirv_val

from kinetic.codegen.vulkan import elementwise, matvec, matvec_float, matvec_k, norm, rope, spirv
from kinetic.codegen.vulkan.builders import Target

GRAMMAR = Path("/usr/include/spirv/unified1")

TARGETS = {
    "lavapipe": Target(8, True, "f64"),
    "nvidia-like": Target(32, True, "fused"),
    "amd-like": Target(64, True, "fused"),
    "no-shuffle": Target(4, False, "unfused"),
}


def _grammar(name: str) -> dict:
    path = GRAMMAR / name
    if not path.exists():
        pytest.skip(f"{path} not installed (apt install spirv-headers)")
    return json.loads(path.read_text())


def test_opcodes_match_the_grammar():
    """Every opcode the emitter spells is the grammar's number for that instruction name."""
    table = {i["opname"]: i["opcode"] for i in _grammar("spirv.core.grammar.json")["instructions"]}
    wrong = {op.name: (op.value, table.get("Op" + op.name)) for op in spirv.Op if table.get("Op" + op.name) != op.value}
    assert not wrong


@pytest.mark.parametrize("enum,kind", [
    (spirv.Capability, "Capability"), (spirv.StorageClass, "StorageClass"), (spirv.Decoration, "Decoration"),
    (spirv.BuiltIn, "BuiltIn"), (spirv.Scope, "Scope"), (spirv.Semantics, "MemorySemantics"),
    (spirv.GroupOperation, "GroupOperation"),
])
def test_enums_match_the_grammar(enum, kind):
    """Every enumerant the emitter uses has the grammar's value."""
    kinds = {k["kind"]: k for k in _grammar("spirv.core.grammar.json")["operand_kinds"]}
    values = {e["enumerant"]: int(e["value"], 0) if isinstance(e["value"], str) else e["value"]
              for e in kinds[kind]["enumerants"]}
    wrong = {e.name: (e.value, values.get(e.name)) for e in enum if e.value and values.get(e.name) != e.value}
    assert not wrong


def test_glsl_extended_instructions_match_the_grammar():
    """GLSL.std.450 instruction numbers agree with the extended instruction grammar."""
    table = {i["opname"]: i["opcode"] for i in _grammar("extinst.glsl.std.450.grammar.json")["instructions"]}
    assert {g.name: g.value for g in spirv.GLSL} == {g.name: table[g.name] for g in spirv.GLSL}


def test_module_header_and_bound():
    """The header is magic, version 1.3, generator, bound, 0; the bound exceeds every id used."""
    k = elementwise.render_elementwise(TARGETS["lavapipe"], "add")
    words = struct.unpack(f"<{len(k.spirv) // 4}I", k.spirv)
    assert words[:3] == (spirv.MAGIC, spirv.VERSION_1_3, spirv.GENERATOR) and words[4] == 0
    assert words[3] > 1 and len(k.spirv) % 4 == 0


def test_string_literals_are_nul_terminated_and_padded():
    """A literal string takes whole words and always ends in at least one nul byte."""
    for text in ("", "abc", "main", "GLSL.std.450"):
        raw = struct.pack(f"<{len(spirv.string_words(text))}I", *spirv.string_words(text))
        assert raw.startswith(text.encode() + b"\0") and len(raw) % 4 == 0 and raw.rstrip(b"\0") == text.encode()


def _all_kernels():
    for tname, t in TARGETS.items():
        for op in elementwise.OPS:
            yield f"{tname}-{op}", lambda t=t, op=op: elementwise.render_elementwise(t, op, 0.5)
        for f64 in (True, False):
            yield f"{tname}-rms-f64={f64}", lambda t=t, f64=f64: norm.render_rms_norm(t, 576, 64, 1e-6, 64, f64)
        yield f"{tname}-rope", lambda t=t: rope.render_rope(t, 9, 64, 32, True)
        yield f"{tname}-quantize", lambda: matvec.render_quantize_q8(True)
        yield f"{tname}-quantize-k", matvec_k.render_quantize_q8_k
        for wtype in matvec_k.SUPPORTED:
            for sg in (True, False):
                yield (f"{tname}-matvec-{wtype.name}-sg={sg}",
                       lambda t=t, w=wtype, sg=sg: matvec_k.render_matvec_k(t, w, 100, 512, use_subgroups=sg))
        for wtype in matvec.SUPPORTED:
            for sg in (True, False):
                yield (f"{tname}-matvec-{wtype.name}-sg={sg}",
                       lambda t=t, w=wtype, sg=sg: matvec.render_matvec(t, w, 100, 576, use_subgroups=sg))
        for wtype in matvec_float.SUPPORTED:
            for k in (512, 352):  # a whole number of 64-value chunks, and a float64 tail
                yield (f"{tname}-matvec-{wtype.name}-k{k}",
                       lambda t=t, w=wtype, k=k: matvec_float.render_matvec_float(t, w, 100, k, True))


KERNELS = list(_all_kernels())


@pytest.mark.parametrize("render", [r for _, r in KERNELS], ids=[n for n, _ in KERNELS])
def test_every_generated_module_passes_spirv_val(render):
    """Every kernel the renderers produce, for every kind of target, is valid SPIR-V for Vulkan."""
    spirv_val(render().spirv)


def small_storage_kernel() -> bytes:
    """y[i] = int8 a[i] + f16 b[i] in f32, reading 8- and 16-bit buffers with only the storage
    capabilities (no Int8 / Float16 arithmetic)."""
    m = spirv.Module()
    i8 = m.int_(8, signed=True, storage_only=True)
    f16 = m.float_(16, storage_only=True)
    a = m.storage_buffer(0, i8, readonly=True)
    b = m.storage_buffer(1, f16, readonly=True)
    y = m.storage_buffer(2, m.f32)
    fn = m.compute_entry((16, 1, 1))
    i = fn.builtin(spirv.BuiltIn.GlobalInvocationId, 0)
    av = fn.convert(fn.convert(fn.buf_load(a, i), m.i32), m.f32)
    bv = fn.convert(fn.buf_load(b, i), m.f32)
    fn.buf_store(y, i, fn.fadd(av, bv))
    fn.end()
    return m.to_bytes()


def test_small_storage_declares_only_storage_capabilities():
    """8/16-bit buffers declare StorageBuffer8BitAccess (with its extension) and
    StorageBuffer16BitAccess, and no arithmetic capability; spirv-val accepts the module."""
    code = small_storage_kernel()
    words = struct.unpack(f"<{len(code) // 4}I", code)
    caps = {words[i + 1] for i in range(5, len(words)) if words[i] == (2 << 16 | spirv.Op.Capability)}
    assert spirv.Capability.StorageBuffer8BitAccess in caps and spirv.Capability.StorageBuffer16BitAccess in caps
    assert spirv.Capability.Int8 not in caps and spirv.Capability.Float16 not in caps
    assert b"SPV_KHR_8bit_storage" in code
    spirv_val(code)


def test_small_storage_kernel_runs(device):
    """The 8/16-bit storage kernel reads int8 and f16 values exactly on the device (when it has the
    storage features; refused with the reason otherwise)."""
    from kinetic.codegen.vulkan.device import Dispatch, Kernel

    if not (device.caps.storage_buffer_8bit and device.caps.storage_buffer_16bit):
        pytest.skip(f"{device.caps.device_name} lacks 8/16-bit storage buffers")
    a = np.arange(-8, 8, dtype=np.int8)
    b = np.linspace(-2, 2, 16).astype(np.float16)
    bufs = [device.upload(a), device.upload(b), device.buffer(64)]
    device.run([Dispatch(Kernel("small_storage", small_storage_kernel(), (True, True, False), (16, 1, 1)),
                         bufs, (1, 1, 1))])
    np.testing.assert_array_equal(bufs[2].read(np.float32, 16), a.astype(np.float32) + b.astype(np.float32))
    for buf in bufs:
        device.free(buf)
