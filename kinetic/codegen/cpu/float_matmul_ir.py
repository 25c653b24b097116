"""Renders the float-weight matmul kernels (F16, BF16, F32).

Owns: one kernel per (weight type, K, variant) computing y[r, n] = dot(activation row r, weight row n)
in exactly `kinetic.ir.numerics.float_dot`'s order (ggml_vec_dot_{f16,bf16,f32} as built natively for
an AVX-512 machine with AVX512-BF16). It does not own threads or dispatch, the vector operations
(float_ops_ir.py) or the pass that rounds f32 activation rows to what the dot reads
(activation_ir.render_round).

Per output (r, n), K in chunks of 64 (the same for every row count, tile and thread split):

    F16, F32:  acc[s] = fma(w[64c+16s .. +16], x[..], acc[s])   s = 0..3, 16 lanes each, c in order
               v = (acc0+acc2) + (acc1+acc3); 16 -> 8 -> 4 lanes by halves; (l0+l2) + (l1+l3)
               F16: the K % 64 last as exact f32 products added in f64;
               F32: of the K % 64 last, the 16s and one 8 as rounded products added in order, the
               last K % 8 by scalar fmas (what GCC made of ggml's leftover loop)
    BF16:      acc[v] = dpbf16(acc[v], w[64c+32v .. +32], x[..])   v = 0, 1: per lane the odd element's
               product, then the even one's, each one rounding, subnormal inputs read as zero and
               subnormal results flushed (vdpbf16ps on Zen 4); each acc reduced as above, the two
               added in f64, the K % 64 last as f32 products added in f64

Variants: `avx512bf16` (BF16 by vdpbf16ps itself), `avx512` and `avx2` (the same IR restricted to
that instruction set; BF16 emulated with fma and explicit flushes), `generic` (f16 widened with
integer operations, no x86 assumption). Every variant performs each lane's operations on the same
operands in the same order, so all are bit-identical (tests/codegen/cpu/test_cpu_float_matmul.py).

Loops: column chunks of ~CHUNK_BYTES of weights; in each, full tiles of `rows` activation rows times
`cols` weight rows share every weight and activation load (T*C outputs, each with its own
accumulators), then the leftover rows (all of them at decode) one at a time. A tile whose rows and
columns over all of K exceed L1 runs K in blocks (`blocked_outputs`). Threads split columns.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.float_ops_ir import V16, FloatOps, hsum16
from kinetic.codegen.cpu.llvm_ir import Function

VARIANTS = ("avx512bf16", "avx512", "avx2", "generic")
_NEEDS = {
    "avx512bf16": ("avx512f", "avx512bw", "avx512vl", "avx512bf16", "f16c", "fma"),
    "avx512": ("avx512f", "avx512bw", "avx512vl", "f16c", "fma"),
    "avx2": ("avx2", "f16c", "fma"),
    "generic": (),
}
FLOAT_TYPES = (Q.F16, Q.BF16, Q.F32)
WEIGHT_BYTES = {Q.F16: 2, Q.BF16: 2, Q.F32: 4}
# what the kernel reads per activation value: f16-rounded values as f32, bf16 bit patterns, f32
ACTIVATION_BYTES = {Q.F16: 4, Q.BF16: 2, Q.F32: 4}
CHUNK = 64  # elements per accumulation step (numerics.FLOAT_CHUNK)
CHUNK_BYTES = 128 * 1024  # weight bytes of a column chunk (reused by all row tiles from L2)
TILE_X_BYTES = 8 * 1024  # a row tile's activation bytes per K block (kept in L1 while columns stream by)
L1_BYTES = 32 * 1024  # a tile whose rows and columns over all of K exceed this runs K in blocks

PARAMS = [
    ("ptr", "w"),  # weight [N, K] as stored (f16, bf16 bits, f32)
    ("ptr", "x"),  # activations [M, K], ACTIVATION_BYTES each
    ("ptr", "unused_d"),
    ("ptr", "unused_e"),
    ("ptr", "out"),  # f32 [M, ldo]
    ("i64", "m"),
    ("i64", "n0"),
    ("i64", "n1"),
    ("i64", "ldo"),
]


@dataclass(frozen=True)
class Shape:
    """Register tiles: `rows` x `cols` outputs per weight pass for full row tiles, `single` weight
    rows at a time for a row alone."""

    rows: int
    cols: int
    single: int


# AVX-512 has 32 vector registers: a 3 x 2 tile of F16/F32 outputs holds 24 accumulators (BF16: 12).
# AVX2's 16 registers hold one output's 64 lanes (8 of them) and little else.
SHAPES = {"avx512bf16": Shape(3, 2, 1), "avx512": Shape(3, 2, 1), "avx2": Shape(1, 1, 1), "generic": Shape(3, 2, 1)}


def variants(wtype: Q) -> tuple[str, ...]:
    """The variants a kernel of this type has (vdpbf16ps only matters for BF16)."""
    return VARIANTS if wtype is Q.BF16 else VARIANTS[1:]


def supports(flags, variant: str) -> bool:
    return all(f in flags for f in _NEEDS[variant])


def best_variant(wtype: Q, flags) -> str:
    return next(v for v in variants(wtype) if supports(flags, v))


def kernel_name(wtype: Q, k: int, variant: str) -> str:
    return f"kin_fmm_{wtype.name.lower()}_k{k}_{variant}"


def _attributes(variant: str, host_features: str) -> str:
    """Function attributes restricting code generation to the variant's instruction set."""
    if variant == "avx2":  # the host's features (the attribute replaces them) minus AVX-512
        width = '"prefer-vector-width"="256" "min-legal-vector-width"="256"'
        return f'"target-features"="{host_features},-avx512f" {width}'
    if variant.startswith("avx512"):
        return '"prefer-vector-width"="512" "min-legal-vector-width"="512"'
    return ""


class _Kernel:
    def __init__(self, wtype: Q, k: int, variant: str):
        self.wtype, self.k, self.variant = wtype, k, variant
        self.fn = Function(kernel_name(wtype, k, variant), PARAMS)
        self.ops = FloatOps(self.fn, wtype, variant)
        self.main = k - k % CHUNK
        self.wbytes, self.xbytes = WEIGHT_BYTES[wtype], ACTIVATION_BYTES[wtype]
        self.accs = 2 if wtype is Q.BF16 else 4  # <16 x float> accumulators per output

    def _ptr(self, base: str, index: str, width: int, elem_bytes: int) -> str:
        """Address of row `index` (`width` elements of `elem_bytes`) of the array at base."""
        return self.fn.gep(base, self.fn.v(f"mul i64 {index}, {width * elem_bytes}"))

    def _operands(self, rows: list[str], cols: list[str]):
        """Row pointers of the activations and weights, and the (row, column) pairs of the outputs."""
        xs = [self._ptr("%x", r, self.k, self.xbytes) for r in rows]
        ws = [self._ptr("%w", n, self.k, self.wbytes) for n in cols]
        return xs, ws, [(i, j) for i in range(len(rows)) for j in range(len(cols))]

    def _advance(self, xs: list[str], ws: list[str], pairs: list[tuple[int, int]], start, end,
                 accs: list[str]) -> list[str]:
        """The outputs' accumulators carried over the chunks [start, end): all advance together, so each
        weight load serves every row and each activation load every column."""
        fn, ops = self.fn, self.ops

        def chunk(c: str, accs: list[str]) -> list[str]:
            at = fn.v(f"mul i64 {c}, {CHUNK}")
            new = list(accs)
            if self.wtype is Q.BF16:
                for s in range(2):
                    off = fn.v(f"add i64 {at}, {32 * s}")
                    wp = [fn.gep(w, fn.v(f"mul i64 {off}, 2")) for w in ws]
                    xp = [fn.gep(x, fn.v(f"mul i64 {off}, 2")) for x in xs]
                    if self.variant != "avx512bf16":
                        xp = [ops.bf16_halves(p) for p in xp]
                    for o, (i, j) in enumerate(pairs):
                        new[2 * o + s] = ops.dpbf16(new[2 * o + s], wp[j], xp[i])
                return new
            for s in range(4):
                off = fn.v(f"add i64 {at}, {16 * s}")
                wv = [ops.weights(fn.gep(w, fn.v(f"mul i64 {off}, {self.wbytes}"))) for w in ws]
                xv = [fn.load(V16, fn.gep(x, fn.v(f"mul i64 {off}, 4")), 4) for x in xs]
                for o, (i, j) in enumerate(pairs):
                    new[4 * o + s] = ops.fma(wv[j], xv[i], new[4 * o + s])
            return new

        return fn.loop(start, end, [(V16, a) for a in accs], chunk)

    def _finish(self, xs, ws, pairs, rows: list[str], cols: list[str], finals: list[str]) -> None:
        """Reduce each output's accumulators, add the leftover elements, store."""
        fn = self.fn
        sums = [self._reduce(finals[self.accs * o : self.accs * (o + 1)]) for o in range(len(pairs))]
        sums = self._tail(xs, ws, pairs, sums)
        for (i, j), y in zip(pairs, sums, strict=True):
            at = fn.v(f"add i64 {fn.v(f'mul i64 {rows[i]}, %ldo')}, {cols[j]}")
            fn.store("float", y, fn.gep("%out", at, "float"), 4)

    def outputs(self, rows: list[str], cols: list[str]) -> None:
        """y[r, n] for every r in rows and n in cols, over the whole of K at once."""
        xs, ws, pairs = self._operands(rows, cols)
        zeros = ["zeroinitializer"] * (self.accs * len(pairs))
        finals = self._advance(xs, ws, pairs, 0, self.main // CHUNK, zeros) if self.main else zeros
        self._finish(xs, ws, pairs, rows, cols, finals)

    def blocked_outputs(self, c0: str, c1: str, rows: list[str], width: int, scratch: str, per_block: int) -> None:
        """The row tile against columns [c0, c1) in groups of `width`, K in blocks of `per_block`
        chunks: every group advances over one block before any starts the next, so the tile's
        activations for a block stay in L1 while the groups stream by; between blocks each group's
        accumulators wait in `scratch` (stored and reloaded unchanged: the order is the same)."""
        fn = self.fn
        nchunks = self.main // CHUNK
        nblocks = -(-nchunks // per_block)
        n_acc = self.accs * len(rows) * width

        def sweep(start, end, first: bool, last: bool) -> None:
            def group(n: str, _c: list[str]) -> list[str]:
                cols = self._group(n, c1, width)
                xs, ws, pairs = self._operands(rows, cols)
                g = fn.v(f"udiv i64 {fn.v(f'sub i64 {n}, {c0}')}, {width}")
                slot = fn.gep(scratch, fn.v(f"mul i64 {g}, {n_acc}"), V16)
                ptrs = [fn.gep(slot, i, V16) for i in range(n_acc)]
                accs = ["zeroinitializer"] * n_acc if first else [fn.load(V16, p, 64) for p in ptrs]
                accs = self._advance(xs, ws, pairs, start, end, accs)
                if last:
                    self._finish(xs, ws, pairs, rows, cols, accs)
                else:
                    for a, ptr in zip(accs, ptrs, strict=True):
                        fn.store(V16, a, ptr, 64)
                return []

            fn.loop(c0, c1, [], group, step=width)

        sweep(0, per_block, True, False)
        if nblocks > 2:
            def middle(b: str, _c: list[str]) -> list[str]:
                start = fn.v(f"mul i64 {b}, {per_block}")
                sweep(start, fn.v(f"add i64 {start}, {per_block}"), False, False)
                return []

            fn.loop(1, nblocks - 1, [], middle)
        sweep((nblocks - 1) * per_block, nchunks, False, True)

    def _group(self, n: str, c1: str, width: int) -> list[str]:
        """Columns n .. n + width - 1; a short last group repeats the last column (stored twice, the
        same value)."""
        fn = self.fn
        last = fn.v(f"sub i64 {c1}, 1")
        cols = [n]
        for j in range(1, width):
            nj = fn.v(f"add i64 {n}, {j}")
            cols.append(fn.v(f"select i1 {fn.v(f'icmp slt i64 {nj}, {c1}')}, i64 {nj}, i64 {last}"))
        return cols

    def _reduce(self, accs: list[str]) -> str:
        """float (F32), double (F16, BF16): the accumulators' sum before the leftover elements."""
        fn = self.fn
        if self.wtype is Q.BF16:
            r1, r2 = (fn.v(f"fpext float {hsum16(fn, a)} to double") for a in accs)
            return fn.v(f"fadd double {fn.v(f'fadd double 0.0, {r1}')}, {r2}")
        v = fn.v(f"fadd {V16} {fn.v(f'fadd {V16} {accs[0]}, {accs[2]}')}, {fn.v(f'fadd {V16} {accs[1]}, {accs[3]}')}")
        total = hsum16(fn, v)
        return total if self.wtype is Q.F32 else fn.v(f"fpext float {total} to double")

    def _scalar(self, base: str, i: int, x: bool) -> str:
        """Element i of an activation (x) or weight row as float."""
        fn = self.fn
        if self.wtype is Q.F32 or (x and self.wtype is Q.F16):
            return fn.load("float", fn.gep(base, 4 * i), 4)
        if self.wtype is Q.F16:
            return fn.v(f"fpext half {fn.load('half', fn.gep(base, 2 * i), 2)} to float")
        bits = fn.v(f"zext i16 {fn.load('i16', fn.gep(base, 2 * i), 2)} to i32")
        return fn.v(f"bitcast i32 {fn.v(f'shl i32 {bits}, 16')} to float")

    def _tail(self, xs: list[str], ws: list[str], pairs: list[tuple[int, int]], sums: list[str]) -> list[str]:
        """The K % 64 last elements, in order, and the result as float."""
        fn = self.fn
        rest = self.k - self.main
        unfused = self.main + rest // 16 * 16 + (8 if rest % 16 >= 8 else 0)  # F32: GCC's vector epilogue
        for i in range(self.main, self.k):
            xv = [self._scalar(x, i, True) for x in xs]
            wv = [self._scalar(w, i, False) for w in ws]
            for o, (a, b) in enumerate(pairs):
                if self.wtype is Q.F32 and i >= unfused:
                    sums[o] = fn.v(f"call float @llvm.fma.f32(float {xv[a]}, float {wv[b]}, float {sums[o]})")
                    continue
                p = fn.v(f"fmul float {xv[a]}, {wv[b]}")
                if self.wtype is Q.F32:
                    sums[o] = fn.v(f"fadd float {sums[o]}, {p}")
                else:
                    sums[o] = fn.v(f"fadd double {sums[o]}, {fn.v(f'fpext float {p} to double')}")
        if self.wtype is Q.F32:
            return sums
        return [fn.v(f"fptrunc double {s} to float") for s in sums]

    def render(self, shape: Shape) -> str:
        fn = self.fn
        row_bytes = self.k * self.wbytes
        chunk = max(shape.cols, CHUNK_BYTES // row_bytes // shape.cols * shape.cols)
        per_block = max(1, TILE_X_BYTES // (shape.rows * CHUNK * self.xbytes))
        tile_bytes = self.k * (shape.rows * self.xbytes + shape.cols * self.wbytes)
        blocked = shape.rows > 1 and self.main // CHUNK > per_block and tile_bytes > L1_BYTES
        if blocked:  # each column group's accumulators between K blocks (in the entry block)
            count = chunk // shape.cols * self.accs * shape.rows * shape.cols
            scratch = fn.v(f"alloca {V16}, i64 {count}, align 64")
        tiles = fn.v(f"udiv i64 %m, {shape.rows}")
        first_single = fn.v(f"mul i64 {tiles}, {shape.rows}")

        def columns(c0: str, c1: str, rows: list[str], width: int) -> None:
            def body(n: str, _c: list[str]) -> list[str]:
                self.outputs(rows, self._group(n, c1, width))
                return []

            fn.loop(c0, c1, [], body, step=width)

        def chunk_body(c0: str, _c: list[str]) -> list[str]:
            end = fn.v(f"add i64 {c0}, {chunk}")
            c1 = fn.v(f"select i1 {fn.v(f'icmp slt i64 {end}, %n1')}, i64 {end}, i64 %n1")
            if shape.rows > 1:
                def tile(t: str, _c2: list[str]) -> list[str]:
                    first = fn.v(f"mul i64 {t}, {shape.rows}")
                    rows = [fn.v(f"add i64 {first}, {i}") for i in range(shape.rows)]
                    if blocked:
                        self.blocked_outputs(c0, c1, rows, shape.cols, scratch, per_block)
                    else:
                        columns(c0, c1, rows, shape.cols)
                    return []

                fn.loop(0, tiles, [], tile)
            fn.loop(first_single if shape.rows > 1 else 0, "%m", [],
                    lambda r, _c2: columns(c0, c1, [r], shape.single) or [])
            return []

        fn.loop("%n0", "%n1", [], chunk_body, step=chunk)
        fn.do("ret void")
        return fn.render()


DECLARATIONS = [
    f"declare {V16} @llvm.fma.v16f32({V16}, {V16}, {V16})",
    f"declare {V16} @llvm.fabs.v16f32({V16})",
    "declare float @llvm.fma.f32(float, float, float)",
    f"declare {V16} @llvm.x86.avx512bf16.dpbf16ps.512({V16}, <32 x bfloat>, <32 x bfloat>)",
]


def render_float_matmul(wtype: Q, k: int, variant: str, host_features: str = "",
                        shape: Shape | None = None) -> tuple[str, str]:
    """(module IR text, function name) for one kernel; `host_features` is the JIT's feature string
    (the AVX2 variant's attribute replaces it, so it must carry it)."""
    wtype = Q(wtype)
    if wtype not in FLOAT_TYPES or k <= 0:
        raise ValueError(f"no float matmul kernel for {wtype.name} with K={k}")
    if variant not in variants(wtype):
        raise ValueError(f"{wtype.name} kernels have no variant {variant!r}")
    kernel = _Kernel(wtype, k, variant)
    text = kernel.render(shape or SHAPES[variant])
    attrs = _attributes(variant, host_features)
    declarations = [d for d in DECLARATIONS if "bf16" not in d or variant == "avx512bf16"]
    if attrs:
        head, rest = text.split(" {\n", 1)
        text = f"{head} #0 {{\n{rest}\nattributes #0 = {{ {attrs} }}\n"
    return "\n".join(declarations) + "\n\n" + text, kernel.fn.name
