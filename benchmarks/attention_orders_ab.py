"""CPU attention alone in its two orders over an f16 cache, A/B in one process: "key_chain_f16"
(ggml's f16 value accumulator) against "key_chain_f16_acc32" (an f32 one), alternating runs on one
thread (the thread's CPU time, so outside load inflates both alike), medians and bests reported.

* prompt: one pass of ROWS rows of one sequence over itself (causal), through the tile kernels
  (step_attention.attend_tiles on attention_tile_ir's kernel rendered for each order), at
  SmolLM2-135M's shape (9 heads, 3 KV heads, head dim 64) and Gemma 3 270M's (4 heads, 1 KV head,
  head dim 256, sliding window 512);
* decode: one row over ROWS cached keys through the one-row score and softmax kernels
  (step_attention.attend_items, attention_ir).

    python benchmarks/attention_orders_ab.py [--rows 512] [--runs 9]
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from types import SimpleNamespace

import numpy as np

from kinetic.codegen.cpu.attention_ir import heads_per_call, render_scores, render_softmax
from kinetic.codegen.cpu.attention_tile_ir import render_tile
from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.step_attention import attend_items, attend_tiles

SHAPES = {"smollm2-135m": SimpleNamespace(n_head=9, n_kv_head=3, head_dim=64, scale=0.125, window=0),
          "gemma3-270m": SimpleNamespace(n_head=4, n_kv_head=1, head_dim=256, scale=1.0, window=512)}
ACCUMULATORS = {"key_chain_f16": "f16", "key_chain_f16_acc32": "f32"}


class Prompt:
    """One sequence's pass of `rows` rows with random q, keys and values (the cache holds the pass's rows)."""

    def __init__(self, a, rows: int, rng):
        self.a, self.rows = a, rows
        width, kv_width = a.n_head * a.head_dim, a.n_kv_head * a.head_dim
        self.arena = np.zeros(2 * rows * width, np.float32)
        self.arena[: rows * width] = rng.standard_normal(rows * width).astype(np.float32)
        self.keys = rng.standard_normal((rows, kv_width)).astype(np.float16)
        self.vals = rng.standard_normal((rows, kv_width)).astype(np.float16)
        self.kp, self.vp = (np.array([x.ctypes.data], np.int64) for x in (self.keys, self.vals))
        self.positions = np.arange(rows, dtype=np.int32)
        self.slot_rows = np.arange(rows, dtype=np.int32)[None, :]
        self.anc = np.tri(rows, dtype=np.uint8)
        self.cpos = np.zeros(1, np.int32)
        self.cpos_addr = np.array([self.cpos.ctypes.data], np.int64)
        self.bits = int(np.float32(a.scale).view(np.uint32))

    def _head(self):
        a = self.a
        return (self.arena, 0, self.rows * a.n_head * a.head_dim, self.kp, self.vp, a.n_kv_head * a.head_dim,
                a.n_head, a.n_kv_head, a.head_dim)

    def tiles(self, tile_fn: int) -> np.ndarray:
        attend_tiles(*self._head(), self.a.window, 0, 1, self.positions, self.slot_rows, np.zeros(1, np.int64),
                     self.cpos_addr, self.anc, tile_fn, self.bits, 0)
        return self.arena[self.rows * self.a.n_head * self.a.head_dim:].copy()

    def decode(self, kernels: tuple[int, int, int], f32_acc: bool) -> np.ndarray:
        """The last row alone over every key (its items in turn)."""
        score_fn, softmax_fn, heads = kernels
        last = self.rows - 1
        attend_items(*self._head(), np.float32(self.a.scale), np.float32(0), self.a.window,
                     last * (self.a.n_head // heads), self.rows * (self.a.n_head // heads), 1, self.positions,
                     np.zeros(self.rows, np.int32), self.slot_rows, np.zeros(1, np.int64), self.cpos_addr, self.anc,
                     score_fn, softmax_fn, heads, self.bits, 0, f32_acc)
        return self.arena[self.rows * self.a.n_head * self.a.head_dim:].copy()


def _timed(run, runs: int) -> tuple[list[float], np.ndarray]:
    times, out = [], None
    for _ in range(runs):
        start = time.thread_time()
        out = run()
        times.append(time.thread_time() - start)
    return times, out


def _compare(title: str, runners: dict, runs: int, work: int, rows: slice = slice(None)) -> None:
    """Alternate the orders' runs; print the median and best per order, ns per unit of `work`, and how
    many output floats of `rows` differ between the orders."""
    times = {order: [] for order in runners}
    outs = {}
    for _ in range(runs):
        for order, run in runners.items():
            t, outs[order] = _timed(run, 1)
            times[order] += t
    print(f"\n{title}")
    for order, ts in times.items():
        med, best = float(np.median(ts)), min(ts)
        print(f"  {order:22s} median {1e3 * med:8.2f} ms  best {1e3 * best:8.2f} ms  {1e9 * med / work:6.2f} ns a unit")
    a, b = (out[rows] for out in outs.values())
    print(f"  outputs differ in {np.count_nonzero(a.view(np.uint32) != b.view(np.uint32))} of {a.size} floats")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    jit = default_jit()
    for model, a in SHAPES.items():
        p = Prompt(a, args.rows, np.random.default_rng(0))
        seen = sum(min(r + 1, a.window or r + 1) for r in range(args.rows))  # (row, key) pairs a head sees
        tiles = {order: jit.address(*render_tile(a.head_dim, False, accumulator=acc))
                 for order, acc in ACCUMULATORS.items()}
        _compare(f"{model} prompt of {args.rows} rows, tiles (ns a unit: per row, head and visible key)",
                 {order: partial(p.tiles, fn) for order, fn in tiles.items()}, args.runs, seen * a.n_head)
        heads = heads_per_call(a.n_head // a.n_kv_head, a.n_kv_head, 1)
        score = jit.address(*render_scores(a.head_dim, heads))
        decode = {}
        for order, acc in ACCUMULATORS.items():
            softmax = jit.address(*render_softmax(a.head_dim, heads, False, accumulator=acc))
            decode[order] = partial(p.decode, (score, softmax, heads), acc == "f32")
        keys = min(args.rows, a.window or args.rows)
        width = a.n_head * a.head_dim
        _compare(f"{model} decode, one row over {keys} keys (ns a unit: per head and key)", decode,
                 args.runs * 20, keys * a.n_head, slice((args.rows - 1) * width, args.rows * width))


if __name__ == "__main__":
    main()
