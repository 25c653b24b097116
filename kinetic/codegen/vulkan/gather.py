"""Row moves: the KV cache store (f32 rows rounded to f16 into cache rows), the embedding lookup of
Q8_0 rows, take_rows and columns (a range of each row); one invocation per output element (or f16
pair).

Owns: these kernels, and the lookup frame embed.py's tables share (`render_lookup`). Does not own which
rows go where (the runtime's slots, the pass's token ids and output rows). Every kernel here is exact on
every device: integer moves, the f16 rounding done by integer operations (builders.f32_to_f16_bits, half
to even), and one f32 product (d * q).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kinetic.codegen.vulkan import builders
from kinetic.codegen.vulkan.device import Kernel, Unsupported
from kinetic.codegen.vulkan.elementwise import flat_index
from kinetic.codegen.vulkan.frame import frame
from kinetic.codegen.vulkan.spirv import Function, Op

WORKGROUP = 64


def render_kv_store(width: int) -> Kernel:
    """Rows of f32 [rows, width] written as f16 (round to nearest even) into cache rows: bindings
    x f32 [rows, width], slots u32 [rows] (the cache row of each input row), cache u32 (f16 pairs,
    [cache_rows, width/2] words). Push constant: rows. One invocation per pair of values."""
    if width % 2:
        raise Unsupported(f"kv store: row width {width} is odd (the cache packs f16 pairs into words)")
    pairs = width // 2
    f = frame(("x", "f32"), ("slots", "u32"), ("cache", "u32"), workgroup=WORKGROUP)
    m, fn, (x, slots, cache) = f.m, f.fn, f.buffers
    index = flat_index(fn, WORKGROUP)
    with each_of_rows(fn, f.params, index, pairs) as (row, p):
        src = fn.iadd(fn.imul(row, m.u(width)), fn.imul(p, m.u(2)))
        lo = builders.f32_to_f16_bits(fn, fn.buf_load(x, src))
        hi = builders.f32_to_f16_bits(fn, fn.buf_load(x, fn.iadd(src, m.u(1))))
        dst = fn.iadd(fn.imul(fn.buf_load(slots, row), m.u(pairs)), p)
        fn.buf_store(cache, dst, fn.bor(lo, fn.shl(hi, m.u(16))))
    return f.kernel(f"kv_store_{width}")


def render_embed_q8_0(n_embd: int) -> Kernel:
    """Rows of a Q8_0 table dequantized (d * q in f32): bindings table u32 (raw GGUF bytes, rows of
    n_embd/32 blocks of 34 bytes), ids u32 [rows], out f32 [rows, n_embd]. Push constants: rows,
    first and count: the table holds ids first .. first+count-1 (a table split across bindings is
    one dispatch per part); rows whose id is elsewhere are left alone."""
    if n_embd % 32:
        raise Unsupported(f"embedding width {n_embd} is not a multiple of Q8_0's 32")
    row_bytes = n_embd // 32 * 34

    def value(fn: Function, table: int, mine: int, i: int) -> int:
        m = fn.m
        block = fn.iadd(fn.imul(mine, m.u(row_bytes)), fn.imul(fn.shr(i, m.u(5)), m.u(34)))
        d = builders.f16_bits_to_f32(fn, builders.load_u16_at(fn, table, block))
        at = fn.iadd(block, fn.iadd(m.u(2), fn.band(i, m.u(31))))
        word = fn.buf_load(table, fn.shr(at, m.u(2)))
        qv = fn.bits_s(fn.bitcast(word, m.i32), None, 8, offset_id=fn.shl(fn.band(at, m.u(3)), m.u(3)))
        return fn.fmul(d, fn.convert(qv, m.f32))

    return render_lookup(f"embed_q8_0_{n_embd}", n_embd, value)


def render_lookup(name: str, n_embd: int, value: Callable[[Function, int, int, int], int]) -> Kernel:
    """An embedding lookup (render_embed_q8_0's bindings and push constants; embed.py's tables too):
    out[r, i] = value(fn, table, mine, i), mine the row's id less `first`, for the rows whose id the
    table holds."""
    f = frame(("table", "u32"), ("ids", "u32"), ("out", "f32"), workgroup=WORKGROUP, push=3)
    m, fn, (table, ids, out) = f.m, f.fn, f.buffers
    index = flat_index(fn, WORKGROUP)
    in_range = fn.icmp(Op.ULessThan, index, fn.imul(f.push(0), m.u(n_embd)))
    row = fn.udiv(index, m.u(n_embd))
    mine = fn.isub(fn.buf_load(ids, fn.select(in_range, row, m.u(0))), f.push(1))  # wraps if below
    with fn.if_(fn.logical_and(in_range, fn.icmp(Op.ULessThan, mine, f.push(2)))):
        fn.buf_store(out, index, value(fn, table, mine, fn.umod(index, m.u(n_embd))))
    return f.kernel(name)


@contextmanager
def each_of_rows(fn: Function, params: int, index: int, width: int) -> Iterator[tuple[int, int]]:
    """In the block: invocation `index` below rows (push constant 0) x width, as (row, column)."""
    m = fn.m
    with fn.if_(fn.icmp(Op.ULessThan, index, fn.imul(fn.push(params, 0, m.u32), m.u(width)))):
        yield fn.udiv(index, m.u(width)), fn.umod(index, m.u(width))


def render_take_rows(width: int) -> Kernel:
    """out[r, :] = x[index[r], :]: bindings x f32 [*, width], index u32 [rows], out f32 [rows, width].
    Push constant: rows."""
    f = frame(("x", "f32"), ("index", "u32"), ("out", "f32"), workgroup=WORKGROUP)
    m, fn, (x, index, out) = f.m, f.fn, f.buffers
    i = flat_index(fn, WORKGROUP)
    with each_of_rows(fn, f.params, i, width) as (row, col):
        src = fn.iadd(fn.imul(fn.buf_load(index, row), m.u(width)), col)
        fn.buf_store(out, i, fn.buf_load(x, src))
    return f.kernel(f"take_rows_{width}")


def render_columns(width: int, start: int, count: int) -> Kernel:
    """out[r, c] = x[r, start + c] for c < count: bindings x f32 [rows, width], out f32 [rows, count].
    Push constant: rows."""
    f = frame(("x", "f32"), ("out", "f32"), workgroup=WORKGROUP)
    m, fn, (x, out) = f.m, f.fn, f.buffers
    i = flat_index(fn, WORKGROUP)
    with each_of_rows(fn, f.params, i, count) as (row, col):
        src = fn.iadd(fn.imul(row, m.u(width)), fn.iadd(m.u(start), col))
        fn.buf_store(out, i, fn.buf_load(x, src))
    return f.kernel(f"columns_{width}_{start}_{count}")


def render_place_columns(width: int, total: int) -> Kernel:
    """out[r, first + c] = x[r, c] for c < width: a part of a matmul whose weight was split across
    bindings put in its place. Bindings x f32 [rows, width], out f32 [rows, total]. Push constants:
    rows, first."""
    f = frame(("x", "f32"), ("out", "f32"), workgroup=WORKGROUP, push=2)
    m, fn, (x, out) = f.m, f.fn, f.buffers
    i = flat_index(fn, WORKGROUP)
    with each_of_rows(fn, f.params, i, width) as (row, col):
        dst = fn.iadd(fn.imul(row, m.u(total)), fn.iadd(f.push(1), col))
        fn.buf_store(out, dst, fn.buf_load(x, i))
    return f.kernel(f"place_columns_{width}_{total}")
