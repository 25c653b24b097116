"""The CPU device runs mixture-of-experts files on its compiled step (kinetic/codegen/cpu/moe_ops.py),
not on the op-by-op interpreter; what it computes is checked against the reference interpreter by
tests/frontend/test_family_devices.py (every MoE file: bit for bit, batch = alone, drafted = plain)."""

from __future__ import annotations

import pytest

from kinetic.codegen.cpu.lowering import unsupported
from kinetic.codegen.cpu.runner import open_runner
from kinetic.codegen.cpu.step import CompiledStep
from kinetic.codegen.runner import RunnerOptions
from kinetic.compiler import compile_graph
from kinetic.frontend.gguf_file import open_gguf
from kinetic.runtime.weights import GGUFWeights
from tests.synthetic import synthetic_arch, synthetic_files, synthetic_path

MOE_FILES = [name for name in synthetic_files()
             if synthetic_arch(name) in ("qwen3moe", "granitemoe", "lfm2moe", "qwen35moe")]


@pytest.mark.parametrize("name", MOE_FILES)
def test_moe_files_run_on_the_compiled_step(name):
    """Every MoE op has a row in the CPU's table, so the CPU device opens the compiled step for them."""
    gguf = open_gguf(synthetic_path(name))
    graph = compile_graph(gguf)
    assert unsupported(graph) is None
    assert isinstance(open_runner(graph, GGUFWeights(gguf), RunnerOptions(batch=8, threads=1, n_ctx=64)), CompiledStep)
