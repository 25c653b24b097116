"""LoRA adapters: llama.cpp's GGUF adapter files, checked against the base model and merged at load.

Owns: parsing the command line's --lora / --lora-scaled values into `Adapter`s, reading an adapter
file (general.type = adapter, adapter.type = lora, adapter.lora.alpha, `<weight>.lora_a` /
`<weight>.lora_b` pairs), refusing one that does not fit the base model (another architecture, a
missing base tensor, other shapes, a lone half of a pair) with what differs, and `merge_adapters`:
a view of the base GGUF file in which each adapted weight is W + Σ scale·alpha/rank·B·A.

Does not own: running the model (the merged view is an ordinary GGUF file to the compiler and the
devices), receipts (kinetic/receipts records `Adapter.record()`).

Why merge, and into what type. llama.cpp keeps B and A beside W and adds scale·B·(A·x) to every
matmul it adapts; merging once at load lets every device run the plain graph at its full speed
(no extra ops, nothing for the device tables to learn). The sum is computed in float32 (W
dequantized by the reference dequantizer, B·A by numpy's float32 matmul, then scaled as llama.cpp
scales, alpha/rank·scale) and stored as F16 (as F32 when the base weight is F32 or BF16: no rounding
added there, and BF16's range exceeds F16's). Why F16: every device runs F16 matmuls, it is half
F32's bytes, and on SmolLM2 with tests/lora's adapter it agrees with llama.cpp as closely as F32 does
(mean log-probability error 0.071 against F32's 0.073 at scale 1, 0.088 against 0.084 at 0.5) while
decoding 1.6x as fast (27-30 tok/s against F32's 17-22, the base model 32-34, 2 busy vCPUs). Re-encoding
into the base's quantized type would lose much of a small adapter's change in the type's own step.
The cost: an adapted matrix takes 2 bytes a value (q, v and ffn_down of SmolLM2 from Q4_1 to F16:
+47 MiB); the other weights keep their bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import GGUFFile, TensorInfo, open_gguf
from kinetic.ir.quants import dequantize

T = GGMLQuantizationType
_SUFFIXES = (".lora_a", ".lora_b")
_HINT = "Use an adapter made for this model (llama.cpp's convert_lora_to_gguf.py writes them from a PEFT folder)."


@dataclass(frozen=True)
class Adapter:
    """One adapter to apply: its file and its scale (--lora FILE is scale 1.0)."""

    path: Path
    scale: float = 1.0

    def record(self) -> dict:
        """What a receipt records of it: the file, its BLAKE3 and the scale."""
        from kinetic.receipts.hashing import file_blake3

        return {"file": self.path.name, "path": str(self.path), "blake3": file_blake3(self.path),
                "scale": self.scale}


# -- the command line's spellings ------------------------------------------------------------------

def parse_lora_flags(lora: list[str] | None, lora_scaled: list[str] | None) -> list[Adapter]:
    """--lora FILE[,FILE] and --lora-scaled FILE:SCALE[,...], each repeatable, in the order given
    (--lora's first); llama.cpp's older `--lora-scaled FILE SCALE` is joined by `join_scaled_pairs`."""
    adapters = [Adapter(Path(f).expanduser()) for value in lora or [] for f in _split(value)]
    for item in (i for value in lora_scaled or [] for i in _split(value)):
        file, sep, scale = item.rpartition(":")
        if not sep or not file:
            raise KineticError(f"--lora-scaled {item!r} has no scale",
                               "Write --lora-scaled FILE:SCALE, for example --lora-scaled style.gguf:0.5.")
        adapters.append(Adapter(Path(file).expanduser(), _scale(scale, file)))
    return adapters


def join_scaled_pairs(argv: list[str]) -> list[str]:
    """llama.cpp's older two-argument `--lora-scaled FILE SCALE` as `--lora-scaled FILE:SCALE`, so one
    argparse option reads both forms (argparse cannot take one or two values by what they look like)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--lora-scaled" and i + 2 < len(argv) and ":" not in argv[i + 1] \
                and _is_number(argv[i + 2]):
            out += ["--lora-scaled", f"{argv[i + 1]}:{argv[i + 2]}"]
            i += 3
            continue
        out.append(argv[i])
        i += 1
    return out


def as_adapters(lora) -> list[Adapter]:
    """The Python API's `lora=`: a path, an Adapter, a (path, scale) pair, or a list of those."""
    if lora is None:
        return []
    items = [lora] if isinstance(lora, (str, os.PathLike, Adapter, tuple)) else list(lora)
    out = []
    for item in items:
        if isinstance(item, Adapter):
            out.append(item)
        elif isinstance(item, tuple) and len(item) == 2:
            out.append(Adapter(Path(item[0]).expanduser(), _scale(item[1], str(item[0]))))
        elif isinstance(item, (str, os.PathLike)):
            out.append(Adapter(Path(item).expanduser()))
        else:
            raise KineticError(f"lora={item!r} is not an adapter", "Give a path, (path, scale), or a list of them.")
    return out


def _split(value: str) -> list[str]:
    return [part for part in value.split(",") if part]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _scale(text, file: str) -> float:
    try:
        scale = float(text)
    except (TypeError, ValueError):
        raise KineticError(f"the scale {text!r} of adapter {file} is not a number",
                           "Give a number such as 0.5.") from None
    if not np.isfinite(scale):
        raise KineticError(f"the scale of adapter {file} is {scale}", "Give a finite number such as 0.5.")
    return scale


# -- reading and checking an adapter ---------------------------------------------------------------

@dataclass(frozen=True)
class LoraPair:
    """One adapted weight: A f32 [rank, n_in], B f32 [n_out, rank] and the factor alpha/rank·scale."""

    a: np.ndarray
    b: np.ndarray
    factor: float

    def delta(self) -> np.ndarray:
        """f32 [n_out, n_in]: (B·A)·factor, in float32 as llama.cpp scales B·(A·x)."""
        return (self.b @ self.a) * np.float32(self.factor)


def read_adapter(adapter: Adapter, base: GGUFFile) -> dict[str, LoraPair]:
    """The adapter's pairs by base tensor name, each checked against `base`; a KineticError names
    what differs."""
    if not adapter.path.is_file():
        raise KineticError(f"no LoRA adapter at {adapter.path}", "Check the path given to --lora.")
    file = open_gguf(adapter.path)
    name = adapter.path.name
    _check_header(file, base, name)
    alpha = float(file.metadata.get("adapter.lora.alpha", 0.0))
    halves = _halves(file, name)
    return {weight: _pair(file, base, name, weight, parts, alpha, adapter.scale) for weight, parts in halves.items()}


def _check_header(file: GGUFFile, base: GGUFFile, name: str) -> None:
    kind = file.metadata.get("general.type")
    if kind != "adapter":
        raise KineticError(f"{name} is not a LoRA adapter: general.type is {kind!r}, not 'adapter'", _HINT)
    adapter_type = file.metadata.get("adapter.type")
    if adapter_type != "lora":
        raise KineticError(f"{name} is a {adapter_type!r} adapter; Kinetic applies 'lora' adapters", _HINT)
    arch, base_arch = file.metadata.get("general.architecture"), base.architecture
    if arch != base_arch:
        raise KineticError(f"{name} is an adapter for {arch!r}; the model is {base_arch!r}", _HINT)


def _halves(file: GGUFFile, name: str) -> dict[str, dict[str, TensorInfo]]:
    halves: dict[str, dict[str, TensorInfo]] = {}
    for tensor, info in file.tensors.items():
        suffix = next((s for s in _SUFFIXES if tensor.endswith(s)), None)
        if suffix is None:
            if tensor.endswith("_norm.weight"):
                continue  # llama.cpp skips adapted norms too
            raise KineticError(f"{name}: tensor {tensor} is neither a .lora_a nor a .lora_b", _HINT)
        halves.setdefault(tensor[: -len(suffix)], {})[suffix] = info
    for weight, parts in halves.items():
        for missing in (s for s in _SUFFIXES if s not in parts):
            raise KineticError(f"{name}: {weight} has no {missing[1:]} tensor", _HINT)
    return halves


def _pair(file: GGUFFile, base: GGUFFile, name: str, weight: str, parts: dict[str, TensorInfo],
          alpha: float, scale: float) -> LoraPair:
    info = base.tensors.get(weight)
    if info is None:
        raise KineticError(f"{name} adapts {weight}, which the model does not have", _HINT)
    if weight == "token_embd.weight" or len(info.ne) != 2:
        raise KineticError(f"{name} adapts {weight}; Kinetic merges adapters into matrices other than the "
                           "token embedding", "Use an adapter without a token_embd pair.")
    a, b = parts[".lora_a"], parts[".lora_b"]
    n_in, n_out = info.ne
    if a.ne[0] != n_in or b.ne[1] != n_out or len(a.ne) != 2 or len(b.ne) != 2:
        raise KineticError(f"{name}: {weight} is [{n_out}, {n_in}] in the model but the adapter's B·A is "
                           f"[{b.ne[-1]}, {a.ne[0]}]", _HINT)
    if a.ne[1] != b.ne[0]:
        raise KineticError(f"{name}: {weight}'s lora_a has rank {a.ne[1]}, its lora_b rank {b.ne[0]}", _HINT)
    rank = b.ne[0]
    factor = scale * alpha / rank if alpha else scale  # llama_adapter_lora_weight::get_scale
    return LoraPair(_f32(file, a), _f32(file, b), float(np.float32(factor)))


def _f32(file: GGUFFile, info: TensorInfo) -> np.ndarray:
    return np.ascontiguousarray(dequantize(file.array(info.name), info.type), dtype=np.float32).reshape(info.shape)


# -- merging ----------------------------------------------------------------------------------------

class MergedGGUF(GGUFFile):
    """The base file with some weights replaced by merged F16 or F32 arrays; everything else,
    metadata and the other tensors' mapped bytes, is the base's."""

    def __init__(self, base: GGUFFile, merged: dict[str, np.ndarray]):
        # not super().__init__(): that would map and parse the file again
        self.__dict__.update(base.__dict__)
        self._merged = merged
        self.tensors = {name: _retyped(info, merged[name]) if name in merged else info
                        for name, info in base.tensors.items()}

    def raw(self, name: str) -> np.ndarray:
        if name in self._merged:
            return self._merged[name].reshape(-1).view(np.uint8)
        return super().raw(name)

    def array(self, name: str) -> np.ndarray:
        if name in self._merged:
            return self._merged[name]
        return super().array(name)


def _retyped(info: TensorInfo, values: np.ndarray) -> TensorInfo:
    kind = T.F16 if values.dtype == np.float16 else T.F32
    return TensorInfo(info.name, kind, info.ne, info.offset, values.nbytes)


def merge_adapters(base: GGUFFile, adapters: list[Adapter]) -> GGUFFile:
    """`base` with every adapted weight replaced by W + Σ factor·B·A (float32 sums, stored as F16, or
    F32 for an F32 or BF16 base: the module docstring says why); `base` itself without adapters."""
    if not adapters:
        return base
    deltas: dict[str, np.ndarray] = {}
    for adapter in adapters:
        for weight, pair in read_adapter(adapter, base).items():
            delta = pair.delta()
            deltas[weight] = delta if weight not in deltas else deltas[weight] + delta
    merged = {}
    for weight, delta in deltas.items():
        info = base.tensors[weight]
        values = dequantize(base.array(weight), info.type).reshape(info.shape) + delta  # f32 [n_out, n_in]
        keep_f32 = info.type in (T.F32, T.BF16)
        merged[weight] = np.ascontiguousarray(values, dtype=np.float32 if keep_f32 else np.float16)
    return MergedGGUF(base, merged)

