"""The weight types the CPU's quantized matmul kernels read, one `Layout` row each (`LAYOUTS`).

Owns: which block decoders each supported type has (a block alone, two rows' block-32 blocks at once,
Q4_K's 512-bit super-block) and the offset the kernels subtract through activation sums. A type's own
facts (block size and bytes, activation format, dot order, minimum, codebook) are not typed here but
read from `kinetic.ir.quants.QUANT_TYPES`. The decoders are in blocks_classic.py (Q8_0, Q4_1, Q5_0,
Q5_1, Q4_K, Q5_K, Q6_K) and blocks_newer.py (Q2_K, Q3_K, IQ4_XS, IQ4_NL, Q4_0, MXFP4); what a decoded
block is, in block_types.py. No loops and no accumulation order: that is `matmul_ir`'s (and, for the
reference, `kinetic/ir/quant_dots.py` reads the same layouts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.block_types import Block, Chunk, PairBlock, WideBlock
from kinetic.codegen.cpu.blocks_classic import (
    decode_q4_1,
    decode_q4_k,
    decode_q4_k_wide,
    decode_q5_0,
    decode_q5_1,
    decode_q5_k,
    decode_q6_k,
    decode_q8_0,
    pair_q4,
    pair_q5,
    pair_q8_0,
)
from kinetic.codegen.cpu.blocks_newer import (
    decode_iq4_nl,
    decode_iq4_xs,
    decode_mxfp4,
    decode_q2_k,
    decode_q3_k,
    decode_q4_0_table,
    pair_iq4_nl,
    pair_mxfp4,
    pair_q4_0_table,
)
from kinetic.codegen.cpu.llvm_ir import Function
from kinetic.ir.quants import QUANT_TYPES, QuantType

__all__ = ["LAYOUTS", "Block", "Chunk", "Layout", "PairBlock", "WideBlock"]


@dataclass(frozen=True)
class Layout:
    """How the kernels read one weight type: its block decoders and how they apply its offset. The
    type's own facts (block size and bytes, activation format, dot order, minimum) are QUANT_TYPES'."""

    wtype: Q
    decode: Callable[[Function, str], Block]
    # weights stored with an offset (Q4_0 8, Q5_0 16; Q8_0 128 once its signed bytes are flipped to
    # unsigned): the dot takes them unsigned and subtracts offset * (sum of each 4 activations), an
    # exact integer computed once per activation row, instead of sign tricks per weight block
    offset: int = 0
    # block-32 types: two weight rows' block b decoded together (`PairBlock`), for the decode path
    decode_pair: Callable[[Function, str, str], PairBlock] | None = None
    # Q4_K: the super-block as 512-bit vectors (`WideBlock`), for VNNI's single-row path
    decode_wide: Callable[[Function, str], WideBlock] | None = None
    # the float order a kernel builds ("lanes" or "scalar"), chosen by matmul_ir.render_matmul's
    # `order`; None: the type's ggml order (QUANT_TYPES dot_order)
    dot_order: str | None = None

    @property
    def facts(self) -> QuantType:
        return QUANT_TYPES[self.wtype]

    @property
    def block(self) -> int:
        return self.facts.block

    @property
    def block_bytes(self) -> int:
        return self.facts.block_bytes

    @property
    def activation(self) -> str:
        """The activation format: "q8_0", "q8_1" or "q8_k"."""
        return self.facts.activation

    @property
    def has_min(self) -> bool:
        """The block's decode sets min_scale (and mins for k-quants)."""
        return self.facts.has_min

    @property
    def float_order(self) -> str:
        """How the float side sums (matmul_ir): "lanes" keeps 8 float lanes per row; "scalar" sums the
        block's int32 lanes first and keeps one float accumulator (ggml's repacked gemvs)."""
        return self.dot_order or self.facts.dot_order


LAYOUTS: dict[Q, Layout] = {
    lay.wtype: lay
    for lay in (
        Layout(Q.Q8_0, decode=decode_q8_0, offset=128, decode_pair=pair_q8_0),
        Layout(Q.Q4_0, decode=decode_q4_0_table, offset=128, decode_pair=pair_q4_0_table),
        Layout(Q.Q4_1, decode=decode_q4_1, decode_pair=pair_q4(4)),
        Layout(Q.Q5_0, decode=decode_q5_0, offset=16, decode_pair=pair_q5(2)),
        Layout(Q.Q5_1, decode=decode_q5_1, decode_pair=pair_q5(4)),
        Layout(Q.Q4_K, decode=decode_q4_k, decode_wide=decode_q4_k_wide),
        Layout(Q.Q5_K, decode=decode_q5_k),
        Layout(Q.Q6_K, decode=decode_q6_k),
        Layout(Q.Q2_K, decode=decode_q2_k),
        Layout(Q.Q3_K, decode=decode_q3_k),
        Layout(Q.IQ4_XS, decode=decode_iq4_xs),
        Layout(Q.IQ4_NL, decode=decode_iq4_nl, offset=128, decode_pair=pair_iq4_nl),
        Layout(Q.MXFP4, decode=decode_mxfp4, offset=12, decode_pair=pair_mxfp4),
    )
}
