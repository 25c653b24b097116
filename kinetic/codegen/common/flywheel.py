"""Flywheel: where each routed expert of a mixture-of-experts layer runs (docs/moe.md).

Owns the placement decisions as plain code, with no device in it (it sits in codegen/common so that
the CUDA runner can ask it: no device imports the runtime): the GPU memory the experts get (what
is left after attention, shared weights and one sequence's cache, minus a reserve), the expert cache in
that memory (which experts are resident; eviction by decayed use frequency, then by least recent use),
the measured costs (CPU seconds per expert byte and row, copy seconds per byte, GPU seconds per byte
and row; each a moving average that keeps following new measurements, so a CPU slowed down by other
programs shifts work to copies), the decision per layer per token for each chosen expert (resident:
run on the GPU; else run on the CPU or copy it up, whichever costs less now), and the prefetch of the
experts a layer most likely picks next. Does not own moving bytes or running kernels (the CUDA runner
asks this module and reports what each step took), nor the arithmetic: an expert computes the same
bits wherever it runs, so placement never changes an answer.

The cost model is deliberately simple: a routed expert reads its whole matrices once per pass and
does work per row, so on a device it costs `bytes * seconds_per_byte * rows` (one row per token in
decode), and a copy costs `bytes * copy_seconds_per_byte` once, after which the expert runs on the GPU.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from kinetic.errors import KineticError


class Where(enum.Enum):
    GPU = "gpu"  # resident in the expert cache: runs there
    CPU = "cpu"  # runs on the CPU from the memory-mapped file
    COPY = "copy"  # copied into the cache now, then runs on the GPU


@dataclass(frozen=True)
class Budget:
    """GPU memory in bytes: all of it, what the rest of the model and one sequence's state take, and
    the reserve kept free (other programs, allocator slack)."""

    gpu_total: int
    fixed: int
    reserve: int

    @property
    def expert_cache(self) -> int:
        """Bytes the expert cache may hold."""
        return max(0, self.gpu_total - self.fixed - self.reserve)


@dataclass
class Rate:
    """A measured cost, seconds per unit, as an exponential moving average of the measurements."""

    seconds_per_unit: float
    weight: float = 0.25  # how much one new measurement moves the average

    def observe(self, seconds: float, units: float) -> None:
        if units > 0 and seconds >= 0:
            sample = seconds / units
            self.seconds_per_unit += self.weight * (sample - self.seconds_per_unit)


@dataclass
class Costs:
    """The three measured costs (initial guesses until the first measurements come in)."""

    cpu: Rate  # seconds per expert byte per row on the CPU
    copy: Rate  # seconds per byte from host memory into the GPU
    gpu: Rate  # seconds per expert byte per row on the GPU

    def run_cpu(self, nbytes: int, rows: int) -> float:
        return nbytes * rows * self.cpu.seconds_per_unit

    def run_copied(self, nbytes: int, rows: int) -> float:
        return nbytes * self.copy.seconds_per_unit + nbytes * rows * self.gpu.seconds_per_unit


@dataclass
class ExpertCache:
    """Which experts are resident on the GPU, within `capacity` bytes. An expert's score is its use
    count, halved every `half_life` expert uses (of any layer), so experts that stay popular stay
    resident and a stream of one-off experts evicts only each other; ties go to the least recently used."""

    capacity: int
    half_life: int = 64
    resident: dict[tuple[int, int], int] = field(default_factory=dict)  # (layer, expert) -> bytes
    score: dict[tuple[int, int], float] = field(default_factory=dict)
    last_use: dict[tuple[int, int], int] = field(default_factory=dict)
    clock: int = 0

    @property
    def used(self) -> int:
        return sum(self.resident.values())

    def touch(self, key: tuple[int, int]) -> None:
        """One use of an expert, resident or not (its score counts toward keeping it)."""
        self.clock += 1
        decay = 0.5 ** (1 / self.half_life)
        age = max(0, self.clock - self.last_use.get(key, self.clock))
        self.score[key] = self.score.get(key, 0.0) * decay ** age + 1
        self.last_use[key] = self.clock

    def value(self, key: tuple[int, int]) -> tuple[float, int]:
        """What keeping an expert is worth now: its decayed score, then its last use."""
        decay = 0.5 ** (1 / self.half_life)
        age = self.clock - self.last_use.get(key, 0)
        return self.score.get(key, 0.0) * decay ** age, self.last_use.get(key, 0)

    def make_room(self, key: tuple[int, int], nbytes: int, *,
                  pinned: set[tuple[int, int]]) -> list[tuple[int, int]] | None:
        """The experts to evict so that `key` fits (the least valuable first, never a pinned one, never
        one worth more than `key`); None when it cannot fit that way."""
        if nbytes > self.capacity:
            return None
        free = self.capacity - self.used
        victims: list[tuple[int, int]] = []
        candidates = sorted((k for k in self.resident if k not in pinned and k != key), key=self.value)
        for victim in candidates:
            if free >= nbytes:
                break
            if self.value(victim) >= self.value(key):
                return None
            victims.append(victim)
            free += self.resident[victim]
        return victims if free >= nbytes else None

    def insert(self, key: tuple[int, int], nbytes: int, victims: Iterable[tuple[int, int]]) -> None:
        for victim in victims:
            del self.resident[victim]
        self.resident[key] = nbytes


@dataclass
class Flywheel:
    """The placement of one model's experts: `expert_bytes[layer]` is one expert's size in that layer
    (its gate, up and down matrices), `n_expert` experts per MoE layer."""

    budget: Budget
    expert_bytes: dict[int, int]
    n_expert: int
    costs: Costs
    prefetch_per_layer: int = 2
    cache: ExpertCache = field(init=False)

    def __post_init__(self) -> None:
        if any(b <= 0 for b in self.expert_bytes.values()) or self.n_expert <= 0:
            raise KineticError("Flywheel needs experts of a positive size", "This is a bug; report it.")
        self.cache = ExpertCache(self.budget.expert_cache)
        if self.all_fit:  # every expert resident from the start: routing stays on the GPU
            for layer, nbytes in self.expert_bytes.items():
                for e in range(self.n_expert):
                    self.cache.resident[(layer, e)] = nbytes

    @property
    def total_expert_bytes(self) -> int:
        return sum(self.expert_bytes.values()) * self.n_expert

    @property
    def all_fit(self) -> bool:
        """Every expert fits in the cache: no offload, routing on the GPU, a step is one recorded graph."""
        return self.total_expert_bytes <= self.budget.expert_cache

    def place(self, layer: int, rows_per_expert: dict[int, int]) -> dict[int, Where]:
        """Where each expert the router chose in `layer` runs this pass (`rows_per_expert`: expert ->
        rows that chose it). Copies are made room for by eviction, never of an expert this layer uses."""
        nbytes = self.expert_bytes[layer]
        pinned = {(layer, e) for e in rows_per_expert}
        out: dict[int, Where] = {}
        for expert, rows in sorted(rows_per_expert.items(), key=lambda item: -item[1]):
            key = (layer, expert)
            self.cache.touch(key)
            if key in self.cache.resident:
                out[expert] = Where.GPU
                continue
            copying_pays = self.costs.run_copied(nbytes, rows) < self.costs.run_cpu(nbytes, rows)
            victims = self.cache.make_room(key, nbytes, pinned=pinned) if copying_pays else None
            if victims is None:
                out[expert] = Where.CPU
                continue
            self.cache.insert(key, nbytes, victims)
            out[expert] = Where.COPY
        return out

    def prefetch(self, layer: int) -> list[int]:
        """The experts of `layer` worth copying before it runs: its most used experts that are not
        resident and fit without evicting anything worth more; marks them resident (the runner copies
        them while the previous layer computes)."""
        if layer not in self.expert_bytes:
            return []
        nbytes = self.expert_bytes[layer]
        ranked = sorted(((layer, e) for e in range(self.n_expert) if (layer, e) in self.cache.score),
                        key=self.cache.value, reverse=True)
        chosen: list[int] = []
        for key in ranked[: self.prefetch_per_layer]:
            if key in self.cache.resident:
                continue
            victims = self.cache.make_room(key, nbytes, pinned=set())
            if victims is not None:
                self.cache.insert(key, nbytes, victims)
                chosen.append(key[1])
        return chosen

    def status(self) -> str:
        """The status line's words for how experts are placed."""
        if self.all_fit:
            return f"experts: all {len(self.expert_bytes) * self.n_expert} on the GPU"
        size = self.budget.expert_cache
        room = f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
        return (f"experts: {len(self.cache.resident)} of {len(self.expert_bytes) * self.n_expert} cached on the "
                f"GPU ({room}), the rest run on the CPU or are copied up")
