"""One validation of sampling and generation settings (settings.LIMITS), shared by `kinetic run`,
the Python API and the server: what llama.cpp gives a meaning is taken, the rest refused naming the
setting, and no accepted value makes the sampler raise."""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np
import pytest

import kinetic
from kinetic.cli.main import main
from kinetic.errors import KineticError
from kinetic.runtime.sampling import Sampler, SamplingSettings
from kinetic.runtime.sampling.settings import LIMITS, SettingError, token_limit
from kinetic.server.body import Fields
from kinetic.server.errors import ApiError
from kinetic.server.params import sampling_settings
from tests.synthetic import synthetic_path

# (setting, refused value, the flag `kinetic run` takes it by) -- issue 16's cases first.
REFUSED = [
    ("temperature", math.inf, "--temp"), ("top_p", 2.0, "--top-p"), ("min_p", -1.0, "--min-p"),
    ("temperature", math.nan, "--temp"), ("typical_p", 1.5, "--typical"), ("xtc_threshold", -0.1, "--xtc-threshold"),
    ("xtc_probability", 2.0, "--xtc-probability"), ("repeat_penalty", 0.0, "--repeat-penalty"),
    ("presence_penalty", 1e39, "--presence-penalty"), ("mirostat_tau", -1.0, "--mirostat-ent"),
    ("mirostat_eta", -0.5, "--mirostat-lr"), ("mirostat", 3, "--mirostat"), ("top_k", 2**31, "--top-k"),
    ("repeat_last_n", -2, "--repeat-last-n"), ("dry_penalty_last_n", 2**40, "--dry-penalty-last-n"),
    ("dry_base", 0.5, "--dry-base"), ("dry_allowed_length", -1, "--dry-allowed-length"),
    ("seed", 2**64, "--seed"), ("seed", -2, "--seed"),
]


@pytest.mark.parametrize("name, value, flag", REFUSED)
def test_out_of_range_values_are_refused_naming_the_setting(name, value, flag):
    """Each value llama.cpp gives no meaning raises SettingError naming its setting."""
    with pytest.raises(SettingError, match=name) as info:
        SamplingSettings(**{name: value})
    assert info.value.setting == name


@pytest.mark.parametrize("value", [True, "0.5", None, [1], 2**1100], ids=["bool", "str", "None", "list", "2**1100"])
def test_wrong_types_are_refused(value):
    """No bools, strings, lists or numbers too large for a double stand for a number."""
    for name in LIMITS:
        with pytest.raises(SettingError, match=name):
            SamplingSettings(**{name: value})


@pytest.mark.parametrize("change", [dict(seed=42.0), dict(seed=1.5), dict(seed=True), dict(top_k=40.0),
                                    dict(logit_bias={2**40: 1.0}), dict(logit_bias={5: math.nan}),
                                    dict(logit_bias={"x": 1.0}), dict(logit_bias=[(1.5, 1.0)]),
                                    dict(logit_bias=7), dict(dry_sequence_breakers="\n"),
                                    dict(dry_sequence_breakers=[b"\n"]), dict(samplers="top_k")])
def test_seeds_biases_and_lists_have_their_types(change):
    """A float seed, a non-integer count, a token id beyond int32, a NaN bias or a string where a
    list of strings belongs is refused (a float seed once crashed the sampler)."""
    with pytest.raises(SettingError):
        SamplingSettings(**change)


def test_llama_cpp_meanings_are_kept():
    """What llama.cpp takes stays valid: top_k <= 0 (all), temperature <= 0 (greedy), seed -1 (fresh),
    probabilities 0 and 1, a -inf bias (a ban), numpy scalars, ints for floats."""
    s = SamplingSettings(top_k=-5, temperature=-1, seed=-1, top_p=1, min_p=0, typical_p=0, xtc_threshold=1,
                         logit_bias={"3": -math.inf}, repeat_last_n=np.int64(-1), mirostat_tau=np.float32(0))
    assert s.greedy and s.seed is None and s.logit_bias == ((3, -math.inf),)
    assert type(s.temperature) is float and type(s.repeat_last_n) is int and type(s.mirostat_tau) is float
    assert SamplingSettings(seed=2**64 - 1).seed == 2**64 - 1


@pytest.mark.parametrize("name", list(LIMITS))
def test_every_accepted_extreme_samples_without_raising(name):
    """At each setting's bounds (or +-3e38 when unbounded; just above an excluded bound) the sampler
    still picks a token, with penalties, DRY and XTC on."""
    limit = LIMITS[name]
    big = 2**31 - 1 if limit.kind is int else 3e38
    low = (1e-30 if limit.above else limit.lo) if limit.lo is not None else -big
    logits = np.random.default_rng(0).normal(size=64).astype(np.float32)
    for value in (low, limit.hi if limit.hi is not None else big):
        change = {"seed": 1, "dry_multiplier": 0.5, "xtc_probability": 0.5, "repeat_penalty": 1.5, name: value}
        with np.errstate(all="ignore"):
            sampler = Sampler(SamplingSettings(**change), [b"a", b"\n"] * 32, n_vocab=64, history=[1, 2, 1, 2])
            assert 0 <= sampler.sample(logits) < 64


def test_token_limit_takes_counts_and_no_limit():
    """max_tokens: None or negative is no limit, a count is itself; a float or bool is refused."""
    assert token_limit(None) is None and token_limit(-1) is None and token_limit(np.int32(5)) == 5
    for bad in (1.5, True, "8"):
        with pytest.raises(SettingError, match="max_tokens"):
            token_limit(bad)


# -- the same refusals through each caller ------------------------------------------------------


@pytest.mark.parametrize("name, value, flag", REFUSED)
def test_kinetic_run_refuses_naming_the_flag_before_loading(name, value, flag, capsys):
    """`kinetic run` refuses the value with exit 1 and the flag's name, before the model loads
    (so even a model that does not exist is never looked at)."""
    text = {math.inf: "inf", math.nan: "nan"}.get(value, str(value))
    assert main(["run", "no-such-model.gguf", "hi", flag, text]) == 1
    err = capsys.readouterr().err
    assert f"bad sampling flag: {flag}" in err and "no-such-model" not in err and "internal error" not in err


@pytest.mark.parametrize("name, value, flag", [case for case in REFUSED if math.isfinite(case[1])])  # JSON has no inf
def test_server_fields_refuse_with_a_400_naming_the_field(name, value, flag):
    """The server's llama-server and Ollama routes (not strict) refuse the same values with a 400
    whose param names the request field."""
    with pytest.raises(ApiError) as info:
        sampling_settings(Fields({name: value}), SamplingSettings(), n_vocab=100)
    assert info.value.status == 400 and info.value.param == name and name in info.value.message


def test_server_names_the_alias_the_client_sent():
    """A refusal of repetition_penalty (an alias of repeat_penalty) names repetition_penalty."""
    with pytest.raises(ApiError) as info:
        sampling_settings(Fields({"repetition_penalty": 0}, prefix="options."), SamplingSettings(), n_vocab=100)
    assert info.value.param == "options.repetition_penalty"


@pytest.fixture(scope="module")
def tiny_model():
    return kinetic.Model(synthetic_path("llama"), n_ctx=32)


@pytest.mark.parametrize("change", [dict(top_p=2.0), dict(temperature=math.inf), dict(seed=4.5),
                                    dict(min_p=-1.0), dict(max_tokens=1.5), dict(max_tokens=True)])
def test_python_api_refuses_with_kinetic_error(tiny_model, change):
    """Model.generate raises KineticError (not ValueError or TypeError from deep inside) for the same
    values, max_tokens included."""
    with pytest.raises(KineticError, match="bad sampling settings|bad max_tokens"):
        tiny_model.generate([1, 2, 3], **{"max_tokens": 2, **change})


def test_every_setting_has_a_limit_or_its_own_check():
    """LIMITS covers every numeric field; the rest (seed, lists, bias) have their own checks."""
    own = {"seed", "logit_bias", "dry_sequence_breakers", "samplers"}
    assert {f.name for f in fields(SamplingSettings)} == set(LIMITS) | own
