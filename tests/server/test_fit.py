"""TokenBound (kinetic/server/fit.py): the fewest tokens a text can take, known from its bytes, is a
true lower bound on both real vocabularies, and vocabularies where bytes can vanish get less or no bound."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.tokenizer import Tokenizer
from kinetic.frontend.tokenizer.vocab import Attr
from kinetic.server.errors import ApiError
from kinetic.server.fit import _BYTE_LEVEL_CHARS, TokenBound

PIECES = ["<|im_start|>", "<start_of_turn>", "<|endoftext|>", " ", "\n", "\t", "the", " the", "\x04", "ab", "\ud800",
          "😀", "é", "\u2581", "1234", "<0x41>"]


@pytest.fixture(scope="module")
def tokenizers(smollm2_path, gemma_path, tmp_path_factory):
    cache = tmp_path_factory.mktemp("tok-cache")
    return [Tokenizer.from_gguf(open_gguf(path), cache_dir=cache) for path in (smollm2_path, gemma_path)]


def _texts(tokenizer, rng: random.Random):
    for trial in range(200):
        n = rng.randint(1, 300)
        kind = trial % 4
        if kind == 0:
            yield "".join(chr(rng.randint(0, 0x2FF)) for _ in range(n))
        elif kind == 1:
            yield "".join(rng.choice(PIECES) for _ in range(n))
        elif kind == 2:
            yield bytes(rng.randint(0, 255) for _ in range(n)).decode("latin-1")
        else:
            yield "".join(rng.choice(tokenizer.vocab.tokens) for _ in range(n // 4 + 1))


def test_fewest_tokens_never_exceeds_the_real_count(tokenizers):
    """On SmolLM2 (byte-level BPE, some bytes without a token) and Gemma 3 (SentencePiece), no text
    tokenizes to fewer tokens than the bound says, special tokens and lone surrogates included."""
    for tokenizer in tokenizers:
        bound = TokenBound.of(tokenizer)
        assert bound.longest is not None
        for text in _texts(tokenizer, random.Random(7)):
            real = len(tokenizer.encode(text, add_special=True, parse_special=True))
            assert bound.fewest_tokens(text) <= real, (repr(text[:60]), bound.fewest_tokens(text), real)


def test_bytes_without_a_token_are_not_counted(tokenizers):
    """SmolLM2 has no token for byte 0x04, so a megabyte of it (which tokenizes to nothing) counts as nothing."""
    smollm2 = tokenizers[0]
    bound = TokenBound.of(smollm2)
    assert 0x04 in bound.dropped and smollm2.encode("\x04" * 1000, add_special=False) == []
    assert bound.fewest_tokens("\x04" * 1_000_000) == 0


def _vocab(model: str, tokens: list[str], attrs: list[int] | None = None):
    attrs = attrs or [Attr.NORMAL] * len(tokens)
    return SimpleNamespace(vocab=SimpleNamespace(model=model, tokens=tokens, attrs=attrs,
                                                 token_to_id={t: i for i, t in enumerate(tokens)}))


def test_vocabularies_that_can_drop_text_get_less_or_no_bound():
    """WordPiece and SentencePiece without every byte token get no bound; a stripping token makes
    whitespace uncounted; a full byte-level vocabulary counts every byte."""
    byte_level = list(_BYTE_LEVEL_CHARS) + ["hello"]
    assert TokenBound.of(_vocab("bert", ["[UNK]", "a"])).longest is None
    assert TokenBound.of(_vocab("llama", ["<0x00>", "a"])).longest is None
    full = TokenBound.of(_vocab("gpt2", byte_level))
    assert full.longest == 5 and full.dropped == b"" and full.fewest_tokens("x" * 11) == 3
    strip = TokenBound.of(_vocab("gpt2", byte_level + ["<s>"], [Attr.NORMAL] * 257 + [Attr.CONTROL | Attr.RSTRIP]))
    assert strip.fewest_tokens(" " * 100) == 0 and strip.fewest_tokens("x" * 10) == 2


def test_refusal_names_the_bound_and_the_context():
    """A prompt of at least n_ctx tokens is refused with llama-server's context error; one token less passes."""
    bound = TokenBound(longest=4)
    bound.refuse_oversized(511, 512)
    with pytest.raises(ApiError) as refused:
        bound.refuse_oversized(512, 512)
    error = refused.value
    assert error.kind == "exceed_context_size_error" and error.extra == {"n_prompt_tokens": 512, "n_ctx": 512}
    assert "at least 512 tokens" in error.message
