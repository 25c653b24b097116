"""Fixtures of the `kinetic bench` tests (test_bench_cmd.py, test_bench_llama_edit.py); the fake
llama.cpp programs they set up are in bench_fakes.py."""

from __future__ import annotations

import pytest

from kinetic import bench_llama
from tests.cli.bench_fakes import write_fake_llama_bench


@pytest.fixture
def no_ik_llama_cpp(monkeypatch, tmp_path_factory):
    """No real ik_llama.cpp is found: its usual place is an empty folder and the variable is unset."""
    monkeypatch.delenv(bench_llama.IK_LLAMA_BENCH_ENV, raising=False)
    monkeypatch.setattr(bench_llama, "IK_LLAMA_BENCH_PLACES", (tmp_path_factory.mktemp("no-ik") / "llama-bench",))


@pytest.fixture
def fake_llama_bench(tmp_path):
    """A fake llama-bench (bench_fakes.write_fake_llama_bench) and the file it logs its argv to."""
    return write_fake_llama_bench(tmp_path)
