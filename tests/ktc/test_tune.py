"""`kinetic compile --tune`: a bounded search whose profile reaches the engine.

One real search on SmolLM2 with a 10 s limit (the slow test); the choice rules, the profile's JSON
and the loader's use of a tuned profile on small inputs and the synthetic llama file.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

import kinetic
from kinetic.cli.main import main
from kinetic.codegen.cpu.step import available_cpus
from kinetic.ktc import Kind, KtcFile
from kinetic.ktc.load import LoadedKtc
from kinetic.ktc.profile import Profile, default_profile
from kinetic.ktc.tune import PROMPT_PASSES, Candidate, _choose_pass, _choose_threads, pass_candidates, thread_candidates
from kinetic.runtime.engine import CPU_PROMPT_PASS, DEFAULT_BATCH
from tests.conftest import model_path
from tests.synthetic import synthetic_path

LIMIT = 10.0
MARGIN = 15.0  # lowering, loading and writing the file around the search, on a busy machine


def profile_of(path: Path) -> dict:
    return KtcFile.open(path).json(Kind.PROFILE)


@pytest.fixture(scope="module")
def warm_smollm2():
    """SmolLM2's default engine built once in this process: its step's numba functions and kernels
    compiled or loaded from the disk caches, a one-off (minutes on a clean clone) that the search's
    bound leaves out (kinetic/ktc/tune_runs.py: the first engine is not bounded)."""
    from kinetic.compiler import compile_graph
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.ktc.tune import N_CTX
    from kinetic.runtime.engine import Engine
    from kinetic.runtime.weights import GGUFWeights

    gguf = open_gguf(model_path("smollm2-135m"))
    engine = Engine(compile_graph(gguf), GGUFWeights(gguf), n_ctx=N_CTX)
    seq = engine.new_sequence()
    engine.decode(seq, int(engine.prefill(seq, list(range(1, 9))).argmax()))
    engine.close()


def test_tune_finishes_within_its_bound_and_its_profile_runs(warm_smollm2, tmp_path, capsys):
    """--tune --tune-seconds 10 on SmolLM2 ends within the limit, or right after the first engine and
    its two runs where those alone take longer (a machine so busy they do), give or take 0.5 s (a
    prompt pass or build running past SLACK x its estimate), and the command within limit + margin;
    it writes tuned: true with measured medians, and Model on the file runs with the chosen threads,
    batch and prompt pass."""
    out = tmp_path / "tuned.ktc"
    start = time.monotonic()
    assert main(["compile", str(model_path("smollm2-135m")), "-o", str(out), "--tune", "--tune-seconds",
                 str(LIMIT)]) == 0
    assert time.monotonic() - start < LIMIT + MARGIN
    captured = capsys.readouterr()
    assert "tuning [" in captured.err and "tuned in" in captured.out
    profile = profile_of(out)
    measured = profile["measured"]
    assert profile["tuned"] is True and measured["first_seconds"] <= measured["seconds"]
    assert measured["seconds"] <= max(LIMIT, measured["first_seconds"]) + 0.5
    assert profile["threads"] in thread_candidates(available_cpus()) and profile["batch"] == DEFAULT_BATCH
    assert profile["prompt_pass"] in PROMPT_PASSES and measured["chosen"]["prompt_pass"] == profile["prompt_pass"]
    assert measured["chosen"]["tg"] > 0 and measured["chosen"]["pp"] > 0 and measured["cpus"] == available_cpus()
    model = kinetic.Model(out, n_ctx=64)
    assert model.engine.batch == profile["batch"] and model.engine.runner.threads == profile["threads"]
    assert model.engine.prompt_pass == profile["prompt_pass"]


def test_default_profile_is_untouched(tmp_path):
    """Without --tune the profile is the defaults, tuned: false, with no measured member."""
    out = tmp_path / "plain.ktc"
    assert main(["compile", str(synthetic_path("llama")), "-o", str(out)]) == 0
    profile = profile_of(out)
    assert profile["tuned"] is False and "measured" not in profile and profile["threads"] is None
    assert profile == default_profile().to_json()


@pytest.mark.parametrize("flags, message", [
    (["--tune"], "give -o MODEL.ktc"),
    (["-o", "x.ktc", "--tune-seconds", "5"], "add --tune"),
    (["-o", "x.ktc", "--tune", "--tune-seconds", "0"], "must be more than 0"),
])
def test_bad_tune_flags_are_usage_errors(flags, message, tmp_path, monkeypatch, capsys):
    """--tune without -o, --tune-seconds without --tune or not positive: exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    assert main(["compile", str(synthetic_path("llama")), *flags]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "x.ktc").exists()


def test_thread_choice_maximizes_decode_and_breaks_ties_by_prompt():
    """The best decode median wins; counts within 2% of it are tied and the faster prompt wins."""
    a, b, c = Candidate(1, 64, tg=[100.0], pp=[300.0]), Candidate(2, 64, tg=[99.0], pp=[500.0]), \
        Candidate(3, 64, tg=[90.0], pp=[900.0])
    assert _choose_threads([a, b, c], cpus=3) == 2
    assert _choose_threads([a, replace(b, tg=[95.0]), c], cpus=3) == 1
    assert _choose_threads([Candidate(1, 64), Candidate(2, 64)], cpus=2) == 2  # nothing measured: all CPUs


def test_pass_choice_maximizes_prompt_and_prefers_the_default_when_tied():
    """The best prompt median wins; within 2% the default pass (a candidate's None), else the
    smallest tied pass; the default when none was measured."""
    def passes(rates: dict) -> list[Candidate]:
        return [Candidate(1, DEFAULT_BATCH, prompt_pass=None if p == 512 else p, pp=[r]) for p, r in rates.items()]

    assert _choose_pass(passes({128: 100.0, 256: 110.0, 512: 109.0}), default=512) == 512
    assert _choose_pass(passes({128: 100.0, 256: 110.0, 512: 105.0}), default=512) == 256
    assert _choose_pass(passes({128: 109.0, 256: 110.0, 512: 100.0}), default=512) == 128
    assert _choose_pass([Candidate(1, DEFAULT_BATCH, prompt_pass=p) for p in (128, 256)], default=512) == 512


def test_passes_are_searched_only_where_they_merge():
    """The CPU engine's default pass (512 rows) is the largest tried, so the phase runs there; an
    engine whose passes are its grid (a recurrent model) gets no prompt-pass phase."""
    assert CPU_PROMPT_PASS == max(PROMPT_PASSES) and pass_candidates(CPU_PROMPT_PASS) == PROMPT_PASSES
    assert pass_candidates(DEFAULT_BATCH) == ()


def test_profile_json_round_trips_and_old_profiles_read():
    """A tuned profile's JSON reads back equal; a profile without `measured` reads with None."""
    tuned = replace(default_profile(), threads=1, batch=32, tuned=True, measured={"cpus": 2, "seconds": 9.5})
    assert Profile.from_json(json.loads(json.dumps(tuned.to_json()))) == tuned
    old = default_profile().to_json()
    assert "measured" not in old and Profile.from_json(old).measured is None
    with pytest.raises(ValueError, match="measured"):
        Profile.from_json({**old, "measured": 3})


@pytest.mark.parametrize("cpus_then, uses_threads", [(None, True), (10_000, False)])
def test_tuned_threads_are_used_only_with_as_many_cpus(cpus_then, uses_threads, tmp_path):
    """A tuned profile's threads reach the engine on a machine with the CPU count it was tuned on;
    on another count every CPU runs (one note), and its batch is used either way."""
    from kinetic.cli.compile_cmd import compile_model
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.ktc.build import build_ktc

    cpus = available_cpus() if cpus_then is None else cpus_then
    profile = replace(default_profile(), threads=1, batch=32, tuned=True, measured={"cpus": cpus})
    graphs: list = []
    compile_model(synthetic_path("llama"), keep=graphs)
    out = tmp_path / "tuned.ktc"
    build_ktc(open_gguf(synthetic_path("llama")), graphs[-1], out, profile=profile)
    notes: list[str] = []
    settings = LoadedKtc(out, note=notes.append).engine_settings("cpu", None)
    assert settings == {"threads": 1 if uses_threads else None, "batch": 32, "matmul": profile.matmul_choice()}
    assert len(notes) == (0 if uses_threads else 1)
