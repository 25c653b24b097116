"""Tokenizer tests: llama.cpp's golden ids on the two real models, round trips, and small vocabularies."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.tokenizer import Tokenizer, read_vocab
from tests.conftest import load_golden

MODELS = ["smollm2-135m", "gemma3-270m"]


@pytest.fixture(scope="module")
def tokenizers(smollm2_path, gemma_path, tmp_path_factory):
    cache = tmp_path_factory.mktemp("tok-cache")
    return {
        "smollm2-135m": Tokenizer.from_gguf(open_gguf(smollm2_path), cache_dir=cache),
        "gemma3-270m": Tokenizer.from_gguf(open_gguf(gemma_path), cache_dir=cache),
    }


def _texts_and_prompts(name):
    golden = load_golden(name)
    return golden, [c.get("prompt") or c.get("rendered") for c in golden["raw"] + golden["chat"]]


@pytest.mark.parametrize("name", MODELS)
def test_golden_tokenize_both_variants(tokenizers, name):
    """Every golden text gives llama.cpp's ids, plain and with add_special + parse_special."""
    tok = tokenizers[name]
    for case in load_golden(name)["tokenize"]:
        assert tok.encode(case["text"], add_special=False, parse_special=False) == case["ids"], case["text"]
        got = tok.encode(case["text"], add_special=True, parse_special=True)
        assert got == case["ids_add_special_parse_special"], case["text"]


@pytest.mark.parametrize("name", MODELS)
def test_golden_prompts(tokenizers, name):
    """Every golden raw prompt and rendered chat tokenizes (add_special, parse_special) to prompt_ids."""
    golden, prompts = _texts_and_prompts(name)
    for case, text in zip(golden["raw"] + golden["chat"], prompts, strict=True):
        assert tokenizers[name].encode(text, add_special=True, parse_special=True) == case["prompt_ids"], text


@pytest.mark.parametrize("name", MODELS)
def test_golden_detokenize_round_trip(tokenizers, name):
    """decode(llama.cpp's ids) is the text again; with skip_special the BOS the file adds goes away."""
    tok = tokenizers[name]
    golden, prompts = _texts_and_prompts(name)
    for case in golden["tokenize"]:
        assert tok.decode(case["ids"]) == case["text"]
    for case, text in zip(golden["raw"] + golden["chat"], prompts, strict=True):
        ids = case["prompt_ids"]
        assert tok.decode(ids) == (tok.token_text(tok.bos_id) + text if tok.add_bos else text)
        without_control = text
        for tid in {i for i in ids if tok.is_control(i)}:
            without_control = without_control.replace(tok.token_text(tid), "")
        assert tok.decode(ids, skip_special=True) == without_control


def test_properties(tokenizers):
    """BOS/EOS/EOT ids, vocabulary size and add_bos are read as llama.cpp reads them."""
    smol, gemma = tokenizers["smollm2-135m"], tokenizers["gemma3-270m"]
    assert (smol.bos_id, smol.eos_id, smol.add_bos, smol.vocab_size) == (1, 2, False, 49152)
    assert (gemma.bos_id, gemma.eos_id, gemma.add_bos, gemma.vocab_size) == (2, 1, True, 262144)
    assert {0, 2} <= smol.eot_ids and smol.token_text(2) == "<|im_end|>"
    assert gemma.eot_ids == {1, 106, 212} and gemma.token_text(106) == "<end_of_turn>"
    assert gemma.token_text(212) == "</s>"  # llama.cpp b1-0c1e570's EOG set on this file: 1, 106, 212


def _extra_texts() -> list[str]:
    rng = random.Random(1234)
    scripts = ("English Ελληνικά Русский עברית العربية हिन्दी বাংলা ไทย ქართული 한국어 日本語 中文 "
               "Tiếng Việt Ꭰ ᚠ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🧑🏽‍🚀 👨‍👩‍👧 🇫🇷 e\u0301 ﬁ Ω")
    control = "".join(chr(c) for c in range(0, 32)) + "\x7f\x85\u200b\u200d\u2028\ufeff\u3000"
    codepoints = [c for c in range(1, 0x30000) if not 0xD800 <= c <= 0xDFFF]
    random_unicode = "".join(chr(rng.choice(codepoints)) for _ in range(10_000))
    return [scripts, control, "a" * 5000, " " * 300 + "\n" * 300 + "\t" * 50, "1234567890" * 200,
            scripts * 40, random_unicode, "<|im_start|><start_of_turn><bos><unused0>[multimodal]"]


@pytest.mark.parametrize("name", MODELS)
def test_extra_round_trips(tokenizers, name):
    """Long, multi-script, control-character and 10k random-code-point texts round-trip exactly."""
    tok = tokenizers[name]
    for text in _extra_texts():
        ids = tok.encode(text, add_special=False)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == "".join(c for c in text if _representable(tok, c))
        assert all(0 <= i < tok.vocab_size for i in tok.encode(text, add_special=True, parse_special=True))


def _representable(tok: Tokenizer, ch: str) -> bool:
    """Whether llama.cpp keeps the character: byte-level BPE drops a byte its vocabulary lacks
    (SmolLM2 has no token for 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D); SentencePiece has all 256."""
    if tok.vocab.model != "gpt2":
        return True
    from kinetic.frontend.tokenizer.core import _BYTES_OF

    to_char = {b: c for c, b in _BYTES_OF.items()}
    return all(to_char[b] in tok.vocab.token_to_id for b in ch.encode())


def test_bytes_without_a_token_are_dropped_as_llama_cpp_does(tokenizers):
    """SmolLM2 has no token for byte 0x04: llama.cpp skips it, so Kinetic does too."""
    tok = tokenizers["smollm2-135m"]
    pieces = tok.encode("a", add_special=False) + tok.encode("b", add_special=False)
    assert tok.encode("a\x04b", add_special=False) == pieces
    assert not _representable(tok, "\x04") and _representable(tok, "\n")


def test_lone_surrogates_do_not_crash(tokenizers):
    """Text that cannot be UTF-8 tokenizes with U+FFFD in place of the surrogate."""
    tok = tokenizers["smollm2-135m"]
    assert tok.encode("a\ud800b", add_special=False) == tok.encode("a\ufffdb", add_special=False)


@pytest.mark.parametrize("name", MODELS)
def test_stream_decoder_emits_whole_characters(tokenizers, name):
    """Pushing ids one at a time gives the full text, and never a broken character on the way."""
    tok = tokenizers[name]
    text = "naïve café — 東京 😀👍🏽 Ελληνικά\n\tend"
    stream = tok.stream_decoder()
    chunks = [stream.push(i) for i in tok.encode(text, add_special=False)]
    chunks.append(stream.flush())
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    assert "" in chunks  # some emoji take several byte tokens; their first pushes emit nothing


def test_stream_decoder_flushes_a_dangling_byte(tokenizers):
    """A character cut off at the end of the stream is flushed as U+FFFD, not dropped."""
    tok = tokenizers["gemma3-270m"]
    first_byte = tok.vocab.token_to_id["<0xF0>"]
    stream = tok.stream_decoder()
    assert stream.push(first_byte) == ""
    assert stream.flush() == "\ufffd"


def test_cached_build_matches_cold_build(gemma_path, tmp_path):
    """A tokenizer built from the disk cache gives the same ids as one built from scratch."""
    text = load_golden("gemma3-270m")["tokenize"][4]["text"] + " Unusual words: floccinaucinihil"
    cold = Tokenizer.from_gguf(open_gguf(gemma_path), cache_dir=tmp_path)
    assert any(tmp_path.iterdir())
    warm = Tokenizer.from_gguf(open_gguf(gemma_path), cache_dir=tmp_path)
    assert cold.encode(text) == warm.encode(text)


# -- SentencePiece: a reference implementation of llama.cpp's algorithm -----------------------------


def _reference_spm(tok: Tokenizer, text: str) -> list[int]:
    """llama.cpp's SPM loop written plainly: join the best-scoring adjacent pair (leftmost on ties)
    while one forms a token; leftovers become <0xNN> byte tokens."""
    vocab = tok.vocab
    symbols = list(text.replace(" ", "\u2581"))
    while True:
        best = None
        for k in range(len(symbols) - 1):
            tid = vocab.token_to_id.get(symbols[k] + symbols[k + 1])
            if tid is not None and (best is None or vocab.scores[tid] > best[0]):
                best = (vocab.scores[tid], k)
        if best is None:
            break
        k = best[1]
        symbols[k : k + 2] = [symbols[k] + symbols[k + 1]]
    out = []
    for s in symbols:
        tid = vocab.token_to_id.get(s)
        out.extend([tid] if tid is not None else [vocab.token_to_id[f"<0x{b:02X}>"] for b in s.encode()])
    return out


def test_spm_matches_reference_algorithm(tokenizers):
    """Gemma's fast SentencePiece path equals the plain score-ordered algorithm on random texts."""
    tok = tokenizers["gemma3-270m"]
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyz ABCXYZ.,'-éüßñ東京日本語한국어ελληνικά😀🏽"
    for _ in range(150):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        assert tok._backend.encode([text]) == _reference_spm(tok, text), text


# -- small synthetic vocabularies ------------------------------------------------------------------


def _byte_level_meta(pre: str, extra=(), merges=()) -> dict:
    from kinetic.frontend.tokenizer.core import _BYTES_OF

    tokens = ["<|endoftext|>", *sorted(_BYTES_OF, key=_BYTES_OF.get), *extra]
    types = np.array([3] + [1] * (len(tokens) - 1), dtype=np.int32)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": list(merges),
            "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0}


def test_unknown_pre_tokenizer_is_a_clear_error():
    """A pre-tokenizer Kinetic does not know fails by name, not with a wrong tokenization."""
    with pytest.raises(KineticError, match='unsupported pre-tokenizer "made-up"'):
        read_vocab(_byte_level_meta("made-up"))


def _split(tok: Tokenizer, text: str) -> list[str]:
    """The pre-tokens of `text` (as slices of it: the byte-level stand-ins are mapped back)."""
    return [text[a:b] for _, (a, b) in tok._backend.hf.pre_tokenizer.pre_tokenize_str(text)]


@pytest.mark.parametrize(
    ("pre", "text", "expected"),
    [
        # digits: Llama 3 groups up to three, Qwen and SmolLM take one at a time, GPT-2 keeps runs
        ("llama3", "x 1234567", ["x", " ", "123", "456", "7"]),
        ("lfm2", "x 1234567", ["x", " ", "123", "456", "7"]),
        ("qwen2", "x 1234", ["x", " ", "1", "2", "3", "4"]),
        ("smollm", "x 1234", ["x", " ", "1", "2", "3", "4"]),
        ("gpt-2", "x 1234", ["x", " 1234"]),
        ("exaone4", "x 1234", ["x", " 1234"]),
        # contractions: Llama 3 matches them in any case, GPT-2 only in lower case
        ("llama3", "DON'T", ["DON", "'T"]),
        ("gpt-2", "DON'T", ["DON", "'", "T"]),
        # whitespace before a word: the last space joins the word
        ("gpt-2", "a   b", ["a", "  ", " b"]),
        ("llama3", "a\n\n  b", ["a", "\n\n", " ", " b"]),
        # Qwen 3.5 keeps combining marks in the word; Qwen 2 splits them off
        ("qwen35", "cafe\u0301!", ["cafe\u0301", "!"]),
        ("qwen2", "cafe\u0301!", ["cafe", "\u0301!"]),
        # Hunyuan: CJK runs apart from letters, digits in threes
        ("hunyuan-dense", "ab東京12345", ["ab", "東京", "123", "45"]),
        # default: punctuation runs first
        ("default", "a+b", ["a", "+", "b"]),
    ],
)
def test_pre_tokenizer_splits(pre, text, expected):
    """Each supported pre-tokenizer splits text where llama.cpp's regexes for it do."""
    tok = Tokenizer(read_vocab(_byte_level_meta(pre)))
    assert _split(tok, text) == expected


def test_bpe_merges_and_user_defined_tokens():
    """Merges apply by rank; user-defined tokens match without parse_special, control ones only with it."""
    meta = _byte_level_meta("gpt-2", extra=["ab", "abc", "<tool>"], merges=["a b", "ab c"])
    meta["tokenizer.ggml.token_type"] = np.append(meta["tokenizer.ggml.token_type"][:-1], 4).astype(np.int32)
    tok = Tokenizer(read_vocab(meta))
    ids = tok.vocab.token_to_id
    assert tok.encode("abc", add_special=False) == [ids["abc"]]
    assert tok.encode("x<tool>", add_special=False) == [ids["x"], ids["<tool>"]]
    assert tok.encode("<|endoftext|>", add_special=False) != [0]
    assert tok.encode("<|endoftext|>", add_special=False, parse_special=True) == [0]


def _spm_meta(add_space_prefix: bool) -> dict:
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], "\u2581", "h", "i", "\u2581h",
              "\u2581hi", "!"]
    types = [2, 3, 3] + [6] * 256 + [1] * 6
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -0.5, -6.0]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
            "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
            "tokenizer.ggml.add_space_prefix": add_space_prefix}


def test_spm_space_prefix_and_byte_fallback():
    """With add_space_prefix a space leads each text after BOS or a special token, and decode drops
    it again; characters no token covers become byte tokens."""
    tok = Tokenizer(read_vocab(_spm_meta(True)))
    ids = tok.vocab.token_to_id
    assert tok.encode("hi", add_special=True) == [1, ids["\u2581hi"]]
    hi = ids["\u2581hi"]
    assert tok.encode("hi</s>hi", add_special=False, parse_special=True) == [hi, 2, hi]
    assert tok.encode("h€", add_special=False)[1:] == [ids["<0xE2>"], ids["<0x82>"], ids["<0xAC>"]]
    assert tok.decode(tok.encode("hi h€", add_special=False)) == "hi h€"
    plain = Tokenizer(read_vocab(_spm_meta(False)))
    assert plain.encode("hi", add_special=False) == [ids["h"], ids["i"]]


def test_wordpiece():
    """WordPiece lower-cases, splits punctuation, takes the longest piece, and gives [UNK] for a gap."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581hello", "\u2581un", "aff", "able", "\u2581,",
              "\u2581!", "\u2581world"]
    meta = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array([3, 2, 3, 3] + [1] * 7, dtype=np.int32),
            "tokenizer.ggml.unknown_token_id": 1, "tokenizer.ggml.bos_token_id": 2,
            "tokenizer.ggml.seperator_token_id": 3}
    tok = Tokenizer(read_vocab(meta))
    assert tok.encode("Hello, unaffable WORLD!") == [2, 4, 8, 5, 6, 7, 10, 9, 3]
    assert tok.encode("hello xyz", add_special=False) == [4, 1]
