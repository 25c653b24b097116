"""Row gathers and scatters as CUDA C: the embedding lookup, a row selection and the KV cache store.

Owns: `embed_q8_0` (rows of a Q8_0 table by token id, dequantized), `take_rows` (rows of an f32
tensor by index), `columns` (a range of each row) and `kv_store` (f32 rows rounded to f16 and
written into the device KV cache at each row's own slot), each specialized to its width. Does not
own: the cache's layout, capacity or which slots a pass takes (the runtime), nor the meaning
(kinetic/ir/reference.py's `embed`, `take_rows` and `columns`, quants.dequantize for Q8_0).

Everything that changes per pass (token ids, row indices, the cache slot) is read from device
memory, so the same launch replays inside a CUDA graph. None of these kernels rounds more than the
reference: a Q8_0 value is f32(d) * f32(q), a product of an 11-bit and an 8-bit significand and so
exact in float32 (as numpy's is); `take_rows` moves bits; the cache store rounds once to f16 with
`k_f2h` (round to nearest even, overflow to infinity), which is numpy's astype(float16).
"""

from __future__ import annotations

from kinetic.codegen.cuda.kernel import Kernel, Param

GATHER_THREADS = 256  # one thread per value of a row
Q8_0_BLOCK_BYTES = 34  # f16 scale d, then 32 int8 values


def _blocks(width: int) -> int:
    return -(-width // GATHER_THREADS)


def embed_q8_0(width: int) -> Kernel:
    """out f32 [rows, width] = the rows tokens[row] of table, a Q8_0 tensor of `width` values per row
    (u8 [n_vocab, width/32*34]); tokens i32 [rows]. Ids must lie in the table (the runtime checks)."""
    if width % 32:
        raise ValueError(f"Q8_0 rows hold whole blocks of 32 values, not {width}")
    params = (Param("table", "const u8*"), Param("tokens", "const int*"), Param("out", "float*"))
    body = f"""\
  enum {{ W = {width}, ROW_BYTES = {width // 32 * Q8_0_BLOCK_BYTES} }};
BODY
  LANES {{
    const int i = BX * {GATHER_THREADS} + TID;
    if (i < W) {{
      const long blk = (long)LD(int, tokens, BY) * ROW_BYTES + (long)(i / 32) * {Q8_0_BLOCK_BYTES};
      const float d = k_h2f(LDB(u16, table, blk));
      const int q = LDB(i8, table, blk + 2 + i % 32);
      ST(float, out, (long)BY * W + i, k_mul(d, k_i2f(q)));
    }}
  }}
"""
    return Kernel(f"embed_q8_0_w{width}", "gather", GATHER_THREADS, _blocks(width), params, body)


def take_rows(width: int) -> Kernel:
    """out f32 [rows, width] = x[index[row]] for x f32 [n, width] and index i32 [rows]; the values'
    bits are copied as they are (NaN payloads included)."""
    params = (Param("x", "const float*"), Param("index", "const int*"), Param("out", "float*"))
    body = f"""\
  enum {{ W = {width} }};
BODY
  LANES {{
    const int i = BX * {GATHER_THREADS} + TID;
    if (i < W) ST(u32, out, (long)BY * W + i, LD(u32, x, (long)LD(int, index, BY) * W + i));
  }}
"""
    return Kernel(f"take_rows_w{width}", "gather", GATHER_THREADS, _blocks(width), params, body)


def columns(width: int, start: int, count: int) -> Kernel:
    """out f32 [rows, count] = columns start .. start + count - 1 of x f32 [rows, width], the values'
    bits copied as they are."""
    params = (Param("x", "const float*"), Param("out", "float*"))
    body = f"""\
  enum {{ W = {width}, START = {start}, COUNT = {count} }};
BODY
  LANES {{
    const int i = BX * {GATHER_THREADS} + TID;
    if (i < COUNT) ST(u32, out, (long)BY * COUNT + i, LD(u32, x, (long)BY * W + START + i));
  }}
"""
    return Kernel(f"columns_w{width}_s{start}_c{count}", "gather", GATHER_THREADS, _blocks(count), params, body)


def kv_store(width: int, pair: bool = False) -> Kernel:
    """cache row kv_rows[row][0] = f16 bits of x row `row`, for x f32 [rows, width], kv_rows i32
    [rows, 2] (per row: the cache row it is stored at, and the first row of its sequence's cache,
    which attention reads; see common/pass_caches.py) and cache u16 [capacity, width]. The runtime
    keeps every stored row within the capacity. pair: a layer's keys and values in one launch, (k,
    v, kv_rows, kcache, vcache), the same slots."""
    sources = ("k", "v") if pair else ("x",)
    caches = ("kcache", "vcache") if pair else ("cache",)
    params = (*(Param(x, "const float*") for x in sources), Param("kv_rows", "const int*"),
              *(Param(c, "u16*") for c in caches))
    stores = "\n".join(f"      ST(u16, {c}, slot * W + i, k_f2h(LD(float, {x}, (long)BY * W + i)));"
                        for x, c in zip(sources, caches, strict=True))
    body = f"""\
  enum {{ W = {width} }};
BODY
  LANES {{
    const int i = BX * {GATHER_THREADS} + TID;
    if (i < W) {{
      const long slot = (long)LD(int, kv_rows, 2 * BY);
{stores}
    }}
  }}
"""
    name = f"kv_store_{'pair_' if pair else ''}w{width}"
    return Kernel(name, "gather", GATHER_THREADS, _blocks(width), params, body)
