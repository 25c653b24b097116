"""Batch invariance, op x device x row count: for every op with a kernel on a device (the reference,
the CPU's compiled step, the CUDA kernels on their host emulation, Vulkan on lavapipe), a small
random graph of that op run as one pass of 1, 2, 3, 8 and 17 rows gives every row the bits the same
row gets alone (one row per pass, after the rows before it: the same keys for attention).

Each case is a graph: a Q8_0 embedding of random tokens (the one table every device looks up), the
op under test, then the output rows. A device whose `unsupported` refuses a case is skipped with its
reason; the completeness test keeps every op of the table in the matrix."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic import devices
from kinetic.ir.ops import LEAVES, OPS
from kinetic.ir.rows import PassRows
from kinetic.ir.text import parse_graph
from kinetic.passes import PassOptions, lower_for_device, run_pipeline
from kinetic.runtime.engine import Engine
from tests.device_checks import same_bits
from tests.random_tensors import random_tensor

ROW_COUNTS = (1, 2, 3, 8, 17)
VOCAB = 24
DEVICES = ("reference", "cpu", "cuda-emulated", "vulkan")



@dataclass(frozen=True)
class Case:
    """One op's graph: `body` reads the embedding %4 (f32[T, width]) and the positions %1, defines the
    node under test as %9 (f32[T, out]) and may use ids %5..%8 and %10..%19; `params` names the extra
    weights (tensor -> (type, shape))."""

    width: int
    out: int
    body: str
    params: tuple[tuple[str, Q, tuple[int, ...]], ...] = ()
    numerics: str = "ggml"  # the pipeline's numerics mode (kinetic/ir/orders.py NUMERICS)

    def text(self) -> str:
        return f"""
%0 = input() {{name="tokens"}} : i32[T]
%1 = input() {{name="positions"}} : i32[T]
%2 = input() {{name="output_rows"}} : i32[R]
%3 = param() {{tensor="token_embd.weight"}} : q8_0[{VOCAB},{self.width}]
%4 = embed(%3, %0) : f32[T,{self.width}]
{self.body.strip()}
%20 = take_rows(%9, %2) : f32[R,{self.out}]
output logits = %20
"""


def _matmul(wtype: Q, k: int, n: int, activations: str = "q8", numerics: str = "ggml") -> Case:
    return Case(k, n, f"""
%5 = param() {{tensor="w"}} : {wtype.name.lower()}[{n},{k}]
%9 = matmul(%4, %5) {{activations="{activations}"}} : f32[T,{n}]""", (("w", wtype, (n, k)),), numerics)


def _unary(op: str, attrs: str = "") -> Case:
    return Case(64, 64, f"%9 = {op}(%4){attrs} : f32[T,64]")


def _binary(op: str) -> Case:  # the second operand: another embedding of the same tokens
    return Case(64, 64, f"""
%5 = param() {{tensor="other"}} : q8_0[{VOCAB},64]
%6 = embed(%5, %0) : f32[T,64]
%9 = {op}(%4, %6) : f32[T,64]""", (("other", Q.Q8_0, (VOCAB, 64)),))


def _attention(attrs: str = "", n_head: int = 2, n_kv: int = 1, head_dim: int = 64) -> Case:
    """q from the embedding, keys and values from two other embeddings of the same tokens."""
    kv = n_kv * head_dim
    return Case(n_head * head_dim, n_head * head_dim, f"""
%5 = param() {{tensor="k"}} : q8_0[{VOCAB},{kv}]
%6 = embed(%5, %0) : f32[T,{kv}]
%7 = param() {{tensor="v"}} : q8_0[{VOCAB},{kv}]
%8 = embed(%7, %0) : f32[T,{kv}]
%10 = state() {{name="kv.0", layer=0, n_kv_head={n_kv}, head_dim={head_dim}}} : kv[]
%9 = attention(%4, %6, %8, %10) {{n_head={n_head}, n_kv_head={n_kv}, head_dim={head_dim}, scale=0.125{attrs}}} \
: f32[T,{n_head * head_dim}]""", (("k", Q.Q8_0, (VOCAB, kv)), ("v", Q.Q8_0, (VOCAB, kv))))


CASES: dict[str, Case] = {
    "embed": Case(64, 64, "%9 = embed(%3, %0) : f32[T,64]"),  # the lookup alone (take_rows ends every case)
    "concat": Case(64, 128, f"""
%5 = param() {{tensor="other"}} : q8_0[{VOCAB},64]
%6 = embed(%5, %0) : f32[T,64]
%9 = concat(%4, %6) : f32[T,128]""", (("other", Q.Q8_0, (VOCAB, 64)),)),  # a prediction block's joined rows
    "matmul_q8_0": _matmul(Q.Q8_0, 64, 40),  # lanes8
    "matmul_q4_0": _matmul(Q.Q4_0, 64, 40),  # block_chain
    "matmul_q4_1": _matmul(Q.Q4_1, 64, 40),  # lanes8 with Q8_1 activations
    "matmul_q5_0": _matmul(Q.Q5_0, 64, 40),  # lanes8, a fifth bit per value
    "matmul_q5_1": _matmul(Q.Q5_1, 64, 40),  # lanes8 with Q8_1 activations and a fifth bit
    "matmul_iq4_nl": _matmul(Q.IQ4_NL, 64, 40),  # block_chain through the IQ4_NL codebook
    "matmul_q4_k": _matmul(Q.Q4_K, 256, 12),  # block_chain over super-blocks
    "matmul_q6_k": _matmul(Q.Q6_K, 256, 12),  # lanes8 over super-blocks
    "matmul_q5_k": _matmul(Q.Q5_K, 256, 12),  # lanes8 over super-blocks, with minimums
    "matmul_q3_k": _matmul(Q.Q3_K, 256, 12),  # lanes8 over super-blocks
    "matmul_q2_k": _matmul(Q.Q2_K, 256, 12),  # block_chain over super-blocks, with minimums
    "matmul_f16": _matmul(Q.F16, 96, 20),  # lanes64 with a tail of 32
    "matmul_bf16": _matmul(Q.BF16, 96, 20),  # bf16_pairs
    "matmul_f32": _matmul(Q.F32, 96, 20),  # lanes64, F32's vectorized tail
    "matmul_float_path": _matmul(Q.Q8_0, 64, 40, activations="f32"),  # dequant_matvec
    # the fast numerics mode: block_chain where the ggml order is lanes8
    "matmul_q8_0_fast": _matmul(Q.Q8_0, 64, 40, numerics="fast"),
    "matmul_q4_1_fast": _matmul(Q.Q4_1, 64, 40, numerics="fast"),
    "matmul_q5_0_fast": _matmul(Q.Q5_0, 64, 40, numerics="fast"),
    "matmul_q5_1_fast": _matmul(Q.Q5_1, 64, 40, numerics="fast"),
    "rms_norm": Case(64, 64, """
%5 = param() {tensor="norm"} : f32[64]
%9 = rms_norm(%4, %5) {eps=1e-06} : f32[T,64]""", (("norm", Q.F32, (64,)),)),
    "rms_norm_group": _unary("rms_norm", " {eps=1e-05, group=32}"),
    "layer_norm": Case(64, 64, """
%5 = param() {tensor="norm"} : f32[64]
%9 = layer_norm(%4, %5) {eps=1e-12} : f32[T,64]""", (("norm", Q.F32, (64,)),)),
    "layer_norm_tail": Case(96, 88, """
%5 = columns(%4) {start=0, count=88} : f32[T,88]
%9 = layer_norm(%5) {eps=1e-05} : f32[T,88]"""),  # 5 chunks of 16 and a tail of 8, no weight
    "add_rms_norm": Case(64, 64, f"""
%5 = param() {{tensor="other"}} : q8_0[{VOCAB},64]
%6 = embed(%5, %0) : f32[T,64]
%7 = add(%4, %6) : f32[T,64]
%8 = param() {{tensor="norm"}} : f32[64]
%9 = rms_norm(%7, %8) {{eps=1e-06}} : f32[T,64]""", (("other", Q.Q8_0, (VOCAB, 64)), ("norm", Q.F32, (64,)))),
    "rope_neox": Case(64, 64, "%9 = rope(%4, %1) {n_head=2, head_dim=32, n_rot=32, theta=10000.0, neox=true} "
                              ": f32[T,64]"),
    "rope_pairs": Case(64, 64, "%9 = rope(%4, %1) {n_head=2, head_dim=32, n_rot=16, theta=500000.0, neox=false} "
                               ": f32[T,64]"),
    "rope_linear": Case(64, 64, "%9 = rope(%4, %1) {n_head=2, head_dim=32, n_rot=32, theta=10000.0, neox=true, "
                                "freq_scale=0.25} : f32[T,64]"),
    "rope_yarn_freqs": Case(64, 64, "%9 = rope(%4, %1) {n_head=2, head_dim=32, n_rot=16, theta=10000.0, neox=false, "
                                    "freq_scale=0.25, yarn_orig_ctx=64, yarn_ext_factor=1.0, yarn_attn_factor=0.9, "
                                    "freq_factors=[1.0, 1.0, 1.5, 2.0, 4.0, 8.0, 8.0, 1e+30]} : f32[T,64]"),
    "attention": _attention(),
    "rope_pair": Case(128, 128, f"""
%5 = param() {{tensor="k"}} : q8_0[{VOCAB},64]
%6 = embed(%5, %0) : f32[T,64]
%7 = param() {{tensor="v"}} : q8_0[{VOCAB},64]
%8 = embed(%7, %0) : f32[T,64]
%10 = state() {{name="kv.0", layer=0, n_kv_head=1, head_dim=64}} : kv[]
%11 = rope(%4, %1) {{n_head=2, head_dim=64, n_rot=64, theta=10000.0, neox=true}} : f32[T,128]
%12 = rope(%6, %1) {{n_head=1, head_dim=64, n_rot=64, theta=10000.0, neox=true}} : f32[T,64]
%9 = attention(%11, %12, %8, %10) {{n_head=2, n_kv_head=1, head_dim=64, scale=0.125}} : f32[T,128]""",
                      (("k", Q.Q8_0, (VOCAB, 64)), ("v", Q.Q8_0, (VOCAB, 64)))),  # q and k rotations, paired
    "attention_window": _attention(", window=5", n_head=2, n_kv=2),
    "attention_softcap": _attention(", softcap=30.0"),
    "attention_f32_cache": _attention(', kv_dtype="f32"'),
    # the fast numerics mode: key_chain_f16_acc32 (an f32 accumulator over the f16 cache)
    "attention_fast": replace(_attention(", window=5", n_head=4, n_kv=2), numerics="fast"),
    "attention_softcap_fast": replace(_attention(", softcap=30.0", head_dim=128), numerics="fast"),
    "add": _binary("add"),
    "add_bias": Case(64, 64, """
%5 = param() {tensor="bias"} : f32[64]
%9 = add_bias(%4, %5) : f32[T,64]""", (("bias", Q.F32, (64,)),)),
    "mul": _binary("mul"),
    "swiglu": _binary("swiglu"),
    "geglu": _binary("geglu"),
    "scale": _unary("scale", " {factor=0.3}"),
    "silu": _unary("silu"),
    "gelu": _unary("gelu"),
    "softcap": _unary("softcap", " {cap=1.5}"),
    "columns": Case(64, 24, "%9 = columns(%4) {start=40, count=24} : f32[T,24]"),  # a range of each row
    "short_conv": Case(64, 64, """
%5 = param() {tensor="conv"} : f32[64,20]
%6 = recurrent_state() {name="conv.0", layer=0} : rs[19,64]
%9 = short_conv(%4, %5, %6) : f32[T,64]""", (("conv", Q.F32, (64, 20)),)),  # 16 rounded taps, 4 fused
    "ssm_scan": Case(224, 64, """
%5 = columns(%4) {start=0, count=64} : f32[T,64]
%6 = columns(%4) {start=64, count=2} : f32[T,2]
%7 = columns(%4) {start=66, count=64} : f32[T,64]
%8 = columns(%4) {start=130, count=64} : f32[T,64]
%10 = param() {tensor="a"} : f32[2,1]
%11 = param() {tensor="d"} : f32[2,1]
%12 = recurrent_state() {name="ssm.0", layer=0} : rs[64,64]
%9 = ssm_scan(%5, %6, %10, %7, %8, %11, %12) {n_head=2, head_dim=32, n_group=1, d_state=64} : f32[T,64]""",
                     (("a", Q.F32, (2, 1)), ("d", Q.F32, (2, 1)))),  # x, dt, B, C: columns of one row
    "delta_rule": Case(160, 64, """
%5 = columns(%4) {start=0, count=32} : f32[T,32]
%6 = columns(%4) {start=32, count=32} : f32[T,32]
%7 = columns(%4) {start=64, count=64} : f32[T,64]
%8 = columns(%4) {start=128, count=2} : f32[T,2]
%10 = columns(%4) {start=130, count=2} : f32[T,2]
%11 = param() {tensor="a"} : f32[2]
%12 = recurrent_state() {name="delta.0", layer=0} : rs[64,32]
%13 = rms_norm(%5) {eps=1e-06, group=32} : f32[T,32]
%14 = rms_norm(%6) {eps=1e-06, group=32} : f32[T,32]
%9 = delta_rule(%13, %14, %7, %8, %10, %11, %12) {n_k_head=1, n_v_head=2, head_dim=32} : f32[T,64]""",
                       (("a", Q.F32, (2,)),)),  # q, k (normed), v, alpha, beta: columns of one row
    "head_columns": Case(128, 64, "%9 = head_columns(%4) {n_head=2, stride=64, start=32, count=32} : f32[T,64]"),
    "sigmoid": _unary("sigmoid"),
    "moe": Case(64, 64, """
%5 = param() {tensor="router"} : f32[6,64]
%6 = matmul(%4, %5) {activations="q8"} : f32[T,6]
%7 = moe_gate(%6) {gating="softmax"} : f32[T,6]
%8 = moe_select(%7) {n_used=2} : i32[T,2]
%10 = moe_weights(%7, %8) {normalize=true, scale=0.0} : f32[T,2]
%11 = param() {tensor="gate_exps"} : f16[6,32,64]
%12 = param() {tensor="up_exps"} : f16[6,32,64]
%13 = param() {tensor="down_exps"} : f16[6,64,32]
%14 = moe_matmul(%4, %11, %8) {activations="q8"} : f32[T,64]
%15 = moe_matmul(%4, %12, %8) {activations="q8"} : f32[T,64]
%16 = swiglu(%14, %15) : f32[T,64]
%17 = moe_matmul(%16, %13, %8) {activations="q8"} : f32[T,128]
%9 = moe_sum(%17, %10) : f32[T,64]""", (("router", Q.F32, (6, 64)), ("gate_exps", Q.F16, (6, 32, 64)),
                                         ("up_exps", Q.F16, (6, 32, 64)), ("down_exps", Q.F16, (6, 64, 32)))),
}


class RandomWeights:
    """A WeightSource of random tensors stored as a GGUF file holds them: quantized types as raw
    blocks [rows, row_bytes] with small f16 scales, F16 and F32 as typed arrays, BF16 as uint16."""

    def __init__(self, case: Case, seed: int = 0):
        rng = np.random.default_rng(seed)
        specs = (("token_embd.weight", Q.Q8_0, (VOCAB, case.width)),) + case.params
        self.arrays = {name: random_tensor(rng, t, shape) for name, t, shape in specs}

    def tensor(self, name: str) -> np.ndarray:
        return self.arrays[name]


def test_every_op_is_in_the_matrix():
    """Each op of the table that computes (every op but the leaves) is in a case's graph as written,
    after the pipeline (fusions) or after the device phase (device forms: CUDA declares every one;
    each device runs the graph its own phase makes). A new op is not batch-invariant by omission."""
    from kinetic.codegen.cuda.renderer import FUSIONS

    tested = set()
    for case in CASES.values():
        graphs = [parse_graph(case.text())]
        graphs.append(run_pipeline(graphs[0]))
        graphs.append(lower_for_device(graphs[1], FUSIONS))
        tested |= {n.op for g in graphs for n in g.nodes}
    assert set(OPS) - LEAVES <= tested


def _engine(case_name: str, device: str) -> Engine:
    d = devices.DEVICES[device]
    if d.unavailable():
        pytest.skip(f"{device}: {d.unavailable()}")
    case = CASES[case_name]
    graph = run_pipeline(parse_graph(case.text()), PassOptions(numerics=case.numerics))
    reason = d.unsupported(graph)
    if reason:
        pytest.skip(f"{device} has no kernel for this case: {reason}")
    return Engine(graph, RandomWeights(case), n_ctx=32, batch=8, device=device, threads=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case_name", sorted(CASES))
def test_a_row_in_a_pass_of_n_rows_equals_the_row_alone(case_name, device):
    """Passes of 1, 2, 3, 8 and 17 rows (one sequence's consecutive tokens) give each row the bits it
    gets in a pass of its own, decoded after the rows before it."""
    engine = _engine(case_name, device)
    try:
        tokens = np.random.default_rng(7).integers(0, VOCAB, max(ROW_COUNTS)).tolist()
        seq = engine.new_sequence()
        alone = np.stack([engine.decode(seq, t) for t in tokens])
        for n in ROW_COUNTS:
            batch = engine.forward(PassRows.chain(tokens[:n], 0, outputs="all"), {0: engine.new_sequence()})
            for row in range(n):
                assert same_bits(batch[row], alone[row]), f"{n} rows: row {row} differs from the row alone"
    finally:
        engine.close()


def _pass_logits(case_name: str, device: str, tokens: list[int]) -> np.ndarray:
    """The case's outputs on `device` for one pass of `tokens`, every row an output."""
    engine = _engine(case_name, device)
    try:
        return engine.forward(PassRows.chain(tokens, 0, outputs="all"), {0: engine.new_sequence()})
    finally:
        engine.close()


@pytest.mark.parametrize("case_name", ["add_bias", "columns"])
@pytest.mark.parametrize("device", DEVICES[1:])
def test_add_bias_and_columns_on_every_device_are_the_reference(device, case_name):
    """add_bias (one f32 add a value) and columns (a copy of part of each row) give the reference
    interpreter's bits on every device, for a pass of 17 rows."""
    tokens = np.random.default_rng(3).integers(0, VOCAB, 17).tolist()
    assert same_bits(*(_pass_logits(case_name, name, tokens) for name in ("reference", device)))


@pytest.mark.parametrize("case_name", ["rope_linear", "rope_yarn_freqs"])
@pytest.mark.parametrize("device", DEVICES[1:])
def test_scaled_rope_on_every_device_is_the_reference(device, case_name):
    """A rotary scaled linearly, and one with YaRN, a magnitude and frequency factors (one of them
    1e30), gives the reference interpreter's bits on every device, for a pass of 17 rows."""
    tokens = np.random.default_rng(4).integers(0, VOCAB, 17).tolist()
    assert same_bits(*(_pass_logits(case_name, name, tokens) for name in ("reference", device)))
