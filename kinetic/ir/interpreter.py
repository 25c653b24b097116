"""The numpy reference interpreter: what every op means.

Owns: evaluating a Graph on one pass of rows. Does not own: where weights come from (a
WeightSource), cache layout or rollback (the runtime supplies a KVView and commits what the pass
returns). Float32 throughout, with ggml's numerics where they matter (kinetic/ir/numerics.py).

A pass is a table of rows (`PassRows`): each row is a token with its sequence, its position and its
parent row in this pass (-1: it follows the committed context of its sequence directly). A row's
attention sees the committed cache entries of its sequence plus its ancestors in the pass and
itself, minus what a sliding window excludes. A prompt chunk is the chain 0 <- 1 <- 2 ...; a draft
tree is any forest; several users are several chains with different sequences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kinetic.ir import numerics
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import Op
from kinetic.ir.quants import dequantize_rows


@dataclass
class PassRows:
    tokens: np.ndarray  # i32 [T]
    positions: np.ndarray  # i32 [T]
    seqs: np.ndarray  # i32 [T]
    parents: np.ndarray  # i32 [T], -1 = attaches to the committed context
    output_rows: np.ndarray  # i32 [R], rows whose logits are wanted
    chain_seq: int = -1  # set by chain(): every row is this sequence's, each the child of the one before

    @staticmethod
    def chain(tokens, start_pos: int, seq: int = 0, outputs: str = "last") -> PassRows:
        """One sequence's consecutive tokens from position start_pos (a prompt chunk or one decode step);
        logits for all rows, the last one or none (a prompt chunk before the last)."""
        n = len(tokens)
        out = {"all": np.arange(n), "last": np.array([n - 1]), "none": np.zeros(0)}[outputs]
        return PassRows(
            tokens=np.asarray(tokens, np.int32),
            positions=np.arange(start_pos, start_pos + n, dtype=np.int32),
            seqs=np.full(n, seq, np.int32),
            parents=np.arange(-1, n - 1, dtype=np.int32),
            output_rows=out.astype(np.int32),
            chain_seq=seq,
        )

    def ancestors(self, row: int) -> list[int]:
        """The rows of this pass that `row` sees: its chain of parents, then itself."""
        chain = [row]
        while self.parents[chain[-1]] >= 0:
            chain.append(int(self.parents[chain[-1]]))
        return chain[::-1]


class KVView(Protocol):
    def committed(self, seq: int, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Keys [n, kv_width], values [n, kv_width] (in the cache dtype) and their positions [n]."""


class WeightSource(Protocol):
    def tensor(self, name: str) -> np.ndarray:
        """The stored tensor: raw bytes [rows, row_bytes] for quantized types, typed values otherwise."""


@dataclass
class PassResult:
    outputs: dict[str, np.ndarray]
    new_kv: dict[int, tuple[np.ndarray, np.ndarray]]  # layer -> (k, v) of every row, cache dtype


class Interpreter:
    """Runs graphs on numpy; caches each weight dequantized once."""

    def __init__(self, weights: WeightSource):
        self.weights = weights
        self._dequantized: dict[str, numerics.DequantizedWeight] = {}

    def run(self, graph: Graph, rows: PassRows, kv: KVView) -> PassResult:
        env: dict[int, object] = {}
        new_kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for node in graph.nodes:
            env[node.id] = self._eval(graph, node, env, rows, kv, new_kv)
        outputs = {name: env[node_id] for name, node_id in graph.outputs}
        return PassResult(outputs, new_kv)

    def weight(self, node: Node) -> numerics.DequantizedWeight:
        name = node.attrs.tensor
        if name not in self._dequantized:
            raw = np.asarray(self.weights.tensor(name))
            raw2d = raw.reshape(raw.shape[0], -1) if raw.ndim > 1 else raw.reshape(1, -1)
            self._dequantized[name] = numerics.DequantizedWeight(raw2d, node.type.ggml_type)
        return self._dequantized[name]

    def matmul(self, x: np.ndarray, weight: Node, attrs) -> np.ndarray:
        """A matmul as the reference defines it; device executors override this with their kernels."""
        return numerics.matmul(x, self.weight(weight), attrs.activations)

    def attend(self, q: np.ndarray, keys: np.ndarray, vals: np.ndarray, visible: np.ndarray, attrs) -> np.ndarray:
        """Attention of some rows over their sequence's keys, as the reference defines it; device
        executors override this with their kernels."""
        return numerics.attention_online(q, keys, vals, visible, attrs)

    def _eval(self, graph, node: Node, env, rows: PassRows, kv: KVView, new_kv):
        op, a = node.op, node.attrs
        x = [env[i] for i in node.inputs]
        if op is Op.INPUT:
            return {"tokens": rows.tokens, "positions": rows.positions, "output_rows": rows.output_rows}[a.name]
        if op is Op.PARAM:
            return node  # resolved lazily by the ops that read weights
        if op is Op.STATE:
            return a
        if op is Op.EMBED:
            table: Node = x[0]
            raw = self.weights.tensor(table.attrs.tensor)
            return dequantize_rows(raw, table.type.ggml_type, x[1]).reshape(len(x[1]), -1)
        if op is Op.MATMUL:
            return self.matmul(x[0], x[1], a)
        if op is Op.RMS_NORM:
            y = numerics.rms_norm(x[0], a.eps, a.group)
            if len(x) == 2:
                w = self.weight(x[1]).values.reshape(-1)
                y = (y.reshape(y.shape[0], y.shape[1] // w.size, w.size) * w).reshape(y.shape)
            return y.astype(np.float32)
        if op is Op.ROPE:
            return _rope(x[0], x[1], a)
        if op is Op.ATTENTION:
            return _attention(x[0], x[1], x[2], x[3], a, rows, kv, new_kv, self.attend)
        return _ELEMENTWISE[op](x, a)


def _rope(x: np.ndarray, positions: np.ndarray, a) -> np.ndarray:
    if a.yarn_ext_factor or a.llama3_factor:
        raise NotImplementedError("the reference interpreter applies only linear rotary scaling so far")
    rows = x.shape[0]
    heads = x.reshape(rows, a.n_head, a.head_dim).copy()
    cos, sin = numerics.rope_cos_sin(positions, a.n_rot, a.theta, a.freq_scale)
    cos, sin = cos[:, None, :], sin[:, None, :]
    rot = heads[:, :, : a.n_rot]
    if a.neox:
        half = a.n_rot // 2
        rot[:, :, :half], rot[:, :, half:] = numerics.rope_rotate(rot[:, :, :half], rot[:, :, half:], cos, sin)
    else:
        rot[:, :, 0::2], rot[:, :, 1::2] = numerics.rope_rotate(rot[:, :, 0::2], rot[:, :, 1::2], cos, sin)
    return heads.reshape(rows, -1).astype(np.float32)


def _attention(q, k, v, state, a, rows: PassRows, kv: KVView, new_kv, attend: Callable) -> np.ndarray:
    """Each row attends over the cache entries it may see; returns f32 [T, n_head*head_dim].

    Rows are grouped by sequence; a group's keys are the sequence's committed entries followed by
    the pass's rows of that sequence, in order, and `visible[r, j]` says which a row sees.
    """
    cache_dtype = np.float16 if a.kv_dtype == "f16" else np.float32
    k_new, v_new = k.astype(cache_dtype), v.astype(cache_dtype)
    new_kv[state.layer] = (k_new, v_new)
    out = np.empty((q.shape[0], a.n_head * a.head_dim), np.float32)
    for seq in np.unique(rows.seqs):
        mine = np.flatnonzero(rows.seqs == seq)
        ck, cv, cpos = kv.committed(int(seq), state.layer)
        keys = np.concatenate([ck, k_new[mine]])
        vals = np.concatenate([cv, v_new[mine]])
        visible = _visibility(rows, mine, cpos, a.window)
        out[mine] = attend(q[mine], keys, vals, visible, a)
    return out


def _visibility(rows: PassRows, mine: np.ndarray, committed_pos: np.ndarray, window: int) -> np.ndarray:
    """bool [len(mine), n_committed + len(mine)]: committed entries at or before the row's position
    (inside the window), and the row's ancestors in the pass with itself."""
    n_c = len(committed_pos)
    where = {int(r): i for i, r in enumerate(mine)}
    visible = np.zeros((len(mine), n_c + len(mine)), bool)
    for i, r in enumerate(mine):
        pos = rows.positions[r]
        seen_pos = committed_pos
        ok = seen_pos <= pos
        if window:
            ok &= seen_pos > pos - window
        visible[i, :n_c] = ok
        for anc in rows.ancestors(int(r)):
            j = where[anc]
            if not window or rows.positions[anc] > pos - window:
                visible[i, n_c + j] = True
    return visible


_ELEMENTWISE: dict[Op, Callable] = {
    Op.ADD: lambda x, a: (x[0] + x[1]).astype(np.float32),
    Op.MUL: lambda x, a: (x[0] * x[1]).astype(np.float32),
    Op.SCALE: lambda x, a: (x[0] * np.float32(a.factor)).astype(np.float32),
    Op.SILU: lambda x, a: numerics.silu(x[0]),
    Op.GELU: lambda x, a: numerics.gelu_ggml(x[0]),
    Op.SOFTCAP: lambda x, a: numerics.softcap(x[0], a.cap),
    Op.SWIGLU: lambda x, a: (numerics.silu(x[0]) * x[1]).astype(np.float32),
    Op.GEGLU: lambda x, a: (numerics.gelu_ggml(x[0]) * x[1]).astype(np.float32),
    Op.SPLIT: lambda x, a: np.ascontiguousarray(x[0][:, a.start : a.start + a.size]),
    Op.TAKE_ROWS: lambda x, a: x[0][x[1]],
}
