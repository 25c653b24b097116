"""`kinetic compile --tune`'s kernel phase and its exactness gate.

Owns: the kernel candidates (`kernel_candidates`: the quantized matmul's tiles of matmul_choice.TILES,
and the wide 512-bit paths off for every type that has one, and for each such type alone), the
choice among them (`choose_kernels`), and the gate every candidate of every phase passes before it
is timed (`fingerprint`, `Refused`): the bits of the logits of one fixed prompt (tune.py's
FINGERPRINT_TOKENS, 261 ids: half the largest prompt pass and FINGERPRINT_EXTRA more, so each
searched pass size cuts it differently and leftover rows run the small tiles), then one decode
step, must be those of the first engine the search built. The kernels, tiles and thread counts are
all meant to give the same bits (kinetic/codegen/cpu/matmul_choice.py says why); the gate makes a
candidate that does not a refused one, recorded in the profile's `measured`, never a chosen one.
Does not own the timing and the other phases (tune.py) nor the kernels (kinetic/codegen/cpu).

The thread split of a phase is not a choice here: the compiled step splits a matmul's output columns
evenly over the threads it runs (step_threads.py) and exposes no other split.
"""

from __future__ import annotations

import hashlib

import numpy as np

from kinetic.codegen.cpu.matmul_choice import DEFAULT_TILE, TILES, MatmulChoice, graph_weights, wide_types
from kinetic.errors import KineticError

FINGERPRINT_EXTRA = 5  # rows past a multiple of every searched pass: a pass of leftover rows (the small tiles)


class Refused(KineticError):
    """A candidate whose logits differ in a bit from the first engine's."""


def kernel_candidates(graph, variant: str) -> list[MatmulChoice]:
    """The default first, then each other tile, then per tile with wide paths those paths off (all
    types), and at the default tile each wide type alone off when there are several."""
    weights = graph_weights(graph)
    candidates = [MatmulChoice()] + [MatmulChoice(tile=t) for t in TILES if t != DEFAULT_TILE]
    for tile in TILES:
        wide = wide_types(weights, variant, tile)
        if wide:
            candidates.append(MatmulChoice(tile=tile, narrow=frozenset(wide)))
    wide = wide_types(weights, variant, DEFAULT_TILE)
    if len(wide) > 1:
        candidates += [MatmulChoice(narrow=frozenset({name})) for name in wide]
    return candidates


def fingerprint(engine, prompt: tuple[int, ...], tokens: int) -> str:
    """BLAKE2 of the logits' bits: the last row of a prompt of `tokens` ids (in the engine's passes),
    then of one decode step feeding back the likeliest token."""
    seq = engine.new_sequence()
    digest = hashlib.blake2b(digest_size=16)
    logits = engine.prefill(seq, list(prompt[:tokens]))
    digest.update(np.ascontiguousarray(logits, np.float32).view(np.uint32).tobytes())
    logits = engine.decode(seq, int(np.argmax(logits)))
    digest.update(np.ascontiguousarray(logits, np.float32).view(np.uint32).tobytes())
    return digest.hexdigest()


def check_bits(name: str, got: str, want: str) -> None:
    if got != want:
        raise Refused(f"--tune: {name} gives other logits than the first engine (a bug in a kernel)",
                      "The candidate was left out; report it with the model file.")


def choose_kernels(candidates: list, tie: float) -> MatmulChoice:
    """The fastest prompt among the measured, not refused candidates; within `tie` of it, the default
    (else the first tied, in candidate order)."""
    measured = [c for c in candidates if c.pp and not c.refused]
    if not measured:
        return MatmulChoice()
    best = max(c.median("pp") for c in measured)
    tied = [c.matmul for c in measured if c.median("pp") >= best * (1 - tie)]
    return MatmulChoice() if MatmulChoice() in tied else tied[0]


def describe(choice: MatmulChoice) -> str:
    narrow = f", {'/'.join(sorted(choice.narrow))} narrow" if choice.narrow else ""
    return f"tile {choice.tile}{narrow}"
