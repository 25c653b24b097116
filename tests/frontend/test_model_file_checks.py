"""Values read from a GGUF file are typed and range-checked on load: each hostile value the hardening
issue found (an internal error before) is a ModelFileError naming its key or tensor.

The files are the synthetic models with one value changed (tests/gguf_variants.py); loading is
lowering (kinetic.frontend.lower), which reads every hyperparameter, checks every tensor's shape and
the tokenizer's arrays. tests/frontend/test_gguf_values_fuzz.py runs hundreds more values end to end.
"""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.errors import ModelFileError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.hparams import KEYS, Spec
from kinetic.frontend.lower import lower
from kinetic.frontend.tokenizer import read_vocab
from tests.gguf_variants import KV, V, variant
from tests.synthetic import synthetic_path

# (case, model, changes, the key or tensor the error names)
ISSUE_CASES = [
    ("head count 0", "llama", {"set_kv": {"llama.attention.head_count": KV(V.UINT32, 0)}},
     "llama.attention.head_count"),
    ("head count not dividing the width", "llama", {"set_kv": {"llama.attention.head_count": KV(V.UINT32, 3)}},
     "llama.attention.head_count_kv"),
    ("head count not dividing the width, one KV head", "llama",
     {"set_kv": {"llama.attention.head_count": KV(V.UINT32, 3), "llama.attention.head_count_kv": KV(V.UINT32, 1)}},
     "llama.attention.head_count"),
    ("embedding length 1", "llama", {"set_kv": {"llama.embedding_length": KV(V.UINT32, 1)}},
     "llama.attention.head_count"),
    ("key length 0", "gemma3", {"set_kv": {"gemma3.attention.key_length": KV(V.UINT32, 0)}},
     "gemma3.attention.key_length"),
    ("block count stored as a string", "llama", {"set_kv": {"llama.block_count": KV(V.STRING, "x")}},
     "llama.block_count"),
    ("negative epsilon", "llama", {"set_kv": {"llama.attention.layer_norm_rms_epsilon": KV(V.FLOAT32, -1.0)}},
     "llama.attention.layer_norm_rms_epsilon"),
    ("NaN rotary base", "llama", {"set_kv": {"llama.rope.freq_base": KV(V.FLOAT32, float("nan"))}},
     "llama.rope.freq_base"),
    ("odd rotary dimensions", "llama", {"set_kv": {"llama.rope.dimension_count": KV(V.UINT32, 63)}},
     "llama.rope.dimension_count"),
    ("per-layer head counts", "llama", {"set_kv": {"llama.attention.head_count_kv": KV(V.ARRAY, [2, 2, 2], V.UINT32)}},
     "llama.attention.head_count_kv"),
    ("swapped feed-forward shape", "llama", {"shapes": {"blk.0.ffn_gate.weight": (512, 256)}},
     "tensor blk.0.ffn_gate.weight"),
    ("swapped embedding shape", "llama", {"shapes": {"token_embd.weight": (2048, 256)}}, "tensor token_embd.weight"),
    ("q projection of the wrong size", "gemma3", {"shapes": {"blk.0.attn_q.weight": (256, 128)}},
     "tensor blk.0.attn_q.weight"),
    ("vocab_size disagreeing with the embedding", "llama", {"set_kv": {"llama.vocab_size": KV(V.UINT32, 7)}},
     "tensor token_embd.weight"),
    ("token types shorter than the vocabulary", "llama",
     {"set_kv": {"tokenizer.ggml.token_type": KV(V.ARRAY, [1] * 10, V.INT32)}}, "tokenizer.ggml.token_type"),
    ("scores shorter than the vocabulary", "gemma3",
     {"set_kv": {"tokenizer.ggml.scores": KV(V.ARRAY, [0.0] * 10, V.FLOAT32)}}, "tokenizer.ggml.scores"),
    ("tokens stored as integers", "llama",
     {"set_kv": {"tokenizer.ggml.tokens": KV(V.ARRAY, list(range(2048)), V.INT32)}}, "tokenizer.ggml.tokens"),
    ("more tokens than embedding rows", "llama",
     {"set_kv": {"tokenizer.ggml.tokens": KV(V.ARRAY, [f"t{i}" for i in range(3000)], V.STRING)},
      "drop_kv": ("tokenizer.ggml.token_type",)}, "tokenizer.ggml.tokens"),
    ("chat template stored as a number", "llama", {"set_kv": {"tokenizer.chat_template": KV(V.UINT32, 1)}},
     "tokenizer.chat_template"),
]


@pytest.mark.parametrize(("case", "arch", "changes", "key"), ISSUE_CASES, ids=[c[0] for c in ISSUE_CASES])
def test_hostile_value_is_named_on_load(tmp_path, case, arch, changes, key):
    """Loading a file with this value fails with a ModelFileError that names the key or tensor."""
    path = variant(synthetic_path(arch), tmp_path / f"{arch}.gguf", **changes)
    with pytest.raises(ModelFileError) as info:
        lower(open_gguf(path))
    assert info.value.key == key
    assert info.value.message.startswith(f"{arch}.gguf: {key} ") and "expected" in info.value.message


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_rewritten_file_still_loads(tmp_path, arch):
    """The variant writer alone changes nothing: an unchanged copy lowers (so each case tests its value)."""
    assert lower(open_gguf(variant(synthetic_path(arch), tmp_path / f"{arch}.gguf"))).nodes


def test_every_key_has_a_sane_range():
    """Every hyperparameter spec accepts a typical value and refuses the wrong type, NaN and its bounds' outside."""
    typical = {int: 4, float: 1e-5, str: "none", bool: True}
    for name, spec in KEYS.items():
        assert spec.accepts(typical[spec.kind]), name
        assert not spec.accepts(False if spec.kind is str else "true") and not spec.accepts([4]), name
        assert spec.kind is bool or not spec.accepts(True), name
        if spec.kind not in (str, bool):
            assert not spec.accepts(float("nan")) and not spec.accepts(spec.high * 2) and not spec.accepts(-1), name


def test_int_keys_refuse_floats_and_float_keys_take_ints():
    """An integer key refuses 4.0 (llama.cpp reads it as the wrong type); a float key reads 10000 as 10000.0."""
    assert not Spec(int, 1, 8).accepts(4.0)
    assert Spec(float, 0.0, 1e30, positive=True).accepts(10000)


def test_read_vocab_refuses_a_short_array_by_name():
    """The tokenizer, built on first use, refuses per-token arrays of the wrong length by key too."""
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a"],
            "tokenizer.ggml.scores": np.zeros(3, np.float32)}
    with pytest.raises(ModelFileError, match=r"tokenizer\.ggml\.scores has 3 values; expected one per token \(4\)"):
        read_vocab(meta)
