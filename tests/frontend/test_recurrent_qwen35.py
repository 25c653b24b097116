"""The qwen35 family (Gated DeltaNet beside gated attention): the layout read strictly, the facts
`kinetic info` names, greedy decoding as llama.cpp's on both synthetic files, the new ops' specs, and
the delta rule's arithmetic against a line-by-line transcription of ggml's gated_delta_net loop."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.cpu import recurrent_kernels
from kinetic.errors import KineticError
from kinetic.frontend.families import qwen35
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.frontend.model_info import read_model_info
from kinetic.ir.numerics.floats import F32, fma_f32, libm_f32
from kinetic.ir.numerics.recurrent import delta_rule_row
from kinetic.ir.ops import DeltaRuleAttrs, HeadColumnsAttrs, Op, VerifyError, spec_of
from kinetic.ir.types import TensorType
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.synthetic import SYNTHETIC, rewrite_gguf, synthetic_path


def test_facts_name_the_mixers_the_state_and_the_prediction_block():
    """`kinetic info` says which layers are Gated DeltaNet with their heads and state, that attention is
    gated, the partial rotary, and that the file has a prediction block (`prediction yes`)."""
    gguf = open_gguf(synthetic_path("qwen35"))
    facts = qwen35.facts(gguf)
    assert facts["mixers"] == "3 Gated DeltaNet (0, 1, 2), 1 gated attention (3)"
    assert facts["gated deltanet"] == "2 key heads, 4 value heads, state 64 x 64 per value head, conv 4 taps"
    assert facts["rotary"].startswith("NeoX halves over 16 of 64 values")
    assert facts["mtp"] == "1 prediction block (blk.4), not in the logits"
    assert read_model_info(synthetic_path("qwen35")).prediction
    assert not read_model_info(SYNTHETIC / "qwen35-s96" / "qwen35-s96.gguf").prediction


@pytest.mark.parametrize("keys, message", [
    ({"ssm.inner_size": 320}, "inner_size is 320"),  # value heads narrower or wider than key heads
    ({"ssm.time_step_rank": 3, "ssm.inner_size": 192}, "time_step_rank is 3"),  # not a multiple of key heads
    ({"rope.dimension_sections": [2, 2, 0, 0]}, "dimension_sections"),  # pair 2 would take position 0
    ({"nextn_predict_layers": 5}, "nextn_predict_layers is 5"),  # no trunk left
    ({"attention.recurrent_layers": [True, True, True]}, "recurrent_layers"),  # a flag for 3 of 5 blocks
])
def test_a_layout_kinetic_cannot_follow_is_refused_by_name(tmp_path, keys, message):
    """Sizes Kinetic does not handle fail loading with the key's name and what it expects."""
    path = rewrite_gguf(synthetic_path("qwen35"), tmp_path / "bad.gguf",
                        set_kv={f"qwen35.{key}": value for key, value in keys.items()})
    with pytest.raises(KineticError, match=message):
        lower(open_gguf(path))


@pytest.mark.parametrize("name", ["qwen35", "qwen35-s96"])
def test_greedy_decoding_gives_llama_cpps_tokens(name):
    """16 greedy tokens after each prompt are llama.cpp's, on the compiled CPU step (the files' top two
    logits are never within rounding distance along these paths)."""
    gguf = open_gguf(SYNTHETIC / name / f"{name}.gguf")
    ref = np.load(SYNTHETIC / name / f"{name}.npz")
    engine = Engine(lower(gguf), GGUFWeights(gguf), n_ctx=64, device="cpu", threads=1)
    try:
        for prompt in ("p0", "p1"):
            seq = engine.new_sequence()
            logits = engine.prefill(seq, ref[f"{prompt}_ids"].tolist())
            tokens = []
            for _ in range(16):
                tokens.append(int(np.argmax(logits)))
                logits = engine.decode(seq, tokens[-1])
            assert tokens == ref[f"{prompt}_greedy_ids"].tolist()
    finally:
        engine.close()


def test_recurrent_layer_flags_choose_the_mixers(tmp_path):
    """`attention.recurrent_layers`, when the file has it, says which layers are Gated DeltaNet (as
    llama.cpp reads it) in place of full_attention_interval: flags that disagree with the tensors fail
    by tensor name, flags that agree load the same layers."""
    same = rewrite_gguf(synthetic_path("qwen35"), tmp_path / "same.gguf",
                        set_kv={"qwen35.attention.recurrent_layers": [True, True, True, False, False],
                                "qwen35.full_attention_interval": 2})
    assert qwen35.facts(open_gguf(same))["mixers"] == "3 Gated DeltaNet (0, 1, 2), 1 gated attention (3)"
    other = rewrite_gguf(synthetic_path("qwen35"), tmp_path / "other.gguf",
                         set_kv={"qwen35.attention.recurrent_layers": [True, False, True, False, False]})
    with pytest.raises(KineticError, match="blk.1.attn_q.weight is missing"):
        lower(open_gguf(other))


def test_the_new_ops_refuse_shapes_that_do_not_fit():
    """head_columns takes whole heads of its stride; delta_rule's state is S x S per value head."""
    f32 = lambda *shape: TensorType("f32", shape)  # noqa: E731
    with pytest.raises(VerifyError, match="head_columns"):
        spec_of(Op.HEAD_COLUMNS).infer([f32(3, 250)], HeadColumnsAttrs(2, 128, 0, 64))
    assert spec_of(Op.HEAD_COLUMNS).infer([f32(3, 256)], HeadColumnsAttrs(2, 128, 64, 64)) == f32(3, 128)
    attrs = DeltaRuleAttrs(n_k_head=1, n_v_head=2, head_dim=8)
    ins = [f32(3, 8), f32(3, 8), f32(3, 16), f32(3, 2), f32(3, 2), f32(2)]
    assert spec_of(Op.DELTA_RULE).infer([*ins, TensorType("rs", (16, 8))], attrs) == f32(3, 16)
    with pytest.raises(VerifyError, match="delta_rule state"):
        spec_of(Op.DELTA_RULE).infer([*ins, TensorType("rs", (8, 8))], attrs)


def _vec_dot(x, y):
    """ggml_vec_dot_f32 as the AVX-512 build runs it, scalar by scalar: 4 x 16 fma lanes over chunks of
    64, GGML_F32_VEC_REDUCE and _mm512_reduce_add_ps, then GCC's tail: 16s and an 8 as rounded
    products added, the last fewer than 8 one fma each."""
    n = len(x)
    main = n // 64 * 64
    lanes = np.zeros((4, 16), F32)
    for i in range(main):
        j, lane = (i % 64) // 16, i % 16
        lanes[j, lane] = fma_f32(x[i], y[i], lanes[j, lane])
    v = ((lanes[0] + lanes[2]).astype(F32) + (lanes[1] + lanes[3]).astype(F32)).astype(F32)
    v = (v[8:] + v[:8]).astype(F32)
    v = (v[4:] + v[:4]).astype(F32)
    total = F32(F32(v[0] + v[2]) + F32(v[1] + v[3]))
    rest = n - main
    unfused = main + rest // 16 * 16 + (8 if rest % 16 >= 8 else 0)
    for i in range(main, n):
        total = F32(total + F32(x[i] * y[i])) if i < unfused else fma_f32(x[i], y[i], total)
    return F32(total)


def _ggml_delta_row(state, q, k, v, decay, beta):
    """ggml_compute_forward_gated_delta_net_one_chunk for one token (one decay per head), written out:
    the state scaled by decay = expf(g) (ggml_vec_scale_f32), delta[j] = (v[j] - dot(M[j], k)) * beta, each
    M[j] += k * delta[j] (ggml_vec_mad_f32: fma lanes), out[j] = dot(M[j], q) * (1/sqrtf(S))."""
    n_head, size, _ = state.shape
    out, new = np.zeros((n_head, size), F32), state.copy()
    for h in range(n_head):
        new[h] = (new[h] * decay[h]).astype(F32)
        delta = [F32(F32(v[h, j] - _vec_dot(new[h, j], k[h])) * beta[h]) for j in range(size)]
        for j in range(size):
            for i in range(size):
                new[h, j, i] = fma_f32(k[h, i], delta[j], new[h, j, i])
        scale = F32(F32(1) / F32(np.sqrt(F32(size))))
        for j in range(size):
            out[h, j] = F32(_vec_dot(new[h, j], q[h]) * scale)
    return out, new


@pytest.mark.parametrize("size", [64, 96, 44])  # one chunk; a chunk and a 32 tail; 32 + 8 rounded, 4 fmas
def test_the_delta_rule_follows_ggmls_loop(size):
    """delta_rule_row's output and new state, and the CPU kernel's, equal ggml's loop written out scalar by
    scalar, bit for bit."""
    rng = np.random.default_rng(size)
    n_head = 2
    state = rng.standard_normal((n_head, size, size)).astype(F32) * F32(0.3)
    q, k = (rng.standard_normal((n_head, size)).astype(F32) * F32(0.2) for _ in range(2))
    v = rng.standard_normal((n_head, size)).astype(F32)
    decay = libm_f32("expf", -np.abs(rng.standard_normal(n_head)).astype(F32))
    beta = rng.random(n_head).astype(F32)
    want_out, want_new = _ggml_delta_row(state, q, k, v, decay, beta)
    for row in (delta_rule_row, recurrent_kernels.delta_rule_row):  # the reference's numerics, the CPU kernel
        out, new = row(state, q, k, v, decay, beta)
        assert np.array_equal(new.view(np.uint32), want_new.view(np.uint32))
        assert np.array_equal(out.view(np.uint32), want_out.view(np.uint32))
