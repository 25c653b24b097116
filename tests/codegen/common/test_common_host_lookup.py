"""Embedding lookups on the CUDA emulation and Vulkan for every table type the reference dequantizes
(common/host_lookup.py: the host's rows where a device has no lookup kernel, the device's kernel
where it has one), against the reference interpreter bit for bit; the tables only host lookups read
stay off the device; whole models whose token table has no lookup kernel run as on the reference."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic import devices
from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.graph import Graph
from kinetic.ir.ops import Op
from kinetic.ir.quants import QUANT_TYPES
from kinetic.ir.rows import PassRows
from kinetic.ir.text import parse_graph
from kinetic.passes import run_pipeline
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.conftest import device_passes
from tests.device_checks import same_bits
from tests.random_tensors import random_tensor
from tests.synthetic import synthetic_path

DEVICES = ("cuda-emulated", "vulkan")
VOCAB, WIDTH = 40, 256  # 256: whole blocks of every type
TOKENS = [7, 7, 0, VOCAB - 1, 7, 3, 3, 12, 39, 0, 21, 7, 5, 5, 30, 1, 7]  # 17, with repeats
ROW_COUNTS = (1, 3, 17)
# byte offsets of the f16 scale fields of each block layout (ggml-common.h), set to small values so
# that every value is finite; MXFP4's scale is an e8m0 byte at 0
F16_FIELDS = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.IQ4_NL: (0,),
              Q.IQ4_XS: (0,), Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
              Q.IQ3_S: (0,), Q.IQ3_XXS: (0,), Q.IQ2_S: (0,), Q.IQ2_XS: (0,), Q.IQ2_XXS: (0,), Q.IQ1_S: (0,),
              Q.IQ1_M: (), Q.TQ2_0: (64,), Q.TQ1_0: (52,), Q.MXFP4: ()}
TYPES = sorted(QUANT_TYPES, key=lambda t: t.name)


def random_table(rng: np.random.Generator, wtype: Q, rows: int, width: int) -> np.ndarray:
    """A table as a GGUF file holds it: float types typed, the others random blocks whose scales are
    small f16 values (every other byte pattern is a valid encoding)."""
    if QUANT_TYPES[wtype].block == 1:
        return random_tensor(rng, wtype, (rows, width))
    facts = QUANT_TYPES[wtype]
    blocks = rng.integers(0, 256, (rows, width // facts.block, facts.block_bytes), dtype=np.uint8)
    for at in F16_FIELDS[wtype]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.02).astype(np.float16)
        blocks[:, :, at : at + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    if wtype is Q.MXFP4:
        blocks[:, :, 0] = rng.integers(118, 130, blocks.shape[:2])
    return blocks.reshape(rows, -1)


class Tables:
    """A WeightSource of named tensors."""

    def __init__(self, **arrays: np.ndarray):
        self.arrays = arrays

    def tensor(self, name: str) -> np.ndarray:
        return self.arrays[name]


def lookup_graph(wtype: Q, *, tied: bool = False) -> Graph:
    """tokens -> embed of a `wtype` table -> every row out (tied: the rows times the table too, as a
    tied output layer reads it)."""
    dtype = wtype.name.lower()
    out = (f'%5 = matmul(%4, %3) {{activations="q8"}} : f32[T,{VOCAB}]\n%6 = take_rows(%5, %2) : f32[R,{VOCAB}]'
           if tied else f"%6 = take_rows(%4, %2) : f32[R,{WIDTH}]")
    return run_pipeline(parse_graph(f"""
%0 = input() {{name="tokens"}} : i32[T]
%2 = input() {{name="output_rows"}} : i32[R]
%3 = param() {{tensor="token_embd.weight"}} : {dtype}[{VOCAB},{WIDTH}]
%4 = embed(%3, %0) : f32[T,{WIDTH}]
{out}
output logits = %6
"""))


def engine_on(device: str, graph: Graph, weights) -> Engine:
    d = devices.DEVICES[device]
    if d.unavailable():
        pytest.skip(f"{device}: {d.unavailable()}")
    assert d.unsupported(graph) is None, d.unsupported(graph)
    return Engine(graph, weights, n_ctx=32, device=device, threads=1)


def passes(engine: Engine) -> list[np.ndarray]:
    """Passes of 1, 3 and 17 rows, then single rows one after another in one sequence (one pass shape,
    replayed: a recorded CUDA graph reads the ids staged for each replay)."""
    got = [engine.forward(PassRows.chain(TOKENS[:n], 0, outputs="all"), {0: engine.new_sequence()})
           for n in ROW_COUNTS]
    seq = engine.new_sequence()
    return got + [np.stack([engine.decode(seq, t) for t in TOKENS[-5:]])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_a_lookup_gives_the_reference_rows(device, wtype):
    """A lookup from a table of this type gives the reference's rows bit for bit in passes of 1, 3 and
    17 rows with repeated ids, and in one-row passes replayed with other ids."""
    weights = Tables(**{"token_embd.weight": random_table(np.random.default_rng(3), wtype, VOCAB, WIDTH)})
    graph = lookup_graph(wtype)
    want = passes(Engine(graph, weights, n_ctx=32, device="reference"))
    assert all(np.isfinite(w).all() for w in want)
    engine = engine_on(device, graph, weights)
    try:
        got = passes(engine)
    finally:
        engine.close()
    assert all(same_bits(g, w) for g, w in zip(got, want, strict=True))


def _runner(engine: Engine):
    return engine.runner.gpu if hasattr(engine.runner, "gpu") else engine.runner


def _uploaded(engine: Engine) -> set[str]:
    runner = _runner(engine)
    return set(runner.weights) | set(getattr(runner, "parts", {}))


@pytest.mark.parametrize("device", DEVICES)
def test_a_table_only_host_lookups_read_is_not_uploaded(device):
    """An untied IQ4_NL table (no lookup kernel on either device) stays on the host; a tied Q4_0 table
    (no lookup kernel, a matmul kernel) is uploaded for the output layer and still looked up by the
    host, the logits the reference's."""
    rng = np.random.default_rng(4)
    untied = Tables(**{"token_embd.weight": random_table(rng, Q.IQ4_NL, VOCAB, WIDTH)})
    engine = engine_on(device, lookup_graph(Q.IQ4_NL), untied)
    try:
        assert list(_runner(engine).host_lookups) and "token_embd.weight" not in _uploaded(engine)
    finally:
        engine.close()
    tied = Tables(**{"token_embd.weight": random_table(rng, Q.Q4_0, VOCAB, WIDTH)})
    graph = lookup_graph(Q.Q4_0, tied=True)
    want = passes(Engine(graph, tied, n_ctx=32, device="reference"))
    engine = engine_on(device, graph, tied)
    try:
        assert list(_runner(engine).host_lookups) and "token_embd.weight" in _uploaded(engine)
        assert all(same_bits(g, w) for g, w in zip(passes(engine), want, strict=True))
    finally:
        engine.close()



@pytest.mark.parametrize("device", DEVICES)
def test_an_id_outside_the_table_is_refused(device):
    """A token id past the table or below zero is a KineticError naming the vocabulary, not a row read
    from elsewhere (numpy would wrap a negative index), and the sequence is untouched."""
    weights = Tables(**{"token_embd.weight": random_table(np.random.default_rng(8), Q.IQ4_NL, VOCAB, WIDTH)})
    engine = engine_on(device, lookup_graph(Q.IQ4_NL), weights)
    try:
        seq = engine.new_sequence()
        for bad in ([5, VOCAB], [-1]):
            with pytest.raises(KineticError, match="outside the vocabulary"):
                engine.prefill(seq, bad)
        assert seq.cache.length == 0
    finally:
        engine.close()


class _Retabled:
    """A synthetic file's weights with its token table replaced by a random table."""

    def __init__(self, weights: GGUFWeights, table: np.ndarray):
        self.weights, self.table = weights, table

    def tensor(self, name: str) -> np.ndarray:
        return self.table if name == "token_embd.weight" else self.weights.tensor(name)


def _retabled_model(name: str, wtype: Q, device: str) -> tuple[Graph, _Retabled]:
    """The synthetic file `name`'s graph for `device` (its default numerics mode) with its token table
    retyped to `wtype` (random values)."""
    gguf = open_gguf(synthetic_path(name))
    graph = lower(gguf)
    nodes = list(graph.nodes)
    (table,) = [n for n in nodes if n.op is Op.PARAM and n.attrs.tensor == "token_embd.weight"]
    nodes[table.id] = replace(table, type=replace(table.type, dtype=wtype.name.lower()))
    n_vocab, width = (int(d) for d in table.type.shape)
    new = random_table(np.random.default_rng(6), wtype, n_vocab, width)
    graph = run_pipeline(Graph(tuple(nodes), graph.outputs, graph.meta), device_passes(device))
    return graph, _Retabled(GGUFWeights(gguf), new)


def _prompt_and_step(engine: Engine) -> np.ndarray:
    """The logits of a 5-token prompt in one pass, then of one greedy decode step."""
    try:
        seq = engine.new_sequence()
        rows = [*engine.forward(PassRows.chain([504, 1575, 282, 649, 314], 0, outputs="all"), {0: seq})]
        rows.append(engine.decode(seq, int(np.argmax(rows[-1]))))
        return np.stack(rows)
    finally:
        engine.close()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("name", "wtype"), [("llama-mha", Q.IQ4_XS), ("qwen2-gqa4", Q.Q5_0)],
                         ids=["llama-mha-IQ4_XS", "qwen2-gqa4-Q5_0"])
def test_a_model_whose_table_has_no_lookup_kernel_runs_as_on_the_reference(device, name, wtype):
    """A whole model with its token table looked up by the host (llama-mha's untied table as IQ4_XS,
    qwen2-gqa4's tied one as Q5_0, which its output layer multiplies by too) gives the reference's
    logits bit for bit for a prompt pass and a decode step."""
    graph, weights = _retabled_model(name, wtype, device)
    want = _prompt_and_step(Engine(graph, weights, n_ctx=32, device="reference"))
    got = _prompt_and_step(engine_on(device, graph, weights))
    assert np.isfinite(want).all() and same_bits(got, want)
