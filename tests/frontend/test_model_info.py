"""`kinetic info`'s facts: right on both real models, and on synthetic files with unusual headers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFWriter

from kinetic.frontend import model_info
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.model_info import describe, format_text, read_model_info, to_json


def weights(info) -> dict[str, int]:
    return {g.type: g.tensors for g in info.weights}


def test_smollm2_facts(smollm2_path):
    """SmolLM2: llama, 30 layers of width 576, Q4_1 x210, F32 x61, Q8_0 x1, gpt2 tokenizer (smollm)."""
    info = read_model_info(smollm2_path)
    assert (info.architecture, info.supported, info.layers, info.width) == ("llama", True, 30, 576)
    assert weights(info) == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert info.context_length == 8192 and not info.prediction
    assert info.parameters == 134_515_008  # the seed's bench report gives the same count
    tok = info.tokenizer
    assert (tok.model, tok.pre, tok.tokens, tok.supported) == ("gpt2", "smollm", 49152, True)
    assert not tok.add_bos and tok.eos_token == "<|im_end|>"
    assert info.chat_template_bytes == 368


def test_gemma_facts(gemma_path):
    """Gemma 3: gemma3, 18 layers of width 640, its five weight types, llama tokenizer, no template."""
    info = read_model_info(gemma_path)
    assert (info.architecture, info.supported, info.layers, info.width) == ("gemma3", True, 18, 640)
    assert weights(info) == {"Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9, "F32": 109}
    assert [g.type for g in info.weights] == ["Q8_0", "Q5_0", "Q4_K", "Q6_K", "F32"]  # largest first
    tok = info.tokenizer
    assert (tok.model, tok.tokens, tok.bos_token, tok.add_bos, tok.eos_token) == (
        "llama", 262144, "<bos>", True, "<eos>")
    assert info.chat_template_bytes is None and info.size_bytes == 253_113_024


def test_text_layout_follows_the_seed(gemma_path):
    """File line, then two-space-indented labels in a 15-wide column; weights continue aligned."""
    lines = format_text(read_model_info(gemma_path)).splitlines()
    assert lines[0] == "gemma-3-270m-q4_k_m.gguf"
    assert lines[2] == "  architecture   gemma3"
    assert lines[3] == "  size           0.24 GiB, 268.10 M parameters"
    assert lines[5] == "  layers         18, width 640"
    assert lines[7] == "  weights        Q8_0     10 tensors     171.5 MiB"
    assert lines[8] == "                 Q5_0     81 tensors      41.6 MiB"
    assert lines[-2] == "  tokenizer      llama (default), 262144 tokens, BOS <bos>, EOS <eos>"
    assert lines[-1] == "  chat template  none"


def test_json_has_the_same_facts(smollm2_path):
    """to_json is serialisable and carries the text report's facts."""
    data = json.loads(json.dumps(to_json(read_model_info(smollm2_path))))
    assert data["architecture"] == "llama" and data["layers"] == 30 and data["prediction"] is False
    assert {w["type"]: w["tensors"] for w in data["weights"]} == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert data["tokenizer"]["pre"] == "smollm" and data["chat_template_bytes"] == 368


def write_model(path, arch: str, **extra):
    """A tiny valid GGUF written by the gguf package's own writer."""
    w = GGUFWriter(path, arch)
    w.add_block_count(2)
    w.add_embedding_length(64)
    for key, value in extra.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_string(key, value)
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture_and_pre_tokenizer(tmp_path):
    """An unknown architecture and BPE pre-tokenizer are named as not supported."""
    path = write_model(tmp_path / "odd.gguf", "mamba9", **{
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "foo-bpe",
        "tokenizer.ggml.tokens": ["a", "b", "<eos>"], "tokenizer.ggml.eos_token_id": 2,
    })
    text = format_text(read_model_info(path))
    assert "  architecture   mamba9 (not supported yet)" in text
    assert 'gpt2 (unsupported pre-tokenizer "foo-bpe"), 3 tokens, BOS none, EOS <eos>' in text


def test_prediction_block_and_odd_values(tmp_path):
    """nextn_predict_layers > 0 means a prediction block; values of the wrong type read as unknown."""
    path = write_model(tmp_path / "mtp.gguf", "qwen35", **{
        "qwen35.nextn_predict_layers": 1, "qwen35.context_length": "lots",
        "tokenizer.ggml.bos_token_id": 99,
    })
    info = read_model_info(path)
    assert info.prediction and info.context_length is None and info.tokenizer.bos_token is None
    text = format_text(info)
    assert "  prediction     yes (drafts for speculative decoding)" in text
    assert "  context        unknown" in text and "  tokenizer      none" in text


def test_describe_reads_no_tensor_data(smollm2_path):
    """describe() decodes no metadata array: the vocabulary stays lazy."""
    g = open_gguf(smollm2_path)
    describe(g)
    assert g.metadata._decoded == {}


@pytest.mark.parametrize("n, text", [(134_515_008, "134.52 M"), (4_330_000_000, "4.33 B")])
def test_parameter_counts_read_like_the_seed(n, text):
    assert model_info._count(n) == text
