"""The import rules between Kinetic's packages, read from the source with ast (nothing is imported).

Devices are independent of one another and of the runtime: a device package (kinetic/codegen/cpu,
cuda, vulkan) imports no other device package, and no code generator imports the runtime, the
device registry (kinetic/devices.py, which loads devices; they never load it back), the model, the
server or the CLI. What several devices share lives in kinetic/codegen/common, which imports no
device. The runtime serves the server and the CLI and imports neither.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODEGEN = ROOT / "kinetic" / "codegen"
DEVICES = sorted(p.name for p in CODEGEN.iterdir() if (p / "__init__.py").exists() and p.name != "common")
ABOVE_CODEGEN = ("kinetic.runtime", "kinetic.devices", "kinetic.model", "kinetic.server", "kinetic.cli")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, top level or inside a function; relative imports
    resolved, and `from a import b` also as a.b (b may be a module)."""
    package = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def violations(folder: Path, forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """`file:line imports module` for each import under `folder` of a module in `forbidden` or below."""
    bad = []
    for path in sorted(folder.rglob("*.py")):
        for line, module in imports(path, root):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(root)}:{line} imports {module}")
    return sorted(set(bad))


def test_the_device_packages_are_found():
    """The rules below cover every device package (a new one is covered by being a folder here)."""
    assert {"cpu", "cuda", "vulkan"} <= set(DEVICES)


@pytest.mark.parametrize("device", DEVICES)
def test_a_device_imports_no_other_device(device):
    """A device package imports no other device package: what two devices share is in
    kinetic/codegen/common (or kinetic/ir)."""
    others = tuple(f"kinetic.codegen.{d}" for d in DEVICES if d != device)
    assert violations(CODEGEN / device, others) == []


def test_common_device_code_imports_no_device():
    """kinetic/codegen/common, what several devices share, imports none of them."""
    assert violations(CODEGEN / "common", tuple(f"kinetic.codegen.{d}" for d in DEVICES)) == []


def test_code_generators_import_nothing_above_them():
    """No code generator imports the runtime (it sees sequences' caches only through KVView), the
    device registry, the model, the server or the CLI."""
    assert violations(CODEGEN, ABOVE_CODEGEN) == []


def test_the_runtime_imports_neither_the_server_nor_the_cli():
    """kinetic/runtime serves the server and the CLI; it imports neither."""
    assert violations(ROOT / "kinetic" / "runtime", ("kinetic.server", "kinetic.cli")) == []


def test_the_checker_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The checker finds a lazy import inside a function and resolves a relative one."""
    package = tmp_path / "kinetic" / "codegen" / "cuda"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "plan.py").write_text("def f():\n    from kinetic.codegen.cpu import jit\n\nfrom ..cpu import step\n")
    assert violations(package, ("kinetic.codegen.cpu",), tmp_path) == [
        "kinetic/codegen/cuda/plan.py:2 imports kinetic.codegen.cpu",
        "kinetic/codegen/cuda/plan.py:2 imports kinetic.codegen.cpu.jit",
        "kinetic/codegen/cuda/plan.py:4 imports kinetic.codegen.cpu",
        "kinetic/codegen/cuda/plan.py:4 imports kinetic.codegen.cpu.step",
    ]
