"""The Ray Serve application for a cluster that is already running (docs/scale-out.md):

    serve run kinetic.deploy:app model=smollm2-135m replicas=4 threads=8 flags="-c 4096 --parallel 4"

Arguments (all strings, as `serve run` passes them): model (a file or a downloaded model's name, on
every node), replicas [default 1], threads (each replica's -t) [default: its node's cores split
between the replicas], overload (requests in flight on a replica from which a less loaded one is
preferred) [default 4], and flags: any other `kinetic serve` flags. Each replica listens on its
node's address, so the ingress can reach it from any node; give --api-key in flags to require a key
there too. Owns only reading these arguments; `kinetic serve --replicas` (kinetic/scaleout/launch.py)
builds the same application.
"""

from __future__ import annotations

import shlex

from kinetic.errors import KineticError
from kinetic.scaleout.launch import import_ray, replica_threads
from kinetic.scaleout.routing import DEFAULT_OVERLOAD

KNOWN = frozenset({"model", "replicas", "threads", "overload", "flags"})


def serve_args(model: str, flags: str = ""):
    """`kinetic serve MODEL FLAGS` parsed as the command line parses it."""
    from kinetic.cli.main import build_parser

    return build_parser().parse_args(["serve", model, *shlex.split(flags)])


def app(args: dict):
    """The application `serve run kinetic.deploy:app key=value ...` deploys."""
    unknown = sorted(set(args) - KNOWN)
    if unknown or "model" not in args:
        raise KineticError(f"kinetic.deploy:app takes {', '.join(sorted(KNOWN))}; "
                           + (f"not {', '.join(unknown)}" if unknown else "model= is missing"),
                           "Example: serve run kinetic.deploy:app model=smollm2-135m replicas=2")
    replicas = _integer(args, "replicas", 1)
    threads = replica_threads(replicas, _integer(args, "threads", None))
    import_ray()
    from kinetic.scaleout.ray_serve import NODE_ADDRESS, build_application

    return build_application(serve_args(args["model"], args.get("flags", "")), replicas=replicas, threads=threads,
                             bind_host=NODE_ADDRESS, overload=_integer(args, "overload", DEFAULT_OVERLOAD))


def _integer(args: dict, name: str, default):
    if name not in args:
        return default
    try:
        return int(args[name])
    except ValueError:
        raise KineticError(f"{name}= must be a whole number, not {args[name]!r}", f"Example: {name}=2") from None
