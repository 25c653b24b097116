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
from kinetic.frontend.blocks import Options
from kinetic.ir.orders import DEFAULT_NUMERICS, NUMERICS
from kinetic.numerics_mode import default_numerics
from kinetic.passes import PassOptions

_WARM_DIR = tempfile.mkdtemp(prefix="kinetic-warm-tests-")
os.environ["KINETIC_WARM_DIR"] = _WARM_DIR  # set on import: before any fixture starts a process


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_WARM_DIR, ignore_errors=True)


DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "golden"

# Tests whose expected values are llama.cpp's decode-path bits (stored logits, perplexity to every
# digit, golden hashes) pin ggml's numerics mode instead of relying on the default, "fast" on the CPU
# and the reference (kinetic/ir/orders.py DEFAULT_NUMERICS): GGML_OPTIONS for a Model or compile, and
# GGML_FLAG for a command line.
GGML_OPTIONS = Options(numerics="ggml")
GGML_FLAG = ("--numerics", "ggml")
# every numerics mode, for the checks that must hold in each (conformance up to near-ties)
ALL_NUMERICS = NUMERICS
# The identity gates (batch = alone, drafted = plain, warm = cold, convoy = alone) must hold in every
# numerics mode. Their tests run in the default mode; each adds a case or two in OTHER_NUMERICS, the
# modes the default leaves out, so the suite covers every mode before and after the default changes.
OTHER_NUMERICS = tuple(mode for mode in NUMERICS if mode != DEFAULT_NUMERICS)
# synthetic files for those extra cases: every block-32 weight type with F16/BF16 (llama), MoE expert
# matmuls (qwen3moe), sliding-window attention (gemma4)
NUMERICS_SYNTHETIC = ("llama", "qwen3moe", "gemma4")


def device_passes(device: str) -> PassOptions:
    """The pipeline's options for a graph made to run on `device` as Model makes it when no mode is
    asked for: the device's default numerics mode (ggml on CUDA and Vulkan, whose kernels follow
    only ggml's orders; kinetic/numerics_mode.py). PassOptions() alone names no device."""
    return PassOptions(numerics=default_numerics(device))

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
