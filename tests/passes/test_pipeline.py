"""The pipeline: phases in order, options, its hash, verification after every pass, and the real
models (verifier after every pass, fusions found, logits bit for bit unchanged)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

import kinetic.passes.pipeline as pipeline
from kinetic.ir.graph import Graph, verify
from kinetic.ir.ops import Op, VerifyError
from kinetic.ir.rows import PassRows
from kinetic.ir.text import parse_graph, print_graph
from kinetic.passes import PIPELINE, PassOptions, Phase, pipeline_hash, run_pipeline

# The pipeline in ggml's numerics mode, for the checks that it changes no number: a graph before the
# batch-invariance pass computes its ops' spec orders, which are ggml's (the fast mode's orders change
# last bits on purpose: tests/passes/test_numerics_mode.py)
GGML_PASSES = PassOptions(numerics="ggml")

# One llama-style layer at toy size: norm, attention over a KV cache, gated feed-forward, logits.
TINY_LAYER = """
meta family = "toy"
%0 = input() {name="positions"} : i32[T]
%1 = input() {name="tokens"} : i32[T]
%2 = param() {tensor="token_embd.weight"} : f32[16,8]
%3 = embed(%2, %1) : f32[T,8]
%4 = scale(%3) {factor=1.0} : f32[T,8]
%5 = param() {tensor="attn_norm"} : f32[8]
%6 = rms_norm(%4, %5) {eps=1e-05} : f32[T,8]
%7 = param() {tensor="wq"} : f32[8,8]
%8 = matmul(%6, %7) {activations="f32"} : f32[T,8]
%9 = param() {tensor="wk"} : f32[4,8]
%10 = matmul(%6, %9) {activations="f32"} : f32[T,4]
%11 = param() {tensor="wv"} : f32[4,8]
%12 = matmul(%6, %11) {activations="f32"} : f32[T,4]
%13 = rope(%8, %0) {n_head=2, head_dim=4, n_rot=4, theta=10000.0, neox=false} : f32[T,8]
%14 = rope(%10, %0) {n_head=1, head_dim=4, n_rot=4, theta=10000.0, neox=false} : f32[T,4]
%15 = state() {name="kv.0", layer=0, n_kv_head=1, head_dim=4} : kv[]
%16 = attention(%13, %14, %12, %15) {n_head=2, n_kv_head=1, head_dim=4, scale=0.5} : f32[T,8]
%17 = add(%4, %16) : f32[T,8]
%18 = param() {tensor="gate"} : f32[12,8]
%19 = matmul(%17, %18) {activations="f32"} : f32[T,12]
%20 = param() {tensor="up"} : f32[12,8]
%21 = matmul(%17, %20) {activations="f32"} : f32[T,12]
%22 = matmul(%17, %18) {activations="f32"} : f32[T,12]
%23 = silu(%22) : f32[T,12]
%24 = mul(%21, %23) : f32[T,12]
%25 = param() {tensor="down"} : f32[8,12]
%26 = matmul(%24, %25) {activations="f32"} : f32[T,8]
%27 = add(%17, %26) : f32[T,8]
%28 = input() {name="output_rows"} : i32[R]
%29 = take_rows(%27, %28) : f32[R,8]
%30 = matmul(%29, %2) {activations="f32"} : f32[R,16]
output logits = %30
"""


def test_tiny_layer_pipeline_is_exact_and_idempotent(same_numbers):
    """The whole pipeline (ggml's mode) on one toy layer: unit scale gone, repeated matmul merged, swiglu fused,
    ids dense, the same logits bit for bit, and a second run changes nothing."""
    before = parse_graph(TINY_LAYER)
    after = run_pipeline(before, GGML_PASSES)
    ops = Counter(n.op for n in after.nodes)
    assert ops[Op.SWIGLU] == 1 and ops[Op.SILU] == 0 and ops[Op.MUL] == 0 and ops[Op.SCALE] == 0
    assert ops[Op.MATMUL] == 7  # cse merged the repeated gate matmul %22 into %19
    assert [n.id for n in after.nodes] == list(range(len(after.nodes)))
    assert after.meta == before.meta
    assert run_pipeline(after, GGML_PASSES) == after
    same_numbers(before, after)


def test_on_phase_sees_each_enabled_phase_in_order():
    """on_phase gets every phase's name and a verified graph; a disabled phase is skipped."""
    seen: list[tuple[str, Graph]] = []
    run_pipeline(parse_graph(TINY_LAYER), on_phase=lambda name, g: seen.append((name, g)))
    assert [name for name, _ in seen] == [p.name for p in PIPELINE]
    for _, g in seen:
        verify(g)
    seen.clear()
    out = run_pipeline(parse_graph(TINY_LAYER), PassOptions(fusion=False),
                       on_phase=lambda name, g: seen.append((name, g)))
    assert "fusion" not in [name for name, _ in seen]
    assert Counter(n.op for n in out.nodes)[Op.SILU] == 1


def test_verifier_runs_after_every_pass(monkeypatch):
    """A pass that breaks a type is caught right after it runs, with its name in the message."""

    def break_types(graph: Graph) -> Graph:
        last = graph.nodes[-1]
        wrong = dataclasses.replace(last, type=dataclasses.replace(last.type, shape=("R", 99)))
        return Graph(graph.nodes[:-1] + (wrong,), graph.outputs, graph.meta)

    monkeypatch.setattr(pipeline, "PIPELINE", (Phase("broken", (break_types,)),))
    with pytest.raises(VerifyError, match="after pass break_types"):
        run_pipeline(parse_graph(TINY_LAYER))


def test_pass_options_are_frozen():
    """Options are values: they cannot be changed after they are made."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        PassOptions().fusion = False


def test_pipeline_hash_depends_on_options_and_nothing_else():
    """The same options give the same hash; different options give a different one."""
    assert pipeline_hash() == pipeline_hash(PassOptions())
    hashes = {pipeline_hash(PassOptions(cse=c, fusion=f)) for c in (True, False) for f in (True, False)}
    assert len(hashes) == 4
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in hashes)


def test_pipeline_hash_changes_with_the_version(monkeypatch):
    """Bumping PIPELINE_VERSION invalidates every cache key."""
    old = pipeline_hash()
    monkeypatch.setattr(pipeline, "PIPELINE_VERSION", pipeline.PIPELINE_VERSION + 1)
    assert pipeline_hash() != old


# ---- the real models ----------------------------------------------------------------------------

EXPECTED_FUSED = {"smollm2-135m": (Op.SWIGLU, Op.SILU, 30), "gemma3-270m": (Op.GEGLU, Op.GELU, 18)}


def _lowered(path):
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower

    return lower(open_gguf(path))


@pytest.mark.parametrize("model", sorted(EXPECTED_FUSED))
def test_real_model_verifies_after_every_phase(model, request):
    """Lowered real graphs pass the verifier after every phase, fuse one gated activation per
    layer, lose exactly the fused activations, round-trip as text, and are a fixed point."""
    path = request.getfixturevalue("smollm2_path" if model.startswith("smollm2") else "gemma_path")
    graph = _lowered(path)
    phases: list[Graph] = []
    optimized = run_pipeline(graph, on_phase=lambda _name, g: phases.append(g))
    assert len(phases) == len(PIPELINE)
    for g in phases:
        verify(g)
    fused, activation, n_layers = EXPECTED_FUSED[model]
    ops = Counter(n.op for n in optimized.nodes)
    assert ops[fused] == n_layers and ops[activation] == 0
    assert len(optimized.nodes) == len(graph.nodes) - n_layers
    assert parse_graph(print_graph(optimized)) == optimized
    assert run_pipeline(optimized) == optimized


def test_smollm2_logits_bit_identical_after_pipeline(smollm2_path):
    """Every row's logits and every cache entry of a short prompt, then one decode step, are bit
    for bit the same through the optimized graph (ggml's mode) as through the lowered one."""
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower
    from kinetic.runtime.engine import Engine
    from kinetic.runtime.weights import GGUFWeights

    gguf = open_gguf(smollm2_path)
    lowered = lower(gguf)
    optimized = run_pipeline(lowered, GGML_PASSES)
    assert len(optimized.nodes) < len(lowered.nodes)
    prompt, next_token = [1, 9690, 314, 253], 2096
    results = []
    for graph in (lowered, optimized):
        engine = Engine(graph, GGUFWeights(gguf), n_ctx=16)
        seq = engine.new_sequence()
        prompt_logits = engine.forward(PassRows.chain(prompt, 0, outputs="all"), {0: seq})
        decode_logits = engine.decode(seq, next_token)
        results.append((prompt_logits, decode_logits, seq.cache.k[0][:5].copy(), seq.cache.v[29][:5].copy()))
    for want, got in zip(*results, strict=True):
        assert want.dtype == got.dtype
        np.testing.assert_array_equal(got, want)
    assert np.isfinite(results[0][0]).all()
