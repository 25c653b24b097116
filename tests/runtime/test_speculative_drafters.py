"""RAD-1's drafters and policy (kinetic/runtime/drafting.py): the n-gram index stays within its memory,
the context drafter's branches, the policy's backoff and gate, and the pass costs it learns from
(a median of CPU time, forgetting old samples)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from kinetic.runtime.drafting import (
    CONTEXT_ORDERS,
    ContextDrafter,
    DraftPolicy,
    DraftTree,
    NgramIndex,
    PassCosts,
    Proposal,
    build_tree,
)
from kinetic.runtime.speculative import DraftStats, GreedyPicker, SpeculativeDecoder
from tests.runtime.speculative_helpers import one_hot


def test_index_stays_within_its_memory_bound():
    """The index allocates its memory once: feeding ten times its budget neither grows it nor drafts
    from overwritten tokens, and the newest tokens still draft."""
    index = NgramIndex(budget=1000, orders=(3, 2))
    size = index.nbytes
    rng = np.random.default_rng(0)
    old = [7, 8, 9, 10, 11]
    index.extend(old + rng.integers(100, 50000, 10_000).tolist())
    recent = [21, 22, 23, 24, 25]
    index.extend(recent + rng.integers(100, 50000, 50).tolist())
    assert index.nbytes == size
    assert index.continuations([7, 8, 9], 2) == (0, [])
    assert index.continuations([21, 22, 23], 2) == (3, [[24, 25]])


def test_index_appended_token_by_token_equals_appended_at_once():
    """Building the index one token at a time or in one call gives the same lookups."""
    tokens = np.random.default_rng(1).integers(0, 6, 300).tolist()
    one, many = NgramIndex(128, orders=CONTEXT_ORDERS), NgramIndex(128, orders=CONTEXT_ORDERS)
    one.extend(tokens)
    for t in tokens:
        many.extend([t])
    for end in range(10, 300, 7):
        query = tokens[end - 8 : end]
        assert one.continuations(query, 5) == many.continuations(query, 5)


def test_context_drafter_branches_on_disagreeing_occurrences():
    """The latest occurrence drafts first; an earlier one with another continuation becomes a branch."""
    drafter = ContextDrafter(64, orders=(2,))
    context = [1, 2, 3, 4, 9, 1, 2, 5, 6, 9, 1, 2]
    proposal = drafter.propose(context, 3)
    assert proposal == Proposal("context/2", [[5, 6, 9], [3, 4, 9]])
    tree = build_tree(2, proposal.branches, rows=3, spare=1)
    assert tree == DraftTree([2, 5, 6, 9, 3], [-1, 0, 1, 2, 0])


def test_context_drafter_continues_a_loop_whose_halves_differ_in_one_token():
    """In a loop of two halves that differ only in their first token (Gemma 3's edit256 answer is one),
    the default drafter continues from a whole period back, where the last 4 tokens would pick the
    other half's occurrence and guess its first token wrong."""
    half = [10, 11, 12, 13, 14, 15, 16]
    context = ([1, *half, 2, *half] * 3)[:-2]  # ... 2 10 11 12 13 14: next comes 15 16 1 10 ...
    proposal = ContextDrafter(256).propose(context, 6)
    assert proposal.branches[0] == [15, 16, 1, 10, 11, 12]


def test_policy_backs_off_longer_after_each_outright_miss():
    """Drafted passes that keep nothing pause drafting for 2, 4, 8 steps; a kept guess ends the backoff."""
    policy = DraftPolicy(PassCosts())
    proposal = Proposal("context/4", [[1, 2]])
    pauses = []
    for _ in range(3):
        policy.record([proposal], [9], drafted=True, accepted=0)
        pauses.append(policy.pause)
        while not policy.ready():
            pass
    assert pauses == [2, 4, 8]
    policy.record([proposal], [1, 2, 3], drafted=True, accepted=2)
    policy.record([proposal], [9], drafted=True, accepted=0)
    assert policy.pause == 2


def test_policy_gates_on_acceptance_against_verify_cost():
    """A source that is rarely right does not draft when rows are expensive; a reliable one drafts
    longer when rows are cheap."""
    good, bad = Proposal("context/4", [list(range(16))]), Proposal("seen/2", [[1]])
    policy = DraftPolicy(PassCosts(beta=0.45))
    for _ in range(10):
        policy.record([good, bad], list(range(6)) + [99], drafted=False, accepted=0)  # good: a = 6/7
    assert policy.choose([bad], room=16) is None
    chosen, rows_dear, spare_dear = policy.choose([good, bad], room=16)
    assert chosen is good and spare_dear == 0
    cheap = DraftPolicy(PassCosts(beta=0.02))
    cheap.score = policy.score
    _, rows_cheap, spare_cheap = cheap.choose([good], room=16)
    assert rows_cheap > rows_dear and spare_cheap > 0


def test_a_guess_pays_for_the_answers_it_slows_down():
    """Beside N - 1 other answers (Convoy) k guessed rows lengthen every answer's pass, so the gate
    weighs the pass's tokens (N - 1 + e(k)) against the N-row pass's cost: a source right 80 % of the
    time drafts 2 rows alone and 1 beside one other answer, none among 4 (beta 0.45); a source almost
    always right (a repeated answer) still drafts among 4. Passes shared with others teach no costs."""
    fair, sure = Proposal("context/4", [list(range(16))]), Proposal("seen/4", [list(range(16))])
    costs = PassCosts(beta=0.45)
    policy = DraftPolicy(costs)
    policy.score = {"context/4": [8.0, 10.0], "seen/4": [99.0, 100.0]}
    rows = {}
    for company in (1, 2, 4):
        costs.company = company
        choice = policy.choose([fair], room=16)
        rows[company] = 0 if choice is None else choice[1]
        assert policy.choose([sure], room=16) is not None
    assert rows == {1: 2, 2: 1, 4: 0}
    costs.observe(0, 0.005)
    costs.observe(2, 0.5)
    assert costs.plain is None and not costs.samples  # company 4: not priced
    costs.company = 1
    costs.observe(0, 0.005)
    assert costs.plain == 0.005


def test_pass_costs_resist_one_slow_pass_and_forget_old_ones():
    """beta is a median, so one pass slowed by another process does not move it; samples expire, so
    a beta measured under a passing load does not stop drafting for good."""
    costs = PassCosts()
    costs.observe(0, 0.005)
    for seconds in (0.0095, 0.0095, 0.5, 0.0095):  # 2 guessed rows: 1.9 steps, once 100 steps
        costs.observe(2, seconds)
    assert costs.beta == pytest.approx(0.45)
    costs.MAX_AGE = 0.0  # as if 20 s had passed
    assert costs.beta == costs.prior


def test_a_pass_costs_the_cpu_time_it_took_not_the_time_it_waited():
    """On the CPU the decoder prices a pass by the CPU time the process spent on it: drafted passes
    that waited (asleep, as behind another process's load) without working do not make rows look dear."""
    cpu_engine = SimpleNamespace(device="cpu", keep=lambda seq, path: None)
    decoder = SpeculativeDecoder(cpu_engine, seen=NgramIndex(64, (2,)), costs=PassCosts())
    seq = SimpleNamespace(cache=SimpleNamespace(length=0))

    def run(choice, work: float, wait: float, n_rows: int) -> None:
        steps = decoder._pass(seq, 1, choice, GreedyPicker(), left=8, stop=(), stats=DraftStats())
        want = next(steps)
        began = time.process_time()
        while time.process_time() - began < work:
            pass
        time.sleep(wait)
        want.logits = one_hot(*[2] * n_rows)
        with pytest.raises(StopIteration):
            steps.send(None)

    run(None, work=0.002, wait=0.0, n_rows=1)  # a plain step: 2 ms of work
    for _ in range(3):
        run((Proposal("context/2", [[2, 2]]), 2, 0), work=0.0, wait=0.1, n_rows=3)  # 2 guessed rows
    assert decoder.costs.beta < 0.2
