"""Sizes on the command line and in tables: `--memory 8` (GiB) in, `1.02 GiB` out.

Owns: the one parser of a GiB figure given on the command line and the one way commands print a
byte count, shared by `kinetic pull`, `models`, `doctor` and `fit`. Does not own measuring anything.
"""

from __future__ import annotations

import argparse

GiB = 1024**3
MiB = 1024**2


def gib_argument(text: str) -> int:
    """A positive number of GiB (`8`, `0.5`) as bytes, for argparse's `type=`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GiB (such as 8 or 0.5)") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} GiB: give a positive size, such as 8 or 0.5")
    return int(value * GiB)


def human(n: int | None) -> str:
    """`1.02 GiB`, `98.4 MiB`, `-` for unknown."""
    if n is None:
        return "-"
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB"
