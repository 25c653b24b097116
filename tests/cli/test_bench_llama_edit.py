"""`kinetic bench --compare`'s edit test on llama.cpp's side: llama-server started beside llama-bench
with the asked speculative mode (fakes: tests/cli/bench_fakes.py), the card's edit row and line, the
server skipped when absent or too old, and always stopped (Ctrl-C included).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kinetic import bench, bench_card, bench_edit, bench_llama, bench_llama_edit
from tests.cli.bench_fakes import SPEC_LINE, kinetic, write_fake_server

pytestmark = pytest.mark.usefixtures("no_ik_llama_cpp")  # no test runs a real ik_llama.cpp


def kinetic_edit(tokens: int, seconds: float, text: str) -> bench.BenchResult:
    """A BenchResult with only an edit test, as if Kinetic had measured it."""
    edit = bench_edit.EditResult(
        256, True, list(range(tokens)), list(range(tokens)), [seconds], [seconds * 3], text=text, prompt_tokens=99
    )
    return bench.BenchResult(Path("SmolLM2.gguf"), "cpu", 2, 1, [], 0.1, 100, 10, "Q4_1", 0, edit=edit)


LL = bench_llama.LlamaBenchResult(4242, "0c1e570", {"pp512": 300.0, "tg128": 120.0}, {"pp512": 290.0, "tg128": 115.0})


def test_card_with_llama_edit():
    """The edit row puts llama-server's best first-to-last speed beside Kinetic's, with the ratio, in the card
    and its JSON, and the line says the speculative mode and whether the answers agree (a difference is no failure)."""
    k = kinetic_edit(101, 0.5, "same answer")  # 100 tokens after the first in 0.5 s: 200 t/s
    le = bench_llama_edit.LlamaEditResult(
        "ngram-mod", counts=[51, 51], seconds=[1.0, 0.5], text="same answer", prompt_tokens=99
    )
    assert le.best == pytest.approx(100.0)
    card = bench_card.card(k, LL, le)
    assert "| edit256 | 200.0 | 100.0 | 2.00x |" in card
    assert (
        "llama.cpp speculative mode ngram-mod" in card
        and "identical to plain decoding: yes" in card
        and "llama.cpp's answer identical to Kinetic's: yes." in card
    )
    js = bench_card.card_json(k, LL, le)
    assert js["tests"][-1] == {"test": "edit256", "kinetic_t_s": 200.0, "llama_cpp_t_s": 100.0, "ratio": 2.0}
    assert js["llama_cpp"]["edit"] == {
        "spec_type": "ngram-mod",
        "t_s": 100.0,
        "runs": [50.0, 100.0],
        "tokens": 51,
        "prompt_tokens": 99,
        "identical_to_kinetic": True,
    }
    le.text = "other answer"
    assert "identical to Kinetic's: no (llama.cpp is not batch-invariant" in bench_card.card(k, LL, le)
    assert bench_card.card_json(k, LL, le)["llama_cpp"]["edit"]["identical_to_kinetic"] is False


def test_missing_llama_server_is_skipped(monkeypatch, tmp_path):
    """No llama-server anywhere: the edit test is not run, the card says why, and its llama.cpp cell is empty."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(bench_llama, "LLAMA_BENCH_PLACES", (tmp_path / "bin" / "llama-bench",))
    assert bench_llama.find_llama_server(tmp_path / "llama-bench") is None
    le = bench_llama_edit.run_llama_edit(None, tmp_path / "m.gguf", threads=2, repetitions=1, n_edit=256)
    k = kinetic_edit(101, 0.5, "x")
    card = bench_card.card(k, LL, le)
    assert "| edit256 | 200.0 | not run | - |" in card
    assert "llama.cpp's edit test (llama-server) not run: llama-server not found" in card
    assert bench_card.card_json(k, LL, le)["llama_cpp"]["edit"]["not_run"].startswith("llama-server not found")


def test_llama_server_without_spec_type_is_skipped(tmp_path):
    """A llama-server whose --help has no --spec-type (or not the asked mode) is not started; the reason says so."""
    old = write_fake_server(tmp_path, ["x"], spec_line="-t, --threads N   threads")
    le = bench_llama_edit.run_llama_edit(old, tmp_path / "m.gguf", threads=2, repetitions=1, n_edit=256)
    assert le.not_run == f"{old} has no --spec-type (too old a build)" and not (tmp_path / "server_argv.json").exists()
    new = write_fake_server(tmp_path, ["x"])
    le = bench_llama_edit.run_llama_edit(new, tmp_path / "m.gguf", threads=2, repetitions=1, n_edit=256,
                                         spec_type="ngram-x")
    assert le.not_run == f"{new} has no --spec-type ngram-x"


def test_spec_types():
    """--spec-type's values are read from its --help line."""
    expected = ["none", "draft-simple", "ngram-simple", "ngram-mod"]
    assert bench_llama_edit.spec_types("x\n" + SPEC_LINE + "\n") == expected
    assert bench_llama_edit.spec_types("--spec-draft-n-max N   tokens") == []


def test_compare_runs_llama_server_edit(capsys, smollm2_path, fake_llama_bench):
    """--compare starts the llama-server beside llama-bench with the same file and threads and the asked
    speculative mode, sends the edit request greedy and streamed, and stops the server afterwards."""
    exe, _ = fake_llama_bench
    write_fake_server(exe.parent, ["```python\n", "def", " f", "():\n", "```"])
    args = ["-p", "8", "-n", "4", "-t", "2", "-r", "1", "--edit-tokens", "8", "--compare", str(exe)]
    code, out, _ = kinetic(capsys, "bench", str(smollm2_path), *args, "--llama-spec", "ngram-simple", "--json")
    assert code == 0, out
    argv = json.loads((exe.parent / "server_argv.json").read_text())
    assert argv[:2] == ["-m", str(smollm2_path)]
    assert " ".join(argv[2:15]) == "-t 2 -c 1032 -np 1 -ngl 0 -fa on --host 127.0.0.1 --port"
    assert int(argv[15]) > 0 and argv[16:] == ["--spec-type", "ngram-simple", "-dev", "none"]
    request = json.loads((exe.parent / "server_request.json").read_text())
    assert request["messages"] == [{"role": "user", "content": bench_edit.EDIT_REQUEST}]
    assert request["temperature"] == 0 and request["max_tokens"] == 8 and request["stream"] is True
    card = json.loads(out)
    edit = card["llama_cpp"]["edit"]
    assert edit["spec_type"] == "ngram-simple" and edit["tokens"] == 6 and edit["prompt_tokens"] == 99
    assert edit["identical_to_kinetic"] is False  # the fake's answer is not SmolLM2's
    assert 0 < edit["t_s"] < 5 / 0.04  # 5 tokens after the first, 10 ms apart at least
    row = card["tests"][-1]
    assert row["test"] == "edit8" and row["ratio"] == pytest.approx(row["kinetic_t_s"] / row["llama_cpp_t_s"], abs=1e-3)
    pid = int((exe.parent / "server_pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped and reaped


def test_compare_edit_alone_skips_llama_bench(capsys, smollm2_path, fake_llama_bench):
    """-p 0 -n 0 --compare runs the edit test alone on both sides: llama-bench, which would have no
    test to run (the real one then prints no JSON list), is not started, and the card says so."""
    exe, log = fake_llama_bench
    write_fake_server(exe.parent, ["```python\n", "def", " f", "():\n", "```"])
    args = ["-p", "0", "-n", "0", "-t", "2", "-r", "1", "--edit-tokens", "8", "--compare", str(exe)]
    code, out, _ = kinetic(capsys, "bench", str(smollm2_path), *args, "--json")
    assert code == 0, out
    assert not log.exists()  # llama-bench never ran
    card = json.loads(out)
    assert card["llama_cpp"]["build"] == "(llama-bench not run)" and card["llama_cpp"]["best_t_s"] == {}
    assert [row["test"] for row in card["tests"]] == ["edit8"] and card["llama_cpp"]["edit"]["tokens"] == 6


def test_llama_server_stopped_on_ctrl_c(monkeypatch, tmp_path):
    """Ctrl-C during the edit request still stops llama-server (the interrupt itself propagates)."""
    exe = write_fake_server(tmp_path, ["x"])

    def interrupted(url, n_edit):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_llama_edit, "stream_edit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench_llama_edit.run_llama_edit(exe, tmp_path / "m.gguf", threads=2, repetitions=1, n_edit=8)
    pid = int((tmp_path / "server_pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
