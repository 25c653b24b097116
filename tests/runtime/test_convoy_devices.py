"""Convoy on the devices that keep the caches in their own memory (Vulkan on lavapipe, CUDA on its host
emulation): several sequences' rows share each pass, each row stored in and attending over its own
cache in the device's pool (kinetic/codegen/common/kv_mirror.py, pass_caches.py), and every answer
is bit for bit what it gets alone on that device (greedy, seeded, drafted; draft trees of several
sequences in one pass: tests/runtime/test_convoy.py, on every device). Each device is skipped,
with the reason, where it cannot run."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kinetic
from kinetic import devices
from kinetic.ir.rows import PassRows
from kinetic.runtime.engine import SeqRows
from kinetic.runtime.generation import GenerationRequest
from kinetic.runtime.sampling import SamplingSettings
from tests.conftest import GGML_OPTIONS
from tests.device_checks import PROMPT, REPEATING, FixedCosts, same_bits
from tests.runtime.convoy_helpers import alone, convoy, shared_passes
from tests.synthetic import SYNTHETIC, synthetic_files

DEVICES = ["vulkan", "cuda-emulated"]
GREEDY = SamplingSettings(temperature=0.0, seed=1)


def _seeded(seed: int) -> SamplingSettings:
    return SamplingSettings(temperature=0.9, top_k=40, seed=seed)


def _skip_unless_runs(device: str) -> None:
    reason = devices.DEVICES[device].unavailable()
    if reason:
        pytest.skip(f"--device {device} cannot run here: {reason}")


@functools.cache
def _model(path, device: str, n_ctx: int) -> kinetic.Model:
    """One model per (file, device), kept for the module's tests (opening a device costs seconds)."""
    model = kinetic.Model(path, n_ctx=n_ctx, device=device)
    model.generator.decoder.costs = FixedCosts()  # drafting decided by acceptance alone, not the clock
    return model


def _gate(model, requests, slots: int, together: int) -> None:
    expected = [alone(model.generator, r) for r in requests]
    got, scheduler = convoy(model.generator, requests, slots=slots, together=together)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g == e, f"request {i}: convoy {g} != alone {e}"
    assert shared_passes(got, scheduler), "no pass held several answers' rows"


# ---- one engine, passes by hand: every row's logits ----------------------------------------------

def _tree(start: int) -> PassRows:
    """A draft tree after `start` entries: a root, two children, a grandchild under the first."""
    return PassRows(tokens=np.array([265, 253, 81, 278], np.int32),
                    positions=np.array([start, start + 1, start + 1, start + 2], np.int32),
                    seqs=np.zeros(4, np.int32), parents=np.array([-1, 0, 0, 1], np.int32),
                    output_rows=np.arange(4, dtype=np.int32))


def _steps() -> list[list]:
    """Per sequence, its passes: ("chain", tokens) commits them, ("tree", keep) verifies _tree and
    keeps that path. Three sequences of different lengths; a tree verifies beside other sequences."""
    return [[("chain", PROMPT), ("chain", [198]), ("tree", [0, 2]), ("chain", [330])],
            [("chain", REPEATING), ("tree", [0, 1, 3]), ("chain", [265]), ("chain", [253])],
            [("chain", REPEATING[:3]), ("chain", [278, 265]), ("chain", [81])]]


def _part(seq, step) -> SeqRows:
    kind, what = step
    if kind == "chain":
        return SeqRows(seq, PassRows.chain(what, seq.cache.length, outputs="all"))
    return SeqRows(seq, _tree(seq.cache.length), commit=False)


def _run_steps(engine, together: bool) -> list[list[np.ndarray]]:
    """Every sequence's steps, all sequences' i-th steps in one pass (together) or each in a pass
    of its own; the logits of every pass of every sequence."""
    plans = _steps()
    seqs = [engine.new_sequence() for _ in plans]
    logits: list[list[np.ndarray]] = [[] for _ in plans]
    for i in range(max(len(p) for p in plans)):
        parts = [(s, _part(seqs[s], p[i]), p[i]) for s, p in enumerate(plans) if i < len(p)]
        groups = [parts] if together else [[p] for p in parts]
        for group in groups:
            engine.run([part for _, part, _ in group])
        for s, part, (kind, what) in parts:
            logits[s].append(part.logits.copy())
            if kind == "tree":
                engine.keep(seqs[s], what)
    return logits


@pytest.mark.parametrize("device", DEVICES)
def test_shared_passes_give_every_row_its_logits_alone(device, smollm2_path):
    """SmolLM2, three sequences of different lengths whose prompt chunks, decode steps and draft
    trees share passes: every row's logits are the bits it gets in passes of its own sequence."""
    _skip_unless_runs(device)
    engine = _model(smollm2_path, device, 64).engine
    assert engine.max_sequences is None
    shared, own = _run_steps(engine, together=True), _run_steps(engine, together=False)
    for s, (got, want) in enumerate(zip(shared, own, strict=True)):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert same_bits(g, w), f"sequence {s}, pass {i}"


# ---- through the scheduler: whole answers ----------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_smollm2_convoy_equals_alone_on_device(device, smollm2_path):
    """SmolLM2: three requests (greedy, seeded, drafted on a repeating prompt) of different lengths
    into 3 slots, two at once and one while they decode: each answer is its answer alone on the
    device, and passes were shared."""
    _skip_unless_runs(device)
    model = _model(smollm2_path, device, 256)

    def ids(text):
        return tuple(model.tokenize(text))

    requests = [GenerationRequest(ids("The capital of France is"), GREEDY, max_tokens=6, draft=False),
                GenerationRequest(ids("Once upon a time"), _seeded(7), max_tokens=5),
                GenerationRequest(ids("Count: one, two, three, one, two, three, one, two,"), GREEDY, max_tokens=8,
                                  draft=True)]
    _gate(model, requests, slots=3, together=2)


@pytest.mark.parametrize("device", DEVICES)
def test_gemma3_convoy_equals_alone_on_device(device, gemma_path):
    """Gemma 3 (sliding-window layers): a greedy and a seeded request of different lengths, the second
    arriving while the first decodes, each give their answer alone on the device."""
    _skip_unless_runs(device)
    model = _model(gemma_path, device, 256)
    requests = [GenerationRequest(tuple(model.tokenize("Name three colors:")), GREEDY, max_tokens=6),
                GenerationRequest(tuple(model.tokenize("Hi")), _seeded(22), max_tokens=4)]
    _gate(model, requests, slots=2, together=1)


def _device_files() -> list:
    return [pytest.param(name, device, id=f"{name}-{device}") for name in synthetic_files() for device in DEVICES]


@pytest.mark.parametrize("name,device", _device_files())
def test_synthetic_convoy_equals_alone_on_device(name, device):
    """On every synthetic file the device runs, two requests of token ids (greedy and seeded) sharing
    passes each give their answer alone on that device."""
    _skip_unless_runs(device)
    path = SYNTHETIC / name / f"{name}.gguf"
    # the graph the devices run: ggml's orders (CUDA and Vulkan follow no other), whatever the default
    model = kinetic.Model(path, n_ctx=64, device="reference", options=GGML_OPTIONS)
    reason = devices.DEVICES[device].unsupported(model.engine.graph)
    if reason:
        pytest.skip(f"--device {device} cannot run {name}: {reason}")
    model = kinetic.Model(path, n_ctx=64, device=device)
    rng = np.random.default_rng(0)
    n_vocab = model.engine.n_vocab
    prompts = [tuple(int(t) for t in rng.integers(1, min(n_vocab, 200), size=n)) for n in (5, 11)]
    requests = [GenerationRequest(prompts[0], GREEDY, max_tokens=6, ignore_eos=True),
                GenerationRequest(prompts[1], _seeded(9), max_tokens=4, ignore_eos=True)]
    _gate(model, requests, slots=2, together=2)
