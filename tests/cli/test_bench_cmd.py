"""`kinetic bench`: its JSON and table on the real SmolLM2 file, its errors, and the --compare card.

llama.cpp is never run here: --compare runs a fake llama-bench that prints llama-bench's JSON shape
(taken from a real `llama-bench -o json` run) with known speeds, and a fake llama-server that streams
a chat answer as llama-server's OpenAI endpoint does, so the card's numbers can be checked.
Token counts are tiny (-p 8 -n 4) so the whole file runs in a few seconds.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from kinetic import __version__, bench, bench_card, bench_edit, bench_llama, bench_llama_edit
from kinetic.cli import main as cli

QUICK = ["-p", "8", "-n", "4", "-t", "2", "--edit-tokens", "0"]  # the edit test has its own tests below


@pytest.fixture(autouse=True)
def no_ik_llama_cpp(monkeypatch, tmp_path_factory):
    """No test runs a real ik_llama.cpp: its usual place is an empty folder and the variable is unset."""
    monkeypatch.delenv(bench_llama.IK_LLAMA_BENCH_ENV, raising=False)
    monkeypatch.setattr(bench_llama, "IK_LLAMA_BENCH_PLACES", (tmp_path_factory.mktemp("no-ik") / "llama-bench",))


def test_bench_is_a_command():
    assert "bench" in cli.COMMANDS


def kinetic(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def llama_bench_json(n_prompt: int, n_gen: int, samples: list[float]) -> dict:
    """One test of `llama-bench -o json`, with the fields Kinetic reads and a few it ignores."""
    return {
        "build_commit": "0c1e570",
        "build_number": 4242,
        "cpu_info": "AMD EPYC",
        "backends": "CPU",
        "model_size": 96576768,
        "model_n_params": 134515008,
        "n_threads": 2,
        "n_gpu_layers": 0,
        "flash_attn": 1,
        "devices": "none",
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "avg_ts": sum(samples) / len(samples),
        "stddev_ts": 1.0,
        "samples_ts": samples,
    }


FAKE_LLAMA_BENCH = """#!{python}
import json, pathlib, sys
args = sys.argv[1:]
if "--help" in args:
    print("  -fa, --flash-attn <on|off|auto>   (default: auto)")
    print("  -dev, --device <dev0/dev1/...>    (default: auto)")
    sys.exit(0)
here = pathlib.Path(sys.argv[0]).parent
(here / "argv.json").write_text(json.dumps(args))
pp, tg = json.loads((here / "answer.json").read_text())
pp["n_prompt"] = int(args[args.index("-p") + 1])
tg["n_gen"] = int(args[args.index("-n") + 1])
print(json.dumps([pp, tg], indent=2))
"""


@pytest.fixture
def fake_llama_bench(tmp_path):
    """An executable that answers as llama-bench does: pp best 400 t/s, tg best 200 t/s; logs its argv."""
    answer = [llama_bench_json(0, 0, [380.0, 400.0]), llama_bench_json(0, 0, [200.0, 190.0])]
    (tmp_path / "answer.json").write_text(json.dumps(answer))
    exe = tmp_path / "llama-bench"
    exe.write_text(FAKE_LLAMA_BENCH.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, tmp_path / "argv.json"


def test_json_report(capsys, smollm2_path):
    """--json prints one object with both tests, each best of -r runs, and no edit test when it is skipped."""
    code, out, _ = kinetic(capsys, "bench", str(smollm2_path), *QUICK, "-r", "2", "--off", "torque,rad1", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["model"] == smollm2_path.name and report["backend"] == "cpu" and report["threads"] == 2
    assert report["size_bytes"] == smollm2_path.stat().st_size and report["parameters"] == 134515008
    assert [t["name"] for t in report["tests"]] == ["pp8", "tg4"]
    for test in report["tests"]:
        assert len(test["runs"]) == 2 and test["t_s"] == max(test["runs"]) > 0
        assert min(test["runs"]) <= test["mean"] <= test["t_s"] and test["stddev"] >= 0
    assert report["prefill_tokens_per_second"] == report["tests"][0]["t_s"]
    assert report["edit_tokens"] == 0 and report["edit_identical"] is None
    assert report["technologies"] == "on: Shortlist"
    assert report["off"] == ["torque", "rad1"] and report["load_seconds"] > 0
    assert report["peak_rss_bytes"] > smollm2_path.stat().st_size and report["kinetic_version"] == __version__


def test_compare_card(capsys, smollm2_path, fake_llama_bench):
    """--compare runs llama-bench with the same settings and puts its best sample beside Kinetic's best."""
    exe, log = fake_llama_bench
    code, out, _ = kinetic(capsys, "bench", str(smollm2_path), *QUICK, "-r", "1", "--compare", str(exe))
    assert code == 0, out
    argv = json.loads(log.read_text())
    assert argv[:2] == ["-m", str(smollm2_path)]
    assert " ".join(argv[2:]) == "-t 2 -r 1 -p 8 -n 4 -fa on -ngl 0 -o json -dev none"
    table, card = out.split("## Kinetic vs llama.cpp: ")
    assert "| pp8 |" in table and "| tg4 |" in table and "| edit256 | not measured |" in table
    lines = card.splitlines()
    assert lines[0] == smollm2_path.stem
    assert lines[2] == f"| test | Kinetic {__version__} | llama.cpp b4242 (0c1e570) | ratio |"
    for label, theirs in (("prompt pp8", 400.0), ("generate tg4", 200.0)):
        row = next(line for line in lines if line.startswith(f"| {label} |")).strip("|").split("|")
        ours, ratio = float(row[1]), float(row[3].strip().rstrip("x"))
        assert float(row[2]) == theirs and ratio == pytest.approx(ours / theirs, abs=0.01)
    assert "flash attention on, best of 1, t/s." in card and "| edit256 | not measured | not run | - |" in card


def test_compare_json(capsys, smollm2_path, fake_llama_bench):
    """--compare --json prints only the card, as one object, with ratios Kinetic / llama.cpp."""
    exe, _ = fake_llama_bench
    code, out, _ = kinetic(capsys, "bench", str(smollm2_path), *QUICK, "-r", "1", "--json", "--compare", str(exe))
    assert code == 0
    card = json.loads(out)
    assert card["llama_cpp"]["build"] == "b4242 (0c1e570)" and card["llama_cpp"]["best_t_s"] == {
        "pp8": 400.0,
        "tg4": 200.0,
    }
    rows = {row["test"]: row for row in card["tests"]}
    for name in ("pp8", "tg4"):
        assert rows[name]["ratio"] == pytest.approx(rows[name]["kinetic_t_s"] / rows[name]["llama_cpp_t_s"], abs=1e-3)
    assert rows["edit256"] == {"test": "edit256", "kinetic_t_s": None, "llama_cpp_t_s": None, "ratio": None}
    assert card["llama_cpp"]["edit"] is None  # no edit test here, so llama-server was not started
    assert card["kinetic"]["model"] == smollm2_path.name


EDIT = ["-p", "0", "-n", "0", "-t", "2", "-r", "1", "--edit-tokens", "48"]


def test_edit_test_drafted_equals_plain(capsys, smollm2_path):
    """The edit test's drafted answer is plain decoding's, token for token: the table says yes, exit 0."""
    code, out, _ = kinetic(capsys, "bench", str(smollm2_path), *EDIT)
    assert code == 0
    assert "edit: drafted output identical to plain decoding: yes" in out
    row = next(line for line in out.splitlines() if "| edit48 |" in line)
    assert float(row.strip("|").split("|")[-1]) > 0
    assert "speed technologies on: RAD-1, Shortlist;" in out


def test_edit_test_json_and_off_rad1(capsys, monkeypatch, smollm2_path):
    """--json has the seed's edit fields; --off rad1 runs the edit test without drafting (nothing guessed).
    Drafted passes are priced as free here: on a loaded machine the measured price of a drafted pass can
    rightly stop RAD-1 from drafting at all, and this test is about the report, not that decision."""
    from kinetic.runtime.drafting import PassCosts

    monkeypatch.setattr(PassCosts, "beta", property(lambda self: 0.0))
    code, out, _ = kinetic(capsys, "bench", str(smollm2_path), *EDIT, "--json")
    drafted = json.loads(out)
    assert code == 0 and drafted["edit_identical"] is True and drafted["technologies"] == "on: RAD-1, Shortlist"
    assert 1 < drafted["edit_tokens"] <= 48 and drafted["edit_tokens_per_second"] > 0 and drafted["edit_guessed"] > 0
    code, out, _ = kinetic(capsys, "bench", str(smollm2_path), *EDIT, "--off", "rad1", "--json")
    plain = json.loads(out)
    assert code == 0 and plain["edit_identical"] is True and plain["technologies"] == "on: Shortlist"
    assert plain["edit_guessed"] == 0 and plain["edit_drafted"] is False
    assert plain["edit_tokens"] == drafted["edit_tokens"]


def test_bad_off_fails_before_loading(capsys, tmp_path):
    """An unknown --off name fails with the known names, before the model is even looked for."""
    code, out, err = kinetic(capsys, "bench", str(tmp_path / "missing.gguf"), "--off", "shortlist,turbo")
    assert code == 1 and out == ""
    assert "unknown speed technology 'turbo'" in err and "rad1, shortlist, torque, warm-start" in err


def test_compare_path_missing(capsys, tmp_path):
    """A --compare path with no llama-bench fails at once, saying where it looked and how to pass it."""
    code, out, err = kinetic(capsys, "bench", str(tmp_path / "missing.gguf"), "--compare", str(tmp_path / "nope"))
    assert code == 1 and out == ""
    assert f"no llama-bench program at {tmp_path / 'nope'}" in err and "--compare PATH" in err


def test_llama_bench_not_found(monkeypatch, tmp_path):
    """Without a path, PATH and the usual places are searched, and the error lists them."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(bench_llama, "LLAMA_BENCH_PLACES", (tmp_path / "bin" / "llama-bench",))
    with pytest.raises(bench.KineticError) as exc:
        bench_llama.find_llama_bench(None)
    assert "PATH" in exc.value.message and str(tmp_path / "bin" / "llama-bench") in exc.value.message
    assert "never downloads" in exc.value.hint


def test_parse_llama_bench_json():
    """The best sample of each test is taken, named pp<n_prompt> or tg<n_gen>; a bad output is a clean error."""
    text = json.dumps([llama_bench_json(512, 0, [330.0, 338.8, 335.1]), llama_bench_json(0, 128, [140.0, 144.0])])
    result = bench_llama.parse_llama_bench_json(text)
    assert result.best == {"pp512": 338.8, "tg128": 144.0} and result.build == "b4242 (0c1e570)"
    with pytest.raises(bench.KineticError, match="could not read llama.cpp's llama-bench JSON"):
        bench_llama.parse_llama_bench_json("| model | size |")


def test_nothing_to_measure(capsys, smollm2_path):
    """-p 0 -n 0 with the edit test skipped is refused before loading anything."""
    code, _, err = kinetic(capsys, "bench", str(smollm2_path), "-p", "0", "-n", "0", "--edit-tokens", "0")
    assert code == 1 and "measures nothing" in err


# -- llama.cpp's edit test (llama-server) ---------------------------------------------------------------

FAKE_LLAMA_SERVER = """#!{python}
import json, os, pathlib, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
if "--help" in args:
    print("{spec_line}")
    print("-dev,  --device <dev1,dev2,..>          devices")
    sys.exit(0)
here = pathlib.Path(sys.argv[0]).parent
(here / "server_argv.json").write_text(json.dumps(args))
(here / "server_pid").write_text(str(os.getpid()))
ANSWER = json.loads((here / "server_answer.json").read_text())

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        (here / "server_request.json").write_text(json.dumps(request))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        def send(chunk):
            self.wfile.write(("data: " + json.dumps(chunk) + "\\n\\n").encode())
            self.wfile.flush()
        send({{"choices": [{{"delta": {{"role": "assistant", "content": None}}, "finish_reason": None}}]}})
        for piece in ANSWER:
            time.sleep(0.01)
            send({{"choices": [{{"delta": {{"content": piece}}, "finish_reason": None}}]}})
        time.sleep(0.01)
        send({{"choices": [{{"delta": {{}}, "finish_reason": "stop"}}]}})
        send({{"choices": [], "usage": {{"completion_tokens": len(ANSWER) + 1, "prompt_tokens": 99}}}})
        self.wfile.write(b"data: [DONE]\\n\\n")

HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
"""
SPEC_LINE = "--spec-type none,draft-simple,ngram-simple,ngram-mod   speculative decoding types"


def write_fake_server(folder, answer: list[str], spec_line: str = SPEC_LINE):
    """A llama-server that answers --help with `spec_line`, /health with 200, and streams `answer` piece by piece."""
    (folder / "server_answer.json").write_text(json.dumps(answer))
    exe = folder / "llama-server"
    exe.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable, spec_line=spec_line))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


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


def test_llama_cpp_runs_on_the_gpu_when_kinetic_did(tmp_path):
    """--compare with --device cuda or vulkan gives llama.cpp every layer on its GPU (-ngl 99, no
    `-dev none`), as the card compares the same device; on the CPU it is -ngl 0 -dev none."""
    from kinetic import bench_llama

    exe = tmp_path / "llama-bench"
    exe.write_text("#!/bin/sh\necho '  -dev, --device <dev1/dev2/..>'\n")
    exe.chmod(0o755)
    model = tmp_path / "m.gguf"
    cpu = bench_llama.llama_bench_command(exe, model, threads=2, repetitions=1, n_prompt=8, n_gen=4)
    gpu = bench_llama.llama_bench_command(exe, model, threads=2, repetitions=1, n_prompt=8, n_gen=4, gpu=True)
    assert cpu[-4:] == ["-o", "json", "-dev", "none"] and "-ngl" in cpu and cpu[cpu.index("-ngl") + 1] == "0"
    assert gpu[gpu.index("-ngl") + 1] == "99" and "-dev" not in gpu
    server = bench_llama_edit.llama_server_command(exe, model, "--device", threads=2, n_ctx=64, port=1, spec_type="x",
                                                   gpu=True)
    assert server[server.index("-ngl") + 1] == "99" and "-dev" not in server
