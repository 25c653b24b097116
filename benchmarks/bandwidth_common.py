"""What the bandwidth benchmarks (qwen3_bandwidth.py, qwen35_bandwidth.py) share.

Owns: a SmolLM2-sized file of another architecture (SmolLM2's tokenizer keys, the family's
hyperparameters, random float weights quantized to the given types; written by made_models.py), the
random weights' scales, the cached file under ~/.cache/kinetic/bench/, the bytes a decoded token
reads, and the in-process alternating decode bursts with their report.
Does not own: any one family's shape or tensor list (each benchmark yields its own tensors).

Scripts beside it import it by name: running `python benchmarks/X.py` puts this folder on sys.path.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np
from made_models import tokenizer_only, write_gguf

from kinetic.frontend.gguf_file import open_gguf
from kinetic.hub import models_dir
from kinetic.user_cache import cache_dir

QT = gguf.GGMLQuantizationType
Tensors = Iterator[tuple[str, np.ndarray, "gguf.GGMLQuantizationType"]]


class RandomWeights:
    """Random weights of realistic scale: norms near 1, projections of fan-in scale, a small embedding."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def dense(self, rows: int, cols: int) -> np.ndarray:
        """f32 [rows, cols], standard normal over sqrt(cols)."""
        return (self.rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float32)

    def norm(self, n: int) -> np.ndarray:
        """f32 [n] near 1."""
        return (1 + 0.1 * self.rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def embedding(self, n_vocab: int, width: int) -> np.ndarray:
        """f32 [n_vocab, width], standard normal times 0.15."""
        return 0.15 * self.rng.standard_normal((n_vocab, width), dtype=np.float32)


def attention_tensors(r: RandomWeights, prefix: str, shape: dict[str, int], *, q_rows: int) -> Tensors:
    """One attention layer's projections (Q4_1) and per-head q/k norms: q of `q_rows` rows, k and v of
    n_head_kv heads, the output back to the width."""
    w, hd = shape["n_embd"], shape["head_dim"]
    kv = shape["n_head_kv"] * hd
    yield prefix + "attn_q.weight", r.dense(q_rows, w), QT.Q4_1
    yield prefix + "attn_k.weight", r.dense(kv, w), QT.Q4_1
    yield prefix + "attn_v.weight", r.dense(kv, w), QT.Q4_1
    yield prefix + "attn_q_norm.weight", r.norm(hd), QT.F32
    yield prefix + "attn_k_norm.weight", r.norm(hd), QT.F32
    yield prefix + "attn_output.weight", r.dense(w, shape["n_head"] * hd), QT.Q4_1


def ffn_tensors(r: RandomWeights, prefix: str, shape: dict[str, int]) -> Tensors:
    """One gated feed-forward's gate, up and down projections (Q4_1)."""
    w, ff = shape["n_embd"], shape["n_ff"]
    yield prefix + "ffn_gate.weight", r.dense(ff, w), QT.Q4_1
    yield prefix + "ffn_up.weight", r.dense(ff, w), QT.Q4_1
    yield prefix + "ffn_down.weight", r.dense(w, ff), QT.Q4_1


def decoder_keys(shape: dict[str, int], n_vocab: int) -> dict[str, int]:
    """The uint hyperparameters every decoder family has, from a shape's n_embd, n_layer, n_ff, n_head,
    n_head_kv and head_dim (an 8192-token context)."""
    return {"context_length": 8192, "embedding_length": shape["n_embd"], "block_count": shape["n_layer"],
            "feed_forward_length": shape["n_ff"], "attention.head_count": shape["n_head"],
            "attention.head_count_kv": shape["n_head_kv"], "attention.key_length": shape["head_dim"],
            "attention.value_length": shape["head_dim"], "vocab_size": n_vocab}


def write_smollm2_sized(
    *,
    smollm2: Path,
    dest: Path,
    arch: str,
    name: str,
    uints: dict[str, int],
    floats: dict[str, float],
    arrays: dict[str, list[int]],
    tensors: Tensors,
) -> Path:
    """A file of `arch` with SmolLM2's tokenizer keys, the given `arch.`-prefixed keys and the tensors,
    each float32 array quantized to its type (the file typed Q4_1)."""

    def general(writer: gguf.GGUFWriter) -> None:
        writer.add_name(name)
        writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_1))

    quantized = ((t, gguf.quants.quantize(arr, qtype) if qtype != QT.F32 else arr, qtype) for t, arr, qtype in tensors)
    return write_gguf(dest=dest, arch=arch, donor=smollm2, keep=tokenizer_only, general=general, uints=uints,
                      floats=floats, arrays=arrays, tensors=quantized)


def cached_model(file_name: str, make: Callable[[Path], Path]) -> Path:
    """~/.cache/kinetic/bench/`file_name`, made once by `make(part_path)` and renamed into place."""
    dest = cache_dir("bench", file_name)
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        make(dest.with_suffix(".part")).rename(dest)
    return dest


def parser(description: str) -> argparse.ArgumentParser:
    """The options every bandwidth benchmark takes: the SmolLM2 file and the thread count."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--smollm2", type=Path, default=models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    return ap


def bytes_per_token(path: Path) -> int:
    """Weight bytes one decoded token reads: every tensor once (the tied embedding as the output)."""
    return sum(info.nbytes for info in open_gguf(path).tensors.values())


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


def report_bursts(models: dict[str, Path], threads: int, n_bursts: int) -> tuple[dict[str, int], dict[str, list]]:
    """Runs the bursts and prints each model's fastest and median burst; returns (bytes/token, seconds)."""
    size = {k: bytes_per_token(p) for k, p in models.items()}
    seconds = burst_seconds(models, threads, n_bursts)
    for k, per_token in seconds.items():
        best, median = min(per_token), statistics.median(per_token)
        print(f"{k:8s} {size[k] / 2**20:6.1f} MiB/token  fastest burst {1 / best:6.1f} t/s = "
              f"{size[k] / best / 1e9:5.2f} GB/s, median {1 / median:6.1f} t/s = {size[k] / median / 1e9:5.2f} GB/s")
    return size, seconds
