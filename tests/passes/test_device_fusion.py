"""The device phase (kinetic/passes/device_fusion.py): each rule's IR in and IR out, run twice, and the
same bits through the reference interpreter; a rule fires only for a capability the device declares."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.ir.graph import verify
from kinetic.ir.ops import Op
from kinetic.ir.text import parse_graph, print_graph
from kinetic.passes import Fusions, PassOptions, lower_for_device, pipeline_hash
from kinetic.passes.device_fusion import computed_by, quantized_in_producer

ROWS = ("q8_0", "q8_1")
EVERYTHING = Fusions(
    quantized_matmuls=frozenset({Q.Q8_0, Q.Q4_1, Q.Q4_K}), add_rms_norm=True, rope_pair=True,
    quantize_in=frozenset({(op, f) for op in (Op.RMS_NORM, Op.ADD_RMS_NORM) for f in ROWS}
                          | {(op, f) for op in (Op.SWIGLU, Op.ATTENTION) for f in (*ROWS, "q8_k")}))


def device_phase(caps: Fusions = EVERYTHING, keep: frozenset[int] = frozenset()):
    def run(graph):
        return lower_for_device(graph, caps, keep=keep)

    run.__name__ = "lower_for_device"
    return run


EMBED = """
%0 = input() {name="tokens"} : i32[T]
%1 = input() {name="positions"} : i32[T]
%2 = param() {tensor="token_embd.weight"} : f32[16,64]
%3 = embed(%2, %0) : f32[T,64]
"""

# the residual stream: x + f(x), then the next norm of the sum (and a second reader of the sum)
RESIDUAL = EMBED + """
%4 = param() {tensor="w"} : f32[64,64]
%5 = matmul(%3, %4) {activations="f32"} : f32[T,64]
%6 = add(%3, %5) : f32[T,64]
%7 = param() {tensor="norm"} : f32[64]
%8 = {norm}(%6, %7) {eps=1e-05} : f32[T,64]
%9 = param() {tensor="w2"} : f32[64,64]
%10 = matmul(%8, %9) {activations="f32"} : f32[T,64]
%11 = add(%6, %10) : f32[T,64]
output out = %11
"""


def test_a_residual_add_and_the_next_norm_become_one_launch(check):
    """rms_norm(add(a, b), w) -> add_rms_norm(add, w): the add stays for its other reader, the norm
    names it as the value its launch computes too."""
    after = check(device_phase(), RESIDUAL.replace("{norm}", "rms_norm"), RESIDUAL.replace("{norm}", "add_rms_norm"))
    assert computed_by(after) == {6: 8}


def test_no_fusion_for_a_device_that_does_not_declare_it(check):
    """A device without the capability (and the default, which declares none) sees the graph unchanged."""
    before = RESIDUAL.replace("{norm}", "rms_norm")
    check(device_phase(Fusions()), before, before)
    check(device_phase(Fusions(rope_pair=True)), before, before)


def test_a_norm_per_head_or_of_no_add_or_the_second_of_an_add_stays(check):
    """A grouped norm (per head) is not a whole-row norm, a norm of a matmul has no add to join, and
    an add's launch computes one norm: its second norm stays a norm of its own."""
    grouped = RESIDUAL.replace("{norm}", "rms_norm").replace("{eps=1e-05}", "{eps=1e-05, group=32}")
    grouped = grouped.replace('f32[64]\n%8', 'f32[32]\n%8')
    check(device_phase(), grouped, grouped)
    of_matmul = RESIDUAL.replace("{norm}", "rms_norm").replace("rms_norm(%6", "rms_norm(%5")
    check(device_phase(), of_matmul, of_matmul)
    two = EMBED + """
%4 = add(%3, %3) : f32[T,64]
%5 = rms_norm(%4) {eps=1e-05} : f32[T,64]
%6 = rms_norm(%4) {eps=1e-06} : f32[T,64]
%7 = add(%5, %6) : f32[T,64]
output out = %7
"""
    check(device_phase(), two, two.replace("%5 = rms_norm", "%5 = add_rms_norm"))


def _layer(q_rotation: str, between: str = "", k_theta: str = "10000.0") -> str:
    """Query and key projections, their rotations and an attention; `q_rotation` is what the
    attention reads as q (%6: the rotation, or %7, a scale of it after the key's rotation, as in
    Gemma), `between` a line before the key's rotation, written ROPE_K(%9, %1OTHER) for _rotations."""
    return EMBED + f"""
%4 = param() {{tensor="wq"}} : f32[64,64]
%5 = matmul(%3, %4) {{activations="f32"}} : f32[T,64]
%6 = rope(%5, %1) {{n_head=2, head_dim=32, n_rot=32, theta=10000.0, neox=true}} : f32[T,64]
{between}
%8 = param() {{tensor="wk"}} : f32[32,64]
%9 = matmul(%3, %8) {{activations="f32"}} : f32[T,32]
%10 = ROPE_K(%9, %1OTHER) {{n_head=1, head_dim=32, n_rot=32, theta={k_theta}, neox=true}} : f32[T,32]
{"%7 = scale(%6) {factor=0.5} : f32[T,64]" if q_rotation == "%7" else ""}
%11 = param() {{tensor="wv"}} : f32[32,64]
%12 = matmul(%3, %11) {{activations="f32"}} : f32[T,32]
%13 = state() {{name="kv.0", layer=0, n_kv_head=1, head_dim=32}} : kv[]
%14 = attention({q_rotation}, %10, %12, %13) {{n_head=2, n_kv_head=1, head_dim=32, scale=0.125}} : f32[T,64]
output out = %14
"""


def _rotations(layer: str, fused: bool) -> str:
    if fused:
        return layer.replace("ROPE_K", "rope_pair").replace("OTHER", ", %6")
    return layer.replace("ROPE_K", "rope").replace("OTHER", "")


@pytest.mark.parametrize("q", ["%6", "%7"], ids=["rotation", "through_a_scale"])
def test_the_query_and_key_rotations_of_an_attention_become_one_launch(check, q):
    """rope(k) -> rope_pair(k, positions, q-rotation): same positions, same tables but the head count,
    the query's rotation earlier and read by nothing before the key's (Gemma's queries reach the
    attention through a scale)."""
    after = check(device_phase(), _rotations(_layer(q), False), _rotations(_layer(q), True))
    assert computed_by(after) == {6: 10}


def test_rotations_are_not_paired_when_a_reader_comes_between_or_the_tables_differ(check):
    """The pair's launch computes the earlier rotation where the later one stands: a reader of the
    earlier one before that keeps them apart; so do other tables (another theta)."""
    read_early = _rotations(_layer("%6", between="%20 = add(%6, %6) : f32[T,64]\noutput early = %20"), False)
    check(device_phase(), read_early, read_early)
    other_theta = _rotations(_layer("%6", k_theta="500000.0"), False)
    check(device_phase(), other_theta, other_theta)


NORMED = EMBED + """
%4 = param() {tensor="norm"} : f32[64]
%5 = rms_norm(%3, %4) {eps=1e-05} : f32[T,64]
%6 = param() {tensor="wq"} : q8_0[64,64]
%7 = matmul(%5, %6) {activations="q8"} : f32[T,64]
%8 = param() {tensor="wk"} : q8_0[32,64]
%9 = matmul(%5, %8) {activations="q8"} : f32[T,32]
%10 = param() {tensor="wv"} : q4_1[32,64]
%11 = matmul(%5, %10) {activations="q8"} : f32[T,32]
%12 = add(%9, %11) : f32[T,32]
output q = %7
output kv = %12
"""


def test_matmuls_of_one_row_share_one_quantize_node_per_format(check):
    """matmul(x, w) -> matmul(quantize(x) {format(w)}, w): the Q8_0 projections read one q8_0
    quantize node (placed before the first), the Q4_1 one a q8_1 node; fresh ids, others kept."""
    expected = NORMED.replace("%7 = matmul(%5", '%13 = quantize(%5) {format="q8_0"} : q8_0[T,64]\n%7 = matmul(%13')
    expected = expected.replace("%9 = matmul(%5", "%9 = matmul(%13")
    expected = expected.replace("%11 = matmul(%5", '%14 = quantize(%5) {format="q8_1"} : q8_1[T,64]\n%11 = matmul(%14')
    caps = Fusions(quantized_matmuls=frozenset({Q.Q8_0, Q.Q4_1}))
    after = check(device_phase(caps), NORMED, expected)
    assert not quantized_in_producer(after)
    only_q8_0 = Fusions(quantized_matmuls=frozenset({Q.Q8_0}))  # the Q4_1 matmul quantizes for itself
    check(device_phase(only_q8_0), NORMED, expected.replace(
        '%14 = quantize(%5) {format="q8_1"} : q8_1[T,64]\n%11 = matmul(%14', "%11 = matmul(%5"))


def test_the_norm_writes_the_first_quantized_row_it_can(check):
    """quantize(norm) {f} -> quantize(norm) {f, in_producer}: the norm's launch writes the q8_0 row;
    a second format stays a quantize of its own (one quantized row per launch)."""
    expected = NORMED.replace(
        "%7 = matmul(%5", '%13 = quantize(%5) {format="q8_0", in_producer=true} : q8_0[T,64]\n%7 = matmul(%13')
    expected = expected.replace("%9 = matmul(%5", "%9 = matmul(%13")
    expected = expected.replace("%11 = matmul(%5", '%14 = quantize(%5) {format="q8_1"} : q8_1[T,64]\n%11 = matmul(%14')
    after = check(device_phase(), NORMED, expected)
    assert {p: q.id for p, q in quantized_in_producer(after).items()} == {5: 13}


def _attention_out(head_dim: int, wtype: str, k: int) -> str:
    n_head = 256 // head_dim
    return f"""
%0 = input() {{name="tokens"}} : i32[T]
%1 = param() {{tensor="token_embd.weight"}} : f32[16,256]
%2 = embed(%1, %0) : f32[T,256]
%3 = param() {{tensor="wk"}} : f32[{head_dim},256]
%4 = matmul(%2, %3) {{activations="f32"}} : f32[T,{head_dim}]
%5 = state() {{name="kv.0", layer=0, n_kv_head=1, head_dim={head_dim}}} : kv[]
%6 = attention(%2, %4, %4, %5) {{n_head={n_head}, n_kv_head=1, head_dim={head_dim}, scale=0.125}} : f32[T,256]
%7 = param() {{tensor="wo"}} : {wtype}[{k},256]
%8 = matmul(%6, %7) {{activations="q8"}} : f32[T,{k}]
output out = %8
"""


@pytest.mark.parametrize("head_dim,wtype,fused", [(64, "q8_0", True), (256, "q4_k", True), (64, "q4_k", False)])
def test_attention_writes_its_output_projection_row_per_head(check, head_dim, wtype, fused):
    """Attention writes its row in the projection's format where each head holds whole blocks: Q8_0
    rows over heads of 64; Q8_K (super-blocks of 256) only over heads of 256."""
    before = _attention_out(head_dim, wtype, 64)
    fmt = "q8_0" if wtype == "q8_0" else "q8_k"
    flag = ", in_producer=true" if fused else ""
    quantized = f'%9 = quantize(%6) {{format="{fmt}"{flag}}} : {fmt}[T,256]'
    expected = before.replace("%8 = matmul(%6", quantized + "\n%8 = matmul(%9")
    check(device_phase(), before, expected)


def test_kept_nodes_are_left_alone(check):
    """Nodes in `keep` (a split's first layers, run elsewhere) are not rewritten, and no fused node
    takes one as the value its launch computes: here the add is kept, so its norm stays a norm, and
    a kept matmul gets no quantize node."""
    before = RESIDUAL.replace("{norm}", "rms_norm")
    check(device_phase(keep=frozenset({6})), before, before)
    check(device_phase(keep=frozenset({7, 9})), NORMED, NORMED.replace(  # the matmuls %7, %9 kept
        "%11 = matmul(%5", '%13 = quantize(%5) {format="q8_1", in_producer=true} : q8_1[T,64]\n%11 = matmul(%13'))


def test_the_cpu_phase_makes_only_shared_quantize_nodes(check):
    """The CPU's fusions (codegen/cpu/target.FUSIONS): a quantize node per (row, format) before the
    q8 matmuls of its exact types, none written in a producer; adds, norms and rotations stay."""
    from kinetic.codegen.cpu.target import FUSIONS

    expected = NORMED.replace("%7 = matmul(%5", '%13 = quantize(%5) {format="q8_0"} : q8_0[T,64]\n%7 = matmul(%13')
    expected = expected.replace("%9 = matmul(%5", "%9 = matmul(%13")
    expected = expected.replace("%11 = matmul(%5", '%14 = quantize(%5) {format="q8_1"} : q8_1[T,64]\n%11 = matmul(%14')
    check(device_phase(FUSIONS), NORMED, expected)
    for unchanged in (RESIDUAL.replace("{norm}", "rms_norm"), _rotations(_layer("%7"), False)):
        check(device_phase(FUSIONS), unchanged, unchanged)


def test_device_forms_verify_and_refuse_what_does_not_fit():
    """The device forms' shape rules: a matmul reads quantized rows only in its weight's format, a
    quantize's rows are whole blocks, and an add_rms_norm normalizes whole rows."""
    from kinetic.ir.ops import VerifyError

    wrong_format = NORMED.replace("%7 = matmul(%5", '%13 = quantize(%5) {format="q8_1"} : q8_1[T,64]\n%7 = matmul(%13')
    with pytest.raises(ValueError, match="reads q8_0 rows"):
        parse_graph(wrong_format)
    with pytest.raises(VerifyError, match="whole blocks of 256"):
        verify(parse_graph(NORMED.replace("%7 = matmul(%5", '%13 = quantize(%5) {format="q8_k"} : q8_k[T,64]\n'
                                          "%7 = matmul(%5"), check_types=False))
    grouped = RESIDUAL.replace("{norm}", "add_rms_norm").replace("{eps=1e-05}", "{eps=1e-05, group=32}")
    with pytest.raises(ValueError, match="whole rows"):
        parse_graph(grouped.replace('f32[64]\n%8', 'f32[32]\n%8'))


def test_the_phase_keeps_ids_and_its_hash_covers_the_fusions():
    """lower_for_device keeps every id of the graph it is given; pipeline_hash with a device's
    fusions differs from the generic hash and between fusions."""
    before = parse_graph(NORMED)
    after = lower_for_device(before, EVERYTHING)
    assert {n.id for n in before.nodes} <= {n.id for n in after.nodes}
    hashes = {pipeline_hash(), pipeline_hash(fusions=EVERYTHING), pipeline_hash(fusions=Fusions()),
              pipeline_hash(PassOptions(), Fusions(add_rms_norm=True))}
    assert len(hashes) == 4


def test_cuda_device_graph_of_smollm2_equals_the_generic_graph(smollm2_path):
    """On a real model, CUDA's device phase (every fusion it declares) gives the reference
    interpreter's bits: the logits of a 4-token pass are the generic graph's, and the phase is
    idempotent."""
    from kinetic.codegen.cuda.renderer import FUSIONS
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower
    from kinetic.ir.interpreter import Interpreter
    from kinetic.ir.rows import PassRows
    from kinetic.passes import run_pipeline
    from kinetic.runtime.kv_cache import KVCache, SequenceCaches
    from kinetic.runtime.weights import GGUFWeights

    gguf = open_gguf(smollm2_path)
    graph = run_pipeline(lower(gguf))
    device = lower_for_device(graph, FUSIONS)
    assert lower_for_device(device, FUSIONS) == device
    assert {Op.ADD_RMS_NORM, Op.ROPE_PAIR, Op.QUANTIZE} <= {n.op for n in device.nodes}
    interpreter = Interpreter(GGUFWeights(gguf))
    rows = PassRows.chain([1, 504, 3493, 314], 0)
    widths = {n.attrs.layer: n.attrs.n_kv_head * n.attrs.head_dim for n in graph.nodes if n.op is Op.STATE}
    outs = [interpreter.run(g, rows, SequenceCaches({0: KVCache(widths, 8)})).outputs["logits"]
            for g in (graph, device)]
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    assert print_graph(device).count("add_rms_norm(") == 59


def test_cpu_device_graph_of_smollm2_equals_the_generic_graph(smollm2_path):
    """On a real model, the CPU's device phase adds only quantize nodes (one per row and format: q/k/v
    share one, gate/up one; 4 a layer and the output layer's) and gives the reference interpreter's
    bits: the logits of a 4-token pass are the generic graph's; the phase is idempotent."""
    from kinetic.codegen.cpu.lowering import device_graph
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower
    from kinetic.ir.interpreter import Interpreter
    from kinetic.ir.rows import PassRows
    from kinetic.passes import run_pipeline
    from kinetic.runtime.kv_cache import KVCache, SequenceCaches
    from kinetic.runtime.weights import GGUFWeights

    gguf = open_gguf(smollm2_path)
    graph = run_pipeline(lower(gguf))
    device = device_graph(graph)
    assert device_graph(device) == device
    added = [n for n in device.nodes if n.id not in {m.id for m in graph.nodes}]
    assert {n.op for n in added} == {Op.QUANTIZE} and len(added) == 4 * 30 + 1
    assert not quantized_in_producer(device)
    interpreter = Interpreter(GGUFWeights(gguf))
    rows = PassRows.chain([1, 504, 3493, 314], 0)
    widths = {n.attrs.layer: n.attrs.n_kv_head * n.attrs.head_dim for n in graph.nodes if n.op is Op.STATE}
    outs = [interpreter.run(g, rows, SequenceCaches({0: KVCache(widths, 8)})).outputs["logits"]
            for g in (graph, device)]
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
