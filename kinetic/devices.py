"""The one registry of devices: every name `--device` accepts, what status lines and the bench table
call it, how to open a runner on it, whether it can run here, and which `--device auto` picks.

Owns: `DEVICES` (name -> Device), `open_runner`, `resolve_device` (auto), `device_choices` and `device_help`
for the command line; `DEVICE_NAMES` (name -> label) is read from it. No device list is typed
anywhere else. Imports no device package until one is asked for, so the command line names devices
without loading them. Does not own the runner contract (kinetic/codegen/runner.py) nor any device's
code; devices never import this module back (they get what they need in RunnerOptions).

Adding a device: a package with an `open_runner(graph, weights, options)` and one row below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kinetic.errors import KineticError

if TYPE_CHECKING:
    from kinetic.codegen.runner import Capabilities, Runner, RunnerOptions
    from kinetic.ir.graph import Graph
    from kinetic.ir.interpreter import WeightSource


def _always() -> str | None:
    return None


@dataclass(frozen=True)
class Device:
    """One `--device` name. `opener(graph, weights, options)` opens a runner (importing the device's
    package only then); `unavailable()` says why the device cannot run here (None: it can);
    `unsupported(graph)` why it cannot run a graph; `auto_skip()`, for the devices `--device auto`
    tries in order, why auto passes it by (None: auto takes it); `capabilities()` the device's one
    capability record (kinetic/codegen/runner.py: fused ops, row limit, the fusions of its device
    phase, which `kinetic compile --dump-ir --device` shows, and its reduction orders; None for the
    reference, which runs every graph)."""

    name: str
    label: str  # what status lines call it: "... on the CPU"
    backend: str  # the bench table's column
    help: str  # its part of --device's help
    opener: Callable[[Graph, WeightSource, RunnerOptions], Runner]
    unavailable: Callable[[], str | None] = _always
    unsupported: Callable[[Graph], str | None] = lambda graph: None
    auto_skip: Callable[[], str | None] | None = None  # None: auto never tries it
    gpu: bool = False  # runs on a GPU (bench --compare puts llama.cpp's layers on that GPU too)
    capabilities: Callable[[], Capabilities] | None = None


# ---- how each device opens (the only place that imports device packages) ------------------------

def _open_reference(graph, weights, options):
    from kinetic.ir.interpreter import Interpreter

    return Interpreter(weights)


def _open_cpu(graph, weights, options):
    from kinetic.codegen.cpu.runner import open_runner as open_cpu_runner

    return open_cpu_runner(graph, weights, options)


def _cuda_opener(emulated: bool):
    def open_cuda(graph, weights, options):
        from dataclasses import replace

        from kinetic.codegen.cuda.model import open_runner as open_cuda_runner

        def host_runner(head):  # the first layers of a model split between the CPU and the GPU
            return open_runner("cpu", head, weights, replace(options, host_runner=None))

        return open_cuda_runner(graph, weights, replace(options, host_runner=host_runner), emulated=emulated)

    return open_cuda


def _open_vulkan(graph, weights, options):
    from kinetic.codegen.vulkan.model import open_runner as open_vulkan_runner

    return open_vulkan_runner(graph, weights, options)


def _cuda_unavailable() -> str | None:
    from kinetic.codegen.cuda.device import unavailable_reason

    return unavailable_reason()


def _emulation_unavailable() -> str | None:
    from kinetic.codegen.cuda.emulator import unavailable_reason

    return unavailable_reason()


def _cuda_unsupported(graph) -> str | None:
    from kinetic.codegen.cuda.model import unsupported

    return unsupported(graph)


def _cpu_capabilities():
    from kinetic.codegen.cpu.target import CAPABILITIES

    return CAPABILITIES


def _cuda_capabilities():
    from kinetic.codegen.cuda.renderer import CAPABILITIES

    return CAPABILITIES


def _vulkan_capabilities():
    from kinetic.codegen.vulkan.kernels import CAPABILITIES

    return CAPABILITIES


def _vulkan_unsupported(graph) -> str | None:
    from kinetic.codegen.vulkan.model import unsupported

    return unsupported(graph)


def _vulkan_choice():
    """(the device --device vulkan opens, or None; why there is none)."""
    try:
        from kinetic.codegen.vulkan.device import VulkanUnavailable, physical_devices, preferred_device
    except ImportError as e:  # numpy/gguf are always there; this is the package itself missing
        return None, str(e)
    try:
        choice = preferred_device(physical_devices())
    except VulkanUnavailable as e:
        return None, str(e)
    return choice, None if choice is not None else "no device with Vulkan 1.2 or newer"


def _vulkan_unavailable() -> str | None:
    return _vulkan_choice()[1]


def _cuda_auto_skip() -> str | None:
    reason = _cuda_unavailable()
    return f"CUDA: {reason}" if reason else None


def _vulkan_auto_skip() -> str | None:
    choice, reason = _vulkan_choice()
    if reason:
        return f"Vulkan: {reason}"
    if choice.is_cpu:
        return f"Vulkan device {choice.name}: a CPU-type device (lavapipe; --device cpu is faster)"
    return None


DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("cpu", "the CPU", "CPU", "cpu: generated kernels", _open_cpu, capabilities=_cpu_capabilities),
    Device("reference", "the CPU (reference interpreter)", "CPU (reference)",
           "reference: the numpy reference interpreter", _open_reference),
    Device("cuda", "the CUDA GPU", "CUDA", "cuda: the CUDA GPU", _cuda_opener(emulated=False),
           _cuda_unavailable, _cuda_unsupported, _cuda_auto_skip, gpu=True,
           capabilities=_cuda_capabilities),
    Device("cuda-emulated", "the host emulation of the CUDA kernels", "CUDA (host emulation)",
           "cuda-emulated: the CUDA kernels on their exact host emulation (slow; development and CI)",
           _cuda_opener(emulated=True), _emulation_unavailable, _cuda_unsupported,
           capabilities=_cuda_capabilities),
    Device("vulkan", "the Vulkan device", "Vulkan", "vulkan: the first Vulkan GPU (else lavapipe)", _open_vulkan,
           _vulkan_unavailable, _vulkan_unsupported, _vulkan_auto_skip, gpu=True, capabilities=_vulkan_capabilities),
)}
AUTO_FALLBACK = "cpu"  # what --device auto runs on when it passes every device it tries
AUTO_HELP = "auto: CUDA, else a Vulkan GPU, else the CPU, saying why each is skipped"
DEVICE_NAMES = {name: d.label for name, d in DEVICES.items()}


def device(name: str) -> Device:
    if name not in DEVICES:
        raise KineticError(f"no device named {name!r}", f"Use --device with one of: {', '.join(DEVICES)}.")
    return DEVICES[name]


def device_choices(auto: bool = True) -> tuple[str, ...]:
    """The names `--device` accepts, `auto` last where it is one."""
    return (*DEVICES, "auto") if auto else tuple(DEVICES)


def device_help(auto: bool = True) -> str:
    """--device's help: each device's line, then auto's."""
    return "; ".join([d.help for d in DEVICES.values()] + ([AUTO_HELP] if auto else []))


def open_runner(name: str, graph: Graph, weights: WeightSource, options: RunnerOptions) -> Runner:
    """A runner for `graph` on device `name` (not auto: resolve_device first)."""
    return device(name).opener(graph, weights, options)


def resolve_device(name: str, say=None) -> str:
    """The device `--device name` runs on: `name` itself, except `auto`, which tries CUDA, then a
    Vulkan GPU (a CPU-type Vulkan device such as lavapipe is skipped: slower than the CPU path), then
    the CPU. Each device skipped is one line through `say` (default: stderr) saying why."""
    if name != "auto":
        return name
    if say is None:
        import sys

        def say(line: str) -> None:
            print(line, file=sys.stderr)

    for d in DEVICES.values():
        if d.auto_skip is None:
            continue
        reason = d.auto_skip()
        if reason is None:
            return d.name
        say(f"auto: skipping {reason}")
    return AUTO_FALLBACK
