"""Reading a receipt refuses, with a KineticError naming the problem, anything but the JSON a receipt
holds (duplicate keys, NaN, deep nesting, a float seed, values a rerun cannot use), and
verify-receipt names every recorded fact a rerun does not share. No model runs here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinetic.cli import verify_receipt_cmd
from kinetic.errors import KineticError
from kinetic.receipts import Answer, hashing, make_receipt, read_receipt, strict_json, write_receipt
from kinetic.receipts import verify as v
from kinetic.receipts.receipt import sign
from kinetic.runtime.sampling import SamplingSettings


@pytest.fixture
def receipt(tmp_path, monkeypatch) -> dict:
    """A receipt of a made-up answer over a small file standing in for the model."""
    monkeypatch.setattr(hashing, "hash_cache_path", lambda: tmp_path / "hashes.json")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    answer = Answer(model_path=model, device="reference", n_ctx=64, input="hi", prompt_ids=[1, 2, 3],
                    sampling=SamplingSettings(seed=7, logit_bias={5: float("-inf")}), max_tokens=4,
                    finish="length", text="abcd", output_ids=[4, 5, 6, 7])
    return make_receipt(answer)


def saved(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "receipt.json"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_written_receipt_reads_back(receipt, tmp_path):
    """The receipt as written (with a -inf logit bias, written -Infinity) reads back equal."""
    path = tmp_path / "r.json"
    write_receipt(receipt, path)
    assert read_receipt(path) == receipt


def test_duplicate_keys_are_refused_signed_or_not(receipt, tmp_path):
    """A key twice in one object is refused, in a signed receipt too (the signature check and a
    reader could otherwise see different values)."""
    from nacl.signing import SigningKey

    for body in (receipt, sign(receipt, SigningKey.generate())):
        text = json.dumps(body).replace('"seed": 7', '"seed": 7, "seed": 8')
        with pytest.raises(KineticError, match="the key 'seed' appears twice"):
            read_receipt(saved(tmp_path, text))


@pytest.mark.parametrize("text, message", [
    ('{"receipt": NaN}', "holds NaN"), ('{"receipt": Infinity}', "holds Infinity"),
    ('{"receipt": 1e400}', "too large for a double"), ('{"receipt": 1,}', "not JSON"),
    ("[" * 100000 + "]" * 100000, "nests deeper than 32"), ('{"input": ' + "[" * 40 + "]" * 40 + "}", "nests deeper"),
])
def test_malformed_json_is_refused_by_name(text, message, tmp_path):
    """NaN, Infinity, an overflowing number, broken JSON and deep nesting (once a RecursionError) are
    refused naming why."""
    with pytest.raises(KineticError, match=message):
        read_receipt(saved(tmp_path, text))


def test_size_and_encoding_are_bounded(tmp_path, monkeypatch):
    """A file larger than a receipt can be is refused without reading it all; so is one not UTF-8."""
    monkeypatch.setattr("kinetic.receipts.receipt.MAX_RECEIPT_BYTES", 100)
    with pytest.raises(KineticError, match="larger than a receipt can be"):
        read_receipt(saved(tmp_path, " " * 101))
    (tmp_path / "latin.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(KineticError, match="not UTF-8"):
        read_receipt(tmp_path / "latin.json")
    assert strict_json.depth([[[]], {"a": [1]}]) == 3


@pytest.mark.parametrize("where, value, message", [
    (("sampling", "seed"), 42.5, "sampling.seed must be an integer"),
    (("sampling", "seed"), 42.0, "sampling.seed must be an integer"),
    (("sampling", "top_p"), 2, "sampling.top_p must be a number from 0 to 1"),
    (("sampling", "temperature"), "0.8", "sampling.temperature must be"),
    (("sampling", "max_tokens"), True, "max_tokens is True"),
    (("device", "settings", "ctx-size"), 10**12, "ctx-size is 1000000000000"),
    (("device", "settings", "kv-type"), "q4", "kv-type is 'q4'"),
    (("output", "finish"), "maybe", "output.finish is 'maybe'"),
    (("prompt", "count"), "3", "'prompt.count' is '3', not int"),
    (("model", "size"), -1, "model.size is negative"),
])
def test_wrong_values_are_refused_naming_the_member(receipt, tmp_path, where, value, message):
    """A float seed, an out-of-range setting, a context of 10^12, an unknown cache type, ... are
    refused when the receipt is read, naming the member, before any model is looked for."""
    inner = receipt
    for key in where[:-1]:
        inner = inner[key]
    inner[where[-1]] = value
    with pytest.raises(KineticError, match=message):
        read_receipt(saved(tmp_path, json.dumps(receipt)))


def test_an_unknown_home_folder_in_the_model_path_is_not_a_crash(receipt, tmp_path):
    """A recorded path of ~someone-not-here/model.gguf is skipped, not a RuntimeError."""
    receipt["model"]["path"] = "~no-such-user-here/model.gguf"
    with pytest.raises(KineticError, match="is not here"):
        v.find_model(receipt, tmp_path / "elsewhere" / "r.json", None)


def rerun_like(receipt: dict, **changes) -> v.Rerun:
    """What a rerun that reproduced the receipt exactly would report, with `changes`."""
    facts = dict(tokens=list(receipt["output"]["tokens"]["ids"]), finish=receipt["output"]["finish"],
                 text=receipt["output"]["text"], device_class=receipt["device"]["class"],
                 build=receipt["kinetic"]["build"], version=receipt["kinetic"]["version"],
                 device_name=receipt["device"]["name"])
    return v.Rerun(**{**facts, **changes})


def test_identical_rerun_on_the_receipts_build_and_class_verifies(receipt, capsys, tmp_path):
    """Same tokens, build, version, class and device: "identical", exit 0."""
    assert verify_receipt_cmd._report_rerun(tmp_path / "r.json", receipt, rerun_like(receipt)) == 0
    assert "rerun:     identical, 4 of 4" in capsys.readouterr().out


@pytest.mark.parametrize("member, label", [(("device", "class"), "device class"), (("kinetic", "build"), "build"),
                                           (("kinetic", "version"), "Kinetic version"), (("device", "name"), "device")])
def test_an_edited_build_or_device_class_is_reported_not_identical(receipt, capsys, tmp_path, member, label):
    """An unsigned receipt whose device class, build, version or device was edited (problem 8) is not
    "identical": the rerun's line says it is not comparable, the fact is named with both values, and
    the command fails."""
    rerun = rerun_like(receipt)  # made the way the receipt first said
    receipt[member[0]][member[1]] = "edited"
    with pytest.raises(KineticError, match="does not confirm the receipt"):
        verify_receipt_cmd._report_rerun(tmp_path / "r.json", receipt, rerun)
    out = capsys.readouterr().out
    assert "identical" not in out and "not comparable" in out
    assert f"{label} (receipt edited, rerun " in out


def test_every_differing_fact_is_named(receipt):
    """With build, class and device all different, what_differs names each of them."""
    reasons = v.what_differs(receipt, rerun_like(receipt, build="b2", device_class="cpu-x", device_name="GPU"))
    assert [r.split(" (")[0] for r in reasons] == ["build", "device class", "device"]
