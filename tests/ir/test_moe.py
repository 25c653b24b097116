"""The mixture-of-experts ops (kinetic/ir/moe_reference.py, numerics/moe.py): a row's result never
depends on the other rows of the pass, the router means what llama.cpp's does, llama.cpp's logits
are reproduced bit for bit on the MoE files (one known exception, NEAR), and the specs refuse what does
not fit."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.compiler import compile_graph
from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.graph import Graph
from kinetic.ir.interpreter import Interpreter
from kinetic.ir.numerics import moe as moe_numerics
from kinetic.ir.ops import OPS, MoeMatmulAttrs, MoeSelectAttrs, Op, VerifyError, infer_type
from kinetic.ir.reference import Evaluation
from kinetic.ir.types import TensorType, f32, i32
from kinetic.runtime.weights import GGUFWeights
from tests.synthetic import (
    logits_beside_llama_cpp,
    rewrite_gguf,
    synthetic_arch,
    synthetic_files,
    synthetic_path,
)

MOE_ARCHS = ("qwen3moe", "granitemoe", "lfm2moe", "qwen35moe")
MOE_FILES = [name for name in synthetic_files() if synthetic_arch(name) in MOE_ARCHS]
# the shared qwen35moe file (Q4_K_M, fused gate_up) is off by up to 3.8e-6 where every other file is exact:
# its legacy-type shape qwen35moe-e8 is exact, the dense qwen35 trunk is exact; the cause is not found yet
NEAR = {"qwen35moe": 1e-5}


def _first_moe_layer(graph: Graph) -> tuple[int, list]:
    """The id of the first router matmul's input (the normed rows) and the nodes from it to its moe_sum."""
    gate = next(n for n in graph.nodes if n.op is Op.MOE_GATE)
    start = graph.node(graph.node(gate.inputs[0]).inputs[0]).id
    end = next(n for n in graph.nodes if n.op is Op.MOE_SUM)
    return start, [n for n in graph.nodes if start < n.id <= end.id]


def _run_moe(graph: Graph, interpreter: Interpreter, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first MoE layer's output f32 [rows, width] and chosen experts for the normed rows x."""
    start, nodes = _first_moe_layer(graph)
    env = {start: x}
    ev = Evaluation(interpreter, None, None)
    for node in nodes:
        for i in node.inputs:
            if i not in env:
                env[i] = graph.node(i)  # a param: the references resolve it through the runner
        env[node.id] = OPS[node.op].reference(ev, node, [env[i] for i in node.inputs])
    ids = next(env[n.id] for n in nodes if n.op is Op.MOE_SELECT)
    return env[nodes[-1].id], ids


def test_a_row_gets_the_same_experts_and_output_in_any_pass():
    """Batch invariance: each of 9 rows gets bit for bit the output (and experts) it gets alone, in
    every pass of 2..9 rows, while the rows choose different experts (the pass groups rows by expert)."""
    gguf = open_gguf(synthetic_path("qwen3moe-e20k4"))
    graph = compile_graph(gguf)
    interpreter = Interpreter(GGUFWeights(gguf))
    x = np.random.default_rng(7).standard_normal((9, 256)).astype(np.float32) * np.float32(3)
    alone = [_run_moe(graph, interpreter, x[i:i + 1]) for i in range(9)]
    assert len(np.unique(np.concatenate([ids for _, ids in alone]))) >= 10  # many experts in play
    for count in range(2, 10):
        out, ids = _run_moe(graph, interpreter, x[:count])
        for i in range(count):
            assert np.array_equal(ids[i], alone[i][1][0])
            assert out[i].tobytes() == alone[i][0][0].tobytes(), f"row {i} of {count}"


@pytest.mark.parametrize("n_expert", [4, 16, 20, 40])
def test_router_weights_are_the_renormalized_top_probabilities(n_expert):
    """The gate is a softmax (or a sigmoid) of each row, the chosen experts are the k most probable in
    descending order, and their weights are those probabilities renormalized to sum to 1."""
    logits = np.random.default_rng(n_expert).standard_normal((5, n_expert)).astype(np.float32) * 4
    exact = np.exp(logits.astype(np.float64) - logits.max(1, keepdims=True))
    exact /= exact.sum(1, keepdims=True)
    probs = moe_numerics.gate(logits, "softmax")
    np.testing.assert_allclose(probs, exact, rtol=2e-6, atol=1e-9)
    np.testing.assert_allclose(moe_numerics.gate(logits, "sigmoid"), 1 / (1 + np.exp(-logits.astype(np.float64))),
                               rtol=1e-6)
    ids = moe_numerics.top_k(probs, 3)
    assert np.array_equal(ids, np.argsort(-exact, axis=1)[:, :3])
    weights = moe_numerics.route_weights(probs, ids, normalize=True, scale=0.0)
    picked = np.take_along_axis(exact, ids.astype(np.int64), 1)
    np.testing.assert_allclose(weights, picked / picked.sum(1, keepdims=True), rtol=1e-5)
    assert np.array_equal(moe_numerics.route_weights(probs, ids, normalize=False, scale=2.5),
                          np.take_along_axis(probs, ids.astype(np.int64), 1) * np.float32(2.5))


@pytest.mark.parametrize("name", MOE_FILES)
def test_moe_logits_equal_llama_cpp_bit_for_bit(name):
    """On every MoE file but those in NEAR, the logits of llama.cpp's top tokens at every prompt position
    (its one-token-at-a-time path) are Kinetic's exactly: the router, the experts and their sum round as
    ggml's CPU ops do (fails when the weights are not renormalized, or summed in another order)."""
    for logits, top_ids, top_logits in logits_beside_llama_cpp(name):
        ours = np.take_along_axis(logits, top_ids, axis=1)
        assert np.abs(ours - top_logits).max() <= NEAR.get(name, 0.0)


def test_specs_refuse_what_does_not_fit():
    """moe_select cannot pick more experts than there are; moe_matmul's input is one row of K shared by
    the slots or one per slot, and its weight is a stack of experts."""
    with pytest.raises(VerifyError, match="picks 1..4 experts"):
        infer_type(Op.MOE_SELECT, [f32("T", 4)], MoeSelectAttrs(5))
    w = TensorType("q4_0", (8, 64, 256))
    assert infer_type(Op.MOE_MATMUL, [f32("T", 256), w, i32("T", 2)], MoeMatmulAttrs()) == f32("T", 128)
    assert infer_type(Op.MOE_MATMUL, [f32("T", 512), w, i32("T", 2)], MoeMatmulAttrs()) == f32("T", 128)
    with pytest.raises(VerifyError, match="must be 256 wide"):
        infer_type(Op.MOE_MATMUL, [f32("T", 384), w, i32("T", 2)], MoeMatmulAttrs())
    with pytest.raises(VerifyError, match="stacked experts"):
        infer_type(Op.MOE_MATMUL, [f32("T", 256), TensorType("q4_0", (64, 256)), i32("T", 2)], MoeMatmulAttrs())


def test_more_experts_per_token_than_experts_is_refused_by_name(tmp_path):
    """A file asking for more experts per token than it has fails loading naming the key."""
    path = rewrite_gguf(synthetic_path("granitemoe"), tmp_path / "used.gguf",
                        set_kv={"granitemoe.expert_used_count": 5})
    with pytest.raises(KineticError, match="granitemoe.expert_used_count"):
        lower(open_gguf(path))
