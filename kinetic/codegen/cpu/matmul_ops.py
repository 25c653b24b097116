"""The compiled step's rows for matmuls and the quantization of their input rows (lowering.py's table
points here for MATMUL and QUANTIZE).

Owns: `matmul` (a quantized weight through its generated kernel in the node's reduction order, an
F16/BF16/F32 weight through the float kernel after one rounding of the row, any other weight through
the reference between compiled segments), `refuse_matmul` (a weight type without a bit-exact kernel
reading quantized rows, or an order the CPU's kernel for the type does not follow:
target.kernel_orders), `quantize` and `quantized_row_bytes`. Does not own the kernels
(step_kernels.py, matmul_ir.py), the tape's columns (tape.py) nor how threads split an instruction
(tape_plan.py: output columns, or rows in the row-split plan, through the row strides given here).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu import float_matmul_ir, tape, target
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.tape_plan import Ref, output_rows, quantized, row_width, value
from kinetic.codegen.cpu.target import BIT_EXACT
from kinetic.errors import KineticError
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import QUANTIZED_ROWS, Op

ROW_BYTES = (tape.MATMUL_Q_ROW, tape.MATMUL_D_ROW, tape.MATMUL_E_ROW)  # a matmul's input row strides


def matmul(b, node: Node, ins: list[Node]) -> None:
    x, w = ins
    if x.op is Op.QUANTIZE:
        _quantized_matmul(b, node, x, w)
    elif node.attrs.activations == "q8" and w.type.ggml_type in BIT_EXACT:
        raise KineticError(f"matmul %{node.id} reads rows no quantize node made",
                           "Lower the graph through device_graph (the CPU's device phase) first.")
    elif node.attrs.activations == "q8" and w.type.ggml_type in float_matmul_ir.FLOAT_TYPES:
        _float_matmul(b, node, x, w)
    else:  # no bit-exact kernel: the reference, between compiled segments
        b.add_python(_python_matmul(x, w, node), reads=(("v", x.id),), writes=(("v", node.id),))


def refuse_matmul(graph: Graph, node: Node) -> str | None:
    wtype = graph.node(node.inputs[1]).type.ggml_type
    reads_rows = graph.node(node.inputs[0]).op is Op.QUANTIZE
    if reads_rows and wtype not in BIT_EXACT:
        return f"a matmul of {wtype.name} weights reading quantized rows"
    order = node.attrs.order
    if node.attrs.activations == "q8" and wtype in BIT_EXACT and order and order not in target.kernel_orders(wtype):
        return (f"matmul %{node.id} sums in order {order!r}, which the CPU's {wtype.name} kernel does not follow "
                f"({', '.join(sorted(target.kernel_orders(wtype)))})")
    return None


def quantize(b, node: Node, ins: list[Node]) -> None:
    """x's rows in the format's blocks (int8 values, f32 scales, and block sums where the format has
    them: Q8_1 per 32, Q8_K per 16), into the byte arena; row-local, split in whole blocks. An
    in_producer flag (another device's launch plan) changes nothing here: the rows are the same."""
    x, fmt = ins[0], node.attrs.format
    k, qkey = row_width(node), quantized(node)
    block = QUANTIZED_ROWS[fmt]
    q_row, d_row, e_row = quantized_row_bytes(fmt, k)
    b.plan.q_sizes[qkey] = (b.capacity * q_row, b.capacity * d_row, b.capacity * e_row)
    b.add(tape.OP_QUANT, {
        tape.QUANT_X: value(x), tape.QUANT_WIDTH: k, tape.QUANT_KERNEL: b.kernels.quantize(fmt),
        tape.QUANT_Q: Ref(qkey, "q"), tape.QUANT_D: Ref(qkey, "d"), tape.QUANT_E: Ref(qkey, "e"),
        tape.QUANT_BLOCK: block, tape.QUANT_E_ROW: e_row},
        reads=(("v", x.id),), writes=(qkey,), row_local=True, output_rows=output_rows(node), width=k, unit=block)


def quantized_row_bytes(fmt: str, k: int) -> tuple[int, int, int]:
    """Bytes a row of k values takes in each part of a quantized buffer: values, block scales and
    block sums (Q8_1 per 32, Q8_K per 16; other formats none)."""
    return k, k // QUANTIZED_ROWS[fmt] * 4, {"q8_1": k // 32 * 4, "q8_k": k // 16 * 4}.get(fmt, 0)


def _quantized_matmul(b, node: Node, x: Node, w: Node) -> None:
    """The generated kernel on the weight as stored, reading the quantize node x's rows (in the
    weight type's activation format: the verifier holds them to it), threads splitting its output
    columns."""
    layout = LAYOUTS[w.type.ggml_type]
    k, out_rows, qkey = x.type.shape[1], output_rows(node), quantized(x)
    b.add(tape.OP_MATMUL, {
        tape.MATMUL_KERNEL: b.kernels.matmul(layout.wtype, k, node.attrs.order),
        tape.MATMUL_WEIGHT: b.address(np.asarray(b.weights.tensor(w.attrs.tensor))),
        tape.MATMUL_Q: Ref(qkey, "q"), tape.MATMUL_D: Ref(qkey, "d"), tape.MATMUL_E: Ref(qkey, "e"),
        tape.MATMUL_Y: value(node), tape.MATMUL_N: node.type.shape[1],
        **dict(zip(ROW_BYTES, quantized_row_bytes(x.attrs.format, k), strict=True))},
        reads=(qkey,), writes=(("v", node.id),), output_rows=out_rows)


def _float_matmul(b, node: Node, x: Node, w: Node) -> None:
    """An F16/BF16/F32 matmul: x rounded once to what the kernel reads (row-local, shared by every
    matmul of that input and type, as a quantization is; F32 reads x itself), then the kernel on
    the weight as stored, threads splitting its columns."""
    wtype, k, out_rows = w.type.ggml_type, x.type.shape[1], output_rows(node)
    source, reads, row_bytes = Ref(("v", x.id), "address"), (("v", x.id),), 4 * k
    if wtype is not Q.F32:
        fmt, row_bytes = wtype.name.lower(), k * float_matmul_ir.ACTIVATION_BYTES[wtype]
        rkey = ("q", x.id, fmt)
        if rkey not in b.rounded:
            b.rounded.add(rkey)
            b.plan.q_sizes[rkey] = (0, 0, b.capacity * row_bytes)
            b.add(tape.OP_QUANT, {  # blocks of one value, written through e
                tape.QUANT_X: value(x), tape.QUANT_WIDTH: k, tape.QUANT_KERNEL: b.kernels.round(fmt),
                tape.QUANT_Q: Ref(rkey, "q"), tape.QUANT_D: Ref(rkey, "d"), tape.QUANT_E: Ref(rkey, "e"),
                tape.QUANT_BLOCK: 1, tape.QUANT_E_ROW: row_bytes},
                reads=reads, writes=(rkey,), row_local=True, output_rows=out_rows, width=k, unit=16)
        source, reads = Ref(rkey, "e"), (rkey,)
    b.add(tape.OP_MATMUL, {
        tape.MATMUL_KERNEL: b.kernels.float_matmul(wtype, k),
        tape.MATMUL_WEIGHT: b.address(np.asarray(b.weights.tensor(w.attrs.tensor))),
        tape.MATMUL_Q: source, tape.MATMUL_D: 0, tape.MATMUL_E: 0,
        tape.MATMUL_Y: value(node), tape.MATMUL_N: node.type.shape[1],
        **dict(zip(ROW_BYTES, (row_bytes, 0, 0), strict=True))},
        reads=reads, writes=(("v", node.id),), output_rows=out_rows)


def _python_matmul(x: Node, weight: Node, node: Node):
    def run(step, n: int, n_out: int) -> None:
        rows = n_out if output_rows(node) else n
        step.view(node.id, rows)[:] = step.reference.matmul(step.view(x.id, rows), weight, node.attrs)

    return run
