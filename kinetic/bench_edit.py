"""The edit test of `kinetic bench`: a greedy chat answer that repeats its prompt, drafted and plain.

Owns: the edit request (a file with one rename to make, sent back whole), running it on Kinetic's
engine through SpeculativeDecoder (RAD-1 drafting, unless --off rad1, then plain decoding), the
`EditResult` that says whether both answers are identical, and the clock both sides of `--compare`
time it with (`FirstToLast`, `rate`).
Does not own: pp/tg timing and model loading (kinetic.bench), the reports (kinetic.bench_report,
kinetic.bench_card), llama.cpp's side of the test (kinetic.bench_llama_edit).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

EDIT_TOKENS = 256
EDIT_SKIPPED = "not measured: skipped"
# The edit test's request (docs/benchmarks.md): rename one variable, send the whole file back.
EDIT_FILE = """\
def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "paid":
            total += order.amount
            count += 1
    average = total / count if count else 0.0
    return {"total": total, "count": count, "average": average}


def report(orders):
    summary = summarize(orders)
    lines = [f"orders: {summary['count']}", f"total: {summary['total']:.2f}"]
    lines.append(f"average: {summary['average']:.2f}")
    return "\\n".join(lines)
"""
EDIT_REQUEST = (
    "Rename the variable `total` to `paid_total` in this Python file. Reply with the whole file, "
    "changed, and nothing else.\n\n```python\n" + EDIT_FILE + "```"
)


@dataclass
class EditResult:
    """The edit test: its tokens drafted (RAD-1, unless --off rad1) and plain, and the best speeds."""

    limit: int
    drafted: bool  # RAD-1 ran (not --off rad1)
    tokens: list[int]  # the drafted run's answer, as the decoder yields it (the end-of-turn token included)
    plain_tokens: list[int]
    seconds: list[float]  # per run, first to last token
    plain_seconds: list[float]
    guessed: int = 0  # RAD-1's guessed rows and the guesses kept, in the last drafted run
    kept: int = 0
    text: str = ""  # the drafted answer, without the end-of-turn token (to compare with llama-server's)
    prompt_tokens: int = 0

    @property
    def identical(self) -> bool:
        return self.tokens == self.plain_tokens

    @property
    def best(self) -> float:
        return rate(len(self.tokens), min(self.seconds))

    @property
    def plain_best(self) -> float:
        return rate(len(self.plain_tokens), min(self.plain_seconds))


def rate(n_tokens: int, seconds: float) -> float:
    """Tokens after the first over the time from the first to the last (the first comes with the prompt)."""
    return (n_tokens - 1) / seconds if n_tokens > 1 and seconds > 0 else 0.0


def edit_prompt(model) -> list[int]:
    """The edit request through the model's chat template, as `kinetic run` and the server build it."""
    text = model.apply_chat_template([{"role": "user", "content": EDIT_REQUEST}], add_generation_prompt=True)
    return model.tokenize(text, add_special=True, parse_special=True)


def run_edit(model, n_edit: int, repetitions: int, draft: bool) -> EditResult:
    """The edit test, greedy: `repetitions` runs with RAD-1 (plain with --off rad1), then as many plain.

    Each run gets a fresh decoder with an empty index of seen requests, so no run can draft from an
    earlier run's answer: every run is a first request. Pass costs are shared (they describe the machine);
    one untimed run first warms the drafted passes' code, as pp and tg have their warm-up.
    """
    from kinetic.runtime.drafting import PassCosts

    prompt, costs = edit_prompt(model), PassCosts()
    _time_edit(model, prompt, min(n_edit, 32), draft, costs)  # untimed: warms the drafted passes' code
    drafted = [_time_edit(model, prompt, n_edit, draft, costs) for _ in range(repetitions)]
    plain = [_time_edit(model, prompt, n_edit, False, costs) for _ in range(repetitions)]
    tokens, _, stats = drafted[-1]
    eot = set(model.tokenizer.eot_ids)
    text = model.detokenize([t for t in tokens if t not in eot])
    return EditResult(
        n_edit,
        draft,
        tokens,
        plain[-1][0],
        [d[1] for d in drafted],
        [p[1] for p in plain],
        stats.drafted,
        stats.accepted,
        text,
        len(prompt),
    )


def _time_edit(model, prompt: list[int], n_edit: int, draft: bool, costs):
    """One greedy answer through SpeculativeDecoder: (its tokens, seconds from first to last, stats)."""
    from kinetic.runtime.drafting import SEEN_BUDGET, SEEN_ORDERS, SEEN_SLOT_BITS, NgramIndex
    from kinetic.runtime.speculative import SpeculativeDecoder

    seen = NgramIndex(SEEN_BUDGET, SEEN_ORDERS, SEEN_SLOT_BITS)
    decoder = SpeculativeDecoder(model.engine, draft=draft, seen=seen, costs=costs)
    stop = set(model.tokenizer.eot_ids)
    tokens, clock = [], FirstToLast()
    gc.collect()
    for token in decoder.generate(model.engine.new_sequence(), prompt, n_edit, stop=stop):
        clock.tick()
        tokens.append(token)
    return tokens, clock.seconds, decoder.stats


class FirstToLast:
    """The edit test's clock, the same for Kinetic and llama-server: `tick()` as each token arrives
    (Kinetic: as the decoder yields it; llama-server: as its streamed chunk is read); `seconds` is the
    time from the first arrival to the last. The first token comes with the prompt, so speed is
    (tokens - 1) / seconds (`rate`)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0

    def tick(self) -> None:
        self.last = time.perf_counter()
        if self.first is None:
            self.first = self.last

    @property
    def seconds(self) -> float:
        return self.last - self.first if self.first is not None else 0.0
