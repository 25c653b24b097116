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

from pathlib import Path

import numpy as np
from bandwidth_common import (
    QT,
    RandomWeights,
    Tensors,
    attention_tensors,
    cached_model,
    decoder_keys,
    ffn_tensors,
    parser,
    report_bursts,
    write_smollm2_sized,
)
from made_models import donor_vocab

SHAPE = dict(n_layer=30, n_embd=576, n_head=9, n_head_kv=3, head_dim=64, n_ff=1536, interval=4,
             d_conv=4, n_k_head=3, n_v_head=6, state=64)
SEED = 20261202


def make_qwen35(smollm2: Path, dest: Path) -> Path:
    """The qwen35 file: SmolLM2's tokenizer keys, qwen35 hyperparameters, random weights."""
    s, n_vocab = SHAPE, donor_vocab(smollm2)
    uints = decoder_keys(s, n_vocab) | {
        "full_attention_interval": s["interval"], "rope.dimension_count": s["head_dim"],
        "ssm.conv_kernel": s["d_conv"], "ssm.inner_size": s["n_v_head"] * s["state"],
        "ssm.state_size": s["state"], "ssm.time_step_rank": s["n_v_head"], "ssm.group_count": s["n_k_head"]}
    floats = {"rope.freq_base": 10000000.0, "attention.layer_norm_rms_epsilon": 1e-6}
    return write_smollm2_sized(smollm2=smollm2, dest=dest, arch="qwen35",
                               name="qwen35-shaped random weights, SmolLM2-135M's size", uints=uints,
                               floats=floats, arrays={"rope.dimension_sections": [11, 11, 10, 0]},
                               tensors=_tensors(RandomWeights(SEED), n_vocab))


def _tensors(r: RandomWeights, n_vocab: int) -> Tensors:
    """(name, f32 array in numpy order [rows, row length], type)."""
    s, rng = SHAPE, r.rng
    w = s["n_embd"]
    key, value = s["n_k_head"] * s["state"], s["n_v_head"] * s["state"]
    yield "token_embd.weight", r.embedding(n_vocab, w), QT.Q8_0
    yield "output_norm.weight", r.norm(w), QT.F32
    for il in range(s["n_layer"]):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", r.norm(w), QT.F32
        if (il + 1) % s["interval"]:
            yield p + "attn_qkv.weight", r.dense(2 * key + value, w), QT.Q4_1
            yield p + "attn_gate.weight", r.dense(value, w), QT.Q4_1
            conv = 0.5 * rng.standard_normal((2 * key + value, s["d_conv"]))
            yield p + "ssm_conv1d.weight", conv.astype(np.float32), QT.F32
            yield p + "ssm_dt.bias", (0.1 * rng.standard_normal(s["n_v_head"])).astype(np.float32), QT.F32
            yield p + "ssm_a", -np.exp(0.5 * rng.standard_normal(s["n_v_head"])).astype(np.float32), QT.F32
            yield p + "ssm_beta.weight", r.dense(s["n_v_head"], w), QT.Q4_1
            yield p + "ssm_alpha.weight", r.dense(s["n_v_head"], w), QT.Q4_1
            yield p + "ssm_norm.weight", r.norm(s["state"]), QT.F32
            yield p + "ssm_out.weight", r.dense(w, value), QT.Q4_1
        else:  # gated attention: each head's query and gate side by side in attn_q
            yield from attention_tensors(r, p, s, q_rows=2 * s["n_head"] * s["head_dim"])
        yield p + "post_attention_norm.weight", r.norm(w), QT.F32
        yield from ffn_tensors(r, p, s)


def main() -> None:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--bursts", type=int, default=20)
    args = ap.parse_args()
    dest = cached_model("qwen35-smollm2-size.Q4_1.gguf", lambda part: make_qwen35(args.smollm2, part))
    report_bursts({"smollm2": args.smollm2, "qwen35": dest}, args.threads, args.bursts)


if __name__ == "__main__":
    main()
