"""RAD-1's acceptance rule (speculative.accept_draft): a verified draft tree is walked as plain decoding
would walk it, greedy and sampled, on hand-made logits."""

from __future__ import annotations

import numpy as np

from kinetic.runtime.drafting import DraftTree
from kinetic.runtime.speculative import GreedyPicker, accept_draft
from tests.runtime.speculative_helpers import InverseCdfPicker, one_hot


def test_accept_keeps_a_chain_the_model_agrees_with_and_adds_one():
    """Guesses equal to the top token are all kept, and the last row gives one more token."""
    tree = DraftTree([5, 1, 2], [-1, 0, 1])
    path, out = accept_draft(tree, one_hot(1, 2, 3), GreedyPicker(), limit=10, stop=())
    assert (path, out) == ([0, 1, 2], [1, 2, 3])


def test_accept_stops_at_the_first_mismatch_with_the_corrected_token():
    """The first guess the model disagrees with ends the walk; its token is the model's, the rest dropped."""
    tree = DraftTree([5, 1, 2, 3], [-1, 0, 1, 2])
    path, out = accept_draft(tree, one_hot(1, 4, 3, 3), GreedyPicker(), limit=10, stop=())
    assert (path, out) == ([0, 1], [1, 4])


def test_accept_follows_the_branch_the_model_picks():
    """In a tree, the walk moves to whichever child guessed the top token (here the second branch)."""
    tree = DraftTree([5, 1, 6, 7], [-1, 0, 0, 2])  # root -> 1 | root -> 6 -> 7
    path, out = accept_draft(tree, one_hot(6, 0, 7, 2), GreedyPicker(), limit=10, stop=())
    assert (path, out) == ([0, 2, 3], [6, 7, 2])


def test_accept_ends_at_a_stop_token_and_at_the_limit():
    """A stop token or the token limit ends generation even inside accepted guesses."""
    tree = DraftTree([5, 1, 2], [-1, 0, 1])
    assert accept_draft(tree, one_hot(1, 2, 3), GreedyPicker(), limit=10, stop={2}) == ([0, 1], [1, 2])
    assert accept_draft(tree, one_hot(1, 2, 3), GreedyPicker(), limit=2, stop=()) == ([0, 1], [1, 2])


def test_greedy_ties_go_to_the_lowest_id():
    """On a tie, greedy picks the lowest token id, as plain decoding's argmax does."""
    logits = np.zeros((1, 8), np.float32)
    logits[0, [3, 6]] = 2.0
    assert accept_draft(DraftTree([5], [-1]), logits, GreedyPicker(), limit=1, stop=()) == ([0], [3])


def test_sampled_acceptance_draws_one_number_per_generated_token():
    """Sampling draws exactly one uniform per generated token, whatever the tree holds."""
    rng_logits = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    picker = InverseCdfPicker(1.0, seed=3)
    tree = DraftTree([5, 1, 2, 3], [-1, 0, 1, 2])
    _, out = accept_draft(tree, rng_logits, picker, limit=10, stop=())
    reference = np.random.default_rng(3)
    for _ in out:
        reference.random()
    assert picker.rng.random() == reference.random()
