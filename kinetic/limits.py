"""Bounds on the settings that start threads or size buffers: the thread count and a profile's batch.

Owns: one check of a thread count, shared by the CLI (-t on run, serve, bench), `kinetic.Model` and a
.ktc file's profile: a whole number from 1 to THREADS_PER_CPU times the logical CPUs this process may
run on. More threads than that only wait on each other (the compiled step's threads meet at a
barrier after every phase), and thousands of them fail to start. A user's value outside the range
is refused with a KineticError; a profile's is replaced by the default with a note (kinetic/ktc/load.py).
Also the batch bound a profile is checked against (kinetic/ktc/profile.py). Does not own what the
runtime does with either.
"""

from __future__ import annotations

from kinetic.errors import KineticError

THREADS_PER_CPU = 4
MAX_BATCH = 4096  # prompt rows per pass; the default is 128, `kinetic compile --tune` tries 32..128


def cpus() -> int:
    from kinetic.codegen.cpu.step import available_cpus

    return available_cpus()


def max_threads() -> int:
    return THREADS_PER_CPU * cpus()


def check_threads(threads: int | None) -> int | None:
    """`threads` when it is None (every CPU) or a whole number from 1 to max_threads(); else a
    KineticError saying the range."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise KineticError(f"the thread count must be a whole number, not {threads!r}",
                           "Give a thread count such as -t 4, or leave it out to use every CPU.")
    if not 1 <= threads <= max_threads():
        raise KineticError(f"{threads} threads is outside 1..{max_threads()} ({THREADS_PER_CPU} per CPU; this "
                           f"machine lets Kinetic use {cpus()})",
                           f"Give -t from 1 to {max_threads()}, or leave it out to use every CPU.")
    return threads
