"""`kinetic compile --tune`'s kernel choices: every candidate gives the default's logits bit for bit, a
candidate that did not would be refused, and a profile's choice reaches the compiled step."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

import kinetic
from kinetic.codegen.cpu.matmul_choice import TILES, MatmulChoice, graph_weights, wide_types
from kinetic.codegen.cpu.target import host
from kinetic.compiler import compile_graph
from kinetic.frontend.gguf_file import open_gguf
from kinetic.ktc import tune, tune_runs
from kinetic.ktc.load import LoadedKtc
from kinetic.ktc.profile import Profile, default_profile
from kinetic.ktc.tune import Candidate
from kinetic.ktc.tune_kernels import Refused, choose_kernels, fingerprint, kernel_candidates
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.synthetic import synthetic_path


def graph_and_weights(path):
    gguf = open_gguf(path)
    return compile_graph(gguf), GGUFWeights(gguf)


@pytest.mark.parametrize("fixture", ["smollm2_path", "gemma_path"])
def test_every_kernel_candidate_gives_the_default_bits(fixture, request):
    """On SmolLM2 (Q4_1, Q8_0: the 512-bit wide tiles) and Gemma 3 (Q4_K lanes, Q5_0, Q8_0...), each
    kernel candidate's logits (prompt passes of 32 rows and of 5, then a decode step) have the
    default kernels' bits, and the candidates include other tiles and the wide paths off."""
    graph, weights = graph_and_weights(request.getfixturevalue(fixture))
    candidates = kernel_candidates(graph, host().best_variant())
    assert candidates[0] == MatmulChoice() and {c.tile for c in candidates} == set(TILES)
    if host().best_variant() == "vnni":
        assert any(c.narrow for c in candidates)
    prints = {c: fingerprint(Engine(graph, weights, n_ctx=tune.FINGERPRINT_TOKENS + 8, batch=32, threads=1,
                                    matmul=c, prompt_pass=32),
                             tune.prompt_ids(graph), tune.FINGERPRINT_TOKENS) for c in candidates}
    assert set(prints.values()) == {prints[MatmulChoice()]}, prints


def test_wide_types_follow_the_kernels():
    """Q4_1 and Q8_0 have wide tiles at 8 and 4 rows on VNNI, none at 16; Q4_K's lanes need 8 rows or
    more; without VNNI no type has a wide path."""
    from gguf import GGMLQuantizationType as Q

    weights = {(Q.Q4_1, 576), (Q.Q8_0, 576), (Q.Q4_K, 1024), (Q.Q6_K, 1024)}
    assert {"Q4_1", "Q4_K", "Q8_0"} <= set(wide_types(weights, "vnni", 8))
    assert {"Q4_1", "Q8_0"} <= set(wide_types(weights, "vnni", 4)) and "Q4_K" not in wide_types(weights, "vnni", 4)
    at16 = wide_types(weights, "vnni", 16)
    assert "Q4_K" in at16 and "Q4_1" not in at16 and "Q8_0" not in at16
    assert wide_types(weights, "avx2", 8) == []


def test_a_candidate_with_other_bits_is_refused(monkeypatch):
    """An engine whose logits bits differ from the first engine's (tile 4's, the check's input made
    to differ) is refused when built, and the search never times it; the others pass and are timed."""
    graph, weights = graph_and_weights(synthetic_path("llama"))
    real = tune_runs.fingerprint

    def tile4_differs(engine, prompt, tokens):
        bits = real(engine, prompt, tokens)
        return bits[::-1] if engine.runner.kernels.matmul_choice.tile == 4 else bits

    monkeypatch.setattr(tune_runs, "fingerprint", tile4_differs)
    engines = tune_runs.Engines(graph, weights, "cpu", tune.prompt_ids(graph), n_ctx=tune.N_CTX,
                                check_tokens=tune.FINGERPRINT_TOKENS)
    cands = [Candidate(1, 32, matmul=m) for m in (MatmulChoice(), MatmulChoice(tile=4), MatmulChoice(tile=16))]
    engines(cands[0])
    with pytest.raises(Refused, match="tile 4 gives other logits"):
        engines(cands[1])
    engines(cands[2])
    sizes = tune_runs.Sizes(pp=32, tg=4, prompt=tune.prompt_ids(graph))
    tune_runs.measure(cands, ("pp",), engines, tune_runs.Walls(), sizes, time.monotonic() + 3.0, lambda _: None)
    assert "other logits" in cands[1].refused and cands[1].pp == [] and "refused" in cands[1].to_json()
    assert cands[0].pp and cands[2].pp and not cands[0].refused and not cands[2].refused
    assert len(engines.fingerprints) == 3


def test_choice_is_fastest_prompt_and_default_when_tied():
    """The kernels with the fastest prompt win; within the tie margin the default does; refused never."""
    fast, default, slow = MatmulChoice(tile=4), MatmulChoice(), MatmulChoice(tile=16)
    cands = [Candidate(1, 32, matmul=m, pp=[r]) for m, r in ((default, 100.0), (fast, 150.0), (slow, 90.0))]
    assert choose_kernels(cands, 0.02) == fast
    cands[1].pp = [101.0]
    assert choose_kernels(cands, 0.02) == default
    cands[1].pp, cands[1].refused = [300.0], "other logits"
    assert choose_kernels(cands, 0.02) == default


def build_with(profile: Profile, tmp_path):
    from kinetic.cli.compile_cmd import compile_model
    from kinetic.ktc.build import build_ktc

    graphs: list = []
    compile_model(synthetic_path("llama"), keep=graphs)
    out = tmp_path / "tuned.ktc"
    build_ktc(open_gguf(synthetic_path("llama")), graphs[-1], out, profile=profile)
    return out


def test_profile_matmul_choice_reaches_the_step(tmp_path):
    """A profile's matmul_tile and matmul_narrow are stored, read back, and the loaded model's CPU
    step renders its kernels with them."""
    profile = replace(default_profile(), tuned=True, matmul_tile=4, matmul_narrow=("Q8_0",), measured={})
    out = build_with(profile, tmp_path)
    assert LoadedKtc(out).profile.matmul_narrow == ("Q8_0",)
    model = kinetic.Model(out, n_ctx=64)
    assert model.engine.runner.kernels.matmul_choice == MatmulChoice(tile=4, narrow=frozenset({"Q8_0"}))


def test_untried_tile_falls_back_with_a_note(tmp_path):
    """A profile tile the tuner never tries (1..1024 but not in TILES) runs the default kernels, one note."""
    out = build_with(replace(default_profile(), matmul_tile=1000), tmp_path)
    notes: list[str] = []
    assert LoadedKtc(out, note=notes.append).engine_settings("cpu", None)["matmul"] is None
    assert len(notes) == 1 and "1000" in notes[0]


def test_profile_json_keeps_matmul_narrow_and_checks_it():
    """matmul_narrow round-trips, is left out when empty (old files read), and must name GGML types."""
    profile = replace(default_profile(), matmul_narrow=("Q4_1", "Q8_0"))
    assert Profile.from_json(profile.to_json()) == profile
    assert "matmul_narrow" not in default_profile().to_json()
    with pytest.raises(ValueError, match="matmul_narrow"):
        Profile.from_json({**profile.to_json(), "matmul_narrow": ["Q9_9"]})
    with pytest.raises(ValueError, match="matmul_narrow"):
        Profile.from_json({**profile.to_json(), "matmul_narrow": "Q4_1"})


def test_graph_weights_lists_quantized_weights():
    """graph_weights gives (type, K) of the weights the quantized kernels multiply by."""
    graph, _ = graph_and_weights(synthetic_path("llama"))
    assert graph_weights(graph) and all(isinstance(k, int) and k > 0 for _, k in graph_weights(graph))


class _Quiet:
    def write(self, _text):
        pass

    def flush(self):
        pass
