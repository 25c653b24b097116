"""Tokenizer: text to ids and back exactly as llama.cpp does it for the same GGUF file.

Owns: splitting special tokens out of text (llama.cpp's tokenizer_st_partition), BOS/EOS, the
SentencePiece space prefix, detokenizing (token pieces, clean-up of spaces) and streaming decode.
Does not own: merge algorithms (backends.py), reading the file (vocab.py), chat templates.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from kinetic.frontend.tokenizer import backends
from kinetic.frontend.tokenizer.vocab import BPE_MODELS, Attr, Vocab, read_vocab

_SPECIAL = Attr.CONTROL | Attr.UNKNOWN
_C_SPACE = " \t\n\v\f\r"  # C isspace(), which llama.cpp's strip flags use


def _byte_decoder() -> dict[str, int]:
    """GPT-2's map from the printable stand-in characters back to bytes."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_BYTES_OF = _byte_decoder()


class Tokenizer:
    """BPE (byte-level or SentencePiece-style), SentencePiece or WordPiece tokenizer read from a GGUF file."""

    def __init__(self, vocab: Vocab, cache_dir: Path | None = None):
        self.vocab = vocab
        if vocab.pre is not None and vocab.pre.escape_whitespaces:
            self._backend = backends.SpmStyleBpe(vocab)
        elif vocab.model in BPE_MODELS:
            self._backend = backends.build_bpe(vocab)
        elif vocab.model == "llama":
            self._backend = backends.build_spm(vocab, cache_dir)
        else:
            self._backend = backends.WordPiece(vocab)
        self._pieces: list[bytes | None] = [None] * len(vocab.tokens)
        self._specials = self._group_specials()

    @classmethod
    def from_gguf(cls, gguf_file, cache_dir: Path | None | bool = True) -> Tokenizer:
        """Build from an open GGUFFile; `cache_dir=False` turns the on-disk cache off."""
        if cache_dir is True:
            cache_dir = backends.default_cache_dir()
        return cls(read_vocab(gguf_file.metadata), cache_dir or None)

    # -- properties -------------------------------------------------------------------------------

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.vocab.eos_id

    @property
    def eot_ids(self) -> set[int]:
        """Every id that ends generation in llama.cpp (its EOG set: eos, <|im_end|>, <end_of_turn>, ...)."""
        return set(self.vocab.eog_ids)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab.tokens)

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    def token_text(self, token_id: int) -> str:
        """The token's text as the vocabulary stores it (byte-level or ▁ form, not decoded)."""
        return self.vocab.tokens[token_id]

    def is_control(self, token_id: int) -> bool:
        return bool(self.vocab.attrs[token_id] & _SPECIAL)

    # -- encoding ---------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize: ids for `text`; `add_special` adds BOS/EOS as the file asks, and
        `parse_special` lets control tokens written in the text count as tokens."""
        text = _valid_utf8(text)
        vocab = self.vocab
        parts = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and vocab.model == "bert":
            out.append(vocab.bos_id)
        elif add_special and vocab.add_bos and vocab.bos_id is not None:
            out.append(vocab.bos_id)
        pending: list[str] = []
        prev_special = True
        for part in parts:
            if isinstance(part, str):
                if vocab.model == "llama" and vocab.add_space_prefix and prev_special:
                    part = " " + part
                pending.append(part)
                prev_special = False
            else:
                if pending:
                    out.extend(self._backend.encode(pending))
                    pending = []
                out.append(part)
                prev_special = True
        if pending:
            out.extend(self._backend.encode(pending))
        if add_special and vocab.model == "bert" and vocab.sep_id is not None:
            out.append(vocab.sep_id)
        elif add_special and vocab.add_eos and vocab.eos_id is not None:
            out.append(vocab.eos_id)
        return out

    def _group_specials(self) -> dict[str, list[int]]:
        """Special tokens in llama.cpp's order (longest first), grouped by their first two characters."""
        groups: dict[str, list[int]] = {}
        for tid in self.vocab.specials_for_matching:
            groups.setdefault(self.vocab.tokens[tid][:2], []).append(tid)
        return groups

    def _candidates(self, text: str, parse_special: bool) -> list[int]:
        """The special tokens that occur in `text`, longest first (llama.cpp's order)."""
        found = []
        attrs, tokens = self.vocab.attrs, self.vocab.tokens
        for prefix, group in self._specials.items():
            if prefix not in text:
                continue
            found.extend(t for t in group if (parse_special or not attrs[t] & _SPECIAL) and tokens[t] in text)
        return sorted(found, key=lambda t: -len(tokens[t].encode("utf-8")))

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split special tokens out of the text: each, longest first, at every non-overlapping
        occurrence left to right in every piece still text (tokenizer_st_partition)."""
        parts: list[str | int] = [text]
        for tid in self._candidates(text, parse_special):
            needle, attr = self.vocab.tokens[tid], self.vocab.attrs[tid]
            split: list[str | int] = []
            for part in parts:
                if not isinstance(part, str) or needle not in part:
                    split.append(part)
                    continue
                pieces = part.split(needle)
                for k, piece in enumerate(pieces):
                    if k:
                        split.append(tid)
                    if k < len(pieces) - 1 and attr & Attr.LSTRIP:
                        piece = piece.rstrip(_C_SPACE)
                    if k and attr & Attr.RSTRIP:
                        piece = piece.lstrip(_C_SPACE)
                    if piece:
                        split.append(piece)
            parts = split
        return parts

    # -- decoding ---------------------------------------------------------------------------------

    def piece(self, token_id: int, special: bool = True) -> bytes:
        """llama_token_to_piece: the bytes one token stands for (control tokens only if `special`)."""
        if not special and self.vocab.attrs[token_id] & _SPECIAL:
            return b""
        cached = self._pieces[token_id]
        if cached is None:
            cached = self._pieces[token_id] = self._make_piece(token_id)
        return cached

    def _make_piece(self, token_id: int) -> bytes:
        text, attr, byte_level = self.vocab.tokens[token_id], self.vocab.attrs[token_id], self.vocab.byte_level
        if attr & (_SPECIAL | Attr.USER_DEFINED):
            return text.encode("utf-8")
        if attr & Attr.NORMAL:
            if byte_level:
                return bytes(_BYTES_OF.get(c, 0) for c in text) if all(c in _BYTES_OF for c in text) \
                    else _unmapped(text)
            return text.replace("\u2581", " ").encode("utf-8")
        if attr & Attr.BYTE and not byte_level:
            return bytes([int(text[3:5], 16)])
        return b""  # unused and undefined tokens print nothing

    def decode(self, ids, skip_special: bool = False) -> str:
        """llama_detokenize: `skip_special` drops control tokens (and a leading BOS / trailing EOS
        the file adds); invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def decode_bytes(self, ids, skip_special: bool = False) -> bytes:
        vocab = self.vocab
        ids = [int(i) for i in ids]
        strip_space = vocab.add_space_prefix
        if skip_special and vocab.add_bos and ids and ids[0] == vocab.bos_id:
            strip_space = False
            ids = ids[1:]
        if skip_special and vocab.add_eos and ids and ids[-1] == vocab.eos_id:
            ids = ids[:-1]
        pieces = [self.piece(i, special=not skip_special) for i in ids]
        if strip_space and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]
        text = b"".join(pieces)
        return _clean_spaces(text) if vocab.clean_spaces else text

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special)


class StreamDecoder:
    """Decodes ids one at a time and hands out only complete UTF-8 characters.

    Each token's piece is emitted as llama-server streams it (no clean-up of spaces); bytes of a
    character split across tokens wait for the rest; `flush` ends the stream (a dangling partial
    character becomes U+FFFD).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tokenizer.piece(int(token_id), special=not self._skip_special))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def _unmapped(text: str) -> bytes:
    """llama_decode_text for a byte-level token holding characters outside GPT-2's byte map."""
    out = bytearray()
    for c in text:
        if c in _BYTES_OF:
            out.append(_BYTES_OF[c])
        else:
            utf8 = c.encode("utf-8")
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


def _valid_utf8(text: str) -> str:
    """Lone surrogates cannot be UTF-8 (llama.cpp only ever sees UTF-8); they become U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces, pass for pass and byte for byte (it edits its
    buffer in place, and the second pass blanks the byte it skips, which the next test then sees):
    " ?" " !" " ." " ," lose the space, " ' " becomes "'", " 's" " 'm" " 're" " 've" lose the space."""
    buf = bytearray(text)
    n = len(buf)
    total = 1 if n else 0
    for i in range(1, n):
        if buf[i - 1] == 0x20 and buf[i] in b"?!.,":
            total -= 1
        buf[total] = buf[i]
        total += 1
    n, total, i = total, 1 if total else 0, 1
    while i < n:
        x = buf[i]
        if x == 0x27 and i + 1 < n and buf[i - 1] == 0x20 and buf[i + 1] == 0x20:
            total -= 1
            i += 1
            buf[i] = 0
        buf[total] = x
        total += 1
        i += 1
    n, total = total, 1 if total else 0
    for i in range(1, n):
        x = buf[i]
        if buf[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1, x2 = buf[i + 1], buf[i + 2] if i + 2 < n else None
            if x1 in b"sm" or (x2 is not None and bytes((x1, x2)) in (b"re", b"ve")):
                total -= 1
        buf[total] = x
        total += 1
    return bytes(buf[:total])
