""".ktc files: compile, verify, sign, load, and what a profile or another build changes.

Real models for compiling and identity (SmolLM2 runs; Gemma 3 compiles and verifies); the synthetic
llama file, given a chat template so that every section kind is present (tests/ktc/conftest.py), for
the layout, signing, writing and profile tests. Damaged files: test_ktc_damage.py.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

import kinetic
from kinetic.cli.main import main
from kinetic.frontend.gguf_file import open_gguf
from kinetic.ktc import Kind, KtcError, KtcFile
from kinetic.ktc import layout as L
from kinetic.ktc import load as ktc_load
from kinetic.ktc import writer as ktc_writer
from kinetic.ktc.load import LoadedKtc
from tests.conftest import model_path
from tests.ktc.helpers import TEMPLATE, flip

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def smollm2_ktc(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "smollm2.ktc"
    assert main(["compile", str(model_path("smollm2-135m")), "-o", str(out)]) == 0
    return out


# -- real models -------------------------------------------------------------------------------------


def test_smollm2_ktc_gives_the_gguf_greedy_tokens(smollm2_ktc, capsys):
    """Greedy tokens from the .ktc are the .gguf file's, token for token, and verify passes."""
    assert main(["verify", str(smollm2_ktc)]) == 0
    assert "every hash matches" in capsys.readouterr().out
    from_gguf = kinetic.Model(model_path("smollm2-135m"), n_ctx=64)
    from_ktc = kinetic.Model(smollm2_ktc, n_ctx=64)
    assert from_ktc.graph == from_gguf.graph
    expected = from_gguf.generate(PROMPT, max_tokens=8, return_tokens=True)
    assert from_ktc.generate(PROMPT, max_tokens=8, return_tokens=True) == expected
    assert len(expected) == 8


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_real_model_sections_join_back_to_the_gguf(name, tmp_path, capsys):
    """Compiling a real model gives a file that verifies, whose joined sections hold exactly the
    source's metadata (keys, values, types) and tensors (names, types, shapes, bytes), and whose
    tokenizer splits text into the same ids."""
    from kinetic.frontend.tokenizer import Tokenizer

    src = model_path(name)
    out = tmp_path / f"{name}.ktc"
    assert main(["compile", str(src), "-o", str(out)]) == 0
    assert main(["verify", str(out)]) == 0
    source, joined = open_gguf(src), LoadedKtc(out).gguf
    assert_same_model(source, joined)
    text = "Héllo wörld, <b>spaces</b>   and 12345 digits!"
    assert Tokenizer.from_gguf(joined).encode(text) == Tokenizer.from_gguf(source).encode(text)


def assert_same_model(source, joined) -> None:
    assert sorted(joined.metadata) == sorted(source.metadata)
    for key in source.metadata:
        assert joined.metadata.value_type(key) == source.metadata.value_type(key), key
        a, b = joined.metadata[key], source.metadata[key]
        assert (a.tolist() if isinstance(a, np.ndarray) else a) == (b.tolist() if isinstance(b, np.ndarray) else b)
    assert list(joined.tensors) == list(source.tensors)
    for name, t in source.tensors.items():
        j = joined.tensors[name]
        assert (j.type, j.ne, j.nbytes) == (t.type, t.ne, t.nbytes)
        assert np.array_equal(joined.raw(name), source.raw(name)), name


# -- the synthetic model: layout, reproducibility, every section kind ------------------------------


def test_synthetic_has_every_section_kind_aligned(synth_ktc, synth_gguf):
    """All six kinds are present, each at a multiple of ALIGN, and the join is the source model."""
    ktc = KtcFile.open(synth_ktc)
    assert list(ktc.entries) == list(Kind)
    assert all(e.offset % L.ALIGN == 0 for e in ktc.entries.values())
    assert ktc.text(Kind.CHAT_TEMPLATE) == TEMPLATE
    assert_same_model(open_gguf(synth_gguf), LoadedKtc(synth_ktc).gguf)


def test_compile_is_reproducible(synth_gguf, synth_ktc, tmp_path):
    """The same model compiled again gives the same bytes (no time stamps, deterministic layout)."""
    again = tmp_path / "again.ktc"
    assert main(["compile", str(synth_gguf), "-o", str(again)]) == 0
    assert again.read_bytes() == synth_ktc.read_bytes()


def test_synthetic_ktc_runs_like_its_gguf(synth_gguf, synth_ktc):
    """Greedy tokens from the synthetic .ktc equal the .gguf's (the stored graph is the same graph)."""
    a = kinetic.Model(synth_gguf, n_ctx=32).generate([1, 2, 3], max_tokens=6, return_tokens=True)
    b = kinetic.Model(synth_ktc, n_ctx=32).generate([1, 2, 3], max_tokens=6, return_tokens=True)
    assert a == b


# -- signing -----------------------------------------------------------------------------------------


def test_signed_file_verifies_with_its_key_only(synth_gguf, tmp_path, capsys):
    """A signed file verifies and shows its public key; --key with that key passes, with another key
    fails; a flipped signature byte is refused naming the signature."""
    key, other = tmp_path / "key", tmp_path / "other"
    assert main(["keygen", str(key)]) == 0 and main(["keygen", str(other)]) == 0
    public = (tmp_path / "key.pub").read_text().strip()
    out = tmp_path / "signed.ktc"
    assert main(["compile", str(synth_gguf), "-o", str(out), "--sign-key", str(key)]) == 0
    capsys.readouterr()
    assert main(["verify", str(out), "--key", str(tmp_path / "key.pub")]) == 0
    assert f"valid, public key {public}" in capsys.readouterr().out
    assert main(["verify", str(out), "--key", str(tmp_path / "other.pub")]) == 1
    assert f"is signed by {public}, not by" in capsys.readouterr().err
    assert KtcFile.open(out).signature.public_key_hex == public
    flip(out, out.stat().st_size - 1)
    with pytest.raises(KtcError, match="signature does not verify") as info:
        LoadedKtc(out)
    assert info.value.part == "signature"


def test_unsigned_file_fails_a_required_key(synth_ktc, tmp_path, capsys):
    """verify --key on an unsigned file exits 1 saying it is unsigned."""
    assert main(["keygen", str(tmp_path / "k")]) == 0
    capsys.readouterr()
    assert main(["verify", str(synth_ktc), "--key", str(tmp_path / "k.pub")]) == 1
    assert "is unsigned" in capsys.readouterr().err


def test_raw_and_hex_key_files_sign_alike(synth_gguf, tmp_path):
    """A 32-byte raw key file and the same seed as 64 hex digits give the same signed file."""
    seed = bytes(range(32))
    (tmp_path / "raw").write_bytes(seed)
    (tmp_path / "hex").write_text(seed.hex() + "\n")
    for name in ("raw", "hex"):
        assert main(["compile", str(synth_gguf), "-o", str(tmp_path / f"{name}.ktc"), "--sign-key",
                     str(tmp_path / name)]) == 0
    assert (tmp_path / "raw.ktc").read_bytes() == (tmp_path / "hex.ktc").read_bytes()


# -- writing: all or nothing; the command line -----------------------------------------------------


def test_full_disk_leaves_no_file(synth_gguf, tmp_path, monkeypatch, capsys):
    """A disk that fills up mid-write gives a clear error and leaves neither the file nor a temp file."""

    def full(f, sections, offsets):
        f.write(b"x" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ktc_writer, "_write_body", full)
    out = tmp_path / "out" / "model.ktc"
    out.parent.mkdir()
    assert main(["compile", str(synth_gguf), "-o", str(out)]) == 1
    assert "disk filled up" in capsys.readouterr().err
    assert list(out.parent.iterdir()) == []


def test_too_little_free_space_is_refused_first(synth_gguf, tmp_path, monkeypatch, capsys):
    """When the folder has less free space than the file needs, nothing is written."""
    usage = collections.namedtuple("usage", "total used free")(10, 9, 1)
    monkeypatch.setattr(ktc_writer.shutil, "disk_usage", lambda _p: usage)
    out = tmp_path / "model.ktc"
    assert main(["compile", str(synth_gguf), "-o", str(out)]) == 1
    assert "not enough disk space" in capsys.readouterr().err and not out.exists()


def test_info_reads_a_ktc_file(synth_ktc, capsys):
    """`kinetic info` on a .ktc reports the model as for a .gguf plus the file's profile and signature."""
    assert main(["info", str(synth_ktc), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["architecture"] == "llama" and report["size_bytes"] == synth_ktc.stat().st_size
    assert report["ktc"]["signed"] is False and report["ktc"]["profile"]["tuned"] is False
    assert [s["kind"] for s in report["ktc"]["sections"]] == [k.label for k in Kind]


# -- profile and build mismatches --------------------------------------------------------------------


def test_other_device_class_runs_defaults_with_one_note(synth_ktc, monkeypatch):
    """On a machine of another device class the profile is not used and one note says so."""
    notes = []
    monkeypatch.setattr(ktc_load, "device_class", lambda device: "cpu-x86_64-elsewhere")
    loaded = LoadedKtc(synth_ktc, note=notes.append)
    assert loaded.engine_settings("cpu", None) == {"threads": None}
    assert len(notes) == 1 and "cpu-x86_64-elsewhere" in notes[0] and loaded.profile.device_class in notes[0]


def test_same_device_class_uses_the_profile(synth_ktc):
    """On the machine class it was made for, the profile's batch and threads reach the engine."""
    loaded = LoadedKtc(synth_ktc, note=pytest.fail)
    assert loaded.engine_settings("cpu", None) == {"threads": loaded.profile.threads, "batch": loaded.profile.batch,
                                                   "matmul": loaded.profile.matmul_choice()}
    assert loaded.engine_settings("cpu", 3)["threads"] == 3


def test_other_build_optimizes_the_graph_again(synth_ktc, monkeypatch):
    """A file from a build with another pipeline hash gets its graph made again (the same graph here),
    with a note."""
    import kinetic.passes

    stored = LoadedKtc(synth_ktc).graph()
    monkeypatch.setattr(kinetic.passes, "pipeline_hash", lambda options=None: "another build")
    notes = []
    assert LoadedKtc(synth_ktc, note=notes.append).graph() == stored
    assert len(notes) == 1 and "optimizing its graph again" in notes[0]


def test_public_key_file_is_not_taken_as_a_secret_key(synth_gguf, tmp_path, capsys):
    """--sign-key with keygen's FILE.pub (also 64 hex digits) is refused instead of signing with it."""
    assert main(["keygen", str(tmp_path / "k")]) == 0
    out = tmp_path / "model.ktc"
    assert main(["compile", str(synth_gguf), "-o", str(out), "--sign-key", str(tmp_path / "k.pub")]) == 1
    assert "is a public key file" in capsys.readouterr().err and not out.exists()


