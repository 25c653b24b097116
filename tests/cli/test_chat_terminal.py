"""`kinetic chat` in a real terminal (a pseudo-terminal driven by pexpect), as a person uses it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pexpect = pytest.importorskip("pexpect")

READY = "\x1b[?2004h"  # prompt_toolkit turns bracketed paste on when the prompt waits for a message
SENT = "\x1b[?2004l"  # and off once Enter sent it


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def spawn_chat(*flags: str, sigint_ignored: bool = False):
    """chat in a terminal; `sigint_ignored`: started by a program that ignores SIGINT (inherited)."""
    env = dict(os.environ, TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
    child = pexpect.spawn(sys.executable, ["-m", "kinetic.cli.main", "chat", "smollm2-135m", *flags], env=env,
                          encoding="utf-8", timeout=60, dimensions=(50, 200),
                          preexec_fn=_ignore_sigint if sigint_ignored else None)
    child.expect("Ctrl\\+D quits")
    child.expect_exact(READY)
    return child


def say(child, line: str) -> str:
    """Send one line; the text printed until the next prompt."""
    child.sendline(line)
    child.expect_exact(READY)
    return child.before


def quit_with_ctrl_d(child) -> int:
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def test_two_turns_commands_and_receipt(smollm2_path, tmp_path):
    """Two turns (the second pasted as two lines, one message, reusing the first's cache), /receipt
    FILE (a receipt that `kinetic verify-receipt` verifies), /system and /clear (each a new conversation), /think on a
    model that does not reason (said plainly), and Ctrl+D, which exits 0."""
    child = spawn_chat("--temp", "0", "-n", "24", "-c", "1024")
    first = say(child, "Say hello.")
    assert "0 reused]" in first
    child.send("\x1b[200~Say it\nagain.\x1b[201~")  # a bracketed paste of two lines, then Enter
    second = say(child, "")
    assert "reused]" in second and "0 reused]" not in second  # only the new message was processed
    receipt = tmp_path / "answer.json"
    assert "receipt written to" in say(child, f"/receipt {receipt}")
    assert "exists already" in say(child, f"/receipt {receipt}")  # never over a file without --force
    assert "does not reason" in say(child, "/think")
    assert "new conversation" in say(child, "/system You answer in one word.")
    assert "0 reused]" not in say(child, "Name a colour.")  # the chat template's opening is kept
    assert "new conversation" in say(child, "/clear")
    assert quit_with_ctrl_d(child) == 0
    assert json.loads(receipt.read_text())["input"][-1] == {"role": "user", "content": "Say it\nagain."}
    verify = subprocess.run([sys.executable, "-m", "kinetic.cli.main", "verify-receipt", str(receipt)],
                            capture_output=True, text=True, timeout=120)
    rerun = verify.stdout
    if verify.returncode != 0:  # a tree edited between the chat and the rerun is another build: same tokens asked
        differs = [line for line in rerun.splitlines() if line.startswith("differs:")]
        assert differs and all(line.split()[1] == "build" for line in differs), rerun + verify.stderr
    assert "identical" in rerun or re.search(r"the same (\d+) of \1 output tokens", rerun), rerun


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["sigint-default", "sigint-ignored-by-parent"])
def test_ctrl_c_stops_the_answer_and_the_chat_goes_on(smollm2_path, sigint_ignored):
    """Ctrl+C while an answer is being written stops that answer, the program stays, and the next
    message is answered; /exit quits with 0. Also when chat was started by a program that ignores
    SIGINT (an inherited SIG_IGN: the full test run's pytest had one and Ctrl+C did nothing)."""
    child = spawn_chat("--temp", "0", "--ignore-eos", "-n", "300", "-c", "1024", sigint_ignored=sigint_ignored)
    child.sendline("Tell me a long story about a lighthouse.")
    child.expect_exact(SENT)
    child.expect(r"\w+ \w+ \w+")  # the answer has started streaming
    child.sendintr()
    child.expect_exact("[stopped]")
    child.expect_exact(READY)
    child.expect_exact(">")  # the prompt is drawn: keys sent before it can be lost on a loaded machine
    time.sleep(0.5)
    child.sendline("Say hello.")
    child.expect_exact(SENT)
    child.expect(r"\[300 tokens at [0-9.]+ tok/s")  # answered in full
    child.expect_exact(READY)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_without_a_terminal_each_line_is_a_message(smollm2_path):
    """With stdin a pipe, chat answers one message per line and prints each answer; after /clear the
    same message gets the same (greedy) answer as at the start, so the conversation really restarted."""
    proc = subprocess.run([sys.executable, "-m", "kinetic.cli.main", "chat", "smollm2-135m", "--temp", "0", "-n", "8",
                           "-c", "512"], input="Say hello.\nAnd again.\n/clear\nSay hello.\n", capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answers = proc.stdout.strip("\n").split("\n")
    assert len(answers) >= 3 and answers[0] == answers[-1] and answers[0]
    assert "new conversation" in proc.stderr
