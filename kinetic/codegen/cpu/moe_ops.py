"""The compiled step's rows for the mixture-of-experts ops (docs/moe.md).

Owns: lowering moe_gate, moe_select, moe_weights, moe_matmul and moe_sum to tape instructions. The
router ops and the weighted sum are generated row kernels (moe_ir.py) called by OP_ROW_KERNEL on
whole rows; the chosen experts (`i32[T, n_used]`) live in the f32 arena as exact small integers.
moe_matmul is two native instructions (moe_step.py): the slots' rows quantized grouped by expert,
then each chosen expert's generated matmul on its slice of the stacked weight, the step's threads
splitting the columns. A stack of a type without a bit-exact kernel (F32, or activations the
kernels do not take) runs its reference between compiled segments instead (a Python instruction
grouping the rows by expert, `CpuInterpreter.expert_matmul`). Each gives the reference's bits
(kinetic/ir/moe_reference.py) for every row, alone or in any pass. Does not own the kernels nor
what the ops mean.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu import float_matmul_ir, moe_ir, moe_step, tape
from kinetic.codegen.cpu.executor import CpuInterpreter
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.tape_plan import Ref, value
from kinetic.codegen.cpu.target import BIT_EXACT
from kinetic.ir import moe_reference as moe_ref
from kinetic.ir.graph import Node
from kinetic.ir.ops import QUANTIZED_ROWS
from kinetic.ir.reference import Evaluation

ROUNDED_TYPES = (Q.F16, Q.BF16)  # float stacks whose kernels read rows rounded once (F32: the reference)


def _row_kernel(b, node: Node, key: tuple, render, x: Node, second) -> None:
    """One OP_ROW_KERNEL: kernel(x, second, node's value) on whole rows. `second`: a node (its
    value), a constant's arena key, or None."""
    width = node.type.shape[1]
    reads = [("v", x.id)]
    if isinstance(second, Node):
        reads.append(("v", second.id))
        second_ref = value(second)
    else:
        second_ref = -1 if second is None else Ref(second)
    b.add(tape.OP_ROW_KERNEL, {tape.ROWK_KERNEL: b.kernels.generated(key, render), tape.ROWK_X: value(x),
                               tape.ROWK_B: second_ref, tape.ROWK_Y: value(node)},
          reads=tuple(reads), writes=(("v", node.id),), row_local=True, width=width, unit=width, whole_row=True)


def moe_gate(b, node: Node, ins: list[Node]) -> None:
    n_expert, gating = node.type.shape[1], node.attrs.gating
    _row_kernel(b, node, ("moe_gate", n_expert, gating), lambda: moe_ir.render_gate(n_expert, gating), ins[0], None)


def moe_select(b, node: Node, ins: list[Node]) -> None:
    n_expert, n_used = ins[0].type.shape[1], node.attrs.n_used
    b.plan.f32_sizes[("v", node.id)] = b.capacity * n_used  # i32 ids as exact floats
    bias = None
    if len(ins) == 2:
        bias = ("c", ins[1].attrs.tensor)
        b.plan.constants[bias] = b.reference.weight(ins[1]).values.reshape(-1).astype(np.float32)
    _row_kernel(b, node, ("moe_select", n_expert, n_used, bias is not None),
                lambda: moe_ir.render_select(n_expert, n_used, bias is not None), ins[0], bias)


def moe_weights(b, node: Node, ins: list[Node]) -> None:
    n_expert, n_used, a = ins[0].type.shape[1], node.type.shape[1], node.attrs
    _row_kernel(b, node, ("moe_weights", n_expert, n_used, a.normalize, float(a.scale)),
                lambda: moe_ir.render_weights(n_expert, n_used, a.normalize, a.scale), ins[0], ins[1])


def moe_sum(b, node: Node, ins: list[Node]) -> None:
    n_used, width = ins[1].type.shape[1], node.type.shape[1]
    _row_kernel(b, node, ("moe_sum", n_used, width), lambda: moe_ir.render_sum(n_used, width), ins[0], ins[1])


# ---- moe_matmul ------------------------------------------------------------------------------------

def _native(node: Node, weight: Node) -> bool:
    wtype = weight.type.ggml_type
    return node.attrs.activations == "q8" and (wtype in BIT_EXACT or wtype in ROUNDED_TYPES)


def moe_matmul(b, node: Node, ins: list[Node]) -> None:
    """The slots' rows quantized (or rounded) grouped by expert, once per (input, choice, format)
    for every moe_matmul reading them (gate and up share theirs), then the experts' products."""
    x, w, ids = ins
    if not _native(node, w):
        _python_moe_matmul(b, node, ins)
        return
    n_expert, n_out, k = w.type.shape
    n_used = ids.type.shape[1]
    wtype = w.type.ggml_type
    places = b.capacity * n_used
    if wtype in ROUNDED_TYPES:
        fmt, block, rounded = wtype.name.lower(), 1, True
        e_row = k * float_matmul_ir.ACTIVATION_BYTES[wtype]
        quantizer, kernel = b.kernels.round(fmt), b.kernels.float_matmul(wtype, k)
        sizes = (0, 0, places * e_row)
    else:
        fmt, rounded = LAYOUTS[wtype].activation, False
        block = QUANTIZED_ROWS[fmt]
        e_row = {"q8_1": k // 32 * 4, "q8_k": k // 16 * 4}.get(fmt, 0)
        quantizer, kernel = b.kernels.quantize(fmt), b.kernels.matmul(wtype, k)
        sizes = (places * k, places * (k // block) * 4, places * e_row)
    qkey = ("moe_q", x.id, ids.id, fmt)
    common = dict(k=k, x_width=x.type.shape[1], block=block, e_row=e_row, n_used=n_used, n_expert=n_expert,
                  rounded=rounded)
    grouped = {tape.MOE_Q: Ref(qkey, "q"), tape.MOE_D: Ref(qkey, "d"), tape.MOE_E: Ref(qkey, "e")}
    if qkey not in b.plan.q_sizes:
        b.plan.q_sizes[qkey] = sizes
        params = moe_step.parameters(kernel=quantizer, **common)
        b.add(tape.OP_MOE_QUANT, {tape.MOE_PARAMS: b.address(params), tape.MOE_X: value(x), tape.MOE_IDS: value(ids),
                                  **grouped, tape.MOE_Y: 0, tape.MOE_SCRATCH: 0},
              reads=(("v", x.id), ("v", ids.id)), writes=(qkey,))
    raw = np.asarray(b.weights.tensor(w.attrs.tensor))
    scratch = ("moe_scratch", node.id)
    b.plan.f32_sizes[scratch] = places * n_out
    params = moe_step.parameters(kernel=kernel, weight=b.address(raw), expert_bytes=raw.nbytes // n_expert, n=n_out,
                                 **common)
    b.add(tape.OP_MOE_MATMUL, {tape.MOE_PARAMS: b.address(params), tape.MOE_X: 0, tape.MOE_IDS: value(ids),
                               **grouped, tape.MOE_Y: value(node), tape.MOE_SCRATCH: Ref(scratch)},
          reads=(qkey, ("v", ids.id)), writes=(("v", node.id), scratch))


def _python_moe_matmul(b, node: Node, ins: list[Node]) -> None:
    """The reference between compiled segments, each expert's rows through the generated matmul
    kernels where the type has one (`CpuInterpreter.expert_matmul`)."""
    ev = Evaluation(CpuInterpreter(b.weights, threads=b.threads), None, None)
    x, w, ids = ins

    def run(step, n: int, n_out: int) -> None:
        chosen = step.view(ids.id, n).astype(np.int32)
        step.view(node.id, n)[:] = moe_ref.moe_matmul(ev, node, [step.view(x.id, n), w, chosen])

    b.add_python(run, reads=(("v", x.id), ("v", ids.id)), writes=(("v", node.id),))
