"""The compiled step's driver: `drive`, the loop every thread runs over a stretch of the tape.

Owns: cutting the tape into phases at its barrier flags, and per phase claiming shares, running
them (step_ops.run_op per op), taking over overdue ones where the phase may be stolen, and waiting
for the phase's end, through the phase counters' operations (step_sync.py). Does not own what an op
computes (step_ops.py), the counters' layout (step_sync.py) nor the threads (step_threads.py).
"""

from __future__ import annotations

from numba import njit

from kinetic.codegen.cpu import tape
from kinetic.codegen.cpu.native import cycles, unowned
from kinetic.codegen.cpu.step_ops import run_op
from kinetic.codegen.cpu.step_sync import LATE, claim, commit, committed, enter, finish, leave, stamp, wait_or_steal

# numba's cache checks only this file's stamp, not those of the modules whose code it compiles in;
# this hash of them (kept current by tests/codegen/cpu/test_cpu_step.py) changes this file whenever
# they change, so a stale cache is never loaded.
SOURCES_HASH = "767fa2be349f2887"


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def run_share(int_rows, float_rows, first, last, share, nt, commits, a, a_addr, n_rows, n_out, out_rows, tokens,
              positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, tid, prof, counters,
              epoch, steal):
    """Share `share` of the ops first..last: those flagged FLAG_COMMIT when `commits`, the others
    otherwise; with `steal`, none after another run of the share has been counted (the rest would
    repeat its bits). Thread 0 adds each op's cycles to prof[ip, 0]."""
    for ip in range(first, last + 1):
        if (int_rows[ip, tape.FLAGS] & tape.FLAG_COMMIT != 0) != commits:
            continue
        if steal and not commits and committed(counters, epoch, share):
            return
        began = cycles()
        run_op(int_rows, float_rows, ip, share, nt, a, a_addr, n_rows, n_out, out_rows, tokens, positions,
               row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu)
        if tid == 0:
            prof[ip, 0] += cycles() - began


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _share_and_commit(int_rows, float_rows, first, last, share, nt, a, a_addr, n_rows, n_out, out_rows, tokens,
                      positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, tid, prof,
                      counters, epoch, waits, steal, began):
    """Run a share; if this run counts (always, unless the phase may be stolen: then the first run to
    finish), its FLAG_COMMIT ops too, and count it done."""
    run_share(int_rows, float_rows, first, last, share, nt, False, a, a_addr, n_rows, n_out, out_rows, tokens,
              positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, tid, prof, counters,
              epoch, steal)
    if steal and not commit(counters, epoch, share):
        return
    run_share(int_rows, float_rows, first, last, share, nt, True, a, a_addr, n_rows, n_out, out_rows, tokens,
              positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, tid, prof, counters,
              epoch, steal)
    finish(counters, nt, waits, cycles() - began if steal else 0)


@njit(cache=True, nogil=True, error_model="numpy")
def drive(int_rows, float_rows, start, end, tid, nt, shares, a, a_addr, n_rows, n_out, out_rows, tokens, positions,
          row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, sync_addr, sync_stride, epoch, waits,
          active, prof):
    """Run the tape's rows start..end (int_rows, float_rows: columns as tape.py names them) as one of
    `nt` threads (thread 0 the caller). The tape is cut into phases at its barrier flags; a phase is
    `shares` shares (`nt`, or more where a thread that is ahead should take over the work of one
    that is behind: a phase may not be stolen then), each share every op of the phase for that
    share (so a row-local op reads what the op before it wrote for the same share), and any thread
    runs any share it claims first (step_sync.claim): a thread another process keeps off its core
    holds nobody up unless it holds an unfinished share, and in a phase flagged FLAG_STEAL not even
    then: a waiting thread runs an overdue share again and the first run to finish counts
    (step_sync.py, "Stealing"). A thread goes
    on to the next phase once every share of this one is done (step_sync.wait_or_steal).
    `sync_addr`: the stretch's phase counters (`sync_stride` bytes a phase), tagged with `epoch`; a
    thread that finds another epoch there is late for a stretch that has ended and returns.
    `active`: the address of the count of threads working in this arena (0: none kept). Returns the
    cycles this thread waited. Thread 0 adds each op's cycles to prof[ip, 0] and the cycles it then
    waited at the phase's end to prof[ip, 1]."""
    # the caller holds these arrays until the stretch is done: views of them count no references
    # (native.unowned; the counting cost a tenth of a decode step, twice that on two threads)
    int_rows, float_rows, a, out_rows, tokens, positions = (unowned(int_rows), unowned(float_rows), unowned(a),
                                                            unowned(out_rows), unowned(tokens), unowned(positions))
    row_slot, row_cidx, slot_rows, anc, kv_addr, clen, gelu = (unowned(row_slot), unowned(row_cidx),
                                                               unowned(slot_rows), unowned(anc), unowned(kv_addr),
                                                               unowned(clen), unowned(gelu))
    waited = 0
    phase = 0
    first = start
    while first < end:
        last = first
        while last < end - 1 and not int_rows[last, tape.FLAGS] & tape.FLAG_BARRIER:
            last += 1
        counters = sync_addr + phase * sync_stride
        steal = int_rows[first, tape.FLAGS] & tape.FLAG_STEAL != 0
        enter(active)
        share = claim(counters, epoch, shares)
        while share >= 0:
            began = stamp(counters, share) if steal else 0
            _share_and_commit(int_rows, float_rows, first, last, share, shares, a, a_addr, n_rows, n_out, out_rows,
                              tokens, positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu,
                              tid, prof, counters, epoch, waits, steal, began)
            share = claim(counters, epoch, shares)
        leave(active)
        if share == LATE:
            return waited
        while True:
            share, wait = wait_or_steal(counters, epoch, shares, waits, steal, active)
            if tid == 0:
                prof[last, 1] += wait
            waited += wait
            if share == LATE:
                return waited
            if share < 0:
                break
            _share_and_commit(int_rows, float_rows, first, last, share, shares, a, a_addr, n_rows, n_out, out_rows,
                              tokens, positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu,
                              tid, prof, counters, epoch, waits, steal, cycles())
            leave(active)
        phase += 1
        first = last + 1
    return waited
