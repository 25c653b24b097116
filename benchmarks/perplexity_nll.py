"""Kinetic's per-token negative log-likelihoods on a text, as `kinetic perplexity -c N` scores it.

Owns: running the same chunks and scored positions as kinetic/cli/perplexity_cmd.py through the
Python API (kinetic.perplexity.split_chunks / chunk_logits / token_nll) in one numerics mode, and
saving per token the NLL, the target and, for the first `--keep-logits` chunks, the scored logits,
so benchmarks/perplexity_f64.py can compare them with its float64 ground truth. `--orders` runs
the fast mode with only some of its orders (matmul / attention) by narrowing
kinetic.ir.orders.FAST_ORDERS in this process. Does not own the scoring (kinetic/perplexity.py).

    python benchmarks/perplexity_nll.py MODEL TEXT --numerics fast -o /tmp/ppl11/smol_fast.npz
"""

from __future__ import annotations

import time

import numpy as np
from perplexity_common import save_run, scoring_parser  # beside this script, on sys.path when run

from kinetic import perplexity as ppl
from kinetic.cli.perplexity_cmd import _bos, _read_text


def _narrow_fast_orders(keep: str | None) -> None:
    """Keeps only the named fast orders ("matmul", "attention"); the others fall back to ggml's."""
    if keep is None:
        return
    from kinetic.ir import orders

    for op in list(orders.FAST_ORDERS):
        if op not in keep.split(","):
            del orders.FAST_ORDERS[op]


def collect(model_spec: str, text_path: str, *, n_ctx: int, numerics: str, threads: int | None,
            keep_logits: int, chunks: int = -1) -> dict[str, np.ndarray]:
    """Per scored token: nll f64 [n], target i32 [n], chunk i32 [n], position i32 [n]; logits f32
    [m, n_vocab] of the first keep_logits chunks' scored positions."""
    from kinetic.frontend.blocks import Options
    from kinetic.model import Model

    model = Model(model_spec, n_ctx=n_ctx, threads=threads, options=Options(numerics=numerics))
    tokens = model.tokenize(_read_text(text_path), add_special=True, parse_special=False)
    all_chunks = ppl.split_chunks(tokens, n_ctx, chunks)
    nll, target, chunk_of, pos, kept = [], [], [], [], []
    for i, chunk in enumerate(all_chunks):
        for row, logits in ppl.chunk_logits(model.engine, chunk, _bos(model), model.engine.batch):
            first = n_ctx // 2 + row
            tgt = chunk[first + 1 : first + 1 + len(logits)]
            nll.append(ppl.token_nll(logits, tgt))
            target.append(tgt)
            chunk_of.append(np.full(len(tgt), i, np.int32))
            pos.append(np.arange(first, first + len(tgt), dtype=np.int32))
            if i < keep_logits:
                kept.append(np.asarray(logits, np.float32))
    out = {"nll": np.concatenate(nll), "target": np.concatenate(target).astype(np.int32),
           "chunk": np.concatenate(chunk_of), "position": np.concatenate(pos),
           "chunks": all_chunks, "bos": np.int32(-1 if _bos(model) is None else _bos(model))}
    if kept:
        out["logits"] = np.concatenate(kept)
    return out


def main() -> None:
    ap = scoring_parser(__doc__)
    ap.add_argument("--numerics", default="ggml")
    ap.add_argument("--orders", help="fast orders to keep, comma-separated (matmul,attention)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    _narrow_fast_orders(args.orders)
    started = time.perf_counter()
    out = collect(args.model, args.text, n_ctx=args.ctx_size, numerics=args.numerics, threads=args.threads,
                  keep_logits=args.keep_logits, chunks=args.chunks)
    save_run(args.output, out, args.numerics + ("/" + args.orders if args.orders else ""), started)


if __name__ == "__main__":
    main()
