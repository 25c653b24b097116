"""`kinetic quantize` as a command: what it refuses (and that it refuses before writing), that OUT
appears whole or not at all, and that threads and chunking never change a byte."""

from __future__ import annotations

import errno
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType

from kinetic.cli.main import main
from kinetic.errors import KineticError
from kinetic.quantize import gguf_out, run

T = GGMLQuantizationType


def _kv(key: str, vtype: GGUFValueType, payload: bytes) -> bytes:
    encoded = key.encode()
    return struct.pack("<Q", len(encoded)) + encoded + struct.pack("<I", vtype) + payload


def tiny_model(path: Path, *, seed: int = 0) -> Path:
    """A small F32 llama file: two layers, rows of 256 values (whole K-quant blocks) and of 96."""
    rng = np.random.default_rng(seed)
    arch = b"llama"
    kvs = [_kv("general.architecture", GGUFValueType.STRING, struct.pack("<Q", len(arch)) + arch),
           _kv("llama.block_count", GGUFValueType.UINT32, struct.pack("<I", 2))]
    shapes = {"token_embd.weight": (256, 64), "output_norm.weight": (256,)}
    for layer in range(2):
        shapes |= {f"blk.{layer}.attn_v.weight": (256, 96), f"blk.{layer}.ffn_down.weight": (96, 256),
                   f"blk.{layer}.attn_norm.weight": (256,)}
    slots = gguf_out.layout([(name, dims, T.F32) for name, dims in shapes.items()])
    with open(path, "wb") as f:
        f.write(gguf_out.metadata_bytes(kvs, 0, slots))
        for slot in slots:
            data = (rng.standard_normal(int(np.prod(slot.dims))) * 0.05).astype(np.float32).tobytes()
            f.write(data + bytes(gguf_out.pad(len(data)) - len(data)))
    return path


def test_imatrix_is_refused_before_anything_is_written(tmp_path, capsys):
    """--imatrix is refused with a reason, and OUT is not created."""
    src = tiny_model(tmp_path / "in.gguf")
    assert main(["quantize", str(src), str(tmp_path / "out.gguf"), "Q4_K_M", "--imatrix", "x.dat"]) == 1
    assert "--imatrix is not supported" in capsys.readouterr().err
    assert not (tmp_path / "out.gguf").exists()


def test_unknown_type_is_refused_naming_the_types(tmp_path, capsys):
    """A TYPE it does not write is refused with the list of those it does."""
    src = tiny_model(tmp_path / "in.gguf")
    assert main(["quantize", str(src), str(tmp_path / "out.gguf"), "IQ2_XXS"]) == 1
    assert "Q4_K_M" in capsys.readouterr().err


def test_a_file_that_is_not_gguf_is_refused_with_the_reason(tmp_path, capsys):
    """An input that is not GGUF is refused, saying what is wrong with it."""
    src = tmp_path / "notes.gguf"
    src.write_text("hello, not a model")
    assert main(["quantize", str(src), str(tmp_path / "out.gguf"), "Q8_0"]) == 1
    assert "not a valid GGUF file" in capsys.readouterr().err


def test_weights_of_an_unreadable_type_are_refused(smollm2_path, tmp_path):
    """A tensor that must change type but is stored in a type it does not read (Q4_1) is named."""
    with pytest.raises(KineticError, match=r"blk\.\d+\.\w+\.weight is Q4_1"):
        run.plan(smollm2_path, "Q4_0")


def test_an_existing_output_is_kept_without_force(tmp_path, capsys):
    """OUT that exists is refused without --force and left as it was."""
    src = tiny_model(tmp_path / "in.gguf")
    out = tmp_path / "out.gguf"
    out.write_bytes(b"keep me")
    assert main(["quantize", str(src), str(out), "Q8_0"]) == 1
    assert out.read_bytes() == b"keep me"


def test_an_interrupted_run_leaves_no_output(tmp_path):
    """Stopped after its first tensor, it leaves neither OUT nor a temporary file behind."""
    src = tiny_model(tmp_path / "in.gguf")

    def stop(_values):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run.quantize_file(src, tmp_path / "out.gguf", "Q4_K_M", progress=stop)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.gguf"]


def test_a_full_disk_leaves_no_output_and_says_so(tmp_path, monkeypatch):
    """A write that fails for want of space is one KineticError saying so, and leaves no file."""
    src = tiny_model(tmp_path / "in.gguf")

    def full_disk(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run, "_write_tensor", full_disk)
    with pytest.raises(KineticError, match="no space left"):
        run.quantize_file(src, tmp_path / "out.gguf", "Q8_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.gguf"]


@pytest.mark.parametrize("target", ["Q4_K_M", "Q3_K_M", "Q5_1"])
def test_threads_and_chunks_never_change_a_byte(tmp_path, monkeypatch, target):
    """One thread with whole tensors and four threads with chunks of a few rows write the same file."""
    src = tiny_model(tmp_path / "in.gguf", seed=1)
    run.quantize_file(src, tmp_path / "one.gguf", target, threads=1)
    monkeypatch.setattr(run, "CHUNK_VALUES", 1000)
    run.quantize_file(src, tmp_path / "four.gguf", target, threads=4)
    assert (tmp_path / "one.gguf").read_bytes() == (tmp_path / "four.gguf").read_bytes()


def test_the_command_writes_the_planned_file(tmp_path):
    """The command's OUT has the plan's metadata, size and the types the mixture chose."""
    src = tiny_model(tmp_path / "in.gguf")
    out = tmp_path / "out.gguf"
    assert main(["quantize", str(src), str(out), "Q4_K_M", "-t", "2"]) == 0
    plan = run.plan(src, "Q4_K_M")
    data = out.read_bytes()
    assert data.startswith(plan.metadata) and len(data) == plan.size
    types = {job.slot.name: job.slot.type for job in plan.jobs}
    # tied embedding rows of 256: Q6_K; the last layer's attn_v and ffn_down get more bits (Q6_K), and
    # ffn_down's rows of 96 fall back (Q4_K -> Q5_0, Q6_K -> Q8_0)
    assert types["token_embd.weight"] == T.Q6_K and types["output_norm.weight"] == T.F32
    assert (types["blk.0.attn_v.weight"], types["blk.1.attn_v.weight"]) == (T.Q4_K, T.Q6_K)
    assert (types["blk.0.ffn_down.weight"], types["blk.1.ffn_down.weight"]) == (T.Q5_0, T.Q8_0)
