"""/metrics of the cluster: the replicas' Prometheus texts (kinetic/server/metrics.py) added up.

Owns: parsing those texts and merging them. Counters and the requests_processing/deferred gauges
are summed; n_tokens_max is the largest; the speed gauges (prompt_tokens_seconds,
predicted_tokens_seconds) are summed too, as the replicas run side by side: their sum is the
cluster's throughput. Each replica also gets `kinetic:replica_up{replica="NAME"}` (1 answering,
0 not), so a dashboard sees a replica that is down. A labelled sample (RAD-1's per-drafter
`kinetic:draft_tokens_total{source="context"}`) is summed per label set, its HELP and TYPE written once
per metric, its samples together. Does not own fetching the texts (ray_serve.py).
"""

from __future__ import annotations

LARGEST = frozenset({"llamacpp:n_tokens_max"})


def parse(text: str) -> tuple[dict[str, float], dict[str, tuple[str, str]]]:
    """({sample: value}, {metric: (help, type)}) of a Prometheus text; a labelled sample's key keeps its
    labels (`kinetic:draft_tokens_total{source="context"}`), the metric's is its name alone."""
    values: dict[str, float] = {}
    meta: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            meta.setdefault(name, ["", "gauge"])[0] = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            meta.setdefault(name, ["", "gauge"])[1] = kind
        elif line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values, {name: (h, k) for name, (h, k) in meta.items()}


def merge(texts: dict[str, str | None]) -> str:
    """The cluster's text from each replica's (None: the replica did not answer)."""
    total: dict[str, float] = {}
    meta: dict[str, tuple[str, str]] = {}
    for text in texts.values():
        if text is None:
            continue
        values, described = parse(text)
        meta.update(described)
        for name, value in values.items():
            total[name] = max(total.get(name, value), value) if name in LARGEST else total.get(name, 0.0) + value
    families: dict[str, list[str]] = {}  # metric -> its samples, in order of first appearance
    for name in total:
        families.setdefault(name.partition("{")[0], []).append(name)
    lines: list[str] = []
    for family, samples in families.items():
        help_text, kind = meta.get(family, ("", "gauge"))
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} {kind}"]
        lines += [f"{name} {_number(kind, total[name])}" for name in samples]
    lines += ["# HELP kinetic:replica_up Whether the replica answered its /metrics", "# TYPE kinetic:replica_up gauge"]
    lines += [f'kinetic:replica_up{{replica="{name}"}} {0 if text is None else 1}' for name, text in texts.items()]
    return "\n".join(lines) + "\n"


def _number(kind: str, value: float) -> str:
    return str(int(value)) if kind == "counter" and value == int(value) else repr(float(value))
