"""How the compiled step's threads share a phase of the tape: shares claimed by whoever runs, a
share whose holder is off its core run again by a waiting thread, and a wait for the phase's end
that sleeps instead of spinning when it lasts.

Owns: the phase counters' layout and the operations on them the driver (step_drive.drive) calls per
phase: `claim` (the next unclaimed share; `claim_rest`, every one left, for a thread that is
`alone`: no other `arrive`d at the two phases before), `stamp` (when its holder started it),
`commit` (which of the threads that ran a share is the one whose run counts), `finish` (a share
done; the last one wakes sleepers), `wait_or_steal` (until every share is done, or until a share is overdue and this
thread takes it over), and `enter` / `leave`, the count of threads working in a stealing tape's
arena. Does not own the counters' memory or their reset per stretch (step_threads.PhaseCounters),
what a share computes, nor which phases may be stolen (tape_plan.steal_flags).

Why not a barrier: a barrier waits for every thread to arrive, so when another process keeps one of
them off its core, the others wait for it to be scheduled again at every phase (a 2-thread decode
collapsed to a tenth of its speed beside one busy process per core). Here a phase ends when its
shares are done, whoever did them: a thread that is not running is waited for only if it holds an
unfinished share, and the threads that wait sleep (futex), giving the core back and, having used
less than their share of CPU, getting it back as soon as they are woken. Which thread runs a share
never changes what it computes: every share is the same rows or columns as before, each with the
same instruction sequence (the step's exactness does not depend on who runs what).

Stealing (phases the tape flags FLAG_STEAL, in the one-row tapes of step_steal.py): a share claimed
for much longer than the phase's shares take (its holder was preempted inside it) is run again by a
waiting thread. Both runs write the same bits to the same places (a share's computation is
deterministic, its inputs are never rewritten in that arena: the stealing tapes reuse no buffer),
so whichever finishes first simply `commit`s: a compare-and-swap on the share's epoch-tagged state
makes it the only one to run the phase's side effects (the KV-cache stores, FLAG_COMMIT) and to
count the share done. The other run's writes repeat bits already there; when it ends after its pass
has, it writes only into that pass's arena, which no pass reuses until every thread has left it
(`enter`/`leave` around every share, counted per arena; step_steal.StealTapes waits for zero).

Naps (a wait in a phase that may be stolen): a short spin (STEAL_SPIN_CYCLES, ~10 us: a quiet
machine's waits at a phase's end are a few us), then futex naps of ~20 us, each followed by a look
for an overdue share. Spinning on until a share is overdue (as before) cost most on a busy machine:
the thread waited for is then usually off its core, at times queued behind the spinner itself, and
the spin holds the core it needs; a nap hands the core over, and the thread that ends the phase
wakes the nappers. A thread's lateness after a nap holds nobody up: the other claims the shares it
finds unclaimed. Measured beside one busy process per core: docs/benchmarks.md, "decode under
load: naps".

Layout, per phase (int64 words): claimed shares at 0 and done shares at 8 (both tagged with the
stretch's epoch in the upper 32 bits, so a thread late for a stretch that has ended finds another
epoch and leaves), sleepers (threads in a futex wait on the done word) at 16, the phase's usual
share length in cycles at 17, the threads come to the phase at 18 (tagged too), then per share s
its state at 24 + 2s (epoch << 32, | 1 once committed) and the cycle its run started at 25 + 2s.

Alone (claim_rest): when no other thread has come to either of the two phases before, the others
are off their cores; the thread claims every share left of a phase that may be stolen and runs
each op once over their columns (step_ops.run_span: the same bits, one call instead of one a
share). A share-by-share claim then cost more CPU time a token (a call a share and op) and, on a
crowded machine, let a thread that was back for a moment claim a share and be preempted in it,
holding the phase up until it was overdue (`benchmarks/under_load.py --share-by-share` runs the
old rule beside). A thread that comes back finds the phase taken, waits for its end and shares the next.
"""

from __future__ import annotations

from numba import njit

from kinetic.codegen.cpu.native import (
    FUTEX_WAIT,
    FUTEX_WAKE,
    atomic_add,
    atomic_cas,
    atomic_load,
    atomic_store,
    call_kernel,
    call_void,
    cycles,
    spin_pause,
)

HEAD_WORDS = 24  # words per phase before the shares' words
DONE, SLEEPERS, USUAL, ARRIVED = 64, 128, 136, 144  # byte offsets within a phase's counters
SHARES = 8 * HEAD_WORDS  # byte offset of share 0's state; its start cycle follows it
LATE = -2  # claim / wait_or_steal: the counters belong to a later stretch
NONE_LEFT = -1  # claim: every share of the phase is taken; wait_or_steal: every share is done
COUNT = (1 << 32) - 1
SPIN_CYCLES = 60_000  # ~25 us at 2.5 GHz: longer than a quiet machine's waits, short beside a time slice
STEAL_SPIN_CYCLES = 26_000  # ~10 us: a wait that may steal spins this long, then naps (waits[5]; "Naps" above)
OVERDUE_FACTOR = 3  # a share is overdue once claimed this many usual share lengths ago ...
OVERDUE_CYCLES = 50_000  # ... plus this (~20 us): a preempted holder is gone for a time slice (ms)
WAKE_ALL = (1 << 31) - 1
# waits: int64 [syscall() address or 0, futex's syscall number, a timespec's address (1 ms),
#               sched_yield's address or 0, a short timespec's address (a nap while a share may be overdue),
#               the cycles a wait that may steal spins before it naps (STEAL_SPIN_CYCLES),
#               1 where a decode phase of small ops is one share (step_drive.phase_shares),
#               1 where a thread alone in a phase that may be stolen claims all its shares (claim_rest)]


def sync_words(threads: int) -> int:
    """int64 words per phase for `threads` shares (a multiple of 8: each phase on its own cache lines)."""
    return HEAD_WORDS + (2 * threads + 7) // 8 * 8


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
def claim_rest(counters, epoch, shares):
    """Every unclaimed share of the phase at once: the first of them (the rest follow it up to
    `shares`), NONE_LEFT, or LATE."""
    tag = epoch << 32
    while True:
        v = atomic_load(counters)
        if v - (v & COUNT) != tag:
            return LATE
        taken = v & COUNT
        if taken >= shares:
            return NONE_LEFT
        if atomic_cas(counters, v, tag + shares):
            return taken


@njit(cache=True, inline="always")
def arrive(counters):
    """This thread has come to the phase (counted whether or not it gets a share)."""
    atomic_add(counters + ARRIVED, 1)


@njit(cache=True, inline="always")
def alone(counters, stride, epoch, phase):
    """Whether no other thread came to either of the two phases before this one (`phase` of the
    stretch; `stride` bytes between phases' counters) by the time this thread has finished them:
    the others are off their cores (or far behind), so this thread may claim_rest. Two phases, not
    one: a thread woken from a nap at one phase's end comes to the next a little late."""
    if phase < 2:
        return False
    one = (epoch << 32) + 1
    return atomic_load(counters - stride + ARRIVED) == one and atomic_load(counters - 2 * stride + ARRIVED) == one


@njit(cache=True, inline="always")
def stamp_span(counters, share, end):
    """Record that this thread starts running shares share..end-1 now; returns the cycle."""
    now = cycles()
    for s in range(share, end):
        atomic_store(counters + SHARES + 16 * s + 8, now)
    return now


@njit(cache=True, inline="always")
def stamp(counters, share):
    """Record that this thread starts running `share` now; returns the cycle."""
    return stamp_span(counters, share, share + 1)


@njit(cache=True, inline="always")
def commit(counters, epoch, share):
    """True for the one thread whose run of `share` counts (the first to finish it this stretch)."""
    return atomic_cas(counters + SHARES + 16 * share, epoch << 32, (epoch << 32) | 1)


@njit(cache=True, inline="always")
def finish(counters, shares, waits, took):
    """One share done (finish_many of one)."""
    finish_many(counters, shares, waits, took, 1)


@njit(cache=True, inline="always")
def finish_many(counters, shares, waits, took, count):
    """`count` shares done (each took `took` cycles; 0: not measured); the last one wakes the
    threads sleeping on the phase. The phase's usual share length follows `took`, a slow run (a
    preempted one) raising it at most by an eighth."""
    if count <= 0:
        return
    if took > 0:
        usual = atomic_load(counters + USUAL)
        atomic_store(counters + USUAL, took if usual == 0 else (7 * usual + min(took, 2 * usual)) >> 3)
    old = atomic_add(counters + DONE, count)
    if (old & COUNT) + count == shares and atomic_load(counters + SLEEPERS) > 0 and waits[0] != 0:
        call_kernel(waits[0], waits[1], counters + DONE, FUTEX_WAKE, WAKE_ALL, 0, 0, 0)


@njit(cache=True, inline="always")
def enter(active):
    """This thread may write into the arena whose counter is at `active` (0: a tape without one)."""
    if active != 0:
        atomic_add(active, 1)


@njit(cache=True, inline="always")
def leave(active):
    if active != 0:
        atomic_add(active, -1)


@njit(cache=True, inline="always")
def overdue_after(counters):
    """Cycles after which a share of the phase counts as overdue: OVERDUE_FACTOR usual share
    lengths, plus OVERDUE_CYCLES."""
    return OVERDUE_FACTOR * atomic_load(counters + USUAL) + OVERDUE_CYCLES


@njit(cache=True, inline="always")
def committed(counters, epoch, share, end):
    """Whether a run of each of the shares share..end-1 has been counted this stretch (or the
    stretch is over)."""
    for s in range(share, end):
        if atomic_load(counters + SHARES + 16 * s) == epoch << 32:
            return False
    return True


@njit(cache=True, inline="always")
def _overdue(counters, epoch, shares, since, now, limit):
    """A share of the phase not yet committed whose run started (and which this thread has waited
    for) more than `limit` cycles ago, or -1; its start cycle second."""
    for s in range(shares):
        state = counters + SHARES + 16 * s
        if atomic_load(state) != epoch << 32:
            continue
        began = atomic_load(state + 8)
        if now - max(began, since) > limit:
            return s, began
    return -1, 0


@njit(cache=True, inline="always")
def _take(counters, epoch, share, began, now, active):
    """Take over `share`: entered into the arena first, then still uncommitted in this stretch
    (so its arena is not yet free for another pass), and no other thief took it since."""
    enter(active)
    state = counters + SHARES + 16 * share
    if atomic_load(state) == epoch << 32 and atomic_cas(state + 8, began, now):
        return True
    leave(active)
    return False


@njit(cache=True, inline="always")
def wait_or_steal(counters, epoch, shares, waits, steal, active):
    """Until every share of the phase is done: (NONE_LEFT, cycles waited); (LATE, cycles) if the
    stretch has ended (the counters carry a later epoch); with `steal`, (share, cycles) once a share
    is overdue and this thread has taken it over (entered into `active`: run it, then `leave`).
    Spins SPIN_CYCLES (with `steal`, waits[5] cycles: "Naps" above), then sleeps on the done word
    (futex, 1 ms at a time, or a short nap with `steal`), or yields where there is no futex."""
    done = counters + DONE
    tag = epoch << 32
    if atomic_load(done) == tag + shares:
        return NONE_LEFT, 0
    start = cycles()
    limit = overdue_after(counters) if steal else 0
    spin = waits[5] if steal else SPIN_CYCLES
    while True:
        v = atomic_load(done)
        now = cycles()
        if v - (v & COUNT) != tag:
            return LATE, now - start
        if (v & COUNT) >= shares:
            return NONE_LEFT, now - start
        if steal:
            share, began = _overdue(counters, epoch, shares, start, now, limit)
            if share >= 0 and _take(counters, epoch, share, began, now, active):
                return share, now - start
        if now - start < spin or (waits[0] == 0 and waits[3] == 0):
            spin_pause()
        elif waits[0] == 0:
            call_void(waits[3])
        else:
            # registered before the recheck: a finisher that misses this sleeper has already
            # changed the word, so the futex call returns at once (it sleeps only while the word is v)
            atomic_add(counters + SLEEPERS, 1)
            if atomic_load(done) == v:
                call_kernel(waits[0], waits[1], done, FUTEX_WAIT, v & COUNT, waits[4] if steal else waits[2], 0, 0)
            atomic_add(counters + SLEEPERS, -1)
