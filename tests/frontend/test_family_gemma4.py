"""The gemma4 family beyond the shared gates (test_families.py, test_family_devices.py): the features
it refuses by name, the checks of its per-layer hyperparameters and one-value scales, and what
`kinetic info` says about it."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.errors import KineticError, ModelFileError
from kinetic.frontend.families import gemma4
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from tests.synthetic import rewrite_gguf, synthetic_path

SHARED = synthetic_path("gemma4")
MQA = synthetic_path("gemma4").parents[1] / "gemma4-mqa" / "gemma4-mqa.gguf"
SHARED_KV = synthetic_path("gemma4").parents[1] / "gemma4-shared" / "gemma4-shared.gguf"
PLE = synthetic_path("gemma4").parents[1] / "gemma4-ple" / "gemma4-ple.gguf"


def _lowered(tmp_path, **changes):
    return lower(open_gguf(rewrite_gguf(SHARED, tmp_path / "changed.gguf", **changes)))


def test_experts_are_refused_by_name(tmp_path):
    """A file with mixture-of-experts layers (26B-A4B) is refused with what Kinetic lacks."""
    with pytest.raises(KineticError, match="gemma4 mixture-of-experts layers are not supported yet"):
        _lowered(tmp_path, extra={"blk.2.ffn_gate_inp.weight": np.zeros((4, 256), np.float32)})


def test_per_layer_embeddings_need_their_tensors(tmp_path):
    """A file that says it has per-layer embeddings but lacks their tensors is refused naming one."""
    with pytest.raises(KineticError, match=r"tensor per_layer_token_embd\.weight is missing"):
        _lowered(tmp_path, set_kv={"gemma4.embedding_length_per_layer_input": 64})


@pytest.mark.parametrize("kv,message", [
    ({"gemma4.attention.head_count_kv": [2, 2, 1]}, r"head_count_kv is an array of 3 values.*one per layer \(4\)"),
    ({"gemma4.attention.head_count_kv": [2, 0, 2, 1]}, r"head_count_kv\[1\] is 0"),
    ({"gemma4.attention.head_count_kv": [2, 2, 3, 1]}, r"a divisor of attention.head_count \(4\) in layer 2"),
    ({"gemma4.attention.sliding_window_pattern": [1, 1, 1, 0]}, r"sliding_window_pattern\[0\] is 1.*true or false"),
    ({"gemma4.attention.value_length_swa": 32}, r"value_length is 32.*key length \(64\) in layer 0"),
    ({"gemma4.rope.dimension_count_swa": 96}, r"dimension_count_swa is 96.*head size \(64\)"),
    ({"gemma4.attention.shared_kv_layers": 3}, r"shared_kv_layers is 3.*at most 2"),
    ({"gemma4.attention.shared_kv_layers": 1}, r"shared_kv_layers is 1.*layer 3 reads 2"),
])
def test_per_layer_values_are_checked(tmp_path, kv, message):
    """Per-layer arrays have one valid value per layer, KV heads divide the heads in each layer, and
    keys and values have one size: each refusal names the key (and the layer)."""
    with pytest.raises(ModelFileError, match=message):
        _lowered(tmp_path, set_kv=kv)


def test_a_layer_output_scale_that_is_not_a_finite_number_is_refused(tmp_path):
    """layer_output_scale is read at load as a number: a NaN in it is refused naming the tensor."""
    path = rewrite_gguf(SHARED, tmp_path / "nan.gguf", drop={"blk.1.layer_output_scale.weight"},
                        extra={"blk.1.layer_output_scale.weight": np.array([np.nan], np.float32)})
    with pytest.raises(ModelFileError, match=r"blk\.1\.layer_output_scale\.weight.*one finite F32"):
        lower(open_gguf(path))


def test_layer_output_scales_are_the_files_values():
    """Each layer's output is multiplied by its own layer_output_scale value, as read from the file."""
    gguf = open_gguf(SHARED)
    scales = [n.attrs.factor for n in lower(gguf).nodes if n.op.value == "scale"][1:]  # [0]: the embedding's
    assert scales == [float(gguf.array(f"blk.{il}.layer_output_scale.weight")[0]) for il in range(4)]


def test_info_names_the_distinctive_facts():
    """kinetic info names both layer kinds' heads and rotary, the layers whose values are the keys, the
    soft-cap and the window."""
    facts = gemma4.facts(open_gguf(MQA))
    assert facts["attention"] == ("sliding layers: 4 heads x 64, 1 KV head (GQA 4); "
                                  "full layers: 8 heads x 128, 2 KV heads (GQA 4)")
    assert "base 10000" in facts["rotary"] and "frequency factors from rope_freqs (64 values)" in facts["rotary"]
    assert facts["values"] == "the key projection in layers 2, 4"
    assert facts["logit soft-cap"].startswith("15 ")
    assert facts["sliding window"].startswith("4 positions on 3 of 5 layers")


def test_sharing_layers_read_their_source_layers_cache():
    """The KV-sharing layers (the last two of gemma4-shared) attend over the keys, values and cache of
    layers 2 and 3 (llama.cpp's reuse rule), and no cache of their own is made."""
    graph = lower(open_gguf(SHARED_KV))
    attention = [n for n in graph.nodes if n.op.value == "attention"]
    layers = [graph.node(n.inputs[3]).attrs.layer for n in attention]
    assert layers == [0, 1, 2, 3, 2, 3]
    assert [n.inputs[1:] for n in attention[4:]] == [n.inputs[1:] for n in attention[2:4]]
    assert sorted({n.attrs.layer for n in graph.nodes if n.op.value == "state"}) == [0, 1, 2, 3]


def test_each_layer_reads_its_own_per_layer_input():
    """With per-layer embeddings (gemma4-ple, 32 values a layer), layer il's block reads columns
    il * 32 .. il * 32 + 31 of the per-layer inputs, and the wider feed-forward of the sharing layers is
    the file's per-layer feed_forward_length."""
    graph = lower(open_gguf(PLE))
    taken = [(n.attrs.start, n.attrs.count) for n in graph.nodes if n.op.value == "columns"]
    assert taken == [(il * 32, 32) for il in range(6)]
    down = [n for n in graph.nodes if n.op.value == "param" and n.attrs.tensor.endswith("ffn_down.weight")]
    assert [n.type.shape[1] for n in down] == [256, 256, 256, 256, 512, 512]
    facts = gemma4.facts(open_gguf(PLE))
    assert facts["KV sharing"] == "4 reads 2's cache, 5 reads 3's cache" and facts["values"] == "attn_v in every layer"
    assert facts["layer inputs"].startswith("32 values a layer")
