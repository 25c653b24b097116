"""Grammar test fixtures: a byte vocabulary (one token per byte, plus an end token) for exact
text checks, and SmolLM2's real tokenizer and vocabulary for mask checks."""

from __future__ import annotations

import pytest

from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.tokenizer import Tokenizer
from kinetic.grammar import GrammarMatcher, TokenVocab, parse_gbnf

BYTE_EOS = 256


@pytest.fixture(scope="session")
def byte_vocab() -> TokenVocab:
    return TokenVocab([bytes([b]) for b in range(256)] + [b""], eog_ids=[BYTE_EOS])


@pytest.fixture(scope="session")
def smol_tokenizer(smollm2_path) -> Tokenizer:
    return Tokenizer.from_gguf(open_gguf(smollm2_path))


@pytest.fixture(scope="session")
def smol_vocab(smol_tokenizer) -> TokenVocab:
    return TokenVocab.from_tokenizer(smol_tokenizer)


@pytest.fixture(scope="session")
def byte_matcher(byte_vocab):
    """matcher(gbnf_text_or_grammar) over the byte vocabulary."""

    def build(grammar):
        return GrammarMatcher(parse_gbnf(grammar) if isinstance(grammar, str) else grammar, byte_vocab)

    return build
