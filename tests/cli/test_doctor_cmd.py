"""`kinetic doctor`: its judgement (`diagnose`) on made-up machines, and the command on this one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kinetic.cli import doctor_cmd
from kinetic.cli.doctor_cmd import Facts, diagnose
from kinetic.cli.main import main
from kinetic.machine import Cpu, Gpu, Machine

GiB = 1024**3
FEATURES = {"AVX2": True, "FMA": True, "F16C": True, "AVX-512": False, "VNNI": False}


def healthy(**machine) -> Facts:
    m = Machine(Cpu("Test CPU", 8, FEATURES, "avx2"), 16 * GiB, 12 * GiB, (),
                {"CUDA": "no NVIDIA driver here (libcuda.so.1 cannot be loaded)"})
    return Facts(replace(m, **machine), "the CPU", Path("/cache"), 5 * 1024**2, True, Path("/models"), 3, 2,
                 100 * GiB)


def problems(facts: Facts) -> list[str]:
    return [p.what for p in diagnose(facts)[1]]


def test_a_healthy_machine_has_nothing_to_fix():
    """A CPU with AVX2, memory, a writable cache, runnable models and disk: no problem, and no GPU is
    not one."""
    lines, found = diagnose(healthy())
    assert found == []
    assert any(line.startswith("cpu      Test CPU, 8 threads, AVX2 yes") for line in lines)
    assert "gpu      CUDA: no NVIDIA driver here (libcuda.so.1 cannot be loaded)" in lines


@pytest.mark.parametrize(("change", "expected"), [
    ({"machine": {"cpu": Cpu("Old", 4, {**FEATURES, "AVX2": False}, "generic")}}, "no AVX2"),
    ({"machine": {"memory_available": GiB // 2}}, "of memory is available"),
    ({"machine": {"gpu_problems": {"CUDA": "CuPy is not installed; pip install 'kinetic-engine[cuda]'"}}},
     "CUDA cannot be used: CuPy is not installed"),
    ({"cache_writable": False}, "cannot be written"),
    ({"models_runnable": 0}, "kinetic pull smollm2-135m"),
    ({"disk_free": 3 * GiB}, "under 10 GiB of disk"),
])
def test_each_problem_says_what_to_do(change, expected):
    """Each condition gives exactly one problem line, which names it and what to do; none is fatal."""
    facts = healthy(**change.get("machine", {}))
    facts = replace(facts, **{k: v for k, v in change.items() if k != "machine"})
    found = diagnose(facts)[1]
    assert len(found) == 1 and expected in found[0].what and not found[0].fatal


def test_no_cpu_compiler_is_fatal():
    """Without the CPU kernel compiler Kinetic cannot run: a fatal problem."""
    found = diagnose(healthy(cpu=None))[1]
    assert [p.fatal for p in found] == [True]


def test_gpus_are_listed_with_their_memory():
    """A CUDA GPU shows free and total memory; a CPU-type Vulkan device says --device cpu is faster."""
    gpus = (Gpu("CUDA", "Test GPU", 5 * GiB, 6 * GiB, "driver CUDA 12.8"),
            Gpu("Vulkan", "llvmpipe", None, 2 * GiB, "Vulkan 1.3.230, cpu", cpu_type=True))
    lines = diagnose(healthy(gpus=gpus, gpu_problems={}))[0]
    assert "gpu      Test GPU via CUDA: 5.00 GiB of 6.00 GiB free; driver CUDA 12.8" in lines
    assert any(line.startswith("gpu      llvmpipe via Vulkan: 2.00 GiB") and "--device cpu" in line for line in lines)


def test_exit_code_follows_fatal_problems(monkeypatch, capsys):
    """`kinetic doctor` exits 0 with problems that are not fatal, 1 with a fatal one."""
    monkeypatch.setattr(doctor_cmd, "gather", lambda: replace(healthy(), disk_free=GiB))
    assert main(["doctor"]) == 0
    assert "To fix:" in capsys.readouterr().out
    monkeypatch.setattr(doctor_cmd, "gather", lambda: healthy(cpu=None))
    assert main(["doctor"]) == 1


def test_doctor_on_this_machine(capsys):
    """On this machine (CPU kernels compile) the doctor reports every section and exits 0."""
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for section in ("system", "cpu", "memory", "device", "kernels", "models", "disk"):
        assert f"\n  {section} " in out
