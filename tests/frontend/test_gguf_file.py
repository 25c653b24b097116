"""The GGUF header parser: real files read right, every kind of broken file refused clearly.

Hostile files are written byte by byte by the small builder below, so each test names exactly the
one thing that is wrong with its file.
"""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import open_gguf

V = GGUFValueType
Q = GGMLQuantizationType


# -- a tiny GGUF writer that can also write wrong files ----------------------------------------------


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, V.UINT32, struct.pack("<I", value))


def kv_str(key: str, value: str | bytes) -> bytes:
    return kv(key, V.STRING, s(value))


def kv_array(key: str, item: int, count: int, payload: bytes) -> bytes:
    return kv(key, V.ARRAY, struct.pack("<IQ", item, count) + payload)


def tensor(name: str | bytes, ne: tuple[int, ...], qtype: int, offset: int, n_dims: int | None = None
           ) -> bytes:
    dims = len(ne) if n_dims is None else n_dims
    return s(name) + struct.pack(f"<I{len(ne)}QIQ", dims, *ne, qtype, offset)


def gguf_bytes(kvs=(), tensors=(), data=b"", *, version=3, n_kv=None, n_tensors=None, alignment=32) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(tensors)
    pad = -len(head) % alignment
    return head + b"\0" * pad + data


def f32_tensor(name: str, n: int, offset: int = 0) -> bytes:
    return tensor(name, (n,), Q.F32, offset)


def valid_file() -> bytes:
    """Two F32 tensors, a string, a number, a number array and a string array."""
    kvs = [
        kv_str("general.architecture", "llama"),
        kv_u32("llama.block_count", 2),
        kv_array("tokenizer.ggml.scores", V.FLOAT32, 3, struct.pack("<3f", 1.0, 2.0, 3.0)),
        kv_array("tokenizer.ggml.tokens", V.STRING, 3, s("a") + s("bé") + s("<s>")),
    ]
    data = np.arange(8, dtype=np.float32).tobytes() + np.ones(4, np.float32).tobytes()
    tensors = [f32_tensor("a.weight", 8, 0), f32_tensor("b.weight", 4, 32)]
    return gguf_bytes(kvs, tensors, data)


def write(tmp_path: Path, content: bytes, name: str = "model.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def refused(path: Path) -> KineticError:
    """Open the file expecting a KineticError; check the error is one line plus a hint."""
    with pytest.raises(KineticError) as info:
        open_gguf(path)
    err = info.value
    assert "\n" not in err.message and err.message
    assert err.hint and "\n" not in err.hint
    return err


# -- files that read --------------------------------------------------------------------------------


def test_valid_synthetic_file_reads_back(tmp_path):
    """Every value and tensor of a well-formed file comes back as written."""
    g = open_gguf(write(tmp_path, valid_file()))
    assert g.architecture == "llama" and g.arch_key("block_count") == 2
    assert g.metadata.array_length("tokenizer.ggml.tokens") == 3
    assert g.metadata.array_item("tokenizer.ggml.tokens", 1) == "bé"
    assert g.metadata["tokenizer.ggml.tokens"] == ["a", "bé", "<s>"]
    assert g.metadata["tokenizer.ggml.scores"].tolist() == [1.0, 2.0, 3.0]
    assert g.metadata.array_item("tokenizer.ggml.scores", 2) == 3.0
    assert list(g.tensors) == ["a.weight", "b.weight"]
    assert g.array("a.weight").tolist() == list(range(8))
    assert g.array("b.weight").tolist() == [1.0] * 4


def test_every_truncation_of_a_valid_file_is_refused(tmp_path):
    """Cutting a valid file anywhere gives a KineticError, never another exception."""
    content = valid_file()
    for cut in range(len(content)):
        refused(write(tmp_path, content[:cut]))


def test_smollm2_matches_gguf_reader(smollm2_path):
    """Our tensor table and scalar metadata equal what the gguf package's own reader sees."""
    ours = open_gguf(smollm2_path)
    reader = GGUFReader(smollm2_path)
    assert list(ours.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        mine = ours.tensors[t.name]
        assert (mine.type, mine.ne, mine.offset, mine.nbytes) == (
            t.tensor_type, tuple(int(d) for d in t.shape), t.data_offset, t.n_bytes)
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[0] == V.ARRAY:
            assert ours.metadata.array_length(key) == len(field.data)
        else:
            assert ours.metadata[key] == pytest.approx(field.contents())
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert ours.metadata["tokenizer.ggml.tokens"] == tokens


def test_gemma_reads_fast_and_lazily(gemma_path):
    """The 262k-token vocabulary stays undecoded until asked for; one token reads alone."""
    g = open_gguf(gemma_path)
    assert g.architecture == "gemma3" and len(g.tensors) == 236
    assert g.metadata.array_length("tokenizer.ggml.tokens") == 262144
    assert "tokenizer.ggml.tokens" not in g.metadata._decoded
    assert g.metadata.array_item("tokenizer.ggml.tokens", 2) == "<bos>"


def test_tensor_data_is_mapped_not_copied(smollm2_path):
    """raw() and array() are views of the file's map, so loading copies no weights."""
    g = open_gguf(smollm2_path)
    view = g.array("token_embd.weight")
    assert view.shape == (49152, 576 // 32 * 34)  # Q8_0: 34 bytes per 32 values
    assert np.shares_memory(view, g._map) and not view.flags.writeable


# -- files that do not read --------------------------------------------------------------------------

BIG = 2**63


def _one_tensor(**kw) -> bytes:
    return gguf_bytes([kv_str("general.architecture", "llama")], [f32_tensor("t", 8)], b"\0" * 32, **kw)


HOSTILE = {
    "wrong magic": (b"GGML" + valid_file()[4:], "instead of b'GGUF'"),
    "version 1": (_one_tensor(version=1), "version 1"),
    "version 4": (_one_tensor(version=4), "version 4"),
    "big-endian": (_one_tensor(version=3 << 16), "big-endian"),
    "absurd tensor count": (_one_tensor(n_tensors=BIG), "more than the file could hold"),
    "absurd metadata count": (_one_tensor(n_kv=2**64 - 1), "more than the file could hold"),
    "key length past the end": (gguf_bytes([struct.pack("<Q", BIG) + b"k"]), "at most 65536"),
    "key past the end": (gguf_bytes([struct.pack("<Q", 100) + b"k"]), "runs past the end"),
    "string value past the end": (gguf_bytes([kv("k", V.STRING, struct.pack("<Q", BIG))]),
                                  "runs past the end"),
    "unknown value type": (gguf_bytes([kv("k", 99, b"\0" * 8)]), "unknown value type 99"),
    "nested array": (gguf_bytes([kv_array("k", V.ARRAY, 1, b"\0" * 12)]), "array of arrays"),
    "absurd string array": (gguf_bytes([kv_array("k", V.STRING, BIG, b"")]), "claims"),
    "absurd number array": (gguf_bytes([kv_array("k", V.UINT64, 2**61 + 1, b"")]), "claims"),
    "string in array past the end": (
        gguf_bytes([kv_array("k", V.STRING, 2, s("a") + struct.pack("<Q", BIG))]), "string 1 of the array k"),
    "invalid UTF-8 key": (gguf_bytes([kv(b"k\xff", V.UINT8, b"\1")]), "not valid UTF-8"),
    "invalid UTF-8 value": (gguf_bytes([kv_str("general.name", b"\xc3\x28")]), "not valid UTF-8"),
    "duplicate key": (gguf_bytes([kv_u32("k", 1), kv_u32("k", 2)]), "appears twice"),
    "split part": (gguf_bytes([kv(b"split.count", V.UINT16, struct.pack("<H", 3)),
                               kv(b"split.no", V.UINT16, struct.pack("<H", 1))]),
                   "part 2 of a model split into 3"),
    "split count not a number": (gguf_bytes([kv_str("split.count", "3")]), "split.count"),
    "alignment not a power of two": (gguf_bytes([kv_u32("general.alignment", 48)]), "not a power of two"),
    "alignment zero": (gguf_bytes([kv_u32("general.alignment", 0)]), "not a power of two"),
    "zero dimensions": (gguf_bytes([], [tensor("t", (), Q.F32, 0)]), "0 dimensions"),
    "five dimensions": (gguf_bytes([], [tensor("t", (1, 1, 1, 1, 1), Q.F32, 0)], b"\0" * 32), "5 dimensions"),
    "huge dimension count": (gguf_bytes([], [tensor("t", (8,), Q.F32, 0, n_dims=2**32 - 1)]), "dimensions"),
    "dimension of zero": (gguf_bytes([], [tensor("t", (8, 0), Q.F32, 0)], b"\0" * 32), "dimension of 0"),
    "dimension product overflows": (gguf_bytes([], [tensor("t", (2**63, 2**63), Q.F32, 0)], b"\0" * 32),
                                    "larger than the file"),
    "row not a whole block": (gguf_bytes([], [tensor("t", (33,), Q.Q8_0, 0)], b"\0" * 64), "block of 32"),
    "unknown tensor type": (gguf_bytes([], [tensor("t", (8,), 4, 0)], b"\0" * 32), "type 4"),
    "unaligned offset": (gguf_bytes([], [f32_tensor("t", 4, 4)], b"\0" * 64), "not aligned"),
    "offset past the end": (gguf_bytes([], [f32_tensor("t", 8, 2**64 - 32)], b"\0" * 32), "past the end"),
    "size past the end": (gguf_bytes([], [f32_tensor("t", 16, 0)], b"\0" * 32), "past the end"),
    "overlapping tensors": (gguf_bytes([], [f32_tensor("a", 16, 0), f32_tensor("b", 8, 32)], b"\0" * 64),
                            "overlap"),
    "duplicate tensor": (gguf_bytes([], [f32_tensor("a", 8, 0), f32_tensor("a", 8, 32)], b"\0" * 64),
                         "appears twice"),
    "data section past the end": (gguf_bytes([kv(b"general.alignment", V.UINT64, struct.pack("<Q", 2**40))],
                                             [f32_tensor("a", 8, 0)]), "past the end of the file"),
    "empty file": (b"", "empty"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_is_refused_clearly_and_cheaply(tmp_path, case):
    """Each broken file gives a one-line KineticError naming its problem, allocating little."""
    content, expected = HOSTILE[case]
    path = write(tmp_path, content)
    tracemalloc.start()
    try:
        err = refused(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert expected in err.message, err.message
    assert peak < len(content) + 1024 * 1024


def test_invalid_utf8_in_an_array_is_refused_when_read(tmp_path):
    """A string array decodes lazily; a bad item is a KineticError naming the array and item."""
    content = gguf_bytes([kv_array("tokenizer.ggml.tokens", V.STRING, 2, s("ok") + s(b"\xff"))])
    g = open_gguf(write(tmp_path, content))
    with pytest.raises(KineticError, match="string 1 of the array tokenizer.ggml.tokens"):
        g.metadata["tokenizer.ggml.tokens"]
    with pytest.raises(KineticError, match="not valid UTF-8"):
        g.metadata.array_item("tokenizer.ggml.tokens", 1)
    assert g.metadata.array_item("tokenizer.ggml.tokens", 0) == "ok"


def test_missing_path_and_directory_are_refused(tmp_path):
    """A path that is not a readable file is a KineticError, not an OSError."""
    with pytest.raises(KineticError, match="does not exist"):
        open_gguf(tmp_path / "nothing.gguf")
    with pytest.raises(KineticError, match="not a regular file"):
        open_gguf(tmp_path)
