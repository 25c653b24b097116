""".ktc files edited and re-hashed are refused before any kernel runs; signatures can be required;
thread counts and profiles are bounded.

The crafted files are the synthetic llama compiled to .ktc with one section edited and written
again with valid hashes (tests/ktc_variants.py). The cases that crashed Kinetic before (SIGSEGV)
run in a child process (tests/load_worker.py), so a regression fails the test instead of pytest.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from kinetic.cli.main import main
from kinetic.errors import KineticError, SignatureRequiredError
from kinetic.ktc import Kind, KtcError
from kinetic.ktc.load import REQUIRE_SIGNATURE_ENV, LoadedKtc, load_if_ktc, required_signer
from kinetic.limits import check_threads, max_threads
from kinetic.model import Model
from tests.ktc_variants import read_sections, rewrite
from tests.load_worker import run_cases
from tests.synthetic import synthetic_path


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("keys")
    for name in ("publisher", "other"):
        assert main(["keygen", str(folder / name)]) == 0
    return {name: folder / f"{name}.pub" for name in ("publisher", "other")} | {"secret": folder / "publisher"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, keys) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ktc")
    out = {"unsigned": folder / "llama.ktc", "signed": folder / "signed.ktc"}
    assert main(["compile", str(synthetic_path("llama")), "-o", str(out["unsigned"])]) == 0
    signed = ["--sign-key", str(keys["secret"])]
    assert main(["compile", str(synthetic_path("llama")), "-o", str(out["signed"]), *signed]) == 0
    return out


def _graph_edit(*replacements: tuple[str, str]):
    def edit(sections: dict[Kind, bytes]) -> dict[Kind, bytes]:
        text = sections[Kind.GRAPH].decode()
        for old, new in replacements:
            assert old in text
            text = text.replace(old, new)
        return {Kind.GRAPH: text.encode()}
    return edit


CRAFTED = {
    # the embedding table and the logits claim 2,000,000 rows (the graph verifies): the output matmul
    # reads far past the tensor (SIGSEGV before)
    "param shape with its uses": _graph_edit(("q8_0[2048,256]", "q8_0[2000000,256]"),
                                             ("f32[R,2048]", "f32[R,2000000]")),
    # the KV cache of layer 0 allocated one value wide, the attention writing 128 per row (SIGSEGV before)
    "KV state smaller than its attention": _graph_edit(("n_kv_head=2, head_dim=64} : kv[]",
                                                        "n_kv_head=1, head_dim=1} : kv[]")),
    # q4_0 bytes read as q8_0 blocks, past the tensor's end (ran before)
    "param type": _graph_edit(("q4_0[256,256]", "q8_0[256,256]")),
}


def test_crafted_graphs_with_valid_hashes_are_refused(compiled, tmp_path):
    """An edited graph whose params or KV state disagree with the weights is refused (it crashed or
    read outside a tensor before), in a child process so that a crash fails only this test."""
    source = read_sections(compiled["unsigned"])
    for edit in CRAFTED.values():  # each edit applies to a graph section as written today
        edit(source)
    cases = [(f"ktc:{name}", partial(rewrite, source, edit(source))) for name, edit in CRAFTED.items()]
    outcomes = run_cases(cases, tmp_path / "work")
    for name, outcome in outcomes.items():
        assert outcome.kind == "refused" and "section graph" in outcome.detail, (name, outcome)


@pytest.mark.parametrize(("field", "value"), [("batch", 10**9), ("threads", 100_000), ("matmul_tile", 0)])
def test_profile_out_of_bounds_is_refused(compiled, tmp_path, field, value):
    """A profile asking for a batch of 10^9 or 100,000 threads is refused on load, before allocating."""
    source = read_sections(compiled["unsigned"])
    profile = json.loads(source[Kind.PROFILE]) | {field: value}
    path = rewrite(source, {Kind.PROFILE: json.dumps(profile).encode()}, tmp_path / "edited.ktc")
    with pytest.raises(KtcError, match=f"'{field}' is {value}, outside 1..") as info:
        LoadedKtc(path)
    assert info.value.part == "profile"


def test_profile_threads_beyond_this_machine_fall_back_with_a_note(compiled, tmp_path):
    """A profile's thread count above 4 per CPU here is replaced by every CPU's default, with a note."""
    source = read_sections(compiled["unsigned"])
    profile = json.loads(source[Kind.PROFILE]) | {"threads": max_threads() + 1}
    path = rewrite(source, {Kind.PROFILE: json.dumps(profile).encode()}, tmp_path / "edited.ktc")
    notes = []
    loaded = LoadedKtc(path, note=notes.append)
    assert loaded.engine_settings("cpu", None)["threads"] is None
    assert any("threads" in n for n in notes)


def test_deeply_nested_json_section_is_refused(compiled, tmp_path):
    """JSON nested past Python's stack is a KtcError naming the section, not a RecursionError."""
    source = read_sections(compiled["unsigned"])
    deep = b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(KtcError, match="section metadata is JSON Kinetic does not read"):
        LoadedKtc(rewrite(source, {Kind.METADATA: deep}, tmp_path / "deep.ktc"))


# -- required signatures -------------------------------------------------------------------------------


def _hex(path: Path) -> str:
    return path.read_text().strip()


def test_required_signer_accepts_its_own_file(compiled, keys):
    """A .ktc file signed by the required key loads."""
    assert load_if_ktc(compiled["signed"], require_signer=required_signer(str(keys["publisher"]))) is not None


@pytest.mark.parametrize(("file", "key", "match"), [
    ("signed", "other", "is signed by"), ("unsigned", "publisher", "is unsigned"),
    ("gguf", "publisher", "is not a .ktc file")])
def test_required_signer_refuses_everything_else(compiled, keys, file, key, match):
    """Another signer, no signer, or a GGUF file (which cannot be signed) is a SignatureRequiredError."""
    path = synthetic_path("llama") if file == "gguf" else compiled[file]
    with pytest.raises(SignatureRequiredError, match=match):
        load_if_ktc(path, require_signer=required_signer(_hex(keys[key])))


def test_model_reads_the_required_signer_from_the_environment(compiled, keys, monkeypatch):
    """Model(...) without require_signature applies $KINETIC_REQUIRE_SIGNATURE; an argument wins over it."""
    monkeypatch.setenv(REQUIRE_SIGNATURE_ENV, _hex(keys["other"]))
    with pytest.raises(SignatureRequiredError):
        Model(compiled["signed"], n_ctx=64)
    assert Model(compiled["signed"], n_ctx=64, require_signature=_hex(keys["publisher"])).n_vocab == 2048
    monkeypatch.setenv(REQUIRE_SIGNATURE_ENV, "not-a-key")
    with pytest.raises(KineticError, match=f"\\${REQUIRE_SIGNATURE_ENV}: not-a-key"):
        Model(compiled["signed"], n_ctx=64)


def test_cli_run_requires_the_signature(compiled, keys, capsys):
    """`kinetic run --require-signature KEY` refuses a GGUF file and runs the file KEY signed."""
    gguf = str(synthetic_path("llama"))
    assert main(["run", gguf, "hi", "-n", "1", "--require-signature", str(keys["publisher"])]) == 1
    assert "is not a .ktc file" in capsys.readouterr().err
    assert main(["run", str(compiled["signed"]), "hi", "-n", "1", "--require-signature", str(keys["publisher"])]) == 0


def test_cli_serve_requires_the_signature(keys, capsys):
    """`kinetic serve --require-signature KEY` refuses a GGUF file before serving."""
    args = ["serve", str(synthetic_path("llama")), "--port", "0", "--require-signature", str(keys["publisher"])]
    assert main(args) == 1
    assert "is not a .ktc file" in capsys.readouterr().err


# -- thread counts -------------------------------------------------------------------------------------


def test_thread_counts_are_bounded():
    """None and 1..4 per CPU pass; 0, more than 4 per CPU, booleans and fractions are KineticErrors."""
    assert check_threads(None) is None and check_threads(1) == 1 and check_threads(max_threads()) == max_threads()
    for bad in (0, -1, max_threads() + 1, 1000 * max_threads(), True, 2.5):
        with pytest.raises(KineticError):
            check_threads(bad)


def test_run_with_a_thousand_threads_is_refused(capsys):
    """`kinetic run -t 1000` (on a machine with fewer than 250 CPUs) stops with the allowed range."""
    if max_threads() >= 1000:
        pytest.skip("this machine allows 1000 threads")
    assert main(["run", str(synthetic_path("llama")), "hi", "-n", "1", "-t", "1000"]) == 1
    assert f"outside 1..{max_threads()}" in capsys.readouterr().err
