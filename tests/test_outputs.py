"""kinetic.outputs: never over an existing file unless forced, never over an input, whole or not at all."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from kinetic import outputs
from kinetic.errors import KineticError
from kinetic.outputs import atomic_output, check_output, same_file, write_output


def only(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_an_existing_file_is_refused_without_force(tmp_path):
    """An existing file is refused and left as it was; with force it is replaced."""
    out = tmp_path / "out.json"
    out.write_text("old")
    with pytest.raises(KineticError, match="exists already") as info:
        write_output(out, "new")
    assert "--force" in info.value.hint and out.read_text() == "old"
    write_output(out, "new", force=True)
    assert out.read_text() == "new" and only(tmp_path) == ["out.json"]


def test_a_dangling_symlink_counts_as_existing(tmp_path):
    """A symlink to nowhere is still something at that path: refused without force."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(KineticError, match="exists already"):
        check_output(link)


@pytest.mark.parametrize("how", ["same path", "symlink", "hard link", "relative path"])
def test_an_input_is_refused_even_with_force(tmp_path, monkeypatch, how):
    """The output is never one of the command's inputs, named by the same path, a symlink, a hard
    link or another spelling of its path, --force or not."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF weights")
    out = {"same path": model, "symlink": tmp_path / "sym", "hard link": tmp_path / "hard",
           "relative path": "./model.gguf"}[how]
    if how == "symlink":
        out.symlink_to(model)
    elif how == "hard link":
        os.link(model, out)
    monkeypatch.chdir(tmp_path)
    for force in (False, True):
        with pytest.raises(KineticError, match="is the model file, an input of this command"):
            write_output(out, "receipt", inputs={"the model file": model, "the key": None}, force=force)
    assert model.read_bytes() == b"GGUF weights"


def test_same_file_compares_device_and_inode(tmp_path):
    """Two names of one file are the same file; two files with equal bytes are not."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("x")
    b.write_text("x")
    os.link(a, tmp_path / "c")
    assert same_file(a, tmp_path / "c") and not same_file(a, b) and not same_file(a, tmp_path / "missing")


def test_folders_and_missing_folders_are_refused(tmp_path):
    """A folder is not a file to write, and a file in a folder that does not exist cannot be written."""
    with pytest.raises(KineticError, match="is a folder"):
        check_output(tmp_path, force=True)
    with pytest.raises(KineticError, match="does not exist"):
        check_output(tmp_path / "no" / "out.json")


def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path):
    """A write that fails with ENOSPC raises "no space left on device writing X", removes its
    temporary file and leaves the old file's bytes as they were."""
    out = tmp_path / "out.bin"
    out.write_bytes(b"old bytes")
    with pytest.raises(KineticError, match="no space left on device writing .*out.bin"):
        with atomic_output(out, force=True) as f:
            f.write(b"half of the new")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert out.read_bytes() == b"old bytes" and only(tmp_path) == ["out.bin"]


def test_any_failure_removes_the_temporary_file(tmp_path):
    """An exception inside the block (not an OSError) passes through; nothing is written."""
    with pytest.raises(RuntimeError, match="stop"):
        with atomic_output(tmp_path / "out.bin") as f:
            f.write(b"x")
            raise RuntimeError("stop")
    assert only(tmp_path) == []


def test_a_file_that_appears_meanwhile_is_not_overwritten(tmp_path):
    """Without force the file is put in place by a hard link, which fails if another file took the
    name while it was written: that file stays, the temporary goes."""
    out = tmp_path / "out.json"
    with pytest.raises(KineticError, match="appeared while it was being written"):
        with atomic_output(out) as f:
            f.write(b"ours")
            out.write_bytes(b"theirs")
    assert out.read_bytes() == b"theirs" and only(tmp_path) == ["out.json"]


def test_without_hard_links_it_checks_then_renames(tmp_path, monkeypatch):
    """On a file system without hard links the file is still written, and still never over one."""
    def no_links(_src, _dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(outputs.os, "link", no_links)
    out = tmp_path / "out.json"
    write_output(out, "first")
    assert out.read_text() == "first"
    with pytest.raises(KineticError, match="appeared while it was being written"):
        with atomic_output(out) as f:
            f.write(b"second")
    assert out.read_text() == "first" and only(tmp_path) == ["out.json"]


def test_private_files_are_the_owners_alone(tmp_path):
    """private: mode 0600; otherwise 0666 less the umask."""
    write_output(tmp_path / "secret", "k", private=True)
    write_output(tmp_path / "public", "p")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "public").stat().st_mode) == 0o666 & ~mask
