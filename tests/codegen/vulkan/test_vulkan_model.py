"""The whole SmolLM2 model on the Vulkan device (lavapipe in CI) against the reference interpreter:
every op of the graph in one command buffer per pass, the KV cache stored by the device.

Each kernel is bit for bit the reference on lavapipe (test_vulkan_kernels, _matvec, _attention), so
the whole pass must be too: logits are compared bit for bit, not by their argmax. Kept to a few
tokens: lavapipe runs a SmolLM2 decode step in about 0.6 s on 2 CPUs."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.interpreter import PassRows
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights

PROMPT = [504, 3575, 282, 4649, 314, 7042]  # "The capital of France is Paris"
LAVAPIPE_ICDS = "/usr/share/vulkan/icd.d/lvp_icd.*.json"


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    gguf = open_gguf(smollm2_path)
    return lower(gguf), GGUFWeights(gguf)


@pytest.fixture(scope="module")
def reference(smollm2):
    graph, weights = smollm2
    return Engine(graph, weights, n_ctx=64, device="reference")


@pytest.fixture
def vulkan_engine(smollm2, device):
    """An engine whose executor is a VulkanModel on the session's validated device (the engine's
    own `--device vulkan` opens a device without the validation layer)."""
    from kinetic.codegen.vulkan.model import VulkanModel

    graph, weights = smollm2
    engine = Engine(graph, weights, n_ctx=64, device="reference")
    model = VulkanModel(graph, weights, device)
    engine.interpreter = model  # same contract as the interpreter: run(graph, rows, kv) -> PassResult
    yield engine
    model.close()


def _greedy(engine: Engine, n: int) -> tuple[list[int], list[np.ndarray]]:
    seq = engine.new_sequence()
    logits = engine.prefill(seq, PROMPT)
    tokens, seen = [], [logits]
    for _ in range(n):
        tokens.append(int(np.argmax(logits)))
        logits = engine.decode(seq, tokens[-1])
        seen.append(logits)
    return tokens, seen


def test_greedy_tokens_and_logits_equal_the_reference(vulkan_engine, reference):
    """Prompt then 4 greedy tokens: the same tokens and bit-identical logits at every step, with the
    validation layer (synchronization validation on) reporting nothing."""
    got_tokens, got_logits = _greedy(vulkan_engine, 4)
    ref_tokens, ref_logits = _greedy(reference, 4)
    assert got_tokens == ref_tokens
    for got, ref in zip(got_logits, ref_logits, strict=True):
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_a_row_in_a_pass_equals_the_row_alone(vulkan_engine):
    """Batch invariance on the device: the prompt in one pass gives each row the logits it gets
    one token at a time, and the cache holds the same bits either way."""
    whole = vulkan_engine.new_sequence()
    batched = vulkan_engine.forward(PassRows.chain(PROMPT[:4], 0, outputs="all"), {0: whole})
    alone = vulkan_engine.new_sequence()
    singles = np.stack([vulkan_engine.decode(alone, t) for t in PROMPT[:4]])
    assert np.array_equal(batched.view(np.uint32), singles.view(np.uint32))
    for layer in (0, 29):
        assert np.array_equal(whole.cache.k[layer][:4].view(np.uint16), alone.cache.k[layer][:4].view(np.uint16))


def test_engine_device_vulkan_runs_the_model(smollm2, reference, monkeypatch, capsys):
    """`Engine(device="vulkan")` (what --device vulkan and Model(device="vulkan") build) runs the model
    on the first Vulkan device: on lavapipe it says so in one line on stderr, and the greedy tokens
    are the reference's."""
    from kinetic.codegen.vulkan.device import VulkanUnavailable, load_vulkan

    try:
        load_vulkan()
    except VulkanUnavailable as e:
        pytest.skip(f"no Vulkan: {e}")
    icds = sorted(glob.glob(LAVAPIPE_ICDS))
    if icds and "VK_ICD_FILENAMES" not in os.environ:
        monkeypatch.setenv("VK_ICD_FILENAMES", ":".join(icds))
    monkeypatch.setenv("MESA_SHADER_CACHE_DISABLE", "true")
    graph, weights = smollm2
    engine = Engine(graph, weights, n_ctx=64, device="vulkan")
    try:
        err = capsys.readouterr().err
        if engine.interpreter.device.caps.is_cpu:
            assert len(err.strip().splitlines()) == 1 and "CPU implementation of Vulkan" in err
        seq, ref_seq = engine.new_sequence(), reference.new_sequence()
        got = list(engine.greedy(seq, PROMPT, 2))
        assert got == list(reference.greedy(ref_seq, PROMPT, 2))
    finally:
        engine.interpreter.close_device()


def test_unsupported_ops_are_refused_with_the_reason(smollm2):
    """A graph with an op that has no Vulkan kernel is refused naming the op, before any device work."""
    from dataclasses import replace

    from kinetic.codegen.vulkan.model import unsupported
    from kinetic.ir.ops import Op

    graph, _ = smollm2
    assert unsupported(graph) is None
    attention = next(n for n in graph.nodes if n.op is Op.ATTENTION)
    capped = replace(graph, nodes=[replace(n, attrs=replace(n.attrs, softcap=30.0)) if n is attention else n
                                   for n in graph.nodes])
    assert "soft-capping" in unsupported(capped)


@pytest.mark.slow  # the reference interpreter takes about 11 s for Gemma 3's prompt on 2 CPUs
def test_gemma3_with_split_weights_equals_the_reference(gemma_path, device):
    """Gemma 3 (sliding-window layers, per-head norms, GELU, Q4_K/Q6_K/Q5_0 weights and a 178 MB Q8_0
    embedding table split across bindings on lavapipe's 128 MiB limit): the prompt's logits and 2
    greedy tokens' logits are the reference interpreter's bits."""
    from kinetic.codegen.vulkan.model import VulkanModel

    gguf = open_gguf(gemma_path)
    graph, weights = lower(gguf), GGUFWeights(gguf)
    reference = Engine(graph, weights, n_ctx=64, device="reference")
    engine = Engine(graph, weights, n_ctx=64, device="reference")
    engine.interpreter = model = VulkanModel(graph, weights, device)
    try:
        prompt = [2, 818, 5279, 529, 7001, 563]  # "<bos>The capital of France is"
        seq, ref_seq = engine.new_sequence(), reference.new_sequence()
        got, ref = engine.prefill(seq, prompt), reference.prefill(ref_seq, prompt)
        for _ in range(2):
            assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
            token = int(np.argmax(ref))
            got, ref = engine.decode(seq, token), reference.decode(ref_seq, token)
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    finally:
        model.close()
