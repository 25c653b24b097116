"""The pool's workers in compiled code (kinetic/codegen/cpu/step_drive.py `serve` and `post`,
step_threads.Worker): a posted stretch reads back as the very arrays and integers it was posted
with, and a worker serves the stretches posted to it (it runs shares of a pass); and which decode
phases drive runs as one share (step_drive.phase_shares)."""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
from numba import literal_unroll, njit, typeof, types
from numba.extending import overload

from kinetic.codegen.cpu import step_threads, tape
from kinetic.codegen.cpu.step_drive import BOX_WORDS, DRIVE_ARGS, _posted, dispatch_words, phase_shares, post
from kinetic.codegen.cpu.step_threads import PhaseCounters, Worker, run_parallel

KERNEL = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 9)  # a matmul kernel: w, q, d, e, y, rows, n0, n1, n
N = 64  # the test tape's output columns


def _describe(value, row):
    """row = [an array's address or an integer's value, the array's shape (0-padded)]."""


@overload(_describe)
def _describe_impl(value, row):
    if isinstance(value, types.Array):
        def describe_array(value, row):
            row[0] = value.ctypes.data
            for d in range(value.ndim):
                row[1 + d] = value.shape[d]
        return describe_array

    def describe_integer(value, row):
        row[0] = value
    return describe_integer


@njit
def _posted_arguments(box):
    return _posted(box)


@njit
def _posted_description(box, out):
    i = 0
    for value in literal_unroll(_posted(box)):
        _describe(value, out[i])
        i += 1


def _dispatch() -> tuple:
    """drive's arguments, each array of its DRIVE_ARGS type and a shape of its own, each integer distinct."""
    shapes = {1: (5,), 2: (3, 4), 3: (2, 3, 2)}
    return tuple(101 + i if spec is None else np.zeros(tuple(s + i for s in shapes[spec[1]]), spec[0])
                 for i, spec in enumerate(DRIVE_ARGS))


def test_a_posted_stretch_reads_back_as_the_arrays_and_integers_posted():
    """What the worker reads from its mailbox is, argument by argument, the posted array (same
    address and shape, read as the same type) or the posted integer."""
    dispatch = _dispatch()
    _posted_arguments.compile((types.int64,))
    read_as = _posted_arguments.nopython_signatures[0].return_type
    assert read_as == types.Tuple([typeof(value) for value in dispatch])
    box = np.zeros(BOX_WORDS, np.int64)
    post(box.ctypes.data, dispatch_words(dispatch), 7, step_threads.WAITS)
    got = np.zeros((len(DRIVE_ARGS), 4), np.int64)
    _posted_description(box.ctypes.data, got)
    want = np.zeros_like(got)
    for row, value in zip(want, dispatch, strict=True):
        if isinstance(value, np.ndarray):
            row[0] = value.ctypes.data
            row[1: 1 + value.ndim] = value.shape
        else:
            row[0] = value
    assert np.array_equal(got, want)


def _tape(kernel: int) -> tuple[np.ndarray, np.ndarray]:
    """One phase: the matmul `kernel` into y [N], columns split."""
    rows = np.zeros((1, tape.TAPE_WIDTH), np.int64)
    rows[0, [tape.OP, tape.MATMUL_KERNEL, tape.MATMUL_Y, tape.MATMUL_N]] = tape.OP_MATMUL, kernel, 0, N
    rows[0, tape.FLAGS] = tape.FLAG_BARRIER | tape.FLAG_COLUMNS
    return rows, np.zeros((1, tape.FLOAT_WIDTH), np.float64)


def _pass_tables():
    """One row's tables, typed as the step passes them (the test tape reads none of them)."""
    i32 = np.zeros(1, np.int32)
    return (1, 1, i32, i32, i32, i32, i32, np.zeros((1, 1), np.int32), np.ones((1, 1), np.uint8),
            np.zeros((1, 0, 2), np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(16, np.float32))


def test_a_worker_runs_shares_of_the_stretches_posted_to_it():
    """A pool worker (compiled, fed through its mailbox) runs shares: over passes whose calling
    thread lingers in its first share, another thread runs the other share, and every column is
    written once a pass ends."""
    caller = threading.get_ident()
    ran_by: set[int] = set()
    arena = np.zeros(N + 16, np.float32)

    def matmul(w, q, d, e, y, rows, n0, n1, n):
        ran_by.add(threading.get_ident())
        if threading.get_ident() == caller:
            time.sleep(0.005)  # room for the worker to claim the other share
        np.ctypeslib.as_array((ctypes.c_float * n).from_address(y))[n0:n1] = 1.0

    kernel = KERNEL(matmul)
    rows, floats = _tape(ctypes.cast(kernel, ctypes.c_void_p).value)
    common = (arena, arena.ctypes.data) + _pass_tables()
    counters = PhaseCounters(1, 2)
    assert all(isinstance(worker, Worker) for worker in step_threads._pool(1))
    for _ in range(40):
        arena[:] = 0
        run_parallel(rows, floats, (0, 1), 2, common, counters, np.zeros((1, 2), np.int64))
        assert arena[:N].min() == 1.0
        if len(ran_by) > 1:
            break
    assert ran_by - {caller}, "no share ran on the worker"


def _phase(*ops: int, columns: bool = True) -> np.ndarray:
    rows = np.zeros((len(ops), tape.TAPE_WIDTH), np.int64)
    rows[:, tape.OP] = ops
    rows[:, tape.FLAGS] = tape.FLAG_COLUMNS if columns else 0
    rows[-1, tape.FLAGS] |= tape.FLAG_BARRIER
    return rows


def test_a_decode_phase_of_small_ops_is_one_share():
    """A columns-split phase of small row-local ops only (RMS norm and its quantization; rotary and
    the KV store) is one share; a phase with a matmul or attention, or one that splits rows, keeps
    a share a thread; waits[6] = 0 (the benchmark's old rule) keeps a share a thread everywhere."""
    waits = step_threads.WAITS.copy()
    small = (_phase(tape.OP_RMS_NORM, tape.OP_QUANT), _phase(tape.OP_ROPE, tape.OP_ROPE, tape.OP_KV_STORE))
    large = (_phase(tape.OP_MATMUL, tape.OP_ADD), _phase(tape.OP_ATTEND),
             _phase(tape.OP_RMS_NORM, tape.OP_QUANT, columns=False))
    assert [phase_shares(rows, 0, len(rows) - 1, 2, waits) for rows in small] == [1, 1]
    assert [phase_shares(rows, 0, len(rows) - 1, 2, waits) for rows in large] == [2, 2, 2]
    waits[6] = 0
    assert [phase_shares(rows, 0, len(rows) - 1, 2, waits) for rows in small] == [2, 2]
