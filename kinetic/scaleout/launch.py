"""`kinetic serve MODEL --replicas N`: start (or join) Ray, deploy the replicas and the ingress, wait.

Owns: the checks of --replicas and the threads each replica gets, Ray's start on this machine
(small: no dashboard, the cores Kinetic needs) or its join of a cluster ($RAY_ADDRESS), and the
start-up line. Does not own the deployments (ray_serve.py) or `serve run kinetic.deploy:app`
(kinetic/deploy.py, for a cluster that is already running).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading

from kinetic.errors import KineticError

APP_NAME = "kinetic"
OBJECT_STORE_BYTES = 200 * 1024 * 1024  # the replicas pass only addresses through Ray, never tensors


def import_ray():
    """ray and ray.serve, or a KineticError that says how to install them."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise KineticError("--replicas runs on Ray Serve, which is not installed",
                           "Install it with: pip install 'kinetic-engine[scale]' (see docs/scale-out.md).") from None
    return ray, serve


def replica_threads(replicas: int, threads: int | None, cores: int | None = None) -> int:
    """Each replica's -t: as given, else this machine's cores split between the replicas (at least 1)."""
    if replicas <= 0:
        raise KineticError(f"--replicas must be positive, not {replicas}", "Example: --replicas 2")
    if threads is not None:
        if threads <= 0:
            raise KineticError(f"-t must be positive, not {threads}", "Give a thread count such as -t 4.")
        return threads
    return max(1, (cores or os.cpu_count() or 1) // replicas)


def start_ray(ray, *, cpus: int) -> None:
    """Join $RAY_ADDRESS's cluster, else start a small Ray on this machine."""
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    else:
        ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
                 logging_level="ERROR", log_to_driver=False)


def serve_replicas(args: argparse.Namespace) -> int:
    from kinetic.server.options import DEFAULT_PORT, OLLAMA_PORT

    if not (args.model_flag or args.model):
        raise KineticError("no model given", "Usage: kinetic serve MODEL --replicas N; see docs/scale-out.md.")
    threads = replica_threads(args.replicas, args.threads)
    port = args.port if args.port is not None else (OLLAMA_PORT if args.ollama else DEFAULT_PORT)
    if not 0 < port <= 65535:
        raise KineticError(f"--port must be from 1 to 65535 with --replicas, not {port}", "Example: --port 8080")
    ray, serve = import_ray()
    from kinetic.scaleout.ray_serve import NODE_ADDRESS, build_application

    start_ray(ray, cpus=max(os.cpu_count() or 1, args.replicas * threads))
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # its start-up lines; ours is the one below
    serve.start(http_options={"host": args.host, "port": port})
    remote = bool(os.environ.get("RAY_ADDRESS"))
    app = build_application(args, replicas=args.replicas, threads=threads,
                            bind_host=NODE_ADDRESS if remote else "127.0.0.1")
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"Serving {args.model_flag or args.model} on {args.replicas} replicas of {threads} "
          f"thread{'' if threads == 1 else 's'} at "
          f"http://{host}:{port}/v1", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
