"""RAD-1 against plain decoding, side by side: tokens/s of generation (first to last token, the
prompt excluded) for an editing request whose answer repeats its input and for a story, each run
plain and drafted back to back, --repeat times (alternating which goes first); prints the median
speeds and the median of the pairs' speed ratios (pairs share the machine's load of the moment,
which matters on a shared machine), and checks the tokens agree. It also prices the drafted runs'
passes with a table of pass costs measured on a quiet machine (QUIET_PASS_COST): a speed-up that
no other process's load can blur (but that trusts the table).

    python benchmarks/rad1.py [MODEL] [--tokens 200] [--threads 2] [--repeat 3] [--raw] [--warm]
    python benchmarks/rad1.py [MODEL] --pass-costs [--repeat 5]    # what verifying n rows costs

Drafted runs start with an empty index of earlier requests (what a first request gets) unless
--warm, which lets each drafted run see the previous runs (a resent request).
"""

from __future__ import annotations

import argparse
import statistics
import time

from kinetic.ir.rows import PassRows
from kinetic.model import Model
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
    return {name: model.tokenize(text, add_special=False, parse_special=True) for name, text in chat.items()}


# Seconds of a pass of n rows over a one-row decode pass: SmolLM2 Q4_1, 2 threads, this project's
# 2-vCPU EPYC, quiet (docs/rad1.md). 8 and 16 are cheaper than their neighbours: the matmul kernels
# run full tiles of 8 rows together and leftover rows one at a time.
QUIET_PASS_COST = {1: 1.0, 2: 1.53, 3: 2.18, 4: 2.71, 5: 3.34, 6: 3.78, 7: 4.38, 8: 4.0, 9: 4.66, 10: 5.1,
                   11: 5.75, 12: 6.31, 13: 6.99, 14: 7.43, 15: 8.27, 16: 7.59, 17: 8.32}


class PassLog:
    """Counts the rows of every pass after the prompt: the noise-free side of the comparison."""

    def __init__(self, engine):
        self.rows: list[int] = []
        verify, decode = engine.verify, engine.decode
        engine.verify = lambda seq, rows: (self.rows.append(len(rows.tokens)), verify(seq, rows))[1]
        engine.decode = lambda seq, token: (self.rows.append(1), decode(seq, token))[1]

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


def timed(tokens_iter) -> tuple[list[int], float]:
    """The tokens and the seconds from the first token to the last."""
    out = [next(tokens_iter)]
    start = time.perf_counter()
    out += list(tokens_iter)
    return out, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--raw", action="store_true", help="raw continuation prompts instead of the chat template")
    ap.add_argument("--warm", action="store_true", help="keep the index of earlier requests between runs")
    ap.add_argument("--pass-costs", action="store_true", help="only time passes of 1 to 16 rows")
    args = ap.parse_args()
    model = Model(args.model, n_ctx=2048, threads=args.threads)
    engine = model.engine
    if args.pass_costs:
        return pass_costs(engine, args.repeat)
    stop = set(model.tokenizer.eot_ids)
    seen = NgramIndex(1 << 16, SEEN_ORDERS)
    decoder = SpeculativeDecoder(engine, seen=seen)
    log = PassLog(engine)
    for name, ids in prompts(model, args.raw).items():
        plain_speeds, drafted_speeds, ratios, modeled = [], [], [], []
        for rep in range(args.repeat):  # back-to-back pairs, alternating which runs first
            runs = {}
            for kind in ("plain", "drafted") if rep % 2 == 0 else ("drafted", "plain"):
                if kind == "plain":
                    runs[kind] = timed(plain_decode(engine, engine.new_sequence(), ids, args.tokens, stop))
                    continue
                if not args.warm:
                    seen.__init__(seen.budget, SEEN_ORDERS)
                log.rows.clear()
                runs[kind] = timed(decoder.generate(engine.new_sequence(), ids, args.tokens, stop))
                modeled.append(log.modeled_speedup(len(runs[kind][0])))
            (plain, plain_s), (drafted, drafted_s) = runs["plain"], runs["drafted"]
            if drafted != plain:
                raise SystemExit(f"{name}: drafted output differs from plain decoding")
            plain_speeds.append((len(plain) - 1) / plain_s)
            drafted_speeds.append((len(drafted) - 1) / drafted_s)
            ratios.append(plain_s / drafted_s)
        s = decoder.stats
        print(f"{name:6s} {len(plain):4d} tokens  plain {statistics.median(plain_speeds):6.1f} t/s  "
              f"drafted {statistics.median(drafted_speeds):6.1f} t/s  x{statistics.median(ratios):.2f} "
              f"(pairs {[round(r, 2) for r in ratios]}; quiet pass-cost model x{statistics.median(modeled):.2f}; "
              f"last run: {s.passes} passes, {s.accepted}/{s.drafted} guesses kept)")
    print(f"identical output: yes; beta {decoder.costs.beta:.2f}")


if __name__ == "__main__":
    main()
