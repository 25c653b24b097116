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

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np

from kinetic.frontend.gguf_file import open_gguf
from kinetic.hub import models_dir
from kinetic.user_cache import cache_dir

SHAPE = dict(n_layer=30, n_embd=576, n_head=9, n_head_kv=3, head_dim=64, n_ff=1536)
QT = gguf.GGMLQuantizationType
SEED = 20261201


def make_qwen3(smollm2: Path, dest: Path) -> Path:
    """The qwen3 file: SmolLM2's tokenizer keys, qwen3 hyperparameters, random weights."""
    donor = gguf.GGUFReader(smollm2)
    writer = gguf.GGUFWriter(dest, "qwen3")
    for key, field in donor.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    n_vocab = len(donor.fields["tokenizer.ggml.tokens"].contents())
    s = SHAPE
    writer.add_name("qwen3-shaped random weights, SmolLM2-135M's size")
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_1))
    for key, value in {"context_length": 8192, "embedding_length": s["n_embd"], "block_count": s["n_layer"],
                       "feed_forward_length": s["n_ff"], "attention.head_count": s["n_head"],
                       "attention.head_count_kv": s["n_head_kv"], "attention.key_length": s["head_dim"],
                       "attention.value_length": s["head_dim"], "vocab_size": n_vocab}.items():
        writer.add_uint32(f"qwen3.{key}", value)
    writer.add_float32("qwen3.rope.freq_base", 1000000.0)
    writer.add_float32("qwen3.attention.layer_norm_rms_epsilon", 1e-6)
    rng = np.random.default_rng(SEED)
    for name, arr, qtype in _tensors(rng, n_vocab):
        writer.add_tensor(name, gguf.quants.quantize(arr, qtype) if qtype != QT.F32 else arr, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def _tensors(rng, n_vocab: int):
    """(name, f32 array in numpy order [rows, row length], type): norms near 1, weights of fan-in scale."""
    s = SHAPE
    w, ff, hd = s["n_embd"], s["n_ff"], s["head_dim"]
    q, kv = s["n_head"] * hd, s["n_head_kv"] * hd

    def dense(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    yield "token_embd.weight", (0.15 * rng.standard_normal((n_vocab, w), dtype=np.float32)), QT.Q8_0
    yield "output_norm.weight", norm(w), QT.F32
    for il in range(s["n_layer"]):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", norm(w), QT.F32
        yield p + "attn_q.weight", dense(q, w), QT.Q4_1
        yield p + "attn_k.weight", dense(kv, w), QT.Q4_1
        yield p + "attn_v.weight", dense(kv, w), QT.Q4_1
        yield p + "attn_q_norm.weight", norm(hd), QT.F32
        yield p + "attn_k_norm.weight", norm(hd), QT.F32
        yield p + "attn_output.weight", dense(w, q), QT.Q4_1
        yield p + "ffn_norm.weight", norm(w), QT.F32
        yield p + "ffn_gate.weight", dense(ff, w), QT.Q4_1
        yield p + "ffn_up.weight", dense(ff, w), QT.Q4_1
        yield p + "ffn_down.weight", dense(w, ff), QT.Q4_1


def bytes_per_token(path: Path) -> int:
    """Weight bytes one decoded token reads: every tensor once (the tied embedding as the output)."""
    return sum(info.nbytes for info in open_gguf(path).tensors.values())


def tg_best(path: Path, threads: int, repeat: int) -> float:
    cmd = [sys.executable, "-m", "kinetic.cli.main", "bench", str(path), "-t", str(threads), "-r", str(repeat),
           "--json", "--device", "cpu", "-p", "0", "--edit-tokens", "0"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return out["decode_tokens_per_second"]


def burst_seconds(models: dict[str, Path], threads: int, n_bursts: int, steps: int = 32) -> dict[str, list[float]]:
    """Per-token seconds of each burst of `steps` greedy decode steps, the models taking turns."""
    from kinetic.model import Model

    engines = {k: Model(p, n_ctx=steps + 2, device="cpu", threads=threads, draft=False).engine
               for k, p in models.items()}
    seqs, firsts = {}, {}
    for k, engine in engines.items():
        seqs[k] = engine.new_sequence()
        firsts[k] = int(np.argmax(engine.prefill(seqs[k], [0])))
        for _ in range(steps):  # untimed warm-up burst
            engine.decode(seqs[k], firsts[k])
        engine.rollback(seqs[k], 1)
    out: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(n_bursts):
        for k, engine in engines.items():
            token, start = firsts[k], time.perf_counter()
            for _ in range(steps):
                token = int(np.argmax(engine.decode(seqs[k], token)))
            out[k].append((time.perf_counter() - start) / steps)
            engine.rollback(seqs[k], 1)
    return out


def report_bursts(models: dict[str, Path], threads: int, n_bursts: int) -> None:
    size = {k: bytes_per_token(p) for k, p in models.items()}
    seconds = burst_seconds(models, threads, n_bursts)
    for k, per_token in seconds.items():
        best, median = min(per_token), statistics.median(per_token)
        print(f"{k:8s} {size[k] / 2**20:6.1f} MiB/token  fastest burst {1 / best:6.1f} t/s = "
              f"{size[k] / best / 1e9:5.2f} GB/s, median {1 / median:6.1f} t/s = {size[k] / median / 1e9:5.2f} GB/s")
    fastest = {k: size[k] / min(v) for k, v in seconds.items()}
    typical = {k: size[k] / statistics.median(v) for k, v in seconds.items()}
    print(f"qwen3/smollm2 bandwidth: fastest bursts {fastest['qwen3'] / fastest['smollm2']:.3f}, "
          f"median bursts {typical['qwen3'] / typical['smollm2']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", type=Path, default=models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bursts", type=int, default=0, help="in-process alternating bursts instead of bench runs")
    args = ap.parse_args()
    dest = cache_dir("bench", "qwen3-smollm2-size.Q4_1.gguf")
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        make_qwen3(args.smollm2, dest.with_suffix(".part")).rename(dest)
    models = {"smollm2": args.smollm2, "qwen3": dest}
    if args.bursts:
        report_bursts(models, args.threads, args.bursts)
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
