"""The pass pipeline: one explicit list of phases, options on a frozen dataclass, and its hash.

A phase's passes are `Graph -> Graph`; a phase that depends on an option beyond being on or off
names the PassOptions fields its passes take as keywords (`reads`: the batch-invariance phase reads
`numerics`, the mode whose reduction orders it writes).

Owns: `PassOptions`, `Phase`, `PIPELINE`, `run_pipeline`, the device phase (`DEVICE_PHASE`,
`lower_for_device`) and `pipeline_hash`. Options come only from a PassOptions value (never from the
environment), so a compiled graph depends on nothing but its input graph and these options (and,
after the device phase, the device's fusions), and `pipeline_hash` can key the kernel cache on
them.

The generic phases give the graph every device runs and a .ktc file stores. The device phase comes
after them, for one device: `lower_for_device(graph, fusions)` applies the device forms its
fusions declare (kinetic/passes/device_fusion.py), with the ids of the graph it is given kept.
A device's runner calls it when it opens; `kinetic compile --dump-ir DIR --device X` shows it as the
last phase.

`run_pipeline` verifies the graph before the first pass and after every pass, and names the pass
when the verifier objects.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

from kinetic.ir.graph import Graph, verify
from kinetic.ir.ops import VerifyError
from kinetic.ir.orders import DEFAULT_NUMERICS
from kinetic.passes.batch_invariance import assign_reduction_orders
from kinetic.passes.canonicalize import canonicalize, renumber
from kinetic.passes.cse import eliminate_common_subexpressions
from kinetic.passes.dce import eliminate_dead_code
from kinetic.passes.device_fusion import DEVICE_PASSES, Fusions
from kinetic.passes.fusion import fuse

# Bump when a pass changes what it produces in a way its source text does not show.
PIPELINE_VERSION = 1

Pass = Callable[[Graph], Graph]


@dataclass(frozen=True)
class PassOptions:
    cse: bool = True  # merge repeated computations
    fusion: bool = True  # silu/gelu * up -> swiglu/geglu
    # the reductions' orders: "ggml" or "fast" (kinetic/ir/orders.py). The pipeline names no device, so
    # it takes DEFAULT_NUMERICS as it is; a caller compiling for a device passes the mode chosen for it
    # (kinetic/numerics_mode.py: "ggml" on Vulkan and CUDA, whose runners refuse the fast orders). The
    # name was checked there; the batch-invariance pass refuses an unknown one (ops.mode_order).
    numerics: str = DEFAULT_NUMERICS


@dataclass(frozen=True)
class Phase:
    name: str
    passes: tuple[Pass, ...]
    option: str | None = None  # the PassOptions field that switches this phase; None = always on
    reads: tuple[str, ...] = ()  # PassOptions fields its passes take as keywords

    def enabled(self, options: PassOptions) -> bool:
        return self.option is None or bool(getattr(options, self.option))

    def keywords(self, options: PassOptions) -> dict:
        return {name: getattr(options, name) for name in self.reads}


PIPELINE: tuple[Phase, ...] = (
    Phase("canonicalize", (canonicalize,)),
    Phase("cse", (eliminate_common_subexpressions, eliminate_dead_code, renumber), option="cse"),
    Phase("fusion", (fuse, eliminate_dead_code, renumber), option="fusion"),
    # last: every reduction, fused ones too, in the numerics mode's order
    Phase("batch_invariance", (assign_reduction_orders,), reads=("numerics",)),
)


def run_pipeline(graph: Graph, options: PassOptions | None = None,
                 on_phase: Callable[[str, Graph], None] | None = None) -> Graph:
    """The graph after every enabled phase; `on_phase(name, graph)` sees it after each phase."""
    options = options or PassOptions()
    verify(graph)
    for phase in PIPELINE:
        if not phase.enabled(options):
            continue
        for run_pass in phase.passes:
            graph = run_pass(graph, **phase.keywords(options))
            _verify_after(graph, phase=phase.name, pass_name=run_pass.__name__)
        if on_phase is not None:
            on_phase(phase.name, graph)
    return graph


DEVICE_PHASE = "device"  # the name on_phase and --dump-ir give the device phase


def lower_for_device(graph: Graph, fusions: Fusions, *, keep: frozenset[int] = frozenset(),
                     on_phase: Callable[[str, Graph], None] | None = None) -> Graph:
    """The graph after the device phase for a device with these fusions (DEVICE_PASSES, each
    verified after it runs); nodes in `keep` (a split's first layers, run elsewhere) stay as they are.
    `on_phase(DEVICE_PHASE, graph)` sees the result."""
    for run_pass in DEVICE_PASSES:
        graph = run_pass(graph, fusions, keep)
        _verify_after(graph, phase=DEVICE_PHASE, pass_name=run_pass.__name__)
    if on_phase is not None:
        on_phase(DEVICE_PHASE, graph)
    return graph


def _verify_after(graph: Graph, *, phase: str, pass_name: str) -> None:
    try:
        verify(graph)
    except VerifyError as exc:
        raise VerifyError(f"after pass {pass_name} (phase {phase}): {exc}") from exc


def pipeline_hash(options: PassOptions | None = None, fusions: Fusions | None = None) -> str:
    """A hex digest of the version, the enabled phases and passes, their source code and the options;
    with a device's fusions, of the device phase too (its passes, their source, the fusions)."""
    options = options or PassOptions()
    phases = [(p.name, [f.__module__ + "." + f.__name__ for f in p.passes])
              for p in PIPELINE if p.enabled(options)]
    modules = sorted({f.__module__ for p in PIPELINE if p.enabled(options) for f in p.passes})
    facts = {"version": PIPELINE_VERSION, "phases": phases, "options": asdict(options)}
    if fusions is not None:
        phases.append((DEVICE_PHASE, [f.__module__ + "." + f.__name__ for f in DEVICE_PASSES]))
        modules = sorted(set(modules) | {f.__module__ for f in DEVICE_PASSES} | {"kinetic.passes.rewrite"})
        facts["fusions"] = fusions.describe()
    modules += [__name__, "kinetic.ir.orders"]  # the orders the batch-invariance pass writes
    h = hashlib.sha256()
    h.update(json.dumps(facts, sort_keys=True).encode())
    for module in modules:
        h.update(inspect.getsource(sys.modules[module]).encode())
    return h.hexdigest()
