"""Value types of the IR: an element type and a shape whose dimensions may be symbolic.

Owns: `TensorType` (dtype + shape), the element types (f32, f16, i32 and every GGUF tensor type for
parameters) and the symbolic dimensions: `T`, the rows of a forward pass (tokens), and `R`, the rows
whose logits the runtime asked for. Text form: `f32[T,576]`, `q4_1[1536,576]`, `i32[T]`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType

# Symbolic dimensions: bound per forward pass by the runtime.
T = "T"  # rows in the pass (tokens of one or several sequences, or a draft tree)
R = "R"  # rows whose output (logits) is wanted
SYMBOLS = (T, R)

Dim = int | str

FLOAT_DTYPES = ("f32", "f16")
INT_DTYPES = ("i32",)
STATE_DTYPES = ("kv", "rs")  # handles to runtime-owned state: a KV cache, a recurrent state rs[rows,width]
QUANT_DTYPES = tuple(t.name.lower() for t in GGMLQuantizationType)
DTYPES = FLOAT_DTYPES + INT_DTYPES + STATE_DTYPES + tuple(q for q in QUANT_DTYPES if q not in ("f32", "f16"))


@dataclass(frozen=True)
class TensorType:
    dtype: str
    shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        for d in self.shape:
            if isinstance(d, str) and d not in SYMBOLS:
                raise ValueError(f"unknown symbolic dimension {d!r}")
            if isinstance(d, int) and d < 0:
                raise ValueError(f"negative dimension {d}")

    @property
    def ggml_type(self) -> GGMLQuantizationType:
        return GGMLQuantizationType[self.dtype.upper()]

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"

    @staticmethod
    def parse(text: str) -> TensorType:
        text = text.strip()
        if not text.endswith("]") or "[" not in text:
            raise ValueError(f"bad type {text!r}")
        dtype, dims = text[:-1].split("[", 1)
        shape = tuple(int(d) if d.strip().lstrip("-").isdigit() else d.strip() for d in dims.split(",") if d.strip())
        return TensorType(dtype, shape)


def f32(*shape: Dim) -> TensorType:
    return TensorType("f32", tuple(shape))


def i32(*shape: Dim) -> TensorType:
    return TensorType("i32", tuple(shape))


def param_type(ggml_type: GGMLQuantizationType, shape: tuple[int, ...]) -> TensorType:
    """The type of a weight as stored in the file (numpy order shape)."""
    return TensorType(ggml_type.name.lower(), tuple(shape))
