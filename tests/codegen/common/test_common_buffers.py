"""The one liveness planner (kinetic/codegen/common/buffers.py): values whose live ranges meet never
share a buffer, every buffer holds its values, and dead values' buffers serve again."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.common.buffers import BufferPlan, Value, plan_buffers


def random_values(seed: int, n: int = 60) -> list[Value]:
    rng = np.random.default_rng(seed)
    values = []
    for i in range(n):
        first = int(rng.integers(0, 40))
        last = None if rng.random() < 0.1 else first + int(rng.integers(0, 8))
        values.append(Value(("v", i), int(rng.integers(0, 5000)), first, last))
    return values


def live(value: Value, end: int) -> range:
    return range(value.first, (end if value.last is None else value.last) + 1)


def overlapping_pairs(values: list[Value]):
    end = max(v.first for v in values) + 1
    for i, a in enumerate(values):
        for b in values[i + 1 :]:
            if set(live(a, end)) & set(live(b, end)):
                yield a, b


@pytest.mark.parametrize("seed", range(20))
def test_values_live_at_once_never_share_a_buffer(seed):
    """For random live ranges (pass outputs among them), two values live at one position, the writer's
    and its last reader's included, get different buffers."""
    values = random_values(seed)
    plan = plan_buffers(values)
    for a, b in overlapping_pairs(values):
        assert plan.buffer_of[a.key] != plan.buffer_of[b.key], (a, b)


@pytest.mark.parametrize("seed", range(20))
def test_every_buffer_holds_its_values_and_the_total_is_bounded(seed):
    """Each buffer is at least as large as every value it holds; the total lies between the most bytes
    live at one position and one buffer per value."""
    values = random_values(seed)
    plan = plan_buffers(values)
    for v in values:
        assert plan.sizes[plan.buffer_of[v.key]] >= v.nbytes
    end = max(v.first for v in values) + 1
    peak = max(sum(v.nbytes for v in values if p in live(v, end)) for p in range(end + 1))
    assert peak <= plan.total <= sum(v.nbytes for v in values)


def test_a_chain_alternates_between_two_buffers():
    """A chain (each value read only by the next writer) needs two buffers, whatever its length: a
    value cannot share with the one it reads, and the one before that is dead."""
    values = [Value(i, 256, i, i + 1) for i in range(10)]
    plan = plan_buffers(values)
    assert plan.sizes == (256, 256)
    assert [plan.buffer_of[i] for i in range(10)] == [0, 1] * 5


def test_a_pass_output_keeps_its_buffer_to_the_end():
    """A value with no last reader (read back after the pass) is never given to a later value."""
    values = [Value("logits", 64, 0, None)] + [Value(i, 64, i, i) for i in range(1, 6)]
    plan = plan_buffers(values)
    assert all(plan.buffer_of[i] != plan.buffer_of["logits"] for i in range(1, 6))


def test_the_smallest_free_buffer_that_fits_is_taken_else_the_largest_grows():
    """Best fit: a value takes the smallest free buffer that holds it, and when none does, the largest
    free buffer grows to it rather than a new one being made."""
    values = [Value("big", 1000, 0, 0), Value("small", 100, 0, 0), Value("fits_small", 80, 1, 1),
              Value("mid", 500, 1, 1), Value("huge", 3000, 2, 2)]
    plan = plan_buffers(values)
    assert plan.buffer_of["fits_small"] == plan.buffer_of["small"]
    assert plan.buffer_of["mid"] == plan.buffer_of["big"]
    assert plan.buffer_of["huge"] == plan.buffer_of["big"]  # the larger of the two free ones, grown
    assert plan.sizes == (3000, 100)


def test_sizes_are_aligned_and_arena_offsets_do_not_overlap():
    """With `align`, every buffer's size is a multiple of it; offsets() lays the buffers end to end at
    aligned starts, each buffer inside the arena and clear of the next."""
    plan = plan_buffers(random_values(3), align=256)
    assert all(size % 256 == 0 for size in plan.sizes)
    starts, total = plan.offsets(align=256)
    for i, (start, size) in enumerate(zip(starts, plan.sizes, strict=True)):
        assert start % 256 == 0
        assert start + size <= (starts[i + 1] if i + 1 < len(starts) else total)


def test_the_plan_depends_only_on_the_values():
    """Planning the same values twice gives the same plan (devices cache a plan per pass shape)."""
    assert plan_buffers(random_values(5)) == plan_buffers(random_values(5))
    assert plan_buffers([]) == BufferPlan({}, ())


def test_inconsistent_values_are_refused():
    """A value read before it is written, a negative size, or two values with one key is an error."""
    with pytest.raises(ValueError, match="before its writer"):
        Value("x", 4, 3, 2)
    with pytest.raises(ValueError, match="negative"):
        Value("x", -1, 0, 0)
    with pytest.raises(ValueError, match="share a key"):
        plan_buffers([Value("x", 4, 0, 0), Value("x", 4, 1, 1)])


def reference_plan(values: list[Value], align: int = 1) -> BufferPlan:
    """The module docstring's rule written straight: at each value, scan every free buffer."""
    sizes: list[int] = []
    buffer_of = {}
    live: list[tuple[float, int]] = []  # (last read, buffer) of the values that hold a buffer
    free: dict[int, float] = {}  # buffer -> when its last value was last read
    for value in sorted(values, key=lambda v: v.first):  # stable: ties keep the order given
        for last, buffer in [x for x in live if x[0] < value.first]:
            live.remove((last, buffer))
            free[buffer] = last
        need = -(-value.nbytes // align) * align
        fits = [b for b in free if sizes[b] >= need]
        if fits:
            buffer = min(fits, key=lambda b: (sizes[b], free[b], b))
        elif free:
            buffer = min(free, key=lambda b: (-sizes[b], free[b], b))
        else:
            buffer = len(sizes)
            sizes.append(0)
        free.pop(buffer, None)
        sizes[buffer] = max(sizes[buffer], need)
        buffer_of[value.key] = buffer
        live.append((float("inf") if value.last is None else value.last, buffer))
    return BufferPlan(buffer_of, tuple(sizes))


def values_with_ties(seed: int, n: int = 300) -> list[Value]:
    """Few distinct sizes and positions, so equal sizes and equal free times meet often."""
    rng = np.random.default_rng(seed)
    values = []
    for i in range(n):
        first = int(rng.integers(0, 120))
        last = None if rng.random() < 0.05 else first + int(rng.integers(0, 12))
        values.append(Value(i, int(rng.choice([0, 64, 256, 300, 1024, 4096])), first, last))
    return values


@pytest.mark.parametrize("seed", range(40))
def test_the_planner_chooses_as_the_straightforward_scan(seed):
    """The bisecting planner gives exactly the plan of scanning every free buffer per value (same
    buffer per value, same sizes), with and without alignment, on random values with many ties."""
    for values in (random_values(seed), values_with_ties(seed)):
        for align in (1, 256):
            assert plan_buffers(values, align=align) == reference_plan(values, align=align)
