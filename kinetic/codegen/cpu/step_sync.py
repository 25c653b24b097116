"""How the compiled step's threads share a phase of the tape: shares claimed by whoever runs, and a
wait for the phase's end that sleeps instead of spinning when it lasts.

Owns: the phase counters' layout and the three operations on them the driver (step_ops.drive) calls
per phase: `claim` (the next unclaimed share), `finish` (a share done; the last one wakes sleepers)
and `wait_done` (until every share is done: a short spin, then a futex sleep). Does not own the
counters' memory or their reset per pass (step_threads.PhaseCounters), nor what a share computes.

Why not a barrier: a barrier waits for every thread to arrive, so when another process keeps one of
them off its core, the others wait for it to be scheduled again at every phase (a 2-thread decode
collapsed to a tenth of its speed beside one busy process per core). Here a phase ends when its
shares are done, whoever did them: a thread that is not running is waited for only if it holds an
unfinished share, and the threads that wait sleep (futex), giving the core back and, having used
less than their share of CPU, getting it back as soon as they are woken. Which thread runs a share
never changes what it computes: every share is the same rows or columns as before, each with the
same instruction sequence (the step's exactness does not depend on who runs what).

Layout, per phase: three int64 a cache line apart: claimed shares, done shares (both tagged with
the pass's epoch in the upper 32 bits, so a thread late for a pass that has ended finds another
epoch and leaves), and sleepers (threads in a futex wait on the done word).
"""

from __future__ import annotations

from numba import njit

from kinetic.codegen.cpu.native import (
    FUTEX_WAIT,
    FUTEX_WAKE,
    atomic_add,
    atomic_cas,
    atomic_load,
    call_kernel,
    call_void,
    cycles,
    spin_pause,
)

SYNC_WORDS = 24  # int64 words per phase: claimed at 0, done at 8, sleepers at 16 (a cache line apart)
SYNC_STRIDE = 8 * SYNC_WORDS  # bytes
DONE, SLEEPERS = 64, 128  # byte offsets within a phase's counters
LATE = -2  # claim: the counters belong to a later pass
NONE_LEFT = -1  # claim: every share of the phase is taken
COUNT = (1 << 32) - 1
SPIN_CYCLES = 60_000  # ~25 us at 2.5 GHz: longer than a quiet machine's waits, short beside a time slice
WAKE_ALL = (1 << 31) - 1
# waits: int64 [syscall() address or 0, futex's syscall number, a timespec's address, sched_yield's address or 0]


@njit(cache=True, inline="always")
def claim(counters, epoch, shares):
    """The next unclaimed share of the phase (0..shares-1), NONE_LEFT, or LATE."""
    tag = epoch << 32
    while True:
        v = atomic_load(counters)
        if v - (v & COUNT) != tag:
            return LATE
        taken = v & COUNT
        if taken >= shares:
            return NONE_LEFT
        if atomic_cas(counters, v, v + 1):
            return taken


@njit(cache=True, inline="always")
def finish(counters, shares, waits):
    """One share done; the last one wakes the threads sleeping on the phase."""
    old = atomic_add(counters + DONE, 1)
    if (old & COUNT) + 1 == shares and atomic_load(counters + SLEEPERS) > 0 and waits[0] != 0:
        call_kernel(waits[0], waits[1], counters + DONE, FUTEX_WAKE, WAKE_ALL, 0, 0, 0)


@njit(cache=True, inline="always")
def wait_done(counters, epoch, shares, waits):
    """Until every share of the phase is done: the cycles waited, or -1 if the pass has ended (the
    counters carry a later epoch). Spins SPIN_CYCLES, then sleeps on the done word (futex, at most
    1 ms at a time), or yields where there is no futex."""
    done = counters + DONE
    tag = epoch << 32
    if atomic_load(done) == tag + shares:
        return 0
    start = cycles()
    while True:
        v = atomic_load(done)
        if v - (v & COUNT) != tag:
            return -1
        if (v & COUNT) >= shares:
            return cycles() - start
        if cycles() - start < SPIN_CYCLES or (waits[0] == 0 and waits[3] == 0):
            spin_pause()
        elif waits[0] == 0:
            call_void(waits[3])
        else:
            # registered before the recheck: a finisher that misses this sleeper has already
            # changed the word, so the futex call returns at once (it sleeps only while the word is v)
            atomic_add(counters + SLEEPERS, 1)
            if atomic_load(done) == v:
                call_kernel(waits[0], waits[1], done, FUTEX_WAIT, v & COUNT, waits[2], 0, 0)
            atomic_add(counters + SLEEPERS, -1)
