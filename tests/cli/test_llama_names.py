"""A copy or link of `kinetic` named llama-server, llama-cli or llama-completion behaves as serve,
chat (run when given a prompt) and run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kinetic.cli.main import program_command


@pytest.mark.parametrize(("program", "command"), [("llama-server", "serve"), ("/usr/local/bin/llama-cli", "run"),
                                                  ("llama-completion.exe", "run"), ("kinetic", None),
                                                  ("llama-bench", None)])
def test_program_names(program, command):
    """The program's base name picks the command; .exe and folders do not matter; others are kinetic."""
    assert program_command(program) == command


@pytest.fixture
def linked(tmp_path):
    """The installed `kinetic` executable under another name, through a symbolic link."""
    exe = shutil.which("kinetic") or str(Path(sys.executable).with_name("kinetic"))
    if not Path(exe).is_file():
        pytest.skip("no kinetic executable installed")

    def link(name: str) -> str:
        (tmp_path / name).symlink_to(exe)
        return str(tmp_path / name)

    return link


def test_linked_names_run_their_commands(linked, smollm2_path):
    """llama-server --help is serve's help; llama-completion and llama-cli with -p answer as run does,
    with llama.cpp's flags (-sys, -fa, --jinja) as llama.cpp reads them."""
    served = subprocess.run([linked("llama-server"), "--help"], capture_output=True, text=True, timeout=60)
    assert served.returncode == 0 and "Serve a model over HTTP" in served.stdout
    flags = ["-m", str(smollm2_path), "-p", "Say hi.", "-n", "3", "--temp", "0", "-sys", "Be brief.", "-fa", "on",
             "--jinja"]
    for name in ("llama-completion", "llama-cli"):
        proc = subprocess.run([linked(name), *flags], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "[3 tokens at" in proc.stderr and proc.stdout.strip()


def test_llama_cli_without_a_prompt_in_a_terminal_is_a_chat(linked, smollm2_path):
    """llama-cli with no prompt and a terminal on stdin opens kinetic chat (llama-cli's conversation)."""
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(linked("llama-cli"), ["-m", str(smollm2_path), "-c", "512"], encoding="utf-8",
                          timeout=60, env={"TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1",
                                           "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    child.expect("Ctrl\\+D quits")
    child.expect_exact("\x1b[?2004h")  # the prompt waits for a message
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
