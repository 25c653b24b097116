"""How close does a qwen35-shaped model (Gated DeltaNet) decode to its memory-bandwidth limit, beside
SmolLM2 (issue 25)?

Makes (once) a qwen35 file of SmolLM2-135M's size with random weights and SmolLM2's types: 30
layers, width 576, every 4th layer gated attention (9 heads x 64 over 3 KV heads, rotary over the
whole head with Qwen3.5's IMROPE sections [11, 11, 10, 0]), the other 23 Gated DeltaNet (3 key
heads and 6 value heads of 64, conv 4: its projections as many weights as SmolLM2's attention),
feed-forward 1536, SmolLM2's tokenizer, Q4_1 projections, a tied Q8_0 embedding, written to
~/.cache/kinetic/bench/ (never committed). Then loads both in one process and alternates bursts of
32 greedy decode steps between them (the sequence rolled back after each), and reports each
model's fastest and median burst as tokens/s and as effective bandwidth: the bytes a decoded token
reads (every weight once, the tied table as the output) times tokens per second. The recurrent
state a token also reads and writes (23 x 6 x 64 x 64 floats, 2.2 MiB) is counted apart.

    python benchmarks/qwen35_bandwidth.py [--bursts 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen3_bandwidth import burst_seconds, bytes_per_token  # noqa: E402

from kinetic.hub import models_dir  # noqa: E402
from kinetic.user_cache import cache_dir  # noqa: E402

SHAPE = dict(n_layer=30, n_embd=576, n_head=9, n_head_kv=3, head_dim=64, n_ff=1536, interval=4,
             d_conv=4, n_k_head=3, n_v_head=6, state=64)
QT = gguf.GGMLQuantizationType
SEED = 20261202


def make_qwen35(smollm2: Path, dest: Path) -> Path:
    """The qwen35 file: SmolLM2's tokenizer keys, qwen35 hyperparameters, random weights."""
    donor = gguf.GGUFReader(smollm2)
    writer = gguf.GGUFWriter(dest, "qwen35")
    for key, field in donor.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    n_vocab = len(donor.fields["tokenizer.ggml.tokens"].contents())
    s = SHAPE
    writer.add_name("qwen35-shaped random weights, SmolLM2-135M's size")
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_1))
    for key, value in {"context_length": 8192, "embedding_length": s["n_embd"], "block_count": s["n_layer"],
                       "feed_forward_length": s["n_ff"], "attention.head_count": s["n_head"],
                       "attention.head_count_kv": s["n_head_kv"], "attention.key_length": s["head_dim"],
                       "attention.value_length": s["head_dim"], "vocab_size": n_vocab,
                       "full_attention_interval": s["interval"], "rope.dimension_count": s["head_dim"],
                       "ssm.conv_kernel": s["d_conv"], "ssm.inner_size": s["n_v_head"] * s["state"],
                       "ssm.state_size": s["state"], "ssm.time_step_rank": s["n_v_head"],
                       "ssm.group_count": s["n_k_head"]}.items():
        writer.add_uint32(f"qwen35.{key}", value)
    writer.add_array("qwen35.rope.dimension_sections", [11, 11, 10, 0])
    writer.add_float32("qwen35.rope.freq_base", 10000000.0)
    writer.add_float32("qwen35.attention.layer_norm_rms_epsilon", 1e-6)
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
    key, value = s["n_k_head"] * s["state"], s["n_v_head"] * s["state"]

    def dense(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    yield "token_embd.weight", (0.15 * rng.standard_normal((n_vocab, w), dtype=np.float32)), QT.Q8_0
    yield "output_norm.weight", norm(w), QT.F32
    for il in range(s["n_layer"]):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", norm(w), QT.F32
        if (il + 1) % s["interval"]:
            yield p + "attn_qkv.weight", dense(2 * key + value, w), QT.Q4_1
            yield p + "attn_gate.weight", dense(value, w), QT.Q4_1
            conv = 0.5 * rng.standard_normal((2 * key + value, s["d_conv"]))
            yield p + "ssm_conv1d.weight", conv.astype(np.float32), QT.F32
            yield p + "ssm_dt.bias", (0.1 * rng.standard_normal(s["n_v_head"])).astype(np.float32), QT.F32
            yield p + "ssm_a", -np.exp(0.5 * rng.standard_normal(s["n_v_head"])).astype(np.float32), QT.F32
            yield p + "ssm_beta.weight", dense(s["n_v_head"], w), QT.Q4_1
            yield p + "ssm_alpha.weight", dense(s["n_v_head"], w), QT.Q4_1
            yield p + "ssm_norm.weight", norm(s["state"]), QT.F32
            yield p + "ssm_out.weight", dense(w, value), QT.Q4_1
        else:
            yield p + "attn_q.weight", dense(2 * q, w), QT.Q4_1
            yield p + "attn_k.weight", dense(kv, w), QT.Q4_1
            yield p + "attn_v.weight", dense(kv, w), QT.Q4_1
            yield p + "attn_q_norm.weight", norm(hd), QT.F32
            yield p + "attn_k_norm.weight", norm(hd), QT.F32
            yield p + "attn_output.weight", dense(w, q), QT.Q4_1
        yield p + "post_attention_norm.weight", norm(w), QT.F32
        yield p + "ffn_gate.weight", dense(ff, w), QT.Q4_1
        yield p + "ffn_up.weight", dense(ff, w), QT.Q4_1
        yield p + "ffn_down.weight", dense(w, ff), QT.Q4_1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", type=Path, default=models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bursts", type=int, default=20)
    args = ap.parse_args()
    dest = cache_dir("bench", "qwen35-smollm2-size.Q4_1.gguf")
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        make_qwen35(args.smollm2, dest.with_suffix(".part")).rename(dest)
    models = {"smollm2": args.smollm2, "qwen35": dest}
    size = {k: bytes_per_token(p) for k, p in models.items()}
    seconds = burst_seconds(models, args.threads, args.bursts)
    for k, per_token in seconds.items():
        best, median = min(per_token), statistics.median(per_token)
        print(f"{k:8s} {size[k] / 2**20:6.1f} MiB/token  fastest burst {1 / best:6.1f} t/s = "
              f"{size[k] / best / 1e9:5.2f} GB/s, median {1 / median:6.1f} t/s = {size[k] / median / 1e9:5.2f} GB/s")


if __name__ == "__main__":
    main()
