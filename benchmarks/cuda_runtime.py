"""The CUDA runtime on a whole model: identity with the reference interpreter, and decode speed as a
share of the GPU's memory bandwidth.

    python benchmarks/cuda_runtime.py --make 1b --tokens 128       # a generated 1B-class model (GPU)
    python benchmarks/cuda_runtime.py MODEL.gguf --check 4          # a real file: 4 steps checked, timed
    python benchmarks/cuda_runtime.py --make tiny --backend host    # the same on the host emulation (no GPU)
    python benchmarks/cuda_runtime.py MODEL.gguf --backend stub     # launches per step, host work alone

`--make` writes a llama-architecture GGUF with random weights (Q8_0 embedding table, the chosen
weight type for every projection, the tokenizer of tests/data/synthetic/llama) to a temporary
folder: the device machine cannot download the real models, and its working tree travels in 64 MiB,
so scripts/gpu_check.sh measures on generated models of real shapes. Random weights change nothing
about the speed of a pass (every weight byte is read once per decoded token either way).

Prints one line per check and a summary: decode tokens/s (median of the timed steps), weight bytes
read per token, GB/s, and the share of the bandwidth the device reports (memory clock x bus width).
--check N compares the first N steps' logits with the reference interpreter bit for bit and exits 1
on a difference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from made_models import ROOT, TOKENIZER_FROM, Q, Tensor, donor_vocab, not_donor_arch, random_quant, write_gguf

sys.path.insert(0, str(ROOT))

from kinetic.frontend.gguf_file import open_gguf  # noqa: E402
from kinetic.frontend.lower import lower  # noqa: E402
from kinetic.ir.ops import Op  # noqa: E402
from kinetic.numerics_mode import default_numerics  # noqa: E402
from kinetic.passes import PassOptions, run_pipeline  # noqa: E402
from kinetic.runtime.engine import Engine  # noqa: E402
from kinetic.runtime.weights import GGUFWeights  # noqa: E402

# name -> (n_embd, n_layer, n_ff, n_head, n_kv_head): tiny for the emulation, 1b about Llama-3.2-1B's body
SHAPES = {"tiny": (256, 2, 512, 4, 2), "1b": (2048, 16, 8192, 32, 8), "3b": (3072, 28, 8192, 24, 8)}


def make_model(path: Path, shape: str, wtype: Q, seed: int = 0) -> Path:
    """A llama GGUF of the named shape with random weights of `wtype` (the embedding table Q8_0)."""
    n_embd, n_layer, n_ff, n_head, n_kv = SHAPES[shape]
    vocab = donor_vocab(TOKENIZER_FROM)
    uints = {"context_length": 4096, "embedding_length": n_embd, "block_count": n_layer, "feed_forward_length": n_ff,
             "attention.head_count": n_head, "attention.head_count_kv": n_kv, "vocab_size": vocab,
             "rope.dimension_count": n_embd // n_head}
    floats = {"rope.freq_base": 500000.0, "attention.layer_norm_rms_epsilon": 1e-5}
    tensors = _tensors(np.random.default_rng(seed), SHAPES[shape], wtype, vocab)
    return write_gguf(dest=path, arch="llama", donor=TOKENIZER_FROM, keep=not_donor_arch, uints=uints, floats=floats,
                      tensors=tensors)


def _tensors(rng: np.random.Generator, shape: tuple, wtype: Q, vocab: int) -> Iterator[Tensor]:
    """The llama tensors in file order: random quant bytes of `wtype`, norms near 1."""
    n_embd, n_layer, n_ff, n_head, n_kv = shape
    kv_rows = n_kv * (n_embd // n_head)

    def quant(name: str, rows: int, cols: int, t: Q = wtype) -> Tensor:
        return name, random_quant(rng, t, rows, cols), t

    def norm(name: str) -> Tensor:
        return name, (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32), None

    yield quant("token_embd.weight", vocab, n_embd, Q.Q8_0)
    yield norm("output_norm.weight")
    yield quant("output.weight", vocab, n_embd)
    for i in range(n_layer):
        yield norm(f"blk.{i}.attn_norm.weight")
        yield quant(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        yield quant(f"blk.{i}.attn_k.weight", kv_rows, n_embd)
        yield quant(f"blk.{i}.attn_v.weight", kv_rows, n_embd)
        yield quant(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        yield norm(f"blk.{i}.ffn_norm.weight")
        yield quant(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        yield quant(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        yield quant(f"blk.{i}.ffn_down.weight", n_embd, n_ff)


def weight_bytes(graph, weights) -> int:
    """Bytes of weights one decoded token reads (every matmul weight; the embedding table one row)."""
    return sum(weights.tensor(graph.node(n.inputs[1]).attrs.tensor).nbytes for n in graph.nodes if n.op is Op.MATMUL)


def peak_bandwidth() -> float | None:
    """The GPU's memory bandwidth in bytes/s from its properties, or None."""
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        return 2.0 * props["memoryClockRate"] * 1e3 * props["memoryBusWidth"] / 8
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="a GGUF file (else --make)")
    p.add_argument("--make", choices=sorted(SHAPES), help="generate a llama model of this shape instead")
    p.add_argument("--type", default="Q4_0", help="weight type of a generated model [default: Q4_0]")
    p.add_argument("--backend", choices=("gpu", "host", "stub"), default="gpu",
                   help="gpu: CuPy; host: the emulation; stub: no kernel runs (launches per step, host work)")
    p.add_argument("--tokens", type=int, default=64, help="decode steps timed [default: 64]")
    p.add_argument("--check", type=int, default=0, help="steps compared with the reference interpreter")
    p.add_argument("-c", "--ctx-size", type=int, default=1024)
    p.add_argument("-ngl", "--gpu-layers", type=int, help="only the last N layers on the GPU, the rest on the CPU")
    args = p.parse_args(argv)
    if args.backend == "gpu":
        from kinetic.codegen.cuda.device import unavailable_reason

        reason = unavailable_reason()
        if reason:
            print(f"no GPU run: {reason} (--backend host runs the emulation instead)", file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else None
        if path is None:
            if not args.make:
                p.error("give a model or --make SHAPE")
            t = time.perf_counter()
            path = make_model(Path(tmp) / f"{args.make}-{args.type}.gguf", args.make, Q[args.type])
            print(f"generated {path.name}: {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t:.1f} s")
        return run(path, args)


class StubBackend:
    """The host backend with the kernels left out: what a decode step costs outside them (staging,
    copies, rounding the new keys and values) and how many launches its graph holds."""

    def __new__(cls):
        from kinetic.codegen.cuda.backends import HostBackend

        class Stub(HostBackend):
            name = "a stub backend (no kernel runs)"

            def compile(self, kernels):
                pass

            def launch(self, name, rows, args):
                self.launches += 1

        return Stub()


def run(path: Path, args) -> int:
    from kinetic.codegen.cuda.backends import GpuBackend, HostBackend
    from kinetic.codegen.cuda.model import CudaModel

    gguf_file = open_gguf(path)
    # CUDA's default numerics mode (ggml: its kernels follow only ggml's orders), as Model compiles for it
    passes = PassOptions(numerics=default_numerics("cuda"))
    graph, weights = run_pipeline(lower(gguf_file), passes), GGUFWeights(gguf_file)
    t = time.perf_counter()
    backend = {"gpu": GpuBackend, "host": HostBackend, "stub": StubBackend}[args.backend]()
    engine = Engine(graph, weights, n_ctx=args.ctx_size, device="reference")
    if args.gpu_layers:
        from kinetic.codegen.cpu.step import CompiledStep
        from kinetic.codegen.cuda.model import SplitModel
        from kinetic.passes.split import n_layers, split_layers

        split = split_layers(graph, n_layers(graph) - args.gpu_layers)
        engine.runner = SplitModel(CompiledStep(split.head, weights),
                                   CudaModel(graph, weights, backend, args.ctx_size, split=split), split)
        print(f"split: layers {split.first_layer}.. on {backend.name}, the first {split.first_layer} on the CPU")
    else:
        engine.runner = CudaModel(graph, weights, backend, args.ctx_size)
    print(f"loaded on {backend.name} in {time.perf_counter() - t:.1f} s (kernels compiled or cached, weights up)")
    prompt = [1 + (7 * i) % 500 for i in range(16)]
    status = 0
    if args.check:
        reference = Engine(graph, weights, n_ctx=args.ctx_size, device="reference")
        seq, ref_seq = engine.new_sequence(), reference.new_sequence()
        got, want = engine.prefill(seq, prompt), reference.prefill(ref_seq, prompt)
        for step in range(args.check):
            same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
            print(f"check step {step}: {'identical' if same else 'DIFFERENT'} logits"
                  + ("" if same else f" (max |diff| {np.max(np.abs(got - want)):.3g})"))
            status |= not same
            token = int(np.argmax(want))
            got, want = engine.decode(seq, token), reference.decode(ref_seq, token)
    seq = engine.new_sequence()
    t = time.perf_counter()
    logits = engine.prefill(seq, prompt)
    print(f"prompt of {len(prompt)} tokens: {(time.perf_counter() - t) * 1e3:.1f} ms (first pass of its shape)")
    times, token = [], int(np.argmax(logits))
    launches = backend.launches
    for _ in range(min(args.tokens, args.ctx_size - len(prompt) - 1)):
        t = time.perf_counter()
        token = int(np.argmax(engine.decode(seq, token)))
        times.append(time.perf_counter() - t)
    if not backend.is_gpu:
        print(f"launches per decode step: {(backend.launches - launches) / max(len(times), 1):.0f}")
    step = statistics.median(times[1:] or times)
    if args.backend == "stub":
        print(f"host work per decode step, the kernels stubbed out: {step * 1e3:.3f} ms (median of {len(times)})")
        engine.runner.close()
        return status
    nbytes = weight_bytes(graph, weights)
    line = (f"decode: {1 / step:.1f} tokens/s (median of {len(times)} steps, {step * 1e3:.3f} ms), "
            f"{nbytes / 2**20:.0f} MiB of weights per token, {nbytes / step / 1e9:.1f} GB/s")
    peak = peak_bandwidth() if args.backend == "gpu" else None
    if peak:
        line += f", {100 * nbytes / step / peak:.0f}% of the {peak / 1e9:.0f} GB/s the GPU reports"
    print(line)
    engine.runner.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
