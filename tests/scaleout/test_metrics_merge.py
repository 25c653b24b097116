"""The cluster's /metrics: the replicas' Prometheus texts merged (kinetic/scaleout/metrics.py)."""

from __future__ import annotations

from kinetic.scaleout.metrics import merge, parse


def replica_text(requests: int, processing: int, longest: int) -> str:
    return (f"# HELP llamacpp:requests_total Number of requests started\n# TYPE llamacpp:requests_total counter\n"
            f"llamacpp:requests_total {requests}\n"
            f"# HELP llamacpp:requests_processing Number of requests processing\n"
            f"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing {processing}\n"
            f"# HELP llamacpp:n_tokens_max Largest observed sequence length\n# TYPE llamacpp:n_tokens_max counter\n"
            f"llamacpp:n_tokens_max {longest}\n")


def test_counters_and_load_add_up_and_the_longest_sequence_is_the_largest():
    """Counters and gauges are the replicas' sums, n_tokens_max their maximum, types and help kept."""
    values, meta = parse(merge({"replica-0": replica_text(3, 1, 40), "replica-1": replica_text(5, 2, 90)}))
    assert values["llamacpp:requests_total"] == 8
    assert values["llamacpp:requests_processing"] == 3
    assert values["llamacpp:n_tokens_max"] == 90
    assert meta["llamacpp:requests_total"] == ("Number of requests started", "counter")


def test_a_replica_that_did_not_answer_counts_nothing_and_shows_down():
    """A replica without a text adds nothing and reports replica_up 0; the others report 1."""
    text = merge({"replica-0": replica_text(3, 1, 40), "replica-1": None})
    values, _ = parse(text)
    assert values["llamacpp:requests_total"] == 3
    assert values['kinetic:replica_up{replica="replica-0"}'] == 1
    assert values['kinetic:replica_up{replica="replica-1"}'] == 0
