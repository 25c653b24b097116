"""A mixture-of-experts model on CUDA: identity with the CPU, decode speed with every expert on the GPU
and with Flywheel holding a quarter of them (docs/moe.md).

    python benchmarks/cuda_moe.py --make bench --tokens 64            # a generated qwen3moe model (GPU)
    python benchmarks/cuda_moe.py --make tiny --tokens 4 --device cuda-emulated   # the same, emulated

`--make` writes a qwen3moe GGUF with random weights (the tokenizer of tests/data/synthetic/llama,
as benchmarks/cuda_runtime.py does): `bench` is docs/moe.md's CPU benchmark shape (4 layers, width
1024, 8 heads x 128 over 2, 32 experts top-4 of ff 512, Q4_0), `tiny` a small one for the emulation.
For each placement (all experts on the GPU; KINETIC_GPU_BYTES set so that Flywheel's cache holds a
quarter of them) it prints whether the prompt's and --tokens greedy steps' logits equal the CPU's bit
for bit, the decode tokens/s (median step), the bytes a token reads (the dense weights, the output
layer and k/E of the experts), and Flywheel's placements. Exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from made_models import ROOT, TOKENIZER_FROM, Q, Tensor, donor_vocab, not_donor_arch, random_quant, write_gguf

sys.path.insert(0, str(ROOT))

from kinetic.codegen.cuda import experts  # noqa: E402
from kinetic.codegen.cuda import model as cuda_model  # noqa: E402
from kinetic.codegen.cuda.backends import GPU_BYTES  # noqa: E402
from kinetic.codegen.cuda.renderer import CudaRenderer  # noqa: E402
from kinetic.frontend.gguf_file import open_gguf  # noqa: E402
from kinetic.frontend.lower import lower  # noqa: E402
from kinetic.ir.ops import Op  # noqa: E402
from kinetic.runtime.engine import Engine  # noqa: E402
from kinetic.runtime.weights import GGUFWeights  # noqa: E402

# name -> (n_embd, n_layer, n_head, n_kv_head, head_dim, n_expert, n_used, expert ff)
SHAPES = {"tiny": (256, 2, 4, 2, 64, 8, 2, 128), "bench": (1024, 4, 8, 2, 128, 32, 4, 512)}
N_CTX = 256


def make_model(path: Path, shape: str, wtype: Q = Q.Q4_0, seed: int = 0) -> Path:
    """A qwen3moe GGUF of the named shape with random `wtype` matrices (router and norms F32)."""
    n_embd, n_layer, n_head, n_kv, hd, n_expert, n_used, n_ff = SHAPES[shape]
    vocab = donor_vocab(TOKENIZER_FROM)
    uints = {"context_length": 4096, "embedding_length": n_embd, "block_count": n_layer,
             "feed_forward_length": 4 * n_embd, "attention.head_count": n_head, "attention.head_count_kv": n_kv,
             "vocab_size": vocab, "attention.key_length": hd, "attention.value_length": hd,
             "expert_count": n_expert, "expert_used_count": n_used, "expert_feed_forward_length": n_ff}
    floats = {"rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6}
    tensors = _tensors(np.random.default_rng(seed), SHAPES[shape], wtype, vocab)
    return write_gguf(dest=path, arch="qwen3moe", donor=TOKENIZER_FROM, keep=not_donor_arch, uints=uints,
                      floats=floats, tensors=tensors)


def _tensors(rng: np.random.Generator, shape: tuple, wtype: Q, vocab: int) -> Iterator[Tensor]:
    """The qwen3moe tensors in file order: random quant bytes (expert stacks [n_expert, rows, row bytes]),
    F32 norms near 1 and a router near 0."""
    n_embd, n_layer, n_head, n_kv, hd, n_expert, _, n_ff = shape

    def quant(name: str, rows: int, cols: int, stack: int = 0) -> Tensor:
        data = random_quant(rng, wtype, max(stack, 1) * rows, cols)
        return name, data.reshape(stack, rows, -1) if stack else data, wtype

    def f32(name: str, *dims: int, around: float = 1.0) -> Tensor:
        return name, (around + 0.1 * rng.standard_normal(dims)).astype(np.float32), None

    yield "token_embd.weight", random_quant(rng, Q.Q8_0, vocab, n_embd), Q.Q8_0
    yield f32("output_norm.weight", n_embd)
    yield quant("output.weight", vocab, n_embd)
    for i in range(n_layer):
        yield f32(f"blk.{i}.attn_norm.weight", n_embd)
        yield quant(f"blk.{i}.attn_q.weight", n_head * hd, n_embd)
        yield quant(f"blk.{i}.attn_k.weight", n_kv * hd, n_embd)
        yield quant(f"blk.{i}.attn_v.weight", n_kv * hd, n_embd)
        yield quant(f"blk.{i}.attn_output.weight", n_embd, n_head * hd)
        yield f32(f"blk.{i}.attn_q_norm.weight", hd)
        yield f32(f"blk.{i}.attn_k_norm.weight", hd)
        yield f32(f"blk.{i}.ffn_norm.weight", n_embd)
        yield f32(f"blk.{i}.ffn_gate_inp.weight", n_expert, n_embd, around=0.0)
        yield quant(f"blk.{i}.ffn_gate_exps.weight", n_ff, n_embd, stack=n_expert)
        yield quant(f"blk.{i}.ffn_up_exps.weight", n_ff, n_embd, stack=n_expert)
        yield quant(f"blk.{i}.ffn_down_exps.weight", n_embd, n_ff, stack=n_expert)


def active_bytes(graph, weights) -> int:
    """Bytes one decoded token reads: every matmul weight, and n_used / n_expert of each expert stack."""
    total = 0
    for n in graph.nodes:
        if n.op is Op.MATMUL:
            total += weights.tensor(graph.node(n.inputs[1]).attrs.tensor).nbytes
        elif n.op is Op.MOE_MATMUL:
            stack = weights.tensor(graph.node(n.inputs[1]).attrs.tensor)
            total += stack.nbytes * graph.node(n.inputs[2]).type.shape[1] // stack.shape[0]
    return total


def quarter_budget(graph, weights) -> int:
    """KINETIC_GPU_BYTES for a GPU whose memory leaves Flywheel a quarter of the experts."""
    quarter = experts.expert_count(CudaRenderer().lower(graph)) // 4
    return cuda_model.free_bytes_for_experts(graph, weights, N_CTX, cached=quarter)


def decode(engine: Engine, prompt: list[int], n: int):
    """Prompt, then n greedy steps: the logits of each and each step's seconds."""
    seq = engine.new_sequence()
    logits = [engine.prefill(seq, prompt)]
    times = []
    for _ in range(n):
        t = time.perf_counter()
        logits.append(engine.decode(seq, int(np.argmax(logits[-1]))))
        times.append(time.perf_counter() - t)
    return logits, times


def run(path: Path, args) -> int:
    gguf_file = open_gguf(path)
    graph, weights = lower(gguf_file), GGUFWeights(gguf_file)
    prompt = [1 + (7 * i) % 500 for i in range(16)]
    cpu_logits, cpu_times = decode(Engine(graph, weights, n_ctx=N_CTX, device="cpu"), prompt, args.tokens)
    nbytes = active_bytes(graph, weights)
    print(f"cpu: {1 / statistics.median(cpu_times):.1f} tokens/s, {nbytes / 2**20:.1f} MiB read per token")
    status = 0
    for label, limit in (("all experts on the GPU", None), ("Flywheel, a quarter of the experts cached",
                                                            quarter_budget(graph, weights))):
        if limit is None:
            os.environ.pop(GPU_BYTES, None)
        else:
            os.environ[GPU_BYTES] = str(limit)
        engine = Engine(graph, weights, n_ctx=N_CTX, device=args.device)
        logits, times = decode(engine, prompt, args.tokens)
        same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32))
                   for a, b in zip(logits, cpu_logits, strict=True))
        status |= not same
        step = statistics.median(times[1:] or times)
        print(f"{args.device}, {label}: logits {'identical to' if same else 'DIFFERENT from'} the CPU's; "
              f"{1 / step:.1f} tokens/s ({nbytes / step / 1e9:.1f} GB/s of active weights)")
        offload = getattr(engine.runner, "experts", None)
        if offload is not None:
            counts = Counter(w.value for e in offload.log if e[0] == "place" for w in e[3].values())
            print(f"  {offload.status()}; placements {dict(counts)}")
        engine.runner.close()
    os.environ.pop(GPU_BYTES, None)
    return status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="a qwen3moe GGUF file (else --make)")
    p.add_argument("--make", choices=sorted(SHAPES), help="generate a qwen3moe model of this shape instead")
    p.add_argument("--device", default="cuda", choices=("cuda", "cuda-emulated"))
    p.add_argument("--tokens", type=int, default=32, help="greedy decode steps, checked and timed [default: 32]")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else None
        if path is None:
            if not args.make:
                p.error("give a model or --make SHAPE")
            path = make_model(Path(tmp) / f"qwen3moe-{args.make}.gguf", args.make)
            print(f"generated {path.name}: {path.stat().st_size / 2**20:.0f} MiB")
        return run(path, args)


if __name__ == "__main__":
    sys.exit(main())
