"""The renderer process: compiles and renders chat templates one at a time, under limits set on itself.

template_pool.py starts it with its stdin and stdout as the channel: frames of a 4-byte big-endian
length and UTF-8 JSON, both ways (the parent never unpickles what a renderer sends). Once imported it
sends {"ready": true}; then for each request {"source", "context" (None: compile only),
"timeout_s", "max_output_chars", "max_memory_bytes"} it answers {"text"} (or {"compiled": true}) or
a failure record (template_sandbox.failure), with "peak_rss_bytes" and "retire" (true: it exits
after this answer, and the parent starts a fresh one).

Owns: the limits around each compile and render: RLIMIT_AS (its address space before the render plus
the memory budget, so an allocation past it raises MemoryError), RLIMIT_CPU (its CPU time so far
plus the budget: a backstop that ends the process if the parent is gone) and a wall-clock timer
that raises RenderTimeout inside the render, so the error names the template line; retiring itself
after a budget failure or when its resident memory has grown. Does not own the sandbox
(template_sandbox.py) or the deadline the parent enforces by killing it (template_pool.py).
"""

from __future__ import annotations

import json
import os
import resource
import signal
from collections import OrderedDict
from contextlib import contextmanager

from kinetic.frontend.template_sandbox import RenderTimeout, compile_template, failure, render_bounded

CACHED_TEMPLATES = 8
RETIRE_GROWTH = 64 * 1024 * 1024  # resident bytes above the start-up figure that retire the process
RETIRING_ERRORS = frozenset({"memory", "timeout", "output", "recursion"})
TIMER_REPEAT_S = 0.1  # the timer fires again until the render stops, in case one firing is swallowed
_rendering = [False]  # the timer raises only while a render runs


def _on_timer(signum, frame) -> None:
    if _rendering[0]:
        raise RenderTimeout("the wall-clock budget was spent")


def _peak_rss() -> int:
    """This process's largest resident set in bytes (VmHWM). Not getrusage's ru_maxrss: Linux carries
    that across exec from the process that started us, so a renderer started by a large parent would
    report the parent's peak."""
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _memory(field: int) -> int:
    """Bytes from /proc/self/statm: field 0 the address space, 1 the resident set."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[field]) * os.sysconf("SC_PAGE_SIZE")


def _soft(value: int, hard: int) -> int:
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


@contextmanager
def _limits(timeout_s: float, max_memory_bytes: int):
    """Address space, CPU time and wall clock bounded for the body; the old limits restored after."""
    old_as, old_cpu = resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_CPU)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_limit = int(usage.ru_utime + usage.ru_stime + timeout_s) + 2
    resource.setrlimit(resource.RLIMIT_AS, (_soft(_memory(0) + max_memory_bytes, old_as[1]), old_as[1]))
    resource.setrlimit(resource.RLIMIT_CPU, (_soft(cpu_limit, old_cpu[1]), old_cpu[1]))
    _rendering[0] = True
    signal.setitimer(signal.ITIMER_REAL, timeout_s, TIMER_REPEAT_S)
    try:
        yield
    finally:
        _rendering[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        resource.setrlimit(resource.RLIMIT_AS, old_as)
        resource.setrlimit(resource.RLIMIT_CPU, old_cpu)


def _answer(request: dict, cache: OrderedDict) -> dict:
    try:
        with _limits(float(request["timeout_s"]), int(request["max_memory_bytes"])):
            template = _compiled(request["source"], cache)
            if request.get("context") is None:
                return {"compiled": True}
            return {"text": render_bounded(template, request["context"], int(request["max_output_chars"]))}
    except Exception as exc:  # anything the untrusted template did, MemoryError and RenderTimeout included
        return failure(exc)


def _compiled(source: str, cache: OrderedDict):
    if source in cache:
        cache.move_to_end(source)
        return cache[source]
    template = compile_template(source)
    cache[source] = template
    if len(cache) > CACHED_TEMPLATES:
        cache.popitem(last=False)
    return template


def _send(channel, message: dict) -> None:
    data = json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass")
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[channel.write(view):]


def _receive(channel) -> dict | None:
    """The next request, or None once the parent has closed the channel."""
    header = _read_exactly(channel, 4)
    if header is None:
        return None
    data = _read_exactly(channel, int.from_bytes(header, "big"))
    return None if data is None else json.loads(data.decode("utf-8", "surrogatepass"))


def _read_exactly(channel, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = channel.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main() -> None:
    channel_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # a stray print cannot corrupt the channel
    channel_in = os.fdopen(0, "rb", buffering=0)
    signal.signal(signal.SIGALRM, _on_timer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the parent, which decides
    start_rss, cache = _memory(1), OrderedDict()
    _send(channel_out, {"ready": True})
    while (request := _receive(channel_in)) is not None:
        answer = _answer(request, cache)
        answer["peak_rss_bytes"] = _peak_rss()
        answer["retire"] = answer.get("error") in RETIRING_ERRORS or _memory(1) > start_rss + RETIRE_GROWTH
        _send(channel_out, answer)
        if answer["retire"]:
            return


if __name__ == "__main__":
    main()
