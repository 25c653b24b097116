"""`kinetic bench --compare` with ik_llama.cpp: reading both forks' llama-bench output, the ratios, the
rounds taking turns, the line when ik_llama.cpp is absent, and decode's bandwidth share.

No llama-bench runs here: the parsers read stored outputs (tests/data/bench/README.md: a real run of
llama.cpp b1-0c1e570's `llama-bench -o json`, and ik_llama.cpp 8337e4c's shape laid out from its
source), and --compare runs fakes that print those outputs with known speeds.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from kinetic import __version__, bench, bench_bandwidth, bench_card, bench_llama
from kinetic.bench_bandwidth import DecodeTraffic, ShortlistTraffic
from kinetic.cli import main as cli
from kinetic.errors import KineticError

DATA = Path(__file__).parents[1] / "data" / "bench"
LLAMA_SAMPLE = DATA / "llama_cpp_llama_bench.json"  # llama-bench -p 32 -n 8 -r 2 -o json, stdout
IK_SAMPLE = DATA / "ik_llama_cpp_llama_bench.txt"  # ik's llama-bench -t 1 -r 2 -p 32 -n 8 -fa 1 -o json, stdout


@pytest.fixture(autouse=True)
def no_ik_llama_cpp(monkeypatch, tmp_path_factory):
    """No test finds a real ik_llama.cpp unless it puts one there: the variable is unset, the usual place empty."""
    monkeypatch.delenv(bench_llama.IK_LLAMA_BENCH_ENV, raising=False)
    monkeypatch.setattr(bench_llama, "IK_LLAMA_BENCH_PLACES", (tmp_path_factory.mktemp("no-ik") / "llama-bench",))


# -- parsing -----------------------------------------------------------------------------------------


def test_parse_llama_cpp_sample():
    """llama.cpp's stored output gives pp32 and tg8, each with its samples, best, mean and median."""
    result = bench_llama.parse_llama_bench_json(LLAMA_SAMPLE.read_text())
    tests = json.loads(LLAMA_SAMPLE.read_text())
    assert set(result.best) == {"pp32", "tg8"} and result.engine == "llama.cpp"
    for t, name in zip(tests, ("pp32", "tg8"), strict=True):
        assert result.samples[name] == t["samples_ts"] and result.best[name] == max(t["samples_ts"])
        assert result.mean[name] == t["avg_ts"] and result.median[name] == pytest.approx(sum(t["samples_ts"]) / 2)
    assert result.build == f"b{tests[0]['build_number']} ({tests[0]['build_commit']})"


def test_parse_ik_llama_cpp_sample():
    """ik_llama.cpp's stored output (its own fields, log lines added around the JSON) gives pp32 and
    tg8 named by its `test` field, each best and mean its own."""
    text = "main: some log line [with brackets]\n" + IK_SAMPLE.read_text() + "\nllama_perf: done\n"
    result = bench_llama.parse_llama_bench_json(text, engine="ik_llama.cpp")
    tests = [t for t in json.loads(IK_SAMPLE.read_text()) if t["test"] in ("pp32", "tg8")]
    assert set(result.best) == {"pp32", "tg8"} and result.engine == "ik_llama.cpp"
    for t in tests:
        assert result.best[t["test"]] == max(t["samples_ts"]) and result.mean[t["test"]] == t["avg_ts"]


def test_parse_errors_name_the_fork():
    """Output with no JSON list of tests, or tests missing their speeds, is a KineticError naming the fork."""
    for text in ("| model | size |", "[]", '[{"n_prompt": 8, "n_gen": 0}]', '[{"test": "pp8+tg8", "n_prompt": 8,'
                 ' "n_gen": 8, "avg_ts": 1, "build_number": 1, "build_commit": "x"}]'):
        with pytest.raises(KineticError, match="could not read ik_llama.cpp's llama-bench JSON"):
            bench_llama.parse_llama_bench_json(text, engine="ik_llama.cpp")


# -- ratios --------------------------------------------------------------------------------------------


def kinetic_result(pp: list[float], tg: list[float], traffic: DecodeTraffic | None = None) -> bench.BenchResult:
    """A BenchResult with pp512 and tg128 runs at the given rates (t/s)."""
    r = bench.BenchResult(Path("M.gguf"), "cpu", 2, len(pp), [], 0.1, 100, 10, "Q4_1", 0, traffic=traffic,
                          read_bandwidth=40e9)
    r.tests = [bench.TestResult("pp512", 512, [512 / x for x in pp]),
               bench.TestResult("tg128", 128, [128 / x for x in tg])]
    return r


def engine_result(engine: str, pp: list[float], tg: list[float]) -> bench_llama.LlamaBenchResult:
    rounds = [
        bench_llama.LlamaBenchResult(7, "abc", {"pp512": a, "tg128": b}, {"pp512": a, "tg128": b},
                                     {"pp512": [a], "tg128": [b]}, engine)
        for a, b in zip(pp, tg, strict=True)
    ]
    return bench_llama.merge_rounds(rounds)


def test_merge_rounds():
    """Rounds of llama-bench -r 1 merge into every sample: best is the highest, mean and median over all."""
    r = engine_result("ik_llama.cpp", [100.0, 300.0, 200.0], [10.0, 30.0, 20.0])
    assert r.samples == {"pp512": [100.0, 300.0, 200.0], "tg128": [10.0, 30.0, 20.0]}
    assert r.best == {"pp512": 300.0, "tg128": 30.0} and r.median == {"pp512": 200.0, "tg128": 20.0}
    assert r.mean == {"pp512": 200.0, "tg128": 20.0} and r.engine == "ik_llama.cpp"


def test_ratios_against_both_engines():
    """Each row's ratios are Kinetic's best over llama.cpp's best and over ik_llama.cpp's best; the median
    line divides the medians; the card has both ratio columns."""
    k = kinetic_result([500.0, 600.0, 550.0], [200.0, 220.0, 180.0])
    ll = engine_result("llama.cpp", [300.0, 240.0, 320.0], [100.0, 110.0, 90.0])
    ik = engine_result("ik_llama.cpp", [1000.0, 1200.0, 900.0], [160.0, 170.0, 150.0])
    rows = {row["test"]: row for row in bench_card.card_rows(k, ll, None, ik)}
    assert rows["pp512"]["ratio"] == pytest.approx(600 / 320, abs=1e-3)
    assert rows["pp512"]["ratio_ik_llama_cpp"] == pytest.approx(600 / 1200, abs=1e-3)
    assert rows["tg128"]["ratio"] == pytest.approx(220 / 110, abs=1e-3)
    assert rows["tg128"]["ratio_ik_llama_cpp"] == pytest.approx(220 / 170, abs=1e-3)
    assert rows["edit256"]["ik_llama_cpp_t_s"] is None and rows["edit256"]["ratio_ik_llama_cpp"] is None
    assert bench_card.median_ratios(k, ik) == {"pp512": pytest.approx(550 / 1000, abs=1e-3),
                                               "tg128": pytest.approx(200 / 160, abs=1e-3)}
    card = bench_card.card(k, ll, None, ik)
    assert "| Kinetic/llama.cpp | Kinetic/ik_llama.cpp |" in card
    assert "| prompt pp512 | 600.0 | 320.0 | 1200.0 | 1.88x | 0.50x |" in card
    assert "Medians of the 3 rounds (the engines took turns): pp512 1.83x llama.cpp, 0.55x ik_llama.cpp;" in card
    assert "ik_llama.cpp not compared" not in card
    js = bench_card.card_json(k, ll, None, ik)
    assert js["ik_llama_cpp"]["median_t_s"] == {"pp512": 1000.0, "tg128": 160.0}
    assert js["ik_llama_cpp"]["median_ratio"]["tg128"] == pytest.approx(1.25)


# -- ik_llama.cpp absent, named, or found ------------------------------------------------------------------


def test_absent_ik_is_one_line(tmp_path):
    """Without ik_llama.cpp's llama-bench, find returns None and the card is llama.cpp's with one line
    saying where it looked and how to build or name it; the JSON says the same."""
    assert bench_llama.find_ik_llama_bench(None) is None
    k, ll = kinetic_result([500.0], [200.0]), engine_result("llama.cpp", [300.0], [100.0])
    card = bench_card.card(k, ll)
    place = str(bench_llama.IK_LLAMA_BENCH_PLACES[0])
    assert card.splitlines()[-1] == bench_llama.ik_absent_line()
    assert f"ik_llama.cpp not compared: no llama-bench at {place}" in card and "docs/benchmarks.md" in card
    assert [line for line in card.splitlines() if "ik_llama.cpp" in line] == [bench_llama.ik_absent_line()]
    assert card.splitlines()[2] == f"| test | Kinetic {__version__} | llama.cpp b7 (abc) | ratio |"
    assert bench_card.card_json(k, ll)["ik_llama_cpp"] == {"not_run": bench_llama.ik_absent_line()}


def test_ik_named_by_flag_or_variable(monkeypatch, tmp_path):
    """--compare-ik or $KINETIC_IK_LLAMA_BENCH names the program (or its folder); a name with no program
    behind it is an error that says which one, never a silent skip."""
    exe = tmp_path / "llama-bench"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert bench_llama.find_ik_llama_bench(str(tmp_path)) == exe
    monkeypatch.setenv(bench_llama.IK_LLAMA_BENCH_ENV, str(exe))
    assert bench_llama.find_ik_llama_bench(None) == exe
    monkeypatch.setenv(bench_llama.IK_LLAMA_BENCH_ENV, str(tmp_path / "gone"))
    with pytest.raises(KineticError, match="KINETIC_IK_LLAMA_BENCH: no ik_llama.cpp llama-bench program at"):
        bench_llama.find_ik_llama_bench(None)
    with pytest.raises(KineticError, match="--compare-ik: no ik_llama.cpp llama-bench program at"):
        bench_llama.find_ik_llama_bench(str(tmp_path / "nope"))


def test_compare_ik_needs_compare(capsys, tmp_path):
    """--compare-ik alone is refused before anything loads."""
    code = cli.main(["bench", str(tmp_path / "m.gguf"), "--compare-ik", str(tmp_path)])
    assert code == 1 and "Add --compare" in capsys.readouterr().err


FAKE = """#!{python}
import json, pathlib, sys
args = sys.argv[1:]
if "--help" in args:
    print({help!r})
    sys.exit(0)
here = pathlib.Path(sys.argv[0]).parent
with open(here.parent / "calls.log", "a") as log:
    log.write({name!r} + " " + " ".join(args[2:]) + "\\n")
tests = json.loads(pathlib.Path({sample!r}).read_text())
out = []
for t in tests:
    if t["n_gen"] == 0 or t["n_prompt"] == 0:
        pp = t["n_gen"] == 0
        t["n_prompt"], t["n_gen"] = (int(args[args.index("-p") + 1]), 0) if pp else (0, int(args[args.index("-n") + 1]))
        t["samples_ts"] = [{pp_speed}] if pp else [{tg_speed}]
        t["avg_ts"] = t["samples_ts"][0]
        if "test" in t:
            t["test"] = f"pp{{t['n_prompt']}}" if pp else f"tg{{t['n_gen']}}"
    out.append(t)
print({prefix!r} + json.dumps(out, indent=2))
"""
IK_HELP = "  -fa, --flash-attn <0|1>             (default: 1)"
LLAMA_HELP = "  -fa, --flash-attn <on|off|auto>\n  -dev, --device <dev0/dev1/...>"


def write_fake(folder: Path, name: str, sample: Path, help_text: str, pp: float, tg: float, prefix: str = "") -> Path:
    folder.mkdir()
    exe = folder / "llama-bench"
    exe.write_text(FAKE.format(python=sys.executable, help=help_text, name=name, sample=str(sample),
                               pp_speed=pp, tg_speed=tg, prefix=prefix))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_compare_with_ik_takes_turns(capsys, monkeypatch, smollm2_path, tmp_path):
    """--compare with ik_llama.cpp found: each round runs Kinetic, then llama-bench -r 1, then ik's -r 1
    (its flags as its --help spells them: -fa 1, no -dev); the card and JSON carry both engines' ratios."""
    ll = write_fake(tmp_path / "ll", "llama", LLAMA_SAMPLE, LLAMA_HELP, 400.0, 200.0)
    ik = write_fake(tmp_path / "ik", "ik", IK_SAMPLE, IK_HELP, 800.0, 100.0, prefix="repacked 4 tensors\n")
    log = tmp_path / "calls.log"
    time_round = bench.BenchSession.time_round

    def logged_round(self):
        with open(log, "a") as f:
            f.write("kinetic\n")
        time_round(self)

    monkeypatch.setattr(bench.BenchSession, "time_round", logged_round)
    args = ["bench", str(smollm2_path), "-p", "8", "-n", "4", "-t", "2", "-r", "2", "--edit-tokens", "0",
            "--compare", str(ll), "--compare-ik", str(ik.parent), "--json"]
    assert cli.main(args) == 0
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["kinetic", "llama", "ik"] * 2
    assert calls[2] == "ik -t 2 -r 1 -p 8 -n 4 -fa 1 -ngl 0 -o json"
    assert calls[1] == "llama -t 2 -r 1 -p 8 -n 4 -fa on -ngl 0 -o json -dev none"
    card = json.loads(capsys.readouterr().out)
    assert card["ik_llama_cpp"]["best_t_s"] == {"pp8": 800.0, "tg4": 100.0}
    rows = {row["test"]: row for row in card["tests"]}
    for name, theirs in (("pp8", 800.0), ("tg4", 100.0)):
        assert rows[name]["ratio_ik_llama_cpp"] == pytest.approx(rows[name]["kinetic_t_s"] / theirs, abs=1e-3)
    assert len(card["kinetic"]["tests"][0]["runs"]) == 2


# -- decode's bandwidth share ----------------------------------------------------------------------------


def test_decode_bytes_per_token():
    """A step reads every weight once, one row of an untied embedding, the KV entries it attends to,
    and the output layer as Shortlist read it: full on the steps it did not serve, else copy + exact rows."""
    traffic = DecodeTraffic(weight_bytes=1000, output_bytes=500, embedding_row_bytes=7, kv_bytes_per_entry=10,
                            mean_entries=bench_bandwidth.mean_entries_attended(5))
    assert bench_bandwidth.mean_entries_attended(5) == 4.0  # steps see 2, 3, 4, 5, 6 entries
    assert traffic.bytes_per_token() == 1000 + 7 + 500 + 40
    listed = ShortlistTraffic(steps=4, shortlisted=3, rows_scored=30, row_bytes=2, copy_bytes=100)
    shortlisted = DecodeTraffic(1000, 500, 0, 10, 4.0, listed)
    assert shortlisted.output_bytes_per_token() == (1 * 500 + 3 * 100 + 30 * 2) / 4
    share = bench_bandwidth.bandwidth_share(shortlisted, tokens_per_second=100.0, machine=2e6)
    assert share.bytes_per_second == pytest.approx(100 * (1000 + 215 + 40))
    assert share.share == pytest.approx(100 * 1255 / 2e6)
    assert share.to_json()["bandwidth_share"] == round(100 * 1255 / 2e6, 4)
    assert "decode reads 0.0 MB a token: 0.0 GB/s, 6 % of the 0.0 GB/s" in share.line()


def test_bench_reports_bandwidth_share(capsys, smollm2_path):
    """kinetic bench --json gives decode's bytes per token (SmolLM2: its weights, tied output read whole,
    with Shortlist off) and GB/s = bytes x tg's best t/s, against a measured machine figure; the table
    says the same in its last line."""
    args = ["bench", str(smollm2_path), "-p", "0", "-n", "4", "-t", "2", "-r", "1", "--edit-tokens", "0",
            "--off", "shortlist"]
    assert cli.main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    from kinetic.frontend.gguf_file import open_gguf

    file_weights = sum(t.nbytes for t in open_gguf(smollm2_path).tensors.values())
    kv = 2 * 30 * 3 * 64 * 2 * (4 + 3) / 2  # K and V, 30 layers, 3 heads x 64, f16 (2 bytes), 3.5 entries
    assert report["decode_bytes_per_token"] == round(file_weights + kv)
    tg = report["decode_tokens_per_second"]
    assert report["decode_gb_per_s"] == pytest.approx(report["decode_bytes_per_token"] * tg / 1e9, rel=1e-2)
    assert report["machine_read_gb_per_s"] > 0.5
    assert report["bandwidth_share"] == pytest.approx(report["decode_gb_per_s"] / report["machine_read_gb_per_s"],
                                                      rel=1e-2)
    assert cli.main(args) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(
        f"bandwidth: decode reads {(file_weights + kv) / 1e6:.1f} MB")


def test_card_bandwidth_line():
    """The card's bandwidth line gives Kinetic's bytes x its best tg t/s (with what Shortlist saved) and
    each llama.cpp fork's best tg t/s x the bytes of a step without Shortlist, as shares of the machine's."""
    listed = ShortlistTraffic(steps=10, shortlisted=10, rows_scored=0, row_bytes=1, copy_bytes=10_000_000)
    traffic = DecodeTraffic(80_000_000, 20_000_000, 0, 0, 0.0, listed)  # 90 MB with Shortlist, 100 MB without
    k = kinetic_result([500.0], [200.0], traffic)  # read_bandwidth 40 GB/s
    ll, ik = engine_result("llama.cpp", [300.0], [100.0]), engine_result("ik_llama.cpp", [900.0], [150.0])
    line = next(line for line in bench_card.card(k, ll, None, ik).splitlines() if line.startswith("Decode bandwidth"))
    assert line == ("Decode bandwidth (tg128): Kinetic decode reads 90.0 MB a token: 18.0 GB/s, 45 % of the 40.0 GB/s "
                    "this machine reads; llama.cpp 10.0 GB/s (25 %); ik_llama.cpp 15.0 GB/s (38 %).")


def test_read_bandwidth_measured_once(monkeypatch, tmp_path):
    """The buffer is at least 8x the last-level cache sysfs reports, and the figure is measured once per
    thread count in a process (the second call does not read the buffer again)."""
    for level, size in (("index0", "48K"), ("index3", "64M")):
        (tmp_path / level).mkdir()
        (tmp_path / level / "size").write_text(size + "\n")
    monkeypatch.setattr(bench_bandwidth, "CACHE_SIZES", tmp_path)
    assert bench_bandwidth.last_level_cache_bytes() == 64 * 2**20
    assert bench_bandwidth.buffer_bytes() == 8 * 64 * 2**20
    monkeypatch.setattr(bench_bandwidth, "buffer_bytes", lambda: 2**22)
    monkeypatch.setattr(bench_bandwidth, "MIN_SECONDS", 0.0)
    bench_bandwidth.read_bandwidth.cache_clear()
    passes = []
    real = bench_bandwidth._Readers.read
    monkeypatch.setattr(bench_bandwidth._Readers, "read", lambda self: passes.append(1) or real(self))
    first = bench_bandwidth.measure_read_bandwidth(2)
    assert first > 0 and len(passes) == 1 + bench_bandwidth.MIN_PASSES
    assert bench_bandwidth.measure_read_bandwidth(2) == first and len(passes) == 1 + bench_bandwidth.MIN_PASSES
    bench_bandwidth.read_bandwidth.cache_clear()
