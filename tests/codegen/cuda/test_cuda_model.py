"""The whole CUDA runtime (kinetic/codegen/cuda/model.py) on the host emulation of its kernels, against
the reference interpreter: weights uploaded once, the device KV cache, plans recorded once and
replayed, the keys and values copied back. Every kernel is the reference bit for bit, so logits are
compared bit for bit. The same runtime runs on a GPU through backends.GpuBackend (test_cuda_gpu.py
runs these checks there).

Kept to a few tokens: the emulation runs a SmolLM2 decode step in well under a second on 2 CPUs."""

from __future__ import annotations

import pytest

from kinetic.codegen.cuda import emulator
from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassRows
from kinetic.passes import run_pipeline
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.conftest import device_passes
from tests.device_checks import (
    PROMPT,
    check_drafted_equals_plain,
    check_greedy_equals,
    check_refuses_soft_capping,
    check_row_in_a_pass_equals_row_alone,
    check_tree_rows_equal_paths,
    greedy,
    same_bits,
)

N_CTX = 64


def load(path):
    """The graph `--device cuda` runs (lowered, then the passes in CUDA's default numerics mode, as Model
    does) and its weights."""
    gguf = open_gguf(path)
    return run_pipeline(lower(gguf), device_passes("cuda")), GGUFWeights(gguf)


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return load(smollm2_path)


@pytest.fixture(scope="module")
def reference(smollm2):
    graph, weights = smollm2
    return Engine(graph, weights, n_ctx=N_CTX, device="reference")


def cuda_engine(graph, weights, backend) -> Engine:
    """An engine whose runner is the CUDA runtime on `backend` (Engine(device="cuda") builds the same
    with the GPU backend, device="cuda-emulated" with the host one)."""
    from kinetic.codegen.cuda.model import CudaModel

    engine = Engine(graph, weights, n_ctx=N_CTX, device="reference")
    engine.runner = CudaModel(graph, weights, backend, N_CTX)
    return engine


@pytest.fixture(scope="module")
def emulated(smollm2):
    reason = emulator.unavailable_reason()
    if reason:
        pytest.skip(reason)
    graph, weights = smollm2
    engine = Engine(graph, weights, n_ctx=N_CTX, device="cuda-emulated")  # the registry's opener
    assert engine.runner.backend.name == "the host emulation of the CUDA kernels"
    yield engine
    engine.close()


def test_greedy_tokens_and_logits_equal_the_reference(emulated, reference):
    """Prompt then 3 greedy tokens: the same tokens, bit-identical logits at every step, and the same
    cache bits; the decode shape is recorded once and replayed."""
    check_greedy_equals(emulated, reference, 3, layers=(0, 17, 29))
    model = emulated.runner
    assert (1, 1) in model._plans and (len(PROMPT), 1) in model._plans
    decode_recordings = [key for key in model._recordings if key[:2] == (1, 1)]
    assert len(decode_recordings) == 1  # three decode steps, one recording


def test_the_one_warp_attention_kernel_equals_the_reference(smollm2, reference):
    """Passes whose scratch would exceed the limit attend one warp per (row, head) instead of with
    attention_rows: forced here for every pass, the same bits (and drafting exact) through it."""
    from kinetic.codegen.cuda.backends import HostBackend

    if emulator.unavailable_reason():
        pytest.skip(emulator.unavailable_reason())
    engine = cuda_engine(*smollm2, HostBackend())
    engine.runner.attention_scratch_bytes = 0
    try:
        check_greedy_equals(engine, reference, 2)
        check_tree_rows_equal_paths(engine)
        launched = {x.kernel.split("_h")[0] for plan in engine.runner._plans.values() for x in plan.launches}
        assert "attention" in launched and "attention_rows" not in launched
    finally:
        engine.runner.close()


def test_a_row_in_a_pass_equals_the_row_alone(emulated):
    """Batch invariance on the device: each row of a pass gets what it gets alone, the device stores
    the same cache bits either way."""
    check_row_in_a_pass_equals_row_alone(emulated)


def test_passes_without_outputs_and_rollback(emulated, reference):
    """A prompt chunk with no output rows (prefill's earlier chunks skip the output layer), then a
    rollback: the next pass sees only the kept entries, as the reference does."""
    seq, ref_seq = emulated.new_sequence(), reference.new_sequence()
    for engine, s in ((emulated, seq), (reference, ref_seq)):
        engine.feed(s, PROMPT[:3])
        engine.forward(PassRows.chain([278, 265], s.cache.length), {0: s})
        s.cache.truncate(3)  # forget the two
    got = emulated.forward(PassRows.chain(PROMPT[3:], 3), {0: seq})
    want = reference.forward(PassRows.chain(PROMPT[3:], 3), {0: ref_seq})
    assert same_bits(got, want)


def test_drafted_equals_plain_on_the_device(emulated):
    """The identity gate through the CUDA runtime: drafted greedy decoding equals plain, cache too."""
    check_drafted_equals_plain(emulated)


def test_a_draft_tree_row_equals_its_path_decoded_plainly(emulated):
    """A draft tree's rows equal their paths; keep() moves a row in the host cache, which the next pass
    copies to the device (without that copy this test fails)."""
    check_tree_rows_equal_paths(emulated)


def test_token_ids_outside_the_vocabulary_are_refused(emulated):
    """The embedding lookup reads the table by token id: an id outside it is a clear error before any
    launch (on a GPU it would read outside the table), and the sequence is untouched."""
    seq = emulated.new_sequence()
    for bad in ([5, 49152], [-1]):
        with pytest.raises(KineticError, match="outside the vocabulary"):
            emulated.prefill(seq, bad)
    assert seq.cache.length == 0 and seq.tokens == []


def test_unsupported_graphs_are_refused_with_the_reason(smollm2):
    """A graph with an op or weight the CUDA kernels do not cover is refused naming it, before any
    device work."""
    from kinetic.codegen.cuda.model import unsupported

    check_refuses_soft_capping(unsupported, smollm2[0])


def test_engine_device_cuda_without_a_gpu_says_why(smollm2):
    """`Engine(device="cuda")` (what --device cuda builds) runs the runtime on the GPU; where CUDA is
    not usable it is one KineticError naming the reason."""
    from kinetic.codegen.cuda.device import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        pytest.skip("CUDA is usable here: test_cuda_gpu.py runs the model")
    graph, weights = smollm2
    with pytest.raises(KineticError, match="--device cuda cannot run here") as err:
        Engine(graph, weights, n_ctx=N_CTX, device="cuda")
    assert reason in err.value.message


def test_gemma3_equals_the_reference(gemma_path):
    """Gemma 3 (sliding-window layers, per-head norms, GELU, Q4_K/Q6_K/Q5_0/Q8_0 weights): the prompt's
    logits and 2 greedy tokens' logits are the reference interpreter's bits (about 20 s on 2 CPUs)."""
    from kinetic.codegen.cuda.backends import HostBackend

    graph, weights = load(gemma_path)
    reference = Engine(graph, weights, n_ctx=N_CTX, device="reference")
    engine = cuda_engine(graph, weights, HostBackend())
    try:
        prompt = [2, 818, 5279, 529, 7001, 563]  # "<bos>The capital of France is"
        _, got, _ = greedy(engine, prompt, 2)
        _, want, _ = greedy(reference, prompt, 2)
        for g, w in zip(got, want, strict=True):
            assert same_bits(g, w)
    finally:
        engine.runner.close()


def test_the_real_models_kernels_compile_within_budget(smollm2, gemma_path, tmp_path):
    """Every kernel the runtime launches for SmolLM2 and Gemma 3 (their exact shapes, the fused chains,
    the mask stride of a 4096-token cache) compiles for every listed architecture within its kind's
    budget (test_cuda_compile.py holds the test shapes to the same)."""
    from kinetic.codegen.cuda import nvrtc
    from kinetic.codegen.cuda.caps import ARCHS, violations
    from kinetic.codegen.cuda.kernel import program_source
    from kinetic.codegen.cuda.renderer import CudaRenderer

    if nvrtc.unavailable_reason():
        pytest.skip(nvrtc.unavailable_reason())
    kernels = {}
    for graph in (smollm2[0], load(gemma_path)[0]):
        renderer = CudaRenderer(mask_stride=4096)
        lowered = renderer.lower(graph)
        rendering = renderer.render(lowered)
        assert not rendering.unsupported and any(n.op is Op.ADD_RMS_NORM for n in lowered.nodes)
        kernels.update({k.name: k for k in rendering.distinct()})
    source = program_source(list(kernels.values()), "cuda")
    for arch in sorted(ARCHS):
        compiled = nvrtc.compile_program(source, arch, cache_dir=tmp_path)
        problems = [p for k in kernels.values() for p in violations(k, compiled.resources[k.name], ARCHS[arch])]
        assert not problems, "\n".join(problems)


def test_fused_chains_of_the_real_models(smollm2, gemma_path):
    """What CUDA's device phase fuses on both models: every residual add with the next norm, every
    layer's query and key rotations (Gemma's queries through their scale), one quantize node per
    (row, format) shared by its matmuls, written by the launch of norms (the final one too, for a Q8_0
    output layer), SwiGLU and attention where it can be; and a rotary pair only where nothing reads
    the earlier rotation before the later one runs."""
    from kinetic.codegen.cuda.renderer import CudaRenderer

    for graph, layers, quantized in ((smollm2[0], 30, 121), (load(gemma_path)[0], 18, 73)):
        lowered = CudaRenderer().lower(graph)
        ops = [n.op for n in lowered.nodes]
        position = {n.id: i for i, n in enumerate(lowered.nodes)}
        users = lowered.users()
        assert ops.count(Op.ROPE_PAIR) == layers and ops.count(Op.ADD_RMS_NORM) == layers * 2 - 1
        assert sum(n.op is Op.QUANTIZE and n.attrs.in_producer for n in lowered.nodes) == quantized
        assert all(lowered.node(n.inputs[0]).op is Op.QUANTIZE for n in lowered.nodes if n.op is Op.MATMUL)
        for pair in (n for n in lowered.nodes if n.op is Op.ROPE_PAIR):
            assert all(position[u] > position[pair.id] for u in users[pair.inputs[2]] if u != pair.id)


# ---- a model split between the CPU and the GPU (--gpu-layers N below the layer count) ---------------

@pytest.fixture(scope="module")
def split_engine(smollm2):
    """SmolLM2's first 20 layers on the CPU (the compiled step), the last 10 on the CUDA runtime."""
    reason = emulator.unavailable_reason()
    if reason:
        pytest.skip(reason)
    from kinetic.codegen.cpu.step import CompiledStep
    from kinetic.codegen.cuda.backends import HostBackend
    from kinetic.codegen.cuda.model import CudaModel, SplitModel
    from kinetic.passes.split import split_layers

    graph, weights = smollm2
    split = split_layers(graph, 20)
    engine = Engine(graph, weights, n_ctx=N_CTX, device="reference")
    engine.runner = SplitModel(CompiledStep(split.head, weights, threads=2),
                               CudaModel(graph, weights, HostBackend(), N_CTX, split=split), split)
    yield engine
    engine.runner.close()


def test_split_model_equals_the_reference(split_engine, reference):
    """Layers 0-19 on the CPU, 20-29 through the CUDA runtime, one hidden state per row crossing: the
    greedy tokens, every step's logits and both halves of the cache are the reference's bits; the
    device holds only its own layers' cache."""
    check_greedy_equals(split_engine, reference, 3, layers=(0, 19, 20, 29))
    gpu = split_engine.runner.gpu
    assert sorted(gpu.kv_layers) == list(range(20, 30))
    assert sorted(gpu.kv_mirrors.k) == list(range(20, 30)) == sorted(gpu.kv_mirrors.v)
    assert not any(name.startswith(f"blk.{i}.") for i in range(20) for name in gpu.weights)


def test_split_model_drafts_a_tree_exactly(split_engine):
    """A draft tree through both halves, keep() moving a row in both, then a decode step: the bits of
    the path decoded plainly."""
    check_tree_rows_equal_paths(split_engine)


def test_split_layers_finds_the_hidden_state_and_refuses_what_is_not_a_split(smollm2):
    from kinetic.passes.split import layer_of_nodes, split_layers

    graph, _ = smollm2
    split = split_layers(graph, 12)
    assert [name for name, _ in split.head.outputs] == ["hidden"]
    assert graph.node(split.boundary).op is Op.ADD  # the residual stream after layer 11
    assert {n.attrs.layer for n in split.head.nodes if n.op is Op.STATE} == set(range(12))
    assert all(layer_of_nodes(graph)[n.id] < 12 for n in split.head.nodes)
    for bad in (0, 30):
        with pytest.raises(ValueError, match="between 1 and 29"):
            split_layers(graph, bad)


def test_the_layers_that_fit_are_the_last_ones(smollm2):
    """As many of the last layers as fit in the free memory, after what runs behind them and a margin
    for the activations; none when even one does not."""
    from kinetic.codegen.cuda.model import layer_bytes, layers_that_fit

    graph, weights = smollm2
    fixed, per_layer, lookup = layer_bytes(graph, weights, N_CTX)
    assert fixed > 0 and lookup == 0  # SmolLM2's output layer is the embedding table (tied)
    assert len(per_layer) == 30 and len(set(per_layer.values())) == 1
    one = per_layer[0]
    margin = 256 << 20
    assert layers_that_fit(graph, weights, N_CTX, margin + fixed + 30 * one) == 30
    assert layers_that_fit(graph, weights, N_CTX, margin + fixed + 7 * one + one // 2) == 7
    assert layers_that_fit(graph, weights, N_CTX, margin + fixed + one // 2) == 0


# ---- on a GPU (scripts/gpu_check.sh): the same checks through backends.GpuBackend -------------------

def _gpu_reason() -> str | None:
    from kinetic.codegen.cuda.device import unavailable_reason

    return unavailable_reason()


@pytest.fixture(scope="module")
def on_gpu(smollm2):
    graph, weights = smollm2
    engine = Engine(graph, weights, n_ctx=N_CTX, device="cuda")  # open_runner: the GPU backend
    yield engine
    engine.runner.close()


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_reason() is not None, reason=f"CUDA is not usable here: {_gpu_reason()}")
def test_gpu_greedy_logits_equal_the_reference(on_gpu, reference):
    """The decode step as one CUDA graph, replayed: tokens and logits bit for bit the reference's."""
    check_greedy_equals(on_gpu, reference, 8)


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_reason() is not None, reason=f"CUDA is not usable here: {_gpu_reason()}")
def test_gpu_batch_invariance_and_drafting(on_gpu):
    """A row in a pass equals the row alone on the GPU, drafted decoding equals plain, tree rows their
    paths."""
    check_row_in_a_pass_equals_row_alone(on_gpu)
    check_drafted_equals_plain(on_gpu)
    check_tree_rows_equal_paths(on_gpu)
