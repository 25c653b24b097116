"""The compiled step's driver: `drive`, the loop every thread runs over a stretch of the tape, and
`serve`, the compiled loop a pool worker lives in.

Owns: cutting the tape into phases at its barrier flags, and per phase claiming shares, running
them (step_ops.run_op per op), taking over overdue ones where the phase may be stolen, and waiting
for the phase's end, through the phase counters' operations (step_sync.py); the workers' mailbox
(`post` a stretch, `serve` it: drive's arguments as addresses and shapes, `dispatch_words`), so a
worker goes from one stretch to the next without Python or the GIL. Does not own what an op
computes (step_ops.py), the counters' layout (step_sync.py) nor the threads (step_threads.py).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from kinetic.codegen.cpu import tape
from kinetic.codegen.cpu.native import (
    FUTEX_WAIT,
    FUTEX_WAKE,
    atomic_load,
    atomic_store,
    call_kernel,
    call_void,
    cycles,
    f32_ptr,
    f64_ptr,
    i32_ptr,
    i64_ptr,
    spin_pause,
    u8_ptr,
    unowned,
)
from kinetic.codegen.cpu.step_ops import run_span
from kinetic.codegen.cpu.step_sync import (
    COUNT,
    LATE,
    alone,
    arrive,
    claim,
    claim_rest,
    commit,
    committed,
    enter,
    finish_many,
    leave,
    stamp_span,
    wait_or_steal,
)

# numba's cache checks only this file's stamp, not those of the modules whose code it compiles in;
# this hash of them (kept current by tests/codegen/cpu/test_cpu_step.py) changes this file whenever
# they change, so a stale cache is never loaded.
SOURCES_HASH = "4a95286a881d982f"


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def run_share(int_rows, float_rows, first, last, share, end, nt, commits, a, a_addr, n_rows, n_out, out_rows, tokens,
              positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, tid, prof, counters,
              epoch, steal):
    """Shares share..end-1 of the ops first..last (one call an op: step_ops.run_span): those
    flagged FLAG_COMMIT when `commits`, the others otherwise; with `steal`, none after another run
    of each of the shares has been counted (the rest would repeat its bits). Thread 0 adds each
    op's cycles to prof[ip, 0]."""
    for ip in range(first, last + 1):
        if (int_rows[ip, tape.FLAGS] & tape.FLAG_COMMIT != 0) != commits:
            continue
        if steal and not commits and committed(counters, epoch, share, end):
            return
        began = cycles()
        run_span(int_rows, float_rows, ip, share, end, nt, a, a_addr, n_rows, n_out, out_rows, tokens, positions,
                 row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu)
        if tid == 0:
            prof[ip, 0] += cycles() - began


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _share_and_commit(int_rows, float_rows, first, last, share, end, nt, a, a_addr, n_rows, n_out, out_rows, tokens,
                      positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, tid, prof,
                      counters, epoch, waits, steal, began):
    """Run shares share..end-1; for each whose run counts (always, unless the phase may be stolen:
    then the first run of it to finish), its FLAG_COMMIT ops too, and count it done."""
    run_share(int_rows, float_rows, first, last, share, end, nt, False, a, a_addr, n_rows, n_out, out_rows, tokens,
              positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, tid, prof, counters,
              epoch, steal)
    took = (cycles() - began) // (end - share) if steal else 0
    done = 0
    for s in range(share, end):
        if steal and not commit(counters, epoch, s):
            continue
        run_share(int_rows, float_rows, first, last, s, s + 1, nt, True, a, a_addr, n_rows, n_out, out_rows, tokens,
                  positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, tid, prof, counters,
                  epoch, steal)
        done += 1
    finish_many(counters, nt, waits, took, done)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def run_prefix(int_rows, float_rows, first, body, nt, a, a_addr, n_rows, n_out, out_rows, tokens, positions, row_slot,
               row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, tid, prof):
    """The phase's prefix, ops first..body-1 (FLAG_PREFIX: step_steal.prefix_flags), in full: every
    share at once, the same bits as share by share (step_ops.run_span). Thread 0 adds each op's
    cycles to prof[ip, 0]."""
    for ip in range(first, body):
        began = cycles()
        run_span(int_rows, float_rows, ip, 0, nt, nt, a, a_addr, n_rows, n_out, out_rows, tokens, positions, row_slot,
                 row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu)
        if tid == 0:
            prof[ip, 0] += cycles() - began


# row-local ops too small to split by columns: two shares cost more than one (an RMS norm's row sum
# is a serial chain every share repeats; each share is a call of its own), ~1-2 us a phase of them
SMALL_OPS = (tape.OP_RMS_NORM, tape.OP_QUANT, tape.OP_ROPE, tape.OP_KV_STORE, tape.OP_ADD, tape.OP_SCALE,
             tape.OP_MUL, tape.OP_ADD_BIAS, tape.OP_SILU, tape.OP_GELU, tape.OP_SOFTCAP, tape.OP_SWIGLU,
             tape.OP_GEGLU)


@njit(cache=True, nogil=True, inline="always")
def phase_shares(int_rows, first, last, shares, waits):
    """The shares of the phase first..last: its tape.SHARES where the tape gives it some (a stolen
    phase of many weight bytes: step_steal.share_counts); one where it splits columns (a pass of fewer
    rows than threads: decode) and holds SMALL_OPS only, unless waits[6] is 0; else `shares`. A share of one
    is every column, what one thread computes (the same bits); the other threads wait at its end.
    Measured (docs/benchmarks.md, "small phases in one share"): 3-4 % less CPU time a token when
    both threads share a core, ~1 % slower on two free cores."""
    if int_rows[first, tape.SHARES] > 0:
        return int_rows[first, tape.SHARES]
    if waits[6] == 0:
        return shares
    for ip in range(first, last + 1):
        if int_rows[ip, tape.FLAGS] & tape.FLAG_COLUMNS == 0:
            return shares
        op = int_rows[ip, tape.OP]
        small = False
        for kind in SMALL_OPS:
            small = small or op == kind
        if not small:
            return shares
    return 1


@njit(cache=True, nogil=True, error_model="numpy")
def drive(int_rows, float_rows, start, end, tid, nt, shares, a, a_addr, n_rows, n_out, out_rows, tokens, positions,
          row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, sync_addr, sync_stride, epoch, waits,
          active, prof):
    """Run the tape's rows start..end (int_rows, float_rows: columns as tape.py names them) as one of
    `nt` threads (thread 0 the caller). The tape is cut into phases at its barrier flags; a phase is
    `shares` shares (`nt`, or more where a thread that is ahead should take over the work of one
    that is behind; a stolen phase's tape.SHARES where it reads many weight bytes; one for a decode
    phase of small ops: phase_shares), each share every op of the phase for that
    share (so a row-local op reads what the op before it wrote for the same share), and any thread
    runs any share it claims first (step_sync.claim): a thread another process keeps off its core
    holds nobody up unless it holds an unfinished share, and in a phase flagged FLAG_STEAL not even
    then: a waiting thread runs an overdue share again and the first run to finish counts
    (step_sync.py, "Stealing"). In such a phase, a thread that no other has followed into either
    of the two phases before (step_sync.alone: the others are off their cores) claims every share
    left at once and runs each op once over their columns (step_ops.run_span: the same bits, one
    call instead of one a share), unless the phase has more shares than threads (their shares are
    big: a call each costs little, and one call would hold them all). A phase's leading FLAG_PREFIX
    ops (step_steal.prefix_flags) are no share's: a thread runs them in full before its first share
    of the phase, claimed or stolen (run_prefix), so whatever share it runs, it has their outputs. A
    thread goes on to the next phase once every share of this one is done (step_sync.wait_or_steal).
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
        body = first
        while body < last and int_rows[body, tape.FLAGS] & tape.FLAG_PREFIX:
            body += 1
        ready = body == first  # this thread has run the phase's prefix
        counters = sync_addr + phase * sync_stride
        steal = int_rows[first, tape.FLAGS] & tape.FLAG_STEAL != 0
        n_shares = phase_shares(int_rows, first, last, shares, waits)
        arrive(counters)
        whole = steal and 1 < n_shares <= nt and waits[7] != 0 and alone(counters, sync_stride, epoch, phase)
        enter(active)
        share = claim_rest(counters, epoch, n_shares) if whole else claim(counters, epoch, n_shares)
        while share >= 0:
            upto = n_shares if whole else share + 1
            began = stamp_span(counters, share, upto) if steal else 0
            if not ready:
                run_prefix(int_rows, float_rows, first, body, n_shares, a, a_addr, n_rows, n_out, out_rows, tokens,
                           positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, tid, prof)
                ready = True
            _share_and_commit(int_rows, float_rows, body, last, share, upto, n_shares, a, a_addr, n_rows, n_out,
                              out_rows, tokens, positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen,
                              cpos_addr, gelu, tid, prof, counters, epoch, waits, steal, began)
            whole = False
            share = claim(counters, epoch, n_shares)
        leave(active)
        if share == LATE:
            return waited
        while True:
            share, wait = wait_or_steal(counters, epoch, n_shares, waits, steal, active)
            if tid == 0:
                prof[last, 1] += wait
            waited += wait
            if share == LATE:
                return waited
            if share < 0:
                break
            if not ready:
                run_prefix(int_rows, float_rows, first, body, n_shares, a, a_addr, n_rows, n_out, out_rows, tokens,
                           positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, tid, prof)
                ready = True
            _share_and_commit(int_rows, float_rows, body, last, share, share + 1, n_shares, a, a_addr, n_rows, n_out,
                              out_rows, tokens, positions, row_slot, row_cidx, slot_rows, anc, kv_addr, clen,
                              cpos_addr, gelu, tid, prof, counters, epoch, waits, steal, cycles())
            leave(active)
        phase += 1
        first = last + 1
    return waited


# -- a pool worker that stays in compiled code (step_threads.Worker) ---------------------------------
# Its mailbox: BOX_WORDS int64 words. GEN: the generation of the stretch posted last (0 while one is
# being written; the worker sleeps on its low half), USING: the generation the worker took last (the
# poster keeps that one's arrays alive), SLEEPING: whether the worker sleeps on GEN; from ARGS on,
# drive's arguments as DRIVE_ARGS encodes them.
GEN, USING, SLEEPING, ARGS, BOX_WORDS = 0, 1, 2, 8, 64
STOP = -1  # GEN: the worker returns (step_threads stops the pool before the interpreter ends)
I64, F64, F32, I32, U8 = "int64", "float64", "float32", "int32", "uint8"
# per drive argument: None (an integer: one word) or (dtype, ndim) (an array: its address, then its shape)
DRIVE_ARGS = ((I64, 2), (F64, 2), None, None, None, None, None,  # int_rows, float_rows, start, end, tid, nt, shares
              (F32, 1), None, None, None,  # a, a_addr, n_rows, n_out
              (I32, 1), (I32, 1), (I32, 1), (I32, 1), (I32, 1),  # out_rows, tokens, positions, row_slot, row_cidx
              (I32, 2), (U8, 2), (I64, 3),  # slot_rows, anc, kv_addr
              (I64, 1), (I64, 1), (F32, 1),  # clen, cpos_addr, gelu
              None, None, None, (I64, 1), None, (I64, 2))  # sync_addr, sync_stride, epoch, waits, active, prof
SPIN_BEFORE_SLEEP = 5_000  # cycles (~2 us) a worker looks for the next stretch before it sleeps
SLEEP_SECONDS = 0.1  # a sleeping worker rechecks its mailbox this often (a wake is never lost: see post)


@njit(cache=True, nogil=True, inline="always")
def _word(at):
    return atomic_load(at)


@njit(cache=True, nogil=True, inline="always")
def _vector(at, ptr):
    return carray(ptr(_word(at)), (_word(at + 8),)), at + 16


@njit(cache=True, nogil=True, inline="always")
def _matrix(at, ptr):
    return carray(ptr(_word(at)), (_word(at + 8), _word(at + 16))), at + 24


@njit(cache=True, nogil=True, inline="always")
def _posted(box):
    """drive's arguments as the mailbox at `box` holds them (DRIVE_ARGS' order and encoding)."""
    at = box + 8 * ARGS
    int_rows, at = _matrix(at, i64_ptr)
    float_rows, at = _matrix(at, f64_ptr)
    start, end, tid, nt, shares = _word(at), _word(at + 8), _word(at + 16), _word(at + 24), _word(at + 32)
    a, at = _vector(at + 40, f32_ptr)
    a_addr, n_rows, n_out = _word(at), _word(at + 8), _word(at + 16)
    out_rows, at = _vector(at + 24, i32_ptr)
    tokens, at = _vector(at, i32_ptr)
    positions, at = _vector(at, i32_ptr)
    row_slot, at = _vector(at, i32_ptr)
    row_cidx, at = _vector(at, i32_ptr)
    slot_rows, at = _matrix(at, i32_ptr)
    anc, at = _matrix(at, u8_ptr)
    kv_addr = carray(i64_ptr(_word(at)), (_word(at + 8), _word(at + 16), _word(at + 24)))
    clen, at = _vector(at + 32, i64_ptr)
    cpos_addr, at = _vector(at, i64_ptr)
    gelu, at = _vector(at, f32_ptr)
    sync_addr, sync_stride, epoch = _word(at), _word(at + 8), _word(at + 16)
    waits, at = _vector(at + 24, i64_ptr)
    active = _word(at)
    prof, at = _matrix(at + 8, i64_ptr)
    return (int_rows, float_rows, start, end, tid, nt, shares, a, a_addr, n_rows, n_out, out_rows, tokens, positions,
            row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu, sync_addr, sync_stride, epoch, waits,
            active, prof)


@njit(cache=True, nogil=True, inline="always")
def _sleep(box, seen, waits, timeout):
    """Until the mailbox's generation is no longer `seen` (or `timeout`, a timespec's address, passes):
    a short spin, then a futex sleep on it (a yield where there is no futex)."""
    start = cycles()
    while cycles() - start < SPIN_BEFORE_SLEEP:
        if atomic_load(box + 8 * GEN) != seen:
            return
        spin_pause()
    if waits[0] == 0:
        if waits[3] != 0:
            call_void(waits[3])
        return
    atomic_store(box + 8 * SLEEPING, 1)
    if atomic_load(box + 8 * GEN) == seen:  # posted before SLEEPING was set: post did not see it, do not sleep
        call_kernel(waits[0], waits[1], box + 8 * GEN, FUTEX_WAIT, seen & COUNT, timeout, 0, 0)
    atomic_store(box + 8 * SLEEPING, 0)


@njit(cache=True, nogil=True)
def serve(box, waits, timeout):
    """A pool worker's life, in compiled code (no Python, no GIL between stretches): for each
    stretch posted to the mailbox at `box`, drive it, until STOP is posted. A stretch posted while
    the worker was busy and replaced by a later one before it looked is skipped: its caller has
    already done all its shares (a worker is never needed for a stretch to end). The arguments are
    read between two looks at GEN, after USING names the generation, so the poster keeps them alive
    (post)."""
    seen = 0
    while True:
        gen = atomic_load(box + 8 * GEN)
        if gen == STOP:
            return
        if gen == 0 or gen == seen:
            _sleep(box, gen, waits, timeout)
            continue
        seen = gen
        atomic_store(box + 8 * USING, gen)
        if atomic_load(box + 8 * GEN) != gen:
            continue
        args = _posted(box)
        if atomic_load(box + 8 * GEN) == gen:
            drive(*args)


@njit(cache=True, nogil=True)
def post(box, words, gen, waits):
    """Post a stretch (drive's arguments encoded as `words`) as generation `gen` (> 0, or STOP) to the mailbox
    at `box`, waking its worker if it sleeps. GEN is 0 while the words change, so a worker never
    takes a half-written stretch; GEN is stored before SLEEPING is read, and the worker sets SLEEPING
    before it reads GEN, so one of the two sees the other (no lost wake)."""
    atomic_store(box + 8 * GEN, 0)
    for i in range(len(words)):
        atomic_store(box + 8 * (ARGS + i), words[i])
    atomic_store(box + 8 * GEN, gen)
    if atomic_load(box + 8 * SLEEPING) != 0 and waits[0] != 0:
        call_kernel(waits[0], waits[1], box + 8 * GEN, FUTEX_WAKE, 1, 0, 0, 0)


def dispatch_words(dispatch: tuple) -> np.ndarray:
    """drive's arguments as a mailbox holds them (DRIVE_ARGS): an integer as itself, an array as its
    address and shape. Refuses an array of another type or layout (the worker would misread it)."""
    words: list[int] = []
    for value, spec in zip(dispatch, DRIVE_ARGS, strict=True):
        if spec is None:
            words.append(int(value))
            continue
        dtype, ndim = spec
        if value.dtype != dtype or value.ndim != ndim or not value.flags.c_contiguous:
            raise AssertionError(f"a drive argument is {value.dtype} {value.shape}, not a contiguous "
                                 f"{dtype} array of {ndim} dimensions")
        words.append(value.__array_interface__["data"][0])
        words.extend(value.shape)
    return np.array(words, np.int64)
