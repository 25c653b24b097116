"""Tokenizers read from GGUF files, identical to llama.cpp's (see docs/tokenizer.md)."""

from kinetic.frontend.tokenizer.core import StreamDecoder, Tokenizer
from kinetic.frontend.tokenizer.pretok import PRE_TOKENIZERS, PreTokenizer
from kinetic.frontend.tokenizer.vocab import Attr, TokenType, Vocab, read_vocab

__all__ = [
    "PRE_TOKENIZERS", "Attr", "PreTokenizer", "StreamDecoder",
    "TokenType", "Tokenizer", "Vocab", "read_vocab",
]
