"""Defaults that just work: the device (auto, quietly), -ngl on a machine without a GPU (the CPU, with
one line), and the context (the model's own, at most 32768 and what memory holds, in the status line)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from kinetic.cli import runtime_options
from kinetic.cli.runtime_options import CONTEXT_CAP, choose_context, choose_device
from kinetic.devices import resolve_device


def kinetic(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kinetic.cli.main", *args], capture_output=True, text=True,
                          timeout=120)


def no_gpu_here() -> bool:
    return resolve_device("auto", lambda line: None) == "cpu"


def options(**given) -> argparse.Namespace:
    return argparse.Namespace(**({"device": None, "gpu_layers": None, "ctx_size": None} | given))


def test_ngl_without_a_gpu_runs_on_the_cpu_saying_so_in_one_line(smollm2_path):
    """-ngl 99 where no GPU is usable runs on the CPU, with one line saying so (and why), and the
    status line names the CPU and the context chosen (the model's own 8192)."""
    if not no_gpu_here():
        pytest.skip("a GPU is usable here")
    proc = kinetic("run", str(smollm2_path), "hi", "-n", "1", "--temp", "0", "-ngl", "99")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert [line for line in lines if "-ngl" in line] == [lines[0]], proc.stderr
    assert lines[0].startswith("kinetic: -ngl 99 asks for a GPU and none is usable here (CUDA: ")
    assert lines[0].endswith("running on the CPU")
    assert lines[-1].endswith("on the CPU; context 8192 (the model's)]")
    assert not [line for line in lines if line.startswith("auto: ")]


def test_device_defaults_to_auto_quietly():
    """No --device means auto, without auto's lines; --device auto given says what it skipped."""
    said: list[str] = []
    assert choose_device(options(), said.append) == resolve_device("auto", lambda line: None)
    assert said == []
    explicit: list[str] = []
    choose_device(options(device="auto"), explicit.append)
    if no_gpu_here():
        assert explicit and all(line.startswith("auto: skipping ") for line in explicit)
    assert choose_device(options(gpu_layers=0), said.append) == "cpu" and said == []


def test_context_is_the_models_own_up_to_the_cap(smollm2_path, gemma_path):
    """Without -c: the model's training context (SmolLM2 8192, Gemma 3 32768); -c 0 the same; -c N N."""
    assert choose_context(options(), smollm2_path) == runtime_options.ContextChoice(8192, "the model's")
    assert choose_context(options(), gemma_path).tokens == 32768
    assert choose_context(options(ctx_size=0), smollm2_path).tokens == 8192
    assert choose_context(options(ctx_size=2048), smollm2_path) == runtime_options.ContextChoice(2048, "-c")


def test_context_is_capped_at_32768_and_by_memory(monkeypatch, smollm2_path):
    """A model trained on 131072 gets 32768 (all of it with -c 0); when half the free memory holds
    less, the largest multiple of 1024 that fits, and never under 4096."""
    monkeypatch.setattr(runtime_options, "_context_facts", lambda path: (131072, 1000))
    monkeypatch.setattr("kinetic.runtime.kv_cache.available_memory", lambda: 1 << 40)
    assert choose_context(options(), smollm2_path) == runtime_options.ContextChoice(CONTEXT_CAP, "capped at 32768")
    assert choose_context(options(ctx_size=0), smollm2_path).tokens == 131072
    monkeypatch.setattr("kinetic.runtime.kv_cache.available_memory", lambda: 2 * 1000 * 10_000)
    assert choose_context(options(), smollm2_path) == runtime_options.ContextChoice(9216, "to fit memory")
    monkeypatch.setattr("kinetic.runtime.kv_cache.available_memory", lambda: 2 * 1000 * 1000)
    assert choose_context(options(), smollm2_path).tokens == 4096


def test_negative_context_is_refused(smollm2_path):
    """-c -1 is refused with what to give instead."""
    from kinetic.errors import KineticError

    with pytest.raises(KineticError, match="-c must be 0 or more"):
        choose_context(options(ctx_size=-1), smollm2_path)


def test_kv_size_reads_per_layer_kv_head_counts():
    """A header whose head_count_kv is one value per layer (gemma4: a numpy array) sizes the cache by
    their sum instead of failing."""
    from tests.synthetic import SYNTHETIC

    trained, per_token = runtime_options._context_facts(SYNTHETIC / "gemma4" / "gemma4.gguf")
    assert (trained, per_token) == (4096, (2 + 2 + 2 + 1) * (128 + 128) * 2)
