"""Every device runs every synthetic file of every registered family (each shape) as the
reference interpreter does: the same logits bit for bit, a row in a pass equal to the row alone, and
drafted decoding equal to plain. A device whose kernels do not cover a file (a weight type without a
kernel) or that is not available here is skipped with its reason."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from kinetic import devices
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.rows import PassRows
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.device_checks import REPEATING, FixedCosts, check_tree_rows_equal_paths, greedy, same_bits, same_cache
from tests.synthetic import SYNTHETIC, synthetic_files, synthetic_path

FILES = synthetic_files()
DEVICES = ("cpu", "cuda-emulated", "vulkan")
N_CTX = 64


@functools.cache
def _model(name: str):
    gguf = open_gguf(synthetic_path(name))
    graph = lower(gguf)
    layers = sorted({n.attrs.layer for n in graph.nodes if n.op.value == "state"})
    prompt = np.load(SYNTHETIC / name / f"{name}.npz")["p0_ids"].tolist()
    return graph, GGUFWeights(gguf), (layers[0], layers[-1]), prompt


def _engine(name: str, device: str) -> Engine:
    graph, weights, _, _ = _model(name)
    d = devices.DEVICES[device]
    reason = d.unavailable() or d.unsupported(graph)
    if reason:
        pytest.skip(f"{device}: {reason}")
    return Engine(graph, weights, n_ctx=N_CTX, device=device, threads=1)


@functools.cache
def _reference(name: str):
    """The reference interpreter's prompt-then-2-greedy-tokens run: tokens, logits, cache."""
    graph, weights, _, prompt = _model(name)
    return greedy(Engine(graph, weights, n_ctx=N_CTX, device="reference"), prompt, 2)


def _check_drafted_equals_plain(engine: Engine, layers) -> None:
    """Drafted greedy decoding gives plain greedy's tokens and cache. A random model may take no
    guesses here, so the verify passes of guessed rows are checked deterministically beside it
    (check_tree_rows_equal_paths: a draft tree's rows equal their paths, keep() included)."""
    from kinetic.runtime.drafting import NgramIndex
    from kinetic.runtime.speculative import GreedyPicker, SpeculativeDecoder, plain_decode

    plain_seq = engine.new_sequence()
    plain = list(plain_decode(engine, plain_seq, REPEATING, 12, picker=GreedyPicker()))
    decoder = SpeculativeDecoder(engine, max_rows=4, seen=NgramIndex(1 << 12, (4, 2)), costs=FixedCosts())
    seq = engine.new_sequence()
    assert list(decoder.generate(seq, REPEATING, 12, picker=GreedyPicker())) == plain
    assert seq.cache.length == plain_seq.cache.length
    assert same_cache(seq.cache, plain_seq.cache, layers, seq.cache.length)
    check_tree_rows_equal_paths(engine, layers)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FILES)
def test_a_family_file_runs_on_the_device_as_on_the_reference(name, device):
    """Prompt then 2 greedy tokens: the reference's tokens, its logits bit for bit at every step and its
    cache bits; the prompt's first 4 rows in one pass equal each row decoded alone; drafted greedy
    decoding equals plain (cache included) and a draft tree's rows equal their paths."""
    engine = _engine(name, device)
    _, _, layers, prompt = _model(name)
    try:
        tokens, logits, seq = greedy(engine, prompt, 2)
        ref_tokens, ref_logits, ref_seq = _reference(name)
        assert tokens == ref_tokens
        assert all(same_bits(a, b) for a, b in zip(logits, ref_logits, strict=True))
        assert same_cache(seq.cache, ref_seq.cache, layers, seq.cache.length)

        whole = engine.new_sequence()
        batched = engine.forward(PassRows.chain(prompt[:4], 0, outputs="all"), {0: whole})
        alone = engine.new_sequence()
        assert same_bits(batched, np.stack([engine.decode(alone, t) for t in prompt[:4]]))
        assert same_cache(whole.cache, alone.cache, layers, 4)

        _check_drafted_equals_plain(engine, layers)
    finally:
        engine.close()
