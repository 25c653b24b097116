"""One real `kinetic serve` on SmolLM2 per test module (a subprocess on a free port), and the same
model loaded in the test process to compare answers with."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import model_path

SERVE_ARGS = ("-c", "512", "-t", "2")


class ServeProcess:
    def __init__(self, *extra: str):
        command = [sys.executable, "-m", "kinetic.cli.main", "serve", str(model_path("smollm2-135m")), "--port", "0",
                   *SERVE_ARGS, *extra]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()
        self.line = self.proc.stdout.readline()  # the start-up line, printed once the socket listens
        match = re.search(r"at (http://\S+)/v1$", self.line.strip())
        if match is None:
            self.stop()
            raise RuntimeError(f"kinetic serve did not start: {self.line!r} {''.join(self.stderr)}")
        self.url = match.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server():
    serve = ServeProcess()
    yield serve
    alive = serve.proc.poll() is None
    serve.stop()
    assert alive, "the server died during the tests:\n" + "".join(serve.stderr)
    assert "Traceback" not in "".join(serve.stderr)


@pytest.fixture(scope="module")
def model():
    from kinetic.model import Model

    return Model(model_path("smollm2-135m"), n_ctx=512, threads=2)


def wait_until(predicate, seconds: float = 20.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False
