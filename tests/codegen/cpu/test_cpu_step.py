"""The compiled step (kinetic/codegen/cpu/step.py): bit for bit the reference interpreter on the
synthetic and real models, whatever the thread count, batch, grouping or buffer capacity; its plan
(barriers, buffer reuse) is sound; ops without a kernel run through the reference in between."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.cpu import step_ops, tape
from kinetic.codegen.cpu.lowering import unsupported
from kinetic.codegen.cpu.step import CompiledStep
from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.rows import PassRows
from kinetic.passes import PassOptions, run_pipeline
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.conftest import model_path
from tests.synthetic import synthetic_path

PROMPT = [2, 504, 3575, 282, 4649, 314, 7042, 30, 198, 198, 504, 17]


def _graph(path):
    gguf = open_gguf(path)
    return gguf, run_pipeline(lower(gguf), PassOptions())


def _engine(gguf, graph, device="cpu", **kw) -> Engine:
    return Engine(graph, GGUFWeights(gguf), n_ctx=kw.pop("n_ctx", 64), device=device, **kw)


def _all_logits(engine: Engine, tokens: list[int]) -> np.ndarray:
    return engine.forward(PassRows.chain(tokens, 0, outputs="all"), {0: engine.new_sequence()})


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def synthetic(request):
    return _graph(synthetic_path(request.param))


def test_synthetic_models_equal_the_reference(synthetic):
    gguf, graph = synthetic
    cpu, ref = _engine(gguf, graph), _engine(gguf, graph, device="reference")
    assert isinstance(cpu.runner, CompiledStep)
    tokens = [t % 200 for t in PROMPT]
    assert np.array_equal(_all_logits(cpu, tokens), _all_logits(ref, tokens))


def test_types_without_a_kernel_run_through_the_reference_between_segments():
    """Matmuls no kernel covers (here the float path's: unquantized activations) run as Python
    segments between compiled ones, and the logits still equal the reference's."""
    from kinetic.frontend.blocks import Options

    gguf = open_gguf(synthetic_path("llama"))
    graph = run_pipeline(lower(gguf, Options(activations="f32")), PassOptions())
    step = _engine(gguf, graph).runner
    assert any(not isinstance(s, tuple) for s in step.segments)
    assert sum(isinstance(s, tuple) for s in step.segments) > 1
    tokens = [t % 200 for t in PROMPT[:5]]
    want = _all_logits(_engine(gguf, graph, device="reference"), tokens)
    assert np.array_equal(_all_logits(_engine(gguf, graph), tokens), want)


@pytest.mark.parametrize("threads", [1, 3])
def test_thread_count_does_not_change_a_bit(synthetic, threads):
    gguf, graph = synthetic
    tokens = [t % 200 for t in PROMPT]
    two = _all_logits(_engine(gguf, graph, threads=2), tokens)
    assert np.array_equal(_all_logits(_engine(gguf, graph, threads=threads), tokens), two)


def test_sliding_window_and_decode_equal_the_reference():
    """Past the synthetic Gemma's window of 8, one token at a time and chunks of 5 give the reference's rows."""
    gguf, graph = _graph(synthetic_path("gemma3"))
    tokens = [(7 * i + 3) % 200 for i in range(20)]
    want = _all_logits(_engine(gguf, graph, device="reference"), tokens)
    engine = _engine(gguf, graph, batch=5)
    seq = engine.new_sequence()
    got = [engine.decode(seq, t) for t in tokens[:4]]
    for start in range(4, len(tokens), 5):
        chunk = tokens[start : start + 5]
        got.extend(engine.forward(PassRows.chain(chunk, seq.cache.length, outputs="all"), {0: seq}))
    assert np.array_equal(np.stack(got), want)


def test_a_pass_larger_than_the_buffers_grows_them():
    gguf, graph = _graph(synthetic_path("llama"))
    engine = _engine(gguf, graph, batch=3, shortlist=False)  # one runner (the full graph) runs every pass
    tokens = [t % 200 for t in PROMPT]
    got = _all_logits(engine, tokens)
    assert engine.runner.capacity >= len(tokens)
    assert np.array_equal(got, _all_logits(_engine(gguf, graph, device="reference"), tokens))


def test_uncommitted_pass_past_the_context_is_refused():
    gguf, graph = _graph(synthetic_path("llama"))
    engine = _engine(gguf, graph, n_ctx=8)
    seq = engine.new_sequence()
    engine.prefill(seq, [1, 2, 3, 4, 5, 6])
    with pytest.raises(KineticError, match="context is full"):
        engine.forward(PassRows.chain([7, 8, 9], seq.cache.length), {0: seq}, commit=False)
    assert seq.cache.length == 6


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_real_models_thread_count_invariant(name):
    gguf, graph = _graph(model_path(name))
    one = _all_logits(_engine(gguf, graph, threads=1), PROMPT[:6])
    assert np.array_equal(_all_logits(_engine(gguf, graph, threads=2), PROMPT[:6]), one)


def test_plan_barriers_are_sound(synthetic):
    """Independent matmuls share a phase; in each plan (row split, rows, columns: tape_plan.py) no
    op reads or writes, in its own phase, what another op of that phase wrote across a different
    split: matmuls split rows, like row-local ops, in the row split plan, and in the columns plan
    the columns in units (as their readers there) where they have one."""
    gguf, graph = synthetic
    step = _engine(gguf, graph).runner
    instrs = step.plan.instrs
    for plan_tape, plan in ((step.split_tape, "split"), (step.tape, "rows"), (step.column_tape, "columns")):
        phases = np.concatenate([[0], np.cumsum(plan_tape[:-1, tape.FLAGS] & tape.FLAG_BARRIER != 0)])
        # independent matmuls reading the same quantized input share a phase (no barrier between them)
        matmul_phases = phases[plan_tape[:, tape.OP] == tape.OP_MATMUL]
        assert len(matmul_phases) > len(set(matmul_phases.tolist()))

        def row_local(ins, plan=plan):
            split = plan == "split" and not ins.output_rows
            matmul = ins.op == tape.OP_MATMUL and (split or (plan == "columns" and ins.unit > 0))
            return ins.row_local or matmul

        for i, a in enumerate(instrs):
            for j in range(i + 1, len(instrs)):
                b = instrs[j]
                if phases[j] != phases[i]:
                    break
                shared = set(a.writes) & (set(b.reads) | set(b.writes)) or set(a.reads) & set(b.writes)
                if shared:
                    assert row_local(a) and row_local(b) and a.output_rows == b.output_rows
                    if plan == "columns":  # the same columns, and none of them read whole
                        assert (a.unit, a.width) == (b.unit, b.width) and a.unit > 0
                        assert not (b.whole_row and set(a.writes) & set(b.reads))
                        assert not (a.whole_row and set(a.reads) & set(b.writes))


def test_buffers_that_overlap_in_an_arena_are_never_live_in_one_phase(synthetic):
    """Two buffers whose bytes overlap (in the f32 arena or the byte arena) have disjoint phase spans,
    a span running from the first phase that reads or writes a buffer to the last; outputs and
    constants span the whole pass."""
    gguf, graph = synthetic
    step = _engine(gguf, graph).runner
    plan, end = step.plan, 1 << 60
    span: dict[tuple, tuple[int, int]] = {}
    for ins in plan.instrs:
        for key in ins.reads + ins.writes:
            lo, hi = span.get(key, (ins.phase, ins.phase))
            span[key] = (min(lo, ins.phase), max(hi, ins.phase))
    span.update({("v", node_id): (span[("v", node_id)][0], end) for _name, node_id in step.graph.outputs})
    span.update({key: (-1, end) for key in plan.constants})
    ranges = {"f32": [], "bytes": []}
    for key, at in step.offsets.items():
        floats = plan.constants[key].size if key in plan.constants else plan.f32_sizes[key]
        ranges["f32"].append((4 * at, 4 * (at + floats), key))
    for key, (q, _d, e) in step.q_offsets.items():
        ranges["bytes"].append((q, e + plan.q_sizes[key][2], key))
    for arena, extent in (("f32", step.arena.nbytes), ("bytes", step.qarena.nbytes)):
        placed = sorted(r for r in ranges[arena] if r[1] > r[0])
        assert placed and placed[-1][1] <= extent
        for i, (_lo, hi, key) in enumerate(placed):
            for lo2, _hi2, key2 in placed[i + 1:]:
                if lo2 >= hi:
                    break
                (a0, a1), (b0, b1) = span[key], span[key2]
                assert a1 < b0 or b1 < a0, (arena, key, key2)
    assert len({at for at, _hi, _key in ranges["f32"]}) < len(ranges["f32"])  # some buffer is reused


def test_graphs_it_cannot_run_fall_back_to_the_op_by_op_executor():
    gguf = open_gguf(synthetic_path("llama"))
    from kinetic.frontend.blocks import Options

    graph = run_pipeline(lower(gguf, Options(kv_dtype="f32")), PassOptions())
    assert unsupported(graph) == "a f32 KV cache"
    engine = _engine(gguf, graph)
    assert not isinstance(engine.runner, CompiledStep)


@pytest.mark.parametrize("threads", [2, 3])
def test_passes_smaller_than_the_thread_count_split_columns(synthetic, threads):
    """One or two rows on more threads run the column-split plan; each row still gets the reference's bits."""
    gguf, graph = synthetic
    tokens = [t % 200 for t in PROMPT[:7]]
    want = _all_logits(_engine(gguf, graph, device="reference"), tokens)
    engine = _engine(gguf, graph, threads=threads)
    seq = engine.new_sequence()
    got = [engine.decode(seq, t) for t in tokens[:3]]
    for start in (3, 5):
        got.extend(engine.forward(PassRows.chain(tokens[start : start + 2], seq.cache.length, outputs="all"), {0: seq}))
    assert np.array_equal(np.stack(got), want)
    step = engine.runner
    rows_barriers = step.tape[:, tape.FLAGS] & tape.FLAG_BARRIER
    column_barriers = step.column_tape[:, tape.FLAGS] & tape.FLAG_BARRIER
    split_barriers = step.split_tape[:, tape.FLAGS] & tape.FLAG_BARRIER
    assert np.all(column_barriers >= split_barriers) and np.all(rows_barriers >= split_barriers)  # the buffer plan's


def test_numba_cache_keys_track_the_modules_compiled_in():
    """numba reuses a cached function while its own file is unchanged, even if a module it compiles
    in changed (a stale, crashing cache); each such file carries a hash of those modules."""
    import hashlib
    from pathlib import Path

    from kinetic.codegen.cpu import step_attention, step_drive

    here = Path(step_ops.__file__).parent

    def digest(*names):
        h = hashlib.sha256()
        for name in names:
            h.update((here / name).read_bytes())
        return h.hexdigest()[:16]

    assert step_attention.SOURCES_HASH == digest("native.py"), "update SOURCES_HASH in step_attention.py"
    assert step_ops.SOURCES_HASH == digest("native.py", "step_attention.py", "tape.py", "moe_step.py"), (
        "update SOURCES_HASH in step_ops.py")
    # step_ops.py changes with its own hash, so this covers what it compiles in too
    assert step_drive.SOURCES_HASH == digest("step_ops.py", "step_sync.py", "native.py", "tape.py"), (
        "update SOURCES_HASH in step_drive.py")


@pytest.mark.parametrize("wtype", ["Q8_0", "F16", "F32"])
def test_the_tape_embedding_equals_the_reference_dequantization(wtype):
    """The tape's own embedding lookup (Q8_0 / F16 / F32 tables) gives kinetic.ir.quants.dequantize's
    values for the chosen tokens, bit for bit, for any split of rows or of whole blocks of columns."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants as gguf_quants

    from kinetic.ir.quants import dequantize

    rng = np.random.default_rng(7)
    values = (rng.standard_normal((50, 96)) * rng.choice([1e-3, 1.0, 300.0], (50, 1))).astype(np.float32)
    qtype = Q[wtype]
    table = (gguf_quants.quantize(values, qtype) if qtype is Q.Q8_0
             else values.astype(np.float16 if qtype is Q.F16 else np.float32))
    table = np.ascontiguousarray(table)
    tokens = np.array([3, 49, 0, 3, 17], np.int32)
    want = dequantize(table[tokens], qtype)
    kind = {Q.Q8_0: tape.EMBED_Q8_0, Q.F16: tape.EMBED_F16, Q.F32: tape.EMBED_F32}[qtype]
    for r0, r1, c0, c1 in [(0, 5, 0, 96), (1, 4, 0, 96), (0, 5, 32, 96), (0, 5, 0, 32)]:
        arena = np.full(5 * 96 + 16, np.nan, np.float32)
        step_ops.embed_rows(arena, table.ctypes.data, table.strides[0], 16, 96, kind, tokens, r0, r1, c0, c1)
        got = arena[16:].reshape(5, 96)
        assert np.array_equal(got[r0:r1, c0:c1], want[r0:r1, c0:c1])
        assert np.isnan(np.delete(got, np.s_[r0:r1], axis=0)).all()


def test_token_ids_outside_the_vocabulary_are_refused_before_the_tape_reads_them():
    """The tape looks the embedding up by address: an id past the table is an error, not a stray read."""
    gguf, graph = _graph(synthetic_path("llama"))
    engine = _engine(gguf, graph)
    seq = engine.new_sequence()
    for bad in ([10**6], [5, -1]):
        with pytest.raises(KineticError, match="outside the vocabulary"):
            engine.forward(PassRows.chain(bad, 0), {0: seq}, commit=False)
    assert seq.cache.length == 0
