"""The card of `kinetic bench --compare`: Kinetic's numbers beside llama.cpp's (and ik_llama.cpp's), as
markdown and JSON.

Owns: one row per test with the speeds and the ratios Kinetic / each engine (`card_rows`), the card
(`card`) and the lines under it (the machine, how it was measured, the ratios of the rounds' medians,
decode's bandwidth on each engine, whether the edit answers agree, or that ik_llama.cpp was not
found), and its JSON (`card_json`). Without ik_llama.cpp the card is llama.cpp's alone plus one line.
Does not own: any measuring (kinetic.bench, kinetic.bench_edit, kinetic.bench_llama,
kinetic.bench_llama_edit), Kinetic's own table (kinetic.bench_report).
"""

from __future__ import annotations

import platform
import statistics
from dataclasses import replace

from kinetic import __version__
from kinetic.bench import BenchResult
from kinetic.bench_bandwidth import bandwidth_share
from kinetic.bench_edit import EDIT_SKIPPED, rate
from kinetic.bench_llama import LlamaBenchResult, ik_absent_line
from kinetic.bench_llama_edit import LlamaEditResult
from kinetic.bench_report import edit_name, gib, to_json

TEST_LABELS = {"pp": "prompt", "tg": "generate"}


def ratio(mine: float | None, other: float | None) -> float | None:
    """Kinetic's speed over another engine's, None when either is missing (or 0)."""
    return round(mine / other, 3) if other and mine else None


def card_rows(
    k: BenchResult, ll: LlamaBenchResult, le: LlamaEditResult | None = None, ik: LlamaBenchResult | None = None
) -> list[dict]:
    """One row per test, edit<N> last: Kinetic's best, llama.cpp's best (None: not run) and the ratio,
    and with ik_llama.cpp its best and Kinetic's ratio to it (it has no edit test: None there)."""
    ours = [(t.name, t.best) for t in k.tests] + [(edit_name(k), k.edit.best if k.edit else None)]
    theirs = dict(ll.best)
    if le is not None and not le.not_run and le.counts:
        theirs[edit_name(k)] = le.best
    rows = []
    for name, mine in ours:
        other = theirs.get(name)
        row = {
            "test": name,
            "kinetic_t_s": round(mine, 2) if mine is not None else None,
            "llama_cpp_t_s": round(other, 2) if other else None,
            "ratio": ratio(mine, other),
        }
        if ik is not None:
            fast = ik.best.get(name)
            row |= {"ik_llama_cpp_t_s": round(fast, 2) if fast else None, "ratio_ik_llama_cpp": ratio(mine, fast)}
        rows.append(row)
    return rows


def card(
    k: BenchResult, ll: LlamaBenchResult, le: LlamaEditResult | None = None, ik: LlamaBenchResult | None = None
) -> str:
    """The markdown card of `kinetic bench --compare`; `le` is llama-server's edit test (None: not run),
    `ik` ik_llama.cpp's llama-bench (None: not found, and a line says so)."""
    if ik is None:
        title, head = "llama.cpp", f"| test | Kinetic {__version__} | llama.cpp {ll.build} | ratio |"
    else:
        title = "llama.cpp and ik_llama.cpp"
        head = (f"| test | Kinetic {__version__} | llama.cpp {ll.build} | ik_llama.cpp {ik.build} "
                "| Kinetic/llama.cpp | Kinetic/ik_llama.cpp |")
    lines = [f"## Kinetic vs {title}: {k.path.stem}", "", head, "| --- |" + " ---: |" * (head.count("|") - 2)]
    for row in card_rows(k, ll, le, ik):
        label = f"{TEST_LABELS[row['test'][:2]]} {row['test']}" if row["test"][:2] in TEST_LABELS else row["test"]
        cells = [label, _speed(row["kinetic_t_s"], "not measured"), _speed(row["llama_cpp_t_s"], "not run")]
        if ik is not None:
            cells.append(_speed(row["ik_llama_cpp_t_s"], "not run"))
        cells.append(_times(row["ratio"]))
        if ik is not None:
            cells.append(_times(row["ratio_ik_llama_cpp"]))
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        machine_line(),
        f"Same file ({gib(k.size_bytes)}, {k.file_type}), on the CPU, {k.threads} threads, "
        f"flash attention on, best of {k.repetitions}, t/s.",
        *median_lines(k, ll, ik),
        *bandwidth_lines(k, ll, ik),
        card_edit_line(k, le),
    ]
    if ik is None:
        lines.append(ik_absent_line())
    return "\n".join(lines)


def _speed(value: float | None, missing: str) -> str:
    return f"{value:.1f}" if value else missing


def _times(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def median_ratios(k: BenchResult, other: LlamaBenchResult) -> dict[str, float]:
    """Per test both engines ran: Kinetic's median run over the other engine's median sample."""
    theirs = other.median
    out = {}
    for t in k.tests:
        if t.seconds and theirs.get(t.name):
            out[t.name] = round(statistics.median(t.rates) / theirs[t.name], 3)
    return out


def median_lines(k: BenchResult, ll: LlamaBenchResult, ik: LlamaBenchResult | None) -> list[str]:
    """`Medians of the 3 rounds (the engines took turns): pp512 1.69x llama.cpp, 0.48x ik_llama.cpp; ...`."""
    engines = [("llama.cpp", ll)] + ([("ik_llama.cpp", ik)] if ik is not None else [])
    ratios = [(name, median_ratios(k, r)) for name, r in engines]
    parts = [
        f"{t.name} " + ", ".join(f"{m[t.name]:.2f}x {name}" for name, m in ratios if t.name in m)
        for t in k.tests if any(t.name in m for _, m in ratios)
    ]
    return [f"Medians of the {k.repetitions} rounds (the engines took turns): {'; '.join(parts)}."] if parts else []


def bandwidth_lines(k: BenchResult, ll: LlamaBenchResult, ik: LlamaBenchResult | None) -> list[str]:
    """Decode's GB/s on each engine at its best tg run; llama.cpp's forks read the whole output layer
    every token, so their bytes per token are Kinetic's without Shortlist."""
    tg = k.test("tg")
    if k.traffic is None or tg is None:
        return []
    full = replace(k.traffic, shortlist=None)
    parts = [f"Kinetic {bandwidth_share(k.traffic, tg.best, k.read_bandwidth, k.read_bandwidth_passes).line()}"]
    for name, other in [("llama.cpp", ll)] + ([("ik_llama.cpp", ik)] if ik is not None else []):
        if other.best.get(tg.name):
            share = bandwidth_share(full, other.best[tg.name], k.read_bandwidth)
            gbps = f"{share.bytes_per_second / 1e9:.1f} GB/s"
            parts.append(f"{name} {gbps}" + (f" ({100 * share.share:.0f} %)" if share.share is not None else ""))
    return [f"Decode bandwidth ({tg.name}): " + "; ".join(parts) + "."]


def card_edit_line(k: BenchResult, le: LlamaEditResult | None) -> str:
    """The line under the card for edit256: the request, llama.cpp's speculative mode, and whether the
    answers agree (docs/benchmarks.md)."""
    if k.edit is None:
        return f"edit: {EDIT_SKIPPED}; llama.cpp's edit test not run either."
    ours = f"Kinetic's output identical to plain decoding: {'yes' if k.edit.identical else 'NO'}"
    head = f"{edit_name(k)}: greedy copy of a file with one rename"
    if le is None or le.not_run:
        why = le.not_run if le is not None else "not asked for"
        return f"{head}; {ours}; llama.cpp's edit test (llama-server) not run: {why}."
    same = "yes" if le.text == k.edit.text else "no (llama.cpp is not batch-invariant; reported, not a failure)"
    prompts = (
        ""
        if le.prompt_tokens == k.edit.prompt_tokens
        else (f"; prompts differ: {k.edit.prompt_tokens} tokens here, {le.prompt_tokens} there")
    )
    return (
        f"{head}; llama.cpp speculative mode {le.spec_type} (llama-server, streamed, first to last token); "
        f"{ours}; llama.cpp's answer identical to Kinetic's: {same}{prompts}."
    )


def llama_edit_json(k: BenchResult, le: LlamaEditResult | None) -> dict | None:
    if le is None:
        return None
    if le.not_run or not le.counts:
        return {"spec_type": le.spec_type, "not_run": le.not_run or "no runs"}
    return {
        "spec_type": le.spec_type,
        "t_s": round(le.best, 2),
        "runs": [round(rate(n, s), 2) for n, s in zip(le.counts, le.seconds, strict=True)],
        "tokens": le.counts[-1],
        "prompt_tokens": le.prompt_tokens,
        "identical_to_kinetic": le.text == k.edit.text if k.edit else None,
    }


def card_json(
    k: BenchResult, ll: LlamaBenchResult, le: LlamaEditResult | None = None, ik: LlamaBenchResult | None = None
) -> dict:
    return {
        "model": k.path.stem,
        "machine": machine_line(),
        "threads": k.threads,
        "repetitions": k.repetitions,
        "kinetic_version": __version__,
        "llama_cpp": {**engine_json(k, ll), "edit": llama_edit_json(k, le)},
        "ik_llama_cpp": engine_json(k, ik) if ik is not None else {"not_run": ik_absent_line()},
        "tests": card_rows(k, ll, le, ik),
        "kinetic": to_json(k),
    }


def engine_json(k: BenchResult, r: LlamaBenchResult) -> dict:
    return {
        "build": r.build,
        "build_number": r.build_number,
        "build_commit": r.build_commit,
        "best_t_s": r.best,
        "mean_t_s": r.mean,
        "median_t_s": r.median,
        "median_ratio": median_ratios(k, r),
    }


def machine_line() -> str:
    """`CPU model, OS`, e.g. `AMD EPYC, Debian GNU/Linux 12 (bookworm)`."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        system = platform.freedesktop_os_release()["PRETTY_NAME"]
    except (OSError, KeyError, AttributeError):
        system = f"{platform.system()} {platform.release()}"
    return f"{cpu}, {system}"
