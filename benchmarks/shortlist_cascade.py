"""Which copies of Gemma 3 270M's output layer could exclude rows: the share of its 262,144 rows whose
Shortlist bound reaches the k-th best score, for 4-, 3- and 2-bit copies, on real hidden rows
(docs/shortlist.md, "Why 4 bits, and why not a cascade").

Hidden rows: greedy decoding after every golden prompt (raw and chat; the prefill's last row and
STEPS more), or every row of a window of tests/data/golden/common-licenses.txt. Per copy, in f64 from
the exact Q8_0 values: the copy's score A and four bounds on |S - A| (S the exact score): the row's
||w - w'|| ||x||, the block bound sum_b ||w_b - w'_b|| ||x_b|| (what Shortlist uses), per block the
smaller of that and max|w_b - w'_b| ||x_b||_1, and Cauchy-Schwarz over 8-wide sub-blocks. Float
rounding (gamma_K terms, about 2^-15 of the norms) is left out: it moves no share shown.

    python benchmarks/shortlist_cascade.py collect            # hidden rows -> /tmp/shortlist_rows_*.npy
    python benchmarks/shortlist_cascade.py study greedy 4s,4e,3s  # shares for those copies

Copies: 4s/3s/2s symmetric (Q4_0's rule: step = largest-magnitude value / -2^(bits-1), f16), 4e the
same 4-bit rule with the scale rounded out to E5M2 (one byte; tried in issue 23, not kept), 4b64 one f16 scale per
64 weights, 3a/2a a scale and a minimum (two f16s). Takes about 5 minutes a copy on 2 vCPUs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

from kinetic.codegen.cpu.matmul import quantize_activations

MODEL = Path.home() / ".local/share/kinetic/models/gemma-3-270m-q4_k_m.gguf"
ROWS = "/tmp/shortlist_rows_{}.npy"
K, NB, STEPS, CHUNK = 640, 20, 32, 8192
COPIES = {"4s": (4, True, ""), "4e": (4, True, "e5m2"), "4b64": (4, True, "b64"), "3s": (3, True, ""),
          "3a": (3, False, ""), "2s": (2, True, ""), "2a": (2, False, "")}


def collect() -> None:
    """Save the hidden rows Shortlist's head sees in greedy decoding and over a text window."""
    from kinetic.ir.rows import PassRows
    from kinetic.model import Model
    from kinetic.runtime.kv_cache import SequenceCaches
    from tests.conftest import load_golden
    from tests.runtime.decoding_helpers import greedy_with_scores

    model = Model(str(MODEL), n_ctx=2048, threads=2)
    engine, seen = model.engine, []
    engine.output.adaptive = False
    logits = engine.head.logits
    engine.head.logits = lambda hidden, top: (seen.append(np.array(hidden)), logits(hidden, top))[1]
    golden = load_golden("gemma3-270m")
    for case in golden["raw"] + golden["chat"]:
        greedy_with_scores(engine, list(case["prompt_ids"]), STEPS, 1)
    np.save(ROWS.format("greedy"), np.concatenate(seen))
    text = (Path(__file__).parents[1] / "tests/data/golden/common-licenses.txt").read_text()
    tokens = model.tokenize(text[20000:40000], add_special=True, parse_special=False)[:256]
    caches = SequenceCaches({0: engine.new_sequence().cache})
    ran = engine.runner.run(engine._run_graph, PassRows.chain(tokens, 0, outputs="all"), caches)
    np.save(ROWS.format("text"), np.array(ran.outputs["hidden"]))


def e5m2_up(d: np.ndarray) -> np.ndarray:
    """f32 steps -> the E5M2 byte (an f16's high byte) of the nearest value at or beyond each in
    magnitude (so no code clips below the lowest level), u8."""
    with np.errstate(over="ignore"):
        h = d.astype(np.float16)
    bits = h.view(np.uint16).astype(np.int32)
    bits += np.abs(h.astype(np.float32)) < np.abs(d)  # f16's rounding went toward zero: one step out
    bits = np.where(bits & 0xFF, (bits & 0xFF00) + 0x100, bits)  # out to the next 2-mantissa-bit value
    return (bits >> 8).astype(np.uint8)


def e5m2_values(scales: np.ndarray) -> np.ndarray:
    """E5M2 bytes u8 -> their values f32 (each an f16: the byte shifted up by 8 bits)."""
    return (scales.astype(np.uint16) << 8).view(np.float16).astype(np.float32)


def copy_values(w: np.ndarray, bits: int, symmetric: bool, mode: str = "") -> np.ndarray:
    """Q8_0 values f64 [m, blocks, 32] -> the copy's values, codes rounded to nearest."""
    if mode == "b64":
        return copy_values(w.reshape(len(w), -1, 64), bits, symmetric).reshape(w.shape)
    if symmetric:
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        biggest = np.take_along_axis(w, np.abs(w).argmax(2)[..., None], 2)[..., 0]
        step = (biggest / low).astype(np.float32)
        d = (e5m2_values(e5m2_up(step)) if mode == "e5m2" else step.astype(np.float16)).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.clip(np.nan_to_num(np.floor(w / d[..., None] + 0.5)), low, high)
        return d[..., None] * q
    lo, hi = w.min(2), w.max(2)
    d = ((hi - lo) / (2 ** bits - 1)).astype(np.float16).astype(np.float64)
    m = lo.astype(np.float16).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.nan_to_num(np.round((w - m[..., None]) / d[..., None])), 0, 2 ** bits - 1)
    return m[..., None] + d[..., None] * q


def study(which: str, names: list[str]) -> None:
    """Print, per copy and bound, the share of rows passing for k = 1 and k = 40."""
    reader = gguf.GGUFReader(str(MODEL))
    raw = np.asarray(next(t for t in reader.tensors if t.name == "token_embd.weight").data).reshape(-1, NB * 34)
    hidden = np.load(ROWS.format(which))
    acts = quantize_activations(hidden.astype(np.float32), "q8_0")
    x = acts.q.astype(np.float64).reshape(len(hidden), NB, 32) * acts.d.astype(np.float64).reshape(len(hidden), NB, 1)
    x2, x1 = np.sqrt((x ** 2).sum(2)), np.abs(x).sum(2)  # [H, blocks]
    x8 = np.sqrt((x.reshape(len(hidden), NB * 4, 8) ** 2).sum(2))
    xflat, n = x.reshape(len(hidden), K), len(raw)
    exact = np.empty((n, len(hidden)))
    kinds = ("row", "block", "min(L2, Linf L1)", "sub-block 8")
    score = {c: np.empty((n, len(hidden)), np.float32) for c in names}
    bound = {(c, b): np.empty((n, len(hidden)), np.float32) for c in names for b in kinds}
    for s in range(0, n, CHUNK):
        blocks = raw[s:s + CHUNK].reshape(-1, NB, 34)
        w = blocks[:, :, :2].copy().view(np.float16).astype(np.float64) * blocks[:, :, 2:].view(np.int8)
        exact[s:s + CHUNK] = w.reshape(-1, K) @ xflat.T
        for c in names:
            copy = copy_values(w, *COPIES[c])
            e = w - copy
            score[c][s:s + CHUNK] = copy.reshape(-1, K) @ xflat.T
            eb = np.sqrt((e ** 2).sum(2))
            bound[c, "row"][s:s + CHUNK] = np.sqrt((eb ** 2).sum(1))[:, None] * np.sqrt((x2 ** 2).sum(1))[None]
            bound[c, "block"][s:s + CHUNK] = eb @ x2.T
            both = np.minimum(eb[:, :, None] * x2.T[None], np.abs(e).max(2)[:, :, None] * x1.T[None])
            bound[c, "min(L2, Linf L1)"][s:s + CHUNK] = both.sum(1)
            bound[c, "sub-block 8"][s:s + CHUNK] = np.sqrt((e.reshape(-1, NB * 4, 8) ** 2).sum(2)) @ x8.T
    for k in (1, 40):
        floor = -np.sort(-exact, axis=0)[k - 1]
        print(f"{which}, k = {k}, {len(hidden)} rows: share of rows passing, median / p90 / max (%)")
        for c in names:
            shares = [((score[c] + bound[c, b]) >= floor[None]).mean(0) * 100 for b in kinds]
            print(f"  {c}: " + " | ".join(f"{b} {np.median(f):.3f}/{np.percentile(f, 90):.3f}/{f.max():.2f}"
                                         for b, f in zip(kinds, shares, strict=True)))


if __name__ == "__main__":
    if sys.argv[1] == "collect":
        collect()
    else:
        study(sys.argv[2], sys.argv[3].split(","))
