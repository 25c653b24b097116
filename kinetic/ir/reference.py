"""What every op computes: one reference function per op, on numpy values.

Owns: the meaning of each op, as the function its spec names (`kinetic.ir.ops.OPS[op].reference`),
float32 throughout with ggml's numerics where they matter (kinetic/ir/numerics). Every kernel of
every device is tested against these. Does not own the order of evaluation or the weights' cache
(kinetic/ir/interpreter.py), nor the row table and the caches (kinetic/ir/rows.py, the runtime).

A reference is `reference(ev, node, inputs) -> value`: `inputs` are the values of the node's
inputs, `node` gives its attributes (and, for a weight, its tensor name and stored type), and `ev`
is the pass being evaluated (`Evaluation`): its rows, the KV-cache view, the keys and values the pass
produces, and the runner that holds the weights and whose `matmul` and `attend` a device may replace
with its kernels. Most references read only their inputs and attributes (then `ev` may be None: see
interpreter.evaluate). This module imports nothing from ops.py (ops.py imports it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from kinetic.ir import numerics
from kinetic.ir.quants import dequantize_rows
from kinetic.ir.recurrence import scan_rows
from kinetic.ir.rows import KVView, PassRows, visibility

if TYPE_CHECKING:
    from kinetic.ir.graph import Node

F32 = np.float32


class Runner(Protocol):
    """What the references ask of the runner that evaluates them (the interpreter, or a device runner
    built on it)."""

    weights: object  # a WeightSource: tensor(name) -> the stored tensor

    def weight(self, param: Node) -> numerics.DequantizedWeight:
        """The weight of a `param` node, decoded once."""

    def matmul(self, x: np.ndarray, weight: Node, attrs) -> np.ndarray:
        """x f32 [rows, K] times the weight's [n_out, K] transposed."""

    def attend(self, q: np.ndarray, keys: np.ndarray, vals: np.ndarray, visible: np.ndarray, attrs) -> np.ndarray:
        """Attention of some rows of one sequence over the keys they see."""


@dataclass
class Evaluation:
    """One pass being evaluated: what a reference may read besides its inputs and attributes."""

    runner: Runner
    rows: PassRows
    kv: KVView
    new_kv: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # layer -> (k, v), cache dtype
    new_state: dict[str, dict] = field(default_factory=dict)  # recurrent state -> {row: f32 [rows, width]}


# ---- leaves -------------------------------------------------------------------------------------


def input_(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """The pass's row data the node names: token ids, positions or the rows whose output is wanted."""
    rows = ev.rows
    return rows.input(node.attrs.name)


def param(ev: Evaluation, node: Node, x: list) -> Node:
    """The weight node itself: the ops that read weights resolve it lazily (and only once)."""
    return node


def state(ev: Evaluation, node: Node, x: list):
    """The cache handle (its attributes); attention reads the cache through the pass's KV view."""
    return node.attrs


def recurrent_state(ev: Evaluation, node: Node, x: list):
    """The recurrent state handle (its attributes); recurrent ops read each row's state through
    kinetic/ir/recurrence.py."""
    return node.attrs


# ---- lookups, projections, norms, position --------------------------------------------------------


def embed(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """Rows x[1] of the table x[0], dequantized: f32 [rows, width]."""
    table, ids = x
    raw = ev.runner.weights.tensor(table.attrs.tensor)
    return dequantize_rows(raw, table.type.ggml_type, ids).reshape(len(ids), -1)


def matmul(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """x[0] @ weight.T with ggml's numerics (numerics.matmul), or the runner's kernel."""
    return ev.runner.matmul(x[0], x[1], node.attrs)


def take_rows(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    return x[0][x[1]]


def columns(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """Columns start .. start + count - 1 of every row of x[0], their bits as they are."""
    a = node.attrs
    return np.ascontiguousarray(x[0][:, a.start: a.start + a.count])


def concat(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """Each row's values of x[0], then of x[1], their bits as they are (ggml_concat along dim 0)."""
    return np.concatenate([x[0], x[1]], axis=1)


def rms_norm(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """RMS norm of each row (or each group of `group` values), times the weight if there is one."""
    a = node.attrs
    y = numerics.rms_norm(x[0], a.eps, a.group)
    if len(x) == 2:
        w = ev.runner.weight(x[1]).values.reshape(-1)
        y = (y.reshape(y.shape[0], y.shape[1] // w.size, w.size) * w).reshape(y.shape)
    return y.astype(F32)


def layer_norm(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """Each row minus its mean over sqrt(variance + eps) (numerics.layer_norm), times the weight if there
    is one (ggml_mul: one f32 rounding a value); the bias is an add_bias after it."""
    y = numerics.layer_norm(x[0], node.attrs.eps)
    if len(x) == 2:
        y = y * ev.runner.weight(x[1]).values.reshape(-1)
    return y.astype(F32)


def rope(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """Rotary position embedding of each head's first n_rot values (NeoX halves or interleaved pairs)."""
    a = node.attrs
    values, positions = x
    rows = values.shape[0]
    heads = values.reshape(rows, a.n_head, a.head_dim).copy()
    cos, sin = numerics.rope_cos_sin(positions, a.rotary)  # with its scaling (numerics/rotary.py)
    cos, sin = cos[:, None, :], sin[:, None, :]
    rot = heads[:, :, : a.n_rot]
    if a.neox:
        half = a.n_rot // 2
        rot[:, :, :half], rot[:, :, half:] = numerics.rope_rotate(rot[:, :, :half], rot[:, :, half:], cos, sin)
    else:
        rot[:, :, 0::2], rot[:, :, 1::2] = numerics.rope_rotate(rot[:, :, 0::2], rot[:, :, 1::2], cos, sin)
    return heads.reshape(rows, -1).astype(F32)


# ---- attention ----------------------------------------------------------------------------------


def attention(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """Each row attends over the cache entries it may see; returns f32 [T, n_head*head_dim].

    Rows are grouped by sequence; a group's keys are the sequence's committed entries followed by
    the pass's rows of that sequence, in order, and `visible[r, j]` says which a row sees. The pass's
    keys and values, in the cache dtype, go to `ev.new_kv` for the runtime to commit.
    """
    q, k, v, handle = x
    a, rows = node.attrs, ev.rows
    cache_dtype = np.float16 if a.kv_dtype == "f16" else np.float32
    k_new, v_new = k.astype(cache_dtype), v.astype(cache_dtype)
    ev.new_kv[handle.layer] = (k_new, v_new)
    out = np.empty((q.shape[0], a.n_head * a.head_dim), np.float32)
    for seq in np.unique(rows.seqs):
        mine = np.flatnonzero(rows.seqs == seq)
        ck, cv, cpos = ev.kv.committed(int(seq), handle.layer)
        keys = np.concatenate([ck, k_new[mine]])
        vals = np.concatenate([cv, v_new[mine]])
        visible = visibility(rows, mine, cpos, a.window)
        out[mine] = ev.runner.attend(q[mine], keys, vals, visible, a)
    return out


# ---- recurrent layers (each row continues its parent's state: kinetic/ir/recurrence.py) ------------


def short_conv(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """Causal depthwise convolution of x[0] f32 [T, C] with the kernel x[1] f32 [C, K]: a row's output
    is each channel's dot of the kernel with that channel's last K values along the row's path (the
    K - 1 its state holds, then its own); the state it leaves is its window's last K - 1 rows."""
    values, weight, handle = x
    kernel = ev.runner.weight(weight).values.reshape(values.shape[1], -1)

    def step(state: np.ndarray, r: int):
        window = np.concatenate([state, values[r: r + 1]])  # f32 [K, C], oldest first
        return numerics.short_conv_row(window, kernel), window[1:]

    return scan_rows(ev, handle.name, values.shape[1], step)


def ssm_scan(ev: Evaluation, node: Node, x: list, row=None) -> np.ndarray:
    """Mamba-2's selective scan (numerics.ssm_scan_row) of each row along its path, plus x * D: inputs
    x f32 [T, n_head*head_dim], dt f32 [T, n_head], A and D (weights, one value per head), B and C f32
    [T, n_group*d_state], the state rs[n_head*head_dim, d_state]. Returns y + x * D (ggml_add of
    ggml_mul: two roundings), f32 [T, n_head*head_dim]. `row` computes one row (default
    numerics.ssm_scan_row; the compiled step passes its kernel, which computes the same bits)."""
    values, dt, a_node, b, c, d_node, handle = x
    a, row = node.attrs, row or numerics.ssm_scan_row
    decay = ev.runner.weight(a_node).values.reshape(-1).astype(F32)
    skip = ev.runner.weight(d_node).values.reshape(-1).astype(F32)
    group_of = np.arange(a.n_head) // (a.n_head // a.n_group)

    def step(state: np.ndarray, r: int):
        heads = values[r].reshape(a.n_head, a.head_dim)
        bs, cs = (t[r].reshape(a.n_group, a.d_state)[group_of] for t in (b, c))
        y, new = row(state.reshape(a.n_head, a.head_dim, a.d_state), heads, dt[r], decay, bs, cs)
        out = (y + (heads * skip[:, None]).astype(F32)).astype(F32)
        return out.reshape(-1), new.reshape(state.shape)

    return scan_rows(ev, handle.name, values.shape[1], step)


# ---- elementwise --------------------------------------------------------------------------------


def add(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    return (x[0] + x[1]).astype(F32)


def add_bias(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """x[0] f32 [T, n] plus the bias x[1] f32 [n] on every row: one f32 rounding a value (ggml_add)."""
    return (x[0] + ev.runner.weight(x[1]).values.reshape(-1)).astype(F32)


def mul(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    return (x[0] * x[1]).astype(F32)


def scale(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    return (x[0] * F32(node.attrs.factor)).astype(F32)


def silu(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    return numerics.silu(x[0])


def gelu(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    return numerics.gelu_ggml(x[0])


def softcap(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    return numerics.softcap(x[0], node.attrs.cap)


def swiglu(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    return (numerics.silu(x[0]) * x[1]).astype(F32)


def geglu(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    return (numerics.gelu_ggml(x[0]) * x[1]).astype(F32)


# ---- device forms (made by the device phase, kinetic/passes/device_fusion.py) ---------------------
# Each is the op it stands for, computed the same way: what changes is only which launch computes it.


def add_rms_norm(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """rms_norm of x[0], which is an add its device computes in the same launch: rms_norm's value."""
    return rms_norm(ev, node, x)


def rope_pair(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """rope of x[0] at positions x[1]: rope's value. x[2], the other rotation of the same positions
    that its device computes in the same launch, is not read."""
    return rope(ev, node, x[:2])


def quantize(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """x[0]'s rows in the 8-bit format `node.attrs.format`, for the q8 matmuls that read the node.

    The reference keeps the rows as they are (f32): its only readers are q8 matmuls of weights whose
    dots take this format (the verifier holds them to it), and a matmul's reference quantizes its
    f32 rows to that format itself (numerics.matmul). So the matmul reads the same quantized values
    as when it reads the rows directly, and every output is bit for bit the unfused graph's."""
    return x[0]
