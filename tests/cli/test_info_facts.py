"""`kinetic info` names each model family's distinctive facts (heads, rotary, norms, multipliers,
sliding windows) from the family descriptor's `facts` hook, in text and in --json."""

from __future__ import annotations

import argparse
import json

import pytest

from kinetic.cli import info_cmd
from kinetic.frontend.families import family_for, supported_architectures
from kinetic.frontend.gguf_file import open_gguf
from tests.synthetic import SYNTHETIC, rewrite_gguf, synthetic_path

# synthetic file -> rows its `kinetic info` text must hold (label padded to the report's column)
DISTINCTIVE = {
    "llama": ["attention      4 heads x 64, 2 KV heads (GQA 2)",
              "rotary         interleaved pairs over the whole head, base 100000, no scaling"],
    "gemma3-gqa": ["rotary         NeoX halves over the whole head, base 1000000, no scaling; base 10000 on sliding",
                   "multipliers    embedding x sqrt(width) = 16, q x 1/sqrt(head size) before attention",
                   "norms          q and k RMS-normed per head; before and after attention and feed-forward",
                   "feed-forward   GELU-gated",
                   "sliding window 4 positions on 6 of 7 layers; global layers: 5\n"],
    "qwen2-gqa4": ["attention      8 heads x 64, 2 KV heads (GQA 4)",
                   "biases         q, k and v add a bias after the projection"],
    "granite-gqa3": ["attention      6 heads x 64, 2 KV heads (GQA 3)",
                     "multipliers    embedding x12, residual branches x0.22, attention scores x0.015625, logits / 8"],
    "granite-nope": ["rotary         none (rope.scaling.finetuned is false)",
                     "multipliers    embedding x1, residual branches x1, attention scores x1/sqrt(head size), "
                     "logits / 3"],
    "olmo2-swa": ["norms          q and k RMS-normed over the whole projection; after attention and feed-forward only",
                  "sliding window 4 positions on 3 of 4 layers; global layers: 1\n"],
    "olmo2-yarn": ["rotary         NeoX halves over the whole head, base 500000, YaRN scaling x16, original context "
                   "32; on global layers only (sliding layers: no scaling)",
                   "sliding window 6 positions on 3 of 4 layers; global layers: 3\n"],
    "exaone4-swa64": ["rotary         NeoX halves over the whole head, base 1000000, no scaling; sliding layers only "
                      "(global layers have none)",
                      "norms          q and k RMS-normed per head; after attention and feed-forward only",
                      "sliding window 4 positions on 48 of 64 layers; global layers: 3, 7, 11, 15, 19, 23, 27, "
                      "31, ..."],
    "exaone4-gqa4": ["sliding window none (the file's window is used by llama.cpp only with 64 layers)"],
}


def _info(path, capsys, *, as_json: bool = False) -> str:
    assert info_cmd.run(argparse.Namespace(model=str(path), json=as_json)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(DISTINCTIVE))
def test_info_names_the_family_facts(name, capsys):
    """The text report of a family's file holds the rows that say what is distinctive about it."""
    out = _info(SYNTHETIC / name / f"{name}.gguf", capsys) + "\n"
    for row in DISTINCTIVE[name]:
        assert f"  {row}" in out, f"{row!r} not in\n{out}"


@pytest.mark.parametrize("arch", sorted(supported_architectures()))
def test_every_family_reports_heads_and_rotary(arch, capsys):
    """Every registered family's shared file gets the attention and rotary rows, and --json carries
    the same facts as the family's hook gives."""
    path = synthetic_path(arch)
    out = _info(path, capsys)
    assert "\n  attention      " in out and "\n  rotary         " in out
    data = json.loads(_info(path, capsys, as_json=True))
    assert data["facts"] == family_for(arch).facts(open_gguf(path))


def test_a_refused_value_is_named_and_the_rest_still_prints(tmp_path, capsys):
    """A multiplier the family refuses shows as one `family facts` row naming the key; the header's
    facts are still printed and the command succeeds."""
    path = rewrite_gguf(synthetic_path("granite"), tmp_path / "bad.gguf", set_kv={"granite.logit_scale": "two"})
    out = _info(path, capsys)
    assert "  architecture   granite\n" in out
    assert "  family facts   unreadable: bad.gguf: granite.logit_scale is 'two' (a string)" in out


def test_an_unsupported_architecture_has_no_family_rows(tmp_path, capsys):
    """A file no family answers to gets the header's facts and no family rows."""
    path = rewrite_gguf(synthetic_path("llama"), tmp_path / "arch.gguf", set_kv={"general.architecture": "llama9"})
    out = _info(path, capsys)
    assert "(not supported yet)" in out and "  attention " not in out


def test_a_ktc_file_reports_the_family_facts_of_its_model(tmp_path, capsys, monkeypatch):
    """`kinetic info` on a .ktc gives the same family rows as on the .gguf it was compiled from."""
    from kinetic.cli.main import main
    from kinetic.ktc import load as ktc_load

    monkeypatch.setattr(ktc_load, "stamp_dir", lambda: tmp_path / "stamps")
    gguf, ktc = synthetic_path("granite"), tmp_path / "granite.ktc"
    assert main(["compile", str(gguf), "-o", str(ktc)]) == 0
    capsys.readouterr()
    facts = json.loads(_info(gguf, capsys, as_json=True))["facts"]
    assert json.loads(_info(ktc, capsys, as_json=True))["facts"] == facts and "multipliers" in facts
    assert f"  multipliers    {facts['multipliers']}\n" in _info(ktc, capsys)
