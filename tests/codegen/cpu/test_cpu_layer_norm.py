"""The CPU's generated layer norm (kinetic/codegen/cpu/layer_norm_ir.py) and its place on the compiled
step's tape (encoder_ops.layer_norm, OP_LAYER_NORM): the kernel gives numerics.layer_norm's bits for
any width, row count and weight, in place too; every layer_norm of the encoder files runs on the tape,
and the step gives the reference interpreter's bits for any thread count."""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import pytest

import kinetic
from kinetic.codegen.cpu import tape
from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.layer_norm_ir import render_layer_norm
from kinetic.codegen.cpu.step import CompiledStep
from kinetic.ir import numerics
from kinetic.ir.ops import Op
from tests.synthetic import SYNTHETIC, synthetic_path

F32 = np.float32
ENCODERS = ("bert", "nomic-bert")
WIDTHS = (1, 15, 16, 17, 48, 100, 384, 1000)
_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)


@functools.cache
def _kernel(width: int, eps: float, weighted: bool):
    ir, name = render_layer_norm(width, eps, weighted)
    return _SIGNATURE(default_jit().address(ir, name))


def _run(x: np.ndarray, eps: float, weight: np.ndarray | None, out: np.ndarray | None = None) -> np.ndarray:
    """The kernel on x's rows into `out` (a new array unless given: x itself runs it in place)."""
    x = np.ascontiguousarray(x, F32)
    y = np.full_like(x, np.nan) if out is None else out
    _kernel(x.shape[1], eps, weight is not None)(x.ctypes.data, y.ctypes.data,
                                                  0 if weight is None else weight.ctypes.data, x.shape[0])
    return y


def _rows(rng, n: int, width: int) -> np.ndarray:
    """Rows of mixed magnitudes around large offsets: a float32 sum of x, or of the squares in
    another order, rounds otherwise."""
    scale = rng.choice([1e-3, 1.0, 300.0], (n, 1))
    offset = rng.standard_normal((n, 1)) * rng.choice([1.0, 1e3], (n, 1))
    return (rng.standard_normal((n, width)) * scale + offset).astype(F32)


def _want(x: np.ndarray, eps: float, weight: np.ndarray | None) -> np.ndarray:
    y = numerics.layer_norm(x, eps)
    return y if weight is None else (y * weight).astype(F32)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
def test_kernel_gives_the_reference_bits(width, weighted):
    """The kernel's rows equal numerics.layer_norm's (times the weight) bit for bit, for widths with
    and without a tail after the chunks of 16, and for two eps values."""
    rng = np.random.default_rng(width)
    weight = rng.standard_normal(width).astype(F32) if weighted else None
    for eps in (1e-12, 1e-5):
        x = _rows(rng, 9, width)
        assert np.array_equal(_run(x, eps, weight).view(np.uint32), _want(x, eps, weight).view(np.uint32))


@pytest.mark.parametrize("width", [17, 384])
def test_kernel_in_place_gives_the_same_bits(width):
    """Run in place (y is x), the kernel writes the bits it writes into another buffer."""
    rng = np.random.default_rng(3)
    weight = rng.standard_normal(width).astype(F32)
    x = _rows(rng, 5, width)
    want = _run(x, 1e-12, weight)
    inplace = x.copy()
    _run(inplace, 1e-12, weight, out=inplace)
    assert np.array_equal(inplace.view(np.uint32), want.view(np.uint32))


def test_a_row_in_a_call_of_many_gets_its_bits_alone():
    """Batch invariance: each of 7 rows normalized in one call equals that row normalized alone."""
    rng = np.random.default_rng(5)
    x = _rows(rng, 7, 100)
    together = _run(x, 1e-12, None)
    for r in range(7):
        assert np.array_equal(together[r].view(np.uint32), _run(x[r:r + 1], 1e-12, None)[0].view(np.uint32))


@functools.cache
def _model(name: str, device: str, threads: int = 1) -> kinetic.Model:
    return kinetic.Model(synthetic_path(name), n_ctx=64, device=device, threads=threads, warm_start=False)


@pytest.mark.parametrize("name", ENCODERS)
def test_every_layer_norm_runs_on_the_tape(name):
    """The compiled step has one OP_LAYER_NORM row per layer_norm node, and no Python segment runs
    one (the only ones left are the lookups by positions and token types at the head of the graph)."""
    engine = _model(name, "cpu").engine
    step = engine.runner
    assert isinstance(step, CompiledStep)
    n_norms = sum(node.op is Op.LAYER_NORM for node in engine.graph.nodes)
    assert n_norms > 0
    assert int((step.tape[:, tape.OP] == tape.OP_LAYER_NORM).sum()) == n_norms
    python = [s.python.__qualname__ for s in step.segments if not isinstance(s, tuple)]
    assert all(q.startswith("embed_by_input.") for q in python), python


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("name", ENCODERS)
def test_step_gives_the_reference_bits_on_any_thread_count(name, threads):
    """Hidden states of inputs of 1 to 16 rows (fewer rows than threads takes the column-split plan)
    equal the reference interpreter's bit for bit on 1, 2 and 3 threads."""
    ref = np.load(SYNTHETIC / name / f"{name}.npz")
    p0, p1 = ref["p0_ids"].tolist(), ref["p1_ids"].tolist()
    inputs = [p0[:1], p1, p0[:2], p0]
    ours = _model(name, "cpu", threads).embedder.hidden_states(inputs)
    want = _model(name, "reference").embedder.hidden_states(inputs)
    for a, b in zip(ours, want, strict=True):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    alone = _model(name, "cpu", threads).embedder.hidden_states([p0[:1]])[0]  # one row: fewer than threads
    assert np.array_equal(alone.view(np.uint32), want[0].view(np.uint32))
