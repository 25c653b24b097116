"""Whether a prompt can fit the context, known from its length in bytes before it is tokenized.

Owns: TokenBound, the most input bytes one token of a vocabulary can stand for, and the refusal of
a text whose length already proves it needs more tokens than the context holds: a text whose
bytes all end up in tokens needs at least ceil(B / longest) tokens for B bytes. Tokenizing 16 MB
takes seconds and about a gigabyte; this check takes milliseconds, so an oversized prompt is
refused before any of that is spent. Does not own tokenizing (kinetic/frontend/tokenizer) or the
exact count after it (prompts.py).

Bytes that can vanish are not counted: in byte-level BPE a byte whose stand-in character is not a
token is dropped (SmolLM2 has no token for some control characters), and beside a token with
llama.cpp's LSTRIP or RSTRIP attribute whitespace is stripped. Vocabularies where more can vanish
get no bound and are tokenized and counted as before: WordPiece (whitespace is dropped), and
SentencePiece missing one of its 256 byte tokens (an unknown character could vanish whole).
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.frontend.tokenizer.vocab import Attr
from kinetic.server.errors import context_exceeded

_WHITESPACE = b" \t\n\v\f\r"  # what llama.cpp's strip flags remove (C isspace)


@dataclass(frozen=True)
class TokenBound:
    """`longest`: the most input bytes one token consumes (None: no bound for this vocabulary);
    `dropped`: byte values that may end up in no token, left out of the count."""

    longest: int | None
    dropped: bytes = b""

    @classmethod
    def of(cls, tokenizer) -> TokenBound:
        vocab = tokenizer.vocab
        if vocab.model not in ("gpt2", "llama") or not vocab.tokens:
            return cls(None)
        ids = vocab.token_to_id
        if vocab.model == "llama":
            if not all(f"<0x{b:02X}>" in ids for b in range(256)):
                return cls(None)
            dropped = b""
        else:
            dropped = bytes(b for b, c in enumerate(_BYTE_LEVEL_CHARS) if c not in ids)
        if any(a & (Attr.LSTRIP | Attr.RSTRIP) for a in vocab.attrs):
            dropped = bytes(sorted(set(dropped) | set(_WHITESPACE)))
        # A token's stored text is at least as long as the input it stands for: byte-level characters
        # take one or two bytes for one input byte, U+2581 three for one space, <0xNN> six for one byte.
        return cls(max(len(t.encode("utf-8", "surrogatepass")) for t in vocab.tokens), dropped)

    def fewest_tokens(self, text: str) -> int:
        """The fewest tokens `text` can tokenize to (0 when there is no bound). Lone surrogates
        count as one byte (they become U+FFFD, three bytes): fewer counted bytes is still a bound."""
        if self.longest is None:
            return 0
        data = text.encode("utf-8", "replace")
        kept = len(data.translate(None, self.dropped)) if self.dropped else len(data)
        return -(-kept // self.longest)

    def refuse_oversized(self, fewest: int, n_ctx: int) -> None:
        """Raise the context-size error when a prompt of at least `fewest` tokens cannot fit in n_ctx
        (a prompt must leave room for one generated token, as prompts.py checks after tokenizing)."""
        if fewest >= n_ctx:
            raise context_exceeded(fewest, n_ctx, at_least=True)


def _byte_level_chars() -> tuple[str, ...]:
    """GPT-2's stand-in character for each byte value (printable bytes stand for themselves, the
    others, in order, for chr(256), chr(257), ...)."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    others = iter(range(256, 512))
    return tuple(chr(b) if b in printable else chr(next(others)) for b in range(256))


_BYTE_LEVEL_CHARS = _byte_level_chars()
