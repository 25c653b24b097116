"""`kinetic run`'s status line: RAD-1's acceptance per drafter when drafting ran."""

from __future__ import annotations

import argparse

import pytest

from kinetic.cli.run_cmd import drafts_kept, status_line
from tests.synthetic import synthetic_path


def _args() -> argparse.Namespace:
    return argparse.Namespace(device="cpu", context=argparse.Namespace(tokens=256, why="-c"))


def test_drafts_kept_gives_the_share_in_all_and_per_drafter_most_guesses_first():
    """drafts_kept is the kept share of all guesses, then each drafter's, the one with most guesses first."""
    assert drafts_kept({"mtp": (25, 3), "context": (100, 70)}) == "; drafts kept 58% (context 70%, mtp 12%)"


def test_nothing_drafted_adds_nothing_to_the_status_line():
    """Without guesses (drafting off, or nothing to draft from) the status line has no drafts part."""
    assert drafts_kept({}) == ""
    assert "drafts" not in status_line(10, 1.0, 5, 1.0, _args(), drafts={"context": (0, 0)})


@pytest.fixture(scope="module")
def model():
    import kinetic

    return kinetic.Model(synthetic_path("llama"), n_ctx=256, warm_start=False)


def test_the_status_line_after_a_drafted_answer_shows_the_context_drafters_share(model):
    """After an answer that repeats (the synthetic model's greedy answer to a repeating prompt), the
    status line built from Model.last_stats names the context drafter and its kept share."""
    model.generate([5, 6, 7, 8] * 8, max_tokens=40, return_tokens=True)
    stats = model.last_stats
    guessed, kept = stats.draft_sources["context"]
    line = status_line(stats.generated_tokens, stats.generate_seconds, stats.prompt_tokens, stats.prompt_seconds,
                       _args(), drafts=stats.draft_sources)
    assert kept > 0
    assert f"context {100 * kept / guessed:.0f}%" in line
    assert line.endswith("%)]") and "; drafts kept " in line
