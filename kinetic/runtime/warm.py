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
Does not own the passes, the chunking (Engine.prompt_steps), nor files and their format (the
disk tier), nor which slot runs what (scheduler.py). `State`, `model_key`, `grid_floor` and
`common_prefix` live in kinetic/runtime/warm_state.py and are imported from here too.

Exactness, the grid: a prompt is cut into chunks that end at multiples of `engine.batch` counted from
position 0 (Engine.prompt_steps), warm or cold, and states are stored and restored only at those multiples,
so after a restore the rest of the prompt runs in exactly the chunks a cold run gives it (a pass may
run several consecutive chunks, Engine.prompt_pass, but always ends at a grid point). A state's
rows are what the run that stored it computed; a row's floats depend only on its token and the rows
before it (attention is causal, and batch invariance makes them independent of the pass it ran in,
decode passes included), so rows [0, n) of any stored run whose first n tokens are the prompt's are
the rows a cold prefill computes. A sequence a caller hands back (a slot's, a conversation's) is cut
back to exactly the prefix it shares with the prompt, as llama-server does, and continues on the grid.

Recurrent models (lfm2, granitehybrid, falcon-h1): a recurrent state cannot be cut back, so a state
of theirs is a snapshot (kinetic/runtime/snapshots.py's contents: KV rows [0, n) and the recurrent
states after exactly n tokens) taken at snapshot points, multiples of `snapshot_every` (256 tokens,
or a larger multiple of the grid when the recurrent states are large next to the KV rows of the
stretch: warm_costs.snapshot_interval), from the sequence's checkpoints (kinetic/runtime/recurrent.py
copies the state when a commit reaches one). A snapshot is restored only whole, at its own n, and
only when that is beyond what the held sequence returns to for free (its latest checkpoint before
the shared prefix: Engine.rollback recomputes from there). The recurrent state at a grid point is the
same bits whichever run computed it (batch invariance), so warm = cold holds as for KV rows.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import blake3
import numpy as np

from kinetic.runtime.warm_costs import DISK, MEMORY, RestoreCosts, snapshot_interval
from kinetic.runtime.warm_state import State, common_prefix, grid_floor, model_key

if TYPE_CHECKING:
    from kinetic.runtime.engine import Engine, Sequence

__all__ = ["DEFAULT_MEMORY_BYTES", "DiskStates", "State", "WarmStore", "common_prefix", "grid_floor", "model_key"]

DEFAULT_MEMORY_BYTES = 1 << 30
log = logging.getLogger("kinetic.runtime")


class DiskStates(Protocol):
    """What Warm Start needs of a disk tier (kinetic/runtime/warm_disk.py's DiskTier)."""

    enabled: bool

    def put(self, key: str, arrays: dict[str, np.ndarray]) -> None: ...

    def get(self, key: str) -> dict[str, np.ndarray] | None: ...


class WarmStore:
    """One model's prefix states (see the module docstring). Safe to use from several threads."""

    def __init__(self, key: str | Callable[[], str], *, batch: int, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 disk: DiskStates | None = None, snapshot_tokens: int | None = None):
        """`key`: model_key()'s answer, or a function giving it (called once, on the first use of the
        disk: hashing a large model file takes a moment). `snapshot_tokens`: tokens between a
        recurrent model's snapshots (None: snapshot_every's rule)."""
        self._key = key
        self.batch = batch
        self.memory_bytes = memory_bytes
        self.disk = disk
        self.snapshot_tokens = snapshot_tokens
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
        """Cut `seq` back to the prefix it shares with `ids`, or restore the longest stored state
        reaching further than the sequence can return to for free, when that is cheaper than computing
        its tokens. At least one prompt token is left to run. Returns the prompt tokens the sequence
        now holds."""
        prompt = np.asarray(ids, np.int32)
        limit = len(prompt) - 1  # the last prompt token runs: its logits start the answer
        shared = min(common_prefix(np.asarray(seq.tokens, np.int32), prompt), limit)
        free = self._free_point(engine, seq, shared)
        state, n, tier = self._stored(engine, prompt, limit, above=free)
        kept = min(shared, n)  # the sequence's rows that are the state's too
        if state is not None and (tier == DISK or self.costs.worth(MEMORY, n - free, state.restore_bytes(kept, n))):
            self._restore(engine, seq, state, kept, n, MEMORY)
            return n
        engine.rollback(seq, shared)
        return shared

    def _free_point(self, engine: Engine, seq: Sequence, shared: int) -> int:
        """How far the sequence returns to without computing: all it shares with the prompt, or for a
        recurrent model cut back, its latest checkpoint (Engine.rollback computes from there)."""
        recurrent = seq.cache.recurrent
        if not _recurrent(engine):
            return shared
        every = self.snapshot_every(engine)
        if every % recurrent.checkpoint_every:  # checkpoints fall on every snapshot point
            recurrent.checkpoint_every = math.gcd(recurrent.checkpoint_every, every)
        if shared == len(seq.tokens):
            return shared
        return max((n for n in recurrent.checkpoints if n <= shared), default=0)

    def _stored(self, engine: Engine, prompt: np.ndarray, limit: int, *,
                above: int) -> tuple[State | None, int, str]:
        """The stored state reaching the furthest point beyond `above` (memory first, then the
        disk), that point and its tier; (None, 0, "") when none does."""
        step = self.snapshot_every(engine) if _recurrent(engine) else self.batch
        if grid_floor(limit, step) <= above:
            return None, 0, ""
        state, n = self._from_memory(prompt, limit)
        if n > above:
            return state, n, MEMORY
        state, n = self._from_disk(prompt, limit, above=above, step=step, engine=engine)
        return (state, n, DISK) if n > above else (None, 0, "")

    def _reach(self, state: State, prompt: np.ndarray, limit: int) -> int:
        """The grid point a state restores the prompt to (0: none). A recurrent snapshot restores only
        to its own length, a KV state to any grid point inside it."""
        shared = common_prefix(state.tokens, prompt)
        if state.recurrent:
            return len(state.tokens) if shared == len(state.tokens) <= limit else 0
        return grid_floor(min(shared, limit), self.batch)

    def _from_memory(self, prompt: np.ndarray, limit: int) -> tuple[State | None, int]:
        """The stored state reaching furthest into the prompt and the grid point it reaches."""
        best, best_n = None, 0
        with self._lock:
            for serial, state in self._states.items():
                n = self._reach(state, prompt, limit)
                if n > best_n:
                    best, best_n, best_serial = state, n, serial
            if best is not None:
                self._states.move_to_end(best_serial)
        return best, best_n

    def _from_disk(self, prompt: np.ndarray, limit: int, *, above: int, step: int,
                   engine: Engine) -> tuple[State | None, int]:
        """A state from the disk tier reaching the furthest point (a multiple of `step`) above
        `above`, and that point; it joins the memory tier. Reads teach the disk's speed."""
        if not self._disk_ready():
            return None, 0
        row_bytes = 2 * sum(engine.kv_width.values()) * np.dtype(engine.kv_dtype).itemsize
        for g in range(grid_floor(limit, step), above, -step):
            if not self.costs.worth(DISK, g - above, g * row_bytes):  # a file holds rows [0, g) at least
                return None, 0
            began = time.perf_counter()
            state = self._read(self._disk_key(prompt[:g]), engine)
            if state is None or self._reach(state, prompt, limit) < g:
                continue
            self.costs.observe_restore(DISK, state.nbytes, time.perf_counter() - began)
            self._remember(state)
            return state, self._reach(state, prompt, limit)
        return None, 0

    def _read(self, key: str, engine: Engine) -> State | None:
        arrays = self.disk.get(key)
        if arrays is not None and set(arrays) == {"state"}:  # a grid point inside a longer stored state
            target = arrays["state"]
            arrays = self.disk.get(target.tobytes().decode("ascii", "replace")) if target.dtype == np.uint8 else None
        if arrays is None:
            return None
        return State.from_arrays(arrays, engine.kv_width, engine.kv_dtype, engine.recurrent_shapes or {})

    def _restore(self, engine: Engine, seq: Sequence, state: State, held: int, n: int, tier: str) -> None:
        """Make the sequence hold `state`'s first n tokens: its first `held` rows stay (they are the
        state's), rows [held, n) are appended (a host write: device copies follow) and a snapshot's
        recurrent states replace the sequence's."""
        began = time.perf_counter()
        if not _recurrent(engine):
            engine.rollback(seq, held)  # a KV cache is cut back without computing
        seq.cache.truncate(held)
        del seq.tokens[held:]
        new_kv = {layer: (state.k[layer][held:n], state.v[layer][held:n]) for layer in state.k}
        seq.cache.commit(new_kv, np.arange(n - held), state.positions[held:n])
        if state.recurrent:
            seq.cache.recurrent.restore(state.recurrent, n)
        else:  # a model without recurrent layers: its (empty) state only counts tokens
            seq.cache.recurrent.commit({}, np.arange(n - held))
        seq.tokens.extend(int(t) for t in state.tokens[held:n])
        self.costs.observe_restore(tier, state.restore_bytes(held, n), time.perf_counter() - began)

    # -- after a prompt -----------------------------------------------------------------------------

    def keep(self, engine: Engine, seq: Sequence) -> None:
        """Store the sequence's state at its last grid point (unless a stored state holds it already);
        for a recurrent model, a snapshot at each snapshot point its checkpoints hold."""
        tokens = np.asarray(seq.tokens[:seq.cache.length], np.int32)
        if _recurrent(engine):
            every = self.snapshot_every(engine)
            for n, values in sorted(seq.cache.recurrent.checkpoints.items()):
                if 0 < n <= len(tokens) and n % every == 0 and not self._holds(tokens[:n], whole=True):
                    self._kept(State.copied(seq.cache, tokens[:n], values))
            return
        n = grid_floor(len(tokens), self.batch)
        if n > 0 and not self._holds(tokens[:n], whole=False):
            self._kept(State.copied(seq.cache, tokens[:n]))

    def _holds(self, tokens: np.ndarray, *, whole: bool) -> bool:
        """A stored state holds these tokens (`whole`: exactly them, as a snapshot must); it becomes
        the most recently used."""
        with self._lock:
            for serial, state in self._states.items():
                fits = len(state.tokens) == len(tokens) if whole else len(state.tokens) >= len(tokens)
                if fits and common_prefix(state.tokens, tokens) >= len(tokens):
                    self._states.move_to_end(serial)
                    return True
        return False

    def _kept(self, state: State) -> None:
        self._remember(state)
        if self._disk_ready():
            self._write(state)

    def _remember(self, state: State) -> None:
        """Add a state to the memory tier: the states it extends go (a KV state holds every shorter
        one; a snapshot replaces only its equal), then the least recently used while the tier holds
        more than its bound (a state larger than the bound is not kept)."""
        if state.nbytes > self.memory_bytes:
            return
        with self._lock:
            for serial in [s for s, old in self._states.items()
                           if common_prefix(old.tokens, state.tokens) == len(old.tokens)
                           and (not state.recurrent or len(old.tokens) == len(state.tokens))]:
                del self._states[serial]
            self._serial += 1
            self._states[self._serial] = state
            used = sum(s.nbytes for s in self._states.values())
            while used > self.memory_bytes:
                _, dropped = self._states.popitem(last=False)
                used -= dropped.nbytes

    def _write(self, state: State) -> None:
        """The state under its own key, and (a KV state) at each grid point inside it a pointer to
        it, so a prompt that shares only part of it finds it after a restart."""
        key = self._disk_key(state.tokens)
        self.disk.put(key, state.arrays())
        if state.recurrent:
            return
        pointer = {"state": np.frombuffer(key.encode("ascii"), np.uint8)}
        for g in range(self.batch, len(state.tokens), self.batch):
            self.disk.put(self._disk_key(state.tokens[:g]), pointer)

    def snapshot_every(self, engine: Engine) -> int:
        """Tokens between a recurrent model's stored snapshots (warm_costs.snapshot_interval), unless
        set (`snapshot_tokens`, a multiple of the batch)."""
        if self.snapshot_tokens is None:
            state_bytes = sum(rows * width * 4 for rows, width in engine.recurrent_shapes.values())
            row_bytes = 2 * sum(engine.kv_width.values()) * np.dtype(engine.kv_dtype).itemsize
            self.snapshot_tokens = snapshot_interval(state_bytes=state_bytes, row_bytes=row_bytes, batch=self.batch)
        return self.snapshot_tokens

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
    stores snapshots of them at snapshot points and restores one only whole."""
    return bool(getattr(engine, "recurrent_shapes", None))
