"""CPU decode speed of a mixture-of-experts model against its active-parameter bandwidth limit.

Makes (once) a qwen3moe file whose active parameters are SmolLM2-135M's size: SmolLM2's 30 layers,
width 576, 9 heads x 64 over 3 KV heads and tokenizer (49152 tokens, tied Q8_0 embedding), every
feed-forward 16 experts, 4 per token, each 384 wide (4 x 384 = SmolLM2's 1536), Q4_1 projections and
expert stacks, an F32 router. Dense weights are random floats quantized by gguf; the expert stacks
are random Q4_1 blocks written directly (scale 1/(8 sqrt(K)), minimum -7.5 x scale: centred values
of fan-in size), which is what makes a 200 MB file in seconds. Written to
~/.cache/kinetic/bench/ (never committed).

Then decodes bursts of 32 greedy steps in one process (the same positions each burst: the sequence is
rolled back) and reports the fastest and median burst as tokens/s, against the limit: the bytes a
token reads (every dense tensor once, the tied embedding as the output, n_used / n_expert of each
expert stack) over the machine's read bandwidth, measured here by reading a 512 MiB array on the
same number of threads (`read_bandwidth`).

    python benchmarks/moe_decode.py [--smollm2 PATH] [--threads 2] [--bursts 10]
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from bandwidth_common import QT, RandomWeights, burst_seconds, cached_model, decoder_keys, parser
from made_models import donor_vocab, tokenizer_only, write_gguf

from kinetic.frontend.gguf_file import open_gguf

SHAPE = dict(n_layer=30, n_embd=576, n_head=9, n_head_kv=3, head_dim=64, n_ff=384, n_expert=16, n_used=4)
SEED = 20261202
Q4_1_BLOCK, Q4_1_BYTES = 32, 20


def random_q4_1(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """u8 [rows, k / 32 * 20]: Q4_1 blocks of random nibbles, scale 1/(8 sqrt(k)), minimum -7.5 x scale."""
    blocks = rng.integers(0, 256, (rows, k // Q4_1_BLOCK, Q4_1_BYTES), dtype=np.uint8)
    d = np.float16(1 / (8 * np.sqrt(k)))
    blocks[:, :, 0:2] = np.array([d], np.float16).view(np.uint8)
    blocks[:, :, 2:4] = np.array([np.float16(-7.5) * d], np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def _tensors(r: RandomWeights, n_vocab: int):
    """(name, stored array, type): dense tensors quantized by gguf, expert stacks as random blocks."""
    import gguf

    s = SHAPE
    w, ff, hd, e = s["n_embd"], s["n_ff"], s["head_dim"], s["n_expert"]
    q, kv = s["n_head"] * hd, s["n_head_kv"] * hd

    def quant(values: np.ndarray, qtype):
        return (values if qtype == QT.F32 else gguf.quants.quantize(values, qtype)), qtype

    yield "token_embd.weight", *quant(r.embedding(n_vocab, w), QT.Q8_0)
    yield "output_norm.weight", *quant(r.norm(w), QT.F32)
    for il in range(s["n_layer"]):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", *quant(r.norm(w), QT.F32)
        for name, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            yield p + f"{name}.weight", *quant(r.dense(rows, w), QT.Q4_1)
        yield p + "attn_q_norm.weight", *quant(r.norm(hd), QT.F32)
        yield p + "attn_k_norm.weight", *quant(r.norm(hd), QT.F32)
        yield p + "attn_output.weight", *quant(r.dense(w, q), QT.Q4_1)
        yield p + "ffn_norm.weight", *quant(r.norm(w), QT.F32)
        yield p + "ffn_gate_inp.weight", *quant(r.dense(e, w), QT.F32)
        for name, rows, k in (("ffn_gate_exps", ff, w), ("ffn_up_exps", ff, w), ("ffn_down_exps", w, ff)):
            stack = np.stack([random_q4_1(r.rng, rows, k) for _ in range(e)])
            yield p + f"{name}.weight", stack, QT.Q4_1


def make_model(smollm2: Path, dest: Path) -> Path:
    import gguf

    s, n_vocab = SHAPE, donor_vocab(smollm2)
    uints = decoder_keys(s, n_vocab) | {"expert_count": s["n_expert"], "expert_used_count": s["n_used"],
                                        "expert_feed_forward_length": s["n_ff"]}
    floats = {"rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6}

    def general(writer: gguf.GGUFWriter) -> None:
        writer.add_name("qwen3moe random weights, SmolLM2-135M's active size")
        writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_1))

    return write_gguf(dest=dest, arch="qwen3moe", donor=smollm2, keep=tokenizer_only, general=general, uints=uints,
                      floats=floats, tensors=_tensors(RandomWeights(SEED), n_vocab))


def active_bytes(path: Path) -> int:
    """Weight bytes one decoded token reads: dense tensors whole, n_used / n_expert of each stack."""
    share = SHAPE["n_used"] / SHAPE["n_expert"]
    return int(sum(info.nbytes * (share if name.endswith("_exps.weight") else 1)
                   for name, info in open_gguf(path).tensors.items()))


def read_bandwidth(threads: int, mib: int = 512, repeats: int = 5) -> float:
    """Bytes per second of OR-reducing a `mib` MiB array of 64-bit words split over `threads`
    threads (best of `repeats`): the cheapest full read numpy has (a float sum is pairwise and
    slower than memory), and its reductions release the GIL, so the threads read in parallel."""
    data = np.ones(mib * 2**20 // 8, np.uint64)
    parts = np.array_split(data, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(np.bitwise_or.reduce, parts))
            best = min(best, time.perf_counter() - start)
    return data.nbytes / best


def main() -> None:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--bursts", type=int, default=10)
    args = ap.parse_args()
    path = cached_model("qwen3moe-smollm2-active.Q4_1.gguf", lambda part: make_model(args.smollm2, part))
    size, bandwidth = active_bytes(path), read_bandwidth(args.threads)
    limit = bandwidth / size
    per_token = burst_seconds({"moe": path}, args.threads, args.bursts)["moe"]
    best, median = 1 / min(per_token), 1 / statistics.median(per_token)
    print(f"{path.name}: {size / 1e6:.1f} MB active per token; read bandwidth {bandwidth / 1e9:.1f} GB/s on "
          f"{args.threads} threads -> limit {limit:.0f} tokens/s")
    print(f"decode: fastest burst {best:.1f} tokens/s ({best / limit:.0%} of the limit), "
          f"median {median:.1f} tokens/s ({median / limit:.0%})")


if __name__ == "__main__":
    main()
