"""Kinetic's report of `kinetic bench`: llama-bench's markdown table, the lines under it, and the JSON.

Owns: `table(result)`, `to_json(result)` and the pieces the comparison card reuses (`edit_name`,
`gib`, `technologies_on`, `decode_share`).
Does not own: measuring (kinetic.bench, kinetic.bench_edit), llama.cpp's numbers and the card
(kinetic.bench_llama, kinetic.bench_card).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kinetic import __version__
from kinetic.bench_bandwidth import BandwidthShare, bandwidth_share
from kinetic.bench_edit import EDIT_SKIPPED, EDIT_TOKENS
from kinetic.devices import DEVICE_NAMES, DEVICES

if TYPE_CHECKING:
    from kinetic.bench import BenchResult
    from kinetic.bench_edit import EditResult


def technologies_on(off: list[str]) -> str:
    """`on: RAD-1, Shortlist` (JSON's technologies), without those --off names, `on: none` without both."""
    on = [name for key, name in (("rad1", "RAD-1"), ("shortlist", "Shortlist")) if key not in off]
    return f"on: {', '.join(on) or 'none'}"


def technologies_line(off: list[str]) -> str:
    told = f" (--off {','.join(off)})" if off else ""
    return (
        f"speed technologies {technologies_on(off)}{told}; Torque is not built yet"
        "; Warm Start, Zero Wait and Convoy take no part"
    )


def edit_line(e: EditResult) -> str:
    """The line under the table; NO means a bug (bench exits 1)."""
    return f"edit: drafted output identical to plain decoding: {'yes' if e.identical else 'NO'}"


def edit_name(r: BenchResult) -> str:
    return f"edit{r.edit.limit}" if r.edit else f"edit{EDIT_TOKENS}"


def table(r: BenchResult) -> str:
    """llama-bench's markdown table, then the lines that say how it was measured."""
    head = [
        "| model | size | params | backend | threads | test | t/s |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    backend = DEVICES[r.device].backend
    cells = f"| {r.path.stem} | {gib(r.size_bytes)} | {r.parameters / 1e9:.2f} B | {backend} | {r.threads}"
    rows = [f"{cells} | {t.name} | {t.best:.2f} |" for t in r.tests]
    rows.append(f"{cells} | {edit_name(r)} | {f'{r.edit.best:.2f}' if r.edit else 'not measured'} |")
    notes = [
        f"on {DEVICE_NAMES[r.device]}, {r.threads} threads, best of {r.repetitions}, load {r.load_seconds:.2f} s",
        technologies_line(r.off),
        f"numerics {r.numerics} (the reductions' order: docs/numerics.md)",
        edit_line(r.edit) if r.edit else f"edit: {EDIT_SKIPPED}",
        f"peak memory {gib(r.peak_rss_bytes)}",
    ]
    if r.shortlist_share is not None:
        share = 100 * r.shortlist_share
        notes.append(f"shortlist: {share:.2f} % of the output layer's rows scored exactly per tg token")
    decode = decode_share(r)
    if decode is not None:
        notes.append(f"bandwidth: {decode.line()} ({r.threads} threads, tg's best run)")
    return "\n".join(head + rows + [""] + notes)


def to_json(r: BenchResult) -> dict:
    pp, tg = r.test("pp"), r.test("tg")
    return {
        "model": r.path.name,
        "backend": "cpu",
        "device": DEVICE_NAMES[r.device],
        "threads": r.threads,
        "repetitions": r.repetitions,
        "load_seconds": round(r.load_seconds, 4),
        "size_bytes": r.size_bytes,
        "parameters": r.parameters,
        "prefill_tokens": pp.tokens if pp else 0,
        "prefill_tokens_per_second": round(pp.best, 2) if pp else None,
        "decode_tokens": tg.tokens if tg else 0,
        "decode_tokens_per_second": round(tg.best, 2) if tg else None,
        "tests": [t.to_json() for t in r.tests],
        **edit_json(r.edit),
        "technologies": technologies_on(r.off),
        "off": r.off,
        "numerics": r.numerics,
        "peak_rss_bytes": r.peak_rss_bytes,
        "shortlist_share": r.shortlist_share,
        **decode_share_json(r),
        "kinetic_version": __version__,
    }


def decode_share(r: BenchResult) -> BandwidthShare | None:
    """Decode's bandwidth share at tg's best run (None without a tg test)."""
    tg = r.test("tg")
    if r.traffic is None or tg is None:
        return None
    return bandwidth_share(r.traffic, tg.best, r.read_bandwidth, r.read_bandwidth_passes)


def decode_share_json(r: BenchResult) -> dict:
    decode = decode_share(r)
    if decode is None:
        return {"decode_bytes_per_token": None, "decode_gb_per_s": None, "machine_read_gb_per_s": None,
                "bandwidth_share": None}
    return decode.to_json()


def edit_json(e: EditResult | None) -> dict:
    if e is None:
        return {"edit_tokens": 0, "edit_tokens_per_second": None, "edit_identical": None}
    return {
        "edit_tokens": len(e.tokens),
        "edit_tokens_per_second": round(e.best, 2),
        "edit_identical": e.identical,
        "edit_limit": e.limit,
        "edit_drafted": e.drafted,
        "edit_plain_tokens_per_second": round(e.plain_best, 2),
        "edit_guessed": e.guessed,
        "edit_kept": e.kept,
    }


def gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"
