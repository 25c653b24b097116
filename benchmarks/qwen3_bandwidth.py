"""Does a qwen3-shaped model decode at the same share of memory bandwidth as SmolLM2 (issue 18)?

Makes (once) a qwen3 file of SmolLM2-135M's size with random weights and SmolLM2's types: 30 layers,
width 576, 9 heads x 64 over 3 KV heads, per-head q/k norms, feed-forward 1536, SmolLM2's tokenizer
and chat template (49152 tokens), Q4_1 projections and a tied Q8_0 embedding, written to
~/.cache/kinetic/bench/ (never committed). Then runs `kinetic bench FILE -t T -r R --json --device
cpu -p 0 --edit-tokens 0` on SmolLM2 and on it, alternating which goes first, --rounds times, and
prints each round's tg128 (best of R) as effective bandwidth: the bytes a decoded token reads (every
weight once; both files tie the output to the embedding, so the whole table is read as the output
projection) times tokens per second. Both models' KV caches are the same size, so the bandwidth
shares compare as these numbers do (the machine's peak is the same denominator).

On a loaded machine the bench runs (minutes apart) see different loads; --bursts N instead loads
both models in one process and alternates bursts of 32 decode steps between them N times each (the
same positions every burst: the sequence is rolled back), then reports each model's fastest and
median burst: the fastest bursts are the ones least slowed by other processes; the medians compare
two models that took turns under the same load.

    python benchmarks/qwen3_bandwidth.py [--smollm2 PATH] [--threads 2] [--repeat 3] [--rounds 3]
    python benchmarks/qwen3_bandwidth.py --bursts 40 [--threads 2]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from bandwidth_common import (
    QT,
    RandomWeights,
    Tensors,
    attention_tensors,
    bytes_per_token,
    cached_model,
    decoder_keys,
    ffn_tensors,
    parser,
    report_bursts,
    write_smollm2_sized,
)
from made_models import donor_vocab

SHAPE = dict(n_layer=30, n_embd=576, n_head=9, n_head_kv=3, head_dim=64, n_ff=1536)
SEED = 20261201


def make_qwen3(smollm2: Path, dest: Path) -> Path:
    """The qwen3 file: SmolLM2's tokenizer keys, qwen3 hyperparameters, random weights."""
    s, n_vocab = SHAPE, donor_vocab(smollm2)
    uints = decoder_keys(s, n_vocab)
    floats = {"rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6}
    return write_smollm2_sized(smollm2=smollm2, dest=dest, arch="qwen3",
                               name="qwen3-shaped random weights, SmolLM2-135M's size", uints=uints,
                               floats=floats, arrays={}, tensors=_tensors(RandomWeights(SEED), n_vocab))


def _tensors(r: RandomWeights, n_vocab: int) -> Tensors:
    """(name, f32 array in numpy order [rows, row length], type)."""
    s, w = SHAPE, SHAPE["n_embd"]
    yield "token_embd.weight", r.embedding(n_vocab, w), QT.Q8_0
    yield "output_norm.weight", r.norm(w), QT.F32
    for il in range(s["n_layer"]):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", r.norm(w), QT.F32
        yield from attention_tensors(r, p, s, q_rows=s["n_head"] * s["head_dim"])
        yield p + "ffn_norm.weight", r.norm(w), QT.F32
        yield from ffn_tensors(r, p, s)


def tg_best(path: Path, threads: int, repeat: int) -> float:
    cmd = [sys.executable, "-m", "kinetic.cli.main", "bench", str(path), "-t", str(threads), "-r", str(repeat),
           "--json", "--device", "cpu", "-p", "0", "--edit-tokens", "0"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return out["decode_tokens_per_second"]


def report_ratio(models: dict[str, Path], threads: int, n_bursts: int) -> None:
    """The bursts' report, then qwen3's bandwidth over SmolLM2's at the fastest and the median bursts."""
    size, seconds = report_bursts(models, threads, n_bursts)
    fastest = {k: size[k] / min(v) for k, v in seconds.items()}
    typical = {k: size[k] / statistics.median(v) for k, v in seconds.items()}
    print(f"qwen3/smollm2 bandwidth: fastest bursts {fastest['qwen3'] / fastest['smollm2']:.3f}, "
          f"median bursts {typical['qwen3'] / typical['smollm2']:.3f}")


def main() -> None:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bursts", type=int, default=0, help="in-process alternating bursts instead of bench runs")
    args = ap.parse_args()
    dest = cached_model("qwen3-smollm2-size.Q4_1.gguf", lambda part: make_qwen3(args.smollm2, part))
    models = {"smollm2": args.smollm2, "qwen3": dest}
    if args.bursts:
        report_ratio(models, args.threads, args.bursts)
        return
    size = {k: bytes_per_token(p) for k, p in models.items()}
    gbs: dict[str, list[float]] = {k: [] for k in models}
    for r in range(args.rounds):
        for k in (list(models) if r % 2 == 0 else list(models)[::-1]):
            t_s = tg_best(models[k], args.threads, args.repeat)
            gbs[k].append(size[k] * t_s / 1e9)
            print(f"round {r}: {k:8s} tg128 {t_s:7.1f} t/s  {size[k] / 2**20:6.1f} MiB/token  "
                  f"{gbs[k][-1]:5.2f} GB/s", flush=True)
    ratios = [q / s for q, s in zip(gbs["qwen3"], gbs["smollm2"], strict=True)]
    print(f"median GB/s: smollm2 {statistics.median(gbs['smollm2']):.2f}, qwen3 {statistics.median(gbs['qwen3']):.2f}; "
          f"qwen3/smollm2 per round {', '.join(f'{x:.3f}' for x in ratios)} (median {statistics.median(ratios):.3f})")


if __name__ == "__main__":
    main()
