"""One forward pass as every runner sees it: the table of its rows, the caches they attend over, and
what the pass gives back.

Owns: `PassRows` (the row table), `visibility` (which cache entries and pass rows a row attends to),
the `KVView` / `SequenceKV` protocols (everything a runner may ask of the runtime's caches and
recurrent states, and no more) and `PassResult`. Does not own the caches themselves
(kinetic/runtime/kv_cache.py implements the protocols), nor what a pass computes (the interpreter
and the device runners).

A pass is a table of rows: each row is a token with its sequence, its position and its parent row in
this pass (-1: it follows the committed context of its sequence directly). A row's attention sees
the committed cache entries of its sequence plus its ancestors in the pass and itself, minus what a
sliding window excludes. A prompt chunk is the chain 0 <- 1 <- 2 ...; a draft tree is any forest;
several users are several chains with different sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass
class PassRows:
    tokens: np.ndarray  # i32 [T]
    positions: np.ndarray  # i32 [T]
    seqs: np.ndarray  # i32 [T]
    parents: np.ndarray  # i32 [T], -1 = attaches to the committed context
    output_rows: np.ndarray  # i32 [R], rows whose logits are wanted
    chain_seq: int = -1  # set by chain(): every row is this sequence's, each the child of the one before
    # the rows whose recurrent state after them the runtime may keep (PassResult.new_state); None: all
    # (a verify pass). A committing pass names each sequence's last row (kinetic/runtime/recurrent.py)
    state_rows: np.ndarray | None = None
    # an encoder's pass (non-causal attention, BERT): every row sees every row of its sequence in the
    # pass, whatever the parents say; such a pass is a sequence's whole text over an empty cache
    bidirectional: bool = False
    token_types: np.ndarray | None = None  # i32 [T], BERT's segment ids; None: all 0 ("sentence A")
    hidden: np.ndarray | None = None  # f32 [T, width], the `hidden.<width>` input (a prediction block's)

    @staticmethod
    def encoder(sequences: list[list[int]]) -> PassRows:
        """Several whole texts in one non-causal pass: text i is sequence i at positions 0.., every row
        an output (an embedding model's hidden state per token)."""
        lengths = [len(s) for s in sequences]
        starts = np.cumsum([0] + lengths[:-1])
        return PassRows(
            tokens=np.asarray([t for s in sequences for t in s], np.int32),
            positions=np.concatenate([np.arange(n) for n in lengths]).astype(np.int32),
            seqs=np.concatenate([np.full(n, i) for i, n in enumerate(lengths)]).astype(np.int32),
            parents=np.concatenate([np.arange(-1, n - 1) + np.where(np.arange(n) > 0, s, 0)
                                    for s, n in zip(starts, lengths, strict=True)]).astype(np.int32),
            output_rows=np.arange(sum(lengths), dtype=np.int32),
            bidirectional=True,
        )

    def input(self, name: str) -> np.ndarray:
        """The per-pass data an `input` node names (kinetic/ir/ops.py, InputAttrs)."""
        if name.startswith("hidden."):
            if self.hidden is None or self.hidden.shape != (len(self.tokens), int(name.removeprefix("hidden."))):
                raise ValueError(f"the pass brings no {name} rows (PassRows.hidden, one per row)")
            return self.hidden
        if name == "token_types":
            return self.token_types if self.token_types is not None else np.zeros(len(self.tokens), np.int32)
        return {"tokens": self.tokens, "positions": self.positions, "output_rows": self.output_rows}[name]

    def pass_sight(self) -> np.ndarray:
        """u8 [T, T]: 1 where row r sees pass row j (its ancestors and itself; in a bidirectional
        pass every row of its sequence)."""
        n = len(self.tokens)
        if self.bidirectional:
            return (self.seqs[:, None] == self.seqs[None, :]).astype(np.uint8)
        sight = np.zeros((n, n), np.uint8)
        for r in range(n):
            p = r
            while p >= 0:
                sight[r, p] = 1
                p = int(self.parents[p])
        return sight

    @staticmethod
    def chain(tokens, start_pos: int, seq: int = 0, outputs: str = "last") -> PassRows:
        """One sequence's consecutive tokens from position start_pos (a prompt chunk or one decode step);
        logits for all rows, the last one or none (a prompt chunk before the last)."""
        n = len(tokens)
        out = {"all": np.arange(n), "last": np.array([n - 1]), "none": np.zeros(0)}[outputs]
        return PassRows(
            tokens=np.asarray(tokens, np.int32),
            positions=np.arange(start_pos, start_pos + n, dtype=np.int32),
            seqs=np.full(n, seq, np.int32),
            parents=np.arange(-1, n - 1, dtype=np.int32),
            output_rows=out.astype(np.int32),
            chain_seq=seq,
        )

    def ancestors(self, row: int) -> list[int]:
        """The rows of this pass that `row` sees: its chain of parents, then itself (in a bidirectional
        pass, every row of its sequence, in order)."""
        if self.bidirectional:
            return [int(r) for r in np.flatnonzero(self.seqs == self.seqs[row])]
        chain = [row]
        while self.parents[chain[-1]] >= 0:
            chain.append(int(self.parents[chain[-1]]))
        return chain[::-1]


def visibility(rows: PassRows, mine: np.ndarray, committed_pos: np.ndarray, window: int) -> np.ndarray:
    """bool [len(mine), n_committed + len(mine)]: committed entries at or before the row's position
    (inside the window), and the row's ancestors in the pass with itself."""
    n_c = len(committed_pos)
    where = {int(r): i for i, r in enumerate(mine)}
    visible = np.zeros((len(mine), n_c + len(mine)), bool)
    for i, r in enumerate(mine):
        pos = rows.positions[r]
        seen_pos = committed_pos
        ok = seen_pos <= pos
        if window:
            ok &= seen_pos > pos - window
        visible[i, :n_c] = ok
        for anc in rows.ancestors(int(r)):
            j = where[anc]
            if not window or rows.positions[anc] > pos - window:
                visible[i, n_c + j] = True
    return visible


class SequenceKV(Protocol):
    """One sequence's cache as a device runner sees it: per layer keys and values [n_ctx, width] in
    the cache dtype, entries [0, length) committed. A runner that keeps a device copy follows the
    rows the host writes itself through `host_writes` / `host_written_from`
    (kinetic/codegen/common/kv_mirror.py); a runner that computes in place writes a pass's rows at
    slots length + i (`write_pass_rows`, or through `addresses`) and the runtime commits them."""

    n_ctx: int
    length: int  # committed entries
    positions: np.ndarray  # i32 [n_ctx]: the position of each entry ([0, length) meaningful)
    host_writes: int  # a count of the writes the host made itself (commit, a kept row moved down) ...
    host_written_from: int  # ... and the lowest slot the latest of them touched

    def layers(self) -> list[int]:
        """The layers the cache holds, in order."""

    def storage(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The layer's whole key and value arrays [n_ctx, width] (to copy from; never to commit)."""

    def addresses(self, layers: list[int]) -> np.ndarray:
        """int64 [len(layers), 2]: where each layer's keys and values start (compiled code reads and
        writes them in place); fixed for the cache's life."""

    def check_room(self, n: int) -> None:
        """Fail before a pass whose n new rows would not fit."""

    def write_pass_rows(self, new_kv: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Write a pass's keys and values [T, width] per layer at slots length + i without committing
        them."""


class KVView(Protocol):
    """The caches of the sequences a pass's rows belong to."""

    def committed(self, seq: int, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Keys [n, kv_width], values [n, kv_width] (in the cache dtype) and their positions [n]."""

    def sequence(self, seq: int) -> SequenceKV:
        """Sequence `seq`'s whole cache, for runners that read or write it in place."""

    def recurrent(self, seq: int, name: str) -> np.ndarray:
        """Sequence `seq`'s committed recurrent state `name`, f32 [rows, width]: the state after its
        last committed token (kinetic/runtime/recurrent.py; read only)."""


@dataclass
class PassResult:
    outputs: dict[str, np.ndarray]
    new_kv: dict[int, tuple[np.ndarray, np.ndarray]]  # layer -> (k, v) of every row, cache dtype
    # recurrent state name -> {pass row: f32 [rows, width]}: the state after each row of
    # rows.state_rows (every row when None), along the row's own path
    new_state: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)
