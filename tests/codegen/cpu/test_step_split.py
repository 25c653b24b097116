"""The compiled step's row split plan (kinetic/codegen/cpu/tape_plan.py): passes of many rows run
matmuls split by rows, so a layer keeps barriers only around attention, and every row still gets the
bits it gets on the rows plan and from the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.cpu import tape
from kinetic.ir.rows import PassRows
from tests.codegen.cpu.test_cpu_step import _engine, _graph
from tests.synthetic import synthetic_path

NEVER = 1 << 30  # split_rows_from: the rows plan for every pass
UNWRITTEN = 12345.0


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def synthetic(request):
    return _graph(synthetic_path(request.param))


def _chunked_logits(engine, tokens: list[int], chunk: int) -> np.ndarray:
    """Every row's logits, fed in passes of `chunk` rows (later passes attend to the cache)."""
    seq = engine.new_sequence()
    got = [engine.forward(PassRows.chain(tokens[lo: lo + chunk], lo, outputs="all"), {0: seq})
           for lo in range(0, len(tokens), chunk)]
    return np.concatenate(got)


@pytest.mark.parametrize("threads", [2, 3])
def test_row_split_passes_give_the_reference_bits(synthetic, threads, monkeypatch):
    """Passes on the row split plan (uneven shares, more shares than threads) give every row the
    reference interpreter's logits, as the rows plan does."""
    from kinetic.codegen.cpu import step as step_module

    gguf, graph = synthetic
    tokens = [(7 * i + 3) % 200 for i in range(40)]
    chunk = 2 * threads * threads + 1  # from 2 * threads rows a thread the pass takes the row split plan
    want = _chunked_logits(_engine(gguf, graph, device="reference"), tokens, chunk)
    ran = []
    real = step_module.run_parallel
    monkeypatch.setattr(step_module, "run_parallel", lambda tape_rows, *a, **kw: ran.append(
        bool(np.any(tape_rows[:, tape.FLAGS] & tape.FLAG_SPLIT_ROWS))) or real(tape_rows, *a, **kw))
    for split_rows_from, split in ((1, True), (NEVER, False)):
        monkeypatch.setattr(step_module, "SPLIT_ROWS_FROM", split_rows_from)
        ran.clear()
        assert np.array_equal(_chunked_logits(_engine(gguf, graph, threads=threads), tokens, chunk), want)
        assert any(ran) == split


def test_the_row_split_plan_keeps_barriers_only_around_attention(synthetic):
    """In the row split tape a layer's barriers are the two around its attention (before it: it reads
    other rows' keys; after it), the others stand beside a Python op or the output rows' take (less
    than half the rows plan's); matmuls of the pass rows are flagged to split rows there and nowhere
    else (one of the output rows, often one row, keeps its columns split)."""
    gguf, graph = synthetic
    step = _engine(gguf, graph, threads=2).runner
    split, ops = step.split_tape, step.split_tape[:, tape.OP]
    ends = np.flatnonzero(split[:-1, tape.FLAGS] & tape.FLAG_BARRIER)
    elsewhere = [end for end in ends if ops[end] not in (tape.OP_KV_STORE, tape.OP_ATTEND)]
    assert all(0 in (ops[end], ops[end + 1]) or tape.OP_TAKE_ROWS in (ops[end], ops[end + 1]) for end in elsewhere)
    assert len(ends) - len(elsewhere) == 2 * int((ops == tape.OP_ATTEND).sum())
    assert len(ends) < np.count_nonzero(step.tape[:, tape.FLAGS] & tape.FLAG_BARRIER) / 2
    matmuls = (ops == tape.OP_MATMUL) & (split[:, tape.FLAGS] & tape.FLAG_OUTPUT_ROWS == 0)
    assert np.all(split[matmuls, tape.FLAGS] & tape.FLAG_SPLIT_ROWS)
    assert not np.any(split[~matmuls, tape.FLAGS] & tape.FLAG_SPLIT_ROWS)
    for other in (step.tape, step.column_tape):
        assert not np.any(other[:, tape.FLAGS] & tape.FLAG_SPLIT_ROWS)


def test_a_pass_runs_the_plan_its_rows_a_thread_call_for():
    """Fewer rows than threads: columns; from split_rows_from rows a thread (and twice as many as
    threads: each thread reads every weight): the row split plan; between: rows."""
    gguf, graph = _graph(synthetic_path("llama"))
    step = _engine(gguf, graph, threads=2).runner
    step.split_rows_from = 4
    assert step._tape_for(1, 2) is step.column_tape
    assert step._tape_for(7, 2) is step.tape
    assert step._tape_for(8, 2) is step.split_tape
    assert step._tape_for(4, 1) is step.split_tape
    assert step._tape_for(47, 6) is step.tape and step._tape_for(72, 6) is step.split_tape


def test_a_matmul_aligned_to_its_readers_writes_their_columns_in_the_columns_plan(monkeypatch):
    """In the columns plan a matmul that shares a phase with its readers (align_columns gave it their
    unit) writes, for each share, exactly the columns those readers' share reads: whole units, the
    same units-per-share split, so no share reads a column another share is still writing."""
    from kinetic.codegen.cpu import step as step_module
    from kinetic.codegen.cpu.step_ops import run_op

    gguf, graph = _graph(synthetic_path("llama"))
    engine = _engine(gguf, graph, threads=2)
    step = engine.runner
    passed = {}

    def keep_common(tape_rows, ftape, seg, threads, common, *rest, **kw):
        if common[0] is step.arena:  # this step's pass (the engine may hold another runner)
            passed["common"] = common
        return real(tape_rows, ftape, seg, threads, common, *rest, **kw)

    real = step_module.run_parallel
    monkeypatch.setattr(step_module, "run_parallel", keep_common)
    seq = engine.new_sequence()
    engine.feed(seq, [5, 6])  # a pass without output rows, on engine.runner: its arena holds every op's inputs
    columns = step.column_tape
    aligned = np.flatnonzero((columns[:, tape.OP] == tape.OP_MATMUL) & (columns[:, tape.UNIT] > 0))
    assert len(aligned) >= 2
    for ip in aligned.tolist():
        n, unit = int(columns[ip, tape.MATMUL_N]), int(columns[ip, tape.UNIT])
        y = step.view(step.plan.instrs[ip].writes[0][1], 2)
        for shares, share in ((2, 0), (2, 1), (3, 0), (3, 1), (3, 2)):  # 3: a tape run on more threads than planned
            y[:] = UNWRITTEN  # (the arena's later buffers may have reused the inputs' memory: any value)
            run_op(columns, step.ftape, ip, share, shares, *passed["common"])
            u0, u1 = (n // unit) * share // shares, (n // unit) * (share + 1) // shares
            for row in y:
                written = np.flatnonzero(row.view(np.int32) != np.float32(UNWRITTEN).view(np.int32))
                assert written.tolist() == list(range(u0 * unit, u1 * unit)), (ip, share)


def test_consecutive_shares_run_together_write_what_they_write_one_by_one(monkeypatch):
    """step_ops.run_span over shares s0..s1-1 of a matmul (one call: a thread alone claims a phase's
    shares together, step_sync.claim_rest) writes exactly the columns those shares write one by one,
    with the same bits."""
    from kinetic.codegen.cpu import step as step_module
    from kinetic.codegen.cpu.step_ops import run_op, run_span

    gguf, graph = _graph(synthetic_path("llama"))
    engine = _engine(gguf, graph, threads=2)
    step = engine.runner
    passed = {}

    def keep_common(tape_rows, ftape, seg, threads, common, *rest, **kw):
        if common[0] is step.arena:
            passed["common"] = common
        return real(tape_rows, ftape, seg, threads, common, *rest, **kw)

    real = step_module.run_parallel
    monkeypatch.setattr(step_module, "run_parallel", keep_common)
    engine.feed(engine.new_sequence(), [5, 6])
    columns = step.column_tape
    matmuls = np.flatnonzero(columns[:, tape.OP] == tape.OP_MATMUL).tolist()
    assert matmuls
    for ip in matmuls:
        y = step.view(step.plan.instrs[ip].writes[0][1], 2)
        for shares, s0, s1 in ((2, 0, 2), (3, 0, 3), (3, 1, 3), (3, 0, 2)):
            y[:] = UNWRITTEN
            for share in range(s0, s1):
                run_op(columns, step.ftape, ip, share, shares, *passed["common"])
            one_by_one = y.copy()
            y[:] = UNWRITTEN
            run_span(columns, step.ftape, ip, s0, s1, shares, *passed["common"])
            assert np.array_equal(y.view(np.int32), one_by_one.view(np.int32)), (ip, shares, s0, s1)
            assert (one_by_one != UNWRITTEN).any()


def test_an_output_layer_keeps_its_columns_split_in_the_row_split_plan():
    """A matmul of the output rows (the output layer of the full graph: often one row of a pass)
    splits its columns in the row split plan too, so every thread takes part in it."""
    from kinetic.codegen.cpu.step import CompiledStep
    from kinetic.compiler import compile_graph
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.runtime.weights import GGUFWeights

    gguf = open_gguf(synthetic_path("llama"))
    step = CompiledStep(compile_graph(gguf), GGUFWeights(gguf), threads=2, rows=4)
    flags = step.split_tape[:, tape.FLAGS]
    output_matmuls = (step.split_tape[:, tape.OP] == tape.OP_MATMUL) & (flags & tape.FLAG_OUTPUT_ROWS != 0)
    assert output_matmuls.any()
    assert not np.any(flags[output_matmuls] & tape.FLAG_SPLIT_ROWS)
