"""Whether a model fits this machine: the largest context its memory holds, and how many layers a
GPU holds.

Owns: the memory estimate, from the file's header only (docs/models.md, "fit", states it):

    need(context) = weights + context * kv_per_token + working
    kv_per_token  = n_layer * n_kv_head * head_dim * 2 (keys and values) * 2 bytes (f16 cache)
    working       = (128 * n_vocab + 512 * (4 * n_embd + 2 * n_ff)) * 4 bytes + 256 MiB

`weights` is the bytes of the file's tensors (mapped as they are); the KV cache is what the engine
allocates (every layer holds the whole context, f16 by default); `working` is 128 rows of logits (a
perplexity chunk's), one prompt pass of 512 rows' activations (the CPU engine's prompt_pass) plus
the process itself (Python, compiled kernels, tokenizer: 200 to
300 MiB measured on the reference models). The largest context is the most whole 256-token steps
that fit, capped at the model's training context. On a GPU, the last layers go there (Kinetic runs
the first ones on the CPU when a model is split): the embeddings, output and working buffers first,
then as many layers, each its weights plus its share of the KV cache at the context planned.

Does not own measuring memory (kinetic.machine) or finding models (kinetic.stores).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kinetic.errors import KineticError

KV_ITEM_BYTES = 2  # f16 keys and values
LOGIT_ROWS = 128  # rows of logits a pass may keep: the engine's default batch (a perplexity chunk)
PASS_ROWS = 512  # prompt rows per pass: the CPU engine's prompt_pass (kinetic.runtime.engine.CPU_PROMPT_PASS)
PROCESS_BYTES = 256 * 1024**2
CONTEXT_STEP = 256
DEFAULT_CONTEXT_CAP = 32768  # the default context: the model's own, capped here (and by memory)


@dataclass(frozen=True)
class Shape:
    """The header facts the estimate needs."""

    n_layer: int
    n_kv_head: int
    head_dim: int
    n_embd: int
    n_ff: int
    n_vocab: int
    context_length: int | None  # the training context
    weights: int  # bytes of every tensor
    layer_weights: tuple[int, ...]  # bytes of each block's tensors (blk.N.*)
    kv_heads: int | None = None  # KV heads over all layers when they differ by layer (0: a recurrent layer)

    @property
    def kv_per_token(self) -> int:
        heads = self.n_layer * self.n_kv_head if self.kv_heads is None else self.kv_heads
        return heads * self.head_dim * 2 * KV_ITEM_BYTES

    @property
    def working(self) -> int:
        return (LOGIT_ROWS * self.n_vocab + PASS_ROWS * (4 * self.n_embd + 2 * self.n_ff)) * 4 + PROCESS_BYTES

    @property
    def other_weights(self) -> int:
        """Bytes outside the blocks: embeddings, output norm and head."""
        return self.weights - sum(self.layer_weights)


@dataclass(frozen=True)
class Fit:
    max_context: int  # 0: the weights and working buffers alone do not fit
    context: int  # the context planned: the model's own, capped at 32768 and at max_context
    gpu_layers: int | None  # None: no GPU to plan for
    n_layer: int

    @property
    def runs_on(self) -> str:
        if self.gpu_layers is None or self.gpu_layers == 0:
            return "CPU" if self.max_context else "does not fit"
        if self.gpu_layers == self.n_layer:
            return "GPU"
        return f"GPU {self.gpu_layers}/{self.n_layer} layers, CPU the rest"


def read_shape(path: str | os.PathLike) -> Shape:
    """The estimate's inputs from a GGUF file's header (checked as loading checks them)."""
    from kinetic.frontend import hparams
    from kinetic.frontend.gguf_file import open_gguf

    gguf = open_gguf(path)
    kv_heads = _hybrid_kv_heads(gguf)
    d = hparams.decoder(gguf, default_eps=1e-5) if kv_heads is None else _hybrid_decoder(gguf)
    n_ff = gguf.metadata.get(f"{gguf.architecture}.feed_forward_length", 4 * d.n_embd)
    n_vocab = gguf.metadata.array_length("tokenizer.ggml.tokens") or 0
    per_layer = [0] * d.n_layer
    for name, tensor in gguf.tensors.items():
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < d.n_layer:
            per_layer[int(parts[1])] += tensor.nbytes
    context = gguf.metadata.get(f"{gguf.architecture}.context_length")
    return Shape(n_layer=d.n_layer, n_kv_head=d.n_kv_head, head_dim=d.head_dim, n_embd=d.n_embd,
                 n_ff=n_ff if isinstance(n_ff, int) else max(n_ff), n_vocab=n_vocab,
                 context_length=context if isinstance(context, int) and context > 0 else None,
                 weights=sum(t.nbytes for t in gguf.tensors.values()), layer_weights=tuple(per_layer),
                 kv_heads=kv_heads)


def _hybrid_kv_heads(gguf) -> int | None:
    """All layers' KV heads for a file whose `attention.head_count_kv` is an array with recurrent
    layers (0: lfm2, granitehybrid; docs/recurrent.md), None otherwise. A recurrent layer's state is
    a fixed size per sequence, not per token, and is left out of the estimate."""
    from kinetic.frontend import hparams
    from kinetic.frontend.recurrent_blocks import kv_heads_per_layer

    raw = gguf.metadata.get(f"{gguf.architecture}.attention.head_count_kv")
    if not hasattr(raw, "__len__") or 0 not in list(raw):
        return None
    n_head = hparams.key(gguf, "attention.head_count")
    return sum(kv_heads_per_layer(gguf, n_layer=hparams.key(gguf, "block_count"), n_head=n_head))


def _hybrid_decoder(gguf):
    """The decoder facts of a hybrid file, its per-layer KV heads aside (n_kv_head 0: see kv_heads)."""
    from kinetic.frontend import hparams

    n_embd, n_head = hparams.key(gguf, "embedding_length"), hparams.key(gguf, "attention.head_count")
    return hparams.Decoder(n_layer=hparams.key(gguf, "block_count"), n_embd=n_embd, n_head=n_head, n_kv_head=0,
                           head_dim=hparams.key(gguf, "attention.key_length", n_embd // n_head),
                           eps=float(hparams.key(gguf, "attention.layer_norm_rms_epsilon", 1e-5)))


def max_context(shape: Shape, memory: int) -> int:
    """The largest context (whole 256-token steps, at most the training context) whose weights, KV
    cache and working buffers fit in `memory` bytes; 0 when not even one step does."""
    room = memory - shape.weights - shape.working
    if room <= 0:
        return 0
    tokens = room // shape.kv_per_token // CONTEXT_STEP * CONTEXT_STEP
    cap = shape.context_length or tokens
    return min(tokens, cap)


def gpu_layers(shape: Shape, gpu_memory: int, context: int) -> int:
    """How many of the last layers fit on a GPU with `gpu_memory` bytes at `context` tokens."""
    room = gpu_memory - shape.other_weights - shape.working
    kv_per_layer = shape.kv_per_token // shape.n_layer * context
    placed = 0
    for weights in reversed(shape.layer_weights):
        if room < weights + kv_per_layer:
            break
        room -= weights + kv_per_layer
        placed += 1
    return placed


def plan(shape: Shape, *, memory: int, gpu_memory: int | None) -> Fit:
    """Where a model runs given `memory` bytes of RAM and, when there is a GPU, its free bytes."""
    largest = max_context(shape, memory)
    own = min(shape.context_length or DEFAULT_CONTEXT_CAP, DEFAULT_CONTEXT_CAP)
    context = min(own, largest) if largest else min(own, CONTEXT_STEP)
    layers = None if gpu_memory is None else gpu_layers(shape, gpu_memory, context)
    return Fit(max_context=largest, context=context, gpu_layers=layers, n_layer=shape.n_layer)


def shape_or_reason(path: str | os.PathLike) -> tuple[Shape | None, str | None]:
    """The shape, or why the file cannot be planned for (a KineticError's message)."""
    try:
        return read_shape(path), None
    except KineticError as exc:
        return None, exc.message
