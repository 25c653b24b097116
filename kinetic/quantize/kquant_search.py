"""The scale searches of ggml's K-quant reference quantizers (ggml-quants.c: nearest_int,
make_qx_quants, make_qkx2_quants, make_q3_quants), vectorized over groups and exact in float32.

Owns: given groups of values x [groups, n] (float32), the codes and scale (and minimum) the C code
picks for each group. Every group runs ggml's sequence of float32 operations: each loop over a
group's n values is a Python loop over the n columns whose body works on all groups at once, so
every sum is accumulated in ggml's order (never numpy's pairwise sums), every product and quotient
is rounded to float32 where C rounds it, and nothing is fused (ggml-base is built for baseline
x86-64, without FMA, so C contracts nothing either). Branches become masks.

Does not own block layouts (kquants.py). Written here because no maintained package has K-quant
encoders that match ggml bit for bit (gguf-py has only the 32-value types).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
GROUP_MAX_EPS = F32(1e-15)
_ROUND_MAGIC = F32(12582912.0)  # 1.5 * 2^23: adding it rounds a float32 to an integer in its low bits


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: v + 1.5*2^23 in float32, the integer read from the low mantissa bits."""
    bits = (np.asarray(v, dtype=F32) + _ROUND_MAGIC).view(np.int32)  # a new array: changed in place below
    bits &= 0x007FFFFF
    bits -= 0x00400000
    return bits


def signed_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max |x|, the x it came from) per row, the first on ties as C's strict `>` keeps it."""
    index = np.abs(x).argmax(axis=1)
    value = np.take_along_axis(x, index[:, None], axis=1)[:, 0]
    return np.abs(value), value


def _weighted_sums(xt, levels_t, wt) -> tuple[np.ndarray, np.ndarray]:
    """sum w*x*l and sum w*l*l over each group, in order (make_qx/make_q3's sumlx, suml2); the
    arguments are transposed, [n, groups], so that each step reads contiguous memory."""
    sumlx = np.zeros(xt.shape[1], F32)
    suml2 = np.zeros(xt.shape[1], F32)
    for i in range(xt.shape[0]):
        l = levels_t[i]
        sumlx += wt[i] * xt[i] * l
        suml2 += wt[i] * l * l
    return sumlx, suml2


def make_qx_quants_rmse1(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants(n, nmax, x, L, rmse_type=1, NULL): (codes 0..2*nmax-1 [groups, n], scale [groups])."""
    amax, vmax = signed_max(x)
    zero = amax < GROUP_MAX_EPS
    xt = np.ascontiguousarray(x.T)  # [n, groups]
    with np.errstate(divide="ignore", invalid="ignore"):
        w = xt * xt
        iscale = F32(-nmax) / vmax
        levels = np.clip(nearest_int(iscale * xt), -nmax, nmax - 1).astype(F32)
        sumlx, suml2 = _weighted_sums(xt, levels, w)
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(F32(nmax) + F32(0.1) * F32(step)) / vmax
            trial = np.clip(nearest_int(iscale * xt), -nmax, nmax - 1).astype(F32)
            sumlx, suml2 = _weighted_sums(xt, trial, w)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            levels = np.where(better, trial, levels)
            scale = np.where(better, sumlx / suml2, scale)
            best = np.where(better, scale * sumlx, best)
    codes = (levels.T + F32(nmax)).astype(np.int32)
    codes[zero] = 0
    return codes, np.where(zero, F32(0), scale).astype(F32)


def make_q3_quants_rmse(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_q3_quants(n, nmax, x, L, do_rmse=true): (codes [groups, n], scale [groups]).

    Each try walks the group's values in order, moving one code when that raises sumlx^2/suml2; a
    group whose try changed nothing would change nothing in a later try either, so all groups run
    the same tries."""
    amax, vmax = signed_max(x)
    zero = amax < GROUP_MAX_EPS
    xt = np.ascontiguousarray(x.T)  # [n, groups]
    w = xt * xt
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-nmax) / vmax
        levels = np.clip(nearest_int(iscale * xt), -nmax, nmax - 1).astype(F32)
        sumlx, suml2 = _weighted_sums(xt, levels, w)
        for _ in range(5):
            changed = np.zeros(xt.shape[1], bool)
            for i in range(xt.shape[0]):
                xi, wi, li = xt[i], w[i], levels[i]
                slx = sumlx - wi * xi * li
                sl2 = suml2 - wi * li * li
                new_l = np.clip(nearest_int(xi * sl2 / slx), -nmax, nmax - 1).astype(F32)
                slx = slx + wi * xi * new_l
                sl2 = sl2 + wi * new_l * new_l
                removed_positive = (sumlx - wi * xi * li) > 0  # C tries a new code only when slx > 0
                take = removed_positive & (new_l != li) & (sl2 > 0) & (slx * slx * suml2 > sumlx * sumlx * sl2)
                levels[i] = np.where(take, new_l, li)
                sumlx = np.where(take, slx, sumlx)
                suml2 = np.where(take, sl2, suml2)
                changed |= take
            if not changed.any():
                break
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    codes = (levels.T + F32(nmax)).astype(np.int32)
    codes[zero] = 0
    return codes, np.where(zero, F32(0), scale).astype(F32)


def make_qkx2_quants(x: np.ndarray, weights: np.ndarray, nmax: int, *, rmin: float, rdelta: float,
                     nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants(n, nmax, x, weights, L, &the_min, Laux, rmin, rdelta, nstep, use_mad=false):
    (codes 0..nmax [groups, n], scale [groups], the_min [groups], a value to subtract)."""
    xt, wt = np.ascontiguousarray(x.T), np.ascontiguousarray(weights.T)  # [n, groups]
    vmin, vmax = xt[0].copy(), xt[0].copy()
    sum_w = wt[0].copy()
    sum_x = sum_w * xt[0]
    for i in range(1, xt.shape[0]):
        vmin = np.where(xt[i] < vmin, xt[i], vmin)
        vmax = np.where(xt[i] > vmax, xt[i], vmax)
        sum_w += wt[i]
        sum_x += wt[i] * xt[i]
    vmin = np.where(vmin > 0, F32(0), vmin)
    flat = vmax == vmin
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(nmax) / (vmax - vmin)
        scale = F32(1) / iscale
        codes = np.clip(nearest_int(iscale * (xt - vmin)), 0, nmax).astype(F32)
        best_error = _squared_error(xt, wt, codes, scale, vmin)
        for step in range(nstep + 1):
            # min moves when a step wins, and C's next steps read the moved min
            iscale = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / (vmax - vmin)
            trial = np.clip(nearest_int(iscale * (xt - vmin)), 0, nmax).astype(F32)
            sum_l, sum_l2, sum_xl = (np.zeros(xt.shape[1], F32) for _ in range(3))
            for i in range(xt.shape[0]):
                wl = wt[i] * trial[i]
                sum_l += wl
                sum_l2 += wl * trial[i]
                sum_xl += wl * xt[i]
            d = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / d
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d
            clamp = this_min > 0
            this_min = np.where(clamp, F32(0), this_min)
            this_scale = np.where(clamp, sum_xl / sum_l2, this_scale)
            cur_error = _squared_error(xt, wt, trial, this_scale, this_min)
            better = (d > 0) & (cur_error < best_error) & ~flat
            codes = np.where(better, trial, codes)
            best_error = np.where(better, cur_error, best_error)
            scale = np.where(better, this_scale, scale)
            vmin = np.where(better, this_min, vmin)
    codes = codes.T.astype(np.int32)
    codes[flat] = 0
    return codes, np.where(flat, F32(0), scale).astype(F32), (-vmin).astype(F32)


def _squared_error(xt, wt, codes_t, scale, vmin) -> np.ndarray:
    """sum w * (scale*L + min - x)^2 over each group, in order (arguments [n, groups])."""
    error = np.zeros(xt.shape[1], F32)
    for i in range(xt.shape[0]):
        diff = scale * codes_t[i] + vmin - xt[i]
        error += wt[i] * (diff * diff)
    return error
