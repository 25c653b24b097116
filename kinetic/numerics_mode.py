"""Which numerics mode a model runs in: the user's `--numerics`, a .ktc file's, or the device's default.

Owns: `default_numerics` and `choose_numerics`, the one user-facing check of a mode's name (the
command line's `--numerics` choices read the same list, kinetic/ir/orders.py NUMERICS, and refuse a
wrong name before a model is resolved or downloaded; the batch-invariance pass asserts it again for
callers of the pipeline). A numerics mode ("ggml", every reduction in the order of llama.cpp's CPU
decode path; "fast", faster per-row orders the reference follows too) is chosen once, before the
graph is compiled, because the batch-invariance pass writes its orders into the graph. Asked for
explicitly, a mode is used; else a .ktc file's stored graph keeps the mode it was compiled in (a file
that records none was compiled in "ggml", kinetic/ktc/load.py); else the device's default:
`orders.DEFAULT_NUMERICS` ("fast") where the device follows it (the CPU, the reference interpreter),
"ggml" elsewhere, silently. A device whose kernels follow only some modes (its Capabilities'
`numerics`: Vulkan and CUDA follow "ggml" only) runs "ggml" instead of a mode the user or the file
asked for, with one note saying so, rather than refusing the model. Does not own the orders
(kinetic/ir/orders.py), the pass (kinetic/passes/batch_invariance.py) or the check a device makes of
a graph's orders (kinetic/codegen/common/orders.py).
"""

from __future__ import annotations

from collections.abc import Callable

from kinetic.errors import KineticError
from kinetic.ir.orders import DEFAULT_NUMERICS, NUMERICS


def device_numerics(device: str) -> frozenset[str]:
    """The numerics modes `device` (a name of kinetic.devices, not auto) follows; every mode for a
    device without a capability record (the reference interpreter runs any graph)."""
    from kinetic.devices import DEVICES

    declared = DEVICES[device].capabilities if device in DEVICES else None
    return frozenset(NUMERICS) if declared is None else declared().numerics


def default_numerics(device: str) -> str:
    """The mode a model runs in on `device` when nobody asked for one: DEFAULT_NUMERICS where the
    device follows it, else "ggml" (the mode every device follows)."""
    return DEFAULT_NUMERICS if DEFAULT_NUMERICS in device_numerics(device) else "ggml"


def choose_numerics(*, requested: str | None, stored: str | None, device: str,
                    note: Callable[[str], None]) -> str:
    """The mode to compile in: `requested` (--numerics) when given, else `stored` (a .ktc file's),
    else `device`'s default; "ggml" when `device` does not follow the mode asked for, with a `note`."""
    if requested is not None and requested not in NUMERICS:
        raise KineticError(f"unknown numerics mode {requested!r}",
                           f"Use --numerics with one of: {', '.join(NUMERICS)}.")
    mode = requested or stored
    if mode is None:
        return default_numerics(device)
    if mode in device_numerics(device):
        return mode
    source = "--numerics" if requested else "the .ktc file's numerics mode"
    note(f"{source} {mode} is not one --device {device} follows; running in ggml's orders")
    return "ggml"
