"""GET /metrics: Prometheus text under llama-server's `llamacpp:` names, so its dashboards work.

Counters since start: requests_total, prompt_tokens_total (prompt tokens run),
prompt_tokens_cached_total (prompt tokens Warm Start reused), prompt_seconds_total,
tokens_predicted_total, tokens_predicted_seconds_total, n_decode_total, n_tokens_max.
Gauges: prompt_tokens_seconds and predicted_tokens_seconds (average speeds since start),
requests_processing (answers in a slot, sharing passes) and requests_deferred (waiting for a slot).
Kinetic's own, after them: RAD-1's drafts per drafter, kinetic:draft_tokens_total{source="context"}
(guessed tokens verified) and kinetic:draft_tokens_accepted_total{source=...} (guesses kept), one
line per drafter that has drafted since start.
"""

from __future__ import annotations

from kinetic.server.worker import EngineWorker


def prometheus_text(worker: EngineWorker) -> str:
    with worker.lock:
        c = worker.counters
        processing = worker.processing
        counters = [
            ("requests_total", "Number of requests started", c.requests_total),
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
             c.prompt_tokens_total),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
             c.prompt_tokens_cached_total),
            ("prompt_seconds_total", "Total time spent processing prompts", c.prompt_seconds_total),
            ("tokens_predicted_total", "Number of generation tokens processed", c.tokens_predicted_total),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens", c.tokens_predicted_seconds_total),
            ("n_decode_total", "Total number of engine passes", c.n_decode_total),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", c.n_tokens_max),
        ]
        gauges = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
             c.prompt_tokens_total / c.prompt_seconds_total if c.prompt_seconds_total else 0.0),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
             c.tokens_predicted_total / c.tokens_predicted_seconds_total if c.tokens_predicted_seconds_total else 0.0),
            ("requests_processing", "Number of requests processing", processing),
            ("requests_deferred", "Number of requests deferred", worker.deferred),
        ]
        drafts = sorted((source, tuple(counts)) for source, counts in c.draft_sources.items())
    lines = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, help_text, value in items:
            lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                      f"llamacpp:{name} {_number(value)}"]
    return "\n".join(lines + _draft_lines(drafts)) + "\n"


def _draft_lines(drafts: list[tuple[str, tuple[int, int]]]) -> list[str]:
    """RAD-1's counters per drafter, from (source, (guessed, kept)) pairs."""
    lines = []
    for metric, help_text, column in (
        ("draft_tokens_total", "Guessed tokens RAD-1 verified, per drafter", 0),
        ("draft_tokens_accepted_total", "Guessed tokens RAD-1 kept, per drafter", 1),
    ):
        lines += [f"# HELP kinetic:{metric} {help_text}", f"# TYPE kinetic:{metric} counter"]
        lines += [f'kinetic:{metric}{{source="{source}"}} {counts[column]}' for source, counts in drafts]
    return lines


def _number(value) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
