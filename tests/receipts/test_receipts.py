"""Receipts end to end on SmolLM2: `kinetic run --receipt` then `kinetic verify-receipt`.

Two answers are made once per module (8 tokens each, sampled at temperature 1): one signed with a
fixed seed, one unsigned with a fresh seed. Each test changes a copy of one and checks what
verify-receipt says. Hashes go to a private cache, so nothing from the user's cache counts.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from kinetic.cli.main import main
from kinetic.receipts import hashing
from kinetic.receipts.hashing import token_hash
from kinetic.runtime.sampling import SamplingSettings
from tests.conftest import model_path

RUN = ["Name three rivers.", "--temp", "1.0", "-n", "8"]


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("cache")
        mp.setattr(hashing, "hash_cache_path", lambda: folder / "hashes.json")
        yield folder


@pytest.fixture(scope="module")
def made(tmp_path_factory, private_cache) -> dict[str, Path]:
    """A signed receipt (seed 7), an unsigned one (fresh seed), the key and another key."""
    folder = tmp_path_factory.mktemp("receipts")
    model = str(model_path("smollm2-135m"))
    for name in ("key", "other"):
        assert main(["keygen", str(folder / name)]) == 0
    assert main(["run", model, *RUN, "--seed", "7", "--receipt", str(folder / "signed.json"),
                 "--sign-key", str(folder / "key")]) == 0
    assert main(["run", model, *RUN, "--receipt", str(folder / "unsigned.json")]) == 0
    return {"folder": folder, "signed": folder / "signed.json", "unsigned": folder / "unsigned.json",
            "key": folder / "key", "other": folder / "other"}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def changed(made, which: str, change, *, rehash: bool = False) -> Path:
    """A copy of a receipt with `change(receipt)` applied (and the token hashes recomputed)."""
    receipt = load(made[which])
    change(receipt)
    if rehash:
        for record in (receipt["prompt"], receipt["output"]["tokens"]):
            record["blake3"] = token_hash(record["ids"])
    out = made["folder"] / f"changed-{which}.json"
    out.write_text(json.dumps(receipt))
    return out


def verify(capsys, path: Path, *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["verify-receipt", str(path), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_receipt_records_every_setting_and_the_seed(made):
    """The receipt has the seed's fields, every sampling setting, the seed given, and token hashes
    that are BLAKE3 over little-endian u32 ids."""
    receipt = load(made["signed"])
    assert set(receipt) == {"receipt", "kinetic", "model", "device", "input", "prompt", "sampling", "output",
                            "signature"}
    assert receipt["sampling"]["seed"] == 7 and receipt["sampling"]["temperature"] == 1.0
    assert set(SamplingSettings().as_dict()) | {"max_tokens", "stop"} == set(receipt["sampling"])
    assert receipt["input"] == [{"role": "user", "content": "Name three rivers."}]
    tokens = receipt["output"]["tokens"]
    assert tokens["count"] == len(tokens["ids"]) == 8 and receipt["output"]["finish"] == "length"
    import blake3
    import numpy as np

    assert tokens["blake3"] == blake3.blake3(np.array(tokens["ids"], "<u4").tobytes()).hexdigest()
    assert receipt["model"]["size"] == model_path("smollm2-135m").stat().st_size


def test_unsigned_receipt_with_a_fresh_seed_verifies_identical(made, capsys):
    """Without --seed a fresh seed is drawn and recorded, and rerunning it gives every token again."""
    assert isinstance(load(made["unsigned"])["sampling"]["seed"], int)
    code, out, _ = verify(capsys, made["unsigned"])
    assert code == 0, out
    assert "signature: none (unsigned)" in out and "rerun:     identical, 8 of 8 output tokens" in out


def test_signed_receipt_verifies_with_its_key(made, capsys):
    """A signed receipt verifies: valid signature by the key's public half, identical rerun."""
    public = (made["key"].parent / "key.pub").read_text().strip()
    code, out, _ = verify(capsys, made["signed"], "--key", str(made["folder"] / "key.pub"))
    assert code == 0, out
    assert f"signature: valid, public key {public}" in out and "identical, 8 of 8" in out


def test_signed_receipt_fails_with_another_key(made, capsys):
    """--key naming another public key fails; so does a receipt whose public key was swapped."""
    code, _, err = verify(capsys, made["signed"], "--key", str(made["folder"] / "other.pub"))
    assert code == 1 and "is signed by" in err
    other = (made["folder"] / "other.pub").read_text().strip()
    swapped = changed(made, "signed", lambda r: r["signature"].update(public_key=other))
    code, out, err = verify(capsys, swapped)
    assert code == 1 and "signature: INVALID" in out and "signature does not match" in err


@pytest.mark.parametrize("what", ["token", "seed", "setting", "text", "ctx"])
def test_signed_receipt_fails_when_anything_changes(made, capsys, what):
    """Changing a token (hashes recomputed), the seed, a setting, the text or a load setting breaks
    the signature, before any rerun."""
    changes = {
        "token": lambda r: r["output"]["tokens"]["ids"].__setitem__(3, r["output"]["tokens"]["ids"][3] + 1),
        "seed": lambda r: r["sampling"].update(seed=8),
        "setting": lambda r: r["sampling"].update(top_k=41),
        "text": lambda r: r["output"].update(text=r["output"]["text"] + "!"),
        "ctx": lambda r: r["device"]["settings"].update({"ctx-size": 2048}),
    }
    code, out, err = verify(capsys, changed(made, "signed", changes[what], rehash=True))
    assert code == 1 and "signature: INVALID" in out and "rerun:" not in out, out


def test_unsigned_receipt_with_a_changed_token_fails_the_hash(made, capsys):
    """A changed output token without a new hash fails the token hash check."""
    bad = changed(made, "unsigned", lambda r: r["output"]["tokens"]["ids"].__setitem__(0, 5))
    code, out, err = verify(capsys, bad)
    assert code == 1 and "output token ids do not match their BLAKE3" in err and "rerun:" not in out


@pytest.mark.parametrize("what", ["token", "seed", "setting"])
def test_unsigned_receipt_changed_and_rehashed_fails_the_rerun(made, capsys, what):
    """With the hashes recomputed, a changed token, seed or setting is caught by the rerun, which
    names the first differing token and says that build, class and settings are the receipt's."""
    at = {"token": 5, "seed": None, "setting": None}[what]
    changes = {
        "token": lambda r: r["output"]["tokens"]["ids"].__setitem__(5, r["output"]["tokens"]["ids"][5] + 1),
        "seed": lambda r: r["sampling"].update(seed=r["sampling"]["seed"] + 1),
        "setting": lambda r: r["sampling"].update(top_k=1),
    }
    code, out, err = verify(capsys, changed(made, "unsigned", changes[what], rehash=True))
    assert code == 1 and "rerun does not reproduce" in err, out
    assert ("differs at output token 6 of 8" if at == 5 else "differs at output token") in out
    assert "the build, the device class and the settings are the receipt's" in out


@pytest.mark.parametrize("member, label", [(("device", "class"), "device class"), (("kinetic", "build"), "build")])
def test_unsigned_receipt_with_an_edited_build_or_class_is_not_identical(made, capsys, member, label):
    """An unsigned receipt whose device class or build was edited (its tokens untouched) reruns to the
    same tokens, but verify-receipt names the edited fact, says the rerun is not comparable and fails
    (it once said "identical")."""
    bad = changed(made, "unsigned", lambda r: r[member[0]].update({member[1]: "cuda-sm86-edited"}))
    code, out, err = verify(capsys, bad)
    assert code == 1 and "identical" not in out and "not comparable" in out, out
    assert f"{label} (receipt cuda-sm86-edited, rerun " in out and "does not confirm the receipt" in err


def test_another_model_file_is_refused(made, capsys):
    """--model pointing at a file that is not the receipt's is refused before any rerun."""
    from tests.synthetic import synthetic_path

    code, out, err = verify(capsys, made["unsigned"], "--model", str(synthetic_path("llama")))
    assert code == 1 and "is not the receipt's model file" in err and "DIFFERS" in out


def test_file_hash_is_cached_until_the_file_changes(tmp_path, private_cache, monkeypatch):
    """A file is hashed once; a file written since (same size) is hashed again."""
    f = tmp_path / "model.bin"
    f.write_bytes(b"a" * 1000)
    first = hashing.file_blake3(f)
    calls = []
    real = hashing.blake3.blake3

    class Counting:
        AUTO = real.AUTO

        def __init__(self, *args, **kwargs):
            calls.append(args)
            self.hasher = real(*args, **kwargs)

        def update_mmap(self, path):
            self.hasher.update_mmap(path)

        def hexdigest(self):
            return self.hasher.hexdigest()

    monkeypatch.setattr(hashing, "blake3", types.SimpleNamespace(blake3=Counting))
    assert hashing.file_blake3(f) == first and calls == []
    f.write_bytes(b"b" * 1000)
    assert hashing.file_blake3(f) != first and len(calls) == 1


def test_canonical_form_is_sorted_compact_json_without_the_signature(made):
    """The signed bytes are the receipt minus its signature, keys sorted, no spaces, UTF-8."""
    from kinetic.receipts import canonical_bytes

    receipt = load(made["signed"])
    body = {k: v for k, v in receipt.items() if k != "signature"}
    assert canonical_bytes(receipt) == json.dumps(body, sort_keys=True, separators=(",", ":"),
                                                  ensure_ascii=False).encode()
    assert b" " not in canonical_bytes({"b": 1, "a": [1, 2]}) and canonical_bytes({"b": 1, "a": 2}) == b'{"a":2,"b":1}'


def test_prompt_ids_receipt_records_no_input_and_verifies(made, capsys):
    """A greedy answer to --prompt-ids records input null and those very ids, and verifies."""
    out = made["folder"] / "ids.json"
    assert main(["run", str(model_path("smollm2-135m")), "--prompt-ids", "504,3575,282", "--temp", "0", "-n", "4",
                 "--receipt", str(out)]) == 0
    receipt = load(out)
    assert receipt["input"] is None and receipt["prompt"]["ids"] == [504, 3575, 282]
    code, text, _ = verify(capsys, out)
    assert code == 0 and "identical, 4 of 4" in text


def test_sign_key_needs_a_receipt(capsys):
    """--sign-key without --receipt fails before the model loads."""
    assert main(["run", "no-such-model.gguf", "hi", "--sign-key", "k"]) == 1
    assert "--sign-key signs a receipt" in capsys.readouterr().err


def test_a_receipt_made_with_drafting_verifies_identical(made, capsys, monkeypatch):
    """A sampled answer made with RAD-1 drafting (and guesses kept: a prompt the answer repeats)
    reruns plainly to the same tokens."""
    from kinetic.runtime import speculative

    kept = []
    steps = speculative.SpeculativeDecoder.steps  # the one decoding loop (generate and Generation use it)

    def counting(self, seq, prompt, max_tokens, stop=frozenset(), picker=None, draft=None, stats=None, **more):
        stats = stats if stats is not None else speculative.DraftStats()
        try:
            return (yield from steps(self, seq, prompt, max_tokens, stop, picker, draft, stats, **more))
        finally:  # the caller closes the generator at the end-of-turn token
            kept.append(stats.accepted)

    monkeypatch.setattr(speculative.SpeculativeDecoder, "steps", counting)
    prompt = "red green blue, red green blue, red green blue, red green blue, red green blue, red"
    path = made["folder"] / "drafted.json"
    assert main(["run", str(model_path("smollm2-135m")), prompt, "--raw", "--temp", "0.3", "--seed", "5",
                 "-n", "48", "--receipt", str(path)]) == 0
    assert sum(kept) > 0, "the answer was meant to be drafted"
    monkeypatch.undo()
    code, out, err = verify(capsys, path)
    assert code == 0 and "identical" in out, err


def test_rotary_overrides_are_recorded_and_rerun(made, capsys):
    """An answer made with --rope-freq-scale records it under device.settings.rope, and verify-receipt
    reruns with it (identical); the same receipt with the override removed no longer reruns identical."""
    out = made["folder"] / "rope.json"
    assert main(["run", str(model_path("smollm2-135m")), "--prompt-ids", "504,3575,282", "--temp", "0", "-n", "6",
                 "--rope-freq-scale", "0.25", "--receipt", str(out)]) == 0
    receipt = load(out)
    assert receipt["device"]["settings"]["rope"] == {"freq_scale": 0.25}
    code, text, _ = verify(capsys, out)
    assert code == 0 and "identical, 6 of 6" in text, text
    dropped = changed(made, "unsigned", lambda r: None)
    dropped.write_text(json.dumps({**receipt, "device": {**receipt["device"], "settings": {
        k: v for k, v in receipt["device"]["settings"].items() if k != "rope"}}}))
    code, text, _ = verify(capsys, dropped)
    assert code != 0 and "identical, 6 of 6" not in text, text


def test_a_malformed_rope_setting_is_refused_by_name(made, capsys):
    """device.settings.rope with an unknown field or a bad value is refused naming it."""
    for rope in ({"warp": 2}, {"freq_scale": "fast"}, {"freq_scale": -1.0}, [1]):
        bad = changed(made, "unsigned", lambda r, rope=rope: r["device"]["settings"].update(rope=rope))
        code, _, err = verify(capsys, bad)
        assert code == 1 and "device.settings.rope" in err, err
