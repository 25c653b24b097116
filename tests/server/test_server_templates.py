"""A chat template that never finishes, served: the request is refused at the budget, the server
stays responsive, and Ctrl+C stops it promptly (issue 16, problem 3)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.server.conftest import ServeProcess

ENDLESS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture()
def endless_server(tmp_path):
    template = tmp_path / "endless.jinja"
    template.write_text(ENDLESS)
    serve = ServeProcess("--chat-template-file", str(template), "--template-timeout", "1")
    yield serve
    serve.stop()
    assert "Traceback" not in "".join(serve.stderr)


def test_endless_template_is_refused_at_the_budget_while_health_answers(endless_server):
    """A chat request whose template never ends answers 400 naming the budget after about 1 s, and
    /health answers at once while the render runs."""
    result: dict = {}

    def chat():
        start = time.monotonic()
        result["response"] = httpx.post(f"{endless_server.url}/v1/chat/completions", json=CHAT, timeout=30)
        result["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=chat)
    thread.start()
    time.sleep(0.3)
    start = time.monotonic()
    assert httpx.get(f"{endless_server.url}/health", timeout=5).status_code == 200
    assert time.monotonic() - start < 0.5
    thread.join(30)
    response = result["response"]
    assert response.status_code == 400
    assert "ran longer than its time budget of 1 s" in response.json()["error"]["message"]
    assert result["seconds"] < 4


def test_ctrl_c_during_an_endless_render_stops_the_server(endless_server):
    """SIGINT while a render runs ends the server within the budget plus the kill grace."""
    threading.Thread(target=lambda: httpx.post(f"{endless_server.url}/v1/chat/completions", json=CHAT, timeout=30),
                     daemon=True).start()
    time.sleep(0.3)
    start = time.monotonic()
    endless_server.proc.send_signal(signal.SIGINT)
    endless_server.proc.wait(timeout=30)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_template_timeout_must_be_positive(value, tmp_path):
    """--template-timeout 0, negative, nan or inf stops with a line naming the flag, before loading."""
    proc = subprocess.run([sys.executable, "-m", "kinetic.cli.main", "serve", str(tmp_path / "missing.gguf"),
                           "--template-timeout", value], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith("kinetic: --template-timeout must be a positive number")
