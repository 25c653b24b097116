"""Shared fixtures: the two real models (downloaded at most once per machine) and the golden data.
Warm Start's states go to a temporary folder for the whole run (KINETIC_WARM_DIR, inherited by the
servers and commands tests start), never to the user's cache: a state an earlier run left there would
change a test's cached counts. The kernel and hash caches stay shared."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from kinetic import hub

_WARM_DIR = tempfile.mkdtemp(prefix="kinetic-warm-tests-")
os.environ["KINETIC_WARM_DIR"] = _WARM_DIR  # set on import: before any fixture starts a process


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_WARM_DIR, ignore_errors=True)


DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "golden"

GOLDEN_FILES = {
    "smollm2-135m": "smollm2-135m-instruct-q4_1.json",
    "gemma3-270m": "gemma-3-270m-q4_k_m.json",
}


def model_path(name: str) -> Path:
    """The cached model file, fetched on first use (tests share Kinetic's models folder)."""
    return hub.pull(name, out=lambda _line: None, progress=False)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return model_path("gemma3-270m")


def load_golden(name: str) -> dict:
    return json.loads((GOLDEN / GOLDEN_FILES[name]).read_text())


@pytest.fixture(scope="session")
def golden_cases() -> dict:
    return json.loads((GOLDEN / "cases.json").read_text())
