"""Generated kernels of Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS and MXFP4 against numerics.matmul (ggml's x86
order, kinetic/ir/quant_dots.py): bit for bit on random and extreme blocks, for every variant, tile,
thread count and shape (N = 1..600, K of one or several blocks, block-32 types at K not a multiple
of 256)."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_kernel_helpers import E8M0_FIELDS, F16_FIELDS, HOST_VARIANTS, assert_bits, random_weight
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.matmul import quantized_matmul
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import BIT_EXACT
from kinetic.ir import numerics

TYPES = [Q.Q2_K, Q.Q3_K, Q.Q5_K, Q.IQ4_XS, Q.IQ4_NL, Q.MXFP4]
# (N, K for super-block types, K for block-32 types, M): M below, at and above the tile of 8
SHAPES = [(1, 256, 32, 1), (7, 768, 96, 2), (37, 1280, 352, 9), (600, 512, 608, 1), (61, 256, 2080, 20)]
SCHEDULES = [(8, 1), (3, 2), (1, 3)]  # (tile, threads)
ids = [t.name for t in TYPES]


def _k(wtype: Q, k256: int, k32: int) -> int:
    return k256 if LAYOUTS[wtype].block == 256 else k32


def _reference(x: np.ndarray, raw: np.ndarray, wtype: Q) -> np.ndarray:
    return numerics.matmul(x, numerics.DequantizedWeight(raw, wtype))


def test_the_new_types_are_trusted_by_the_cpu_device():
    """Every type here is in target.BIT_EXACT (so the compiled step and the CPU executor use its kernel)."""
    assert set(TYPES) <= BIT_EXACT


@pytest.mark.parametrize("wtype", TYPES, ids=ids)
@pytest.mark.parametrize("n,k256,k32,m", SHAPES)
def test_random_blocks_equal_reference_bit_for_bit(jit, wtype, n, k256, k32, m):
    """Random blocks (random scales) and activations: the best variant under every tile and thread
    count gives the reference's bits."""
    k = _k(wtype, k256, k32)
    rng = np.random.default_rng([n, k, m, int(wtype)])
    x = rng.standard_normal((m, k)).astype(np.float32)
    raw = random_weight(rng, wtype, n, k)
    want = _reference(x, raw, wtype)
    for tile, threads in SCHEDULES:
        got = quantized_matmul(x, raw, wtype, jit=jit, tile=tile, threads=threads)
        assert_bits(got, want, f"{wtype.name} {tile=} {threads=}")


def _extreme_weight(rng: np.random.Generator, wtype: Q, n: int, k: int) -> np.ndarray:
    """Random blocks, with whole blocks replaced by: all zero bytes (scale 0), all 0xFF quants with
    the largest f16 scales, all zero quants (IQ4's -127, Q3_K's -4) with tiny subnormal f16 scales;
    MXFP4 exponents over 0 (subnormal), 1, 2 and up to 2^72."""
    layout = LAYOUTS[wtype]
    raw = random_weight(rng, wtype, n, k)
    blocks = raw.reshape(n, k // layout.block, layout.block_bytes)
    kind = rng.integers(0, 4, blocks.shape[:2])
    blocks[kind == 1] = 0
    blocks[kind == 2] = 0xFF
    blocks[kind == 3] = 0
    for off in F16_FIELDS[wtype]:
        for sel, value in ((kind == 2, 60000.0), (kind == 3, 6e-8)):
            sign = np.where(rng.integers(0, 2, blocks.shape[:2]) == 0, 1.0, -1.0)[sel]
            blocks[sel, off : off + 2] = (sign * value).astype(np.float16).view(np.uint8).reshape(-1, 2)
    for off in E8M0_FIELDS.get(wtype, ()):
        blocks[kind == 2, off] = 200
        blocks[kind == 3, off] = rng.choice([0, 1, 2], int((kind == 3).sum()))
    return blocks.reshape(n, -1)


def _extreme_activations(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """Rows: all zero, all one (every quant at +-127: the largest pair sums against IQ4's -127
    weights), large alternating signs, random of mixed magnitudes."""
    x = rng.standard_normal((m, k)).astype(np.float32) * np.float32(10.0) ** rng.integers(-6, 6, (m, 1))
    x[0] = 0
    x[1] = 1
    x[2] = np.where(np.arange(k) % 2 == 0, 3e4, -3e4)
    return x.astype(np.float32)


@pytest.mark.parametrize("wtype", TYPES, ids=ids)
def test_extreme_blocks_equal_reference_in_every_variant(jit, wtype):
    """Zero blocks, saturated quants with the largest scales, subnormal scales, extreme activations:
    every variant the host runs, tiled and row by row, gives the reference's bits (no 16-bit
    saturation in pmaddubsw, conversions and fmas as the reference's)."""
    n, k, m = 29, _k(wtype, 768, 352), 11
    rng = np.random.default_rng(int(wtype))
    raw = _extreme_weight(rng, wtype, n, k)
    x = _extreme_activations(rng, m, k)
    want = _reference(x, raw, wtype)
    assert np.isfinite(want).all()
    for variant in HOST_VARIANTS:
        for tile, threads in [(8, 2), (1, 1)]:
            got = quantized_matmul(x, raw, wtype, jit=jit, variant=variant, tile=tile, threads=threads)
            assert_bits(got, want, f"{wtype.name} {variant} {tile=} {threads=}")


@pytest.mark.parametrize("wtype", TYPES, ids=ids)
def test_variants_equal_reference_at_awkward_shapes(jit, wtype):
    """AVX2, AVX-512 VNNI and generic kernels give the same bits as the reference with N not a
    multiple of the column group (1, 2, 3 columns left) and M leaving rows after the tiles."""
    k = _k(wtype, 512, 608)
    rng = np.random.default_rng([7, int(wtype)])
    for n in (1, 2, 3, 13):
        x = rng.standard_normal((10, k)).astype(np.float32)
        raw = random_weight(rng, wtype, n, k)
        want = _reference(x, raw, wtype)
        for variant in HOST_VARIANTS:
            got = quantized_matmul(x, raw, wtype, jit=jit, variant=variant)
            assert_bits(got, want, f"{wtype.name} {variant} {n=}")


@pytest.mark.parametrize("wtype", TYPES, ids=ids)
def test_rows_alone_equal_rows_in_a_batch(jit, wtype):
    """Each row of a 19-row call (two tiles and three leftover rows, over 1-3 threads) is bit for bit
    the row computed alone, over weights of several ~128 KB column chunks."""
    k = _k(wtype, 2048, 2048)
    rng = np.random.default_rng([11, int(wtype)])
    n = 300 if LAYOUTS[wtype].block == 32 else 1001  # rows of 1.1 KB (block-32) or 0.7-1.4 KB
    x = rng.standard_normal((19, k)).astype(np.float32)
    raw = random_weight(rng, wtype, n, k)
    alone = np.concatenate([quantized_matmul(x[r : r + 1], raw, wtype, jit=jit) for r in range(19)])
    for threads in (1, 2, 3):
        got = quantized_matmul(x, raw, wtype, jit=jit, threads=threads)
        assert_bits(got, alone, f"{wtype.name} {threads=}")
    assert_bits(alone, _reference(x, raw, wtype), f"{wtype.name} reference")


# -- the compiled step on a synthetic model with these weight types ------------------------------------

RETYPED = {  # tensor of the synthetic llama -> the type its random blocks take
    "blk.0.attn_q.weight": Q.Q2_K, "blk.0.attn_k.weight": Q.Q3_K, "blk.0.attn_v.weight": Q.IQ4_XS,
    "blk.0.attn_output.weight": Q.Q5_K, "blk.0.ffn_up.weight": Q.IQ4_NL, "blk.0.ffn_down.weight": Q.MXFP4,
    "blk.1.attn_q.weight": Q.IQ4_NL, "blk.1.ffn_down.weight": Q.Q2_K, "blk.2.ffn_up.weight": Q.Q3_K,
}


def _retyped_llama(dst):
    """The synthetic llama GGUF with the RETYPED weights replaced by random blocks of small scale."""
    import gguf

    from tests.synthetic import synthetic_path

    reader = gguf.GGUFReader(synthetic_path("llama"))
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    rng = np.random.default_rng(23)
    for t in reader.tensors:
        wtype = RETYPED.get(t.name)
        if wtype is None:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
            continue
        k, n = (int(v) for v in t.shape)
        raw = random_weight(rng, wtype, n, k)
        blocks = raw.reshape(n, k // LAYOUTS[wtype].block, -1)
        for off in F16_FIELDS[wtype]:  # smaller scales than random_weight's: activations stay tame
            d = (rng.standard_normal(blocks.shape[:2]) * 0.003).astype(np.float16)
            blocks[:, :, off : off + 2] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
        writer.add_tensor(t.name, blocks.reshape(n, -1), raw_dtype=wtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_compiled_step_with_these_types_equals_the_reference(tmp_path):
    """A synthetic llama whose projections are Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS and MXFP4: the compiled
    step's logits for a 12-token prompt are the reference interpreter's, bit for bit, and these
    weights add no Python segment (their matmuls run as generated kernels)."""
    from kinetic.codegen.cpu.step import CompiledStep
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower
    from kinetic.ir.rows import PassRows
    from kinetic.passes import PassOptions, run_pipeline
    from kinetic.runtime.engine import Engine
    from kinetic.runtime.weights import GGUFWeights
    from tests.synthetic import synthetic_path

    def engine(path, device):
        gguf = open_gguf(path)
        graph = run_pipeline(lower(gguf), PassOptions())
        return Engine(graph, GGUFWeights(gguf), n_ctx=64, device=device)

    path = _retyped_llama(tmp_path / "retyped.gguf")
    tokens = [2, 104, 175, 82, 49, 114, 42, 30, 198, 198, 4, 17]
    logits = {}
    for device in ("cpu", "reference"):
        e = engine(path, device)
        logits[device] = e.forward(PassRows.chain(tokens, 0, outputs="all"), {0: e.new_sequence()})
    assert np.isfinite(logits["reference"]).all()
    assert np.array_equal(logits["cpu"].view(np.uint32), logits["reference"].view(np.uint32))
    step, original = engine(path, "cpu").runner, engine(synthetic_path("llama"), "cpu").runner
    assert isinstance(step, CompiledStep)
    python = [sum(not isinstance(s, tuple) for s in e.segments) for e in (step, original)]
    assert python[0] == python[1]
