"""What a decoded weight block is, as the quantized matmul kernels read it: the vocabulary shared by
the block decoders (blocks_classic.py, blocks_newer.py) and the kernels (matmul_ir.py).

Owns: `Chunk` (32 weights as <32 x i8> with their integer scales), `Block` (a block's chunks, its
float scale and its minimum's terms), `PairBlock` (block b of two weight rows at once) and `WideBlock`
(Q4_K's super-block as 512-bit vectors). Values are LLVM IR value names of the kernel being built.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """32 weights as <32 x i8> (`signed` tells how to read them) and an optional <8 x i32> lane scale;
    `scale16` is the same scale per 16-bit pair (<16 x i16>, pair 2l and 2l+1 of lane l), for the
    variants that multiply it in with `pmaddwd` / `vpdpwssd` (unused values cost nothing: LLVM drops them)."""

    w: str
    signed: bool
    lane_scale: str | None = None
    scale16: str | None = None
    # w holds 4-bit indices into these 16 signed values (IQ4_NL, IQ4_XS, MXFP4); the kernel looks
    # them up (`vpshufb`, or selects in the generic variant), since how depends on the variant
    table: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Block:
    """A decoded block: chunks in element order, the float scale d, and the minimum's terms.

    `min_scale` is m (Q4_1/Q5_1, multiplied by the activation's s) or dmin (k-quants, multiplied by
    sum_j mins[j] * sum of activations in sub-block j, with `mins` a <16 x i32> per 16 elements).
    `offsets` (Q6_K) is a <16 x i32> per 16 elements: lane l of the integer dot loses
    offsets[2l] * xsum16[2l] + offsets[2l+1] * xsum16[2l+1], ggml's -32 applied through the Q8_K sums.
    """

    chunks: list[Chunk]
    d: str
    min_scale: str | None = None
    mins: str | None = None
    offsets: str | None = None
    # the chunks' scale16 are the scales times 2^scale16_shift (Q3_K: a signed byte in a word's high
    # byte); the kernel shifts the exact lane sums back
    scale16_shift: int = 0


@dataclass(frozen=True)
class PairBlock:
    """Block b of two weight rows a and c, as 32 bytes per half: `low` = [elements 0..15 of a |
    elements 0..15 of c], `high` = [elements 16..31 of a | of c]. Against activations
    [x0..15 | x0..15] and [x16..31 | x16..31] a dot8 gives [a's lanes 0-3 | c's lanes 0-3] and
    [a's lanes 4-7 | c's lanes 4-7]: each row's own exact lane sums, two rows per instruction and no
    shuffle to pair the nibbles. `signed`: Q8_0's bytes (flipped to unsigned by the kernel on VNNI);
    the others are unsigned, their offset subtracted through the activation sums (Layout.offset).
    The float scales (f16 d at byte 0, m at byte 2) are read by the kernel."""

    low: str
    high: str
    signed: bool = False
    table: tuple[int, ...] | None = None  # low/high are indices into these values, as Chunk.table
    d: str | None = None  # <2 x float> [d_a, d_c] where the decoder reads the scales (scalar order)
    # <2 x i64>: each row's first 8 bytes (Q5_0: f16 d, then qh), when the kernel converts a group's d at once
    heads: str | None = None


@dataclass(frozen=True)
class WideBlock:
    """Q4_K's super-block for 512-bit VNNI (one row alone): `quants[p]` = <64 x i8> elements
    64p..64p+63 (chunk 2p, the low nibbles of 32 bytes, then chunk 2p+1, their high nibbles),
    `scales[p]` = <32 x i16> sub-block scale 2p in the first 16 words, 2p+1 in the last 16 (so
    `vpdpwssd` on `pmaddubsw`'s pair sums multiplies each by its scale), `mins` = <16 x i16> min j
    at words 2j and 2j+1 (one per Q8_K sum of 16)."""

    quants: list[str]
    scales: list[str]
    mins: str
