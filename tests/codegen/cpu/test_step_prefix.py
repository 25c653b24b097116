"""Prefixes of the stealing tapes' phases (kinetic/codegen/cpu/step_steal.py, "Prefixes"): a decode
layer's RMS norm and activation quantizations run in full on every thread at the head of the next
matmul phase, with no barrier of their own, and decode gives the bits it gave with their phases."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kinetic
from kinetic.codegen.cpu import step_steal, step_threads, tape
from tests.codegen.cpu.test_step_sync import _AbsentWorker
from tests.synthetic import synthetic_path

PROMPT = [1, 5, 17, 3, 99, 42]
DECODE = 24


def _decode(model) -> list[np.ndarray]:
    """The prompt's logits, then 24 greedy decode steps' logits."""
    engine = model.engine
    seq = engine.new_sequence()
    out = [engine.prefill(seq, PROMPT)]
    for _ in range(DECODE):
        out.append(engine.decode(seq, int(np.argmax(out[-1][-1]))))
    return out


def _model(name: str, threads: int):
    # without Shortlist one runner (the full graph's, with its output layer) runs every pass
    return kinetic.Model(name, n_ctx=64, threads=threads, shortlist=False)


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_prefixed_decode_gives_one_threads_bits(name, monkeypatch):
    """24 decode tokens' logits: one thread = two threads with prefixes = two threads whose worker
    never runs (the caller runs every prefix and share) = two threads without prefixes; each layer
    has three prefixes (before its QKV, output and FFN matmuls)."""
    one = _decode(_model(name, 1))
    model = _model(name, 2)
    steal = model.engine.runner.steal
    layers = int(np.count_nonzero(steal.ops == tape.OP_ATTEND))
    assert steal.prefixes() >= 3 * layers
    assert _same(_decode(model), one), "two threads with prefixes changed the bits"
    absent = _AbsentWorker()
    with monkeypatch.context() as m:
        m.setattr(step_threads, "_pool", lambda n: [absent] * n)
        got: list = []
        runner = threading.Thread(target=lambda: got.append(_decode(_model(name, 2))), daemon=True)
        runner.start()
        runner.join(timeout=300)
    assert got and _same(got[0], one), "the caller alone with prefixes changed the bits"
    monkeypatch.setattr(step_steal, "PREFIXES", False)
    plain = _model(name, 2)
    assert plain.engine.runner.steal.prefixes() == 0
    assert _same(_decode(plain), one)


def test_a_prefix_is_small_stolen_ops_before_a_matmul_with_no_barrier(monkeypatch):
    """Every prefix row is an RMS norm or a quantization of a stolen, column-split phase with no
    barrier after it, the rest of its phase holds a matmul, and the tape has one phase fewer per
    prefix (three a layer, one before the output layer) than without prefixes."""
    def steal_tapes():
        return kinetic.Model(synthetic_path("llama"), n_ctx=64, threads=2, shortlist=False).engine.runner.steal

    steal = steal_tapes()
    rows = steal.sets[0].tape
    flags = rows[:, tape.FLAGS]
    prefix = np.flatnonzero(flags & tape.FLAG_PREFIX)
    assert all(rows[i, tape.OP] in tape.PREFIX_OPS for i in prefix)
    assert np.all(flags[prefix] & tape.FLAG_STEAL) and np.all(flags[prefix] & tape.FLAG_COLUMNS)
    assert not np.any(flags[prefix] & tape.FLAG_BARRIER)
    for i in prefix[~np.isin(prefix + 1, prefix)]:  # each prefix's last row
        end = i + 1
        while not flags[end] & tape.FLAG_BARRIER and end < len(rows) - 1:
            end += 1
        assert tape.OP_MATMUL in rows[i + 1: end + 1, tape.OP]
    layers = int(np.count_nonzero(steal.ops == tape.OP_ATTEND))
    assert steal.prefixes() == 3 * layers + 1  # and the output norm's, before the output layer
    monkeypatch.setattr(step_steal, "PREFIXES", False)
    plain = steal_tapes()
    assert plain.stolen_phases()[1] == steal.stolen_phases()[1] + steal.prefixes()
    assert steal.stolen_phases()[0] == steal.stolen_phases()[1]
