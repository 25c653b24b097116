"""Shared fixtures: the two real models (downloaded at most once per machine) and the golden data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinetic import hub

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
