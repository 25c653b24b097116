"""Embedding lookups from tables of the K-quant and float types, as CUDA C.

Owns: `embed(wtype, width)` for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16 and BF16 tables (Q8_0 is gather.py's
`embed_q8_0`, which this returns for it), and `SUPPORTED`. Does not own: which tables a model has,
the launch (plan.py: table, tokens, out, like Q8_0's) or the meaning (kinetic/ir/reference.py's
`embed`: quants.dequantize_rows, that is gguf.quants' dequantization).

One thread per value of the row tokens[row], each computing its value with gguf's float operations
in gguf's order, so the lookup is the reference bit for bit: per 16 or 32 values a scale
dl = d * sc (f32), then dl * q, minus dmin * m for the types with minimums (Q2_K, Q4_K, Q5_K), each
product and the difference rounded on its own (numpy's elementwise steps); F16 and BF16 values are
converted exactly. Value j of a super-block (block_q*_K of ggml-common.h):

* Q2_K: q = qs[32h + l] >> 2s & 3 for j = 128h + 32s + l; scales[j / 16]: sc low nibble, m high.
* Q3_K: the same crumb, minus 4 unless bit 4h + s of hmask[l] is set; scale j / 16 of 16 (offset 32).
* Q4_K / Q5_K: for j = 32c + l the nibble c & 1 of qs[32(c >> 1) + l] (Q5_K: + 16 * bit c of
  qh[l]); sc, m = get_scale_min_k4(c).
* Q6_K: j = 128h + a: the nibble a >> 6 of ql[64h + (a & 63)], the crumb a >> 5 of qh[32h + (a & 31)]
  as bits 4-5, minus 32; scale (int8) j / 16.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda import gather
from kinetic.codegen.cuda.kernel import Kernel, Param
from kinetic.ir.quants import QUANT_TYPES

# per super-block type: C statements that, given `blk` (the super-block's first byte) and `j`, define
# `value`, the dequantized value j
SUPERBLOCK: dict[Q, str] = {
    Q.Q2_K: """\
const int h = j >> 7, s = (j >> 5) & 3, sub = LDB(u8, blk, j >> 4);
const int q = (LDB(u8, blk, 16 + 32 * h + (j & 31)) >> (2 * s)) & 3;
const float value = k_sub(k_mul(k_mul(k_h2f(LDB(u16, blk, 80)), k_i2f(sub & 15)), k_i2f(q)),
                          k_mul(k_h2f(LDB(u16, blk, 82)), k_i2f(sub >> 4)));""",
    Q.Q3_K: """\
const int h = j >> 7, s = (j >> 5) & 3, l = j & 31;
const int low = (LDB(u8, blk, 32 + 32 * h + l) >> (2 * s)) & 3, high = (LDB(u8, blk, l) >> (4 * h + s)) & 1;
const float dl = k_mul(k_h2f(LDB(u16, blk, 108)), k_i2f(k_scale_q3_k(blk + 96, j >> 4)));
const float value = k_mul(dl, k_i2f(low - 4 * (1 - high)));""",
    Q.Q4_K: """\
const int c = j >> 5, l = j & 31;
const int q = (LDB(u8, blk, 16 + 32 * (c >> 1) + l) >> (4 * (c & 1))) & 15;
const float value = k_sub(k_mul(k_mul(k_h2f(LDB(u16, blk, 0)), k_i2f(k_scale_k4(blk + 4, c))), k_i2f(q)),
                          k_mul(k_h2f(LDB(u16, blk, 2)), k_i2f(k_min_k4(blk + 4, c))));""",
    Q.Q5_K: """\
const int c = j >> 5, l = j & 31;
const int q = ((LDB(u8, blk, 48 + 32 * (c >> 1) + l) >> (4 * (c & 1))) & 15) | (((LDB(u8, blk, 16 + l) >> c) & 1) << 4);
const float value = k_sub(k_mul(k_mul(k_h2f(LDB(u16, blk, 0)), k_i2f(k_scale_k4(blk + 4, c))), k_i2f(q)),
                          k_mul(k_h2f(LDB(u16, blk, 2)), k_i2f(k_min_k4(blk + 4, c))));""",
    Q.Q6_K: """\
const int h = j >> 7, a = j & 127;
const int low = (LDB(u8, blk, 64 * h + (a & 63)) >> (4 * (a >> 6))) & 15;
const int high = (LDB(u8, blk, 128 + 32 * h + (a & 31)) >> (2 * (a >> 5))) & 3;
const float dl = k_mul(k_h2f(LDB(u16, blk, 208)), k_i2f(LDB(i8, blk, 192 + (j >> 4))));
const float value = k_mul(dl, k_i2f((low | (high << 4)) - 32));""",
}
# float tables: the value of element i of the row starting at byte `at`
FLOAT = {Q.F16: "k_h2f(LDB(u16, table, at + 2 * i))", Q.BF16: "k_bits2f((u32)LDB(u16, table, at + 2 * i) << 16)"}
SUPPORTED = frozenset({Q.Q8_0}) | frozenset(SUPERBLOCK) | frozenset(FLOAT)
_PARAMS = (Param("table", "const u8*"), Param("tokens", "const int*"), Param("out", "float*"))


def embed(wtype: Q, width: int) -> Kernel:
    """out f32 [rows, width] = the rows tokens[row] of a table of `wtype` (raw GGUF rows, u8 [n_vocab,
    row_bytes]), dequantized as the reference; tokens i32 [rows]. Ids must lie in the table."""
    if wtype is Q.Q8_0:
        return gather.embed_q8_0(width)
    if wtype not in SUPPORTED:
        raise NotImplementedError(f"{wtype.name} embedding tables (CUDA has lookups for "
                                  f"{', '.join(sorted(t.name for t in SUPPORTED))})")
    row_bytes = QUANT_TYPES[wtype].row_bytes(width)  # refuses a width of partial blocks
    if wtype in FLOAT:
        value = f"const float value = {FLOAT[wtype]};"
    else:
        block_bytes = QUANT_TYPES[wtype].block_bytes
        block = f"const u8* blk = table + at + (long)(i >> 8) * {block_bytes};"
        value = f"const int j = i & 255;\n{block}\n{SUPERBLOCK[wtype]}"
    code = "\n".join("      " + line for line in value.splitlines())
    body = f"""\
  enum {{ W = {width} }};
BODY
  LANES {{
    const int i = BX * {gather.GATHER_THREADS} + TID;
    if (i < W) {{
      const long at = (long)LD(int, tokens, BY) * {row_bytes};
{code}
      ST(float, out, (long)BY * W + i, value);
    }}
  }}
"""
    return Kernel(f"embed_{wtype.name.lower()}_w{width}", "gather", gather.GATHER_THREADS,
                  -(-width // gather.GATHER_THREADS), _PARAMS, body)
