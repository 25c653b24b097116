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
from kinetic.ir.rows import PassRows
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.device_checks import (
    PROMPT,
    check_drafted_equals_plain,
    check_greedy_equals,
    check_refuses_soft_capping,
    check_row_in_a_pass_equals_row_alone,
    check_tree_rows_equal_paths,
)

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
    """An engine whose runner is a VulkanModel on the session's validated device (the engine's
    own `--device vulkan` opens a device without the validation layer)."""
    from kinetic.codegen.vulkan.model import VulkanModel

    graph, weights = smollm2
    engine = Engine(graph, weights, n_ctx=64, device="reference")
    model = VulkanModel(graph, weights, device)
    engine.runner = model  # same contract as the interpreter: run(graph, rows, kv) -> PassResult
    yield engine
    model.close()


def test_greedy_tokens_and_logits_equal_the_reference(vulkan_engine, reference):
    """Prompt then 4 greedy tokens: the same tokens and bit-identical logits at every step, with the
    validation layer (synchronization validation on) reporting nothing."""
    check_greedy_equals(vulkan_engine, reference, 4)


def test_a_row_in_a_pass_equals_the_row_alone(vulkan_engine):
    """Batch invariance on the device: each row of a pass gets the logits it gets one token at a
    time, and the cache holds the same bits either way."""
    check_row_in_a_pass_equals_row_alone(vulkan_engine)


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
        if engine.runner.device.caps.is_cpu:
            assert len(err.strip().splitlines()) == 1 and "CPU implementation of Vulkan" in err
        seq, ref_seq = engine.new_sequence(), reference.new_sequence()
        got = list(engine.greedy(seq, PROMPT, 2))
        assert got == list(reference.greedy(ref_seq, PROMPT, 2))
    finally:
        engine.runner.close_device()


def test_unsupported_ops_are_refused_with_the_reason(smollm2):
    """A graph with an op that has no Vulkan kernel is refused naming the op, before any device work."""
    from kinetic.codegen.vulkan.model import unsupported

    check_refuses_soft_capping(unsupported, smollm2[0])


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
    engine.runner = model = VulkanModel(graph, weights, device)
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



def test_drafted_equals_plain_on_the_device(vulkan_engine):
    """The identity gate on Vulkan: drafted greedy decoding (verify passes of draft rows with parents,
    keep() committing the runner's new cache rows) gives plain greedy's tokens with guesses kept, and
    leaves the cache bit for bit as plain decoding does."""
    check_drafted_equals_plain(vulkan_engine)


def test_a_draft_tree_row_equals_its_path_decoded_plainly(vulkan_engine):
    """A verify pass of a tree with branches: each row's logits are the bits its path gets decoded
    one token at a time; the device's copy of the cache follows the host's move of a kept row."""
    check_tree_rows_equal_paths(vulkan_engine)


def test_greedy_agrees_with_llama_cpp_golden(vulkan_engine):
    """The golden greedy check (tests/runtime/test_conformance.py) on the device, for one SmolLM2
    prompt and its first 8 tokens: teacher-forced in one pass (each row is what it gets alone, above),
    the argmax at each row agrees with llama.cpp's greedy tokens up to near-ties."""
    from kinetic.runtime.conformance import compare
    from tests.conftest import load_golden

    case = load_golden("smollm2-135m")["raw"][1]  # def fibonacci(n): ...
    prompt, reference = case["prompt_ids"], case["ids"][:8]
    rows = PassRows.chain(prompt + reference[:-1], 0, outputs="all")
    rows.output_rows = np.arange(len(prompt) - 1, len(prompt) + len(reference) - 1, dtype=np.int32)
    logits = vulkan_engine.forward(rows, {0: vulkan_engine.new_sequence()}, commit=False)
    result = compare([int(t) for t in logits.argmax(axis=1)], reference, case["top2"])
    assert result.ok, f"{result.agreed}/{result.total} agree, diverges at step {result.diverged_at} (gap {result.gap})"


def test_the_device_cache_lives_as_long_as_its_sequence(vulkan_engine):
    """Each sequence's cache is kept on the device between passes (uploaded once, then only the new
    rows are written there, by the device: a decode step copies nothing up) and freed with the
    sequence; a rollback needs no upload."""
    import gc

    engine = vulkan_engine
    model = engine.runner
    seq = engine.new_sequence()
    first = engine.prefill(seq, PROMPT[:3])
    assert list(model.kv_mirrors.by_cache) == [id(seq.cache)]
    mirror, uploads = model.kv_mirrors.by_cache[id(seq.cache)], []
    plain_upload = mirror.upload
    mirror.upload = lambda cache, start, end: uploads.append((start, end)) or plain_upload(cache, start, end)
    engine.decode(seq, PROMPT[3])
    engine.decode(seq, PROMPT[4])
    assert uploads == []  # the device wrote those rows itself: nothing goes up
    engine.rollback(seq, 0)
    again = engine.prefill(seq, PROMPT[:3])
    assert np.array_equal(first.view(np.uint32), again.view(np.uint32))
    del seq
    gc.collect()
    other = engine.new_sequence()
    engine.decode(other, PROMPT[0])
    assert list(model.kv_mirrors.by_cache) == [id(other.cache)]


def test_shared_buffers_keep_the_barriers_of_a_buffer_per_value(vulkan_engine):
    """The pass's activation values share buffers by one liveness plan (common/buffers.py, live ranges
    in barrier epochs): the bound command buffer has exactly the barriers it has with a buffer per
    value, and the device holds a fraction of a buffer per value."""
    from kinetic.codegen.vulkan.device import barrier_points

    engine, model = vulkan_engine, vulkan_engine.runner
    seen = []
    plain_bind = model._bind

    def bind(recorder, shape):
        stand_ins, values = barrier_points(recorder.dispatches), recorder.values()
        plain_bind(recorder, shape)
        seen.append((stand_ins, barrier_points(recorder.dispatches), values))

    model._bind = bind
    seq = engine.new_sequence()
    engine.prefill(seq, PROMPT[:5])
    engine.decode(seq, PROMPT[5])
    assert len(seen) == 2
    for stand_ins, bound, _ in seen:
        assert bound == stand_ins
    one_per_value = sum(v.nbytes for v in seen[0][2])
    assert model.activation_bytes() * 4 < one_per_value
