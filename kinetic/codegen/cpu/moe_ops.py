"""The compiled step's rows for the mixture-of-experts ops (docs/moe.md).

Owns: lowering moe_gate, moe_select, moe_weights, moe_matmul and moe_sum to Python instructions of
the tape (between compiled segments; no generated router kernels yet). Each runs its reference
(kinetic/ir/moe_reference.py) on the arena's rows, so the step gives the reference's bits; the
chosen experts (`i32[T, n_used]`) live in the f32 arena as exact small integers. moe_matmul groups
the pass's rows by expert and runs each group through the generated matmul kernels on that expert's
stored bytes (`ExpertKernels`, the CPU interpreter's `expert_matmul`), each row as alone: grouping
changes no row's arithmetic. Does not own the kernels (matmul.py) nor what the ops mean.
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.cpu.executor import CpuInterpreter
from kinetic.ir import moe_reference as moe_ref
from kinetic.ir.graph import Node
from kinetic.ir.ops import Op
from kinetic.ir.reference import Evaluation


def _ids(view: np.ndarray) -> np.ndarray:
    """The chosen experts, from their f32 arena rows."""
    return view.astype(np.int32)


def _evaluation(b) -> Evaluation:
    """What the references ask of a runner: the weights (a bias, an expert's bytes) and expert_matmul
    through the generated kernels; it holds no pass state."""
    return Evaluation(CpuInterpreter(b.weights, threads=b.threads), None, None)


def _lower(reference, *, ids_in: tuple[int, ...] = (), ids_out: bool = False):
    """A tape row running `reference` on the arena's rows; inputs at positions `ids_in` are expert
    ids (f32 rows back to integers); `ids_out`: the node's own value is expert ids."""
    def lower(b, node: Node, ins: list[Node]) -> None:
        ev = _evaluation(b)
        computed = [i for i in ins if i.op is not Op.PARAM]
        if ids_out:
            b.plan.f32_sizes[("v", node.id)] = b.capacity * node.type.shape[1]

        def run(step, n: int, n_out: int) -> None:
            inputs = [i if i.op is Op.PARAM else step.view(i.id, n) for i in ins]
            inputs = [_ids(v) if pos in ids_in else v for pos, v in enumerate(inputs)]
            step.view(node.id, n)[:] = reference(ev, node, inputs)

        b.add_python(run, reads=tuple(("v", i.id) for i in computed), writes=(("v", node.id),))

    return lower


moe_gate = _lower(moe_ref.moe_gate)
moe_select = _lower(moe_ref.moe_select, ids_out=True)
moe_weights = _lower(moe_ref.moe_weights, ids_in=(1,))
moe_matmul = _lower(moe_ref.moe_matmul, ids_in=(2,))
moe_sum = _lower(moe_ref.moe_sum)
