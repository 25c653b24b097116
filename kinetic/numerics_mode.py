"""Which numerics mode a model runs in: the user's `--numerics`, a .ktc file's, or the default.

Owns: `choose_numerics`. A numerics mode (kinetic/ir/orders.py: "ggml", every reduction in the
order of llama.cpp's CPU decode path; "fast", faster per-row orders the reference follows too) is
chosen once, before the graph is compiled, because the batch-invariance pass writes its orders into
the graph. Asked for explicitly, a mode is used; else a .ktc file's stored graph keeps the mode it
was compiled in; else `orders.DEFAULT_NUMERICS`. A device whose kernels follow only some modes (its
Capabilities' `numerics`: Vulkan and CUDA follow "ggml" only) runs "ggml" instead of another mode,
with one note saying so, rather than refusing the model. The reference interpreter follows every
mode. Does not own the orders (kinetic/ir/orders.py), the pass (kinetic/passes/batch_invariance.py)
or the check a device makes of a graph's orders (kinetic/codegen/common/orders.py).
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


def choose_numerics(*, requested: str | None, stored: str | None, device: str,
                    note: Callable[[str], None]) -> str:
    """The mode to compile in: `requested` (--numerics) when given, else `stored` (a .ktc file's),
    else DEFAULT_NUMERICS; "ggml" when `device` does not follow that mode, with a `note` when the
    user or the file asked for it."""
    if requested is not None and requested not in NUMERICS:
        raise KineticError(f"unknown numerics mode {requested!r}",
                           f"Use --numerics with one of: {', '.join(NUMERICS)}.")
    mode = requested or stored or DEFAULT_NUMERICS
    if mode in device_numerics(device):
        return mode
    if requested or stored:
        source = "--numerics" if requested else "the .ktc file's numerics mode"
        note(f"{source} {mode} is not one --device {device} follows; running in ggml's orders")
    return "ggml"
