"""Convoy against one request at a time: aggregate generated tokens/s of N concurrent clients (each
a distinct prompt, greedy, --tokens tokens, its end-of-turn ignored) through the runtime's Scheduler,
with N slots (their decode rows share each pass) and with one slot (requests take turns); the two
runs of each N go back to back, alternating which goes first, --repeat times, and the medians are
printed. Every convoy answer is checked against the one-slot answer of the same request (they must
be equal bit for bit). The clock runs from the first submit to the last answer's end, prompts
included.

    python benchmarks/convoy.py [MODEL] [--clients 1,2,4] [--tokens 64] [--threads 2] [--repeat 3]
                                [--draft]

With --servers, the same through HTTP against `kinetic serve -np N` and llama-server
(`-np N -cb`), same file and threads (convoy_servers.py): aggregate tokens/s and per-client latency
for each N, then the same-answer demo.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time

from convoy_prompts import PROMPTS

from kinetic.model import Model
from kinetic.runtime.generation import Finished, GenerationRequest
from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.scheduler import Failed, Scheduler


def run_clients(model: Model, requests: list[GenerationRequest], slots: int) -> tuple[float, list[tuple]]:
    """(seconds from the first submit to the last Finished, each request's tokens)."""
    scheduler = Scheduler(model.generator, slots=slots, max_queued=len(requests))
    inbox: queue.Queue = queue.Queue()
    answers: list[tuple] = [()] * len(requests)
    scheduler.start()
    try:
        start = time.perf_counter()
        for i, request in enumerate(requests):
            scheduler.submit(request, lambda event, i=i: inbox.put((i, event)))
        for _ in requests:
            while True:
                i, event = inbox.get(timeout=600)
                if isinstance(event, Failed):
                    raise SystemExit(f"request {i} failed: {event.message}")
                if isinstance(event, Finished):
                    answers[i] = tuple(event.tokens)
                    break
        seconds = time.perf_counter() - start
    finally:
        scheduler.stop()
    return seconds, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--clients", default="1,2,4", help="comma-separated client counts [default: 1,2,4]")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each client generates [default: 64]")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--draft", action="store_true", help="RAD-1 on (default: off, plain decode rows)")
    parser.add_argument("--servers", action="store_true", help="kinetic serve against llama-server over HTTP")
    parser.add_argument("--demo-tokens", type=int, default=128, help="--servers: the same-answer demo's tokens (0: none)")
    parser.add_argument("--kinetic-off", help="--servers: kinetic serve's --off list (e.g. rad1), for diagnosis")
    args = parser.parse_args()
    if args.servers:
        from convoy_servers import compare_servers

        compare_servers(args.model, [int(x) for x in args.clients.split(",")], args.tokens, args.threads,
                        args.repeat, args.demo_tokens, args.kinetic_off)
        return
    model = Model(args.model, n_ctx=512, threads=args.threads)
    greedy = SamplingSettings(temperature=0.0, seed=1)
    drafting = "on" if args.draft else "off"
    print(f"{args.model}, {args.threads} threads, {args.tokens} tokens per client, drafting {drafting}")
    print(f"{'clients':>7} {'one at a time tok/s':>20} {'convoy tok/s':>13} {'ratio':>6}")
    run_clients(model, [GenerationRequest(tuple(model.tokenize(PROMPTS[0])), greedy, max_tokens=4)], 1)  # warm-up
    for n in (int(x) for x in args.clients.split(",")):
        requests = [GenerationRequest(tuple(model.tokenize(PROMPTS[i % len(PROMPTS)])), greedy,
                                      max_tokens=args.tokens, ignore_eos=True, draft=args.draft) for i in range(n)]
        alone_speeds, convoy_speeds = [], []
        for r in range(args.repeat):
            order = (1, n) if r % 2 == 0 else (n, 1)
            results = {slots: run_clients(model, requests, slots) for slots in order}
            (one_s, one_answers), (convoy_s, convoy_answers) = results[1], results[n]
            assert convoy_answers == one_answers, "a convoy answer differs from its answer alone"
            alone_speeds.append(n * args.tokens / one_s)
            convoy_speeds.append(n * args.tokens / convoy_s)
        one, both = statistics.median(alone_speeds), statistics.median(convoy_speeds)
        print(f"{n:>7} {one:>20.1f} {both:>13.1f} {both / one:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
