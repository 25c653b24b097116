"""The `concat` kernel (kinetic/codegen/cuda/concat.py) on the host emulation, in both thread orders,
against the reference interpreter bit for bit; and the renderer's row for it."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import host_programs

from kinetic.codegen.cuda import concat, nvrtc
from kinetic.codegen.cuda.caps import ARCHS, violations
from kinetic.codegen.cuda.kernel import program_source
from kinetic.codegen.cuda.renderer import CudaRenderer
from kinetic.ir.ops import Op
from kinetic.ir.text import parse_graph
from tests.codegen import kernel_cases as cases
from tests.device_checks import same_bits

prog = host_programs(lambda: [concat.concat(*c) for c in cases.CONCATS], "cuda-concat")


@pytest.mark.parametrize("widths", cases.CONCATS)
def test_concat_puts_each_rows_two_parts_side_by_side(prog, widths):
    """concat gives the reference's rows (a's values, then b's) bit for bit, NaN payloads and signed
    zeros included, for every row of the pass."""
    a, b, expected = cases.concat_case(60, *widths)
    out = np.zeros_like(expected)
    prog.launch(concat.concat(*widths).name, len(a), a, b, out)
    assert same_bits(out, expected)


@pytest.mark.skipif(nvrtc.unavailable_reason() is not None, reason=nvrtc.unavailable_reason() or "")
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_concat_compiles_within_budget(tmp_path, arch):
    """The concat kernels (a prediction block's graph is not among test_cuda_compile.py's synthetic
    model graphs) compile with NVRTC for every architecture within their kind's budget."""
    kernels = [concat.concat(*c) for c in cases.CONCATS]
    compiled = nvrtc.compile_program(program_source(kernels, "cuda"), arch, cache_dir=tmp_path)
    assert [p for k in kernels for p in violations(k, compiled.resources[k.name], ARCHS[arch])] == []


def test_the_renderer_has_a_row_for_concat():
    """The renderer gives a concat node the kernel of its two input widths."""
    graph = parse_graph(cases.CONCAT_GRAPH)
    kernels = CudaRenderer().render(graph).kernels
    node = next(n for n in graph.nodes if n.op is Op.CONCAT)
    assert [k.name for k in kernels[node.id]] == [concat.concat(40, 40).name]
