"""Where each tool keeps its GGUF models on disk, and the names Kinetic gives them.

Owns: the folder of each store (from the environment, as each tool reads it) and reading each
store's layout into `Found` records, from file and folder names and Ollama's manifests only (no
model file is opened here):

* Kinetic's folder (KINETIC_MODELS): `file.gguf` is named by its stem (or its known short name),
  `org/repo/file.gguf` (what `kinetic pull org/repo` writes) as `org/repo:QUANT`;
* Ollama (OLLAMA_MODELS, ~/.ollama/models, the Linux service's /usr/share/ollama/.ollama/models):
  `manifests/<host>/<namespace>/<model>/<tag>` is JSON whose layer of media type
  application/vnd.ollama.image.model names the blob `blobs/sha256-<hex>`; named `model:tag`
  (`namespace/model:tag` outside the library, `host/namespace/model:tag` for other hosts);
* LM Studio (the folder ~/.lmstudio-home-pointer names, ~/.lmstudio/models, the older
  ~/.cache/lm-studio/models): `<publisher>/<repo>/*.gguf`, named `publisher/repo:QUANT`;
* the Hugging Face cache (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub), read with
  huggingface_hub's scan_cache_dir: `models--org--repo/snapshots/<rev>/*.gguf` as `org/repo:QUANT`;
* llama.cpp's cache (LLAMA_CACHE, ~/.cache/llama.cpp): the same Hugging Face layout (llama.cpp
  now downloads that way) and the older flat `*.gguf` files, named by their stem.

A repository file whose name states no quantization is named `org/repo:<file stem>`. Split models
(`-00001-of-0000N.gguf`) are one record holding every part present; vision projectors (mmproj) are
not models and are left out. Does not own reading headers or choosing among records (kinetic.stores).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kinetic.stores.names import is_gguf, is_projector, quant_from_name, split_part

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_SERVICE_FOLDER = Path("/usr/share/ollama/.ollama/models")


@dataclass(frozen=True)
class Found:
    """One model as a store keeps it, before its header is read."""

    name: str
    source: str  # "kinetic", "ollama", "lmstudio", "huggingface", "llama.cpp"
    path: Path  # the file to open: the model, or the first part of a split model
    parts: tuple[Path, ...]  # every file of the model present (one unless split)
    split_count: int = 1  # parts the model was split into (parts may hold fewer)
    quant: str | None = None  # what the file name states

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.parts if p.exists())


@dataclass(frozen=True)
class Locations:
    """The folders searched, in the order a name is looked up."""

    kinetic: Path
    ollama: tuple[Path, ...]
    lmstudio: tuple[Path, ...]
    huggingface: Path
    llama_cpp: Path

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Locations:
        from kinetic.hub import models_dir

        env = os.environ if env is None else env
        home = Path(env.get("HOME") or Path.home())
        cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
        return cls(
            kinetic=models_dir(),
            ollama=(Path(env["OLLAMA_MODELS"]),) if env.get("OLLAMA_MODELS") else
            (home / ".ollama" / "models", OLLAMA_SERVICE_FOLDER),
            lmstudio=_lmstudio_folders(home),
            huggingface=_huggingface_cache(env, cache),
            llama_cpp=Path(env["LLAMA_CACHE"]) if env.get("LLAMA_CACHE") else cache / "llama.cpp",
        )


def _lmstudio_folders(home: Path) -> tuple[Path, ...]:
    pointer = home / ".lmstudio-home-pointer"  # LM Studio writes its home folder's path here
    try:
        lm_home = Path(pointer.read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError):
        lm_home = home / ".lmstudio"
    return (lm_home / "models", home / ".cache" / "lm-studio" / "models")


def _huggingface_cache(env: Mapping[str, str], cache: Path) -> Path:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    return cache / "huggingface" / "hub"


def scan_all(where: Locations) -> list[Found]:
    """Every model of every store, stores in lookup order, names unique within a store."""
    found = scan_kinetic(where.kinetic)
    for folder in _distinct(where.ollama):
        found += scan_ollama(folder)
    for folder in _distinct(where.lmstudio):
        found += scan_repo_folders(folder, "lmstudio")
    found += scan_huggingface(where.huggingface, "huggingface")
    found += scan_llama_cpp(where.llama_cpp)
    return found


def _distinct(folders: Iterable[Path]) -> list[Path]:
    seen: list[Path] = []
    for f in folders:
        if f.is_dir() and not any(f.resolve() == s.resolve() for s in seen):
            seen.append(f)
    return seen


# ---- Kinetic's own folder -------------------------------------------------------------------------

def scan_kinetic(folder: Path) -> list[Found]:
    from kinetic.hub import KNOWN_MODELS

    short = {m.filename: m.name for m in KNOWN_MODELS.values()}
    records = [
        Found(short.get(f.path.name, f.name), f.source, f.path, f.parts, f.split_count, f.quant)
        for f in flat_files(_files(folder), "kinetic")
    ]
    return records + scan_repo_folders(folder, "kinetic")


def flat_files(files: list[Path], source: str) -> list[Found]:
    """Files named by their stem (split models by the stem before -0000N-of-0000M)."""
    return [Found(stem, source, parts[0], parts, count, quant_from_name(stem))
            for stem, parts, count in _group_parts(files)]


def scan_repo_folders(folder: Path, source: str) -> list[Found]:
    """`<owner>/<repo>/**.gguf` below folder, named `owner/repo:QUANT` (LM Studio's layout)."""
    found: list[Found] = []
    for owner in _subfolders(folder):
        for repo in _subfolders(owner):
            files = sorted(p for p in repo.rglob("*") if p.is_file() and is_gguf(p.name))
            found += repo_files(f"{owner.name}/{repo.name}", files, source)
    return found


def repo_files(repo: str, files: list[Path], source: str) -> list[Found]:
    """A repository's models named `repo:QUANT` (or `repo:<stem>` when the name states none or
    another file of the repository took that name first)."""
    found: list[Found] = []
    names: set[str] = set()
    for stem, parts, count in _group_parts(files):
        quant = quant_from_name(stem)
        name = f"{repo}:{quant}" if quant else f"{repo}:{stem}"
        if name.lower() in names:
            name = f"{repo}:{stem}"
        names.add(name.lower())
        found.append(Found(name, source, parts[0], parts, count, quant))
    return found


def _group_parts(files: list[Path]) -> list[tuple[str, tuple[Path, ...], int]]:
    """(stem, parts in order, split count) per model among files; projectors left out."""
    groups: dict[str, tuple[list[Path], int]] = {}
    for f in files:
        if not is_gguf(f.name) or is_projector(f.name):
            continue
        part = split_part(f.name)
        if part is None:
            groups[f.name[: -len(".gguf")]] = ([f], 1)
        else:
            key = str(f.parent / part.stem)
            groups.setdefault(key, ([], part.count))[0].append(f)
    return [(Path(stem).name, tuple(sorted(paths)), count) for stem, (paths, count) in groups.items()]


def _files(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_file())
    except OSError:
        return []


def _subfolders(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


# ---- Ollama ---------------------------------------------------------------------------------------

def scan_ollama(folder: Path) -> list[Found]:
    found: list[Found] = []
    manifests = folder / "manifests"
    for manifest in sorted(manifests.glob("*/*/*/*")):
        host, namespace, model, tag = manifest.relative_to(manifests).parts
        blob = _ollama_model_blob(folder, manifest)
        if blob is None:
            continue
        if host == OLLAMA_REGISTRY:
            name = f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
        else:
            name = f"{host}/{namespace}/{model}:{tag}"
        found.append(Found(name, "ollama", blob, (blob,), 1, quant_from_name(tag)))
    return found


def _ollama_model_blob(folder: Path, manifest: Path) -> Path | None:
    """The blob a manifest's model layer names, when the manifest reads and the blob is there."""
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
    except (OSError, ValueError, AttributeError):
        return None
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER:
            digest = str(layer.get("digest", ""))
            blob = folder / "blobs" / digest.replace(":", "-", 1)
            return blob if digest.startswith("sha256:") and blob.is_file() else None
    return None


# ---- the Hugging Face cache and llama.cpp's ---------------------------------------------------------

def scan_huggingface(folder: Path, source: str) -> list[Found]:
    """The GGUF files of each model repository's current snapshot (the one `main` points to, else
    the newest), read with huggingface_hub's own cache scanner."""
    if not folder.is_dir():
        return []
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(folder)
    except (CacheNotFound, OSError):
        return []
    found: list[Found] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
        files = sorted(f.file_path for f in revision.files if is_gguf(f.file_name))
        found += repo_files(repo.repo_id, files, source)
    return found


def scan_llama_cpp(folder: Path) -> list[Found]:
    return scan_huggingface(folder, "llama.cpp") + flat_files(_files(folder), "llama.cpp")
