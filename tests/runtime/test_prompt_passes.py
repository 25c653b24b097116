"""A prompt's passes: where they end (engine.prompt_passes, against the greedy merge of grid chunks it
stands for) and the one loop that feeds them (Engine.prompt_steps), as Engine.prefill, Engine.feed and
a stepped generation see it, on the synthetic llama file through the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.runtime.engine import Engine, prompt_passes
from kinetic.runtime.weights import GGUFWeights
from tests.synthetic import synthetic_path

PROMPT = [1, 54, 35, 82, 11, 7, 19, 23, 5, 17, 29, 41, 53, 65, 7, 19, 3, 8, 13, 21]  # 20 tokens


def grid_chunks(start: int, n: int, batch: int) -> list[tuple[int, int]]:
    """The grid's chunks (from, to) of n tokens fed after `start`, the long way: cut at every multiple
    of `batch` counted from position 0 inside (start, start + n)."""
    if n <= 0:
        return []
    cuts = [start, *range((start // batch + 1) * batch, start + n, batch), start + n]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def test_grid_chunks_end_on_multiples_of_the_batch():
    """The oracle's chunks end at multiples of the batch counted from position 0, the last at the
    prompt's end; and passes of `batch` rows are those chunks."""
    assert grid_chunks(0, 300, 128) == [(0, 128), (128, 256), (256, 300)]
    assert grid_chunks(130, 300, 128) == [(130, 256), (256, 384), (384, 430)]
    assert grid_chunks(256, 128, 128) == [(256, 384)]
    assert grid_chunks(5, 0, 128) == []
    for start, n in ((0, 300), (130, 300), (256, 128), (5, 0), (7, 1000)):
        assert list(prompt_passes(start, n, 128, 128)) == grid_chunks(start, n, 128)


def merged_chunks(start: int, n: int, batch: int, pass_rows: int) -> list[tuple[int, int]]:
    """The plan the long way: every grid chunk, merged into the pass before it while that pass stays
    within pass_rows rows."""
    passes: list[tuple[int, int]] = []
    for lo, hi in grid_chunks(start, n, batch):
        if passes and hi - passes[-1][0] <= pass_rows:
            passes[-1] = (passes[-1][0], hi)
        else:
            passes.append((lo, hi))
    return passes


def test_prompt_passes_are_grid_chunks_merged_greedily():
    """Each pass takes as many whole grid chunks as fit in pass_rows (a longer chunk alone), for any
    start, length, grid and pass size, so every pass ends at a grid point or the prompt's end."""
    cases = [(start, n, batch, rows) for batch in (1, 3, 4, 7) for rows in (1, 2, batch, batch + 1, 3 * batch, 13)
             for start in range(3 * batch + 2) for n in range(1, 5 * batch + 3)]
    rng = np.random.default_rng(0)
    cases += [(int(rng.integers(0, 4096)), int(rng.integers(1, 4096)), 128, int(rows))
              for rows in rng.choice([64, 128, 129, 300, 512, 1000], 300)]
    for case in cases:
        assert list(prompt_passes(*case)) == merged_chunks(*case), case
    assert list(prompt_passes(130, 900, 128, 512)) == [(130, 640), (640, 1030)]
    assert list(prompt_passes(5, 0, 128, 512)) == []


@pytest.fixture(scope="module")
def engine() -> Engine:
    """A grid of 4 and prompt passes of up to 8 rows (two chunks), on the reference interpreter."""
    gguf = open_gguf(synthetic_path("llama"))
    return Engine(lower(gguf), GGUFWeights(gguf), n_ctx=64, batch=4, prompt_pass=8, device="reference")


def drive(engine: Engine, steps, between=None) -> tuple[list, object]:
    """Runs each pass the steps ask for alone, calling between(part) after it; (the parts, the return value)."""
    parts = []
    while True:
        try:
            part = next(steps)
        except StopIteration as end:
            return parts, end.value
        engine.run([part])
        parts.append(part)
        if between is not None:
            between(part)


def test_prompt_steps_follow_the_plan_and_only_the_last_row_gives_logits(engine):
    """prefill's steps are the plan's passes from where the sequence stands; only the last pass has
    an output row (its last), with the asked Shortlist top, and its logits are what prefill returns.
    feed's steps are the same passes with no output row, and return None."""
    warm = engine.new_sequence()
    engine.feed(warm, PROMPT[:3])
    parts, logits = drive(engine, engine.prompt_steps(warm, PROMPT[3:], top=2))
    spans = [(int(p.rows.positions[0]), int(p.rows.positions[-1]) + 1) for p in parts]
    assert spans == list(prompt_passes(3, len(PROMPT) - 3, 4, 8)) == [(3, 8), (8, 16), (16, 20)]
    assert [p.rows.output_rows.tolist() for p in parts] == [[], [], [3]]
    assert [p.top for p in parts] == [0, 0, 2]
    assert logits.shape == (engine.n_vocab,) and np.array_equal(logits, parts[-1].logits[-1])
    fed = engine.new_sequence()
    parts, nothing = drive(engine, engine.prompt_steps(fed, PROMPT, logits=False))
    assert nothing is None and all(len(p.rows.output_rows) == 0 for p in parts)
    assert fed.tokens == PROMPT and fed.cache.length == len(PROMPT)
    with pytest.raises(ValueError, match="at least one token"):
        next(engine.prompt_steps(engine.new_sequence(), []))


def test_each_pass_is_sized_when_it_is_asked_for(engine):
    """The steps ask next_pass before every pass, so a prompt bound set between passes (Convoy's,
    Sequence.prompt_pass) sizes the next one: here one grid chunk a pass after the first pass."""
    seq = engine.new_sequence()

    def bound(part) -> None:
        seq.prompt_pass = engine.batch

    parts, _ = drive(engine, engine.prompt_steps(seq, PROMPT), between=bound)
    assert [len(p.rows.tokens) for p in parts] == [8, 4, 4, 4]


def test_prompt_steps_give_the_same_logits_whatever_the_pass_size(engine):
    """prefill in passes of two chunks, in one chunk a pass, and as feed then one decode step all give
    the last token bit for bit the same logits and the same cache."""
    runs = []
    for rows in (8, 4):
        engine.prompt_pass, seq = rows, engine.new_sequence()
        runs.append((engine.prefill(seq, PROMPT), seq))
    engine.prompt_pass, fed = 8, engine.new_sequence()
    engine.feed(fed, PROMPT[:-1])
    runs.append((engine.decode(fed, PROMPT[-1]), fed))
    (logits, seq), *others = runs
    for other_logits, other in others:
        assert np.array_equal(logits, other_logits) and other.tokens == seq.tokens
        for layer in seq.cache.k:
            assert np.array_equal(seq.cache.k[layer][:len(PROMPT)], other.cache.k[layer][:len(PROMPT)])
