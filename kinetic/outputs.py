"""Files a command writes for the user: never over an existing file unless asked, never over one of
the command's own inputs, and always whole or not at all.

Owns: the one rule every writing command follows (`kinetic run --receipt`, `compile -o`, `keygen`,
`pull`, `perplexity --kl-divergence-base`):

* `check_output` refuses, before any work is done, a path that exists (a dangling symlink counts)
  unless the command was given --force, a folder, a path in a folder that does not exist, and a
  path that is one of the command's inputs: the same resolved path, or the same device and inode
  (a hard link or a symlink to the model file or the --sign-key file is still that file), --force
  or not.
* `atomic_output` writes into a temporary file in the target's folder, syncs it, and only then
  puts it in place: with --force by rename over the old file, without by a hard link, which fails
  if a file appeared there meanwhile (a rename would overwrite it). A failure at any point (a full
  disk included) removes the temporary file, leaves any old file as it was, and raises a
  KineticError naming the file.

Does not own what goes into the files, or Kinetic's own caches (kinetic/user_cache.py), which
replace their files freely. Hand-written rather than a library: the one maintained-looking
package for this (atomicwrites) is archived, and none checks a path against a command's inputs.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from kinetic.errors import KineticError

# errno values with which os.link says "no hard links on this file system" rather than "no".
_NO_HARD_LINKS = {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.EOPNOTSUPP,
                  getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}
_FORCE_HINT = "Choose another file name, or add --force to replace it."

Inputs = Mapping[str, "str | os.PathLike | None"]  # what each input is ("the model file") -> its path


def check_output(path: str | os.PathLike, *, inputs: Inputs | None = None, force: bool = False) -> Path:
    """The path to write, once it is safe to write there (see the module's docstring)."""
    path = Path(path)
    for label, given in (inputs or {}).items():
        if given is not None and same_file(path, given):
            raise KineticError(f"{path} is {label}, an input of this command; it is never written over",
                               "Choose another output file.")
    if path.is_dir():
        raise KineticError(f"{path} is a folder", "Give the path of a file to write.")
    folder = path.parent
    if not folder.is_dir():
        raise KineticError(f"cannot write {path}: the folder {folder} does not exist", "Create it first.")
    if not force and os.path.lexists(path):
        raise KineticError(f"{path} exists already; it was not overwritten", _FORCE_HINT)
    return path


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: the same resolved path, or the same device and inode."""
    try:
        if Path(a).resolve() == Path(b).resolve():
            return True
        first, second = os.stat(a), os.stat(b)
    except (OSError, RuntimeError, ValueError):  # a path that does not exist (yet), a symlink loop
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


@contextmanager
def atomic_output(path: str | os.PathLike, *, force: bool = False, private: bool = False,
                  size: int | None = None) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s new contents to; they replace `path` when the block ends
    without an exception. private: readable by the owner only (0600), else 0666 less the umask.
    size (bytes) goes into the message when the disk fills up."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise write_error(path, exc, size) from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if not private:
            os.chmod(tmp, 0o666 & ~_umask())
        _commit(tmp, path, force)
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, OSError):
            raise write_error(path, exc, size) from None
        raise
    sync_folder(path.parent)


def write_output(path: str | os.PathLike, data: bytes | str, *, inputs: Inputs | None = None, force: bool = False,
                 private: bool = False) -> Path:
    """check_output, then the whole of `data` (text as UTF-8) written atomically."""
    path = check_output(path, inputs=inputs, force=force)
    with atomic_output(path, force=force, private=private, size=len(data)) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def write_error(path: Path, exc: OSError, size: int | None = None) -> KineticError:
    """The KineticError for an OSError met while writing `path` (nothing was written)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        needed = f" ({size / 2**20:.1f} MiB)" if size is not None else ""
        return KineticError(f"no space left on device writing {path}{needed}: the disk filled up; nothing was "
                            "written", "Free some space or write elsewhere; an older file there is unchanged.")
    return KineticError(f"cannot write {path}: {exc.strerror or exc}; nothing was written",
                        "Check the path and its permissions.")


def _commit(tmp: str, path: Path, force: bool) -> None:
    """Put the finished temporary file at `path`: a rename over it with force, else a hard link
    that fails if anything is there (falling back to check-then-rename without hard links)."""
    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise KineticError(f"{path} appeared while it was being written; it was not overwritten",
                           _FORCE_HINT) from None
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(path):
            raise KineticError(f"{path} appeared while it was being written; it was not overwritten",
                               _FORCE_HINT) from None
        os.replace(tmp, path)
        return
    _remove(tmp)


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable where the platform allows syncing a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
