"""`kinetic run`: placeholder until its issue lands; refuses with a clear message."""

from __future__ import annotations

import argparse

from kinetic.errors import KineticError


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="(not available yet)")
    p.add_argument("model", nargs="?")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    raise KineticError("kinetic run is not available yet", "See the README for what works today.")
