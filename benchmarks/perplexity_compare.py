"""Per-token comparison of perplexity runs against a float64 ground truth.

Owns: reading the .npz files benchmarks/perplexity_f64.py and benchmarks/perplexity_nll.py write
(per scored token: nll, target, chunk; optionally the scored logits), or a llama-perplexity
--kl-divergence-base file (.kld), and printing, for each run
against the truth: its perplexity and the difference in percent, the mean and mean absolute per-token
NLL difference, the correlation, the RMS logit error (logits centred per row, since a softmax ignores
a common shift); and for a pair of runs (say fast against ggml) how their gap is made: the mean
difference with its standard error over chunks, and how much of it the few tokens of largest
|difference| carry (a few huge ones = near-ties flipping; a broad shift = a systematic error).
Does not compute anything of a model.

    python benchmarks/perplexity_compare.py truth=/tmp/ppl11/smol_exact.npz ggml=... fast=... --pair fast,ggml
"""

from __future__ import annotations

import argparse

import numpy as np


def _from_kld_base(path: str) -> dict[str, np.ndarray]:
    """A llama-perplexity --kl-divergence-base file as a run: its stored log-probabilities (16 nats
    deep, in steps of about 2.4e-4 nats) stand in for the logits, and give the NLLs."""
    from kinetic.perplexity import read_kld_base, stored_log_probs

    base = read_kld_base(path)
    first = base.n_ctx // 2
    logp = np.concatenate([stored_log_probs(np.asarray(base.rows[i]), base.n_vocab) for i in range(base.n_chunk)])
    target = base.tokens[:, first + 1 :].reshape(-1).astype(np.int32)
    return {"nll": -logp[np.arange(len(target)), target].astype(np.float64), "target": target,
            "chunk": np.repeat(np.arange(base.n_chunk, dtype=np.int32), base.n_ctx - 1 - first), "logits": logp}


def _load(spec: str) -> tuple[str, dict[str, np.ndarray]]:
    name, path = spec.split("=", 1)
    if path.endswith(".kld"):
        return name, _from_kld_base(path)
    with np.load(path) as z:
        return name, {k: z[k] for k in z.files if k in ("nll", "target", "chunk", "logits")}


def ppl(nll: np.ndarray) -> float:
    return float(np.exp(nll.mean()))


def chunk_standard_error(d: np.ndarray, chunk: np.ndarray) -> float:
    """Standard error of mean(d) with chunks as the independent units (tokens of a chunk share context)."""
    means = np.array([d[chunk == c].mean() for c in np.unique(chunk)])
    return float(means.std(ddof=1) / np.sqrt(len(means))) if len(means) > 1 else float("nan")


def centred_rms(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, the RMS of the difference of the two rows of logits, each centred on its mean."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    d = (a - a.mean(axis=1, keepdims=True)) - (b - b.mean(axis=1, keepdims=True))
    return np.sqrt((d * d).mean(axis=1))


def nll_split(run_logits: np.ndarray, truth_logits: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact split of a row's NLL change under a logit error d = run - truth, with p the truth's
    softmax: dNLL = (E_p[d] - d_target) + (log E_p[exp d] - E_p[d]). The first term has mean zero when
    the error is independent of which token comes next; the second is >= 0 (Jensen): any error of the
    logits raises the expected NLL by about half the variance of d under p."""
    d = run_logits.astype(np.float64) - truth_logits.astype(np.float64)
    z = truth_logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    mean_d = (p * d).sum(axis=1)
    first = mean_d - d[np.arange(len(d)), target]
    second = np.log((p * np.exp(d - mean_d[:, None])).sum(axis=1))
    return first, second


def against_truth(name: str, run: dict, truth: dict) -> str:
    d = run["nll"] - truth["nll"]
    line = (f"{name:>10}: PPL {ppl(run['nll']):9.4f} ({100 * (ppl(run['nll']) / ppl(truth['nll']) - 1):+6.2f} %)"
            f"  mean dNLL {d.mean():+.5f} +/- {chunk_standard_error(d, truth['chunk']):.5f}"
            f"  mean|dNLL| {np.abs(d).mean():.5f}  corr {np.corrcoef(run['nll'], truth['nll'])[0, 1]:.6f}")
    if "logits" in run and "logits" in truth:
        n = min(len(run["logits"]), len(truth["logits"]))
        rms = centred_rms(run["logits"][:n], truth["logits"][:n])
        line += f"  logit RMS err median {np.median(rms):.4f} max {rms.max():.4f}"
        first, second = nll_split(run["logits"][:n], truth["logits"][:n], truth["target"][:n])
        line += (f"\n{'':12}dNLL over the first {n} tokens {(run['nll'][:n] - truth['nll'][:n]).mean():+.5f} = "
                 f"first order {first.mean():+.5f} +/- {chunk_standard_error(first, truth['chunk'][:n]):.5f} "
                 f"(mean zero for noise) + noise penalty {second.mean():+.5f} (>= 0)")
    return line


def gap_makeup(a_name: str, a: dict, b_name: str, b: dict, truth: dict | None, top: tuple[int, ...]) -> list[str]:
    """How the NLL gap a - b is made: its mean, its error over chunks, the share the top tokens carry."""
    d = a["nll"] - b["nll"]
    order = np.argsort(-np.abs(d))
    lines = [f"gap {a_name} - {b_name}: mean {d.mean():+.5f} nats/token (PPL ratio {np.exp(d.mean()):.4f}) "
             f"+/- {chunk_standard_error(d, a['chunk']):.5f} (chunk s.e.), mean|d| {np.abs(d).mean():.5f}, "
             f"median|d| {np.median(np.abs(d)):.5f}, {np.mean(d > 0) * 100:.1f} % of tokens positive"]
    for k in top:
        kept = np.ones_like(d, bool)
        kept[order[:k]] = False
        lines.append(f"  top {k:4d} tokens by |d| carry sum {d[order[:k]].sum():+.3f} of {d.sum():+.3f} nats; "
                     f"without them PPL ratio {np.exp(d[kept].mean()):.4f}")
    worst = order[:8]
    cols = "".join(f" {i}:{d[i]:+.3f}" for i in worst)
    lines.append(f"  largest (token index: d):{cols}")
    if truth is not None:
        ea, eb = np.abs(a["nll"] - truth["nll"]), np.abs(b["nll"] - truth["nll"])
        lines.append(f"  closer to the truth per token: {a_name} {np.mean(ea < eb) * 100:.1f} %, "
                     f"{b_name} {np.mean(eb < ea) * 100:.1f} %; mean |err| {ea.mean():.5f} vs {eb.mean():.5f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="name=file.npz; the first is the truth")
    ap.add_argument("--pair", action="append", default=[], help="a,b: how the gap a - b is made")
    ap.add_argument("--top", default="5,20,100")
    args = ap.parse_args()
    runs = dict(_load(s) for s in args.runs)
    truth_name = args.runs[0].split("=", 1)[0]
    truth = runs[truth_name]
    n = min(len(r["nll"]) for r in runs.values())  # a truth stopped early: compare the tokens it scored
    runs = {k: {f: (v if f == "logits" else v[:n]) for f, v in r.items()} for k, r in runs.items()}
    truth = runs[truth_name]
    for name, run in runs.items():
        if not np.array_equal(run["target"], truth["target"]):
            raise SystemExit(f"{name} scored other tokens than {truth_name}")
    print(f"{truth_name:>10}: PPL {ppl(truth['nll']):9.4f} over {len(truth['nll'])} tokens (the truth)")
    for name, run in runs.items():
        if name != truth_name:
            print(against_truth(name, run, truth))
    top = tuple(int(k) for k in args.top.split(","))
    for pair in args.pair:
        a, b = pair.split(",")
        print("\n".join(gap_makeup(a, runs[a], b, runs[b], truth, top)))


if __name__ == "__main__":
    main()
