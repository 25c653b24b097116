"""qwen35's prediction block as RAD-1's "mtp" drafter (kinetic/runtime/mtp.py, kinetic/frontend/mtp_block.py)
on the synthetic qwen35 file (one MTP layer, blk.4, random weights): the engine hands out the trunk's
hidden rows; the block computes llama.cpp's graph_mtp maths; drafting with it forced on equals plain
decoding; its own cache stays what a fresh catch-up gives over rejected drafts, turns and rollbacks."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gguf.quants import dequantize

from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.frontend.mtp_block import build_prediction_block
from kinetic.ir.rows import PassRows
from kinetic.runtime import mtp, speculative
from kinetic.runtime.drafting import ForcedDraft, NgramIndex
from kinetic.runtime.engine import Engine, SeqRows
from kinetic.runtime.kv_cache import SequenceCaches
from kinetic.runtime.speculative import GreedyPicker, SpeculativeDecoder, plain_decode
from kinetic.runtime.weights import GGUFWeights
from tests.device_checks import FixedCosts, same_bits
from tests.synthetic import synthetic_path

PROMPT = [504, 613, 901, 278, 720, 94, 275, 1324, 544, 382, 851, 690, 504, 613]
DEVICES = ("reference", "cpu")


@functools.cache
def _engine(device: str = "reference", name: str = "qwen35") -> Engine:
    from kinetic import devices

    gguf = open_gguf(synthetic_path(name))
    graph = lower(gguf)
    reason = devices.DEVICES[device].unavailable() or devices.DEVICES[device].unsupported(graph)
    if reason:
        pytest.skip(f"{device}: {reason}")
    return Engine(graph, GGUFWeights(gguf), n_ctx=96, device=device, threads=1)


# -- the engine's trunk rows ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_the_trunk_rows_are_the_heads_normed_rows(device):
    """Each committed row's trunk row (the final norm of every pass row) is bit for bit the row the
    output layer reads: Shortlist's "hidden" on the CPU, the reference's output norm node."""
    engine = _engine(device)
    seq = engine.new_sequence()
    engine.prefill(seq, PROMPT)
    rows = PassRows.chain(PROMPT, 0, outputs="all")
    graph = mtp.with_trunk_hidden(engine.graph)
    head_input = ("hidden", graph.output("logits").inputs[0])
    wanted = engine.runner.run(engine._run_graph if device == "cpu" else _with_output(graph, head_input), rows,
                               SequenceCaches({0: engine.new_sequence().cache})).outputs["hidden"]
    assert sorted(seq.prediction.rows) == list(range(len(PROMPT)))
    assert same_bits(np.stack([seq.prediction.rows[p] for p in range(len(PROMPT))]), wanted)


def _with_output(graph, output):
    from kinetic.ir.graph import Graph

    return Graph(graph.nodes, graph.outputs + (output,), graph.meta)


def test_a_model_without_a_block_pays_nothing():
    """A file without a prediction block runs its graph as compiled (no trunk output), its sequences
    carry no prediction track and drafters_for adds no mtp drafter."""
    from kinetic.runtime.drafting import drafters_for

    engine = _engine("reference", "qwen35-s96")
    seq = engine.new_sequence()
    assert engine._run_graph.outputs == engine.graph.outputs and seq.prediction is None
    assert [d.name for d in drafters_for(engine, NgramIndex(64, (2,)), seq)] == ["context", "seen"]
    assert "mtp" in [d.name for d in drafters_for(_engine(), NgramIndex(64, (2,)), _engine().new_sequence())]


def test_a_shared_pass_hands_each_sequence_its_own_rows():
    """In one Convoy pass (a committing prompt chunk beside a held draft chain), each sequence's track
    gets the trunk rows its rows get alone: the committing one's at once, the held one's kept rows
    at keep() and none of its dropped row."""
    engine = _engine()
    a, b = engine.new_sequence(), engine.new_sequence()
    engine.prefill(b, PROMPT[:5])
    engine.run([SeqRows(a, PassRows.chain(PROMPT, 0)), SeqRows(b, PassRows.chain([7, 8, 9], 5), commit=False)])
    engine.keep(b, [0, 1])
    alone_a, alone_b = engine.new_sequence(), engine.new_sequence()
    engine.prefill(alone_a, PROMPT)
    engine.prefill(alone_b, PROMPT[:5] + [7, 8])
    for seq, alone in ((a, alone_a), (b, alone_b)):
        assert sorted(seq.prediction.rows) == sorted(alone.prediction.rows)
        assert all(same_bits(seq.prediction.rows[p], alone.prediction.rows[p]) for p in alone.prediction.rows)


# -- the block's maths -------------------------------------------------------------------------------


def _weight(g, name: str) -> np.ndarray:
    info = g.tensors[name]
    return dequantize(np.asarray(g.array(name)), info.type).astype(np.float64)


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _block_numpy(g, tokens: list[int], hidden: np.ndarray) -> np.ndarray:
    """llama.cpp's graph_mtp (src/models/qwen35.cpp) in float64 numpy, a chain from position 0:
    logits f64 [T, n_vocab]."""
    md, p = g.metadata, "blk.4."
    eps, n_head, n_kv, hd = (float(md["qwen35.attention.layer_norm_rms_epsilon"]),
                             int(md["qwen35.attention.head_count"]), int(md["qwen35.attention.head_count_kv"]),
                             int(md["qwen35.attention.key_length"]))
    n_rot, base = int(md["qwen35.rope.dimension_count"]), float(md["qwen35.rope.freq_base"])
    w = functools.partial(_weight, g)
    e = _rms(w("token_embd.weight")[tokens], w(p + "nextn.enorm.weight"), eps)
    x = np.concatenate([e, _rms(hidden.astype(np.float64), w(p + "nextn.hnorm.weight"), eps)], axis=1)
    x = x @ w(p + "nextn.eh_proj.weight").T
    a = _rms(x, w(p + "attn_norm.weight"), eps)
    both = (a @ w(p + "attn_q.weight").T).reshape(len(tokens), n_head, 2 * hd)
    q, gate = both[:, :, :hd], both[:, :, hd:].reshape(len(tokens), -1)
    k = (a @ w(p + "attn_k.weight").T).reshape(len(tokens), n_kv, hd)
    v = (a @ w(p + "attn_v.weight").T).reshape(len(tokens), n_kv, hd)
    q, k = _rms(q, w(p + "attn_q_norm.weight"), eps), _rms(k, w(p + "attn_k_norm.weight"), eps)
    angles = np.arange(len(tokens))[:, None] * base ** (-2 * np.arange(n_rot // 2) / n_rot)  # NeoX halves
    q, k = _neox(q, angles, n_rot), _neox(k, angles, n_rot)
    out = np.zeros((len(tokens), n_head, hd))
    for h in range(n_head):
        kv = h // (n_head // n_kv)
        scores = q[:, h] @ k[:, kv].T / np.sqrt(hd) + np.triu(np.full((len(tokens),) * 2, -np.inf), 1)
        probs = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, h] = (probs / probs.sum(axis=1, keepdims=True)) @ v[:, kv]
    x = x + (out.reshape(len(tokens), -1) / (1 + np.exp(-gate))) @ w(p + "attn_output.weight").T
    f = _rms(x, w(p + "post_attention_norm.weight"), eps)
    gate_f = f @ w(p + "ffn_gate.weight").T
    x = x + (gate_f / (1 + np.exp(-gate_f)) * (f @ w(p + "ffn_up.weight").T)) @ w(p + "ffn_down.weight").T
    return _rms(x, w(p + "nextn.shared_head_norm.weight"), eps) @ w("output.weight").T


def _neox(x: np.ndarray, angles: np.ndarray, n_rot: int) -> np.ndarray:
    """Rotary over the first n_rot values of each head, pairs (i, i + n_rot / 2)."""
    half, out = n_rot // 2, x.copy()
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    a, b = x[..., :half], x[..., half:n_rot]
    out[..., :half], out[..., half:n_rot] = a * cos - b * sin, a * sin + b * cos
    return out


def _trunk_rows(engine: Engine, tokens: list[int]) -> np.ndarray:
    seq = engine.new_sequence()
    engine.prefill(seq, tokens)
    return np.stack([seq.prediction.rows[p] for p in range(len(tokens))])


def _block_logits(engine: Engine, tokens: list[int], hidden: np.ndarray, options=None) -> np.ndarray:
    """The block's logits for a chain from position 0 (`options`: lowered with those, on the reference)."""
    block = mtp.PredictionBlock.for_engine(engine)
    if options is not None:
        block = mtp.PredictionBlock(build_prediction_block(engine.weights.gguf, options), engine.weights,
                                    n_ctx=engine.n_ctx, device="reference")
    rows = PassRows.chain(tokens, 0, outputs="all")
    rows.hidden = hidden.astype(np.float32)
    return block.runner.run(block.graph, rows, SequenceCaches({0: block.new_cache()})).outputs["logits"]


def test_the_block_computes_llama_cpps_mtp_graph():
    """The block's logits for a chain of (token, trunk row of the position before) rows are llama.cpp's
    graph_mtp maths (numpy, float64): within float32 rounding when lowered with f32 activations and
    cache, and with the same top token at every row as lowered by default (8-bit activations, f16 cache)."""
    engine = _engine()
    g = engine.weights.gguf
    hidden = np.vstack([np.zeros((1, 256), np.float32), _trunk_rows(engine, PROMPT)[:-1]])  # h_{q-1}, 0 at q = 0
    want = _block_numpy(g, PROMPT, hidden)
    exact = _block_logits(engine, PROMPT, hidden, Options(activations="f32", kv_dtype="f32"))
    assert np.abs(exact - want).max() < 1e-5 * np.abs(want).max()
    assert (np.argmax(_block_logits(engine, PROMPT, hidden), axis=1) == np.argmax(want, axis=1)).all()


def test_the_cpu_runs_the_block_as_the_reference():
    """The block's graph on the CPU (its compiled step: concat and the hidden rows as Python
    instructions) gives the reference interpreter's logits bit for bit."""
    from kinetic.codegen.cpu.step import CompiledStep

    hidden = _trunk_rows(_engine(), PROMPT)
    cpu = _block_logits(_engine("cpu"), PROMPT, hidden)
    assert isinstance(mtp.PredictionBlock.for_engine(_engine("cpu")).runner, CompiledStep)
    assert same_bits(cpu, _block_logits(_engine(), PROMPT, hidden))


@pytest.mark.parametrize("device", ["cuda-emulated", "vulkan"])
def test_a_gpu_runs_the_block_as_the_reference(device, monkeypatch):
    """The block's graph on a GPU device (its concat kernel, the trunk rows uploaded as a per-pass
    input) gives the reference interpreter's logits bit for bit, and runs there, not on the CPU."""
    # a block takes its device's default numerics mode (GPUs: ggml's, their only one), so the reference's
    # block is pinned to ggml's orders too, whatever the default, and built afresh: the reference
    # engine's own block (PredictionBlock.for_engine) may have been built in the default mode already
    monkeypatch.setattr("kinetic.numerics_mode.DEFAULT_NUMERICS", "ggml")
    hidden = _trunk_rows(_engine(), PROMPT)
    assert mtp.PredictionBlock.for_engine(_engine(device)).device == device
    want = _block_logits(_engine(), PROMPT, hidden, Options())  # Options(): the lowering the trunk shows
    assert same_bits(_block_logits(_engine(device), PROMPT, hidden), want)


# -- drafting ----------------------------------------------------------------------------------------


class _HalfRight:
    """The mtp drafter, with its first guess made right where plain decoding's next token is known, so
    verify passes keep some rows (and a kept row's trunk row reaches the block) as well as reject."""

    name = "mtp"

    def __init__(self, inner, text: list[int]):
        self.inner, self.text = inner, text

    def propose(self, context, max_len):
        proposal = self.inner.propose(context, max_len)
        n = len(context)
        if proposal and n < len(self.text) and n % 2:
            proposal.branches[0][0] = self.text[n]
        return proposal


def _decode(monkeypatch, engine, prompt, plain, picker, max_tokens, seq):
    """Drafted decoding with the mtp drafter forced on (helped to half-right guesses)."""
    real = speculative.drafters_for
    monkeypatch.setattr(speculative, "DraftPolicy", ForcedDraft)
    monkeypatch.setattr(speculative, "drafters_for", lambda e, seen, s: [
        _HalfRight(d, list(s.tokens) + prompt + plain) for d in real(e, seen, s) if d.name == "mtp"])
    decoder = SpeculativeDecoder(engine, max_rows=4, seen=NgramIndex(1 << 12, (4, 2)), costs=FixedCosts(0.02))
    out = list(decoder.generate(seq, prompt, max_tokens, picker=picker))
    monkeypatch.undo()
    return out, decoder.stats


def _picker(kind: str, engine: Engine, history: list[int]):
    from kinetic.runtime.sampling import Sampler, SamplingSettings

    if kind == "greedy":
        return GreedyPicker()
    return Sampler(SamplingSettings(seed=5, temperature=1.5), n_vocab=engine.n_vocab, history=history)


@pytest.mark.parametrize("device,kind", [(d, k) for d in DEVICES for k in ("greedy", "seeded")] + [
    ("cuda-emulated", "greedy"), pytest.param("cuda-emulated", "seeded", marks=pytest.mark.slow),
    ("vulkan", "greedy"), pytest.param("vulkan", "seeded", marks=pytest.mark.slow)])
def test_drafting_with_the_block_equals_plain(monkeypatch, kind, device):
    """Drafted decoding with the mtp drafter forced on (its chains verified every step, some rows kept,
    most rejected), the block on the model's device, gives plain decoding's tokens, greedy and with a
    seeded sampler."""
    engine = _engine(device)
    assert mtp.PredictionBlock.for_engine(engine).device == device
    plain = list(plain_decode(engine, engine.new_sequence(), PROMPT, 12, picker=_picker(kind, engine, PROMPT)))
    out, stats = _decode(monkeypatch, engine, PROMPT, plain, _picker(kind, engine, PROMPT), 12,
                         engine.new_sequence())
    assert out == plain
    assert stats.accepted > 0 and stats.drafted > stats.accepted


def _fresh_block_cache(engine: Engine, context: list[int]):
    """The block's cache a catch-up over `context` gives from plain decoding's trunk rows."""
    track = mtp.PredictionTrack()
    plain = engine.new_sequence()
    for token in context[:-1]:
        engine.decode(plain, token)
    track.rows = dict(plain.prediction.rows)
    drafter = mtp.MtpDrafter(mtp.PredictionBlock.for_engine(engine), track)
    drafter.catch_up(context)
    return track


def _same_block_cache(a: mtp.PredictionTrack, b: mtp.PredictionTrack) -> bool:
    n = a.cache.length
    return (a.tokens == b.tokens and n == b.cache.length
            and all(np.array_equal(a.cache.k[i][:n].view(np.uint16), b.cache.k[i][:n].view(np.uint16))
                    and np.array_equal(a.cache.v[i][:n].view(np.uint16), b.cache.v[i][:n].view(np.uint16))
                    for i in a.cache.k))


@pytest.mark.parametrize("device", DEVICES)
def test_the_blocks_cache_stays_right_over_rejected_drafts_turns_and_a_rollback(monkeypatch, device):
    """After two drafted turns on one sequence, and again after a rollback and a third turn, the
    block's cache (its entries' keys, values and tokens) is bit for bit what a catch-up from plain
    decoding's trunk rows gives: drafted rows left no trace, kept rows' trunk rows reached it."""
    engine = _engine(device)
    seq = engine.new_sequence()
    turns = [PROMPT[:8], [77, 78, 79], [901, 5]]
    for i, prompt in enumerate(turns):
        if i == 2:
            engine.rollback(seq, len(seq.tokens) - 5)
        context = list(seq.tokens) + prompt
        plain_seq = engine.new_sequence()
        engine.prefill(plain_seq, context[:-1]) if len(context) > 1 else None
        plain = list(plain_decode(engine, plain_seq, context[-1:], 8))
        out, stats = _decode(monkeypatch, engine, prompt, plain, GreedyPicker(), 8, seq)
        assert out == plain and stats.drafted > stats.accepted > 0
        mtp.MtpDrafter(mtp.PredictionBlock.for_engine(engine), seq.prediction).catch_up(seq.tokens + [out[-1]])
        assert _same_block_cache(seq.prediction, _fresh_block_cache(engine, seq.tokens + [out[-1]]))


# -- kinetic info ------------------------------------------------------------------------------------


def test_info_says_the_file_has_a_prediction_block(capsys):
    """`kinetic info` prints `prediction yes` for the qwen35 file with an MTP layer, `no` without one."""
    from kinetic.cli.main import main

    main(["info", str(synthetic_path("qwen35"))])
    assert "prediction     yes" in capsys.readouterr().out
    main(["info", str(synthetic_path("qwen35-s96"))])
    assert "prediction     no" in capsys.readouterr().out
