"""`kinetic bench`: its JSON and table on the real SmolLM2 file, its errors, and the --compare card
against a fake llama-bench (tests/cli/bench_fakes.py) whose known speeds let the card's numbers be
checked. llama.cpp's edit test through llama-server is in test_bench_llama_edit.py.
Token counts are tiny (-p 8 -n 4) so the whole file runs in a few seconds.
"""

from __future__ import annotations

import json

import pytest

from kinetic import __version__, bench, bench_llama, bench_llama_edit
from kinetic.cli import main as cli
from tests.cli.bench_fakes import kinetic, llama_bench_json

pytestmark = pytest.mark.usefixtures("no_ik_llama_cpp")  # no test runs a real ik_llama.cpp

QUICK = ["-p", "8", "-n", "4", "-t", "2", "--edit-tokens", "0"]  # the edit test has its own tests below
EDIT = ["-p", "0", "-n", "0", "-t", "2", "-r", "1", "--edit-tokens", "48"]


def test_bench_is_a_command():
    assert "bench" in cli.COMMANDS


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


# -- the edit test (drafted = plain) ------------------------------------------------------------------


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


# -- errors, llama-bench's output and command ----------------------------------------------------------


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
