"""RAD-1 against plain decoding, side by side: tokens/s of generation (first to last token, the
prompt excluded) for editing requests whose answers repeat their input, `kinetic bench`'s edit256
request and a story, each run plain and drafted back to back, --repeat times (rotating which goes
first); prints the median speeds and the median of the pairs' speed ratios (pairs share the
machine's load of the moment, which matters on a shared machine), and checks the tokens agree. It
also prices the drafted runs' passes with a table of pass costs measured on a quiet machine
(QUIET_PASS_COST, SmolLM2's): a speed-up that no other process's load can blur (but that trusts the
table), and gives each kind's median CPU seconds a run (every thread of the process).

    python benchmarks/rad1.py [MODEL] [--tokens 200] [--threads 2] [--repeat 3] [--raw] [--warm]
                              [--requests edit256,story] [--context-orders 4,3,2]
    python benchmarks/rad1.py [MODEL] --pass-costs [--repeat 5]    # what verifying n rows costs

Drafted runs start with an empty index of earlier requests (what a first request gets) unless
--warm, which lets each drafted run see the previous runs (a resent request). --context-orders adds
a third kind to each rotation: drafted with the context drafter looking up those n-gram lengths
instead of CONTEXT_ORDERS (kinetic/runtime/ngram_index.py), to compare the two in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

from kinetic.bench_edit import edit_prompt
from kinetic.ir.rows import PassRows
from kinetic.model import Model
from kinetic.runtime import drafting
from kinetic.runtime.drafting import SEEN_ORDERS, NgramIndex
from kinetic.runtime.speculative import SpeculativeDecoder, plain_decode

CODE = '''import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Item:
    name: str
    price: float
    quantity: int


def load_items(path: Path) -> list[Item]:
    with path.open() as f:
        rows = json.load(f)
    return [Item(row["name"], float(row["price"]), int(row["quantity"])) for row in rows]


def total(items: list[Item]) -> float:
    count = 0.0
    for item in items:
        count += item.price * item.quantity
    return count


def cheapest(items: list[Item]) -> Item:
    return min(items, key=lambda item: item.price)


if __name__ == "__main__":
    items = load_items(Path("items.json"))
    print(total(items), cheapest(items).name)
'''

REQUESTS = {
    "repeat": f"Repeat this code exactly:\n\n{CODE}",
    "copy": f"Copy this file exactly, without changing anything:\n\n```python\n{CODE}```",
    "edit": f"Here is a Python file:\n\n{CODE}\nRename the variable count to running_total and show the whole file.",
    "story": "Write a long story about a girl who lives in a lighthouse by the sea.",
}


def prompts(model: Model, raw: bool) -> dict[str, list[int]]:
    if raw:
        return {"repeat": model.tokenize(f"```python\n{CODE}```\n\nThe same file again:\n\n```python\n"),
                "story": model.tokenize("Once upon a time, in a lighthouse by the sea, there lived a girl who")}
    chat = {name: model.apply_chat_template([{"role": "user", "content": text}]) for name, text in REQUESTS.items()}
    chat["copy"] += "```python\n"  # an answer begun by the client: the model then copies nearly verbatim
    ids = {name: model.tokenize(text, add_special=False, parse_special=True) for name, text in chat.items()}
    return {**ids, "edit256": edit_prompt(model)}  # kinetic bench's edit request, as it builds it


# Seconds of a pass of n rows over a one-row decode pass: SmolLM2 Q4_1, 2 threads, this project's
# 2-vCPU EPYC, quiet (docs/rad1.md). 8 and 16 are cheaper than their neighbours: the matmul kernels
# run full tiles of 8 rows together and leftover rows one at a time.
QUIET_PASS_COST = {1: 1.0, 2: 1.53, 3: 2.18, 4: 2.71, 5: 3.34, 6: 3.78, 7: 4.38, 8: 4.0, 9: 4.66, 10: 5.1,
                   11: 5.75, 12: 6.31, 13: 6.99, 14: 7.43, 15: 8.27, 16: 7.59, 17: 8.32}


class PassLog:
    """Counts the rows of every pass after the prompt (`clear()` when the first token is out): the
    noise-free side of the comparison."""

    def __init__(self, engine):
        self.rows: list[int] = []
        forward, verify = engine.forward, engine.verify

        def logged_forward(rows, *args, **kwargs):  # decode steps (and prompt chunks, before clear())
            self.rows.append(len(rows.tokens))
            return forward(rows, *args, **kwargs)

        def logged_verify(seq, rows, *args, **kwargs):  # draft trees
            self.rows.append(len(rows.tokens))
            return verify(seq, rows, *args, **kwargs)

        engine.forward, engine.verify = logged_forward, logged_verify

    def clear(self) -> None:
        self.rows.clear()

    def modeled_speedup(self, tokens: int) -> float:
        """Plain decoding's passes (one per token after the first) over these passes, priced by the table."""
        return (tokens - 1) / sum(QUIET_PASS_COST.get(n, 0.45 * (n - 1) + 1) for n in self.rows)


def pass_costs(engine, repeat: int) -> None:
    """Prints what a pass of n rows (a chain after a 300-token context, logits for every row, nothing
    committed) costs against a one-row pass: medians of `repeat` rounds, the row counts interleaved."""
    seq = engine.new_sequence()
    engine.prefill(seq, list(range(100, 400)))
    times: dict[int, list[float]] = {}
    for _ in range(repeat):
        for n in (1, 2, 3, 4, 8, 16):
            rows = PassRows.chain(list(range(500, 500 + n)), seq.cache.length, outputs="all")
            samples = []
            for _ in range(9):
                start = time.perf_counter()
                engine.forward(rows, {0: seq}, commit=False)
                samples.append(time.perf_counter() - start)
            times.setdefault(n, []).append(statistics.median(samples))
    one = statistics.median(times[1])
    for n, ts in times.items():
        print(f"{n:2d} rows  {1e3 * statistics.median(ts):6.2f} ms  x{statistics.median(ts) / one:.2f}")


def timed(tokens_iter, first=lambda: None) -> tuple[list[int], float, float]:
    """The tokens, the seconds from the first token to the last and the process's CPU seconds in
    that time; `first()` runs when the first token (the prompt's) is out."""
    out = [next(tokens_iter)]
    first()
    start, cpu = time.perf_counter(), time.process_time()
    out += list(tokens_iter)
    return out, time.perf_counter() - start, time.process_time() - cpu


@contextlib.contextmanager
def context_orders(orders: tuple[int, ...] | None):
    """While open, drafters_for builds the context drafter with `orders` (None: as the runtime does).
    The runtime has no setting for it: the benchmark swaps the class drafters_for calls."""
    original = drafting.ContextDrafter
    if orders:
        drafting.ContextDrafter = lambda capacity: original(capacity, orders)
    try:
        yield
    finally:
        drafting.ContextDrafter = original


class DraftedKind:
    """One drafted way to run: its decoder (pass costs learned across its runs), its index of earlier
    requests (emptied before each run unless --warm) and the context drafter's orders."""

    def __init__(self, engine, orders: tuple[int, ...] | None):
        self.seen = NgramIndex(1 << 16, SEEN_ORDERS)
        self.decoder = SpeculativeDecoder(engine, seen=self.seen)
        self.orders = orders

    def run(self, engine, ids: list[int], tokens: int, stop: set[int], log: PassLog, warm: bool):
        if not warm:
            self.seen.__init__(self.seen.budget, SEEN_ORDERS)
        with context_orders(self.orders):
            return timed(self.decoder.generate(engine.new_sequence(), ids, tokens, stop), log.clear)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--raw", action="store_true", help="raw continuation prompts instead of the chat template")
    ap.add_argument("--warm", action="store_true", help="keep the index of earlier requests between runs")
    ap.add_argument("--pass-costs", action="store_true", help="only time passes of 1 to 16 rows")
    ap.add_argument("--requests", help="comma-separated requests to run [default: all]")
    ap.add_argument("--context-orders", help="also draft with these context n-gram lengths, e.g. 4,3,2")
    args = ap.parse_args()
    model = Model(args.model, n_ctx=2048, threads=args.threads)
    engine = model.engine
    if args.pass_costs:
        return pass_costs(engine, args.repeat)
    stop = set(model.tokenizer.eot_ids)
    log = PassLog(engine)
    kinds = {"drafted": DraftedKind(engine, None)}
    if args.context_orders:
        kinds[f"orders {args.context_orders}"] = DraftedKind(engine, tuple(map(int, args.context_orders.split(","))))
    chosen = prompts(model, args.raw)
    if args.requests:
        chosen = {name: chosen[name] for name in args.requests.split(",")}
    for name, ids in chosen.items():
        speeds, cpu, ratios, modeled = {}, {}, {}, {}
        for rep in range(args.repeat):  # back-to-back runs, rotating which goes first
            order = ["plain", *kinds]
            order = order[rep % len(order):] + order[:rep % len(order)]
            runs = {}
            for kind in order:
                if kind == "plain":
                    runs[kind] = timed(plain_decode(engine, engine.new_sequence(), ids, args.tokens, stop))
                else:
                    runs[kind] = kinds[kind].run(engine, ids, args.tokens, stop, log, args.warm)
                    modeled.setdefault(kind, []).append(log.modeled_speedup(len(runs[kind][0])))
            plain, plain_s, _ = runs["plain"]
            for kind, (tokens, seconds, cpu_s) in runs.items():
                if tokens != plain:
                    raise SystemExit(f"{name}: {kind} output differs from plain decoding")
                speeds.setdefault(kind, []).append((len(tokens) - 1) / seconds)
                cpu.setdefault(kind, []).append(cpu_s)
                ratios.setdefault(kind, []).append(plain_s / seconds)
        print(f"{name:7s} {len(plain):4d} tokens  plain {statistics.median(speeds['plain']):6.1f} t/s "
              f"({statistics.median(cpu['plain']):.2f} CPU s)")
        for kind, k in kinds.items():
            s = k.decoder.stats
            print(f"  {kind:14s} {statistics.median(speeds[kind]):6.1f} t/s ({statistics.median(cpu[kind]):.2f} CPU s)"
                  f"  x{statistics.median(ratios[kind]):.2f} (pairs {[round(r, 2) for r in ratios[kind]]}; quiet "
                  f"pass-cost model x{statistics.median(modeled[kind]):.2f}; last run: {s.passes} passes, "
                  f"{s.accepted}/{s.drafted} guesses kept; beta {k.decoder.costs.beta:.2f})")
    print("identical output: yes")


if __name__ == "__main__":
    main()
