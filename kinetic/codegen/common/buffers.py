"""Buffer liveness planning, written once for every device: which of a pass's values share a buffer.

Owns: `Value` (one value a pass writes: a key, its size in bytes, the position of its writer and the
position of its last reader) and `plan_buffers(values) -> BufferPlan` (each value's buffer and each
buffer's size). Pure: no device, no allocation. Does not own what a position is (the Vulkan runner
counts graph nodes; a launch list works the same), which values a device plans (per-pass inputs the
host writes, weights and the KV cache stay out), nor allocating: a device allocates `plan.sizes` its
own way (one buffer each, or one arena at `plan.offsets()`).

Liveness. A value is live from its writer's position to its last reader's, both included; a value
whose `last` is None (a pass output read back after the pass) is live to the end. Two values share a
buffer only when their live ranges do not meet, so a value never shares with a value its own writer
reads (no in-place aliasing), and every byte a reader reads is still the writer's.

Choice (greedy, deterministic). In order of `first` (ties: the order given), a value takes, among the
buffers free at its position, the smallest that holds it; else the largest free one, grown to its
size; else a new buffer. Among buffers of one size it takes the one free the longest (its last
reader furthest back), so a reused buffer rarely makes its new writer wait for reads just before it
(a device orders a write after earlier reads of the same buffer: Vulkan's barriers). A buffer's size
is the largest value it holds. The total is at least the largest sum of sizes live at one position,
and at most the sum of all sizes (what a buffer per value costs).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Value:
    """One value of a pass: `nbytes` written at position `first`, last read at `last` (None: read after
    the pass, so live to its end)."""

    key: Hashable
    nbytes: int
    first: int
    last: int | None

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            raise ValueError(f"value {self.key!r}: negative size {self.nbytes}")
        if self.last is not None and self.last < self.first:
            raise ValueError(f"value {self.key!r}: last read at {self.last}, before its writer at {self.first}")


@dataclass(frozen=True)
class BufferPlan:
    """Each value's buffer (`buffer_of[key]`, an index into `sizes`) and each buffer's size in bytes."""

    buffer_of: dict[Hashable, int]
    sizes: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def offsets(self, align: int = 1) -> tuple[tuple[int, ...], int]:
        """The buffers laid end to end in one arena, each start a multiple of `align`: (each buffer's
        offset, the arena's size)."""
        starts, at = [], 0
        for size in self.sizes:
            starts.append(at)
            at += -(-size // align) * align
        return tuple(starts), at


def plan_buffers(values: Iterable[Value], align: int = 1) -> BufferPlan:
    """Buffers for `values`, reused once their value is dead (see the module docstring). Each size is
    rounded up to a multiple of `align` first."""
    values = list(values)
    keys = [v.key for v in values]
    if len(set(keys)) != len(keys):
        raise ValueError("plan_buffers: two values share a key")
    order = sorted(range(len(values)), key=lambda i: (values[i].first, i))
    sizes: list[int] = []
    buffer_of: dict[Hashable, int] = {}
    busy: list[tuple[float, int]] = []  # (last position read, buffer) of the live values
    free: dict[int, float] = {}  # buffer -> the position its last value was last read at
    for i in order:
        value = values[i]
        while busy and busy[0][0] < value.first:
            last, buffer = heapq.heappop(busy)
            free[buffer] = last
        need = -(-value.nbytes // align) * align
        buffer = _choose(free, sizes, need)
        if buffer is None:
            buffer = len(sizes)
            sizes.append(need)
        else:
            del free[buffer]
            sizes[buffer] = max(sizes[buffer], need)
        buffer_of[value.key] = buffer
        heapq.heappush(busy, (float("inf") if value.last is None else value.last, buffer))
    return BufferPlan(buffer_of, tuple(sizes))


def _choose(free: dict[int, float], sizes: list[int], need: int) -> int | None:
    """The smallest free buffer that holds `need` bytes, else the largest free one (to be grown), else
    None; among equal sizes the one free the longest, then the lower index."""
    fits = [b for b in free if sizes[b] >= need]
    if fits:
        return min(fits, key=lambda b: (sizes[b], free[b], b))
    if free:
        return min(free, key=lambda b: (-sizes[b], free[b], b))
    return None
