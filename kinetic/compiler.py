"""From a GGUF file to the optimized graph: the one compile step `Model`, .ktc loading and
`kinetic compile` share.

Owns: the order of the step, which is the frontend's `lower` (family descriptor -> verified graph),
then the pass pipeline (`kinetic.passes.PIPELINE`), with `on_phase` seeing the graph after lowering
(as phase "lowered") and after every phase. The result is the generic graph every device is given
(and a .ktc file stores); a device's runner applies its own device phase to it when it opens
(`kinetic.passes.lower_for_device`, which `kinetic compile --dump-ir --device X` shows). Does not
own what lowering or any pass does, nor caching the result (kinetic/ktc/load.py decides when the
stored graph can be used instead).
"""

from __future__ import annotations

from collections.abc import Callable

from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.lower import lower
from kinetic.ir.graph import Graph
from kinetic.ir.orders import DEFAULT_NUMERICS
from kinetic.passes import PassOptions, run_pipeline


def compile_graph(gguf: GGUFFile, options: Options | None = None, passes: PassOptions | None = None,
                  on_phase: Callable[[str, Graph], None] | None = None) -> Graph:
    """The model's optimized graph; `on_phase(name, graph)` sees it after lowering and each phase.
    The pipeline runs with `passes`, else with the numerics mode `options` names (None: the default)."""
    graph = lower(gguf, options)
    if on_phase is not None:
        on_phase("lowered", graph)
    return run_pipeline(graph, passes or pass_options(options), on_phase=on_phase)


def pass_options(options: Options | None) -> PassOptions:
    """The pipeline's options for these lowering options: their numerics mode, DEFAULT_NUMERICS when
    they name none."""
    return PassOptions(numerics=(options and options.numerics) or DEFAULT_NUMERICS)
