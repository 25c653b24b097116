"""The device registry (kinetic/devices.py) is the one list of devices: every name opens a runner
meeting the Runner contract, `auto` and the command line read it, and no other module types a list
of device names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from kinetic import devices
from kinetic.codegen.runner import RunnerOptions
from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.passes import run_pipeline
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.conftest import device_passes
from tests.synthetic import synthetic_path

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def llama():
    """device -> (the graph a model gets on it, in its default numerics mode; the weights)."""
    gguf = open_gguf(synthetic_path("llama"))
    graphs = {}

    def for_device(name: str):
        mode = device_passes(name)
        if mode not in graphs:
            graphs[mode] = run_pipeline(lower(gguf), mode)
        return graphs[mode], GGUFWeights(gguf)
    return for_device


def test_every_device_has_its_names_and_the_cli_reads_them():
    """Each device has a label, a bench column and a help line; --device's choices are the registry's
    names with auto last, and its help names every one."""
    assert {"cpu", "reference", "cuda", "cuda-emulated", "vulkan"} <= set(devices.DEVICES)
    assert devices.device_choices() == (*devices.DEVICES, "auto")
    assert "auto" not in devices.device_choices(auto=False)
    help_text = devices.device_help()
    for name, d in devices.DEVICES.items():
        assert d.name == name and d.label and d.backend and d.help.startswith(f"{name}: ")
        assert d.help in help_text and devices.DEVICE_NAMES[name] == d.label
    assert devices.resolve_device("vulkan", [].append) == "vulkan"


def test_an_unknown_device_is_refused_with_the_names():
    """A name the registry does not hold is a KineticError listing the ones it does."""
    with pytest.raises(KineticError) as e:
        devices.device("tpu")
    assert "cuda-emulated" in e.value.hint


@pytest.mark.parametrize("name", list(devices.DEVICES))
def test_runners_opened_through_the_registry_meet_the_contract(llama, name):
    """A runner opened by name has in_place, run and close, and a prompt then a decode step through
    it give the reference interpreter's logits bit for bit; a device that cannot run the graph is
    refused at opening with the reason its `unsupported` gives."""
    d = devices.DEVICES[name]
    if d.unavailable():
        pytest.skip(d.unavailable())
    graph, weights = llama(name)
    options = RunnerOptions(batch=8, threads=2, n_ctx=64)
    if d.unsupported(graph):
        with pytest.raises(KineticError, match=re.escape(d.unsupported(graph))):
            devices.open_runner(name, graph, weights, options)
        return
    runner = devices.open_runner(name, graph, weights, options)
    assert isinstance(runner.in_place, bool) and callable(runner.run) and callable(runner.close)
    runner.close()
    engine, reference = (Engine(graph, weights, n_ctx=64, batch=8, device=e) for e in (name, "reference"))
    logits = {}
    for e in (engine, reference):
        seq = e.new_sequence()
        logits[e] = [e.prefill(seq, [1, 5, 9, 3]), e.decode(seq, 7)]
    for got, want in zip(logits[engine], logits[reference], strict=True):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    engine.close()


def test_a_device_that_cannot_run_here_says_why():
    """Each device's availability is a reason or None; CUDA's without a GPU names what is missing."""
    for d in devices.DEVICES.values():
        reason = d.unavailable()
        assert reason is None or (isinstance(reason, str) and reason)
    assert devices.DEVICES["cpu"].unavailable() is None and devices.DEVICES["reference"].unavailable() is None


def _device_name_lists(path: Path) -> list[str]:
    names = set(devices.DEVICES)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            strings = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
            if len(strings & names) >= 2:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_module_but_the_registry_types_a_list_of_devices():
    """No tuple, list, set or dict of two or more device names anywhere in kinetic/ but the registry."""
    found = [hit for path in sorted((ROOT / "kinetic").rglob("*.py")) if path != ROOT / "kinetic" / "devices.py"
             for hit in _device_name_lists(path)]
    assert found == []


def test_every_compiling_device_declares_one_capability_record():
    """Each device but the reference interpreter declares one Capabilities record (kinetic/codegen/
    runner.py) holding its fused ops, its device-phase fusions and the reduction orders it follows,
    all names the IR knows."""
    from kinetic.codegen.runner import Capabilities
    from kinetic.ir.ops import Op
    from kinetic.ir.orders import ORDERS

    for name, dev in devices.DEVICES.items():
        if name == "reference":
            assert dev.capabilities is None
            continue
        caps = dev.capabilities()
        assert isinstance(caps, Capabilities) and name.startswith(caps.name)
        assert caps.reduction_orders and caps.reduction_orders <= set(ORDERS)
    assert devices.DEVICES["cuda"].capabilities().fusions is not None  # CUDA's device phase fuses
    cpu = devices.DEVICES["cpu"].capabilities().fusions  # the CPU's phase: shared quantize nodes only
    assert cpu.quantized_matmuls and cpu.forms() == {Op.QUANTIZE}
