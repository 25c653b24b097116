"""Buffer liveness planning, written once for every device: which of a pass's values share a buffer.

Owns: `Value` (one value a pass writes: a key, its size in bytes, the position of its writer and the
position of its last reader) and `plan_buffers(values) -> BufferPlan` (each value's buffer and each
buffer's size). Pure: no device, no allocation. Does not own what a position is (the Vulkan runner
counts graph nodes, CUDA's plans positions in the graph's order, the CPU tape phases), which values
a device plans (per-pass inputs the host writes, weights and the KV cache stay out), nor
allocating: a device allocates `plan.sizes` its own way (one buffer each, or one arena at
`plan.offsets()`).

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

import bisect
import heapq
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import NamedTuple


class _ValueFields(NamedTuple):
    key: Hashable
    nbytes: int
    first: int
    last: int | None


class Value(_ValueFields):
    """One value of a pass: `nbytes` written at position `first`, last read at `last` (None: read after
    the pass, so live to its end). A named tuple: a device makes one per value per pass shape, and
    a frozen dataclass costs three times as much to build."""

    __slots__ = ()

    def __new__(cls, key: Hashable, nbytes: int, first: int, last: int | None):
        if nbytes < 0:
            raise ValueError(f"value {key!r}: negative size {nbytes}")
        if last is not None and last < first:
            raise ValueError(f"value {key!r}: last read at {last}, before its writer at {first}")
        return tuple.__new__(cls, (key, nbytes, first, last))


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
    rounded up to a multiple of `align` first.

    The free buffers are kept as a list of (size, freed at, index) sorted ascending, so the choice is
    a bisection: the first entry of at least `need` bytes is the smallest that holds it (the one free
    the longest among equals), and the first entry of the largest size is the one to grow."""
    values = list(values)
    keys = [v.key for v in values]
    if len(set(keys)) != len(keys):
        raise ValueError("plan_buffers: two values share a key")
    firsts = [v.first for v in values]
    order = sorted(range(len(values)), key=firsts.__getitem__)  # stable: ties keep the order given
    sizes: list[int] = []
    buffer_of: dict[Hashable, int] = {}
    busy: list[tuple[float, int]] = []  # (last position read, buffer) of the live values
    free: list[tuple[int, float, int]] = []  # (size, position its last value was last read at, buffer)
    heappush, heappop, insort, bisect_left = heapq.heappush, heapq.heappop, bisect.insort, bisect.bisect_left
    never = float("inf")
    for i in order:
        key, nbytes, first, last = values[i]
        while busy and busy[0][0] < first:
            freed_at, buffer = heappop(busy)
            insort(free, (sizes[buffer], freed_at, buffer))
        need = -(-nbytes // align) * align
        if free:
            at = bisect_left(free, (need,))  # the smallest that holds it
            if at == len(free):  # none does: the largest, grown
                at = bisect_left(free, (free[-1][0],))
            buffer = free.pop(at)[2]
            if sizes[buffer] < need:
                sizes[buffer] = need
        else:
            buffer = len(sizes)
            sizes.append(need)
        buffer_of[key] = buffer
        heappush(busy, (never if last is None else last, buffer))
    return BufferPlan(buffer_of, tuple(sizes))
