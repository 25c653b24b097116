"""The profile's `prompt_pass` (kinetic compile --tune's prompt-pass phase): optional, checked, and
carried by the loader and kinetic.Model to the engine, where it changes speed only.

On the synthetic llama file; the real search that writes it is in test_tune.py.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

import kinetic
from kinetic.errors import KineticError
from kinetic.ktc.load import LoadedKtc
from kinetic.ktc.profile import Profile, default_profile
from kinetic.runtime.engine import CPU_PROMPT_PASS, Engine
from tests.synthetic import synthetic_path

PROMPT = [int(t) for t in np.random.default_rng(7).integers(1, 2000, 21)]  # 5 grid chunks of 4 and one row


def ktc_with(tmp_path, profile: Profile, name: str = "tuned.ktc"):
    """The synthetic llama model compiled to a .ktc file holding `profile`."""
    from kinetic.cli.compile_cmd import compile_model
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.ktc.build import build_ktc

    graphs: list = []
    compile_model(synthetic_path("llama"), keep=graphs)
    out = tmp_path / name
    build_ktc(open_gguf(synthetic_path("llama")), graphs[-1], out, profile=profile)
    return out


def test_prompt_pass_round_trips_and_an_old_profile_reads_with_the_default():
    """A profile's prompt_pass reads back equal; the defaults leave it out of the JSON, and a profile
    without it (every file written before it) reads with None, the engine's default."""
    tuned = replace(default_profile(), threads=1, tuned=True, prompt_pass=256, measured={"cpus": 2})
    data = json.loads(json.dumps(tuned.to_json()))
    assert data["prompt_pass"] == 256 and Profile.from_json(data) == tuned
    old = default_profile().to_json()
    assert "prompt_pass" not in old and Profile.from_json(old).prompt_pass is None


@pytest.mark.parametrize("value", [0, -128, 4097, True, "256", 256.0, None])
def test_a_bad_prompt_pass_is_refused(value):
    """prompt_pass, when present, is a whole number from 1 to 4096 (no bool, text, float or null)."""
    with pytest.raises(ValueError, match="prompt_pass"):
        Profile.from_json({**default_profile().to_json(), "prompt_pass": value})


def test_a_profiles_prompt_pass_reaches_the_engine_and_changes_no_bit(tmp_path):
    """A profile's prompt_pass goes to Model's engine (engine_settings names it only when the profile
    does); on the same grid, passes of 8 rows give the same logits, bit for bit, as one pass."""
    tuned = replace(default_profile(), tuned=True, prompt_pass=8, measured={"cpus": 10_000})
    plain = ktc_with(tmp_path, default_profile(), "plain.ktc")
    passes = ktc_with(tmp_path, tuned)
    assert "prompt_pass" not in LoadedKtc(plain).engine_settings("cpu", None)
    assert LoadedKtc(passes, note=lambda _: None).engine_settings("cpu", None)["prompt_pass"] == 8
    logits = []
    for path, expected in ((plain, CPU_PROMPT_PASS), (passes, 8)):
        model = kinetic.Model(path, n_ctx=64, batch=4)
        assert model.engine.prompt_pass == expected
        assert model.engine.next_pass(model.engine.new_sequence(), len(PROMPT)) == min(expected, len(PROMPT))
        logits.append(model.engine.prefill(model.engine.new_sequence(), PROMPT))
    assert logits[0].tobytes() == logits[1].tobytes()


def test_models_prompt_pass_wins_and_is_checked(tmp_path):
    """Model(prompt_pass=) sets the engine's pass over the profile's; a value outside 1..4096 or not
    a whole number is refused."""
    path = ktc_with(tmp_path, replace(default_profile(), prompt_pass=8))
    assert kinetic.Model(path, n_ctx=64, batch=4, prompt_pass=12).engine.prompt_pass == 12
    assert kinetic.Model(synthetic_path("llama"), n_ctx=64, prompt_pass=256).engine.prompt_pass == 256
    for bad in (0, 5000, True, 2.5):
        with pytest.raises(KineticError, match="prompt pass"):
            kinetic.Model(synthetic_path("llama"), n_ctx=64, prompt_pass=bad)


def test_a_recurrent_model_keeps_one_chunk_a_pass():
    """An asked pass size does not merge a recurrent model's chunks (its states are checkpointed per
    commit): its engine's prompt pass stays the grid."""
    from kinetic.compiler import compile_graph
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.runtime.weights import GGUFWeights

    gguf = open_gguf(synthetic_path("lfm2-k20"))
    engine = Engine(compile_graph(gguf), GGUFWeights(gguf), n_ctx=64, batch=4, prompt_pass=16, device="reference")
    assert engine.prompt_pass == 4
