"""Generated F16 / BF16 / F32 matmul kernels (kinetic/codegen/cpu/float_matmul_ir.py): bit for bit
numerics.float_dot (ggml_vec_dot_{f16,bf16,f32}'s order) for any shape, batch, thread count and
variant, and in the compiled step and the op-by-op executor."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu import float_matmul_ir as F
from kinetic.codegen.cpu import tape
from kinetic.codegen.cpu.executor import CpuInterpreter
from kinetic.codegen.cpu.matmul import float_matmul, round_activations
from kinetic.codegen.cpu.step import CompiledStep
from kinetic.codegen.cpu.target import host
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir import numerics as nx
from kinetic.ir.interpreter import Interpreter
from kinetic.ir.ops import Op
from kinetic.ir.quants import dequantize
from kinetic.ir.rows import PassRows
from kinetic.passes import PassOptions, run_pipeline
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.synthetic import synthetic_path

F32 = np.float32
TYPES = [Q.F16, Q.BF16, Q.F32]
HOST_FLAGS = host().flags

# (N, K, M): K not a multiple of 64 (the chunk) or 16 (a vector) and tails that take every branch of
# F32's leftover order (16s, an 8, single fmas); N odd (a repeated last column), over several column
# chunks; M around and off the row tile; K long enough for row tiles to run in 2 or more K blocks
SHAPES = [(1, 1, 1), (37, 31, 5), (600, 100, 1), (129, 576, 70), (600, 1000, 7), (5, 2048, 4), (64, 88, 3),
          (7, 4000, 6)]


def stored(values: np.ndarray, wtype: Q) -> np.ndarray:
    """f32 values -> the weight as a GGUF file stores it (f16, bf16 bit patterns as u16, f32)."""
    if wtype is Q.F16:
        return values.astype(np.float16)
    if wtype is Q.BF16:
        return (nx.quantized_activations(values, "bf16").view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(F32)


def reference(x: np.ndarray, weight: np.ndarray, wtype: Q) -> np.ndarray:
    return nx.matmul(x, nx.DequantizedWeight(weight, wtype))


def case(wtype: Q, n: int, k: int, m: int, seed: int = 0, spread: int = 0):
    """Activations N(0, 3) and weights N(0, 0.05), each value scaled by 2^U(-spread, spread)."""
    rng = np.random.default_rng([seed, n, k, m, int(wtype)])

    def scale(shape):
        return np.exp2(rng.integers(-spread, spread + 1, shape)) if spread else 1.0

    x = (rng.standard_normal((m, k)) * 3 * scale((m, k))).astype(F32)
    w = (rng.standard_normal((n, k)) * 0.05 * scale((n, k))).astype(F32)
    return x, stored(w, wtype)


def same_bits(a: np.ndarray, b: np.ndarray, msg: str = "") -> None:
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=msg)


host_variants = {t: [v for v in F.variants(t) if F.supports(HOST_FLAGS, v)] for t in TYPES}


# -- the reference order ---------------------------------------------------------------------------


def test_f16_order_is_the_attention_scores_dot_f16():
    """F16 weights sum as ggml_vec_dot_f16, the order attention scores already follow (dot_f16)."""
    x, w = case(Q.F16, 9, 200, 3)
    xq = nx.quantized_activations(x, "f16")
    same_bits(nx.float_dot(xq, w.astype(F32), Q.F16), nx.dot_f16(xq[:, None, :], w.astype(F32)[None]))


def test_bf16_steps_flush_subnormal_results_as_vdpbf16ps():
    """BF16: each pair adds its odd element's product first, and a subnormal partial sum becomes 0:
    lane 0 holds 1.5t after the first chunk (t = 2^-126), -t then +t give t, not 1.5t."""
    t = 2.0**-126
    x, w = np.zeros((1, 128), F32), np.zeros((1, 128), F32)
    x[0, 0], w[0, 0] = 1.5, t  # chunk 0: lane 0 = 1.5t
    x[0, 65], w[0, 65], x[0, 64], w[0, 64] = -1.0, t, 1.0, t  # chunk 1: odd -t (-> 0.5t, flushed), even +t
    assert nx.float_dot(x, w, Q.BF16)[0, 0] == F32(t)


def test_f32_leftovers_follow_gcc_s_vector_epilogue():
    """F32, K % 64 = 9: the first 8 leftover products are rounded and added in order, the last one fused."""
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((1, 73)).astype(F32), rng.standard_normal((50, 73)).astype(F32)
    total = nx.float_dot(x[:, :64], w[:, :64], Q.F32)[0]
    for i in range(64, 72):
        total = (total + (x[0, i] * w[:, i]).astype(F32)).astype(F32)
    same_bits(nx.float_dot(x, w, Q.F32)[0], nx.fma_f32(x[0, 72], w[:, 72], total))


def _skip_unless_avx512_build(wtype: Q) -> None:
    """The local llama.cpp build is native, so its float dots take this host's vectors: numerics'
    order is the AVX-512 build's (64 lanes; BF16 with AVX512-BF16), and an AVX2-only build sums F16
    and F32 in 4 x 8 lanes over chunks of 32, BF16 as 2 x 16 (docs/numerics.md): on such a host
    the local build is not the machine class the reference models."""
    needs = {"avx512f"} | ({"avx512bf16"} if wtype is Q.BF16 else set())
    missing = " ".join(sorted(needs - set(HOST_FLAGS)))
    if missing:
        pytest.skip(f"the local llama.cpp build is native to a host without {missing}: "
                    "its float dots sum in another order than the AVX-512 build numerics follows")


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_reference_is_llama_cpps_own_cpu_result(wtype):
    """numerics.matmul is bit for bit llama.cpp's ggml_mul_mat on each activation row alone (its
    decode path: the f32 row converted to the weight's type, then ggml_vec_dot_*), K with and
    without leftovers. Needs the local llama.cpp build (tests/ir/test_quant_dots.py's harness)."""
    from tests.ir.test_quant_dots import LLAMA_CPP_LIB, _Ggml

    if not (LLAMA_CPP_LIB / "libggml-cpu.so").exists():
        pytest.skip(f"no llama.cpp build in {LLAMA_CPP_LIB}")
    _skip_unless_avx512_build(wtype)
    ggml = _Ggml(LLAMA_CPP_LIB)
    for k in (25, 67, 98, 576, 1000):  # F32 leftovers K % 64 = 25, 3, 34, 0, 40: see below
        x, w = case(wtype, 48, k, 4, seed=8, spread=6)
        want = ggml.matmul_rows(x, w.view(np.uint8).reshape(48, -1), wtype, repack=False)
        same_bits(reference(x, w, wtype), want, f"K={k}")


def test_f32_leftovers_of_the_local_build_are_one_of_gcc_s_two_epilogues():
    """ggml_vec_dot_f32's leftover loop is vectorized by GCC, not by ggml's source: a native Zen 4
    build rounds the products up to the last whole 8 of the K % 64 leftovers (numerics' order), a
    native Sapphire Rapids build up to the last whole 4; both fuse the rest. The test above keeps to
    K whose K % 8 < 4, where the two agree; here K % 8 = 7 must give one of the two, and numerics'
    order where the local build is the Zen 4 kind."""
    from tests.ir.test_quant_dots import LLAMA_CPP_LIB, _Ggml

    if not (LLAMA_CPP_LIB / "libggml-cpu.so").exists():
        pytest.skip(f"no llama.cpp build in {LLAMA_CPP_LIB}")
    _skip_unless_avx512_build(Q.F32)
    ggml = _Ggml(LLAMA_CPP_LIB)
    x, w = case(Q.F32, 48, 95, 4, seed=8, spread=6)  # K % 64 = 31: 24 or 28 rounded products, then fmas
    want = ggml.matmul_rows(x, w.view(np.uint8).reshape(48, -1), Q.F32, repack=False)
    ours = reference(x, w, Q.F32)
    total = nx.float_dot(x[:, :64], w[:, :64], Q.F32)
    for i in range(64, 95):
        product = (x[:, None, i] * w[None, :, i]).astype(F32)
        total = (total + product).astype(F32) if i < 64 + 28 else nx.fma_f32(x[:, None, i], w[None, :, i], total)
    by_fours = total
    if not np.array_equal(ours.view(np.uint32), want.view(np.uint32)):
        same_bits(by_fours, want, "the local build follows neither epilogue")


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_activation_rounding_kernel_matches_numerics(jit, fmt):
    """The rounding pass gives numerics.quantized_activations' values: ties to even, overflow to inf,
    subnormals, infinities and a NaN (bf16 keeps it quiet)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4099) * np.exp2(rng.integers(-140, 20, 4099))).astype(F32)
    x[:8] = [np.nan, np.inf, -np.inf, 3.4e38, -0.0, 65520.0, 1 + 2.0**-11, 1 + 3 * 2.0**-8]
    got = round_activations(x[None], Q.F16 if fmt == "f16" else Q.BF16, jit)
    if fmt == "bf16":
        got = (got.astype(np.uint32) << 16).view(F32)
    same_bits(got, nx.quantized_activations(x[None], fmt))


# -- kernels against the reference -----------------------------------------------------------------


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n,k,m", SHAPES)
def test_kernel_equals_reference(jit, wtype, n, k, m):
    """Every output is numerics.matmul's, bit for bit."""
    x, w = case(wtype, n, k, m)
    same_bits(float_matmul(x, w, wtype, jit=jit), reference(x, w, wtype))


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_wide_ranges_and_subnormals(jit, wtype):
    """Values spread over many binades (bf16 and f32: down into the subnormals, where vdpbf16ps
    reads inputs as zero and flushes results): every host variant still gives the reference's bits."""
    spread = {Q.F16: 12, Q.BF16: 60, Q.F32: 60}[wtype]
    x, w = case(wtype, 41, 300, 4, seed=5, spread=spread)
    want = reference(x, w, wtype)
    for variant in host_variants[wtype]:
        same_bits(float_matmul(x, w, wtype, variant=variant, jit=jit), want, variant)


@pytest.mark.parametrize("wtype", [Q.BF16, Q.F32], ids=lambda t: t.name)
def test_sums_through_the_subnormal_range(jit, wtype):
    """Products around 2^-127, so partial sums keep entering the subnormal range (vdpbf16ps flushes
    them, F32 keeps them), and in rows 1-2 subnormal activations against large weights (vdpbf16ps
    reads them as zero): every host variant matches the reference."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((3, 256)) * 2.0**-63).astype(F32)
    w = (rng.standard_normal((40, 256)) * 2.0**-64).astype(F32)
    w[:, ::17] = rng.standard_normal((40, 16)) * 2.0**62
    x[0, ::17] = 0
    x[1:, ::17] = rng.standard_normal((2, 16)) * 2.0**-130
    x, w = nx.quantized_activations(x, wtype.name.lower()), stored(w, wtype)
    want = reference(x, w, wtype)
    assert np.any(want != 0) and np.any(np.abs(want) < 2.0**-126)
    for variant in host_variants[wtype]:
        same_bits(float_matmul(x, w, wtype, variant=variant, jit=jit), want, variant)


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_batch_invariance(jit, wtype):
    """Row r of a 37-row call (12 full tiles and a leftover row) is the 1-row call on row r alone."""
    x, w = case(wtype, 45, 320, 37, seed=1)
    batch = float_matmul(x, w, wtype, jit=jit)
    for r in range(x.shape[0]):
        same_bits(batch[r : r + 1], float_matmul(x[r : r + 1], w, wtype, jit=jit), f"row {r}")


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_thread_count_invariance(jit, wtype):
    """1, 2 and 3 threads (odd column ranges) give the same bits."""
    x, w = case(wtype, 1001, 704, 8, seed=2)  # over several column chunks
    one = float_matmul(x, w, wtype, jit=jit)
    for threads in (2, 3):
        same_bits(float_matmul(x, w, wtype, jit=jit, threads=threads), one, f"{threads=}")


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_variants_are_bit_identical(jit, wtype):
    """Every variant the host runs (vdpbf16ps, AVX-512, AVX2, generic) gives the generic kernel's bits."""
    x, w = case(wtype, 23, 3500, 7, seed=3)  # K blocks in the 3 x 2 tiles
    generic = float_matmul(x, w, wtype, variant="generic", jit=jit)
    for variant in host_variants[wtype]:
        same_bits(float_matmul(x, w, wtype, variant=variant, jit=jit), generic, variant)


@pytest.mark.skipif(not F.supports(HOST_FLAGS, "avx2"), reason="host CPU lacks AVX2")
def test_avx2_variant_uses_no_avx512(jit):
    """The AVX2 variant's attributes keep AVX-512 out of its code (it must run on AVX2-only hosts)."""
    import llvmlite.binding as llvm

    h = host()
    tm = llvm.Target.from_triple(h.triple).create_target_machine(cpu=h.cpu, features=h.features, opt=3)
    for wtype in TYPES:
        ir, _name = F.render_float_matmul(wtype, 640, "avx2", h.features)
        asm = tm.emit_assembly(llvm.parse_assembly(ir))
        assert "zmm" not in asm and "ymm" in asm, wtype.name


def test_rejects_a_weight_of_the_wrong_width(jit):
    """A weight whose row does not hold K values is refused, not read out of bounds."""
    with pytest.raises(ValueError):
        float_matmul(np.zeros((1, 64), F32), np.zeros((4, 32), np.float16), Q.F16, jit=jit)


# -- in the compiled step and the executor ----------------------------------------------------------

# the synthetic llama's matmul weights retyped: both layers' projections in every float type
RETYPE = {"blk.0.attn_q.weight": Q.F32, "blk.0.attn_k.weight": Q.BF16, "blk.0.ffn_up.weight": Q.F16,
          "blk.1.attn_output.weight": Q.F32, "blk.1.ffn_gate.weight": Q.F16, "blk.2.ffn_down.weight": Q.BF16,
          "blk.2.attn_v.weight": Q.F32}


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    """The synthetic llama with F16, BF16 and F32 matmul weights (RETYPE and its own F16/BF16 ones)."""
    src = synthetic_path("llama")
    dst = tmp_path_factory.mktemp("float") / "llama-float.gguf"
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.name in RETYPE:
            values = dequantize(np.asarray(t.data), t.tensor_type).reshape(t.data.shape[0], -1)
            writer.add_tensor(t.name, stored(values, RETYPE[t.name]), raw_dtype=RETYPE[t.name])
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    file = open_gguf(dst)
    return file, run_pipeline(lower(file), PassOptions())


def _logits(engine: Engine, tokens: list[int]) -> np.ndarray:
    return engine.forward(PassRows.chain(tokens, 0, outputs="all"), {0: engine.new_sequence()})


def test_step_runs_every_float_matmul_on_the_tape(float_model):
    """No Python segment is left: each matmul, float ones included, is a kernel call on the tape."""
    file, graph = float_model
    step = Engine(graph, GGUFWeights(file), n_ctx=64, device="cpu", shortlist=False).runner  # the whole graph
    assert isinstance(step, CompiledStep)
    assert all(isinstance(s, tuple) for s in step.segments)
    n_matmuls = sum(node.op is Op.MATMUL for node in graph.nodes)
    assert int((step.tape[:, tape.OP] == tape.OP_MATMUL).sum()) == n_matmuls


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_step_equals_the_reference_on_float_weights(float_model, threads):
    """A prompt pass, then decode steps on more threads than rows (the column-split plan), give the
    reference interpreter's logits bit for bit."""
    file, graph = float_model
    tokens = [(7 * i + 3) % 200 for i in range(9)]
    want = _logits(Engine(graph, GGUFWeights(file), n_ctx=64, device="reference"), tokens)
    engine = Engine(graph, GGUFWeights(file), n_ctx=64, device="cpu", threads=threads)
    seq = engine.new_sequence()
    got = list(engine.forward(PassRows.chain(tokens[:6], 0, outputs="all"), {0: seq}))
    got += [engine.decode(seq, t) for t in tokens[6:]]
    assert np.array_equal(np.stack(got), want)


def test_executor_float_matmuls_equal_the_reference(float_model):
    """The op-by-op executor's float matmuls (kernels) give the reference interpreter's bits."""
    file, graph = float_model
    weights = GGUFWeights(file)
    cpu, ref = CpuInterpreter(weights), Interpreter(weights)
    rng = np.random.default_rng(4)
    checked = 0
    for node in graph.nodes:
        if node.op is Op.MATMUL and graph.node(node.inputs[1]).type.ggml_type in F.FLOAT_TYPES:
            w = graph.node(node.inputs[1])
            x = rng.standard_normal((5, graph.node(node.inputs[0]).type.shape[1])).astype(F32)
            same_bits(cpu.matmul(x, w, node.attrs), ref.matmul(x, w, node.attrs), w.attrs.tensor)
            checked += 1
    assert checked == len(RETYPE) + 2
