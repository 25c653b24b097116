"""Weights decoded once for the reference matmul: `DequantizedWeight`.

Owns: turning a stored weight (raw blocks [n_out, row_bytes], or float values) into what
`dots.matmul` reads for its type: block-32 "lanes" types (Q8_0, Q5_0, Q4_1, Q5_1) as integer quants in
lane groups plus their f16 scales (and Q4_1/Q5_1's minimums); Q4_K / Q6_K as exact integer parts per
super-block; Q2_K, Q3_K, Q5_K, Q4_0, IQ4_NL, IQ4_XS, MXFP4 as `quant_dots.IntegerParts`; every other
type as dequantized float32 values. Q8_0, Q5_0, Q4_1 and Q5_1 also as IntegerParts of whole blocks
for the fast order (`chain_parts`, decoded on first use). Does not own the dot products' order (dots.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants as gguf_quants

from kinetic.ir import quant_dots
from kinetic.ir.numerics.activations import Q8_1_USERS
from kinetic.ir.quants import QUANT_TYPES, dequantize

F32 = np.float32


def block_minimums(raw: np.ndarray, wtype: Q) -> np.ndarray:
    """The per-block minimum m of Q4_1/Q5_1 weights [n_out, row_bytes] -> f32 [n_out, K/32]."""
    blocks = raw.reshape(raw.shape[0], -1, QUANT_TYPES[wtype].block_bytes)
    return blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)


# Block-32 weight types whose ggml dot product (arch/x86/quants.c ggml_vec_dot_{q4_0,q4_1,q5_0,q5_1,
# q8_0}_q8_{0,1}, llamafile/sgemm.cpp tinyBLAS_Q0_AVX) has one shape: per block, the exact integer
# dot of 32 values in 8 lanes of 4 consecutive values, each lane accumulated in float32 by
# fma(d_w*d_x, lane, acc) over the blocks in order, then the 8 lanes summed as
# ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)); Q4_1/Q5_1 add the sum over blocks of m_w*s_x. (IQ4_NL is
# repacked on x86 and follows its gemv instead: quant_dots.SCALAR_ORDER.)
LANE_TYPES = frozenset(t for t, q in QUANT_TYPES.items() if q.block == 32 and q.dot_order == "lanes")


class DequantizedWeight:
    """A weight held dequantized once (f32 [n_out, K]) plus what its matmul needs. Block-32 weights
    hold their integer quants as float32 (`lanes`) and their f16 block scales instead; their
    dequantized `values` are computed only if asked for (the float path)."""

    def __init__(self, raw: np.ndarray, wtype: Q):
        self.type = wtype
        self._raw = raw
        self._values = None
        self._chain_parts = None
        self.minimums = block_minimums(raw, wtype) if wtype in Q8_1_USERS else None
        self.lanes = None
        self.k_weights = None
        self.parts = None  # quant_dots.IntegerParts of Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, MXFP4
        if wtype in LANE_TYPES:
            values = dequantize(raw, wtype).reshape(raw.shape[0], -1)
            n_out, k = values.shape
            # the f16 block scale leads every block-32 layout
            blocks = raw.reshape(n_out, k // 32, -1)
            self.scales = blocks[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(F32)
            if self.minimums is not None:
                values -= np.repeat(self.minimums, 32, axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                q = values.reshape(n_out, k // 32, 32) / self.scales[:, :, None]
            # the integer weight of each value (values are d*q (+ m) of small integers q)
            q = np.rint(np.nan_to_num(q, posinf=0, neginf=0)).astype(F32)
            # laid out [K/4 lane groups, n_out, 4] so that every lane sum is one batched product
            self.lanes = np.ascontiguousarray(q.reshape(n_out, k // 4, 4).transpose(1, 0, 2))
        elif wtype in (Q.Q4_K, Q.Q6_K):
            self._superblock_parts(raw, wtype)
        elif wtype in quant_dots.TYPES:
            self.parts = quant_dots.integer_parts(raw.reshape(raw.shape[0], -1), wtype)
        else:
            self._values = dequantize(raw, wtype).reshape(raw.shape[0], -1)

    def _superblock_parts(self, raw: np.ndarray, wtype: Q) -> None:
        """Integer parts of Q4_K / Q6_K rows (block layouts of ggml-common.h, decoded as gguf does),
        as float64 matrices whose products with Q8_K quants are exact integers."""
        n_out = raw.shape[0]
        blocks = raw.reshape(-1, QUANT_TYPES[wtype].block_bytes)
        nsb = blocks.shape[0] // n_out
        if wtype is Q.Q4_K:
            d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(F32)
            dmin = blocks[:, 2:4].copy().view(np.float16)[:, 0].astype(F32)
            sc, mn = gguf_quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
            qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
            q = (qs & np.uint8(15)).reshape(-1, 8, 32).astype(np.float64)
            # iacc = sum sc*q*qx over the super-block; imin = sum m * (sum of 32 qx)
            self.k_weights = (q * sc[:, :, None]).reshape(n_out, nsb, 256)
            self.k_mins = mn.astype(np.float64).reshape(n_out, nsb, 8)
            self.k_d, self.k_dmin = d.reshape(n_out, nsb), dmin.reshape(n_out, nsb)
        else:
            ql = blocks[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
            ql = (ql & np.uint8(15)).reshape(-1, 2, 128)
            qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
            qh = (qh & np.uint8(3)).reshape(-1, 2, 128)
            qu = (ql | (qh << np.uint8(4))).reshape(-1, 256).astype(np.float64)  # 0..63, offset 32 not applied
            sc = blocks[:, 192:208].copy().view(np.int8).astype(np.float64)  # one per 16 values
            sc_e = np.repeat(sc, 16, axis=1)
            # ggml_vec_dot_q6_K_q8_K: lane l sums, over the 8 chunks c of 32, values 32c+4l..32c+4l+3 of
            # sc*qu*qx, minus 32 * sum of sc*qx over values 32l..32l+31 (the -32 offset through bsums)
            lane_perm = quant_dots.LANE_PERM
            self.k_weights = (sc_e * qu)[:, lane_perm].reshape(n_out, nsb, 256)
            self.k_offsets = (32 * sc_e).reshape(n_out, nsb, 256)
            self.k_perm = lane_perm
            self.k_d = blocks[:, 208:210].copy().view(np.float16)[:, 0].astype(F32).reshape(n_out, nsb)

    @property
    def chain_parts(self) -> quant_dots.IntegerParts:
        """The weight as one lane of whole blocks (quant_dots.CHAIN_TYPES), for the fast order
        "block_chain"; decoded on first use, so a graph in ggml's orders never pays for it."""
        if self._chain_parts is None:
            parts = quant_dots.integer_parts(self._raw.reshape(self._raw.shape[0], -1), self.type)
            # stored block-major, one contiguous [32, n] matrix per block (dots._block_chain_dot's
            # products), seen through the IntegerParts layout [n, nb, 1, 32]
            blocks = np.ascontiguousarray(parts.weights[:, :, 0, :].transpose(1, 2, 0))
            self._chain_parts = replace(parts, weights=blocks.transpose(2, 0, 1)[:, :, None, :])
        return self._chain_parts

    @property
    def values(self) -> np.ndarray:
        if self._values is None:
            self._values = dequantize(self._raw, self.type).reshape(self._raw.shape[0], -1)
        return self._values

