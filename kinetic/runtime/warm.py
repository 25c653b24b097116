"""Warm Start: the states earlier prompts left behind, and starting a new prompt from the longest
prefix it can return to exactly.

Owns: `WarmStore`, one model's store of prefix states (a state is the KV cache rows [0, n) of a token
prefix, every layer, with their positions), kept in memory up to `memory_bytes` (1 GiB; least
recently used out first) and, when a disk tier is given (kinetic/runtime/warm_disk.py's `DiskTier`),
written there too and looked up there on a memory miss; `model_key`, everything that changes the
rows (model file hash, graph hash, pipeline hash, device and its class, build, batch); and the two
moves a generation makes: `resume` (before a prompt: cut the sequence back to what it shares with the
prompt, then restore the longest stored grid-aligned prefix beyond that, when cheaper than computing
it: kinetic/runtime/warm_costs.py) and `keep` (after: store the sequence's state at its last grid point).
Does not own the passes, the chunking (speculative.prefill_steps), nor files and their format (the
disk tier), nor which slot runs what (scheduler.py).

Exactness, the grid: a prompt is cut into chunks that end at multiples of `engine.batch` counted from
position 0 (prefill_steps), warm or cold, and states are stored and restored only at those multiples,
so after a restore the rest of the prompt runs in exactly the chunks a cold run gives it. A state's
rows are what the run that stored it computed; a row's floats depend only on its token and the rows
before it (attention is causal, and batch invariance makes them independent of the pass it ran in,
decode passes included), so rows [0, n) of any stored run whose first n tokens are the prompt's are
the rows a cold prefill computes. A sequence a caller hands back (a slot's, a conversation's) is cut
back to exactly the prefix it shares with the prompt, as llama-server does, and continues on the grid.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import blake3
import numpy as np

from kinetic.runtime.warm_costs import DISK, MEMORY, RestoreCosts

if TYPE_CHECKING:
    from kinetic.ir.graph import Graph
    from kinetic.runtime.engine import Engine, Sequence
    from kinetic.runtime.kv_cache import KVCache

DEFAULT_MEMORY_BYTES = 1 << 30
log = logging.getLogger("kinetic.runtime")


class DiskStates(Protocol):
    """What Warm Start needs of a disk tier (kinetic/runtime/warm_disk.py's DiskTier)."""

    enabled: bool

    def put(self, key: str, arrays: dict[str, np.ndarray]) -> None: ...

    def get(self, key: str) -> dict[str, np.ndarray] | None: ...


def grid_floor(n: int, batch: int) -> int:
    """The last grid point at or before n (chunks end at multiples of batch from position 0)."""
    return n // batch * batch


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two i32 arrays share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def model_key(*, model_file: Path, graph: Graph, device: str, batch: int) -> str:
    """Everything that changes a state's rows: the model file's BLAKE3, the compiled graph (its text
    holds rope overrides, the cache type and each reduction's order), the pass pipeline's hash, the
    device and its class (the CPU's kernel variant), the build (kernel generators and their compilers)
    and the batch (the grid)."""
    from kinetic.ir.text import print_graph
    from kinetic.passes.pipeline import pipeline_hash
    from kinetic.receipts.hashing import build_hash, file_blake3
    from kinetic.receipts.receipt import device_class_of

    try:
        device_class = device_class_of(device)
    except ValueError:  # a GPU: its runner's name decides (kernels are generated per device)
        device_class = device
    facts = [file_blake3(model_file), hashlib.sha256(print_graph(graph).encode()).hexdigest(), pipeline_hash(),
             device, device_class, build_hash(), str(batch)]
    return blake3.blake3("\n".join(facts).encode()).hexdigest()


@dataclass
class State:
    """KV cache rows [0, n) of the token prefix `tokens` (i32 [n]): per layer keys and values
    [n, width] in the cache dtype, and each row's position."""

    tokens: np.ndarray
    positions: np.ndarray
    k: dict[int, np.ndarray]
    v: dict[int, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k.values()) + sum(a.nbytes for a in self.v.values())

    def bytes_per_row(self) -> int:
        return self.nbytes // max(len(self.tokens), 1)

    @staticmethod
    def copied(cache: KVCache, tokens: np.ndarray) -> State:
        n = len(tokens)
        return State(tokens.copy(), cache.positions[:n].copy(), {layer: k[:n].copy() for layer, k in cache.k.items()},
                     {layer: v[:n].copy() for layer, v in cache.v.items()})

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"tokens": self.tokens, "positions": self.positions}
        out.update({f"k{layer}": k for layer, k in self.k.items()})
        out.update({f"v{layer}": v for layer, v in self.v.items()})
        return out

    @staticmethod
    def from_arrays(arrays: dict[str, np.ndarray], widths: dict[int, int], dtype) -> State | None:
        """The state a disk entry holds, or None when its arrays do not fit this engine's cache."""
        tokens, positions = arrays.get("tokens"), arrays.get("positions")
        if tokens is None or positions is None or tokens.ndim != 1 or positions.shape != tokens.shape:
            return None
        n, k, v = len(tokens), {}, {}
        for layer, width in widths.items():
            for name, into in (("k", k), ("v", v)):
                a = arrays.get(f"{name}{layer}")
                if a is None or a.shape != (n, width) or a.dtype != np.dtype(dtype):
                    return None
                into[layer] = a
        if len(arrays) != 2 + 2 * len(widths):
            return None
        return State(tokens.astype(np.int32), positions.astype(np.int32), k, v)


class WarmStore:
    """One model's prefix states (see the module docstring). Safe to use from several threads."""

    def __init__(self, key: str | Callable[[], str], *, batch: int, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 disk: DiskStates | None = None):
        """`key`: model_key()'s answer, or a function giving it (called once, on the first use of the
        disk: hashing a large model file takes a moment)."""
        self._key = key
        self.batch = batch
        self.memory_bytes = memory_bytes
        self.disk = disk
        self.costs = RestoreCosts()
        self._states: OrderedDict[int, State] = OrderedDict()  # least recently used first
        self._serial = 0
        self._lock = threading.Lock()

    @property
    def memory_used(self) -> int:
        with self._lock:
            return sum(s.nbytes for s in self._states.values())

    def __len__(self) -> int:
        return len(self._states)

    # -- before a prompt ----------------------------------------------------------------------------

    def resume(self, engine: Engine, seq: Sequence, ids: list[int]) -> int:
        """Cut `seq` back to the prefix it shares with `ids`, then restore the longest stored
        grid-aligned prefix beyond that when it is cheaper than computing it. At least one prompt
        token is left to run. Returns the prompt tokens the sequence now holds."""
        prompt = np.asarray(ids, np.int32)
        limit = len(prompt) - 1  # the last prompt token runs: its logits start the answer
        held = min(common_prefix(np.asarray(seq.tokens, np.int32), prompt), limit)
        engine.rollback(seq, held)
        if grid_floor(limit, self.batch) <= held or _recurrent(engine):
            return held
        state, n = self._from_memory(prompt, limit)
        if n > held:
            if self.costs.worth(MEMORY, n - held, (n - held) * state.bytes_per_row()):
                self._restore(seq, state, held, n, MEMORY)
                return n
            return held  # the disk is no faster than memory
        state, n = self._from_disk(prompt, limit, above=held, engine=engine)
        if n > held:
            self._restore(seq, state, held, n, MEMORY)
            return n
        return held

    def _from_memory(self, prompt: np.ndarray, limit: int) -> tuple[State | None, int]:
        """The stored state reaching furthest into the prompt and the grid point it reaches."""
        best, best_n = None, 0
        with self._lock:
            for serial, state in self._states.items():
                n = grid_floor(min(common_prefix(state.tokens, prompt), limit), self.batch)
                if n > best_n:
                    best, best_n, best_serial = state, n, serial
            if best is not None:
                self._states.move_to_end(best_serial)
        return best, best_n

    def _from_disk(self, prompt: np.ndarray, limit: int, *, above: int,
                   engine: Engine) -> tuple[State | None, int]:
        """A state from the disk tier reaching the furthest grid point above `above`, and that grid
        point; it joins the memory tier. Reads teach the disk's speed."""
        if not self._disk_ready():
            return None, 0
        row_bytes = 2 * sum(engine.kv_width.values()) * np.dtype(engine.kv_dtype).itemsize
        for g in range(grid_floor(limit, self.batch), above, -self.batch):
            if not self.costs.worth(DISK, g - above, g * row_bytes):  # a file holds rows [0, g) at least
                return None, 0
            began = time.perf_counter()
            state = self._read(self._disk_key(prompt[:g]), engine)
            if state is None or common_prefix(state.tokens, prompt) < g:
                continue
            self.costs.observe_restore(DISK, state.nbytes, time.perf_counter() - began)
            self._remember(state)
            return state, grid_floor(min(common_prefix(state.tokens, prompt), limit), self.batch)
        return None, 0

    def _read(self, key: str, engine: Engine) -> State | None:
        arrays = self.disk.get(key)
        if arrays is not None and set(arrays) == {"state"}:  # a grid point inside a longer stored state
            target = arrays["state"]
            arrays = self.disk.get(target.tobytes().decode("ascii", "replace")) if target.dtype == np.uint8 else None
        if arrays is None:
            return None
        return State.from_arrays(arrays, engine.kv_width, engine.kv_dtype)

    def _restore(self, seq: Sequence, state: State, held: int, n: int, tier: str) -> None:
        """Append rows [held, n) of `state` to the sequence (a host write: device copies follow)."""
        began = time.perf_counter()
        new_kv = {layer: (state.k[layer][held:n], state.v[layer][held:n]) for layer in state.k}
        seq.cache.commit(new_kv, np.arange(n - held), state.positions[held:n])
        recurrent = getattr(seq.cache, "recurrent", None)
        if recurrent is not None:  # a model without recurrent layers: its (empty) state only counts tokens
            recurrent.commit({}, np.arange(n - held))
        seq.tokens.extend(int(t) for t in state.tokens[held:n])
        self.costs.observe_restore(tier, (n - held) * state.bytes_per_row(), time.perf_counter() - began)

    # -- after a prompt -----------------------------------------------------------------------------

    def keep(self, engine: Engine, seq: Sequence) -> None:
        """Store the sequence's state at its last grid point (unless a stored state holds it already)."""
        if _recurrent(engine):
            return
        tokens = np.asarray(seq.tokens[:seq.cache.length], np.int32)
        n = grid_floor(len(tokens), self.batch)
        if n == 0:
            return
        with self._lock:
            for serial, state in self._states.items():
                if len(state.tokens) >= n and common_prefix(state.tokens, tokens) >= n:
                    self._states.move_to_end(serial)
                    return
        state = State.copied(seq.cache, tokens[:n])
        self._remember(state)
        if self._disk_ready():
            self._write(state)

    def _remember(self, state: State) -> None:
        """Add a state to the memory tier: the states it extends go, then the least recently used
        while the tier holds more than its bound (a state larger than the bound is not kept)."""
        if state.nbytes > self.memory_bytes:
            return
        with self._lock:
            for serial in [s for s, old in self._states.items()
                           if common_prefix(old.tokens, state.tokens) == len(old.tokens)]:
                del self._states[serial]
            self._serial += 1
            self._states[self._serial] = state
            used = sum(s.nbytes for s in self._states.values())
            while used > self.memory_bytes:
                _, dropped = self._states.popitem(last=False)
                used -= dropped.nbytes

    def _write(self, state: State) -> None:
        """The state under its own key, and at each grid point inside it a pointer to it, so a prompt
        that shares only part of it finds it after a restart."""
        key = self._disk_key(state.tokens)
        self.disk.put(key, state.arrays())
        pointer = {"state": np.frombuffer(key.encode("ascii"), np.uint8)}
        for g in range(self.batch, len(state.tokens), self.batch):
            self.disk.put(self._disk_key(state.tokens[:g]), pointer)

    @property
    def key(self) -> str:
        if callable(self._key):
            self._key = self._key()
        return self._key

    def _disk_ready(self) -> bool:
        """The disk tier is on and the key is known (a model file that cannot be read to hash it turns
        the disk tier off with one warning; the memory tier goes on)."""
        if self.disk is None or not self.disk.enabled:
            return False
        try:
            _ = self.key
        except OSError as e:
            log.warning("Warm Start keeps states in memory only: cannot hash the model file (%s)", e)
            self.disk = None
            return False
        return True

    def _disk_key(self, tokens: np.ndarray) -> str:
        return blake3.blake3(self.key.encode() + np.asarray(tokens, "<i4").tobytes()).hexdigest()


def _recurrent(engine: Engine) -> bool:
    """The model has recurrent layers, whose states cannot be cut back to a grid point: Warm Start
    stores and restores nothing for it until it keeps their snapshots (a held sequence is still cut
    back, exactly, by Engine.rollback)."""
    return bool(getattr(engine, "recurrent_shapes", None))
