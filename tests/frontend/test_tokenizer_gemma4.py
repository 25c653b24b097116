"""Gemma 4's tokenizer (SentencePiece-style BPE) against llama.cpp's ids on a small Gemma 4 style file.

The file and llama.cpp's answers come from scripts/make_gemma4_tokenizer_data.py (tests/data/tokenizer-gemma4).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.model_info import read_model_info
from kinetic.frontend.tokenizer import Attr, Tokenizer, read_vocab

DATA = Path(__file__).resolve().parents[1] / "data" / "tokenizer-gemma4"
REFERENCE = json.loads((DATA / "llama-cpp.json").read_text(encoding="utf-8"))
CASES = REFERENCE["cases"]


@pytest.fixture(scope="module")
def metadata() -> dict:
    meta = open_gguf(DATA / REFERENCE["file"]).metadata
    return {key: meta[key] for key in meta if key.startswith("tokenizer.")}


@pytest.fixture(scope="module")
def tok(metadata) -> Tokenizer:
    return Tokenizer(read_vocab(metadata))


def _variant(metadata: dict, **changes) -> Tokenizer:
    meta = dict(metadata)
    meta.update({f"tokenizer.ggml.{key}": value for key, value in changes.items()})
    return Tokenizer(read_vocab(meta))


def test_file_loads_as_gemma4():
    """The GGUF file itself (tokenizer.ggml.model "gemma4") builds a tokenizer through from_gguf."""
    tok = Tokenizer.from_gguf(open_gguf(DATA / REFERENCE["file"]), cache_dir=False)
    assert tok.vocab.model == "gemma4" and tok.vocab.pre_name == "gemma4"
    hello = next(c for c in CASES if c["text"] == "Hello world")
    assert tok.encode("Hello world", add_special=False) == hello["ids"]


def test_ids_equal_llama_cpp(tok):
    """Every text gives llama.cpp's ids, plain and with add_special + parse_special."""
    for case in CASES:
        assert tok.encode(case["text"], add_special=False, parse_special=False) == case["ids"], case["text"]
        got = tok.encode(case["text"], add_special=True, parse_special=True)
        assert got == case["ids_add_special_parse_special"], case["text"]


def test_detokenize_equals_llama_cpp(tok):
    """decode of llama.cpp's ids is llama.cpp's detokenization, with and without special tokens."""
    for case in CASES:
        assert tok.decode(case["ids"]) == case["detokenized"], case["text"]
        assert tok.decode(case["ids_add_special_parse_special"], skip_special=True) == \
            case["detokenized_skip_special"], case["text"]


def test_round_trip_where_llama_cpp_round_trips(tok):
    """decode(encode(s)) == s for every text llama.cpp gives back unchanged (all but missing bytes)."""
    round_trips = [c["text"] for c in CASES if c["detokenized"] == c["text"]]
    assert len(round_trips) >= len(CASES) - 6
    for text in round_trips:
        assert tok.decode(tok.encode(text, add_special=False)) == text


def test_vocabulary_facts_equal_llama_cpp(tok):
    """Token attributes, the end-of-generation set, BOS/EOS and add_bos are llama.cpp's: "<turn|>" and
    "<|tool_response>" end generation, "</s>" is an ordinary token, visible markers are user-defined."""
    assert tok.vocab.attrs == REFERENCE["attrs"]
    assert sorted(tok.eot_ids) == REFERENCE["eog_ids"]
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (REFERENCE["bos"], REFERENCE["eos"], REFERENCE["add_bos"])
    assert tok.vocab.attrs[tok.vocab.token_to_id["</s>"]] == Attr.NORMAL


def test_bos_is_added_even_where_the_file_says_not(metadata):
    """llama.cpp forces add_bos for the gemma4 pre-tokenizer, over add_bos_token = false."""
    tok = _variant(metadata, add_bos_token=False)
    assert tok.add_bos and tok.encode("Hi")[0] == REFERENCE["bos"]


def test_the_files_pre_tokenizer_key_is_ignored(metadata, tok):
    """A "gemma4" vocabulary always runs the "gemma4" pre-tokenizer, whatever tokenizer.ggml.pre says."""
    other = _variant(metadata, pre="llama3")
    for case in CASES:
        assert other.encode(case["text"], add_special=False) == case["ids"], case["text"]


@pytest.mark.parametrize("pre", sorted(REFERENCE["variants"]))
def test_byte_level_files_naming_spm_style_pre_tokenizers(metadata, pre):
    """A "gpt2" vocabulary whose pre-tokenizer is gemma4 or sarvam-moe tokenizes, detokenizes and sets
    add_bos and the end-of-generation set as llama.cpp does on the same file."""
    expected = REFERENCE["variants"][pre]
    tok = _variant(metadata, model="gpt2", pre=pre)
    assert tok.add_bos == expected["add_bos"] and sorted(tok.eot_ids) == expected["eog_ids"]
    for case, want in zip(CASES, expected["cases"], strict=True):
        assert tok.encode(case["text"], add_special=False) == want["ids"], case["text"]
        got = tok.encode(case["text"], add_special=True, parse_special=True)
        assert got == want["ids_add_special_parse_special"], case["text"]
        assert tok.decode(want["ids"]) == want["detokenized"], case["text"]


def _tiny_gemma4(merges: list[str]) -> Tokenizer:
    tokens = ["<pad>", "<eos>", "<bos>", "a", "b", "c", "ab", "bc", "\u2581"]
    return Tokenizer(read_vocab({
        "tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": [3, 3, 3, 1, 1, 1, 1, 1, 1], "tokenizer.ggml.bos_token_id": 2,
    }))


def test_a_repeated_merge_keeps_its_first_rank():
    """Of two equal merge lines the first decides the rank, as llama.cpp's emplace keeps the first."""
    assert _tiny_gemma4(["a b", "b c"]).encode("abc", add_special=False) == [6, 5]
    assert _tiny_gemma4(["a b", "b c", "a b"]).encode("abc", add_special=False) == [6, 5]
    assert _tiny_gemma4(["b c", "a b", "b c"]).encode("abc", add_special=False) == [3, 7]


def test_merges_outside_the_vocabulary_are_left_out():
    """A merge whose parts or result are not tokens is skipped; the others keep their order."""
    tok = _tiny_gemma4(["a x", "c a", "b c", "a b", "nospace"])
    assert tok.encode("abc a", add_special=False) == [3, 7, 8, 3]


def test_model_info_reports_the_gemma4_tokenizer_as_supported():
    """`kinetic info` counts a gemma4 vocabulary as supported and says it adds BOS."""
    tok = read_model_info(DATA / REFERENCE["file"]).tokenizer
    assert (tok.model, tok.supported, tok.add_bos, tok.bos_token) == ("gemma4", True, True, "<bos>")
