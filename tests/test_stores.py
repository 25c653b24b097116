"""`kinetic models` and model names: the real models laid out in temporary folders as Kinetic,
Ollama, LM Studio, the Hugging Face cache and llama.cpp's cache store them (symlinks to the real
files, Ollama's manifests and Hugging Face's refs as those tools write them), found, listed, and
resolved by the names each tool uses.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kinetic import hub, stores
from kinetic.cli.main import main
from kinetic.errors import KineticError

COMMIT = "3f1c2a9b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a"
SMOL_SHA = hub.KNOWN_MODELS["smollm2-135m"].sha256
GEMMA_SHA = hub.KNOWN_MODELS["gemma3-270m"].sha256


def link(target: Path, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


def ollama_blob(root: Path, data: bytes) -> dict:
    """A small blob (config, template, params) written as Ollama writes blobs; its layer entry."""
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def ollama_model(root: Path, name: str, model_file: Path, sha: str) -> Path:
    """`<host>/<namespace>/<model>/<tag>` (library models: registry.ollama.ai/library/...) -> the model blob."""
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    blob = root / "blobs" / f"sha256-{sha}"
    if not blob.exists():
        link(model_file, blob)
    config = ollama_blob(root, json.dumps({"model_format": "gguf", "file_type": "Q4_1"}).encode())
    template = ollama_blob(root, b"{{ .Prompt }}")
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{sha}",
                    "size": model_file.stat().st_size},
                   {"mediaType": "application/vnd.ollama.image.template", **template}],
    }
    path = root / "manifests" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob


def hf_cache_repo(root: Path, repo: str, files: dict[str, Path]) -> dict[str, Path]:
    """models--org--repo/{blobs,refs/main,snapshots/<commit>/<file> -> ../../blobs/<hash>}."""
    folder = root / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    paths = {}
    for name, model_file in files.items():
        digest = hashlib.sha256(name.encode()).hexdigest()  # stands in for the file's hash
        link(model_file, folder / "blobs" / digest)
        snap = folder / "snapshots" / COMMIT / name
        snap.parent.mkdir(parents=True, exist_ok=True)
        snap.symlink_to(Path("../..") / "blobs" / digest)
        paths[name] = snap
    return paths


@pytest.fixture
def layout(tmp_path, monkeypatch, smollm2_path, gemma_path) -> dict[str, Path]:
    """Every store under tmp_path, the environment pointing at them; the expected file of each name."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    monkeypatch.setenv("XDG_CACHE_HOME", cache)  # compiled kernels stay where they are
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for var, sub in (("KINETIC_MODELS", "kinetic"), ("OLLAMA_MODELS", "ollama"), ("HF_HUB_CACHE", "hf"),
                     ("LLAMA_CACHE", "llama.cpp")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.delenv("HF_HOME", raising=False)
    expected = {
        "smollm2-135m": link(smollm2_path, tmp_path / "kinetic" / smollm2_path.name),
        "split-Q8_0": tmp_path / "kinetic" / "split-Q8_0-00001-of-00002.gguf",
    }
    for part in (1, 2):
        (tmp_path / "kinetic" / f"split-Q8_0-0000{part}-of-00002.gguf").write_bytes(b"GGUF")
    ollama = tmp_path / "ollama"
    expected["smollm2:135m"] = ollama_model(ollama, "registry.ollama.ai/library/smollm2/135m", smollm2_path, SMOL_SHA)
    expected["gemma3:270m"] = ollama_model(ollama, "registry.ollama.ai/library/gemma3/270m", gemma_path, GEMMA_SHA)
    ollama_model(ollama, "registry.ollama.ai/library/gemma3/latest", gemma_path, GEMMA_SHA)
    expected["someone/tiny:v1"] = ollama_model(ollama, "registry.ollama.ai/someone/tiny/v1", smollm2_path, SMOL_SHA)
    lms = home / ".lmstudio" / "models" / "lmstudio-community" / "SmolLM2-135M-Instruct-GGUF"
    lms_file = lms / "SmolLM2-135M-Instruct-Q4_1.gguf"
    expected["lmstudio-community/SmolLM2-135M-Instruct-GGUF:Q4_1"] = link(smollm2_path, lms_file)
    (lms / "mmproj-SmolLM2-f16.gguf").write_bytes(b"GGUF")  # a projector: not a model
    hf = hf_cache_repo(tmp_path / "hf", "unsloth/gemma-3-270m-it-GGUF",
                       {"gemma-3-270m-it-Q4_K_M.gguf": gemma_path, "gemma-3-270m-it-Q8_0.gguf": gemma_path})
    expected["unsloth/gemma-3-270m-it-GGUF:Q4_K_M"] = hf["gemma-3-270m-it-Q4_K_M.gguf"]
    expected["unsloth/gemma-3-270m-it-GGUF:Q8_0"] = hf["gemma-3-270m-it-Q8_0.gguf"]
    llama = tmp_path / "llama.cpp"
    old_style = "ggml-org_SmolLM2-GGUF_SmolLM2-135M-Q4_1"  # llama.cpp's flat names before its HF-cache layout
    expected[old_style] = link(smollm2_path, llama / f"{old_style}.gguf")
    expected["ggml-org/gemma-3-270m-GGUF:Q4_K_M"] = hf_cache_repo(
        llama, "ggml-org/gemma-3-270m-GGUF", {"gemma-3-270m-Q4_K_M.gguf": gemma_path})["gemma-3-270m-Q4_K_M.gguf"]
    return expected


def test_models_lists_every_store(layout, capsys):
    """`kinetic models --json` lists each model of each store once, under the name its tool uses."""
    assert main(["models", "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    assert set(listed) == set(layout) | {"gemma3:latest"}
    sources = {name: m["source"] for name, m in listed.items()}
    assert sources["smollm2:135m"] == "ollama" and sources["smollm2-135m"] == "kinetic"
    assert sources["lmstudio-community/SmolLM2-135M-Instruct-GGUF:Q4_1"] == "lmstudio"
    assert sources["unsloth/gemma-3-270m-it-GGUF:Q8_0"] == "huggingface"
    assert sources["ggml-org/gemma-3-270m-GGUF:Q4_K_M"] == "llama.cpp"
    assert sources["ggml-org_SmolLM2-GGUF_SmolLM2-135M-Q4_1"] == "llama.cpp"


def test_models_reads_family_quantization_and_support_from_the_header(layout, capsys):
    """Each real model shows its architecture, its header's quantization, its size and that it runs;
    a split model shows that it does not run yet."""
    main(["models", "--json"])
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    smol, gemma = listed["smollm2:135m"], listed["unsloth/gemma-3-270m-it-GGUF:Q8_0"]
    assert (smol["arch"], smol["quant"], smol["runs"], smol["size"]) == ("llama", "Q4_1", True, 98_362_432)
    assert (gemma["arch"], gemma["quant"], gemma["runs"]) == ("gemma3", "Q4_K_M", True)  # the header, not the name
    split = listed["split-Q8_0"]
    assert not split["runs"] and "split into 2 files" in split["why_not"] and len(split["parts"]) == 2


def test_models_table(layout, capsys):
    """The table has one row per model and a count of those Kinetic runs."""
    main(["models"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["NAME", "SIZE", "QUANT"] and len(out) == len(layout) + 3
    assert out[-1] == f"{len(layout) + 1} found, {len(layout)} that Kinetic runs"


@pytest.mark.parametrize("name", [
    "smollm2:135m", "gemma3:270m", "someone/tiny:v1", "smollm2-135m",
    "lmstudio-community/SmolLM2-135M-Instruct-GGUF:Q4_1", "unsloth/gemma-3-270m-it-GGUF:Q8_0",
    "ggml-org/gemma-3-270m-GGUF:Q4_K_M", "ggml-org_SmolLM2-GGUF_SmolLM2-135M-Q4_1",
])
def test_each_name_resolves_to_its_file(layout, name):
    """The one resolver every command uses gives each store's own file for the name its tool uses."""
    assert hub.resolve_model(name) == layout[name]


def test_name_rules(layout):
    """Case does not matter; a bare Ollama name takes :latest (or its only tag); a repository with one
    model needs no quantization; a file name works."""
    assert hub.resolve_model("GEMMA3") == layout["gemma3:270m"].parent / f"sha256-{GEMMA_SHA}"
    assert hub.resolve_model("smollm2") == layout["smollm2:135m"]
    assert hub.resolve_model("unsloth/gemma-3-270m-it-gguf:q4_k_m") == layout["unsloth/gemma-3-270m-it-GGUF:Q4_K_M"]
    assert hub.resolve_model("lmstudio-community/SmolLM2-135M-Instruct-GGUF") == \
        layout["lmstudio-community/SmolLM2-135M-Instruct-GGUF:Q4_1"]
    assert hub.resolve_model("SmolLM2-135M-Instruct-Q4_1.gguf") == \
        layout["lmstudio-community/SmolLM2-135M-Instruct-GGUF:Q4_1"]


def test_a_repository_with_several_models_needs_a_quantization(layout):
    """org/repo holding two models is refused, naming both."""
    with pytest.raises(KineticError, match="holds 2 models") as err:
        hub.resolve_model("unsloth/gemma-3-270m-it-GGUF")
    assert "unsloth/gemma-3-270m-it-GGUF:Q8_0" in err.value.message


def test_a_name_that_matches_nothing_lists_the_closest(layout):
    """A misspelt name is refused with the closest names found."""
    with pytest.raises(KineticError, match="no model file or known model named gema3:270m") as err:
        hub.resolve_model("gema3:270m")
    assert "gemma3:270m" in err.value.hint


def test_ollama_manifest_without_its_blob_is_skipped(layout, tmp_path):
    """A manifest whose model blob is missing (an unfinished `ollama pull`) lists nothing."""
    manifest = tmp_path / "ollama" / "manifests" / "registry.ollama.ai" / "library" / "broken" / "1b"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                                "digest": "sha256:" + "0" * 64}]}))
    assert stores.find("broken:1b") is None


def test_run_by_an_ollama_name(layout):
    """`kinetic run smollm2:135m` runs Ollama's file and answers (two tokens)."""
    proc = subprocess.run([sys.executable, "-m", "kinetic.cli.main", "run", "smollm2:135m", "Hi", "-n", "2",
                           "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and "2 tokens" in proc.stderr
