"""The compiled step's mixture-of-experts products: a moe_matmul run by the step's own threads.

Owns the machine code of the tape's OP_MOE_QUANT and OP_MOE_MATMUL (step_ops.run_op calls them):

    OP_MOE_QUANT   each slot's input row (the row itself when the slots share it: gate, up; the
                   slot's own part of the row: down) quantized (or rounded, for float weights) by
                   the generated quantizer, into place g of the grouped rows, g its place in expert
                   order; the shares split the slots
    OP_MOE_MATMUL  for each expert chosen in the pass, the generated matmul kernel on its slice of
                   the stacked weight (weight + expert * expert_bytes) over its group's rows, the
                   shares splitting the output columns: each expert's weights are read once per
                   pass, and a group of one row writes its output in place

Expert order (`expert_order`) is a counting sort of the pass's (row, slot) places by expert, ties in
place order, computed by every share from the chosen experts: no Python per expert, no share waits
for another's table. Each row's slots go through the same generated kernels as a matmul row alone
(their rows are independent of how many share a call), so grouping changes no row's arithmetic: a
row gives the reference's moe_matmul (kinetic/ir/moe_reference.py) bit for bit, alone or in any
pass, on any number of threads. Does not own the kernels (matmul_ir, activation_ir) nor which node
becomes which instructions (moe_ops.py).

The parameters of an instruction are one int64 array (its address in the tape's MOE_PARAMS column);
P_* name its entries.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from kinetic.codegen.cpu.native import call_kernel, i64_ptr

# the entries of an instruction's parameters
(P_KERNEL, P_WEIGHT, P_EXPERT_BYTES, P_K, P_X_WIDTH, P_BLOCK, P_E_ROW, P_N_USED, P_N, P_N_EXPERT,
 P_FLOAT) = range(11)
N_PARAMS = 11


def parameters(*, kernel: int, weight: int = 0, expert_bytes: int = 0, k: int, x_width: int, block: int,
               e_row: int, n_used: int, n: int = 0, n_expert: int, rounded: bool) -> np.ndarray:
    """An instruction's parameters (P_* order): kernel the quantizer or the matmul; k a slot's input
    width; block the values a quantized block holds (1: a float rounding); e_row the extra bytes of
    a row (a rounded row's bytes when `rounded`)."""
    return np.array([kernel, weight, expert_bytes, k, x_width, block, e_row, n_used, n, n_expert, int(rounded)],
                    np.int64)


@njit(cache=True, nogil=True, error_model="numpy")
def _share(n, tid, nt):
    return n * tid // nt, n * (tid + 1) // nt


@njit(cache=True, nogil=True, error_model="numpy")
def _expert(a, ids, place, n_expert):
    """The expert of (row, slot) place `place`, from its exact f32 value (kept in range)."""
    e = np.int64(a[ids + place])
    return min(max(e, 0), n_expert - 1)


@njit(cache=True, nogil=True, error_model="numpy")
def expert_order(a, ids, places, n_expert):
    """(starts, order, dest): expert e's group is order[starts[e]:starts[e + 1]], its places in
    increasing order; dest[place] is the place's position in that order."""
    starts = np.zeros(n_expert + 1, np.int64)
    for p in range(places):
        starts[_expert(a, ids, p, n_expert) + 1] += 1
    for e in range(n_expert):
        starts[e + 1] += starts[e]
    fill = starts[:n_expert].copy()
    order = np.empty(places, np.int64)
    dest = np.empty(places, np.int64)
    for p in range(places):
        e = _expert(a, ids, p, n_expert)
        dest[p] = fill[e]
        order[fill[e]] = p
        fill[e] += 1
    return starts, order, dest


@njit(cache=True, nogil=True, error_model="numpy")
def quantize_slots(params_addr, a, a_addr, x, ids, q, d, e, rows, share, shares):
    """OP_MOE_QUANT: share `share` of the pass's slots into their grouped places."""
    p = carray(i64_ptr(params_addr), (N_PARAMS,))
    k, x_width, block, e_row, n_used = p[P_K], p[P_X_WIDTH], p[P_BLOCK], p[P_E_ROW], p[P_N_USED]
    places = rows * n_used
    _starts, _order, dest = expert_order(a, ids, places, p[P_N_EXPERT])
    own = 0 if x_width == k else k  # slots of a shared row read it whole
    p0, p1 = _share(places, share, shares)
    for place in range(p0, p1):
        g = dest[place]
        src = x + (place // n_used) * x_width + (place % n_used) * own
        call_kernel(p[P_KERNEL], a_addr + 4 * src, q + g * k, d + 4 * g * (k // block), e + g * e_row, k // block)


@njit(cache=True, nogil=True, error_model="numpy")
def matmul_slots(params_addr, a, a_addr, ids, q, d, e, y, scratch, rows, share, shares):
    """OP_MOE_MATMUL: share `share` of the output columns of every chosen expert's group."""
    p = carray(i64_ptr(params_addr), (N_PARAMS,))
    k, block, e_row, n, n_expert = p[P_K], p[P_BLOCK], p[P_E_ROW], p[P_N], p[P_N_EXPERT]
    n0, n1 = _share(n, share, shares)
    if n1 <= n0:
        return
    starts, order, _dest = expert_order(a, ids, rows * p[P_N_USED], n_expert)
    for expert in range(n_expert):
        s, m = starts[expert], starts[expert + 1] - starts[expert]
        if m == 0:
            continue
        w = p[P_WEIGHT] + expert * p[P_EXPERT_BYTES]
        if p[P_FLOAT]:  # a float kernel reads the rounded rows alone
            qa, da, ea = e + s * e_row, 0, 0
        else:
            qa, da, ea = q + s * k, d + 4 * s * (k // block), e + s * e_row
        if m == 1:  # the place's output row directly
            call_kernel(p[P_KERNEL], w, qa, da, ea, a_addr + 4 * (y + order[s] * n), 1, n0, n1, n)
            continue
        call_kernel(p[P_KERNEL], w, qa, da, ea, a_addr + 4 * (scratch + s * n), m, n0, n1, n)
        for i in range(m):  # this share's columns of each group row to its place
            src, dst = scratch + (s + i) * n, y + order[s + i] * n
            a[dst + n0: dst + n1] = a[src + n0: src + n1]
