"""The op group of leaves, lookups and projections: input, param, embed, matmul, take_rows, columns,
concat, and the device form quantize (rows in a matmul's 8-bit format).

Owns: their attribute dataclasses and shape inference (`infer_<op>`). Does not own: the table that
binds them to ops and references (kinetic/ir/ops.py, the import surface for every name here).
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.ir.op_groups.checks import activation, check, n_inputs
from kinetic.ir.quants import QUANT_TYPES
from kinetic.ir.types import R, T, TensorType, f32, i32


@dataclass(frozen=True)
class NoAttrs:
    pass


@dataclass(frozen=True)
class InputAttrs:
    name: str  # "tokens", "positions", "token_types" (BERT's segment ids) or "output_rows"; "hidden.<width>":
    # f32 rows a pass brings (PassRows.hidden: the trunk's hidden states a prediction block reads)


@dataclass(frozen=True)
class ParamAttrs:
    tensor: str  # GGUF tensor name


@dataclass(frozen=True)
class EmbedAttrs:
    pass


@dataclass(frozen=True)
class MatmulAttrs:
    # "q8": activations are quantized to 8 bits per block first, as ggml's vec-dot does for
    # quantized weights (Q8_0 for legacy types, Q8_1 for Q4_1/Q5_1, Q8_K for k-quants);
    # "f32": plain float activations.
    activations: str = "q8"
    order: str = ""  # the reduction order (kinetic/ir/orders.py); "" until the batch-invariance pass


@dataclass(frozen=True)
class ColumnsAttrs:
    start: int  # the first column taken
    count: int  # how many


@dataclass(frozen=True)
class QuantizeAttrs:
    format: str  # "q8_0", "q8_1" or "q8_k": the format of the weights' dots that read it (QUANT_TYPES)
    in_producer: bool = False  # its input's launch writes it too (no launch of its own)


def infer_input(ins, a: InputAttrs) -> TensorType:
    n_inputs(ins, 0, "input")
    if a.name.startswith("hidden."):
        width = a.name.removeprefix("hidden.")
        check(width.isdigit() and int(width) > 0, f"input {a.name!r} must name its width, e.g. hidden.576")
        return f32(T, int(width))
    check(a.name in ("tokens", "positions", "token_types", "output_rows"), f"unknown input {a.name!r}")
    return i32(R) if a.name == "output_rows" else i32(T)


def infer_embed(ins, a) -> TensorType:
    n_inputs(ins, 2, "embed")
    table, ids = ins
    check(len(table.shape) == 2, f"embedding table must be 2-D, got {table}")
    check(ids.dtype == "i32" and len(ids.shape) == 1, f"embedding ids must be i32[rows], got {ids}")
    return f32(ids.shape[0], table.shape[1])


def infer_matmul(ins, a: MatmulAttrs) -> TensorType:
    n_inputs(ins, 2, "matmul")
    x, w = ins
    check(len(w.shape) == 2, f"matmul weight must be 2-D, got {w}")
    if x.dtype in QUANTIZED_ROWS:  # rows a quantize node made: in the format this weight's dots take
        fmt = QUANT_TYPES[w.ggml_type].activation if w.ggml_type in QUANT_TYPES else None
        check(a.activations == "q8" and x.dtype == fmt, f"matmul of {w} reads {fmt} rows, got {x}")
        rows, k = x.shape
    else:
        rows, k = activation(x, "matmul input")
    check(w.shape[1] == k, f"matmul width mismatch: input {x}, weight {w}")
    check(a.activations in ("q8", "f32"), f"matmul activations must be q8 or f32, got {a.activations!r}")
    return f32(rows, w.shape[0])


def infer_take_rows(ins, a) -> TensorType:
    n_inputs(ins, 2, "take_rows")
    x, idx = ins
    _, width = activation(x, "take_rows input")
    check(idx.dtype == "i32" and len(idx.shape) == 1, f"take_rows index must be i32[rows], got {idx}")
    return f32(idx.shape[0], width)


def infer_columns(ins, a: ColumnsAttrs) -> TensorType:
    n_inputs(ins, 1, "columns")
    rows, width = activation(ins[0], "columns input")
    check(a.start >= 0 and a.count > 0 and a.start + a.count <= width,
           f"columns {a.start}..{a.start + a.count - 1} are not within the {width} of {ins[0]}")
    return f32(rows, a.count)


def infer_concat(ins, a) -> TensorType:
    n_inputs(ins, 2, "concat")
    (rows_a, width_a), (rows_b, width_b) = activation(ins[0], "concat input"), activation(ins[1], "concat input")
    check(rows_a == rows_b, f"concat of {ins[0]} and {ins[1]}: the rows differ")
    return f32(rows_a, width_a + width_b)


# the formats a quantize node makes -> values per block
QUANTIZED_ROWS = {"q8_0": 32, "q8_1": 32, "q8_k": 256}


def infer_quantize(ins, a: QuantizeAttrs) -> TensorType:
    n_inputs(ins, 1, "quantize")
    rows, width = activation(ins[0], "quantize input")
    check(a.format in QUANTIZED_ROWS, f"quantize format must be one of {', '.join(QUANTIZED_ROWS)}, got {a.format!r}")
    check(isinstance(width, int) and width % QUANTIZED_ROWS[a.format] == 0,
           f"{a.format} rows are whole blocks of {QUANTIZED_ROWS[a.format]} values, not {width}")
    return TensorType(a.format, (rows, width))
