"""Receipts from the server ("receipt": true on /v1/chat/completions and /v1/completions): the format
`kinetic run --receipt` writes, signed with the server's key, made with drafting on, and accepted by
`kinetic verify-receipt` (greedy, seeded, and with a fresh seed drawn for the request); a tampered
one is rejected; what a receipt cannot record yet is a 400."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from nacl.signing import SigningKey

from kinetic.receipts import signature_valid
from kinetic.server.options import ServerOptions
from tests.server.live import serving

KEY = SigningKey(bytes(range(32)))
CHAT = {"messages": [{"role": "user", "content": "Name three rivers."}], "max_tokens": 12, "receipt": True}


@pytest.fixture(scope="module")
def url(model):
    assert model.generator.draft, "the receipts must come from an answer made with drafting on"
    with serving(model, ServerOptions(sign_key=KEY)) as base:
        yield base


def _verify(receipt: dict, tmp_path, name: str) -> subprocess.CompletedProcess:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(receipt))
    return subprocess.run([sys.executable, "-m", "kinetic.cli.main", "verify-receipt", str(path), "-t", "2"],
                          capture_output=True, text=True, timeout=300)


def _stream_receipt(url: str, path: str, body: dict) -> tuple[str, dict]:
    """The streamed text and the receipt carried by the stream's last chunk."""
    lines = httpx.post(url + path, json={**body, "stream": True}, timeout=120).text.splitlines()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
    assert all("receipt" not in c for c in chunks[:-1])
    text = "".join((c["choices"][0].get("delta", {}).get("content") or c["choices"][0].get("text") or "")
                   for c in chunks if c["choices"])
    return text, chunks[-1]["receipt"]


def test_greedy_chat_receipt_verifies_and_a_tampered_one_does_not(url, tmp_path):
    """A greedy chat's receipt records the messages, the prompt and output tokens and a seed, is
    signed by the server's key, and verifies as identical; changing an output token fails it."""
    answer = httpx.post(url + "/v1/chat/completions", json={**CHAT, "temperature": 0}, timeout=120).json()
    receipt = answer["receipt"]
    assert receipt["input"] == CHAT["messages"] and receipt["output"]["text"] == answer["choices"][0]["message"][
        "content"]
    assert receipt["sampling"]["temperature"] == 0 and isinstance(receipt["sampling"]["seed"], int)
    assert signature_valid(receipt) and receipt["signature"]["public_key"] == bytes(KEY.verify_key).hex()
    verified = _verify(receipt, tmp_path, "greedy")
    assert verified.returncode == 0 and "identical" in verified.stdout, verified.stdout + verified.stderr
    tampered = json.loads(json.dumps(receipt))
    tampered["output"]["tokens"]["ids"][0] += 1
    rejected = _verify(tampered, tmp_path, "tampered")
    assert rejected.returncode == 1


def test_seeded_and_fresh_seed_receipts_verify_streamed_or_not(url, tmp_path):
    """Sampling at temperature 0.8: with seed 42 (a streamed /v1/completions, the receipt in the last
    chunk) and with no seed (the fresh seed the server drew is recorded), both verify as identical."""
    text, seeded = _stream_receipt(url, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 12,
                                                            "temperature": 0.8, "seed": 42, "receipt": True})
    assert seeded["sampling"]["seed"] == 42 and seeded["output"]["text"] == text
    assert seeded["input"] == "Once upon a time"
    fresh = httpx.post(url + "/v1/chat/completions", json={**CHAT, "temperature": 0.8}, timeout=120).json()["receipt"]
    assert fresh["sampling"]["seed"] not in (None, -1)
    for name, receipt in (("seeded", seeded), ("fresh", fresh)):
        verified = _verify(receipt, tmp_path, name)
        assert verified.returncode == 0 and "identical" in verified.stdout, verified.stdout + verified.stderr


@pytest.mark.parametrize("extra,named", [({"stop": ["\n"]}, "stop strings"),
                                         ({"response_format": {"type": "json_object"}}, "response_format"),
                                         ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools")])
def test_what_a_receipt_cannot_record_is_refused(url, extra, named):
    """A receipt with stop strings, a response_format or tools is a 400 naming them (verify-receipt
    reruns without them)."""
    answer = httpx.post(url + "/v1/chat/completions", json={**CHAT, **extra}, timeout=120)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "receipt" and named in error["message"]


def test_sign_key_flag_reads_the_key_and_refuses_a_bad_file(tmp_path):
    """--sign-key FILE gives the server the key in the file (64 hex digits); a file that is not a key
    stops `kinetic serve` with a KineticError naming it, before anything is served."""
    import argparse

    from kinetic.errors import KineticError
    from kinetic.server.options import add_server_args, server_settings

    parser = argparse.ArgumentParser()
    add_server_args(parser)
    good = tmp_path / "receipt.key"
    good.write_text(bytes(range(32)).hex() + "\n")
    settings = server_settings(parser.parse_args(["--sign-key", str(good)]), {})
    assert bytes(settings["sign_key"].verify_key) == bytes(KEY.verify_key)
    bad = tmp_path / "bad.key"
    bad.write_text("not a key")
    with pytest.raises(KineticError, match="bad.key"):
        server_settings(parser.parse_args(["--sign-key", str(bad)]), {})
