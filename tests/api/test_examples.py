"""examples/llama_cpp_python/: scripts written for llama-cpp-python run unchanged with `import llama_cpp`
resolving to Kinetic's (the llama-cpp-kinetic distribution's shadow folder first on the path, as its
.pth file puts it), each with its model path as its first argument."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hub_server import Hub, HubFile, HubServer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "llama_cpp_python"
DISTRIBUTION = ROOT / "distributions" / "llama-cpp-kinetic"
SHADOW = DISTRIBUTION / "llama_cpp_kinetic" / "shadow"
BERT = ROOT / "tests" / "data" / "synthetic" / "bert" / "bert.gguf"


def run_example(script: str, *argv: str, env: dict | None = None) -> str:
    environment = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(SHADOW), str(ROOT)])}
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *argv], capture_output=True, text=True,
                          env=environment, timeout=600, cwd=EXAMPLES)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_every_example_has_a_test():
    """Each script in examples/llama_cpp_python is one this file runs."""
    tested = {"completion.py", "streaming_chat.py", "embeddings.py", "tokenize_roundtrip.py", "from_pretrained.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


@pytest.mark.parametrize("script", ["completion.py", "streaming_chat.py", "tokenize_roundtrip.py"])
def test_text_examples_run_unchanged(script, smollm2_path):
    """The text examples run to their end (their own asserts on the response shapes pass) on SmolLM2."""
    assert run_example(script, str(smollm2_path)).strip()


def test_completion_example_is_greedy_and_echoes(smollm2_path):
    """completion.py's temperature-0 answer starts with the echoed prompt, and is the same twice."""
    first = run_example("completion.py", str(smollm2_path))
    assert first.startswith("Q: Name the planets in the solar system. A:")
    assert run_example("completion.py", str(smollm2_path)) == first


def test_embeddings_example_runs_unchanged():
    """embeddings.py runs on an embedding model (the synthetic BERT file)."""
    assert "cosine(a cat, a dog)" in run_example("embeddings.py", str(BERT))


def test_from_pretrained_example_pulls_from_the_hub(smollm2_path, tmp_path):
    """from_pretrained.py fetches the file its glob names from a hub (a local stand-in through
    HF_ENDPOINT) into the models folder and answers with it."""
    repo = "test-org/SmolLM2-135M-Instruct-GGUF"
    hub = Hub(repos={repo: {"SmolLM2-135M-Instruct-Q4_1.gguf": HubFile(path=str(smollm2_path)),
                            "README.md": HubFile(data=b"# SmolLM2\n", lfs=False)}})
    with HubServer(hub) as server:
        env = {"HF_ENDPOINT": server.url, "KINETIC_MODELS": str(tmp_path / "models"),
               "HF_HUB_CACHE": str(tmp_path / "hf"), "HF_TOKEN": ""}
        out = run_example("from_pretrained.py", repo, "*Q4_1.gguf", env=env)
    assert out.strip()
    assert (tmp_path / "models" / repo / "SmolLM2-135M-Instruct-Q4_1.gguf").is_file()


def test_the_pth_file_shadows_an_installed_llama_cpp(tmp_path):
    """With the distribution's folder as a site directory (its .pth file run), `import llama_cpp` is
    Kinetic's even when another llama_cpp package comes earlier on the path."""
    other = tmp_path / "site" / "llama_cpp"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("WHO = 'llama-cpp-python'\n")
    code = ("import sys, site; sys.path.insert(0, sys.argv[1]); site.addsitedir(sys.argv[2]); import llama_cpp; "
            "print(llama_cpp.Llama.__module__)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site"), str(DISTRIBUTION)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.stdout.strip() == "kinetic.llama_cpp", done.stderr
