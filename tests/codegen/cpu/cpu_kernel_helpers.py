"""Helpers for the CPU kernel tests: random weights in every layout, the reference and its tolerance,
the bit-for-bit check, and the fast order's cases (random rows and weights, the block_chain reference)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import VARIANTS, host
from kinetic.ir import numerics
from kinetic.ir.quants import dequantize

# byte offsets of each layout's f16 scale fields; every other byte pattern is a valid encoding
F16_FIELDS = {
    Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2),
    Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,),
    Q.IQ4_NL: (0,), Q.IQ4_XS: (0,), Q.MXFP4: (),
}
# byte offsets of E8M0 scales (2^(e - 128) in MXFP4's doubled-value convention)
E8M0_FIELDS = {Q.MXFP4: (0,)}

HOST_VARIANTS = [v for v in VARIANTS if host().supports(v)]
variant_params = [
    pytest.param(v, marks=pytest.mark.skipif(not host().supports(v), reason=f"host CPU lacks {v}")) for v in VARIANTS
]


def random_weight(rng: np.random.Generator, wtype: Q, n: int, k: int) -> np.ndarray:
    """u8 [n, row_bytes]: random quant bytes, f16 scales drawn from N(0, 0.02) (signed, like real mins),
    E8M0 exponents for scales 2^-14 .. 2^-3."""
    layout = LAYOUTS[wtype]
    blocks = rng.integers(0, 256, (n, k // layout.block, layout.block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[wtype]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.02).astype(np.float16)
        blocks[:, :, off : off + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    for off in E8M0_FIELDS.get(wtype, ()):
        blocks[:, :, off] = rng.integers(114, 126, blocks.shape[:2])
    return blocks.reshape(n, -1)


def reference(x: np.ndarray, raw: np.ndarray, wtype: Q) -> tuple[np.ndarray, np.ndarray]:
    """(numerics.matmul's result, the sum of |products| per output, the scale float error is judged by)."""
    values = dequantize(raw, wtype).reshape(raw.shape[0], -1)
    xq = np.abs(numerics.quantized_activations(x, numerics.activation_format(wtype)))
    if wtype in numerics.Q8_1_USERS:  # d*q and the minimum's m*s are summed separately
        mins = numerics.block_minimums(raw, wtype)
        values = values - np.repeat(mins, 32, axis=1)
        magnitude = xq @ np.abs(values).T + np.abs(numerics.q8_1_sums(x)) @ np.abs(mins).T
    else:
        magnitude = xq @ np.abs(values).T
    return numerics.matmul(x, numerics.DequantizedWeight(raw, wtype)), magnitude


def assert_matches_reference(y: np.ndarray, x: np.ndarray, raw: np.ndarray, wtype: Q) -> None:
    ref, magnitude = reference(x, raw, wtype)
    err = np.abs(y.astype(np.float64) - ref)
    bound = 1e-5 * magnitude + 1e-30
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), f"{wtype.name}: at {worst} got {y[worst]}, reference {ref[worst]}"


def assert_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Every output of `got` has the bits of `want`; the message names how many differ and the first."""
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert not len(bad), (f"{what}: {len(bad)} of {got.size} outputs differ, first at {tuple(bad[0])}: "
                          f"{got[tuple(bad[0])]} vs {want[tuple(bad[0])]}")


def chain_case(wtype: Q, n: int, k: int, m: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x f32 [m, k], a random `wtype` weight of n rows), seeded by the case."""
    rng = np.random.default_rng([seed, n, k, m, int(wtype)])
    return rng.standard_normal((m, k)).astype(np.float32), random_weight(rng, wtype, n, k)


def chain_reference(x: np.ndarray, w: np.ndarray, wtype: Q) -> np.ndarray:
    """numerics.matmul in the fast order "block_chain"."""
    return numerics.matmul(x, numerics.DequantizedWeight(w, wtype), order="block_chain")
