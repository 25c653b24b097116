"""Warm Start's memory soak: under 200 different prompts the memory tier stays within its bound by its
own accounting and the disk tier's files within theirs, and answers stay the cold ones; with small
bounds on synthetic files (a KV model and a recurrent one), and at the real bounds (1 GiB, 2 GiB) on
SmolLM2 (slow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kinetic
from kinetic.runtime.generation import GenerationRequest, Generator
from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.warm import DEFAULT_MEMORY_BYTES, WarmStore
from kinetic.runtime.warm_disk import DEFAULT_LIMIT_BYTES, SUFFIX, DiskTier
from tests.conftest import model_path
from tests.runtime.convoy_helpers import alone
from tests.synthetic import synthetic_path

GREEDY = SamplingSettings(temperature=0.0, seed=1)


def _disk_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.iterdir() if f.name.endswith(SUFFIX))


def _soak(generator: Generator, store: WarmStore, prompts: list[list[int]], *, check_every: int) -> None:
    """Runs every prompt warm (a fresh sequence each, so only the stores help), checking both bounds
    after each and every `check_every`-th answer against a cold run."""
    cold = Generator(generator.engine, generator.tokenizer, draft=False, warm=None)
    for i, prompt in enumerate(prompts):
        request = GenerationRequest(tuple(prompt), GREEDY, 2)
        warm = alone(generator, request)
        assert store.memory_used <= store.memory_bytes, f"prompt {i}: memory tier over its bound"
        store.disk.flush()
        assert _disk_bytes(store.disk.directory) <= store.disk.limit_bytes, f"prompt {i}: disk tier over its bound"
        if i % check_every == 0:
            assert warm.tokens == alone(cold, request).tokens, f"prompt {i}"


@pytest.mark.parametrize("name", ["llama", "lfm2"])
def test_small_bounds_hold_over_200_prompts(name, tmp_path):
    """With bounds of a few states (memory) and a few files (disk), 200 different prompts sharing
    prefixes in families never take more than either bound, both tiers evict, and answers equal the
    cold ones."""
    model = kinetic.Model(synthetic_path(name), n_ctx=64, batch=4)
    engine = model.engine
    row_bytes = 2 * sum(engine.kv_width.values()) * np.dtype(engine.kv_dtype).itemsize
    state_bytes = sum(rows * width * 4 for rows, width in engine.recurrent_shapes.values())
    disk = DiskTier(tmp_path, limit_bytes=6 * (48 * row_bytes + state_bytes + 4096))
    store = WarmStore("ab" * 16, batch=4, memory_bytes=3 * (40 * row_bytes + state_bytes), disk=disk,
                      snapshot_tokens=8)
    generator = Generator(engine, model.tokenizer, draft=False, warm=store)
    rng = np.random.default_rng(29)
    vocab = min(engine.n_vocab, 200)
    stems = [[int(t) for t in rng.integers(1, vocab, size=12)] for _ in range(10)]
    prompts = [stems[i % 10] + [int(t) for t in rng.integers(1, vocab, size=int(rng.integers(5, 40)))]
               for i in range(200)]
    _soak(generator, store, prompts, check_every=10)
    assert disk.stats["evicted"] > 0 and len(store) > 0
    assert sum(generator_cached(generator, p) for p in prompts[-10:]) > 0


def generator_cached(generator: Generator, prompt: list[int]) -> int:
    """Prompt tokens a fresh sequence starts with for `prompt` (from the stores)."""
    seq = generator.engine.new_sequence()
    return generator.resume(seq, prompt)


@pytest.mark.slow
def test_real_bounds_hold_over_200_prompts_on_smollm2(tmp_path):
    """At the real bounds (memory 1 GiB by the store's accounting, disk 2 GiB of files), 200 different
    prompts of about 300 tokens (over 1 GiB of states in all) on SmolLM2 stay within both bounds,
    and sampled answers equal the cold ones."""
    model = kinetic.Model(model_path("smollm2-135m"), n_ctx=512, threads=2, cache_dir=tmp_path)
    store = model.warm
    assert store.memory_bytes == DEFAULT_MEMORY_BYTES and store.disk.limit_bytes == DEFAULT_LIMIT_BYTES
    generator = Generator(model.engine, model.tokenizer, draft=False, warm=store)
    rng = np.random.default_rng(31)
    prompts = [[int(t) for t in rng.integers(100, 40000, size=int(rng.integers(260, 340)))] for _ in range(200)]
    _soak(generator, store, prompts, check_every=40)
    assert store.memory_used > DEFAULT_MEMORY_BYTES // 2  # the soak filled the tier
