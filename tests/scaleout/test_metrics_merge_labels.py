"""The cluster's /metrics with labelled samples: RAD-1's per-drafter counters merged (kinetic/scaleout/metrics.py)."""

from __future__ import annotations

from kinetic.scaleout.metrics import merge, parse


def drafts_text(counts: dict[str, int]) -> str:
    lines = ["# HELP kinetic:draft_tokens_total Guessed tokens RAD-1 verified, per drafter",
             "# TYPE kinetic:draft_tokens_total counter"]
    return "\n".join(lines + [f'kinetic:draft_tokens_total{{source="{s}"}} {n}' for s, n in counts.items()]) + "\n"


def test_labelled_counters_add_up_per_label_with_one_help_and_type_per_metric():
    """Each drafter's counter is the replicas' sum; HELP and TYPE name the metric once, without labels,
    and every sample of the metric follows them, a drafter only one replica has included."""
    text = merge({"replica-0": drafts_text({"context": 10, "seen": 2}),
                  "replica-1": drafts_text({"context": 5, "mtp": 7})})
    values, meta = parse(text)
    assert values['kinetic:draft_tokens_total{source="context"}'] == 15
    assert values['kinetic:draft_tokens_total{source="mtp"}'] == 7
    assert meta["kinetic:draft_tokens_total"] == ("Guessed tokens RAD-1 verified, per drafter", "counter")
    lines = text.splitlines()
    assert [x for x in lines if x.startswith("# TYPE kinetic:draft")] == ["# TYPE kinetic:draft_tokens_total counter"]
    start = lines.index("# TYPE kinetic:draft_tokens_total counter")
    assert sorted(lines[start + 1:start + 4]) == ['kinetic:draft_tokens_total{source="context"} 15',
                                                 'kinetic:draft_tokens_total{source="mtp"} 7',
                                                 'kinetic:draft_tokens_total{source="seen"} 2']
