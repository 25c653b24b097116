"""Recurrent state (kinetic/runtime/recurrent.py, docs/recurrent.md) on the synthetic lfm2 (short
convolution), granitehybrid (Mamba-2), falcon-h1 (attention beside Mamba-2) and qwen35 (Gated DeltaNet) files: a
row continues the state its own path left, whatever else shares its pass; keep() leaves the state
after the last kept row; a rollback and a restored snapshot continue bit for bit; drafted decoding
equals plain."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.rows import PassRows
from kinetic.runtime.drafting import NgramIndex, Proposal
from kinetic.runtime.engine import Engine, SeqRows
from kinetic.runtime.snapshots import restore_snapshot, take_snapshot
from kinetic.runtime.speculative import GreedyPicker, SpeculativeDecoder, plain_decode
from kinetic.runtime.weights import GGUFWeights
from tests.device_checks import FixedCosts, same_bits
from tests.synthetic import synthetic_path

PROMPT = [504, 613, 901, 278, 720, 94, 275, 1324, 544, 382, 851, 690, 504, 613]
FILES = ("lfm2", "lfm2-k20", "granitehybrid", "granitehybrid-s128", "falcon-h1", "falcon-h1-s96", "qwen35",
         "qwen35-s96")
FAMILIES = ("lfm2-k20", "granitehybrid-s128", "falcon-h1-s96", "qwen35-s96")  # one file a family for the longer checks
DEVICES = ("reference", "cpu")  # the CPU: the compiled step, keys and values written in place


@functools.cache
def _engine(name: str, device: str = "reference") -> Engine:
    gguf = open_gguf(synthetic_path(name))
    return Engine(lower(gguf), GGUFWeights(gguf), n_ctx=96, device=device, threads=1)


def _same_state(a, b) -> bool:
    """Recurrent states, KV entries and tokens of two sequences, bit for bit."""
    ra, rb = a.cache.recurrent, b.cache.recurrent
    n = a.cache.length
    return (a.tokens == b.tokens and n == b.cache.length and set(ra.values) == set(rb.values)
            and all(np.array_equal(ra.values[k].view(np.uint32), rb.values[k].view(np.uint32)) for k in ra.values)
            and all(np.array_equal(a.cache.k[i][:n].view(np.uint16), b.cache.k[i][:n].view(np.uint16))
                    and np.array_equal(a.cache.v[i][:n].view(np.uint16), b.cache.v[i][:n].view(np.uint16))
                    for i in a.cache.k))


def _fed(engine: Engine, tokens: list[int]):
    seq = engine.new_sequence()
    for t in tokens:
        engine.decode(seq, t)
    return seq


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FILES)
def test_a_prompt_pass_leaves_the_state_decoding_one_row_at_a_time_leaves(name, device):
    """Each row of one prompt pass gets the logits it gets decoded alone, and the pass leaves the
    state and cache that one-at-a-time decoding leaves."""
    engine = _engine(name, device)
    whole = engine.new_sequence()
    batched = engine.forward(PassRows.chain(PROMPT, 0, outputs="all"), {0: whole})
    alone = engine.new_sequence()
    assert same_bits(batched, np.stack([engine.decode(alone, t) for t in PROMPT]))
    assert engine.recurrent_shapes and _same_state(whole, alone)


@pytest.mark.parametrize("device", DEVICES)
def test_a_committing_pass_returns_only_the_states_it_keeps(device):
    """A prompt pass the runtime commits gets back the state after each sequence's last row only
    (rows.state_rows), not one per row: a prompt chunk of a Mamba model would hold T states."""
    from kinetic.runtime.kv_cache import SequenceCaches
    from kinetic.runtime.recurrent import state_rows

    engine = _engine("granitehybrid-s128", device)
    seq = engine.new_sequence()
    result = engine.runner.run(engine.graph, state_rows(PassRows.chain(PROMPT, 0)), SequenceCaches({0: seq.cache}))
    assert set(result.new_state) == set(engine.recurrent_shapes)
    assert all(list(states) == [len(PROMPT) - 1] for states in result.new_state.values())


@pytest.mark.parametrize("device", DEVICES)
def test_two_sequences_in_one_pass_each_continue_their_own_state(device):
    """Two sequences with different histories in one pass (Convoy) each get the logits and state they
    get in a pass of their own."""
    engine = _engine("lfm2", device)
    a, b = _fed(engine, PROMPT[:5]), _fed(engine, PROMPT[5:12])
    parts = [SeqRows(a, PassRows.chain(PROMPT[12:], 5, outputs="all")),
             SeqRows(b, PassRows.chain([PROMPT[0]], 7, outputs="all"))]
    engine.run(parts)
    a_alone, b_alone = _fed(engine, PROMPT[:5]), _fed(engine, PROMPT[5:12])
    assert same_bits(parts[0].logits, np.stack([engine.decode(a_alone, t) for t in PROMPT[12:]]))
    assert same_bits(parts[1].logits[-1], engine.decode(b_alone, PROMPT[0]))
    assert _same_state(a, a_alone) and _same_state(b, b_alone)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("path", [[0, 2, 3], [0], [0, 1]])
def test_keep_leaves_the_state_after_the_last_kept_row(path, name, device):
    """A verified draft tree's kept path (through a branch, the root alone, a prefix) leaves the state,
    cache and next logits that plain decoding of that path leaves: rejected rows leave no trace."""
    engine = _engine(name, device)
    tokens, parents = [690, 11, 253, 1232, 278], [-1, 0, 0, 2, 3]
    seq = _fed(engine, PROMPT[:6])
    tree = engine.verify(seq, PassRows(tokens=np.asarray(tokens, np.int32),
                                       positions=np.asarray([6, 7, 7, 8, 9], np.int32),
                                       seqs=np.zeros(5, np.int32), parents=np.asarray(parents, np.int32),
                                       output_rows=np.arange(5, dtype=np.int32)))
    engine.keep(seq, path)
    plain = _fed(engine, PROMPT[:6])
    plain_logits = [engine.decode(plain, tokens[r]) for r in path]
    assert all(same_bits(tree[r], want) for r, want in zip(path, plain_logits, strict=True))
    assert _same_state(seq, plain)
    assert same_bits(engine.decode(seq, 30), engine.decode(plain, 30))


def test_rollback_restarts_from_a_checkpoint_and_refeeds():
    """Rolling back restores the latest checkpoint at or before the length and feeds the tokens after
    it again: the state, cache and next logits are bit for bit those of a sequence that stopped there."""
    engine = _engine("lfm2")
    seq = engine.new_sequence()
    seq.cache.recurrent.checkpoint_every = 4
    engine.prefill(seq, PROMPT[:3])
    for t in PROMPT[3:]:
        engine.decode(seq, t)
    assert sorted(seq.cache.recurrent.checkpoints) == [4, 8, 12]
    passes = engine.passes
    engine.rollback(seq, 10)
    assert engine.passes == passes + 1  # tokens 8 and 9 fed again from the checkpoint at 8
    stopped = _fed(engine, PROMPT[:10])
    assert _same_state(seq, stopped)
    assert same_bits(engine.decode(seq, 7), engine.decode(stopped, 7))


@pytest.mark.parametrize("name", FAMILIES)
def test_a_snapshot_restored_mid_sequence_continues_bit_for_bit(name):
    """A sequence restored from a snapshot taken mid-generation generates the same tokens with the
    same logits and ends in the same state as the sequence it was taken from."""
    engine = _engine(name)
    seq = engine.new_sequence()
    logits = engine.prefill(seq, PROMPT)
    logits = engine.decode(seq, int(np.argmax(logits)))
    snapshot = take_snapshot(seq)
    restored = restore_snapshot(engine, snapshot)
    assert _same_state(seq, restored)
    for _ in range(4):
        token = int(np.argmax(logits))
        logits = engine.decode(seq, token)
        assert same_bits(engine.decode(restored, token), logits)
    assert _same_state(seq, restored)


class _PlainOracle:
    """Drafts plain decoding's continuation with every third token wrong and a second branch, so that
    passes keep some guesses, reject others and verify trees."""

    name = "oracle"

    def __init__(self, prompt: list[int], plain: list[int]):
        self.text = prompt + plain

    def propose(self, context: list[int], max_len: int) -> Proposal | None:
        n = len(context)
        right = self.text[n:n + max_len]
        if not right:
            return None
        guess = [t if (n + i) % 3 else (t + 1) % 2048 for i, t in enumerate(right)]
        other = [(right[0] + 7) % 2048]
        return Proposal("oracle/1", [guess] if guess[0] == other[0] else [guess, other])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("picker", ["greedy", "seeded"])
def test_drafted_decoding_equals_plain(monkeypatch, picker, name, device):
    """Drafted decoding (chains and trees whose guesses are partly right) gives plain decoding's
    tokens and leaves its state, greedy and with a seeded sampler."""
    from kinetic.runtime import speculative
    from kinetic.runtime.sampling import Sampler, SamplingSettings

    engine = _engine(name, device)

    def make():
        return GreedyPicker() if picker == "greedy" else Sampler(SamplingSettings(seed=5, temperature=1.5),
                                                                 n_vocab=engine.n_vocab, history=PROMPT)

    plain_seq = engine.new_sequence()
    plain = list(plain_decode(engine, plain_seq, PROMPT, 16, picker=make()))
    monkeypatch.setattr(speculative, "drafters_for", lambda *_: [_PlainOracle(PROMPT, plain)])
    decoder = SpeculativeDecoder(engine, max_rows=4, seen=NgramIndex(1 << 12, (4, 2)), costs=FixedCosts(0.02))
    seq = engine.new_sequence()
    assert list(decoder.generate(seq, PROMPT, 16, picker=make())) == plain
    assert decoder.stats.accepted > 0 and decoder.stats.drafted > decoder.stats.accepted
    assert _same_state(seq, plain_seq)


@pytest.mark.parametrize("name", FILES)
def test_the_compiled_cpu_step_runs_the_family_as_the_reference(name):
    """The CPU's compiled step (its short convolution gathering each row's window along its path, the
    scan a Python instruction) gives the reference's logits, state and cache bit for bit."""
    from kinetic.codegen.cpu.step import CompiledStep

    cpu, ref = _engine(name, "cpu"), _engine(name)
    assert isinstance(cpu.runner, CompiledStep)
    a, b = cpu.new_sequence(), ref.new_sequence()
    assert same_bits(cpu.prefill(a, PROMPT), ref.prefill(b, PROMPT))
    assert same_bits(cpu.decode(a, 42), ref.decode(b, 42))
    assert _same_state(a, b)


def test_checkpoints_stay_bounded_and_a_rewind_forgets_the_later_ones():
    """RecurrentState keeps the latest MAX_CHECKPOINTS checkpoints; rewinding to n restores the latest
    at or before n (the zero state when none is) and drops the ones after it."""
    from kinetic.runtime.recurrent import MAX_CHECKPOINTS, RecurrentState

    state = RecurrentState({"conv.0": (1, 2)}, checkpoint_every=2)
    for step in range(1, 2 * MAX_CHECKPOINTS + 5):
        state.commit({"conv.0": {0: np.full((1, 2), step, np.float32)}}, np.array([0]))
    assert len(state.checkpoints) == MAX_CHECKPOINTS
    newest = max(state.checkpoints)
    assert state.rewind(newest - 1) == newest - 2
    assert state.values["conv.0"][0, 0] == newest - 2 and max(state.checkpoints) == newest - 2
    assert state.rewind(min(state.checkpoints) - 1) == 0  # older than every kept checkpoint: from zero
    assert not state.values["conv.0"].any() and state.length == 0
