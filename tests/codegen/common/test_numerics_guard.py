"""No device runs a fast-mode order with a ggml-order kernel: an order name a device declares
("block_chain", for Q4_0) covers only the weight types that take it in the numerics modes the device
follows (Capabilities.numerics), so Vulkan and CUDA refuse a fast Q8_0 matmul, and the CPU gives a
matmul whose kernel does not follow its order to the reference (target.kernel_orders)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic import devices
from kinetic.codegen.common.orders import refused_order
from kinetic.ir.ops import MatmulAttrs
from kinetic.ir.text import parse_graph
from kinetic.passes import PassOptions, run_pipeline

GRAPH = """
%0 = input() {name="tokens"} : i32[T]
%1 = param() {tensor="token_embd.weight"} : f32[16,128]
%2 = embed(%1, %0) : f32[T,128]
%3 = param() {tensor="w"} : WTYPE[64,128]
%4 = matmul(%2, %3) {activations="q8"} : f32[T,64]
output out = %4
"""


def graph(wtype: str, numerics: str):
    return run_pipeline(parse_graph(GRAPH.replace("WTYPE", wtype)), PassOptions(numerics=numerics))


def test_a_declared_name_in_another_modes_sense_is_refused():
    """block_chain is declared, yet a device following only ggml's orders refuses a Q8_0 matmul in it
    (naming the mode and the flag) and accepts Q4_0's (ggml's own block_chain); a device following
    both modes accepts both."""
    declared = {"lanes8", "block_chain"}
    reason = refused_order(graph("q8_0", "fast"), declared, "Toy")
    assert "matmul %4 sums in order 'block_chain' (another numerics mode's)" in reason
    assert "--numerics ggml" in reason
    assert refused_order(graph("q4_0", "fast"), declared, "Toy") is None
    assert refused_order(graph("q8_0", "fast"), declared, "Toy", frozenset({"ggml", "fast"})) is None
    assert refused_order(graph("q8_0", "ggml"), declared, "Toy") is None


@pytest.mark.parametrize("device", ["vulkan", "cuda-emulated"])
def test_the_gpu_devices_refuse_a_fast_matmul(device):
    """Vulkan's and CUDA's unsupported(graph) refuse the fast Q8_0 matmul and accept the ggml one."""
    check = devices.DEVICES[device].unsupported
    assert "block_chain" in check(graph("q8_0", "fast"))
    assert check(graph("q8_0", "ggml")) is None


def test_the_cpu_step_refuses_an_order_its_kernel_does_not_follow(monkeypatch):
    """Without a block_chain kernel for Q8_0 (FAST_CHAIN_KERNELS), the compiled step refuses the fast
    Q8_0 matmul, naming the kernel's orders; with one, it takes it."""
    from kinetic.codegen.cpu import lowering, target

    monkeypatch.setattr(target, "FAST_CHAIN_KERNELS", frozenset())
    assert "the CPU's Q8_0 kernel does not follow (lanes8)" in lowering.unsupported(graph("q8_0", "fast"))
    assert lowering.unsupported(graph("q8_0", "ggml")) is None
    monkeypatch.setattr(target, "FAST_CHAIN_KERNELS", frozenset({Q.Q8_0}))
    assert lowering.unsupported(graph("q8_0", "fast")) is None


class OneWeight:
    """A WeightSource holding one tensor under every name."""

    def __init__(self, raw: np.ndarray):
        self.raw = raw

    def tensor(self, name: str) -> np.ndarray:
        return self.raw


def test_the_cpu_executor_runs_an_unfollowed_order_as_the_reference(monkeypatch):
    """CpuInterpreter.matmul of a fast Q8_0 node without a block_chain kernel gives the reference's
    block_chain bits (not the lanes8 kernel's)."""
    from kinetic.codegen.cpu import target
    from kinetic.codegen.cpu.executor import CpuInterpreter
    from kinetic.ir import numerics
    from tests.ir.test_fast_order import random_raw

    monkeypatch.setattr(target, "FAST_CHAIN_KERNELS", frozenset())
    rng = np.random.default_rng(21)
    raw = random_raw(rng, Q.Q8_0, 64, 128)
    g = graph("q8_0", "fast")
    weight = g.node(3)
    cpu = CpuInterpreter(OneWeight(raw), threads=1)
    x = rng.standard_normal((5, 128)).astype(np.float32)
    got = cpu.matmul(x, weight, MatmulAttrs("q8", order="block_chain"))
    want = numerics.matmul(x, numerics.DequantizedWeight(raw, Q.Q8_0), order="block_chain")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert not np.array_equal(got, cpu.matmul(x, weight, MatmulAttrs("q8", order="lanes8")))
