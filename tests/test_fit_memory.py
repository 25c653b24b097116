"""`kinetic fit`: the memory estimate (kinetic/fit.py) on the real models, with made-up memory figures
(the --memory and --gpu-memory flags, and plain arguments), checked against the formula and against
what the engine actually allocates for its KV cache.
"""

from __future__ import annotations

import json

import pytest

from kinetic import fit
from kinetic.cli.main import main
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.ops import Op

MiB = 1024**2


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def model(request, smollm2_path, gemma_path):
    path = smollm2_path if request.param == "smollm2" else gemma_path
    return path, fit.read_shape(path)


def test_kv_per_token_is_what_the_engine_allocates(model):
    """The header's KV bytes per token equal the engine's cache rows: every STATE node's n_kv_head *
    head_dim, for keys and for values, in f16."""
    path, shape = model
    graph = lower(open_gguf(path))
    widths = [n.attrs.n_kv_head * n.attrs.head_dim for n in graph.nodes if n.op is Op.STATE]
    assert len(widths) == shape.n_layer
    assert shape.kv_per_token == sum(widths) * 2 * 2


def test_weights_are_the_tensor_bytes(model):
    """weights is every tensor's bytes, and the blocks' share is counted once per layer."""
    path, shape = model
    tensors = open_gguf(path).tensors.values()
    assert shape.weights == sum(t.nbytes for t in tensors)
    assert sum(shape.layer_weights) == sum(t.nbytes for t in tensors if t.name.startswith("blk."))
    assert all(w > 0 for w in shape.layer_weights)


@pytest.mark.parametrize("tokens", [256, 1000, 5000])
def test_max_context_follows_the_formula(model, tokens):
    """With memory = weights + working + tokens * kv_per_token, the largest context is tokens rounded
    down to 256 (capped at the training context)."""
    _, shape = model
    memory = shape.weights + shape.working + tokens * shape.kv_per_token
    assert fit.max_context(shape, memory) == min(tokens // 256 * 256, shape.context_length)
    assert fit.max_context(shape, memory - 1) == min((tokens - 1) // 256 * 256, shape.context_length)


def test_plenty_of_memory_gives_the_training_context(model):
    """With far more memory than needed the context is the model's own."""
    _, shape = model
    assert fit.max_context(shape, 1 << 50) == shape.context_length


def test_too_little_memory_does_not_fit(model):
    """Memory below the weights and working buffers: no context, and the plan says it does not fit."""
    _, shape = model
    plan = fit.plan(shape, memory=shape.weights, gpu_memory=None)
    assert plan.max_context == 0 and plan.runs_on == "does not fit"


def test_gpu_layers_count_the_layers_that_fit(model):
    """A GPU that holds the non-layer weights, the working buffers and exactly k layers (weights + KV at
    the context planned) gets k layers; one byte less gets k - 1; a large one gets them all."""
    _, shape = model
    context = 2048
    kv_layer = shape.kv_per_token // shape.n_layer * context
    k = 3
    last = shape.layer_weights[-k:]
    exact = shape.other_weights + shape.working + sum(w + kv_layer for w in last)
    assert fit.gpu_layers(shape, exact, context) == k
    assert fit.gpu_layers(shape, exact - 1, context) == k - 1
    assert fit.gpu_layers(shape, 1 << 50, context) == shape.n_layer
    whole = fit.plan(shape, memory=1 << 40, gpu_memory=1 << 50)
    assert whole.runs_on == "GPU" and whole.context == min(shape.context_length, fit.DEFAULT_CONTEXT_CAP)


def test_fit_command_with_a_given_memory(smollm2_path, capsys):
    """`kinetic fit MODEL --memory GIB --json` reports the formula's context for that memory."""
    shape = fit.read_shape(smollm2_path)
    gib = 0.5
    assert main(["fit", str(smollm2_path), "--memory", str(gib), "--gpu-memory", "0.25", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    row = report["models"][0]
    expected = min((int(gib * 1024**3) - shape.weights - shape.working) // shape.kv_per_token // 256 * 256,
                   shape.context_length)
    assert row["max_context"] == expected and row["kv_per_token"] == shape.kv_per_token
    assert row["gpu_layers"] == fit.gpu_layers(shape, 1024**3 // 4, row["context"])


def test_fit_command_on_a_folder(smollm2_path, gemma_path, tmp_path, capsys):
    """`kinetic fit DIR` has one row per model in the folder; an unreadable file says why."""
    for p in (smollm2_path, gemma_path):
        (tmp_path / p.name).symlink_to(p)
    (tmp_path / "broken.gguf").write_bytes(b"nope")
    assert main(["fit", str(tmp_path), "--memory", "4", "--gpu-memory", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "memory: 4.00 GiB (given); GPU: 1.00 GiB (given)"
    rows = {line.split()[0]: line for line in out[2:]}
    assert set(rows) == {"SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m", "broken"}
    assert "GPU (at 8192 tokens)" in rows["SmolLM2-135M-Instruct.Q4_1"] and "no: " in rows["broken"]
