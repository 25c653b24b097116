"""Reading a family's hyperparameters from GGUF metadata: every value typed and range-checked as it
is read, before anything uses it.

Owns: KEYS, the table of `<arch>.*` keys Kinetic reads (each key's type and range); `key()`, which
reads one and refuses anything else (wrong type, an array where one value belongs, out of range,
NaN) with a ModelFileError naming the key, what it holds and what was expected; the relations
between the values (head counts dividing the width and each other, rotary dimensions within a head)
in `decoder()` and `rope()`; and the refusal of rotary scaling types the interpreter does not apply.
Does not own the tensors' shapes (blocks.py checks them against these values) or the tokenizer's
keys (tokenizer/vocab.py). A key missing from KEYS is a programming error: add it with its range.

The bounds are far above every released model (the largest have 126 layers, width 16,384, 128
heads, head size 256) and low enough that no value can size an allocation by itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kinetic.errors import KineticError, ModelFileError
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
        what, low, high = ("an integer", f"{self.low}", f"{self.high}") if self.kind is int else \
            ("a finite number", f"{self.low:g}", f"{self.high:g}")
        return f"{what} above {low} and at most {high}" if self.positive else f"{what} from {low} to {high}"

    def accepts(self, value: Any) -> bool:
        if self.kind is str:
            return isinstance(value, str)
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
    "rope.scaling.type": Spec(str),
    "rope.scaling.factor": Spec(float, 0.0, MAX_FLOAT),
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


def rope(gguf: GGUFFile, *, n_head: int, head_dim: int, neox: bool, theta: float | None = None) -> RopeAttrs:
    """The rotary configuration; linear scaling is applied, other scaling types are refused."""
    n_rot = key(gguf, "rope.dimension_count", head_dim)
    if n_rot % 2 or n_rot > head_dim:
        raise _refuse(gguf, "rope.dimension_count", n_rot, f"an even number from 2 to the head size ({head_dim})")
    base = theta if theta is not None else key(gguf, "rope.freq_base", 10000.0)
    scaling = key(gguf, "rope.scaling.type", "none")
    factor = key(gguf, "rope.scaling.factor", 0.0)
    if "rope_freqs.weight" in gguf.tensors:
        scaling = "llama3"
    if scaling in ("none", "") or (scaling == "linear" and factor in (0.0, 1.0)):
        return RopeAttrs(n_head, head_dim, n_rot, base, neox)
    if scaling == "linear":
        return RopeAttrs(n_head, head_dim, n_rot, base, neox, freq_scale=1.0 / factor)
    raise KineticError(f"{scaling} rotary scaling is not supported yet",
                       "Use a model without rotary scaling, or run it with llama.cpp for now.")


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
