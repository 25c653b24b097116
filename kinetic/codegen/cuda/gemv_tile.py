"""The GEMV / GEMM text shared by every weight format's matmul kernels: which rows a block computes.

Owns: `Tile` (the GEMV's one row per block or the GEMM's tile of rows, and how a kernel's text says
so), `hsum8` (ggml's hsum_float_8 as a butterfly over 8 lanes) and `GEMV_WARPS`. Does not own any
weight format's decoding or order (gemv.py: block-32, Q4_K, Q6_K; gemv_k.py: Q3_K, Q5_K;
gemv_float.py: F16, BF16), nor which format a kernel is rendered for.

A format's kernel is one text: its per-row statements wrapped by `each_row`, so the GEMM computes
every row of its tile with the GEMV's statements, values and order (gemv.py's docstring says why
that makes gemm's rows gemv's bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda.kernel import Kernel, Param, butterfly, indent

GEMV_WARPS = 4  # warps per block of every GEMV kernel


@dataclass(frozen=True)
class Tile:
    """The activation rows a block of a matmul kernel computes, and how its text says so. The GEMV
    (rows None): the one row BY, per-row values plain LANE values. The GEMM: rows BY*rows + r for
    r < rows, those at or past the `n_rows` parameter skipped; per-row values are LANE arrays indexed
    by r. Either way `row` names the row and each_row() wraps the same per-row statements."""

    rows: int | None

    @property
    def kind(self) -> str:
        return "gemv" if self.rows is None else "gemm"

    def name(self, wtype: Q, n_out: int, k: int) -> str:
        tag = "" if self.rows is None else f"_r{self.rows}"
        return f"{self.kind}_{wtype.name.lower()}_n{n_out}_k{k}{tag}"

    def params(self, with_sums: bool, activations: tuple[Param, ...] | None = None) -> tuple[Param, ...]:
        """w, the activation row's buffers (default: Q8 values and scales, plus Q8_1 sums), y[, n_rows]."""
        if activations is None:
            activations = (Param("xq", "const i8*"), Param("xd", "const float*"))
            activations += (Param("xs", "const float*"),) if with_sums else ()
        params = (Param("w", "const u8*"), *activations, Param("y", "float*"))
        return params if self.rows is None else (*params, Param("n_rows", "int"))

    def kernel(self, wtype: Q, n_out: int, k: int, blocks_x: int, with_sums: bool, body: str,
               activations: tuple[Param, ...] | None = None) -> Kernel:
        return Kernel(self.name(wtype, n_out, k), self.kind, 32 * GEMV_WARPS, blocks_x,
                      self.params(with_sums, activations), body, rows_per_block=self.rows or 1)

    def declare(self, ctype: str, name: str) -> str:
        """A LANE value per row: one value, or an array over the tile."""
        return f"  LANE({ctype}, {name if self.rows is None else f'{name}[{self.rows}]'});\n"

    def of(self, name: str) -> str:
        """The current row's value of a per-row LANE value (read it as L(...), shuffle it as is)."""
        return name if self.rows is None else f"{name}[r]"

    @property
    def top(self) -> str:
        return "  const int row = BY;\n" if self.rows is None else ""

    def each_row(self, code: str, spaces: int) -> str:
        """`code` for every row of the tile, `row` its index (uniform: it may shuffle, in uniform code)."""
        if self.rows is None:
            return indent(code, spaces) + "\n"
        loop = (f"#pragma unroll\nfor (int r = 0; r < {self.rows}; ++r) {{\n"
                f"  const int row = BY * {self.rows} + r;\n  if (row < n_rows) {{\n{indent(code, 4)}\n  }}\n}}")
        return indent(loop, spaces) + "\n"


def hsum8(var: str) -> str:
    """((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)) over the lane bits of LANE_ID & 7."""
    return butterfly(var, f"k_add(L({var}), L(other))", (4, 2, 1), 0)
