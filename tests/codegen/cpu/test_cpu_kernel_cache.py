"""The kernel cache: a second JIT on the same folder compiles nothing and gets the same bits."""

from __future__ import annotations

import numpy as np
from cpu_kernel_helpers import random_weight
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.jit import Jit
from kinetic.codegen.cpu.matmul import quantized_matmul
from kinetic.codegen.cpu.matmul_ir import render_matmul


def test_second_start_compiles_nothing(tmp_path):
    """Kernels compiled by one JIT are loaded, not compiled, by a fresh one on the same cache folder."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 96)).astype(np.float32)
    w = random_weight(rng, Q.Q4_1, 9, 96)
    first = Jit(tmp_path)
    y1 = quantized_matmul(x, w, Q.Q4_1, jit=first, tile=2)
    assert first.stats.compiled == 2 and first.stats.loaded == 0  # the quantizer and the matmul
    assert len(list(tmp_path.glob("*.o"))) == 2
    second = Jit(tmp_path)
    y2 = quantized_matmul(x, w, Q.Q4_1, jit=second, tile=2)
    assert second.stats.compiled == 0 and second.stats.loaded == 2
    np.testing.assert_array_equal(y1.view(np.uint32), y2.view(np.uint32))


def test_key_follows_the_ir_text(tmp_path):
    """Different kernels get different keys; the same text gets the same key."""
    jit = Jit(tmp_path)
    a, _ = render_matmul(Q.Q4_1, 96, "generic", 2)
    b, _ = render_matmul(Q.Q4_1, 128, "generic", 2)
    assert jit.key(a) == jit.key(render_matmul(Q.Q4_1, 96, "generic", 2)[0])
    assert jit.key(a) != jit.key(b)
