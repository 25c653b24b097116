"""Reduction orders: the named orders of summation the reductions of the IR follow, one row at a time.

Owns: `ORDERS` (every order's name and what it means) and the functions that say which order a
reduction's reference follows given its input types and attributes (`matmul_order`,
`rms_norm_order`, `attention_order`), which the op table names in each reducing op's spec
(kinetic/ir/ops.py, `OpSpec.order`). Does not own the arithmetic (kinetic/ir/numerics), assigning
the orders in a graph (kinetic/passes/batch_invariance.py) or which orders a device's kernels follow
(each device declares the ones it follows in its Capabilities record, `reduction_orders`).

The batch-invariance contract (docs/ir.md, "Batch invariance"): every order here is a per-row order.
The sum that makes one row's value reads that row's inputs and the weights only, in a sequence fixed
by the widths (K, a norm's group, a head's size, the keys the row sees), never by the number of rows
in the pass, so a row gives the same bits alone as among any other rows. An order that splits a
row's reduction across threads, or tiles it by the batch (split-K, a BLAS matrix-matrix product), has
no name here, and no device may claim one.

Numerics modes (`NUMERICS`, the pipeline's PassOptions.numerics): "ggml" gives every reduction the
order of llama.cpp's CPU decode path (the functions below, which each op's spec names); "fast" gives
the ops in `FAST_ORDERS` a faster per-row order (a matmul of FAST_BLOCK_CHAIN weights "block_chain"),
every other reduction its ggml order. Both are per-row orders, so both keep the batch-invariance
contract; the verifier accepts a node's order from either mode (ops.allowed_orders). The default is
"fast" (`DEFAULT_NUMERICS`) wherever a device follows it (the CPU, the reference interpreter), "ggml"
on the others (kinetic/numerics_mode.py, `default_numerics`); a node without an order (a graph before
the batch-invariance pass) sums in its spec's, ggml's, order.

Renaming an order or changing which one an op gets changes what the batch-invariance pass writes:
this module's source is part of kinetic/passes/pipeline.py's pipeline_hash, so stored graphs (.ktc
files) are optimized again rather than read with stale names.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType

from kinetic.ir.quants import QUANT_TYPES

ORDERS: dict[str, str] = {
    # matmul: one output of one row is a dot product of its activation row with a weight row
    "lanes8": "ggml's x86 vec-dot of 8-bit activations: per block the exact integer lane sums, each of "
              "8 float lanes an fma chain over the blocks in order, summed by hsum_float_8 at the end "
              "(the weight types whose QUANT_TYPES dot_order is \"lanes\")",
    "block_chain": "one float chain of whole-block dots per output, an fma per block in block order: "
                   "acc = fma(f32(exact int block sum), f32(d_w*d_x), acc), Q4_1/Q5_1 plus a chain "
                   "accm = fma(m_w, s_x, accm) added at the end (ggml's repacked x86 gemv for Q4_0, Q2_K, "
                   "Q4_K, IQ4_NL, MXFP4; the fast numerics mode's order for Q8_0, Q5_0, Q4_1, Q5_1 too, and for "
                   "Q3_K, Q5_K, Q6_K, IQ4_XS one fma per super-block, Q5_K's minimum as Q4_K's)",
    "lanes64": "ggml_vec_dot_f16 / _f32: 64 fma lanes over chunks of 64 values, ggml's reduction tree, "
               "then the last K % 64 values in ggml's order (F16 and F32 weights)",
    "bf16_pairs": "ggml_vec_dot_bf16 with AVX512-BF16: 2 x 16 lanes by vdpbf16ps over chunks of 64, each "
                  "vector reduced on its own and added in float64, the tail in float64 (BF16 weights)",
    "dequant_matvec": "a float32 matrix-vector product of the dequantized weight with the row as its "
                      "activation format gives it (the float path, activations=\"f32\", and weight types "
                      "without an exact ggml order)",
    # rms_norm: one row (or group) of squares
    "f64_sum": "the squares of the row (or of each group) summed in float64, mean and scale in float32",
    # layer_norm: one row's mean and variance
    "mean_var_f64": "the row summed in float64 (mean in float32), the deviations' squares reduced 16 lanes "
                    "at a time (_mm512_reduce_add_ps) into a float64 sum, the tail one by one in float64",
    # attention: one query row over the keys it sees
    "key_chain_f16": "one query row over its visible keys in cache order: scores in ggml_vec_dot_f16's "
                     "order, an online softmax with the C library's expf, an f16 accumulator rounded "
                     "after every key (an f16 cache)",
    "key_chain_f16_acc32": "as key_chain_f16 (q rounded to f16, the same scores, softmax and S) with an f32 "
                           "accumulator never rounded to f16: acc * ms and the fma acc + v * vs in float32 "
                           "(an f16 cache, the fast numerics mode)",
    "key_chain_f32": "as key_chain_f16 with scores summed in float64 and an f32 accumulator (an f32 cache)",
}

# ---- numerics modes: which order each reduction takes -------------------------------------------
# "ggml": every reduction in the order llama.cpp's CPU decode path sums in (the functions below, named
# by each op's spec: OpSpec.order). "fast": the reductions listed in FAST_ORDERS take a faster per-row
# order, which the reference follows too; every other reduction keeps its ggml order.
NUMERICS = ("ggml", "fast")
# the one default: every entry point (CLI, Model, compile) takes it on a device that follows it and
# "ggml" on the others (numerics_mode.default_numerics); the pipeline's PassOptions, which names no
# device, takes it as it is
DEFAULT_NUMERICS = "fast"

_FLOAT_WEIGHT_ORDERS = {"f16": "lanes64", "f32": "lanes64", "bf16": "bf16_pairs"}
_QUANTIZED_ORDERS = {"lanes": "lanes8", "scalar": "block_chain"}


def weight_order(wtype: GGMLQuantizationType, activations: str = "q8") -> str:
    """The order of a matmul's dots with weights of `wtype` (dots.matmul's branches): float weights
    meet activations in their own format, quantized ones 8-bit activations in their dot_order; the
    float path (activations="f32") and types without an exact order multiply dequantized values."""
    facts = QUANT_TYPES.get(wtype)
    if activations == "f32" or facts is None:
        return "dequant_matvec"
    if facts.activation in _FLOAT_WEIGHT_ORDERS:
        return _FLOAT_WEIGHT_ORDERS[facts.activation]
    return _QUANTIZED_ORDERS.get(facts.dot_order, "dequant_matvec")


def matmul_order(input_types: list, attrs) -> str:
    """matmul(x, w): the order of its weight type and activations (`weight_order`)."""
    return weight_order(input_types[1].ggml_type, attrs.activations)


def rms_norm_order(input_types: list, attrs) -> str:
    return "f64_sum"


def layer_norm_order(input_types: list, attrs) -> str:
    return "mean_var_f64"


def attention_order(input_types: list, attrs) -> str:
    return "key_chain_f16" if attrs.kv_dtype == "f16" else "key_chain_f32"


# ---- the fast mode's orders ---------------------------------------------------------------------

# weight types whose matmul with 8-bit activations sums as one chain of whole blocks in "fast" mode
FAST_BLOCK_CHAIN = frozenset({GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0,
                              GGMLQuantizationType.Q5_1, GGMLQuantizationType.Q8_0, GGMLQuantizationType.IQ4_NL,
                              GGMLQuantizationType.MXFP4, GGMLQuantizationType.Q2_K, GGMLQuantizationType.Q4_K,
                              GGMLQuantizationType.Q3_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K,
                              GGMLQuantizationType.IQ4_XS})


def fast_matmul_order(input_types: list, attrs) -> str:
    """matmul(x, w) in "fast" mode: "block_chain" for FAST_BLOCK_CHAIN weights with 8-bit
    activations, ggml's order otherwise."""
    if attrs.activations != "f32" and input_types[1].ggml_type in FAST_BLOCK_CHAIN:
        return "block_chain"
    return matmul_order(input_types, attrs)


def fast_attention_order(input_types: list, attrs) -> str:
    """attention in "fast" mode: over an f16 cache "key_chain_f16_acc32" (ggml's steps with an f32
    value accumulator: no f16 rounding per key), over an f32 cache its ggml order."""
    return "key_chain_f16_acc32" if attrs.kv_dtype == "f16" else attention_order(input_types, attrs)


# the "fast" mode's order functions, one entry per op (its name in the text form, Op.value); an op
# without an entry keeps its ggml order (OpSpec.order) in every mode. ops.mode_order reads this.
FAST_ORDERS = {
    "matmul": fast_matmul_order,
    "attention": fast_attention_order,
}
