"""The lfm2 family's descriptor and the short_conv op: the file's layout read strictly, the facts
`kinetic info` names, the op's spec, and the tap order that makes the logits llama.cpp's (the logits
gates themselves run in test_families.py on every lfm2 file)."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.errors import KineticError
from kinetic.frontend.families import lfm2
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.numerics.floats import fma_f32
from kinetic.ir.numerics.recurrent import short_conv_row
from kinetic.ir.ops import NoAttrs, Op, VerifyError, infer_type
from kinetic.ir.types import TensorType, f32
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.synthetic import rewrite_gguf, synthetic_path, top_logit_gap


def test_facts_name_the_mixers_the_kernel_and_the_window():
    """`kinetic info` says which layers are short convolutions, their taps and state, and the window."""
    facts = lfm2.facts(open_gguf(synthetic_path("lfm2-k20")))
    assert facts["mixers"] == "2 short convolution (1, 2), 1 attention (0)"
    assert facts["short conv"] == "20 taps, a per-sequence state of the last 19 rows"
    assert facts["attention"].endswith("sliding window 5")


@pytest.mark.parametrize("value, message", [
    ([0, 2, 0], r"head_count_kv is \[0, 2, 0\]"),  # one value short of the 4 layers
    ([0, 3, 0, 2], r"head_count_kv\[1\] is 3"),  # not a divisor of the 4 heads
])
def test_a_bad_layer_layout_is_refused_by_name(tmp_path, value, message):
    """head_count_kv must give each layer 0 (a short convolution) or a divisor of the heads."""
    path = rewrite_gguf(synthetic_path("lfm2"), tmp_path / "bad.gguf", set_kv={"lfm2.attention.head_count_kv": value})
    with pytest.raises(KineticError, match=message):
        lower(open_gguf(path))


def test_short_conv_spec_refuses_a_state_that_is_not_kernel_minus_one_rows():
    """short_conv's state handle holds exactly kernel - 1 past rows of every channel."""
    x, w = f32("T", 256), f32(256, 3)
    assert infer_type(Op.SHORT_CONV, [x, w, TensorType("rs", (2, 256))], NoAttrs()) == x
    with pytest.raises(VerifyError, match=r"rs\[2,256\]"):
        infer_type(Op.SHORT_CONV, [x, w, TensorType("rs", (3, 256))], NoAttrs())


@pytest.mark.parametrize("taps, fused", [(3, 3), (8, 0), (11, 3), (20, 4), (40, 0)])  # 40 = 16 + 16 + 8
def test_short_conv_rounds_products_in_chunks_then_fuses_the_tail(taps, fused):
    """A row's output follows llama.cpp's compiled tap loop: chunks of 16, then 8, of products rounded
    before each add, then one fma per remaining tap (checked one channel at a time here)."""
    rng = np.random.default_rng(taps)
    window = rng.standard_normal((taps, 64)).astype(np.float32)
    kernel = rng.standard_normal((64, taps)).astype(np.float32)
    want = np.zeros(64, np.float32)
    for t in range(taps):
        if t < taps - fused:
            want = (want + window[t] * kernel[:, t]).astype(np.float32)
        else:
            want = fma_f32(window[t], kernel[:, t], want)
    assert np.array_equal(short_conv_row(window, kernel).view(np.uint32), want.view(np.uint32))


def test_llama_cpps_tap_order_is_needed_on_the_20_tap_file(monkeypatch):
    """With every tap fused (or none), the 20-tap file's logits move off llama.cpp's: the chunk rule
    is what makes them agree exactly."""
    gguf = open_gguf(synthetic_path("lfm2-k20"))
    engine = Engine(lower(gguf), GGUFWeights(gguf), n_ctx=16, device="reference")
    assert top_logit_gap(engine, "lfm2-k20", "p0") == 0.0

    def all_fused(window, kernel):
        acc = np.zeros(window.shape[1], np.float32)
        for t in range(window.shape[0]):
            acc = fma_f32(window[t], kernel[:, t], acc)
        return acc

    from kinetic.ir import numerics
    monkeypatch.setattr(numerics, "short_conv_row", all_fused)
    assert top_logit_gap(engine, "lfm2-k20", "p0") > 0.0


def test_fit_counts_the_cache_of_the_attention_layers_only():
    """`kinetic fit` reads a hybrid file's per-layer KV heads: its cache per token is the attention
    layers' (2 of them, 2 KV heads of 64, keys and values in f16), the convolutions hold none."""
    from kinetic.fit import read_shape

    assert read_shape(synthetic_path("lfm2")).kv_per_token == 2 * 2 * 64 * 2 * 2
