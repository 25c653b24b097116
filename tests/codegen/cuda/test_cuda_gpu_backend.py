"""backends.GpuBackend's own code, run without a GPU: a stand-in for the few CuPy calls it makes
(byte arrays with set/get, a stream that captures launches instead of running them, a graph that
runs them when launched), with the kernels themselves run by the host emulation. It checks the
runtime's use of those calls (what is captured, what is copied when, that nothing runs inside a
capture but the launches), not CuPy: the calls' names and signatures are CuPy's documented ones
(cupy.ndarray.set/get, Stream.begin_capture/end_capture, Graph.launch, RawModule.get_function),
and a GPU run (scripts/gpu_check.sh, test_cuda_model.py's gpu tests) checks the real thing."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from kinetic.codegen.cuda import emulator


class FakeArray:
    """A device byte array: numpy underneath; slicing gives views, as CuPy's does."""

    def __init__(self, data: np.ndarray, log: list):
        self.data, self.log = data, log

    def __getitem__(self, key):
        return FakeArray(self.data[key], self.log)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def set(self, arr, stream=None):
        assert isinstance(arr, np.ndarray) and arr.shape == self.data.shape and arr.dtype == self.data.dtype
        assert not stream.capturing, "a copy inside a capture would become part of the graph"
        self.log.append("set")
        self.data[...] = arr

    def get(self, stream=None):
        assert not stream.capturing
        self.log.append("get")
        return self.data.copy()


class FakeStream:
    def __init__(self, non_blocking=False):
        self.capturing, self.captured = False, []

    def __enter__(self):
        FakeCupy.current = self
        return self

    def __exit__(self, *exc):
        FakeCupy.current = None
        return False

    def synchronize(self):
        assert not self.capturing, "a capturing stream cannot be synchronized"

    def begin_capture(self, mode=None):
        assert not self.capturing
        self.capturing, self.captured = True, []

    def end_capture(self):
        assert self.capturing
        self.capturing = False
        return FakeGraph(self.captured)


class FakeGraph:
    def __init__(self, calls):
        self.calls, self.launches = list(calls), 0

    def launch(self, stream=None):
        assert stream is not None and not stream.capturing
        self.launches += 1
        for call in self.calls:
            call()


class FakeCupy(types.ModuleType):
    current = None  # the stream of the innermost `with stream:`

    def __init__(self, log: list):
        super().__init__("cupy")
        self.uint8, self.log = np.uint8, log
        self.cuda = types.SimpleNamespace(
            Stream=FakeStream, Device=lambda: types.SimpleNamespace(id=0),
            runtime=types.SimpleNamespace(
                getDeviceProperties=lambda i: {"name": b"Stand-in GPU", "major": 9, "minor": 0},
                memGetInfo=lambda: (1 << 34, 1 << 35)))

    def zeros(self, n, dtype):
        return FakeArray(np.zeros(n, dtype), self.log)

    def get_default_memory_pool(self):
        return types.SimpleNamespace(free_bytes=lambda: 0, free_all_blocks=lambda: None)


@pytest.fixture
def gpu_backend(monkeypatch):
    """A GpuBackend over the stand-in: its compile() builds the host program and functions that, like a
    RawModule's, run when called outside a capture and are recorded when called inside one."""
    if emulator.unavailable_reason():
        pytest.skip(emulator.unavailable_reason())
    from kinetic.codegen.cuda.backends import GpuBackend

    log: list = []
    cupy = FakeCupy(log)
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda n, dtype: np.empty(n, dtype)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)

    def compile(self, kernels):
        host = emulator.HostProgram(kernels)
        self.program = types.SimpleNamespace(kernels={k.name: k for k in kernels})

        def function(name):
            kernel = self.program.kernels[name]

            def call(grid, block, args):
                stream = FakeCupy.current
                assert stream is self.stream, "every launch goes to the backend's own stream"
                assert block == (kernel.threads,) and grid[0] == kernel.blocks_x
                values = tuple(a.data if isinstance(a, FakeArray) else a.item() for a in args)
                run = lambda: host.launch(name, grid[1], *values)  # noqa: E731
                if stream.capturing:
                    stream.captured.append(run)
                else:
                    run()
            return call

        self._functions = {k.name: function(k.name) for k in kernels}

    monkeypatch.setattr(GpuBackend, "compile", compile)
    backend = GpuBackend()
    backend.log = log
    return backend


def test_gpu_backend_runs_the_model_as_the_reference(gpu_backend, smollm2_path):
    """SmolLM2 through CudaModel on the GpuBackend code: bit for bit the reference; the decode shape
    captured once and replayed as a graph; per decode step exactly one copy in and two out (the
    logits, the new keys and values)."""
    from test_cuda_model import load

    from kinetic.codegen.cuda.model import CudaModel
    from kinetic.runtime.engine import Engine
    from tests.device_checks import PROMPT, greedy, same_bits

    graph, weights = load(smollm2_path)
    engine = Engine(graph, weights, n_ctx=64, device="reference")
    engine.runner = model = CudaModel(graph, weights, gpu_backend, 64)
    reference = Engine(graph, weights, n_ctx=64, device="reference")
    got_tokens, got, _ = greedy(engine, PROMPT[:4], 1)
    gpu_backend.log.clear()
    seq = engine.new_sequence()
    engine.prefill(seq, PROMPT[:4])
    gpu_backend.log.clear()
    engine.decode(seq, got_tokens[0])
    assert gpu_backend.log == ["set", "get", "get"]
    want_tokens, want, _ = greedy(reference, PROMPT[:4], 1)
    assert got_tokens == want_tokens
    for g, w in zip(got, want, strict=True):
        assert same_bits(g, w)
    assert any(key[:2] == (1, 1) for key in model._recordings)  # the decode step, captured
    model.close()
