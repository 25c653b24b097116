"""Matching a grammar token by token: the allowed-token mask, advancing, completion, snapshots.

Owns: the parse state and the masks. A parse state is a set of grammar stacks, as in llama.cpp (each
stack: the positions still to match, innermost rule on top); after every byte each stack's top is a
terminal (a byte set or a token). Stacks are hash-consed (a stack node is (position, parent node)),
and each distinct set of stacks is numbered once, so a state is one int and the matcher is a
deterministic automaton over those ints, built lazily: the successor of a state on a byte is
computed the first time it is needed and kept in a table. A mask then walks the vocabulary's byte
trie (vocab.py) through that table in compiled code; snapshot and restore are copying an int.
Does not own: parsing or lowering grammars (gbnf.py, compile.py), sampling (the runtime applies
the mask with `apply_mask`).

End-of-generation tokens are allowed exactly when the grammar is complete (some stack is empty);
they never match text. A GrammarMatcher is shared by every sequence of one grammar and vocabulary
(thread-safe); a GrammarState is one sequence's position in it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from kinetic.grammar.compile import BYTES, END, NOT_TOKEN, RULE, TOKEN, Program, compile_grammar
from kinetic.grammar.gbnf_ast import Grammar, GrammarError
from kinetic.grammar.vocab import TokenVocab, walk_trie

ACCEPT = 0      # the stack node standing for the empty stack: the grammar is complete
DEAD = -1       # no state: the input was rejected
_MASK_CACHE = 4096  # masks kept per matcher (6 KiB each for a 49k vocabulary)
_MISSING = 4096


class GrammarMatcher:
    """A compiled grammar over one vocabulary; `start()` gives a fresh GrammarState."""

    def __init__(self, grammar: Grammar, vocab: TokenVocab):
        self.grammar = grammar
        self.vocab = vocab
        self.program: Program = compile_grammar(grammar, vocab.resolve)
        p = self.program
        self._kinds, self._args, self._alts = p.kinds, p.args, p.alternatives
        self._bytesets = np.array([[(m >> b) & 1 for b in range(256)] for m in p.bytesets], dtype=bool)
        self._lock = threading.RLock()
        # stack nodes: node 0 is the empty stack
        self._node_pos: list[int] = [-1]
        self._node_parent: list[int] = [-1]
        self._node_ids: dict[tuple[int, int], int] = {}
        self._closure: dict[int, frozenset[int]] = {}
        self._successors: dict[int, frozenset[int]] = {}
        # automaton states
        self._state_ids: dict[frozenset[int], int] = {}
        self._state_nodes: list[frozenset[int]] = []
        self._token_nodes: list[tuple[int, ...]] = []
        self._trans = np.full((64, 256), DEAD, dtype=np.int32)
        self._row_known = np.zeros(64, dtype=bool)
        self._complete = np.zeros(64, dtype=bool)
        self._masks: OrderedDict[int, np.ndarray] = OrderedDict()
        roots = [ACCEPT if self._kinds[s] == END else self._node(s, ACCEPT) for s in self._alts[p.root]]
        self.initial = self._state(frozenset().union(*(self._expand(n) for n in roots)))

    def start(self) -> GrammarState:
        return GrammarState(self, self.initial)

    @property
    def n_states(self) -> int:
        return len(self._state_nodes)

    # -- stacks ----------------------------------------------------------------------------------

    def _node(self, pos: int, parent: int) -> int:
        key = (pos, parent)
        node = self._node_ids.get(key)
        if node is None:
            node = self._node_ids[key] = len(self._node_pos)
            self._node_pos.append(pos)
            self._node_parent.append(parent)
        return node

    def _expand(self, node: int) -> frozenset[int]:
        """Every stack `node` turns into once rule references on top are replaced by their
        alternatives, until each top is a terminal (or the stack is empty)."""
        cached = self._closure.get(node)
        if cached is not None:
            return cached
        kinds, args = self._kinds, self._args
        out, seen, todo = set(), set(), [node]
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            pos = self._node_pos[n]
            if n == ACCEPT or kinds[pos] != RULE:
                out.add(n)
                continue
            parent = self._node_parent[n]
            rest = parent if kinds[pos + 1] == END else self._node(pos + 1, parent)
            for start in self._alts[args[pos]]:
                todo.append(rest if kinds[start] == END else self._node(start, rest))
        result = self._closure[node] = frozenset(out)
        return result

    def _after_terminal(self, node: int) -> frozenset[int]:
        """The stacks after the terminal on top of `node` matched."""
        result = self._successors.get(node)
        if result is None:
            pos, parent = self._node_pos[node], self._node_parent[node]
            nxt = parent if self._kinds[pos + 1] == END else self._node(pos + 1, parent)
            result = self._successors[node] = self._expand(nxt)
        return result

    # -- automaton states ------------------------------------------------------------------------

    def _state(self, nodes: frozenset[int]) -> int:
        if not nodes:
            return DEAD
        state = self._state_ids.get(nodes)
        if state is not None:
            return state
        state = self._state_ids[nodes] = len(self._state_nodes)
        self._state_nodes.append(nodes)
        kinds = self._kinds
        self._token_nodes.append(tuple(n for n in nodes if n != ACCEPT and kinds[self._node_pos[n]] in
                                       (TOKEN, NOT_TOKEN)))
        if state >= len(self._row_known):
            grow = len(self._row_known)
            self._trans = np.concatenate([self._trans, np.full((grow, 256), DEAD, dtype=np.int32)])
            self._row_known = np.concatenate([self._row_known, np.zeros(grow, dtype=bool)])
            self._complete = np.concatenate([self._complete, np.zeros(grow, dtype=bool)])
        self._complete[state] = ACCEPT in nodes
        return state

    def _build_row(self, state: int) -> None:
        """The successor of `state` on every byte, grouping bytes that the same stacks accept."""
        if self._row_known[state]:
            return
        byte_nodes = [n for n in self._state_nodes[state]
                      if n != ACCEPT and self._kinds[self._node_pos[n]] == BYTES]
        row = np.full(256, DEAD, dtype=np.int32)
        if byte_nodes:
            accepts = self._bytesets[[self._args[self._node_pos[n]] for n in byte_nodes]]  # bool [k, 256]
            keys = np.packbits(accepts, axis=0).T.copy()  # which stacks accept each byte, as bits
            groups: dict[bytes, list[int]] = {}
            for b in range(256):
                groups.setdefault(keys[b].tobytes(), []).append(b)
            for bytes_of_group in groups.values():
                who = accepts[:, bytes_of_group[0]]
                if not who.any():
                    continue
                accepting = [n for n, ok in zip(byte_nodes, who, strict=True) if ok]
                nodes = frozenset().union(*(self._after_terminal(n) for n in accepting))
                row[bytes_of_group] = self._state(nodes)
        self._trans[state] = row
        self._row_known[state] = True

    # -- the operations a GrammarState uses ------------------------------------------------------

    def is_complete(self, state: int) -> bool:
        return state >= 0 and bool(self._complete[state])

    def next_state(self, state: int, token: int) -> int:
        """The state after `token`, or DEAD if the grammar rejects it. An end-of-generation token
        leaves a complete state unchanged."""
        if state < 0 or not 0 <= token < self.vocab.n_vocab:
            return DEAD
        if self.vocab.is_eog(token):
            return state if self._complete[state] else self._token_step(state, token)
        with self._lock:
            s = self._walk_bytes(state, self.vocab.pieces[token])
            return self._token_step(state, token, s)

    def _walk_bytes(self, state: int, piece: bytes) -> int:
        if not piece:
            return DEAD
        for b in piece:
            self._build_row(state)
            state = int(self._trans[state, b])
            if state < 0:
                return DEAD
        return state

    def _token_step(self, state: int, token: int, by_bytes: int = DEAD) -> int:
        """Add the stacks whose top is a token terminal matching `token` to `by_bytes`."""
        matched = [n for n in self._token_nodes[state] if self._token_matches(n, token)]
        if not matched:
            return by_bytes
        with self._lock:
            nodes = frozenset().union(*(self._after_terminal(n) for n in matched))
            if by_bytes >= 0:
                nodes = nodes | self._state_nodes[by_bytes]
            return self._state(nodes)

    def _token_matches(self, node: int, token: int) -> bool:
        pos = self._node_pos[node]
        if self._kinds[pos] == TOKEN:
            return self._args[pos] == token
        return self._args[pos] != token and not self.vocab.is_eog(token)

    def mask(self, state: int) -> np.ndarray:
        """bool [n_vocab]: the tokens the grammar allows next (a cached array: do not modify it)."""
        with self._lock:
            cached = self._masks.get(state)
            if cached is not None:
                self._masks.move_to_end(state)
                return cached
            mask = self._compute_mask(state)
            self._masks[state] = mask
            if len(self._masks) > _MASK_CACHE:
                self._masks.popitem(last=False)
        return mask

    def _compute_mask(self, state: int) -> np.ndarray:
        v = self.vocab
        mask = np.zeros(v.n_vocab, dtype=bool)
        if state < 0:
            return mask
        self._build_row(state)
        missing = np.empty(_MISSING, dtype=np.int32)
        while True:
            n_missing = walk_trie(v.node_byte, v.node_depth, v.node_next, v.node_tok_start, v.node_tok_end,
                                  v.tok_ids, self._trans, self._row_known, state, v.max_depth, mask, missing)
            if not n_missing:
                break
            for s in set(missing[:n_missing].tolist()):
                self._build_row(s)  # may grow the tables; the next walk sees the new arrays
        mask[v.eog_ids] = self._complete[state]
        for node in self._token_nodes[state]:
            pos = self._node_pos[node]
            if self._kinds[pos] == TOKEN:
                mask[self._args[pos]] = True
            else:  # any token but one, end of generation excepted
                eog, saved = mask[v.eog_ids].copy(), mask[self._args[pos]]
                mask[:] = True
                mask[self._args[pos]] = saved
                mask[v.eog_ids] = eog
        mask.flags.writeable = False
        return mask


class GrammarState:
    """One sequence's position in a grammar: `mask()`, `accept(token)`, `is_complete`,
    `snapshot()` / `restore(snap)`, `copy()`. Snapshots are plain ints, cheap to keep per drafted
    row."""

    __slots__ = ("matcher", "state")

    def __init__(self, matcher: GrammarMatcher, state: int):
        self.matcher = matcher
        self.state = state

    def mask(self) -> np.ndarray:
        """bool [n_vocab], read-only: True where the token may come next."""
        return self.matcher.mask(self.state)

    def can_accept(self, token: int) -> bool:
        return self.matcher.next_state(self.state, int(token)) != DEAD

    def accept(self, token: int) -> None:
        """Advance by `token`; a token the grammar does not allow raises GrammarError (the state is
        left as it was)."""
        nxt = self.matcher.next_state(self.state, int(token))
        if nxt == DEAD:
            piece = self.matcher.vocab.pieces[int(token)] if 0 <= int(token) < self.matcher.vocab.n_vocab else b""
            raise GrammarError(f"token {int(token)} ({piece!r}) is not allowed by the grammar here")
        self.state = nxt

    def accept_bytes(self, text: bytes) -> None:
        """Advance by raw bytes (text the prompt forced, tests); raises GrammarError if rejected."""
        with self.matcher._lock:
            nxt = self.matcher._walk_bytes(self.state, bytes(text)) if text else self.state
        if nxt == DEAD:
            raise GrammarError(f"text {bytes(text)!r} is not allowed by the grammar here")
        self.state = nxt

    @property
    def is_complete(self) -> bool:
        """The text so far is a whole match: end-of-generation tokens are allowed now."""
        return self.matcher.is_complete(self.state)

    @property
    def must_stop(self) -> bool:
        """Complete, and nothing but end of generation may follow."""
        return self.is_complete and int(self.mask().sum()) == len(self.matcher.vocab.eog_ids)

    def walk(self, tokens) -> list[int]:
        """The snapshot after each of `tokens` in turn (a drafted path), DEAD from the first one the
        grammar rejects; the state itself does not move."""
        out, state = [], self.state
        for token in tokens:
            state = self.matcher.next_state(state, int(token)) if state != DEAD else DEAD
            out.append(state)
        return out

    def snapshot(self) -> int:
        return self.state

    def restore(self, snapshot: int) -> None:
        self.state = int(snapshot)

    def copy(self) -> GrammarState:
        return GrammarState(self.matcher, self.state)
