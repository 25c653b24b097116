"""The pass pipeline: one explicit list of phases, options on a frozen dataclass, and its hash.

Owns: `PassOptions`, `Phase`, `PIPELINE`, `run_pipeline` and `pipeline_hash`. Options come only
from a PassOptions value (never from the environment), so a compiled graph depends on nothing but
its input graph and these options, and `pipeline_hash` can key the kernel cache on them.

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
from kinetic.passes.canonicalize import canonicalize, renumber
from kinetic.passes.cse import eliminate_common_subexpressions
from kinetic.passes.dce import eliminate_dead_code
from kinetic.passes.fusion import fuse

# Bump when a pass changes what it produces in a way its source text does not show.
PIPELINE_VERSION = 1

Pass = Callable[[Graph], Graph]


@dataclass(frozen=True)
class PassOptions:
    cse: bool = True  # merge repeated computations
    fusion: bool = True  # silu/gelu * up -> swiglu/geglu


@dataclass(frozen=True)
class Phase:
    name: str
    passes: tuple[Pass, ...]
    option: str | None = None  # the PassOptions field that switches this phase; None = always on

    def enabled(self, options: PassOptions) -> bool:
        return self.option is None or bool(getattr(options, self.option))


PIPELINE: tuple[Phase, ...] = (
    Phase("canonicalize", (canonicalize,)),
    Phase("cse", (eliminate_common_subexpressions, eliminate_dead_code, renumber), option="cse"),
    Phase("fusion", (fuse, eliminate_dead_code, renumber), option="fusion"),
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
            graph = run_pass(graph)
            _verify_after(graph, phase=phase.name, pass_name=run_pass.__name__)
        if on_phase is not None:
            on_phase(phase.name, graph)
    return graph


def _verify_after(graph: Graph, *, phase: str, pass_name: str) -> None:
    try:
        verify(graph)
    except VerifyError as exc:
        raise VerifyError(f"after pass {pass_name} (phase {phase}): {exc}") from exc


def pipeline_hash(options: PassOptions | None = None) -> str:
    """A hex digest of the version, the enabled phases and passes, their source code and the options."""
    options = options or PassOptions()
    phases = [(p.name, [f.__module__ + "." + f.__name__ for f in p.passes])
              for p in PIPELINE if p.enabled(options)]
    modules = sorted({f.__module__ for p in PIPELINE if p.enabled(options) for f in p.passes})
    modules.append(__name__)
    h = hashlib.sha256()
    h.update(json.dumps({"version": PIPELINE_VERSION, "phases": phases, "options": asdict(options)},
                        sort_keys=True).encode())
    for module in modules:
        h.update(inspect.getsource(sys.modules[module]).encode())
    return h.hexdigest()
