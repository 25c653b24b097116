"""Where Shortlist's time goes in a decode token, per part: Gemma 3 270M greedy from BOS (what `kinetic
bench`'s tg measures), Shortlist forced on, process CPU time per token (docs/shortlist.md, "Exact rows").

Parts of OutputHead.shortlist: quant (the activations), copy (the copy scan and its group maxima),
best (the k + 7 best-looking rows), exact_first (their exact scores), floor, reach (rows_reaching: row
bound, then block bound), exact_rest (the exact scores of the rows reaching the floor), glue (the rest
of the call); token_ms is the whole token (the cut graph's pass included). Also the rows scored a token.

    python benchmarks/shortlist_exact.py 1 64     # threads, tokens: one JSON line

A/B two trees by running this script with PYTHONPATH set to frozen copies of each package, alternating,
many rounds, and comparing medians (the machine is shared: one run says little).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

import kinetic.codegen.cpu.shortlist as head_module
from kinetic.codegen.cpu.matmul import quantize_activations
from kinetic.model import Model

MODEL = Path.home() / ".local/share/kinetic/models/gemma-3-270m-q4_k_m.gguf"
PARTS = ("quant", "copy", "best", "exact_first", "floor", "reach", "exact_rest", "glue")


def timed_shortlist(spent: dict, rows: dict):
    """OutputHead.shortlist's steps (the same calls, kept in step with shortlist.py by hand), each one's
    process CPU time added to `spent`."""
    clock = time.process_time

    def shortlist(self, hidden, k, out=None):
        t0 = clock()
        acts = quantize_activations(hidden[None, :], self.kind.activations)
        t1 = clock()
        copy = self._approximate(acts)
        t2 = clock()
        out = np.full(self.n, -np.inf, np.float32) if out is None else out
        first = head_module.best_rows(copy.scores, max(1, min(k + head_module.MORE_FIRST, self.n)), copy.groups.keys)
        t3 = clock()
        self._exact_rows(acts, first, out)
        t4 = clock()
        floor = float(np.sort(out[first])[-min(k, len(first))])
        t5 = clock()
        rest = head_module.rows_reaching(copy.scores, self.c, copy.xnorm, floor, self.tiny, self.per_block,
                                         copy.xblocks, copy.groups.keys, self._group_c(), np.sort(first))
        t6 = clock()
        self._exact_rows(acts, rest, out)
        t7 = clock()
        ids = np.concatenate([first, rest])
        self.scored += len(ids)
        self.calls += 1
        rows["first"] += len(first)
        rows["rest"] += len(rest)
        result = head_module.Shortlisted(ids, out[ids])
        for part, spent_s in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6,
                                         clock() - t7), strict=True):
            spent[part] += spent_s
        return result

    return shortlist


def main(threads: int, tokens: int) -> dict:
    spent = dict.fromkeys(PARTS, 0.0)
    rows = {"first": 0, "rest": 0}
    head_module.OutputHead.shortlist = timed_shortlist(spent, rows)
    engine = Model(str(MODEL), n_ctx=1024, threads=threads, shortlist=True).engine
    engine.output.adaptive = False  # Shortlist on every token
    engine.head.prepare()
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [2], top=1)
    for _ in range(8):  # warm up
        logits = engine.decode(seq, int(np.argmax(logits)), top=1)
    spent.update(dict.fromkeys(PARTS, 0.0))
    rows.update(first=0, rest=0)
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [2], top=1)
    began, chosen = time.process_time(), []
    for _ in range(tokens):
        chosen.append(int(np.argmax(logits)))
        logits = engine.decode(seq, chosen[-1], top=1)
    token_ms = (time.process_time() - began) / tokens * 1e3
    return {"threads": threads, "token_ms": round(token_ms, 4),
            **{part: round(s / tokens * 1e3, 4) for part, s in spent.items()},
            "rows_first": rows["first"] / tokens, "rows_rest": rows["rest"] / tokens,
            "tokens_hash": hash(tuple(chosen))}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
