"""`kinetic pull org/repo[:QUANT]`: a GGUF model from a Hugging Face repository (or a mirror).

Owns: reading the repository's file list with its published hashes (huggingface_hub's HfApi),
choosing the model to fetch (`choose`: the quantization named, else the rule below), fetching its
files with huggingface_hub's `http_get` (HF_TOKEN, HF_ENDPOINT, its progress bar, its retries),
checking each file against the hash the hub publishes (the LFS SHA-256; the git blob id for a file
outside LFS) and only then putting it in place as `<models folder>/org/repo/<file>`, never over an
existing file.

Files are fetched into `<models folder>/.pull/org--repo/<file>.part`. A transfer that breaks off is
resumed with a Range request, by http_get itself a few times and, after that, by the next
`kinetic pull` from where the part ends (the installed huggingface_hub's own hf_hub_download
deletes a partial file when a download fails, which is why the part file is kept here). A file whose hash does not match
is refused and the staging folder removed: nothing is left behind.

The rule without a quantization: a repository with one model gives that one; otherwise the largest
of Q4_K_M, Q5_K_M, Q6_K and Q8_0 whose files, plus a fifth for context and working buffers, fit the
memory available to a model (the GPU's free memory, else half the free RAM; kinetic.machine), and
Q4_K_M when none fits; a repository with none of those four gives its largest model that fits, else
its smallest. Does not own the models folder or known short names (kinetic.hub).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kinetic.errors import KineticError
from kinetic.stores.names import is_gguf, is_projector, quant_from_name, same_quant, split_part

LADDER = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")  # smallest first
HEADROOM = 1.2  # a model needs its files plus a fifth for context and working buffers
DEFAULT_ENDPOINT = "https://huggingface.co"
_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class RepoFile:
    path: str  # the file's path in the repository
    size: int
    sha256: str | None  # the LFS SHA-256 the hub publishes
    blob_id: str | None  # the git blob id (what a file outside LFS is checked against)


@dataclass(frozen=True)
class Candidate:
    """One model of a repository: a file, or every part of a split model."""

    stem: str
    quant: str | None
    files: tuple[RepoFile, ...]
    split_count: int = 1

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def label(self) -> str:
        return self.quant or self.stem


def candidates(files: list[RepoFile]) -> list[Candidate]:
    """The repository's GGUF models, vision projectors left out, split parts grouped in order."""
    groups: dict[str, list[RepoFile]] = {}
    counts: dict[str, int] = {}
    for f in files:
        name = PurePosixPath(f.path).name
        if not is_gguf(name) or is_projector(name):
            continue
        part = split_part(name)
        stem = str(PurePosixPath(f.path).parent / (part.stem if part else name[: -len(".gguf")]))
        groups.setdefault(stem, []).append(f)
        counts[stem] = part.count if part else 1
    return [Candidate(PurePosixPath(stem).name, quant_from_name(PurePosixPath(stem).name),
                      tuple(sorted(parts, key=lambda f: f.path)), counts[stem])
            for stem, parts in sorted(groups.items())]


def choose(models: list[Candidate], *, quant: str | None, budget: Callable[[], tuple[int | None, str]],
           file: str | None = None) -> tuple[Candidate, str]:
    """(the model to fetch, why): the one holding `file`, else the one named by `quant`, else the
    rule in the module docstring. `budget()` gives the memory a model may use and what that figure is."""
    if file is not None:
        named = [m for m in models if any(file.lower() in (f.path.lower(), PurePosixPath(f.path).name.lower())
                                          for f in m.files)]
        if not named:
            raise KineticError(f"the repository has no GGUF model file {file}; its models: " + _labels(models),
                               "Give one of its .gguf file names to --file (a projector is not a model).")
        return named[0], "the file named"
    if quant is not None:
        named = [m for m in models if same_quant(m.quant, quant) or m.stem.lower() == quant.lower()]
        if not named:
            raise KineticError(f"the repository has no {quant} model; it has: " + _labels(models),
                               "Name one of those after the colon, or leave it out to let Kinetic choose.")
        return named[0], "the quantization named"
    if len(models) == 1:
        return models[0], "the repository's only model"
    memory, what = budget()
    fits = [m for m in models if memory is None or m.size * HEADROOM <= memory]
    ladder = [m for q in LADDER for m in models if same_quant(m.quant, q)]
    room = "unknown memory" if memory is None else f"{_gib(memory)} ({what})"
    if ladder:
        fitting = [m for m in ladder if m in fits]
        if fitting:
            return fitting[-1], f"the largest of {', '.join(LADDER)} that fits {room} with room for context"
        return ladder[0], f"none of {', '.join(LADDER)} fits {room}; the smallest of them"
    if fits:
        best = max(fits, key=lambda m: m.size)
        return best, f"the largest model that fits {room} with room for context"
    return min(models, key=lambda m: m.size), f"no model fits {room}; the smallest"


def _labels(models: list[Candidate]) -> str:
    return ", ".join(f"{m.label} ({_gib(m.size)})" for m in models)


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


# ---- the hub ---------------------------------------------------------------------------------------

def endpoint() -> str:
    """HF_ENDPOINT (a mirror), else huggingface.co; read when a pull starts."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token() -> str | None:
    """HF_TOKEN, sent for gated and private repositories; None lets huggingface_hub use a saved login."""
    return os.environ.get("HF_TOKEN") or None


def repo_files(repo: str) -> tuple[str, list[RepoFile]]:
    """(the commit the repository's main branch is at, its files with their hashes)."""
    from huggingface_hub import HfApi

    with no_telemetry(), hub_errors(repo):
        info = HfApi(endpoint=endpoint(), token=token()).model_info(repo, files_metadata=True)
    files = [RepoFile(s.rfilename, s.lfs.size if s.lfs else (s.size or 0), s.lfs.sha256 if s.lfs else None,
                      s.blob_id) for s in info.siblings or []]
    return info.sha, files


def download(repo: str, f: RepoFile, *, revision: str, staging: Path, progress: bool) -> Path:
    """Fetch one file into `staging/<name>.part` and return that path. A part left by an earlier
    attempt is continued with a Range request (huggingface_hub's http_get also resumes by itself
    when a transfer breaks off, a few times, before giving up)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    name = PurePosixPath(f.path).name
    part = staging / f"{name}.part"
    staging.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if have > f.size:  # not a prefix of this file: start again
        part.unlink()
        have = 0
    if have == f.size:
        return part
    with no_telemetry(), hub_errors(repo), open(part, "ab") as fh:
        headers = {**build_hf_headers(token=token()), "Accept-Encoding": "identity"}  # sizes are the file's own
        http_get(hf_hub_url(repo, f.path, revision=revision, endpoint=endpoint()), fh, resume_size=have,
                 headers=headers, expected_size=f.size, displayed_filename=name,
                 tqdm_class=None if progress else _silent_bar())
    return part


def _silent_bar():
    from tqdm.auto import tqdm

    class Silent(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent


@contextmanager
def no_telemetry() -> Iterator[None]:
    """huggingface_hub's telemetry switched off while it runs (its own opt-out, which it reads from
    HF_HUB_DISABLE_TELEMETRY at import): no usage headers, no fetch of its agent registry. Kinetic
    sends nothing about its user; a pull asks for the file list and the files, nothing else."""
    from huggingface_hub import constants

    before = constants.HF_HUB_DISABLE_TELEMETRY
    constants.HF_HUB_DISABLE_TELEMETRY = True
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_TELEMETRY = before


@contextmanager
def hub_errors(repo: str) -> Iterator[None]:
    """huggingface_hub's and the network's errors as KineticErrors saying what to do."""
    from huggingface_hub import errors

    where = endpoint()
    try:
        yield
    except errors.GatedRepoError as exc:
        raise KineticError(f"{repo} is gated on {where}: its files need an account that accepted its terms",
                           "Accept the terms on the repository's page, then set HF_TOKEN to a token of that "
                           "account.") from exc
    except errors.RepositoryNotFoundError as exc:
        raise KineticError(f"no repository {repo} on {where}",
                           "Check the name (org/repo); a private repository needs HF_TOKEN set to a token "
                           "that can read it.") from exc
    except (errors.RevisionNotFoundError, errors.EntryNotFoundError) as exc:
        raise KineticError(f"{repo} changed on {where} while it was being read ({type(exc).__name__})",
                           "Repeat the pull.") from exc
    except errors.HfHubHTTPError as exc:
        raise KineticError(f"{where} answered with an error for {repo}: {str(exc).splitlines()[0]}",
                           "Repeat the pull later; HF_ENDPOINT names a mirror if this one is down.") from exc
    except _transport_errors() as exc:
        raise KineticError(f"cannot download from {where}: {type(exc).__name__}: {exc}",
                           "Check the network (and HF_ENDPOINT, if set); repeat the pull to resume where it "
                           "stopped.") from exc


def _transport_errors() -> tuple[type[BaseException], ...]:
    """OSError, and the transport errors of the HTTP client huggingface_hub uses (httpx2 or httpx)."""
    found: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(module).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


# ---- checking and placing files ------------------------------------------------------------------

def matches(path: Path, f: RepoFile) -> bool:
    """Whether the file holds the published bytes: its size, then its SHA-256 (LFS) or git blob id."""
    if path.stat().st_size != f.size:
        return False
    if f.sha256:
        digest = hashlib.sha256()
    elif f.blob_id:
        digest = hashlib.sha1(f"blob {f.size}\0".encode())  # git's object id of the file's bytes
    else:
        raise KineticError(f"the hub publishes no hash for {f.path}; it cannot be checked",
                           "Download the file another way and check it yourself.")
    with open(path, "rb") as src:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest() == (f.sha256 or f.blob_id)


def place(staged: Path, target: Path) -> None:
    """Move a checked file into place, synced, never over a file that is there (a hard link fails
    where one appeared; a rename is used only where hard links are not supported)."""
    with open(staged, "rb") as fh:
        os.fsync(fh.fileno())
    try:
        os.link(staged, target)
    except FileExistsError as exc:
        raise KineticError(f"{target} appeared during the pull; it was not replaced",
                           "Move it away or delete it, then repeat the pull.") from exc
    except OSError:
        if os.path.lexists(target):
            raise KineticError(f"{target} appeared during the pull; it was not replaced",
                               "Move it away or delete it, then repeat the pull.") from None
        os.rename(staged, target)
        return
    staged.unlink()


def discard(staging: Path) -> None:
    """Remove a staging folder and, when it was the last, the .pull folder holding it."""
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.parent.rmdir()
    except OSError:
        pass


# ---- the whole pull -------------------------------------------------------------------------------

def pull_repo(spec: str, *, folder: Path, out: Callable[[str], None], progress: bool,
              memory: Callable[[], tuple[int | None, str]], check_space: Callable[[Path, int], None],
              file: str | None = None) -> Path:
    """Fetch `org/repo[:QUANT]` (or the model holding `file`) into `folder/org/repo/` and return the
    model's (first) file. `memory()` is the figure the automatic choice plans for;
    `check_space(folder, bytes)` refuses a download the disk cannot take."""
    repo, _, quant = spec.partition(":")
    revision, files = repo_files(repo)
    models = candidates(files)
    if not models:
        raise KineticError(f"{repo} holds no GGUF model file",
                           "Kinetic runs GGUF files; choose a repository with .gguf files (often named ...-GGUF).")
    choice, why = choose(models, quant=quant or None, budget=memory, file=file)
    if len(choice.files) < choice.split_count:
        raise KineticError(f"{repo} holds {len(choice.files)} of the {choice.split_count} parts of {choice.stem}",
                           "The repository is incomplete; choose another quantization.")
    name = f"{repo}:{choice.label}"
    out(f"{name}: {_gib(choice.size)}, {why}")
    dest = folder / repo
    todo = _files_to_fetch(repo, choice, dest, out)
    if todo:
        out(f"fetching from {endpoint()}/{repo} at {revision[:12]}: "
            + ", ".join(f"{PurePosixPath(f.path).name} ({f.size / 1024**2:.1f} MiB)" for f, _ in todo))
        check_space(folder, sum(f.size for f, _ in todo))
        _fetch(repo, todo, revision=revision, staging=folder / ".pull" / repo.replace("/", "--"),
               progress=progress)
    first = dest / PurePosixPath(choice.files[0].path).name
    out(f"saved {first}" if todo else f"{name} is already downloaded: {first}")
    if choice.split_count > 1:
        out(f"note: it is split into {choice.split_count} files, which Kinetic does not read yet; join them with "
            f"`llama-gguf-split --merge {first} {dest / (choice.stem + '.gguf')}`")
    out(f"run it with: kinetic run {name if _is_models_folder(folder) else first}")
    return first


def _is_models_folder(folder: Path) -> bool:
    """Whether `folder` is Kinetic's models folder, where names find models (not a --dir elsewhere)."""
    from kinetic.hub import models_dir

    return folder.resolve() == models_dir().resolve()


def _files_to_fetch(repo: str, choice: Candidate, dest: Path, out) -> list[tuple[RepoFile, Path]]:
    """The files of `choice` not yet in place; one that is there must be the published file."""
    todo = []
    for f in choice.files:
        target = dest / PurePosixPath(f.path).name
        if not os.path.lexists(target):
            todo.append((f, target))
        elif not (target.is_file() and matches(target, f)):
            raise KineticError(f"{target} exists but is not {f.path} of {repo}",
                               "Move it away or delete it, then repeat the pull.")
    return todo


def _fetch(repo: str, todo: list[tuple[RepoFile, Path]], *, revision: str, staging: Path, progress: bool) -> None:
    """Download every file, check each, and only then put them all in place; one pull of a
    repository at a time (a second would append to the same part files)."""
    from filelock import FileLock, Timeout

    staging.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(staging / ".lock").acquire(timeout=0):
            _fetch_locked(repo, todo, revision=revision, staging=staging, progress=progress)
    except Timeout:
        raise KineticError(f"another `kinetic pull` of {repo} is running",
                           "Wait for it to finish (or stop it), then repeat the pull.") from None
    discard(staging)


def _fetch_locked(repo: str, todo: list[tuple[RepoFile, Path]], *, revision: str, staging: Path,
                  progress: bool) -> None:
    staged = []
    for f, target in todo:
        part = download(repo, f, revision=revision, staging=staging, progress=progress)
        if not matches(part, f):
            discard(staging)
            raise KineticError(
                f"{f.path} as downloaded from {endpoint()} does not match the SHA-256 the hub publishes for it; "
                "nothing was kept",
                "Repeat the pull; if it fails again, a mirror (HF_ENDPOINT) or a proxy is altering the file.")
        staged.append((part, target))
    for part, target in staged:
        target.parent.mkdir(parents=True, exist_ok=True)
        place(part, target)
