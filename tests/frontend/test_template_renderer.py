"""The renderer processes: budgets enforced, renders cancellable, shutdown and exit never held up.

A hostile template here is an endless loop (it never returns by itself), so each test that stops one
also checks that its renderer process is gone afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kinetic.errors import KineticError
from kinetic.frontend import template_pool
from kinetic.frontend.chat import ChatTemplate, RenderBudget, RenderCancelled
from kinetic.frontend.template_pool import POOL, RenderPool

ENDLESS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
SLOW_BUDGET = RenderBudget(timeout_s=60.0)  # the render would run a minute unless something stops it
MESSAGES = [{"role": "user", "content": "hi"}]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _in_thread(template: ChatTemplate, **kwargs) -> tuple[threading.Thread, dict]:
    """Render in a thread; the result or the exception lands in the returned dict."""
    result: dict = {}

    def work():
        try:
            result["text"] = template.render_cancellable(MESSAGES, **kwargs)
        except BaseException as exc:  # the test inspects whatever ended the render
            result["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    return thread, result


def test_cancel_stops_the_render_and_kills_its_renderer():
    """Once cancel returns True the render ends with RenderCancelled within a poll, its process dead."""
    template = ChatTemplate.from_string(ENDLESS, budget=SLOW_BUDGET)
    stop = threading.Event()
    pids = set(POOL.pids())
    thread, result = _in_thread(template, cancel=stop.is_set)
    time.sleep(0.3)
    busy = set(POOL.pids()) | pids
    stop.set()
    start = time.monotonic()
    thread.join(5)
    assert time.monotonic() - start < 1.0
    assert isinstance(result["error"], RenderCancelled)
    assert all(_gone(pid) for pid in busy - set(POOL.pids()))
    assert len(busy - set(POOL.pids())) >= 1


def test_cancel_may_raise_its_own_exception():
    """An exception raised by cancel (anyio's cancellation in the server) propagates unchanged."""

    class ClientLeft(Exception):
        pass

    deadline = time.monotonic() + 0.3

    def cancel() -> bool:
        if time.monotonic() > deadline:
            raise ClientLeft()
        return False

    with pytest.raises(ClientLeft):
        ChatTemplate.from_string(ENDLESS, budget=SLOW_BUDGET).render_cancellable(MESSAGES, cancel=cancel)


def test_shutdown_ends_a_render_in_progress():
    """POOL.shutdown() kills a busy renderer: its render fails at once, and the next render works."""
    template = ChatTemplate.from_string(ENDLESS, budget=SLOW_BUDGET)
    thread, result = _in_thread(template)
    time.sleep(0.3)
    start = time.monotonic()
    POOL.shutdown()
    thread.join(5)
    assert time.monotonic() - start < 1.0
    assert isinstance(result["error"], KineticError) and "renderer stopped" in result["error"].message
    assert ChatTemplate.from_string("{{ messages[0].content }}").render(MESSAGES) == "hi"


def test_interpreter_exit_waits_for_a_render_at_most_its_budget():
    """A process whose main thread ends while another thread renders an endless template exits once the
    render's 1 s budget is spent (the old in-process render never returned)."""
    root = Path(__file__).resolve().parents[2]
    script = (
        "import threading\n"
        "from kinetic.frontend.chat import ChatTemplate, RenderBudget\n"
        f"t = ChatTemplate.from_string({ENDLESS!r}, budget=RenderBudget(timeout_s=1.0))\n"
        "def work():\n"
        "    try:\n"
        "        t.render([])\n"
        "    except Exception as e:\n"
        "        print(type(e).__name__, e)\n"
        "threading.Thread(target=work).start()\n"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=30)
    assert time.monotonic() - start < 10
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("KineticError chat template at line 1: the template ran longer")


def test_a_killed_renderer_is_a_clean_error_and_is_replaced():
    """A renderer killed from outside mid-render gives a KineticError naming the signal; the next render works."""
    thread, result = _in_thread(ChatTemplate.from_string(ENDLESS, budget=SLOW_BUDGET))
    time.sleep(0.3)
    killed = POOL.pids()
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    thread.join(5)
    assert isinstance(result["error"], KineticError) and "killed by signal 9" in result["error"].message
    assert ChatTemplate.from_string("{{ messages[0].content }}").render(MESSAGES) == "hi"
    assert all(_gone(pid) for pid in killed)


def test_a_hostile_render_does_not_hold_up_another():
    """While one renderer runs an endless template, an ordinary render still answers quickly."""
    thread, result = _in_thread(ChatTemplate.from_string(ENDLESS, budget=RenderBudget(timeout_s=5.0)))
    time.sleep(0.3)
    template = ChatTemplate.from_string("{{ messages[0].content }}!")
    start = time.monotonic()
    assert template.render(MESSAGES) == "hi!"
    assert time.monotonic() - start < 3.0  # at most a renderer start, never the other render's 5 s
    thread.join(10)
    assert "time budget of 5 s" in result["error"].message


def test_warm_renderer_is_reused():
    """Consecutive ordinary renders go to the same renderer process (no start-up per render)."""
    template = ChatTemplate.from_string("{{ messages|length }}")
    template.render(MESSAGES)
    pids = POOL.pids()
    for _ in range(5):
        assert template.render(MESSAGES) == "1"
    assert POOL.pids() == pids


def test_memory_budget_is_what_stops_a_large_allocation():
    """A 100-million-character string fits the default memory budget (the output budget stops it) but
    not a 64 MiB one: the memory limit is applied to the renderer, not assumed."""
    source = "{{ '%0100000000d' % (messages|length) }}"
    with pytest.raises(KineticError, match="output passed its budget"):
        ChatTemplate.from_string(source).render([])
    with pytest.raises(KineticError, match="memory budget of 64 MiB"):
        ChatTemplate.from_string(source, budget=RenderBudget(max_memory_bytes=64 * 1024 * 1024)).render([])


def test_output_budget_is_configurable():
    """An output one character over max_output_chars is refused; one at it is rendered."""
    budget = RenderBudget(max_output_chars=10)
    assert ChatTemplate.from_string("{{ 'x' * 10 }}", budget=budget).render([]) == "x" * 10
    with pytest.raises(KineticError, match="output passed its budget of 10 characters"):
        ChatTemplate.from_string("{{ 'x' * 10 }}y", budget=budget).render([])


def test_time_budget_names_the_template_line():
    """A render past its time budget says which template line it was running."""
    template = ChatTemplate.from_string("ok\n" + ENDLESS, budget=RenderBudget(timeout_s=0.3))
    start = time.monotonic()
    with pytest.raises(KineticError, match=r"at line 2: the template ran longer than its time budget of 0.3 s"):
        template.render([])
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("field", ["timeout_s", "max_output_chars", "max_memory_bytes"])
@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "2", True])
def test_budget_values_must_be_positive_numbers(field, value):
    with pytest.raises(KineticError, match=f"template budget's {field} must be a positive number"):
        RenderBudget(**{field: value})


def test_odd_values_cross_to_the_renderer_unchanged():
    """Lone surrogates, non-ASCII text, NaN, big integers and nested data reach the template as given."""
    messages = [{"role": "user", "content": "a\ud800b é 😀", "n": float("nan"), "big": 10**40,
                 "nested": {"k": [1, None, True]}}]
    source = "{{ messages[0].content }}|{{ messages[0].n }}|{{ messages[0].big }}|{{ messages[0].nested|tojson }}"
    text = ChatTemplate.from_string(source).render(messages)
    assert text == 'a\ud800b é 😀|nan|' + str(10**40) + '|{"k": [1, null, true]}'


def test_a_large_legitimate_prompt_renders_exactly():
    """A 15-million-character message (near the server's 16 MiB body limit) renders in full within the
    default budget."""
    content = "é" * (15 * 1024 * 1024)
    text = ChatTemplate.from_string("[{{ messages[0].content }}]").render([{"role": "user", "content": content}])
    assert text == f"[{content}]"


def test_messages_that_cannot_cross_are_a_clear_error():
    """An integer past Python's digit limit or nesting past the stack is a KineticError, not a crash."""
    template = ChatTemplate.from_string("{{ messages|length }}")
    with pytest.raises(KineticError, match="cannot be given to the template"):
        template.render([{"role": "user", "content": 10**5000}])
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(KineticError, match="nest too deeply"):
        template.render([{"role": "user", "content": deep}])


def _fake_renderer(monkeypatch, body: str) -> RenderPool:
    """A pool whose renderers run `body` after sending a proper ready frame."""
    script = ("import json, os, sys\n"
              "def send(data): os.write(1, len(data).to_bytes(4, 'big') + data)\n"
              "send(json.dumps({'ready': True}).encode())\n"
              "sys.stdin.buffer.read(4)\n" + body)
    monkeypatch.setattr(template_pool, "_COMMAND", (sys.executable, "-c", script))
    return RenderPool(size=1)


@pytest.mark.parametrize("body", [
    "os.write(1, (2**31).to_bytes(4, 'big'))\nimport time; time.sleep(30)",  # a frame past the answer cap
    "send(b'not json')\nimport time; time.sleep(30)",
    "send(b'[1, 2]')\nimport time; time.sleep(30)",
    "sys.exit(0)",
])
def test_a_renderer_answering_garbage_is_a_stopped_render(monkeypatch, body):
    """Whatever a (compromised) renderer sends back, the caller gets a "stopped" failure, never an
    exception, and the renderer is killed."""
    pool = _fake_renderer(monkeypatch, body)
    answer = pool.run(b"{}", RenderBudget(timeout_s=1.0))
    assert answer["error"] == "stopped"
    assert pool.pids() == []


def test_a_renderer_that_cannot_start_is_a_clear_error(monkeypatch):
    """A renderer that exits before its ready frame is a KineticError with its exit status."""
    monkeypatch.setattr(template_pool, "_COMMAND", (sys.executable, "-c", "import sys; sys.exit(3)"))
    with pytest.raises(KineticError, match=r"renderer did not start \(exit status 3\)"):
        RenderPool(size=1).run(b"{}", RenderBudget())
