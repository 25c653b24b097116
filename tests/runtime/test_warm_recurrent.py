"""Warm Start on models with recurrent layers (lfm2, granitehybrid, falcon-h1 synthetic files): their
states are stored as snapshots at snapshot points and restored whole, giving bit for bit the tokens a
cold run gives, from memory and after a restart from the disk tier."""

from __future__ import annotations

import numpy as np
import pytest

import kinetic
from kinetic.runtime.generation import GenerationRequest, Generator
from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.warm_costs import SNAPSHOT_EVERY, snapshot_interval
from tests.runtime.convoy_helpers import alone
from tests.synthetic import synthetic_path

RECURRENT = ["lfm2", "granitehybrid", "falcon-h1"]
BATCH, EVERY = 4, 8  # small files: a snapshot every 8 tokens, on a grid of 4


def _settings(turn: int) -> SamplingSettings:
    if turn % 2:
        return SamplingSettings(temperature=0.0, seed=1)
    return SamplingSettings(temperature=0.8, top_k=40, seed=30 + turn)


def _model(name: str, **options) -> kinetic.Model:
    model = kinetic.Model(synthetic_path(name), n_ctx=128, batch=BATCH, **options)
    model.warm.snapshot_tokens = EVERY
    return model


def _cold_tokens(model, prompt: list[int], settings, max_tokens: int = 5) -> tuple[int, ...]:
    cold = Generator(model.engine, model.tokenizer, draft=False, warm=None)
    return alone(cold, GenerationRequest(tuple(prompt), settings, max_tokens)).tokens


def _warm_tokens(model, prompt: list[int], settings, *, fresh: bool, max_tokens: int = 5) -> tuple[tuple, int]:
    """The tokens of `prompt` run through the Model (fresh: on a new sequence, so only stored
    snapshots can help) and its cached prompt tokens."""
    if fresh:
        model._spare = None
    model.generate(prompt, max_tokens=max_tokens, sampling=settings)
    return tuple(model.last_stats.tokens), model.last_stats.cached_tokens


@pytest.mark.parametrize("fresh", [True, False])
@pytest.mark.parametrize("name", RECURRENT)
def test_recurrent_conversation_warm_equals_cold(name, fresh):
    """Each turn of a 4-turn conversation (and a turn branching off it) run warm, greedy and seeded,
    gives the cold run's tokens; on a fresh sequence every later turn starts from a stored snapshot
    (cached > 0, at a snapshot point)."""
    model = _model(name)
    rng = np.random.default_rng(17)
    vocab = min(model.engine.n_vocab, 200)
    prompt = [int(t) for t in rng.integers(1, vocab, size=13)]
    cached = []
    for turn in range(4):
        warm, n = _warm_tokens(model, prompt, _settings(turn), fresh=fresh)
        assert warm == _cold_tokens(model, prompt, _settings(turn)), f"turn {turn + 1}"
        cached.append(n)
        prompt = prompt + list(warm) + [int(t) for t in rng.integers(1, vocab, size=4)]
    branch = prompt[:19] + [int(t) for t in rng.integers(1, vocab, size=6)]
    warm, n = _warm_tokens(model, branch, _settings(1), fresh=fresh)
    assert warm == _cold_tokens(model, branch, _settings(1))
    if fresh:
        assert all(c > 0 and c % EVERY == 0 for c in cached[1:]), cached
        assert n == 16  # the snapshot at 16 of the 19 shared tokens


@pytest.mark.parametrize("name", RECURRENT)
def test_recurrent_restart_restores_snapshots_from_disk(name, tmp_path):
    """A new Model on the same cache directory restores a snapshot an earlier one wrote and gives the
    cold tokens; with the files corrupted it restores nothing and still gives them."""
    first = _model(name, cache_dir=tmp_path)
    rng = np.random.default_rng(23)
    vocab = min(first.engine.n_vocab, 200)
    prompt = [int(t) for t in rng.integers(1, vocab, size=21)]
    first.generate(prompt, max_tokens=5, sampling=_settings(0))
    first.warm.disk.flush()
    longer = prompt + list(first.last_stats.tokens) + [int(t) for t in rng.integers(1, vocab, size=3)]
    cold = _cold_tokens(first, longer, _settings(1))

    second = _model(name, cache_dir=tmp_path)
    assert _warm_tokens(second, longer, _settings(1), fresh=True) == (cold, 24)
    second.warm.disk.flush()
    for file in tmp_path.glob("*.kwarm"):
        data = bytearray(file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        file.write_bytes(data)
    third = _model(name, cache_dir=tmp_path)
    assert _warm_tokens(third, longer, _settings(1), fresh=True) == (cold, 0)


def test_snapshot_interval_grows_with_the_snapshot():
    """Snapshots come every 256 tokens (a multiple of the batch), or at the smallest multiple of that
    whose KV rows outweigh the recurrent states."""
    assert snapshot_interval(state_bytes=10_000, row_bytes=20_000, batch=128) == SNAPSHOT_EVERY
    assert snapshot_interval(state_bytes=10_000, row_bytes=20_000, batch=96) == 768
    big = 3 * SNAPSHOT_EVERY * 20_000 + 1
    assert snapshot_interval(state_bytes=big, row_bytes=20_000, batch=128) == 4 * SNAPSHOT_EVERY
    assert snapshot_interval(state_bytes=SNAPSHOT_EVERY * 2048, row_bytes=0, batch=128) == 2 * SNAPSHOT_EVERY
