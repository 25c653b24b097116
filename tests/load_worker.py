"""Loading model files in a child process and running one token each, reporting every outcome.

Owns: `run_cases(cases, workdir)`, which starts `python -m tests.load_worker` once and feeds it one
case at a time: it writes the case's file, sends its path, reads the outcome and deletes the file
(so hundreds of variants of a 2 MB model never sit on disk together). In the child, one case is:
kinetic.Model(path) with a 64-token context, the chat template applied to one message, and one
token generated. Its outcome is "ok", "refused" (a KineticError, with its message) or "internal"
(any other exception, with its type and message). A case that kills the child (SIGSEGV, say) or
outlives CASE_SECONDS fails with AssertionError naming it, so a crash fails the calling test
instead of killing pytest.

The child runs under a data-segment limit of MEMORY_LIMIT bytes above what it holds after start-up:
an allocation a file asks for beyond it raises MemoryError there (an "internal" outcome), so "no
case allocates more" is checked, not assumed. Stamps of hashed .ktc files go to the caller's
workdir, not the user's cache.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

CASE_SECONDS = 30  # a synthetic model loads and answers in ~30 ms once its kernels are cached
MEMORY_LIMIT = 3 * 1024**3
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Outcome:
    kind: str  # "ok", "refused" or "internal"
    detail: str


Case = tuple[str, Callable[[Path], Path]]  # a name, and a function writing the case's file at a path


def run_cases(cases: Iterable[Case], workdir: Path) -> dict[str, Outcome]:
    """Every case's outcome by name; AssertionError when one crashes or hangs the child."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "worker-stderr.txt"  # a file, not a pipe: notes must never fill a buffer and block
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tests.load_worker", str(workdir)], cwd=ROOT, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    outcomes: dict[str, Outcome] = {}
    try:
        for name, write in cases:
            path = write(workdir / f"case-{len(outcomes)}{_suffix(name)}")
            watchdog = threading.Timer(CASE_SECONDS + 10, proc.kill)  # a hang the child's alarm cannot break
            watchdog.start()
            proc.stdin.write(f"{path}\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            watchdog.cancel()
            path.unlink(missing_ok=True)
            if not line:
                proc.wait(timeout=10)
                died = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
                raise AssertionError(f"case {name} killed the worker ({died}):\n{log.read_text()[-2000:]}")
            result = json.loads(line)
            outcomes[name] = Outcome(result["kind"], result["detail"])
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait()
    return outcomes


def _suffix(name: str) -> str:
    return ".ktc" if name.startswith("ktc:") else ".gguf"


# -- the child ---------------------------------------------------------------------------------------


def _one_case(path: str) -> Outcome:
    from kinetic.errors import KineticError
    from kinetic.model import Model

    try:
        model = Model(path, n_ctx=64)
        prompt = model.apply_chat_template([{"role": "user", "content": "hi"}])
        model.generate(prompt, max_tokens=1)
        return Outcome("ok", "")
    except KineticError as exc:
        return Outcome("refused", exc.message)
    except Exception as exc:
        return Outcome("internal", f"{type(exc).__name__}: {str(exc)[:300]}")


def _hang(_signum, _frame):
    raise TimeoutError(f"the case ran longer than {CASE_SECONDS} s")


def _limit_data(extra: int) -> None:
    """Cap the data segment (heap and anonymous maps, not mapped files) at what it is now + extra."""
    status = Path("/proc/self/status")
    if not status.exists():  # RLIMIT_DATA is enforced this way on Linux only
        return
    used = next(int(line.split()[1]) * 1024 for line in status.read_text().splitlines() if line.startswith("VmData:"))
    resource.setrlimit(resource.RLIMIT_DATA, (used + extra, resource.getrlimit(resource.RLIMIT_DATA)[1]))


def main(workdir: str) -> None:
    from kinetic.ktc import load

    importlib.import_module("kinetic.model")  # before the limit, which then bounds the cases alone

    load.stamp_dir = lambda: Path(workdir) / "stamps"
    _limit_data(MEMORY_LIMIT)
    signal.signal(signal.SIGALRM, _hang)
    for line in sys.stdin:
        signal.alarm(CASE_SECONDS)
        outcome = _one_case(line.strip())
        signal.alarm(0)
        sys.stdout.write(json.dumps({"kind": outcome.kind, "detail": outcome.detail}) + "\n")
        sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: the compiled step's worker threads need not be joined


if __name__ == "__main__":
    main(sys.argv[1])
