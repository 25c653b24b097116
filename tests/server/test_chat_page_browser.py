"""The chat page in a real headless Chromium (Debian's `chromium`, installed by scripts/setup-and-test)
against a live `kinetic serve smollm2-135m`: it loads under its strict CSP, streams an answer that
grows on screen, stops one mid-stream (and the server stops generating), keeps the conversation
across a reload, never turns model text into HTML, and asks for the key of a server that needs one.
A screenshot goes to $KINETIC_TEST_ARTIFACTS (else the test's tmp dir).

Driven by playwright's Python package through its own driver, pointed at the system browser with
executable_path (no browser download): it waits on page state without sleeps and reports console
errors, which a hand-written DevTools-protocol client would have to re-implement.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from tests.server.conftest import ServeProcess, wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine: scripts/setup-and-test installs "
                                                          "Debian's chromium package (apt-get install chromium)")
MODEL = "SmolLM2-135M-Instruct.Q4_1"
# Records every length the last message's text takes while it streams (read back with evaluate).
WATCH = """() => {
  window.lengths = [];
  new MutationObserver(() => {
    const last = document.querySelector('#conversation .message:last-child');
    const text = last && last.dataset.state === 'streaming' && last.querySelector('.content').textContent;
    if (text) window.lengths.push(text.length);
  }).observe(document.getElementById('conversation'), {childList: true, subtree: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox cannot start; /dev/shm may be small there
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def url():
    serve = ServeProcess("-c", "2048")  # room for a story far longer than the test waits
    yield serve.url
    serve.stop()
    assert "Traceback" not in "".join(serve.stderr)


@pytest.fixture
def page(browser):
    context = browser.new_context()
    tab = context.new_page()
    tab.errors = []
    tab.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: tab.errors.append(str(e)))
    yield tab
    context.close()


def artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("KINETIC_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def processing(url: str) -> int:
    """Answers the server is generating now (/metrics, llama-server's requests_processing)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return int(re.search(r"^llamacpp:requests_processing (\d+)", text, re.MULTILINE).group(1))


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def last_message(page):
    return page.locator("#conversation .message").last


def test_page_streams_an_answer_stops_one_and_keeps_the_conversation(page, url, tmp_path):
    """/v1 in the browser lands on the page, which names the model; a greedy answer grows on
    screen and ends with its speed; after New chat, Stop ends a long answer at once, the server
    stops generating, and the conversation survives a reload. No console error (a CSP violation
    would be one)."""
    page.goto(url + "/v1")
    assert page.url == url + "/"
    expect(page.locator("#model")).to_have_text(MODEL)
    page.click("#settings-button")
    page.fill("#temperature", "0")
    page.evaluate(WATCH)
    send(page, "Say hello in one short sentence.")
    page.wait_for_selector("#conversation .message.assistant[data-state=done]", timeout=30_000)
    lengths = page.evaluate("window.lengths")
    assert len(set(lengths)) >= 2, lengths  # seen while streaming, more than once
    answer = last_message(page).locator(".content").inner_text()
    assert answer and "tokens/s" in last_message(page).locator(".note").inner_text()
    assert "tokens/s" in page.inner_text("#speed")

    page.click("#clear")  # New chat: the story asked alone runs (greedy) to the end of the context
    assert page.locator("#conversation .message").count() == 0
    send(page, "Write a very long story about a dragon who learns to fly.")
    page.wait_for_function("() => document.querySelector('#conversation .message:last-child .content')"
                           ".textContent.length > 20", timeout=30_000)
    assert page.is_visible("#stop") and not page.is_visible("#send")
    page.click("#stop")
    page.wait_for_selector("#conversation .message.assistant[data-state=stopped]", timeout=5_000)
    stopped = last_message(page).locator(".content").inner_text()
    # unstopped, the greedy story fills the 2048-token context: about a minute on 2 CPUs
    assert wait_until(lambda: processing(url) == 0, 5)
    assert last_message(page).locator(".content").inner_text() == stopped and page.is_visible("#send")
    shot = artifacts(tmp_path) / "chat-page.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 1000

    page.reload()
    expect(page.locator("#model")).to_have_text(MODEL)
    assert page.locator("#conversation .message").count() == 2
    assert last_message(page).locator(".content").inner_text() == stopped
    assert "stopped" in last_message(page).locator(".note").inner_text()
    assert page.errors == []


def test_model_text_is_never_html(page, url):
    """An answer holding HTML (an <img onerror>, a <script> in a code fence) is shown as text: no
    element is made from it and nothing in it runs; the fence becomes <pre><code>."""
    answer = ('Look: <img src=x onerror="window.pwned=1"> <b>bold</b>\n'
              '```html\n<script>window.pwned=2</script>\n```\nend')
    chat = {"messages": [{"role": "user", "content": "<i>hi</i>"}, {"role": "assistant", "content": answer}],
            "settings": {}}
    page.goto(url + "/", wait_until="domcontentloaded")
    page.evaluate("chat => localStorage.setItem('kinetic-chat', JSON.stringify(chat))", chat)
    page.reload()
    page.wait_for_selector("#conversation .message.assistant")
    assert page.locator("#conversation img, #conversation script, #conversation b, #conversation i").count() == 0
    assert page.evaluate("window.pwned") is None
    code = page.locator("#conversation pre > code.language-html")
    assert code.inner_text() == "<script>window.pwned=2</script>"
    assert '<img src=x onerror="window.pwned=1">' in page.locator("#conversation .message.assistant").inner_text()
    assert page.locator("#conversation .message.user").inner_text().endswith("<i>hi</i>")
    assert page.errors == []


def test_page_asks_for_the_key_of_a_server_that_needs_one(page):
    """Against kinetic serve --api-key, the page loads, asks for the key, says when one is refused,
    and with the right one names the model and gets an answer."""
    serve = ServeProcess("--api-key", "sekrit")
    try:
        page.goto(serve.url + "/")
        page.wait_for_selector("#key-form", state="visible")
        page.fill("#key-input", "wrong")
        page.click("#key-form button")
        page.wait_for_selector("#key-error", state="visible")
        page.fill("#key-input", "sekrit")
        page.click("#key-form button")
        expect(page.locator("#model")).to_have_text(MODEL)
        assert not page.is_visible("#key-form")
        page.click("#settings-button")
        page.fill("#max-tokens", "8")
        started = time.monotonic()
        send(page, "Hi!")
        page.wait_for_selector("#conversation .message.assistant[data-state=done]", timeout=30_000)
        assert last_message(page).locator(".content").inner_text() and time.monotonic() - started < 30
        # the browser's own 401 for the first /v1/models is a console error; nothing else may be
        assert all("401" in e for e in page.errors), page.errors
    finally:
        serve.stop()
