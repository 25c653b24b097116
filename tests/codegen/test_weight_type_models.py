"""Whole models with the weight types of popular GGUF mixes on every device: the synthetic llama file's
graph with its weights retyped as a Q5_K_M, a Q3_K_M, a Q2_K, an F16 and a BF16 file has them (random
weights of those types; its f32 norms as stored; its token table, which the file ties to the output
layer, retyped too: a lookup and an output matmul of that type) gives the reference interpreter's
logits bit for bit on the CPU, the CUDA emulation and Vulkan, for a prompt in one pass and for a
decode step. (The same check on files llama-quantize made is in docs/devices.md.)"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic import devices
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.graph import Graph
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassRows
from kinetic.passes.pipeline import PassOptions, run_pipeline
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.device_checks import same_bits
from tests.random_tensors import random_tensor
from tests.synthetic import synthetic_path

PROMPT = [504, 1575, 282, 649, 314]
DECODE_STEPS = 1  # the prompt pass runs the GEMMs, a decode step the GEMVs
# per mix: the type of each weight (by the GGUF name's role), as llama-quantize's mixes choose them (a
# tied table: Q6_K; Q3_K_M's and Q2_K's here as an untied file's, for lookups of those types)
MIXES = {
    "Q5_K_M": {"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K, "token_embd": Q.Q6_K, "": Q.Q5_K},
    "Q3_K_M": {"attn_v": Q.Q5_K, "ffn_down": Q.Q4_K, "attn_output": Q.Q4_K, "token_embd": Q.Q4_K, "": Q.Q3_K},
    "Q2_K": {"attn_v": Q.Q4_K, "ffn_down": Q.Q3_K, "": Q.Q2_K},
    "F16": {"": Q.F16},
    "BF16": {"": Q.BF16},
}


def _type_for(mix: dict, tensor: str) -> Q:
    return next(t for role, t in mix.items() if role in tensor)


class _Retyped:
    """The file's tensors, with the retyped weights replaced by random tensors of their new type."""

    def __init__(self, weights: GGUFWeights, new: dict[str, tuple[Q, tuple[int, int]]]):
        rng = np.random.default_rng(5)
        self.weights = weights
        self.new = {name: random_tensor(rng, t, shape) for name, (t, shape) in sorted(new.items())}

    def tensor(self, name: str) -> np.ndarray:
        return self.new[name] if name in self.new else self.weights.tensor(name)


def _retyped_model(mix: dict) -> tuple[Graph, _Retyped]:
    gguf = open_gguf(synthetic_path("llama"))
    graph = lower(gguf)
    nodes, new = list(graph.nodes), {}
    for node in graph.nodes:
        name = node.attrs.tensor if node.op is Op.PARAM else ""
        if node.op is Op.PARAM and len(node.type.shape) == 2:
            wtype = _type_for(mix, name)
            nodes[node.id] = replace(node, type=replace(node.type, dtype=wtype.name.lower()))
            new[name] = (wtype, tuple(int(d) for d in node.type.shape))
    # ggml's orders whatever the default: every device (CUDA and Vulkan follow no other) runs this graph
    graph = run_pipeline(Graph(tuple(nodes), graph.outputs, graph.meta), PassOptions(numerics="ggml"))
    return graph, _Retyped(GGUFWeights(gguf), new)


def _logits(graph: Graph, weights, device: str) -> np.ndarray:
    """The prompt's logits (one pass of every row) and those of DECODE_STEPS greedy steps: f32 [n, vocab]."""
    engine = Engine(graph, weights, n_ctx=32, device=device)
    try:
        seq = engine.new_sequence()
        rows = [*engine.forward(PassRows.chain(PROMPT, 0, outputs="all"), {0: seq})]
        for _ in range(DECODE_STEPS):
            rows.append(engine.decode(seq, int(np.argmax(rows[-1]))))
        return np.stack(rows)
    finally:
        engine.close()


@pytest.fixture(scope="module", params=sorted(MIXES))
def model(request):
    graph, weights = _retyped_model(MIXES[request.param])
    return request.param, graph, weights, _logits(graph, weights, "reference")


@pytest.mark.parametrize("device", ["cpu", "cuda-emulated", "vulkan"])
def test_every_device_gives_the_reference_logits(model, device):
    """The mix's prompt pass and decode steps give the reference interpreter's logits bit for bit."""
    mix, graph, weights, want = model
    d = devices.DEVICES[device]
    if d.unavailable():
        pytest.skip(f"{device}: {d.unavailable()}")
    assert d.unsupported(graph) is None, f"{mix} on {device}: {d.unsupported(graph)}"
    got = _logits(graph, weights, device)
    assert np.isfinite(want).all()
    assert same_bits(got, want), f"{mix} on {device}: {np.count_nonzero(got != want)} logits differ"
