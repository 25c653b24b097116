"""What the per-token perplexity benchmarks (perplexity_f64.py, perplexity_nll.py) share: the arguments
that choose the scored tokens, so the float64 truth and Kinetic's runs score the same chunks and
positions for benchmarks/perplexity_compare.py to pair, and how a run is saved and reported.

Does not own the scoring (each script's own) nor the comparison (perplexity_compare.py).
Scripts beside it import it by name: running `python benchmarks/X.py` puts this folder on sys.path.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def scoring_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the script's docstring's first paragraph, with the arguments both sides
    take: MODEL TEXT, -c/--ctx-size (chunk length), --chunks (-1: all), --keep-logits N, -o/--output."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("-c", "--ctx-size", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=-1)
    ap.add_argument("--keep-logits", type=int, default=0, metavar="N", help="save the logits of the first N chunks")
    ap.add_argument("-o", "--output", required=True)
    return ap


def save_run(path: str, out: dict[str, np.ndarray], label: str, started: float) -> None:
    """Writes a run's arrays to `path` (.npz) and prints its label, scored tokens, perplexity
    exp(mean NLL) and the seconds since `started` (time.perf_counter)."""
    np.savez(path, **out)
    print(f"{label}: {len(out['nll'])} tokens, PPL {np.exp(out['nll'].mean()):.4f} "
          f"({time.perf_counter() - started:.0f} s) -> {path}")
