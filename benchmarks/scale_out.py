"""Scale-out on Ray Serve against one server: aggregate generated tokens/s of --concurrency clients
sending --requests distinct completions (--tokens tokens each, end-of-turn ignored) through

  * one `kinetic serve -t THREADS*2`, then one `kinetic serve -t THREADS` (subprocesses, no Ray),
  * the ingress of 1 replica of THREADS threads,
  * the ingress of 2 replicas of THREADS threads each,

and the ingress's routing overhead per request: the median time of GET /health through the ingress
minus the same request sent to a replica directly (--probes each). The clock runs from the first
request to the last answer. Needs the scale extra (ray[serve]); prints the machine's load average
before and after, as the numbers depend on what else runs.

    python benchmarks/scale_out.py [MODEL] [--requests 24] [--concurrency 4] [--tokens 32] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from kinetic.hub import resolve_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drive(url: str, requests: int, concurrency: int, tokens: int) -> float:
    """Generated tokens per second of `requests` completions sent `concurrency` at a time."""
    def one(i: int) -> int:
        body = {"prompt": f"Request {i}: write about the number {i * 7919 % 1000}.", "n_predict": tokens,
                "ignore_eos": True, "seed": i}
        answer = httpx.post(url + "/completion", json=body, timeout=600)
        answer.raise_for_status()
        return answer.json()["tokens_predicted"]

    drive_warm = one(-1)  # the first request pays for what loads lazily
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        generated = sum(pool.map(one, range(requests)))
    assert drive_warm == tokens
    return generated / (time.perf_counter() - start)


def median_get(url: str, probes: int) -> float:
    with httpx.Client() as client:
        times = []
        for _ in range(probes):
            start = time.perf_counter()
            client.get(url + "/health").raise_for_status()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def single_server(model: str, threads: int, args) -> float:
    command = [sys.executable, "-m", "kinetic.cli.main", "serve", model, "--port", "0", "-c", "512",
               "-t", str(threads)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        url = re.search(r"at (http://\S+)/v1$", proc.stdout.readline().strip()).group(1)
        return drive(url, args.requests, args.concurrency, args.tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def on_ray(model: str, args) -> dict:
    import ray
    from ray import serve

    from kinetic.deploy import serve_args
    from kinetic.scaleout.ray_serve import build_application

    ray.init(num_cpus=max(2, 2 * args.threads), include_dashboard=False, object_store_memory=200 * 1024 * 1024,
             logging_level="ERROR", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url, results = f"http://127.0.0.1:{port}", {}
    try:
        for replicas in (1, 2):
            app = build_application(serve_args(model, "-c 512"), replicas=replicas, threads=args.threads)
            serve.run(app, name="kinetic", route_prefix="/", blocking=False)
            results[replicas] = drive(url, args.requests, args.concurrency, args.tokens)
            direct = httpx.get(url + "/scaleout/replicas", timeout=60).json()[0]["url"]
            results[f"overhead {replicas}"] = median_get(url, args.probes) - median_get(direct, args.probes)
            serve.delete("kinetic")
    finally:
        serve.shutdown()
        ray.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="each replica's; the single server gets twice")
    parser.add_argument("--probes", type=int, default=50)
    args = parser.parse_args()
    model = str(resolve_model(args.model))
    print(f"load before: {os.getloadavg()}  cpus: {os.cpu_count()}", flush=True)
    for threads in (2 * args.threads, args.threads):
        alone = single_server(model, threads, args)
        print(f"one server, {threads} thread(s): {alone:.1f} tokens/s", flush=True)
    ray_results = on_ray(model, args)
    for replicas in (1, 2):
        print(f"{replicas} replica(s) of {args.threads} thread(s): {ray_results[replicas]:.1f} tokens/s, routing "
              f"overhead {ray_results[f'overhead {replicas}'] * 1000:.2f} ms per request", flush=True)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
