"""Where Shortlist's time goes in a decode token, per part: Gemma 3 270M greedy from BOS (what `kinetic
bench`'s tg measures), Shortlist forced on, process CPU time per token (docs/shortlist.md, "Exact rows").

The parts are OutputHead.shortlist's own steps, timed by the head's `step_times` hook (shortlist.StepTimes,
marked in the real code where each step ends): quant (the activations), copy (the copy scan and its group
maxima), best (the k + 7 best-looking rows), exact_first (their exact scores), floor, reach
(rows_reaching: row bound, then block bound), exact_rest (the exact scores of the rows reaching the
floor), glue (the rest of the call); token_ms is the whole token (the cut graph's pass included). Also
the rows scored a token.

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

from kinetic.codegen.cpu.shortlist import STEPS, StepTimes
from kinetic.model import Model

MODEL = Path.home() / ".local/share/kinetic/models/gemma-3-270m-q4_k_m.gguf"


def main(threads: int, tokens: int) -> dict:
    engine = Model(str(MODEL), n_ctx=1024, threads=threads, shortlist=True).engine
    engine.output.adaptive = False  # Shortlist on every token
    engine.head.prepare()
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [2], top=1)
    for _ in range(8):  # warm up
        logits = engine.decode(seq, int(np.argmax(logits)), top=1)
    times = engine.head.step_times = StepTimes()
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [2], top=1)
    began, chosen = time.process_time(), []
    for _ in range(tokens):
        chosen.append(int(np.argmax(logits)))
        logits = engine.decode(seq, chosen[-1], top=1)
    token_ms = (time.process_time() - began) / tokens * 1e3
    return {"threads": threads, "token_ms": round(token_ms, 4),
            **{step: round(times.spent[step] / tokens * 1e3, 4) for step in STEPS},
            "rows_first": times.rows["exact_first"] / tokens, "rows_rest": times.rows["exact_rest"] / tokens,
            "tokens_hash": hash(tuple(chosen))}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
