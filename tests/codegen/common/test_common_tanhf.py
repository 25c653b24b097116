"""glibc's tanhf as the devices compute it (codegen/common/tanhf.py and its renderings) against the C
library's own tanhf, the function the reference's softcap calls: values drawn from every branch of
tanhf and of the expm1f it calls (benchmarks/tanhf_exhaustive.py runs every input that reaches
expm1f, or all 2^32, through the numpy steps)."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.common import tanhf
from kinetic.codegen.common.libm import libm_map
from kinetic.ir.numerics import _LIBM

pytestmark = pytest.mark.skipif(_LIBM is None, reason="no C library tanhf to compare with")


def branch_values(n: int = 1 << 16) -> np.ndarray:
    """f32 [n * 8 + edges]: uniform bit patterns, and values dense in each branch: tanhf's |x| < 2^-55,
    [2^-55, 1) (expm1f of -2|x|: its k = 0, -1 and -2/-3 forms, its tiny form), [1, 22) (k from 1 to
    31), [22, inf), and the thresholds themselves with their neighbours."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ranges = [(-60, -56), (-55, -26), (-26, -2), (-2, 0), (0, 2), (2, 4.5), (4.5, 5)]
    logs = [rng.uniform(lo, hi, n) for lo, hi in ranges]
    mags = np.concatenate([np.exp2(v) for v in logs]).astype(np.float32)
    signs = rng.choice(np.array([-1, 1], np.float32), mags.size)
    edges = np.array([tanhf._f(b) for b in (tanhf.TANH_ONE, tanhf.TANH_TINY, tanhf.TANH_LARGE,
                                             tanhf.EXPM1_REDUCE // 2, tanhf.EXPM1_ONE_STEP)], np.float32)
    near = np.concatenate([np.nextafter(edges, 0), edges, np.nextafter(edges, np.float32(np.inf))])
    edges = np.concatenate([near, -near, np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, 1e-45])])
    return np.concatenate([bits, (mags * signs).astype(np.float32), edges]).astype(np.float32)


def differing(got: np.ndarray, x: np.ndarray) -> str:
    want = libm_map("tanhf", x)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    if not bad.size:
        return ""
    return f"{bad.size} differ, e.g. tanhf({x[bad[0]]!r}) = {got[bad[0]]!r}, not {want[bad[0]]!r}"


def test_steps_are_the_c_library_tanhf():
    """tanhf_steps, the float steps the device kernels follow, gives the C library's bits."""
    x = branch_values()
    msg = differing(tanhf.tanhf_steps(x), x)
    assert not msg, msg


def test_cuda_emulation_softcap_is_the_c_library_tanhf(tmp_path):
    """The CUDA soft-cap kernel with cap 1 (tanhf itself), run on the host emulation, gives the C
    library's tanhf bits for values from every branch."""
    from kinetic.codegen.cuda import emulator, pointwise

    if emulator.unavailable_reason():
        pytest.skip(emulator.unavailable_reason())
    width = 4096
    x = branch_values()
    x = np.concatenate([x, np.zeros(-x.size % width, np.float32)]).reshape(-1, width)
    kernel = pointwise.elementwise("softcap", width, 1.0)
    out = np.zeros_like(x)
    emulator.HostProgram([kernel], cache_dir=tmp_path).launch(kernel.name, x.shape[0], x, out)
    msg = differing(out.reshape(-1), x.reshape(-1))
    assert not msg, msg
