"""NVRTC compiles every CUDA kernel for every listed architecture and to PTX, without a GPU, within
each kind's register budget and without spills; the content-hashed cache and the ptxas report parser
work. Skipped with the reason when NVRTC is not installed (the `cuda` extra, in `dev` too)."""

from __future__ import annotations

import pytest
from cuda_helpers import kernels_under_test

from kinetic.codegen.cuda import nvrtc
from kinetic.codegen.cuda.caps import ARCHS, BUDGETS, arch_for, violations
from kinetic.codegen.cuda.kernel import Kernel, Param, program_source
from kinetic.codegen.cuda.renderer import CudaRenderer
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.passes.pipeline import run_pipeline
from tests.conftest import device_passes
from tests.synthetic import SYNTHETIC, synthetic_path

pytestmark = pytest.mark.skipif(nvrtc.unavailable_reason() is not None, reason=nvrtc.unavailable_reason() or "")


def _all_kernels() -> list[Kernel]:
    """The kernels under test plus every kernel of the synthetic model graphs (real op mixes)."""
    ks = kernels_under_test()
    for family in sorted(p.name for p in SYNTHETIC.iterdir() if p.is_dir()):
        renderer = CudaRenderer()
        ks += renderer.render(renderer.lower(run_pipeline(lower(open_gguf(synthetic_path(family))),
                                                            device_passes("cuda")))).distinct()
    return list({k.name: k for k in ks}.values())


@pytest.fixture(scope="module")
def program():
    kernels = _all_kernels()
    return kernels, program_source(kernels, "cuda")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("nvrtc")


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_every_kernel_compiles_within_budget(program, cache, arch):
    """One NVRTC program with every kernel compiles for this architecture; ptxas reports each kernel,
    none spills or uses a stack frame, each keeps its kind's register and shared-memory budget and a
    whole block fits one SM's registers."""
    kernels, source = program
    compiled = nvrtc.compile_program(source, arch, cache_dir=cache)
    assert set(compiled.resources) == {k.name for k in kernels}
    problems = [p for k in kernels for p in violations(k, compiled.resources[k.name], ARCHS[arch])]
    assert not problems, "\n".join(problems)


def test_ptx_holds_every_kernel(program, cache):
    """The PTX build (for drivers to JIT on architectures not listed) has an entry for every kernel."""
    kernels, source = program
    ptx = nvrtc.compile_program(source, nvrtc.PTX_TARGET, cache_dir=cache).binary.decode()
    missing = [k.name for k in kernels if f".entry {k.name}(" not in ptx]
    assert not missing, missing


def test_cache_returns_the_same_binary(tmp_path):
    """A second compile of the same source loads the cached cubin (same bytes, no NVRTC run); another
    source gets another key."""
    source = program_source(kernels_under_test()[:2], "cuda")
    first = nvrtc.compile_program(source, "sm_80", cache_dir=tmp_path)
    second = nvrtc.compile_program(source, "sm_80", cache_dir=tmp_path)
    assert not first.cached and second.cached and first.binary == second.binary
    assert first.resources == second.resources
    assert nvrtc.cache_key(source + "\n", "sm_80") != nvrtc.cache_key(source, "sm_80")
    assert nvrtc.cache_key(source, "sm_90") != nvrtc.cache_key(source, "sm_80")


def test_stack_and_register_overruns_are_reported(tmp_path):
    """The budget check fails a kernel that keeps a dynamically indexed array in local memory (a stack
    frame), and one whose registers exceed its kind's budget."""
    body = """\
  enum { N = 64 };
BODY
  LANES {
    float a[N];
    for (int i = 0; i < N; ++i) a[i] = LD(float, x, (i * 7 + TID) % N);
    ST(float, out, TID, a[LD(int, x, TID) & (N - 1)]);
  }
"""
    k = Kernel("uses_stack", "pointwise", 32, 1, (Param("x", "const float*"), Param("out", "float*")), body)
    compiled = nvrtc.compile_program(program_source([k], "cuda"), "sm_90", cache_dir=tmp_path)
    res = compiled.resources["uses_stack"]
    assert res.stack > 0 and any("stack frame" in p for p in violations(k, res, ARCHS["sm_90"]))
    greedy = nvrtc.Resources(registers=BUDGETS["pointwise"].registers + 1, spill_stores=0, spill_loads=0,
                             stack=0, shared=0)
    assert any("registers" in p for p in violations(k, greedy, ARCHS["sm_90"]))


def test_ptxas_report_parser():
    """Registers, spills, stack and shared memory are read per kernel from an -Xptxas=-v log."""
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'a' for 'sm_90'
ptxas info    : Function properties for a
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 32 bytes smem
ptxas info    : Compiling entry function 'b' for 'sm_90'
ptxas info    : Function properties for b
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 0 barriers
"""
    r = nvrtc.parse_ptxas(log)
    assert r["a"] == nvrtc.Resources(registers=255, spill_stores=8, spill_loads=4, stack=16, shared=32)
    assert r["b"] == nvrtc.Resources(registers=30, spill_stores=0, spill_loads=0, stack=0, shared=0)


def test_device_capability_maps_to_a_listed_arch():
    """A device runs the cubin of its major version's highest listed minor not above its own (sm_87
    runs sm_86's), and PTX where no cubin fits."""
    assert arch_for(9, 0) == "sm_90" and arch_for(8, 7) == "sm_86" and arch_for(8, 9) == "sm_89"
    assert arch_for(12, 1) == "sm_120" and arch_for(7, 0) is None and arch_for(6, 1) is None
