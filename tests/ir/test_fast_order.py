"""The fast numerics mode's matmul order in the reference ("block_chain" on Q8_0, Q5_0, Q4_1, Q5_1;
kinetic/ir/numerics/dots.py): it is its definition, one float32 fma chain of whole-block integer dots
per output (docs/numerics.md), computed here by a slow scalar loop on bytes decoded by hand; a row
gives the same bits alone as among others; the types whose ggml order it already is keep their bits."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.ir import numerics, quant_dots
from kinetic.ir.ops import VerifyError
from kinetic.ir.quants import QUANT_TYPES, dequantize

F32 = np.float32
CHAIN = [Q.Q8_0, Q.Q5_0, Q.Q4_1, Q.Q5_1]
ids = [t.name for t in CHAIN]


F16_AT = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q5_0: (0,), Q.Q4_1: (0, 2), Q.Q5_1: (0, 2), Q.Q6_K: (208,)}


def random_raw(rng: np.random.Generator, wtype: Q, n: int, k: int) -> np.ndarray:
    """u8 [n, row_bytes]: random bytes with N(0, 0.02) f16 scales (and minimums)."""
    block_bytes = QUANT_TYPES[wtype].block_bytes
    blocks = rng.integers(0, 256, (n, k // QUANT_TYPES[wtype].block, block_bytes), dtype=np.uint8)
    for off in F16_AT[wtype]:
        d = (rng.standard_normal(blocks.shape[:2]) * 0.02).astype(np.float16)
        blocks[:, :, off : off + 2] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(n, -1)


def _f16(b: np.ndarray, at: int) -> F32:
    return F32(b[at : at + 2].copy().view(np.float16)[0])


def _block(wtype: Q, b: np.ndarray) -> tuple[list[int], F32, F32 | None]:
    """One block's integer weights (Q8_0 q, Q5_0 q - 16, Q4_0 q - 8, Q4_1 / Q5_1 q), d and m (or None),
    read from its bytes as ggml-common.h lays them out."""
    if wtype is Q.Q8_0:
        return [int(v) for v in b[2:34].view(np.int8)], _f16(b, 0), None
    if wtype is Q.Q4_0:
        return [int(b[2 + j % 16] >> (4 * (j // 16)) & 15) - 8 for j in range(32)], _f16(b, 0), None
    if wtype is Q.Q4_1:
        return [int(b[4 + j % 16] >> (4 * (j // 16)) & 15) for j in range(32)], _f16(b, 0), _f16(b, 2)
    qh_at, qs_at = (2, 6) if wtype is Q.Q5_0 else (4, 8)
    qh = int.from_bytes(bytes(b[qh_at : qh_at + 4]), "little")
    q = [(int(b[qs_at + j % 16] >> (4 * (j // 16)) & 15) | ((qh >> j) & 1) << 4) for j in range(32)]
    if wtype is Q.Q5_0:
        return [v - 16 for v in q], _f16(b, 0), None
    return q, _f16(b, 0), _f16(b, 2)


def slow_block_chain(x: np.ndarray, raw: np.ndarray, wtype: Q) -> np.ndarray:
    """The definition, one output at a time: acc = fma(f32(isum), f32(d_w * d_x), acc) over the
    blocks in order, Q4_1 / Q5_1 accm = fma(m_w, s_x, accm), y = acc or f32(acc + accm)."""
    qx, dx = numerics.quantize_q8_0(x)
    sx = numerics.q8_1_sums(x)
    bytes_per = QUANT_TYPES[wtype].block_bytes
    out = np.empty((x.shape[0], raw.shape[0]), F32)
    for r in range(x.shape[0]):
        for n in range(raw.shape[0]):
            acc, accm, has_min = F32(0), F32(0), False
            for b in range(x.shape[1] // 32):
                q, d, m = _block(wtype, raw[n, b * bytes_per : (b + 1) * bytes_per])
                isum = sum(qi * int(xi) for qi, xi in zip(q, qx[r, b], strict=True))
                acc = numerics.fma_f32(F32(isum), F32(d * dx[r, b]), acc)
                if m is not None:
                    has_min = True
                    accm = numerics.fma_f32(m, sx[r, b], accm)
            out[r, n] = F32(acc + accm) if has_min else acc
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, any NaN matching any NaN (its payload is not part of the order)."""
    nan = np.isnan(a) & np.isnan(b)
    return bool(np.array_equal(np.where(nan, 0, a).view(np.uint32), np.where(nan, 0, b).view(np.uint32)))


def adversarial_raw(rng: np.random.Generator, wtype: Q, n: int, k: int) -> np.ndarray:
    """Blocks at the edges: extreme quants (all bits set or clear), f16 scales and minimums at the
    largest finite, subnormal, zero and negative zero, mixed with random ones."""
    raw = random_raw(rng, wtype, n, k).reshape(n, k // 32, -1)
    raw[0, :, 2 if wtype in (Q.Q8_0, Q.Q5_0, Q.Q4_0) else 4 :] = 0xFF
    raw[1, :, 2 if wtype in (Q.Q8_0, Q.Q5_0, Q.Q4_0) else 4 :] = 0x00
    edges = np.array([65504.0, -65504.0, 6e-8, -6e-8, 0.0, -0.0, 1.0, -2.5], np.float16)
    for off in (0, 2) if wtype in (Q.Q4_1, Q.Q5_1) else (0,):
        picks = edges[rng.integers(0, len(edges), (n - 2, k // 32))]
        raw[2:, :, off : off + 2] = picks.view(np.uint8).reshape(n - 2, k // 32, 2)
    return raw.reshape(n, -1)


def adversarial_x(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """Rows at the edges: zeros, values near float32's smallest normal (products in the subnormal
    range) and near its largest (products that overflow), exact ties of magnitude, plain random."""
    x = rng.standard_normal((rows, k)).astype(F32)
    x[0] = 0
    x[1] *= F32(1e-30)
    x[2] *= F32(1e33)
    x[3] = np.where(np.arange(k) % 2 == 0, F32(1.5), F32(-1.5))
    return x


@pytest.mark.parametrize("k", [32, 96, 352])
@pytest.mark.parametrize("wtype", CHAIN, ids=ids)
def test_block_chain_is_its_definition_on_random_blocks(wtype, k):
    """numerics.matmul(order="block_chain") equals the scalar loop of its definition bit for bit on
    random weights and activations."""
    rng = np.random.default_rng([11, int(wtype), k])
    raw = random_raw(rng, wtype, 5, k)
    x = rng.standard_normal((3, k)).astype(F32)
    got = numerics.matmul(x, numerics.DequantizedWeight(raw, wtype), order="block_chain")
    assert same_bits(got, slow_block_chain(x, raw, wtype))


@pytest.mark.parametrize("wtype", CHAIN, ids=ids)
def test_block_chain_is_its_definition_on_adversarial_blocks(wtype):
    """The same on blocks and rows at the edges of float32 and f16 (saturated quants, huge, subnormal
    and signed-zero scales, rows that underflow or overflow in the products)."""
    rng = np.random.default_rng([12, int(wtype)])
    raw = adversarial_raw(rng, wtype, 9, 128)
    x = adversarial_x(rng, 6, 128)
    with np.errstate(all="ignore"):
        got = numerics.matmul(x, numerics.DequantizedWeight(raw, wtype), order="block_chain")
        want = slow_block_chain(x, raw, wtype)
    assert same_bits(got, want)


def test_q4_0_block_chain_is_its_definition_and_its_ggml_order():
    """For Q4_0 "block_chain" is ggml's (repacked gemv) order: the definition's loop gives the bits the
    default order gives, so the fast mode changes nothing for it."""
    rng = np.random.default_rng(13)
    raw = random_raw(rng, Q.Q4_0, 6, 256)
    x = rng.standard_normal((3, 256)).astype(F32)
    w = numerics.DequantizedWeight(raw, Q.Q4_0)
    chained = numerics.matmul(x, w, order="block_chain")
    assert same_bits(chained, numerics.matmul(x, w)) and same_bits(chained, slow_block_chain(x, raw, Q.Q4_0))


@pytest.mark.parametrize("wtype", CHAIN, ids=ids)
def test_a_row_gives_the_same_bits_alone_as_among_others(wtype):
    """Each of 37 rows (more than one chunk of the reference's rows) gives alone what it gives in the
    batch: the chain is per row."""
    rng = np.random.default_rng([14, int(wtype)])
    raw = random_raw(rng, wtype, 11, 192)
    x = rng.standard_normal((37, 192)).astype(F32)
    w = numerics.DequantizedWeight(raw, wtype)
    batch = numerics.matmul(x, w, order="block_chain")
    for r in (0, 15, 16, 36):
        assert same_bits(numerics.matmul(x[r : r + 1], w, order="block_chain")[0], batch[r])


@pytest.mark.parametrize("wtype", CHAIN, ids=ids)
def test_the_fast_order_is_another_order_than_ggmls(wtype):
    """On these types "block_chain" is not the default (8-lane) order: some output differs in its last
    bits, while both stay the same dot to rounding."""
    rng = np.random.default_rng([15, int(wtype)])
    raw = random_raw(rng, wtype, 64, 1024)
    x = rng.standard_normal((4, 1024)).astype(F32)
    w = numerics.DequantizedWeight(raw, wtype)
    fast, ggml = numerics.matmul(x, w, order="block_chain"), numerics.matmul(x, w)
    assert not same_bits(fast, ggml)
    assert np.allclose(fast, ggml, rtol=1e-4, atol=1e-4 * np.abs(ggml).max())


@pytest.mark.parametrize("wtype", CHAIN, ids=ids)
def test_chain_parts_are_gguf_dequantization(wtype):
    """The whole-block integer weights times d, plus m, are gguf's dequantized values (a wrong nibble,
    fifth bit or offset would be off by whole steps)."""
    raw = random_raw(np.random.default_rng([16, int(wtype)]), wtype, 7, 160)
    parts = quant_dots.integer_parts(raw, wtype)
    want = dequantize(raw, wtype).reshape(7, -1).astype(np.float64)
    assert np.all(np.abs(quant_dots.values(parts) - want) <= 1e-6 * np.abs(want).max(axis=1, keepdims=True))


def test_the_ggml_order_does_not_decode_the_chain_parts():
    """A weight used in ggml's order never builds the fast order's parts (ggml mode costs nothing)."""
    rng = np.random.default_rng(17)
    w = numerics.DequantizedWeight(random_raw(rng, Q.Q8_0, 4, 64), Q.Q8_0)
    numerics.matmul(rng.standard_normal((2, 64)).astype(F32), w)
    assert w._chain_parts is None
    numerics.matmul(rng.standard_normal((2, 64)).astype(F32), w, order="block_chain")
    assert w._chain_parts is not None


@pytest.mark.parametrize("wtype,activations,order", [
    (Q.Q6_K, "q8", "lanes64"), (Q.Q8_0, "f32", "block_chain"), (Q.Q8_0, "q8", "lanes64"),
], ids=["q6_k", "float-path", "foreign-order"])
def test_an_order_the_reference_cannot_follow_is_refused(wtype, activations, order):
    """The reference raises rather than compute another order than the one asked for."""
    rng = np.random.default_rng(18)
    k = 256
    w = numerics.DequantizedWeight(random_raw(rng, wtype, 2, k), wtype)
    with pytest.raises(VerifyError, match=order):
        numerics.matmul(rng.standard_normal((1, k)).astype(F32), w, activations, order)
