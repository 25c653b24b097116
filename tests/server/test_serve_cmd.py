"""`kinetic serve` command-line handling that needs no model: llama-server's flags and clear errors."""

from __future__ import annotations

import socket
import subprocess
import sys


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kinetic.cli.main", "serve", *args], capture_output=True, text=True,
                          timeout=60)


def test_unknown_flag_is_a_usage_error():
    """An unknown flag exits 2 with a `kinetic: ` line naming it."""
    proc = serve("model.gguf", "--frobnicate")
    assert proc.returncode == 2 and "--frobnicate" in proc.stderr.splitlines()[0]


def test_llama_server_flag_without_equivalent_says_what_to_use():
    """A llama-server flag Kinetic has no equivalent for stops with a line saying what to use instead."""
    proc = serve("-m", "model.gguf", "-hf", "org/repo")
    assert proc.returncode == 2 and "kinetic pull" in proc.stderr and "Traceback" not in proc.stderr


def test_port_in_use_fails_cleanly(tmp_path):
    """A port another program holds fails at once with a `kinetic: cannot listen` line, before loading."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        proc = serve(str(tmp_path / "missing.gguf"), "--port", str(held.getsockname()[1]))
    assert proc.returncode == 1 and proc.stderr.startswith("kinetic: cannot listen on 127.0.0.1:")


def test_no_model_is_an_error():
    """Without a model, serve exits 1 with the usage line."""
    proc = serve()
    assert proc.returncode == 1 and "no model given" in proc.stderr
