"""Flywheel on the CUDA emulation (kinetic/codegen/cuda/experts.py): with an emulated GPU whose memory
holds a quarter of a MoE model's experts (KINETIC_GPU_BYTES), the runner caches that many,
runs the rest on the CPU or copies them up as Flywheel decides, gives the CPU's tokens and logits bit
for bit, and its decisions are the ones Flywheel's plain code makes on the same routing."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from kinetic.codegen.common.flywheel import Budget, Costs, Flywheel, Rate, Where
from kinetic.codegen.cuda import emulator, experts
from kinetic.codegen.cuda import model as cuda_model
from kinetic.codegen.cuda.backends import GPU_BYTES
from kinetic.codegen.cuda.renderer import CudaRenderer
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.device_checks import greedy, same_bits
from tests.synthetic import SYNTHETIC, synthetic_path

N_CTX = 64
FILES = ("qwen3moe", "granitemoe-shared")  # 3 layers x 4 experts top-2; 6 experts top-3 and a shared expert


@functools.cache
def _model(name: str):
    gguf = open_gguf(synthetic_path(name))
    prompt = np.load(SYNTHETIC / name / f"{name}.npz")["p0_ids"].tolist()
    return lower(gguf), GGUFWeights(gguf), prompt


def _quarter_budget(graph, weights) -> tuple[int, int, int]:
    """The emulated GPU's bytes that leave Flywheel's cache a quarter of the experts
    (cuda_model.free_bytes_for_experts), that count and the experts' count."""
    n_experts = experts.expert_count(CudaRenderer().lower(graph))
    return cuda_model.free_bytes_for_experts(graph, weights, N_CTX, cached=n_experts // 4), n_experts // 4, n_experts


@functools.cache
def _cpu_run(name: str):
    graph, weights, prompt = _model(name)
    return greedy(Engine(graph, weights, n_ctx=N_CTX, device="cpu", threads=1), prompt, 4)


def _flywheel_engine(name: str, monkeypatch) -> tuple[Engine, int, int]:
    if emulator.unavailable_reason():
        pytest.skip(emulator.unavailable_reason())
    graph, weights, _ = _model(name)
    budget, quarter, n_experts = _quarter_budget(graph, weights)
    monkeypatch.setenv(GPU_BYTES, str(budget))
    engine = Engine(graph, weights, n_ctx=N_CTX, device="cuda-emulated", threads=1)
    offload = engine.runner.experts
    assert offload is not None, "the budget should leave the experts to Flywheel"
    for rate in (offload.flywheel.costs.cpu, offload.flywheel.costs.copy, offload.flywheel.costs.gpu):
        rate.weight = 0.0  # costs fixed at the first guesses, so that the replay below sees the same ones
    return engine, quarter, n_experts


@pytest.mark.parametrize("name", FILES)
def test_a_quarter_of_the_experts_on_the_gpu_gives_the_cpus_tokens(name, monkeypatch, capfd):
    """With room for a quarter of the experts, the cache holds that many, every kind of placement
    happens (resident, run on the CPU, copied up), the status line says so, and the prompt and 4
    greedy tokens give the CPU's tokens and logits bit for bit."""
    engine, quarter, n_experts = _flywheel_engine(name, monkeypatch)
    offload = engine.runner.experts
    assert len(offload.free_slots) == quarter
    assert f"experts: 0 of {n_experts} cached on the GPU" in capfd.readouterr().err
    _, _, prompt = _model(name)
    tokens, logits, _ = greedy(engine, prompt, 4)
    cpu_tokens, cpu_logits, _ = _cpu_run(name)
    assert tokens == cpu_tokens
    assert all(same_bits(a, b) for a, b in zip(logits, cpu_logits, strict=True))
    decisions = {w for event in offload.log if event[0] == "place" for w in event[3].values()}
    assert decisions == {Where.GPU, Where.CPU, Where.COPY}
    assert len(offload.flywheel.cache.resident) <= quarter
    assert offload.status().startswith(f"experts: {len(offload.flywheel.cache.resident)} of {n_experts} cached")


def test_the_runner_makes_flywheels_decisions(monkeypatch):
    """The runner's placements and prefetches, replayed on the same routing through a fresh Flywheel
    with the same budget and costs, are the decisions Flywheel's plain code makes."""
    engine, _, _ = _flywheel_engine("qwen3moe", monkeypatch)
    offload = engine.runner.experts
    _, _, prompt = _model("qwen3moe")
    greedy(engine, prompt, 4)
    fresh = Flywheel(Budget(offload.flywheel.budget.gpu_total, 0, 0), dict(offload.flywheel.expert_bytes),
                     offload.flywheel.n_expert,
                     Costs(**{k: Rate(v) for k, v in experts.INITIAL_COSTS.items()}))
    assert len(offload.log) > 20
    for event in offload.log:
        if event[0] == "place":
            assert fresh.place(event[1], event[2]) == event[3]
        else:
            assert fresh.prefetch(event[1]) == event[2]
    assert fresh.cache.resident == offload.flywheel.cache.resident
    assert set(offload.slot_of) == set(offload.flywheel.cache.resident)


def test_when_every_expert_fits_there_is_no_offload(monkeypatch):
    """Without a memory limit every expert is on the GPU: no expert cache, no host steps."""
    if emulator.unavailable_reason():
        pytest.skip(emulator.unavailable_reason())
    monkeypatch.delenv(GPU_BYTES, raising=False)
    graph, weights, _ = _model("qwen3moe")
    engine = Engine(graph, weights, n_ctx=N_CTX, device="cuda-emulated", threads=1)
    assert engine.runner.experts is None


@pytest.mark.gpu
@pytest.mark.parametrize("quarter", [False, True], ids=["all-experts", "flywheel-quarter"])
@pytest.mark.parametrize("name", ("qwen3moe", "granitemoe"))
def test_a_moe_file_on_the_gpu_gives_the_cpus_tokens(name, quarter, monkeypatch):
    """On a real GPU (scripts/gpu_check.sh), with every expert resident or a quarter of them cached,
    the prompt and 4 greedy tokens give the CPU's tokens and logits bit for bit."""
    from kinetic.codegen.cuda.device import unavailable_reason

    if unavailable_reason():
        pytest.skip(unavailable_reason())
    graph, weights, prompt = _model(name)
    if quarter:
        monkeypatch.setenv(GPU_BYTES, str(_quarter_budget(graph, weights)[0]))
    else:
        monkeypatch.delenv(GPU_BYTES, raising=False)
    engine = Engine(graph, weights, n_ctx=N_CTX, device="cuda", threads=1)
    assert (engine.runner.experts is not None) == quarter
    tokens, logits, _ = greedy(engine, prompt, 4)
    cpu_tokens, cpu_logits, _ = _cpu_run(name)
    assert tokens == cpu_tokens
    assert all(same_bits(a, b) for a, b in zip(logits, cpu_logits, strict=True))
