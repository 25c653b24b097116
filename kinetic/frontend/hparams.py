"""Reading a family's hyperparameters from GGUF metadata: every value typed and range-checked as it
is read, before anything uses it.

Owns: KEYS, the table of `<arch>.*` keys Kinetic reads (each key's type and range); `key()`, which
reads one and refuses anything else (wrong type, an array where one value belongs, out of range,
NaN) with a ModelFileError naming the key, what it holds and what was expected; the relations
between the values (head counts dividing the width and each other, rotary dimensions within a head)
in `decoder()`; and `rope()`, the entry to a layer's rotary parameters (rope_scaling.py resolves them).
Does not own the tensors' shapes (blocks.py checks them against these values) or the tokenizer's
keys (tokenizer/vocab.py). A key missing from KEYS is a programming error: add it with its range.

The bounds are far above every released model (the largest have 126 layers, width 16,384, 128
heads, head size 256) and low enough that no value can size an allocation by itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kinetic.errors import ModelFileError
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.ir.ops import RopeAttrs

_MISSING = object()
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20  # widths and the vocabulary
MAX_HEADS = 4096
MAX_HEAD_SIZE = 4096
MAX_CONTEXT = 1 << 31
MAX_FLOAT = 1e30


@dataclass(frozen=True)
class Spec:
    """What one key may hold: an int, float or str, and for numbers a closed range (open below
    when `positive`: the low end itself is refused)."""

    kind: type
    low: float | None = None
    high: float | None = None
    positive: bool = False

    def expected(self) -> str:
        if self.kind is str:
            return "a string"
        if self.kind is bool:
            return "true or false"
        what, low, high = ("an integer", f"{self.low}", f"{self.high}") if self.kind is int else \
            ("a finite number", f"{self.low:g}", f"{self.high:g}")
        return f"{what} above {low} and at most {high}" if self.positive else f"{what} from {low} to {high}"

    def accepts(self, value: Any) -> bool:
        if self.kind in (str, bool):
            return isinstance(value, self.kind)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind is int and not isinstance(value, int):
            return False
        if not math.isfinite(value) or value > self.high:
            return False
        return value > self.low if self.positive else value >= self.low


KEYS: dict[str, Spec] = {
    "block_count": Spec(int, 1, MAX_LAYERS),
    "context_length": Spec(int, 1, MAX_CONTEXT),
    "embedding_length": Spec(int, 1, MAX_WIDTH),
    "feed_forward_length": Spec(int, 1, MAX_WIDTH),
    "vocab_size": Spec(int, 1, MAX_WIDTH),
    "attention.head_count": Spec(int, 1, MAX_HEADS),
    "attention.head_count_kv": Spec(int, 1, MAX_HEADS),
    "attention.key_length": Spec(int, 1, MAX_HEAD_SIZE),
    "attention.value_length": Spec(int, 1, MAX_HEAD_SIZE),
    "attention.layer_norm_rms_epsilon": Spec(float, 0.0, 1.0, positive=True),
    "attention.sliding_window": Spec(int, 0, MAX_CONTEXT),
    "rope.dimension_count": Spec(int, 2, MAX_HEAD_SIZE),
    "rope.freq_base": Spec(float, 0.0, MAX_FLOAT, positive=True),
    "rope.freq_base_swa": Spec(float, 0.0, MAX_FLOAT, positive=True),
    # gemma4: per-layer head counts and sizes, its sliding-window pattern, the final logit cap, and the
    # features Kinetic refuses for now (per-layer embeddings, layers that share another's KV cache)
    "attention.key_length_swa": Spec(int, 1, MAX_HEAD_SIZE),
    "attention.value_length_swa": Spec(int, 1, MAX_HEAD_SIZE),
    "attention.sliding_window_pattern": Spec(bool),  # per layer: true = sliding window
    "rope.dimension_count_swa": Spec(int, 2, MAX_HEAD_SIZE),
    "final_logit_softcapping": Spec(float, 0.0, MAX_FLOAT),  # 0 = off
    "embedding_length_per_layer_input": Spec(int, 0, MAX_WIDTH),
    "attention.shared_kv_layers": Spec(int, 0, MAX_LAYERS),
    "rope.scaling.type": Spec(str),
    "rope.scaling.factor": Spec(float, 0.0, MAX_FLOAT),
    "rope.scale_linear": Spec(float, 0.0, MAX_FLOAT),  # the older name of rope.scaling.factor
    "rope.scaling.attn_factor": Spec(float, 0.0, MAX_FLOAT, positive=True),
    "rope.scaling.original_context_length": Spec(int, 0, MAX_CONTEXT),  # YaRN's; 0 = context_length
    "rope.scaling.finetuned": Spec(bool),  # granite: false means no rotary at all
    "embedding_scale": Spec(float, 0.0, MAX_FLOAT),  # granite multipliers; 0 = off (llama.cpp's default)
    "residual_scale": Spec(float, 0.0, MAX_FLOAT),
    "attention.scale": Spec(float, 0.0, MAX_FLOAT),
    "logit_scale": Spec(float, 0.0, MAX_FLOAT, positive=True),  # the logits are divided by it
    "rope.scaling.alpha": Spec(float, 0.0, MAX_FLOAT),  # hunyuan: NTK alpha, folded into the base
    "shortconv.l_cache": Spec(int, 2, 64),  # lfm2: taps of the short convolution (its state: l_cache - 1 rows)
    # Mamba-2 layers (granitehybrid, falcon-h1): conv taps, inner width, state size, heads, B/C groups
    "ssm.conv_kernel": Spec(int, 2, 64),
    "ssm.inner_size": Spec(int, 1, MAX_WIDTH),
    "ssm.state_size": Spec(int, 1, 1024),
    "ssm.time_step_rank": Spec(int, 1, MAX_HEADS),
    "ssm.group_count": Spec(int, 1, MAX_HEADS),
    # qwen35 (Gated DeltaNet): every Nth layer is attention; trailing layers that are prediction (MTP) blocks
    "full_attention_interval": Spec(int, 1, MAX_LAYERS),
    "nextn_predict_layers": Spec(int, 0, MAX_LAYERS),
    # embedding models (kinetic/frontend/encoder.py): BERT's norm eps, whether attention is causal, and
    # llama.cpp's pooling type (0 none, 1 mean, 2 CLS, 3 last, 4 rank)
    "attention.layer_norm_epsilon": Spec(float, 0.0, 1.0, positive=True),
    "attention.causal": Spec(bool),
    "pooling_type": Spec(int, 0, 4),
    # mixture of experts (kinetic/frontend/moe_blocks.py): experts per layer and per row, their widths,
    # the weights' renormalization and scale, the gate (1 softmax, 2 sigmoid), the leading dense layers
    "expert_count": Spec(int, 1, 4096),
    "expert_used_count": Spec(int, 1, 4096),
    "expert_feed_forward_length": Spec(int, 1, MAX_WIDTH),
    "expert_shared_feed_forward_length": Spec(int, 0, MAX_WIDTH),
    "expert_weights_norm": Spec(bool),
    "expert_weights_scale": Spec(float, 0.0, MAX_FLOAT),
    "expert_gating_func": Spec(int, 0, 4),
    "leading_dense_block_count": Spec(int, 0, MAX_LAYERS),
}


@dataclass(frozen=True)
class Decoder:
    """The hyperparameters every decoder family reads the same way, already checked together."""

    n_layer: int
    n_embd: int
    n_head: int
    n_kv_head: int
    head_dim: int
    eps: float


def decoder(gguf: GGUFFile, *, default_eps: float) -> Decoder:
    n_embd = key(gguf, "embedding_length")
    n_head = key(gguf, "attention.head_count")
    n_kv_head = key(gguf, "attention.head_count_kv", n_head)
    if n_head % n_kv_head:
        raise _refuse(gguf, "attention.head_count_kv", n_kv_head, f"a divisor of attention.head_count ({n_head})")
    head_dim = key(gguf, "attention.key_length", None)
    if head_dim is None:
        if n_embd % n_head:
            raise _refuse(gguf, "attention.head_count", n_head, f"a divisor of embedding_length ({n_embd}), "
                          "since the file gives no attention.key_length")
        head_dim = n_embd // n_head
    value_length = key(gguf, "attention.value_length", head_dim)
    if value_length != head_dim:
        raise _refuse(gguf, "attention.value_length", value_length, f"the key length ({head_dim}): Kinetic's "
                      "attention reads keys and values of one size")
    return Decoder(n_layer=key(gguf, "block_count"), n_embd=n_embd, n_head=n_head, n_kv_head=n_kv_head,
                   head_dim=head_dim, eps=float(key(gguf, "attention.layer_norm_rms_epsilon", default_eps)))


def key(gguf: GGUFFile, suffix: str, default: Any = _MISSING) -> Any:
    """`<architecture>.<suffix>`, checked against KEYS[suffix]; without a default a missing key is an
    error naming it. Numbers come back as int or float, as the spec says."""
    spec = KEYS[suffix]
    name = f"{gguf.architecture}.{suffix}"
    value = gguf.metadata.get(name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise ModelFileError(gguf.path.name, name, "is missing", spec.expected(),
                                 "The file is incomplete or was converted for another architecture; get a "
                                 "complete file.")
        return default
    if not spec.accepts(value):
        raise _refuse(gguf, suffix, value, spec.expected())
    return float(value) if spec.kind is float else value


def per_layer(gguf: GGUFFile, suffix: str, *, n_layer: int, default: Any = _MISSING) -> tuple[Any, ...]:
    """`<architecture>.<suffix>` for each of n_layer layers: one value for every layer, or an array of
    exactly n_layer values, each checked against KEYS[suffix] as key() checks one."""
    name = f"{gguf.architecture}.{suffix}"
    value = gguf.metadata.get(name, _MISSING)
    if not hasattr(value, "__len__") or isinstance(value, str):
        return (key(gguf, suffix, default),) * n_layer
    spec, values = KEYS[suffix], list(value.tolist() if hasattr(value, "tolist") else value)
    if len(values) != n_layer:
        raise _refuse(gguf, suffix, value, f"one value, or an array of one per layer ({n_layer})")
    for il, item in enumerate(values):
        if not spec.accepts(item):
            raise ModelFileError(gguf.path.name, f"{name}[{il}]", f"is {_show(item)}", spec.expected())
    return tuple(float(v) if spec.kind is float else v for v in values)


@dataclass(frozen=True)
class Heads:
    """One layer's attention heads: query heads, KV heads, and the size of each."""

    n_head: int
    n_kv_head: int
    head_dim: int


def heads_per_layer(gguf: GGUFFile, *, n_layer: int, key_length: tuple[int, ...],
                    value_length: tuple[int, ...]) -> tuple[Heads, ...]:
    """Each layer's heads, for files whose head counts (attention.head_count, head_count_kv) may be
    arrays and whose head size may differ between layers (given per layer by the family): the KV heads
    divide the heads, and keys and values have one size."""
    n_head = per_layer(gguf, "attention.head_count", n_layer=n_layer)
    n_kv_head = per_layer(gguf, "attention.head_count_kv", n_layer=n_layer, default=None)
    layers = []
    for il in range(n_layer):
        kv = n_kv_head[il] or n_head[il]
        if n_head[il] % kv:
            raise _refuse(gguf, "attention.head_count_kv", kv, f"a divisor of attention.head_count ({n_head[il]}) "
                          f"in layer {il}")
        if value_length[il] != key_length[il]:
            raise _refuse(gguf, "attention.value_length", value_length[il], f"the key length ({key_length[il]}) in "
                          f"layer {il}: Kinetic's attention reads keys and values of one size")
        layers.append(Heads(n_head=n_head[il], n_kv_head=kv, head_dim=key_length[il]))
    return tuple(layers)


def rope(gguf: GGUFFile, *, n_head: int, head_dim: int, neox: bool, theta: float | None = None,
         swa: bool = False, freq_factors: bool = True) -> RopeAttrs:
    """The rotary configuration of a layer with llama.cpp's scaling (none, linear, YaRN, the file's
    rope_freqs factors) and the command line's overrides; an unknown scaling type is refused by name.
    `theta`: a base in place of rope.freq_base; `swa`: a sliding-window layer (its own base, no linear
    or YaRN scale); `freq_factors`: whether the layer reads rope_freqs. See rope_scaling.py."""
    from kinetic.frontend.rope_scaling import rope_attrs  # it reads its keys through this module

    return rope_attrs(gguf, n_head=n_head, head_dim=head_dim, neox=neox, theta=theta, swa=swa,
                      freq_factors=freq_factors)


def _refuse(gguf: GGUFFile, suffix: str, value: Any, expected: str) -> ModelFileError:
    return ModelFileError(gguf.path.name, f"{gguf.architecture}.{suffix}", f"is {_show(value)}", expected)


def _show(value: Any) -> str:
    """A value as a message shows it: short, with its kind when that is the problem."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        text = value if len(value) <= 30 else value[:27] + "..."
        return f"{text!r} (a string)"
    if isinstance(value, (int, float)):
        return repr(value)
    if hasattr(value, "__len__"):
        return f"an array of {len(value)} values"
    return f"a {type(value).__name__}"
