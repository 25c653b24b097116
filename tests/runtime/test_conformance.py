"""Kinetic's greedy tokens against llama.cpp's, on both real models.

Two references: llama-server's golden continuations (tests/data/golden, prompts run through
llama.cpp's batch kernels), where agreement must hold up to near-ties; and llama.cpp's one-token
decode path on the same tokens (tests/data/reference, from scripts/reference_decode.py), which
Kinetic's numerics follow for every row: there the top two logits must be equal bit for bit.

Teacher forcing: each case runs as one pass over the golden prompt and llama.cpp's continuation. The
engine gives every row of a pass what it gets one token at a time (tests/runtime/test_engine.py), so
the argmax at each row is what greedy decoding would pick after that prefix, and the agreement up to
the first divergence is the greedy agreement. scripts/conformance.py runs the same check by
decoding token by token and prints the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kinetic
from kinetic.ir.rows import PassRows
from kinetic.runtime.conformance import compare
from kinetic.runtime.engine import Engine
from tests.conftest import load_golden, model_path

MODELS = ("smollm2-135m", "gemma3-270m")
REFERENCE = Path(__file__).parent.parent / "data" / "reference"
# Cases where llama-server's golden tokens came from llama.cpp's prompt-batch kernels (Q4_K rows in
# tiles of four, the Q6_K batch path), which round differently from its decode path; Kinetic follows
# the decode path for every row and matches it bit for bit (test_top2_logits_equal_llama_cpp_decode).
BATCH_KERNEL_CASES = {("gemma3-270m", "raw", 1), ("gemma3-270m", "raw", 2), ("gemma3-270m", "chat", 1)}
CASES = [
    pytest.param(m, kind, i, id=f"{m}-{kind}{i}", marks=pytest.mark.xfail(
        strict=True, reason="golden prompt ran through llama.cpp's batch kernels")
        if (m, kind, i) in BATCH_KERNEL_CASES else ())
    for m in MODELS for kind in ("raw", "chat") for i in range(len(load_golden(m)[kind]))
]
_ENGINES: dict[str, Engine] = {}


def engine_for(name: str) -> Engine:
    if name not in _ENGINES:
        _ENGINES.clear()  # one model's dequantized weights in memory at a time
        _ENGINES[name] = kinetic.Model(model_path(name), n_ctx=256).engine
    return _ENGINES[name]


def teacher_forced(name: str, tokens: list[int], n_prompt: int) -> np.ndarray:
    """Logits f32 [steps, n_vocab] after the prompt and after each following token, in one pass."""
    engine = engine_for(name)
    rows = PassRows.chain(tokens, 0, outputs="all")
    rows.output_rows = np.arange(n_prompt - 1, len(tokens), dtype=np.int32)
    return engine.forward(rows, {0: engine.new_sequence()}, commit=False)


@pytest.mark.parametrize(("name", "kind", "index"), CASES)
def test_greedy_agrees_with_llama_cpp_up_to_near_ties(name, kind, index):
    case = load_golden(name)[kind][index]
    prompt, reference = case["prompt_ids"], case["ids"]
    logits = teacher_forced(name, prompt + reference[:-1], len(prompt))
    ours = [int(t) for t in logits.argmax(axis=1)]
    result = compare(ours, reference, case["top2"])
    assert result.ok, (f"{name} {kind}[{index}]: {result.agreed}/{result.total} agree, diverges at step "
                       f"{result.diverged_at} where llama.cpp's top-2 gap is {result.gap:.3f} nats")


DECODE_CASES = [(m, c) for m in MODELS for c in json.loads((REFERENCE / f"{m}.json").read_text())["cases"]]


@pytest.mark.parametrize(("name", "case_id"), DECODE_CASES, ids=[f"{m}-{c}" for m, c in DECODE_CASES])
def test_top2_logits_equal_llama_cpp_decode(name, case_id):
    """At every step, the two likeliest tokens and their logits equal llama.cpp's decode path bit for bit."""
    case = json.loads((REFERENCE / f"{name}.json").read_text())["cases"][case_id]
    logits = teacher_forced(name, case["tokens"], case["prompt_tokens"])
    for step, (a, logit_a, b, logit_b) in enumerate(case["top2"]):
        assert int(logits[step].argmax()) == a, f"step {step}"
        assert (logits[step, a], logits[step, b]) == (np.float32(logit_a), np.float32(logit_b)), f"step {step}"
