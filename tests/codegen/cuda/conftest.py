"""Fixtures for the CUDA kernel tests: the host emulation of a kernel set, in both thread orders."""

from __future__ import annotations

import pytest
from cuda_helpers import kernels_under_test

from kinetic.codegen.cuda import emulator


@pytest.fixture(scope="session")
def emulation_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cuda-host")


def _program(cache, forward: bool) -> emulator.HostProgram:
    reason = emulator.unavailable_reason()
    if reason:
        pytest.skip(reason)
    return emulator.HostProgram(kernels_under_test(), forward=forward, cache_dir=cache)


@pytest.fixture(scope="session")
def host(emulation_cache) -> emulator.HostProgram:
    """The test kernels on the host, warps and lanes in reverse order."""
    return _program(emulation_cache, forward=False)


@pytest.fixture(scope="session")
def host_forward(emulation_cache) -> emulator.HostProgram:
    """The same kernels, warps and lanes in forward order."""
    return _program(emulation_cache, forward=True)
