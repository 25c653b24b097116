"""The Mamba-2 families (granitehybrid, falcon-h1) and Mamba-2's scan: the layout read strictly, the
facts `kinetic info` names, and the scan's arithmetic against a line-by-line transcription of ggml's AVX-512 loop (the
granitehybrid files' logits do not move when the scan rounds otherwise; falcon-h1's do, by 2e-6 with
the multiply and add unfused: test_families.py checks them against llama.cpp's)."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.cpu import recurrent_kernels
from kinetic.errors import KineticError
from kinetic.frontend.families import falcon_h1, granitehybrid
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir import numerics
from kinetic.ir.numerics.floats import F32, fma_f32, libm_f32
from kinetic.ir.numerics.recurrent import ssm_scan_row
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.synthetic import rewrite_gguf, synthetic_path, top_logit_gap


def test_facts_name_the_mixers_the_state_and_the_multipliers():
    """`kinetic info` says which layers are Mamba-2 with their heads, state and conv, and the multipliers."""
    facts = granitehybrid.facts(open_gguf(synthetic_path("granitehybrid")))
    assert facts["mixers"] == "2 Mamba-2 (0, 2), 2 attention (1, 3)"
    assert facts["mamba-2"] == "8 heads x 64, state 64, 1 group, conv 4 taps"
    assert facts["rotary"].startswith("none")
    assert facts["multipliers"] == "embedding x8, residual branches x0.25, attention scores x0.0125, logits / 1.5"


@pytest.mark.parametrize("key, value, message", [
    ("ssm.group_count", 2, "group_count is 2"),  # grouped norms over several groups: not yet
    ("ssm.time_step_rank", 6, "time_step_rank is 6"),  # heads must divide the inner width
])
def test_a_layout_the_scan_cannot_follow_is_refused_by_name(tmp_path, key, value, message):
    """Mamba-2 sizes Kinetic does not handle fail loading with the key's name and what it expects."""
    path = rewrite_gguf(synthetic_path("granitehybrid"), tmp_path / "bad.gguf",
                        set_kv={f"granitehybrid.{key}": value})
    with pytest.raises(KineticError, match=message):
        lower(open_gguf(path))


def _ggml_scan_row(state, x, dt, a, b, c):
    """ggml_compute_forward_ssm_scan_f32's Mamba-2 branch for one token, scalar by scalar, as the AVX-512
    build's machine code runs it: GGML_F32_STEP 64 (4 vectors of 16 lanes), per lane b * x_dt, then
    fma(s, dA, that) (GCC contracts the intrinsics), fma into the lane; GGML_F32_VEC_REDUCE and
    _mm512_reduce_add_ps; then the scalar tail, one fma each for state and sum."""
    n_head, head_dim, d_state = state.shape
    y, new = np.zeros((n_head, head_dim), F32), np.zeros_like(state)
    for h in range(n_head):
        one = np.array([dt[h]], F32)  # ggml_compute_softplus_f32: x > 20 ? x : logf(1 + expf(x))
        sp = dt[h] if dt[h] > 20 else libm_f32("logf", (F32(1) + libm_f32("expf", one)).astype(F32))[0]
        d_a = libm_f32("expf", np.array([F32(sp * a[h])], F32))[0]
        for i in range(head_dim):
            x_dt = F32(x[h, i] * sp)
            lanes = np.zeros((4, 16), F32)
            main = d_state // 64 * 64
            for start in range(0, main, 64):
                for j in range(4):
                    for lane in range(16):
                        k = start + 16 * j + lane
                        s = fma_f32(state[h, i, k], d_a, F32(b[h, k] * x_dt))
                        new[h, i, k] = s
                        lanes[j, lane] = fma_f32(s, c[h, k], lanes[j, lane])
            v = ((lanes[0] + lanes[2]).astype(F32) + (lanes[1] + lanes[3]).astype(F32)).astype(F32)
            v = (v[8:] + v[:8]).astype(F32)
            v = (v[4:] + v[:4]).astype(F32)
            y[h, i] = F32(F32(v[0] + v[2]) + F32(v[1] + v[3]))
            for k in range(main, d_state):
                new[h, i, k] = fma_f32(state[h, i, k], d_a, F32(b[h, k] * x_dt))
                y[h, i] = fma_f32(new[h, i, k], c[h, k], y[h, i])
    return y, new


@pytest.mark.parametrize("d_state", [128, 96, 16])  # whole chunks; a chunk and a tail; a tail alone
def test_the_scan_follows_ggmls_lanes_and_reduction(d_state):
    """ssm_scan_row's new state and y equal, bit for bit, ggml's loop written out scalar by scalar."""
    rng = np.random.default_rng(d_state)
    state = rng.standard_normal((2, 3, d_state)).astype(F32)
    x = rng.standard_normal((2, 3)).astype(F32)
    dt, a = np.array([0.3, 25.0], F32), np.array([-1.5, -0.25], F32)  # 25: softplus passes it through
    b, c = rng.standard_normal((2, d_state)).astype(F32), rng.standard_normal((2, d_state)).astype(F32)
    want_y, want_new = _ggml_scan_row(state, x, dt, a, b, c)
    for row in (ssm_scan_row, recurrent_kernels.ssm_scan_row):  # the reference's numerics, the CPU kernel
        y, new = row(state, x, dt, a, b, c)
        assert np.array_equal(new.view(np.uint32), want_new.view(np.uint32))
        assert np.array_equal(y.view(np.uint32), want_y.view(np.uint32))


def test_falcon_h1_facts_name_both_mixers():
    """`kinetic info` on a falcon-h1 file names the two mixers of every layer and the Mamba-2 sizes."""
    facts = falcon_h1.facts(open_gguf(synthetic_path("falcon-h1-s96")))
    assert facts["mixers"] == "attention and Mamba-2 side by side in each of the 2 layers"
    assert facts["mamba-2"] == "12 heads x 32, state 96, 1 group, conv 3 taps"


def test_the_fused_state_update_is_needed_on_falcon_h1(monkeypatch):
    """With the state update's multiply and add rounded apart (no fma), falcon-h1's logits move off
    llama.cpp's: the contraction read from the build is what makes them agree exactly."""
    gguf = open_gguf(synthetic_path("falcon-h1"))
    engine = Engine(lower(gguf), GGUFWeights(gguf), n_ctx=16, device="reference")
    assert top_logit_gap(engine, "falcon-h1", "p1") == 0.0

    def unfused(state, x, dt, a, b, c):
        sp = numerics.softplus(dt)
        decay = libm_f32("expf", (sp * a).astype(F32))
        x_dt = (x * sp[:, None]).astype(F32)
        new = ((state * decay[:, None, None]).astype(F32) + (b[:, None, :] * x_dt[:, :, None]).astype(F32)).astype(F32)
        return (new.astype(np.float64) * c[:, None, :]).sum(-1).astype(F32), new

    monkeypatch.setattr(numerics, "ssm_scan_row", unfused)
    assert top_logit_gap(engine, "falcon-h1", "p1") > 0.0
