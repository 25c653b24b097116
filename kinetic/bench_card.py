"""The card of `kinetic bench --compare`: Kinetic's numbers beside llama.cpp's, as markdown and JSON.

Owns: one row per test with both speeds and their ratio (`card_rows`), the card (`card`) and the
lines under it (the machine, how it was measured, whether the edit answers agree), and its JSON
(`card_json`).
Does not own: any measuring (kinetic.bench, kinetic.bench_edit, kinetic.bench_llama,
kinetic.bench_llama_edit), Kinetic's own table (kinetic.bench_report).
"""

from __future__ import annotations

import platform

from kinetic import __version__
from kinetic.bench import BenchResult
from kinetic.bench_edit import EDIT_SKIPPED, rate
from kinetic.bench_llama import LlamaBenchResult
from kinetic.bench_llama_edit import LlamaEditResult
from kinetic.bench_report import edit_name, gib, to_json

TEST_LABELS = {"pp": "prompt", "tg": "generate"}


def card_rows(k: BenchResult, ll: LlamaBenchResult, le: LlamaEditResult | None = None) -> list[dict]:
    """One row per test, edit<N> last: Kinetic's best, llama.cpp's best (None: not run) and the ratio."""
    ours = [(t.name, t.best) for t in k.tests] + [(edit_name(k), k.edit.best if k.edit else None)]
    theirs = dict(ll.best)
    if le is not None and not le.not_run and le.counts:
        theirs[edit_name(k)] = le.best
    rows = []
    for name, mine in ours:
        other = theirs.get(name)
        rows.append(
            {
                "test": name,
                "kinetic_t_s": round(mine, 2) if mine is not None else None,
                "llama_cpp_t_s": round(other, 2) if other else None,
                "ratio": round(mine / other, 3) if other and mine else None,
            }
        )
    return rows


def card(k: BenchResult, ll: LlamaBenchResult, le: LlamaEditResult | None = None) -> str:
    """The markdown card of `kinetic bench --compare`; `le` is llama-server's edit test (None: not run)."""
    lines = [
        f"## Kinetic vs llama.cpp: {k.path.stem}",
        "",
        f"| test | Kinetic {__version__} | llama.cpp {ll.build} | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for row in card_rows(k, ll, le):
        label = f"{TEST_LABELS[row['test'][:2]]} {row['test']}" if row["test"][:2] in TEST_LABELS else row["test"]
        mine = f"{row['kinetic_t_s']:.1f}" if row["kinetic_t_s"] is not None else "not measured"
        theirs = f"{row['llama_cpp_t_s']:.1f}" if row["llama_cpp_t_s"] else "not run"
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "-"
        lines.append(f"| {label} | {mine} | {theirs} | {ratio} |")
    lines += [
        "",
        machine_line(),
        f"Same file ({gib(k.size_bytes)}, {k.weight_type}), on the CPU, {k.threads} threads, "
        f"flash attention on, best of {k.repetitions}, t/s.",
        card_edit_line(k, le),
    ]
    return "\n".join(lines)


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


def card_json(k: BenchResult, ll: LlamaBenchResult, le: LlamaEditResult | None = None) -> dict:
    return {
        "model": k.path.stem,
        "machine": machine_line(),
        "threads": k.threads,
        "repetitions": k.repetitions,
        "kinetic_version": __version__,
        "llama_cpp": {
            "build": ll.build,
            "build_number": ll.build_number,
            "build_commit": ll.build_commit,
            "best_t_s": ll.best,
            "mean_t_s": ll.mean,
            "edit": llama_edit_json(k, le),
        },
        "tests": card_rows(k, ll, le),
        "kinetic": to_json(k),
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
