"""Fixtures of the .ktc tests: a private stamp folder for every test, and the synthetic llama model
with a chat template (so that every section kind is present) as a .gguf and compiled to a .ktc."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinetic.cli.main import main
from kinetic.ktc import load as ktc_load
from kinetic.ktc.load import REQUIRE_SIGNATURE_ENV
from tests.ktc.helpers import TEMPLATE
from tests.synthetic import rewrite_gguf, synthetic_path


@pytest.fixture(autouse=True)
def private_stamps(tmp_path, monkeypatch):
    """Each test gets its own stamp folder, so no stamp from another test or the user's cache counts,
    and no signature requirement from the user's environment."""
    monkeypatch.setattr(ktc_load, "stamp_dir", lambda: tmp_path / "stamps")
    monkeypatch.delenv(REQUIRE_SIGNATURE_ENV, raising=False)


@pytest.fixture(scope="package")
def synth_gguf(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "llama-chat.gguf"
    return rewrite_gguf(synthetic_path("llama"), out, set_kv={"tokenizer.chat_template": TEMPLATE})


@pytest.fixture(scope="package")
def synth_ktc(synth_gguf) -> Path:
    """The synthetic model compiled; tests that change it work on a copy (`copy_of`)."""
    out = synth_gguf.with_suffix(".ktc")
    assert main(["compile", str(synth_gguf), "-o", str(out)]) == 0
    return out
