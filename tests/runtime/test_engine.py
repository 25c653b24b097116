"""The engine's exactness contract on the real SmolLM2 model: batch = alone, tree rows = their path,
several sequences = each alone, rollback = never having gone ahead. The `engine` fixture's graph is
lowered without the pass pipeline, so its reductions take their ggml orders; `fast_engine` is the
model compiled in the "fast" numerics mode (kinetic/ir/orders.py), where batch = alone must hold too."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.compiler import compile_graph
from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.rows import PassRows
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights

PROMPT = [504, 3575, 282, 4649, 314, 7042, 30, 198, 198, 504]  # "The capital of France is Paris.\n\nThe"


@pytest.fixture(scope="module")
def engine(smollm2_path) -> Engine:
    gguf = open_gguf(smollm2_path)
    return Engine(lower(gguf), GGUFWeights(gguf), n_ctx=128)


@pytest.fixture(scope="module")
def fast_engine(smollm2_path) -> Engine:
    gguf = open_gguf(smollm2_path)
    graph = compile_graph(gguf, Options(numerics="fast"))
    assert {"block_chain", "key_chain_f16_acc32"} <= {getattr(n.attrs, "order", "") for n in graph.nodes}
    return Engine(graph, GGUFWeights(gguf), n_ctx=128)


@pytest.fixture(params=["engine", "fast_engine"])
def any_engine(request) -> Engine:
    """The engine in ggml's orders, then in the fast mode's."""
    return request.getfixturevalue(request.param)


def one_at_a_time(engine: Engine, tokens: list[int]) -> np.ndarray:
    seq = engine.new_sequence()
    return np.stack([engine.decode(seq, t) for t in tokens])


def test_batch_equals_one_at_a_time(any_engine):
    """A prompt in one pass gives every row bit for bit the logits it gets one token at a time."""
    engine = any_engine
    seq = engine.new_sequence()
    batched = engine.forward(PassRows.chain(PROMPT, 0, outputs="all"), {0: seq})
    alone = one_at_a_time(engine, PROMPT)
    assert np.array_equal(batched, alone)


def test_chunking_does_not_change_logits(engine):
    """Prompt chunks of 3 give the same last logits as one chunk."""
    seq_a, seq_b = engine.new_sequence(), engine.new_sequence()
    whole = engine.prefill(seq_a, PROMPT)
    saved = engine.batch, engine.prompt_pass
    engine.batch, engine.prompt_pass = 3, 3
    try:
        chunked = engine.prefill(seq_b, PROMPT)
    finally:
        engine.batch, engine.prompt_pass = saved
    assert np.array_equal(whole, chunked)
    assert seq_b.cache.length == len(PROMPT)


@pytest.mark.parametrize("numerics", ["ggml", "fast"])
def test_prompt_passes_of_512_rows_equal_passes_of_128(smollm2_path, numerics):
    """A 600-token prompt prefilled in passes of up to 512 rows (grid chunks of 128 run together)
    gives bit for bit the logits and KV rows of one pass a grid chunk, in fewer passes."""
    gguf = open_gguf(smollm2_path)
    graph = lower(gguf) if numerics == "ggml" else compile_graph(gguf, Options(numerics="fast"))
    engine = Engine(graph, GGUFWeights(gguf), n_ctx=640, batch=128, prompt_pass=512)
    prompt = [(t * 7919) % 40000 + 100 for t in range(600)]
    runs = {}
    for rows in (512, 128):
        engine.prompt_pass, seq, before = rows, engine.new_sequence(), engine.passes
        logits = engine.prefill(seq, prompt)
        runs[rows] = (logits, seq.cache, engine.passes - before)
    (merged, merged_cache, merged_passes), (chunked, chunked_cache, chunked_passes) = runs[512], runs[128]
    assert (merged_passes, chunked_passes) == (2, 5)  # 512 + 88 rows against 4 x 128 + 88
    assert np.array_equal(merged, chunked)
    for layer in chunked_cache.layers():
        for a, b in zip(merged_cache.committed(layer), chunked_cache.committed(layer), strict=True):
            assert np.array_equal(a, b)


def test_a_pass_without_output_rows_fills_the_cache_and_returns_no_logits(engine):
    """Prompt chunks before the last skip the output layer: no logits, the same cache as with them."""
    seq_a, seq_b = engine.new_sequence(), engine.new_sequence()
    none = engine.forward(PassRows.chain(PROMPT[:4], 0, outputs="none"), {0: seq_a})
    engine.forward(PassRows.chain(PROMPT[:4], 0), {0: seq_b})
    assert none.shape == (0, engine.n_vocab)
    assert np.array_equal(engine.decode(seq_a, PROMPT[4]), engine.decode(seq_b, PROMPT[4]))


def test_tree_rows_equal_their_paths(engine):
    """In a draft tree, each row gives what its own path gives decoded plainly."""
    prefix, a, b, c = PROMPT[:5], 7042, 3575, 30
    seq = engine.new_sequence()
    engine.prefill(seq, prefix)
    n = len(prefix)
    rows = PassRows(tokens=np.array([a, b, c], np.int32), positions=np.array([n, n, n + 1], np.int32),
                    seqs=np.zeros(3, np.int32), parents=np.array([-1, -1, 0], np.int32),
                    output_rows=np.arange(3, dtype=np.int32))
    tree = engine.forward(rows, {0: seq}, commit=False)
    assert seq.cache.length == n
    path_a = one_at_a_time(engine, prefix + [a])[-1]
    path_b = one_at_a_time(engine, prefix + [b])[-1]
    path_ac = one_at_a_time(engine, prefix + [a, c])[-1]
    assert np.array_equal(tree[0], path_a)
    assert np.array_equal(tree[1], path_b)
    assert np.array_equal(tree[2], path_ac)


def test_two_sequences_in_one_pass_equal_each_alone(any_engine):
    """Rows of two users in one pass give each user what it gets alone."""
    engine = any_engine
    s0, s1 = engine.new_sequence(), engine.new_sequence()
    first, second = PROMPT[:4], PROMPT[4:9]
    rows_0 = PassRows.chain(first, 0, seq=0, outputs="all")
    rows_1 = PassRows.chain(second, 0, seq=1, outputs="all")
    rows = PassRows(
        tokens=np.concatenate([rows_0.tokens, rows_1.tokens]),
        positions=np.concatenate([rows_0.positions, rows_1.positions]),
        seqs=np.concatenate([rows_0.seqs, rows_1.seqs]),
        parents=np.concatenate([rows_0.parents, np.where(rows_1.parents >= 0, rows_1.parents + len(first), -1)]),
        output_rows=np.arange(len(first) + len(second), dtype=np.int32),
    )
    both = engine.forward(rows, {0: s0, 1: s1})
    assert np.array_equal(both[: len(first)], one_at_a_time(engine, first))
    assert np.array_equal(both[len(first) :], one_at_a_time(engine, second))
    assert (s0.cache.length, s1.cache.length) == (len(first), len(second))


def test_rollback_equals_never_going_ahead(engine):
    """Rolling the cache back and decoding again gives the logits of the first time."""
    seq = engine.new_sequence()
    engine.prefill(seq, PROMPT[:6])
    first = engine.decode(seq, PROMPT[6])
    engine.decode(seq, PROMPT[7])
    engine.rollback(seq, 6)
    assert seq.cache.length == 6 and seq.tokens == PROMPT[:6]
    assert np.array_equal(engine.decode(seq, PROMPT[6]), first)


def test_context_full_is_a_clear_error(engine):
    """Going past -c fails with a KineticError that says what to do."""
    from kinetic.errors import KineticError

    small = Engine(engine.graph, engine.runner.weights, n_ctx=4)
    seq = small.new_sequence()
    with pytest.raises(KineticError, match="context is full"):
        small.prefill(seq, PROMPT[:5])


def test_oversized_context_is_refused_before_allocating(engine):
    """A context whose KV cache cannot fit in memory fails with a clear error, not a MemoryError."""
    from kinetic.errors import KineticError

    huge = Engine(engine.graph, engine.runner.weights, n_ctx=10**10)
    with pytest.raises(KineticError, match="Use a smaller context"):
        huge.new_sequence()
