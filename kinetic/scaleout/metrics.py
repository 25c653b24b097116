"""/metrics of the cluster: the replicas' Prometheus texts (kinetic/server/metrics.py) added up.

Owns: parsing those texts and merging them. Counters and the requests_processing/deferred gauges
are summed; n_tokens_max is the largest; the speed gauges (prompt_tokens_seconds,
predicted_tokens_seconds) are summed too, as the replicas run side by side: their sum is the
cluster's throughput. Each replica also gets `kinetic:replica_up{replica="NAME"}` (1 answering,
0 not), so a dashboard sees a replica that is down. Does not own fetching the texts (ray_serve.py).
"""

from __future__ import annotations

LARGEST = frozenset({"llamacpp:n_tokens_max"})


def parse(text: str) -> tuple[dict[str, float], dict[str, tuple[str, str]]]:
    """({name: value}, {name: (help, type)}) of a Prometheus text without labels."""
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
    lines: list[str] = []
    for name, value in total.items():
        help_text, kind = meta.get(name, ("", "gauge"))
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {_number(kind, value)}"]
    lines += ["# HELP kinetic:replica_up Whether the replica answered its /metrics", "# TYPE kinetic:replica_up gauge"]
    lines += [f'kinetic:replica_up{{replica="{name}"}} {0 if text is None else 1}' for name, text in texts.items()]
    return "\n".join(lines) + "\n"


def _number(kind: str, value: float) -> str:
    return str(int(value)) if kind == "counter" and value == int(value) else repr(float(value))
