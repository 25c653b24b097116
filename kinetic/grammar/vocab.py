"""The vocabulary as the grammar matcher sees it: each token's exact bytes, in a byte trie.

Owns: each token id's bytes (llama.cpp's token_to_piece with special tokens rendered as their text),
the end-of-generation ids (allowed only where the grammar is complete, never matched as text), the
token-text lookup for `<text>` tokens in a grammar, and the trie that shares every common prefix so
a mask walks each prefix once (`walk_trie`, compiled with numba).
Does not own: grammar states (matcher.py) or tokenizing (kinetic.frontend.tokenizer).

The trie is stored in preorder: node i has a byte, a depth (1 for a first byte), the index just past
its subtree (so a rejected prefix skips everything under it in one step) and the token ids whose
bytes end at it. Tokens with no bytes (unused ids) never match text.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence

import numpy as np
from numba import njit

from kinetic.grammar.gbnf_ast import GrammarError, Token


class TokenVocab:
    """`TokenVocab(pieces, eog_ids)`: pieces[i] is token i's bytes."""

    def __init__(self, pieces: Sequence[bytes], eog_ids: Iterable[int] = (), special_ids: Iterable[int] = ()):
        self.pieces = [bytes(p) for p in pieces]
        self.n_vocab = len(self.pieces)
        self.eog_ids = np.array(sorted({int(i) for i in eog_ids if 0 <= int(i) < self.n_vocab}), dtype=np.int64)
        self._eog = set(self.eog_ids.tolist())
        self._special = {int(i) for i in special_ids}
        self._by_text: dict[bytes, list[int]] | None = None
        self._build_trie()

    @classmethod
    def from_tokenizer(cls, tokenizer) -> TokenVocab:
        """The vocabulary of a kinetic Tokenizer, built once per tokenizer and shared."""
        with _CACHE_LOCK:
            cached = _CACHE.get(tokenizer)
            if cached is None:
                n = tokenizer.vocab_size
                pieces = [tokenizer.piece(i, special=True) for i in range(n)]
                specials = [i for i in range(n) if tokenizer.is_control(i)]
                cached = _CACHE[tokenizer] = cls(pieces, tokenizer.eot_ids, specials)
        return cached

    def is_eog(self, token: int) -> bool:
        return token in self._eog

    def resolve(self, token: Token) -> int:
        """The id a grammar's `<[id]>` or `<text>` names; the text must be exactly one token."""
        if token.token_id is not None:
            if not 0 <= token.token_id < self.n_vocab:
                raise GrammarError(f"token id {token.token_id} is outside the vocabulary (0..{self.n_vocab - 1})")
            return token.token_id
        if self._by_text is None:
            by_text: dict[bytes, list[int]] = {}
            for i, piece in enumerate(self.pieces):
                by_text.setdefault(piece, []).append(i)
            self._by_text = by_text
        ids = self._by_text.get((token.text or "").encode("utf-8"), [])
        special = [i for i in ids if i in self._special]
        if len(special) == 1 or len(ids) == 1:
            return special[0] if special else ids[0]
        raise GrammarError(f"token {token.text} is not a single token of this model's vocabulary")

    # -- the trie --------------------------------------------------------------------------------

    def _build_trie(self) -> None:
        by_piece: dict[bytes, list[int]] = {}
        for i, piece in enumerate(self.pieces):
            if piece and i not in self._eog:
                by_piece.setdefault(piece, []).append(i)
        byte, depth, tok_start, tok_end, tok_ids = [], [], [], [], []
        prev = b""
        for piece in sorted(by_piece):
            common = 0
            limit = min(len(prev), len(piece))
            while common < limit and prev[common] == piece[common]:
                common += 1
            for d in range(common, len(piece)):
                byte.append(piece[d])
                depth.append(d + 1)
                tok_start.append(len(tok_ids))
                tok_end.append(len(tok_ids))
            tok_ids.extend(by_piece[piece])
            tok_end[-1] = len(tok_ids)
            prev = piece
        self.node_byte = np.array(byte, dtype=np.uint8)
        self.node_depth = np.array(depth, dtype=np.int32)
        self.node_tok_start = np.array(tok_start, dtype=np.int32)
        self.node_tok_end = np.array(tok_end, dtype=np.int32)
        self.tok_ids = np.array(tok_ids, dtype=np.int32)
        self.node_next = _subtree_ends(self.node_depth)
        self.max_depth = int(self.node_depth.max(initial=0))

    @property
    def n_nodes(self) -> int:
        return len(self.node_byte)


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


@njit(cache=True)
def _subtree_ends(depth):
    """For each preorder node, the index of the first node after its subtree."""
    n = depth.shape[0]
    out = np.full(n, n, dtype=np.int32)
    open_nodes = np.empty(n + 1, dtype=np.int32)
    top = 0
    for i in range(n):
        while top > 0 and depth[open_nodes[top - 1]] >= depth[i]:
            top -= 1
            out[open_nodes[top]] = i
        open_nodes[top] = i
        top += 1
    return out


@njit(cache=True, nogil=True)
def walk_trie(node_byte, node_depth, node_next, tok_start, tok_end, tok_ids,
              trans, row_known, start, max_depth, mask, missing):
    """Mark in `mask` every token whose bytes the automaton accepts from state `start`.

    trans: int32 [n_states, 256] next state per byte (-1: rejected); rows are valid where
    row_known. A state reached whose row is not known yet goes into `missing` (its subtree is left
    unwalked); returns how many were recorded, so the caller builds those rows and walks again."""
    states = np.empty(max_depth + 1, dtype=np.int32)
    states[0] = start
    n = node_byte.shape[0]
    n_missing = 0
    i = 0
    while i < n:
        d = node_depth[i]
        s = trans[states[d - 1], node_byte[i]]
        if s < 0:
            i = node_next[i]
            continue
        for k in range(tok_start[i], tok_end[i]):
            mask[tok_ids[k]] = True
        if row_known[s]:
            states[d] = s
            i += 1
        else:
            if n_missing < missing.shape[0]:
                missing[n_missing] = s
                n_missing += 1
            i = node_next[i]
    return n_missing
