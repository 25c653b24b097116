"""The quant-type table and the reference dequantization.

The table must match the seed's bits-per-weight column; dequantization must be bit-identical to
`gguf.quants` (the reference) on real tensors of both models and on random blocks of every type,
and, for the legacy block types, equal to an independent implementation written from ggml's block
layout below (so the reference itself is checked where that is short to do).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from kinetic.frontend.gguf_file import open_gguf
from kinetic.ir.quants import QUANT_TYPES, TYPES, dequantize, dequantize_rows, quant_type

T = GGMLQuantizationType

# The seed's "Bits per weight" column, as printed (two decimals).
SEED_BITS = {
    "F32": 32, "F16": 16, "BF16": 16, "Q8_0": 8.5, "Q6_K": 6.56, "Q5_K": 5.5, "Q5_0": 5.5, "Q5_1": 6,
    "Q4_K": 4.5, "Q4_0": 4.5, "Q4_1": 5, "IQ4_NL": 4.5, "IQ4_XS": 4.25, "MXFP4": 4.25, "Q3_K": 3.44,
    "IQ3_S": 3.44, "IQ3_XXS": 3.06, "Q2_K": 2.63, "IQ2_S": 2.56, "IQ2_XS": 2.31, "IQ2_XXS": 2.06,
    "TQ2_0": 2.06, "IQ1_M": 1.75, "TQ1_0": 1.69, "IQ1_S": 1.56,
}

# Types whose block starts with one f16 scale (and, for *_1, an f16 minimum right after it).
F16_SCALE_AT = {T.Q8_0: (0,), T.Q4_0: (0,), T.Q5_0: (0,), T.Q4_1: (0, 2), T.Q5_1: (0, 2)}


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# -- the table ---------------------------------------------------------------------------------------


def test_table_is_the_seed_list():
    """The table holds exactly the seed's 25 types, in its order."""
    assert [t.name for t in TYPES] == list(SEED_BITS)
    assert list(QUANT_TYPES) == list(TYPES)


@pytest.mark.parametrize("name", list(SEED_BITS))
def test_bits_per_weight_match_the_seed(name):
    """bytes * 8 / block rounds (half up) to the seed's two-decimal figure."""
    q = quant_type(name)
    assert q.bits_per_weight == q.block_bytes * 8 / q.block
    assert abs(q.bits_per_weight - SEED_BITS[name]) <= 0.005 + 1e-12


def test_known_block_layouts():
    """A few layouts spelled out: block size and bytes per block from ggml."""
    assert (quant_type("q8_0").block, quant_type("q8_0").block_bytes) == (32, 34)
    assert (quant_type(T.Q4_K).block, quant_type(T.Q4_K).block_bytes) == (256, 144)
    assert (quant_type(int(T.Q6_K)).block, quant_type(int(T.Q6_K)).block_bytes) == (256, 210)
    assert quant_type("Q2_K").bits_per_weight == 2.625
    assert quant_type("Q4_1").row_bytes(576) == 18 * 20


def test_lookup_errors_are_clear():
    """Unknown names, and known types outside the table, raise KeyError naming them."""
    with pytest.raises(KeyError, match="Q9_9"):
        quant_type("Q9_9")
    with pytest.raises(KeyError, match="Q8_1"):
        quant_type(T.Q8_1)
    with pytest.raises(ValueError, match="multiple of 32"):
        quant_type("Q8_0").row_bytes(33)


# ggml's vec_dot_type of each weight type (ggml-cpu.c type_traits_cpu), written out independently
VEC_DOT_TYPE = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q8_0", "Q5_0": "q8_0",
                "IQ4_NL": "q8_0", "MXFP4": "q8_0", "Q4_1": "q8_1", "Q5_1": "q8_1"}


def test_activation_formats_are_ggmls_vec_dot_types():
    """Each type's activation format is ggml's vec_dot_type: the listed ones, Q8_K for the rest."""
    for t, q in QUANT_TYPES.items():
        assert q.activation == VEC_DOT_TYPE.get(t.name, "q8_k"), t.name


def test_dot_orders_and_minimums():
    """The repacked gemvs (scalar order) are Q4_0, Q2_K, Q4_K, IQ4_NL and MXFP4; the vec-dots (lanes)
    the other types with an exact order; minimums are Q4_1, Q5_1 (m) and Q2_K, Q4_K, Q5_K (dmin)."""
    scalar = {t.name for t, q in QUANT_TYPES.items() if q.dot_order == "scalar"}
    lanes = {t.name for t, q in QUANT_TYPES.items() if q.dot_order == "lanes"}
    assert scalar == {"Q4_0", "Q2_K", "Q4_K", "IQ4_NL", "MXFP4"}
    assert lanes == {"Q8_0", "Q4_1", "Q5_0", "Q5_1", "Q3_K", "Q5_K", "Q6_K", "IQ4_XS"}
    assert {t.name for t, q in QUANT_TYPES.items() if q.has_min} == {"Q4_1", "Q5_1", "Q2_K", "Q4_K", "Q5_K"}


@pytest.mark.parametrize("qtype,scale", [(T.Q4_0, [0x00, 0x3C]), (T.IQ4_NL, [0x00, 0x3C]), (T.MXFP4, [128])],
                         ids=lambda v: getattr(v, "name", ""))
def test_codebooks_are_what_gguf_decodes(qtype, scale):
    """With a block scale of 1, code j (byte j's low and high nibble) dequantizes to codebook[j]."""
    q = QUANT_TYPES[qtype]
    codes = np.arange(16, dtype=np.uint8)
    block = np.concatenate([np.array(scale, np.uint8), codes | (codes << 4)])
    assert block.size == q.block_bytes
    values = dequantize(block.reshape(1, -1), qtype)[0]
    assert values[:16].tolist() == list(q.codebook) and values[16:].tolist() == list(q.codebook)
    assert QUANT_TYPES[T.IQ4_XS].codebook == QUANT_TYPES[T.IQ4_NL].codebook


# -- against gguf.quants on random blocks ------------------------------------------------------------


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_random_blocks_match_gguf(qtype):
    """Random bytes of every type dequantize bit-identically to gguf.quants, NaNs included."""
    q = QUANT_TYPES[qtype]
    rng = np.random.default_rng(int(qtype))
    raw = rng.integers(0, 256, size=(3, 4 * q.block_bytes), dtype=np.uint8)
    with np.errstate(all="ignore"):  # random scales include inf; inf * 0 is NaN on both sides
        ours = dequantize(raw, qtype)
        theirs = gguf_quants.dequantize(raw, qtype)
    assert ours.shape == (3, 4 * q.block) and ours.dtype == np.float32
    np.testing.assert_array_equal(bits(ours), bits(theirs))
    with np.errstate(all="ignore"):
        rows = dequantize_rows(raw, qtype, slice(1, 3))
    np.testing.assert_array_equal(bits(rows), bits(ours[1:3]))


def test_typed_inputs_equal_byte_inputs():
    """F16 values and BF16 (as uint16, how GGUFFile.array gives them) read like their bytes."""
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    f16 = x.astype(np.float16)
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(dequantize(f16, T.F16), dequantize(f16.view(np.uint8), T.F16))
    assert np.array_equal(dequantize(bf16, T.BF16), (bf16.astype(np.uint32) << 16).view(np.float32))
    assert np.array_equal(dequantize(x.view(np.uint8), T.F32), x)


# -- an independent reading of the legacy block layouts ----------------------------------------------


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32)  # [n_blocks, 1]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's order: the 16 low nibbles are values 0..15, the 16 high nibbles values 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    word = qh.copy().view("<u4")  # [n_blocks, 1]
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32) << 4


def reference(blocks: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Values of [n_blocks, block_bytes] blocks, written from ggml's dequantize_row_* for each type."""
    d = _f16(blocks, 0)
    if qtype == T.Q8_0:
        return d * blocks[:, 2:].view(np.int8).astype(np.float32)
    if qtype == T.Q4_0:
        return d * (_nibbles(blocks[:, 2:]) - 8).astype(np.float32)
    if qtype == T.Q4_1:
        return d * _nibbles(blocks[:, 4:]).astype(np.float32) + _f16(blocks, 2)
    if qtype == T.Q5_0:
        q = _nibbles(blocks[:, 6:]) | _fifth_bits(blocks[:, 2:6])
        return d * (q - 16).astype(np.float32)
    if qtype == T.Q5_1:
        q = _nibbles(blocks[:, 8:]) | _fifth_bits(blocks[:, 4:8])
        return d * q.astype(np.float32) + _f16(blocks, 2)
    raise AssertionError(f"no independent reference for {qtype.name}")


@pytest.mark.parametrize("qtype", list(F16_SCALE_AT), ids=lambda t: t.name)
def test_legacy_types_match_an_independent_reading(qtype):
    """Random finite-scale blocks of the legacy types equal the layout written out above."""
    q = QUANT_TYPES[qtype]
    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, size=(64, q.block_bytes), dtype=np.uint8)
    for at in F16_SCALE_AT[qtype]:
        blocks[:, at + 1] &= 0xBB  # keep the f16 exponent below 31: finite scales, no NaN
    ours = dequantize(blocks.reshape(1, -1), qtype).reshape(64, q.block)
    np.testing.assert_array_equal(bits(ours), bits(reference(blocks, qtype)))


# -- real tensors of both models ---------------------------------------------------------------------


def _rows_of_every_type(path):
    """(name, type, first rows, last rows) for one tensor of each type in the file."""
    g = open_gguf(path)
    seen = {}
    for t in g.tensors.values():
        seen.setdefault(t.type, t)
    for qtype, t in seen.items():
        data = g.array(t.name)
        rows = data if data.ndim == 1 else data.reshape(-1, data.shape[-1])
        yield t.name, qtype, rows


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_real_tensors_match_gguf(model, smollm2_path, gemma_path):
    """A few rows of a tensor of every type in each model equal gguf.quants bit for bit."""
    path = smollm2_path if model == "smollm2" else gemma_path
    types = set()
    for name, qtype, rows in _rows_of_every_type(path):
        types.add(qtype.name)
        for pick in (slice(0, 3), slice(len(rows) - 2, len(rows))):
            ours = dequantize_rows(rows, qtype, pick)
            raw = np.ascontiguousarray(rows[pick]).view(np.uint8)
            np.testing.assert_array_equal(bits(ours), bits(gguf_quants.dequantize(raw, qtype)), err_msg=name)
            assert np.isfinite(ours).all(), name
        if qtype in F16_SCALE_AT:
            blocks = np.ascontiguousarray(rows[:2]).reshape(-1, QUANT_TYPES[qtype].block_bytes)
            np.testing.assert_array_equal(bits(dequantize_rows(rows, qtype, slice(0, 2)).reshape(-1)),
                                          bits(reference(blocks, qtype).reshape(-1)), err_msg=name)
    expected = {"smollm2": {"Q4_1", "Q8_0", "F32"}, "gemma": {"Q5_0", "Q4_K", "Q8_0", "Q6_K", "F32"}}
    assert types == expected[model]
