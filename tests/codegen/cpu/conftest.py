"""Fixtures for the CPU kernel tests: a JIT compiling into a private kernel cache."""

from __future__ import annotations

import pytest

from kinetic.codegen.cpu.jit import Jit


@pytest.fixture(scope="session")
def jit(tmp_path_factory) -> Jit:
    return Jit(tmp_path_factory.mktemp("kernels"))
