"""The compiled step: a graph turned into one tape that compiled code runs once per forward pass.

Owns: lowering an optimized graph to a tape of ops (kinetic.codegen.cpu.step_ops runs it), the
buffer plan (one float32 arena for activations and small weights, one byte arena for quantized
activations, both reused by liveness), the barrier plan, the persistent worker threads, and the
per-pass tables (rows' sequences, cache slots, who sees whom). Python runs per pass only the
embedding lookup, the rotary tables and, between compiled segments, any op no kernel covers yet
(a matmul of a type without a bit-exact kernel goes through the reference), so every file runs.

Plan of a pass: every thread walks the same tape. Row-local ops (norms, rotary, activations,
residual adds, activation quantization, KV stores) split the rows, and consecutive row-local ops
need no barrier between them; matmuls split output columns and attention splits (row, head) pairs,
so a barrier separates them from what reads their output. Consecutive independent matmuls (q/k/v,
gate/up) share one phase with no barrier between them, which is what concatenating their weights
would buy, without copying them. Buffers are reused only across a barrier.

Exactness: each op repeats the reference's floats for each row on its own (kinetic.ir.numerics), so
the step gives the reference interpreter's logits bit for bit, for any batch, grouping or thread
count (tests/codegen/cpu/test_cpu_step.py).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.common.libm import render_libm_map
from kinetic.codegen.cpu import float_matmul_ir as F
from kinetic.codegen.cpu import step_ops as S
from kinetic.codegen.cpu.activation_ir import render_quantize, render_round
from kinetic.codegen.cpu.attention_ir import heads_per_call, render_scores, render_softmax
from kinetic.codegen.cpu.executor import BIT_EXACT
from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.matmul import DEFAULT_TILE
from kinetic.codegen.cpu.matmul_ir import render_matmul
from kinetic.codegen.cpu.native import cycle_count, sched_yield_address
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import host
from kinetic.errors import KineticError
from kinetic.ir import numerics
from kinetic.ir.graph import Graph, Node
from kinetic.ir.interpreter import Interpreter, WeightSource
from kinetic.ir.ops import Op
from kinetic.ir.quants import dequantize_rows
from kinetic.ir.rows import KVView, PassResult, PassRows

F32 = np.float32
ALIGN = 16  # floats (64 bytes) between arena buffers
CONTENDED = 0.4  # a pass whose calling thread waited this share of its time at barriers was starved
STARVED_PASSES = 4  # this many starved passes among the last 8 (a lasting load, not one hiccup) ...
SOLO_SECONDS = 1.0  # ... run on one thread this long, then try all again
EMBED_KINDS = {Q.Q8_0: S.EMBED_Q8_0, Q.F16: S.EMBED_F16, Q.F32: S.EMBED_F32}  # tables the tape looks up itself
_ELEMENTWISE = {Op.ADD: S.OP_ADD, Op.MUL: S.OP_MUL, Op.SCALE: S.OP_SCALE, Op.SILU: S.OP_SILU,
                Op.GELU: S.OP_GELU, Op.SOFTCAP: S.OP_SOFTCAP, Op.SWIGLU: S.OP_SWIGLU, Op.GEGLU: S.OP_GEGLU}


def unsupported(graph: Graph) -> str | None:
    """Why the compiled step cannot run this graph (None: it can)."""
    for node in graph.nodes:
        a = node.attrs
        if node.op is Op.ATTENTION and a.kv_dtype != "f16":
            return f"a {a.kv_dtype} KV cache"
        if node.op is Op.ROPE and (a.yarn_ext_factor or a.llama3_factor):
            return "YaRN or llama3 rotary scaling"
        if node.op is Op.RMS_NORM and len(node.inputs) == 2:
            if graph.node(node.inputs[1]).op is not Op.PARAM:
                return "an rms_norm weight computed in the graph"
    return None


@dataclass(eq=False)
class _Instr:
    op: int  # a step_ops code, or 0 for a Python op
    args: list  # ints, or _Ref placeholders resolved by the buffer plan
    floats: tuple = ()
    reads: tuple = ()
    writes: tuple = ()
    row_local: bool = False
    output_rows: bool = False
    python: object = None  # callable(runner) for Python ops
    barrier: bool = False
    phase: int = 0
    # a row-local op's split across threads when a pass has fewer rows than threads: columns in
    # units of `unit` floats of a row `width` wide; whole_row: it reads all of its input's row
    width: int = 0
    unit: int = 0
    whole_row: bool = False
    column_barrier: bool = False
    column_args: dict | None = None  # {i: (values...)}: args i.. replaced in the column plan's row


@dataclass(frozen=True)
class _Ref:
    key: tuple
    part: str = ""  # "" (f32 arena offset) or q / d / e (byte-arena addresses)


@dataclass
class _Plan:
    instrs: list[_Instr] = field(default_factory=list)
    f32_sizes: dict = field(default_factory=dict)  # key -> floats
    q_sizes: dict = field(default_factory=dict)  # key -> (q bytes, d bytes, e bytes)
    constants: dict = field(default_factory=dict)  # key -> f32 values
    rope_tables: dict = field(default_factory=dict)  # (n_rot, theta, freq_scale) -> key


class CompiledStep:
    """Runs a graph's forward passes through one compiled tape; writes K/V into the caches in place."""

    in_place = True

    def __init__(self, graph: Graph, weights: WeightSource, *, threads: int | None = None, rows: int = 64):
        self.graph = graph
        self.weights = weights
        self.threads = max(1, threads or available_cpus())
        self.reference = Interpreter(weights)  # weights of Python ops, dequantized once
        self.jit = default_jit()
        self.variant = host().best_variant()
        self.gelu = numerics.gelu_table().astype(F32)
        self.layers = sorted({n.attrs.layer for n in graph.nodes if n.op is Op.STATE})
        self.layer_index = {layer: i for i, layer in enumerate(self.layers)}
        self.barrier = np.zeros(32, np.int64)
        self.yield_addr = sched_yield_address()
        self._kernels: dict = {}
        self._weights_held: list[np.ndarray] = []
        self._solo_until = 0.0
        self._lock = threading.Lock()  # a step's buffers serve one pass at a time
        self._starved = 0  # one bit per recent multi-threaded pass: was it starved?
        self._vocab = 1 << 62  # rows of the embedding table the tape reads (set when it has one)
        self._outputs = [(name, node_id, graph.node(node_id).type.shape[0] == "R") for name, node_id in graph.outputs]
        self._build(rows)

    # -- building --------------------------------------------------------------------------------

    def _build(self, rows: int) -> None:
        self.capacity = rows
        plan = self._lower()
        self._align_columns(plan)
        self._phases(plan)
        self._allocate(plan)
        self._encode(plan)

    def _kernel(self, kind: str, *key) -> int:
        if (kind, key) not in self._kernels:
            if kind == "quant":
                ir, name = render_quantize(*key)
            elif kind == "scores":
                ir, name = render_scores(*key)
            elif kind == "softmax":
                ir, name = render_softmax(*key)
            elif kind == "round":
                ir, name = render_round(*key)
            elif kind == "fmm":
                ir, name = F.render_float_matmul(*key, F.best_variant(key[0], host().flags), host().features)
            else:
                ir, name = render_matmul(*key, self.variant, DEFAULT_TILE)
            self._kernels[kind, key] = self.jit.address(ir, name)
        return self._kernels[kind, key]

    def _libm_address(self, name: str) -> int:
        """The C library's `name` over an array, compiled (numerics.rope_cos_sin's values)."""
        if ("libm", name) not in self._kernels:
            self._kernels["libm", name] = self.jit.address(*render_libm_map(name))
        return self._kernels["libm", name]

    def _rope_tables(self, plan: _Plan) -> None:
        """One instruction per distinct rotary table, first on the tape: each row's angles
        (numerics.rope_angles) and their cosines and sines through the C library's cosf / sinf."""
        for node in self.graph.nodes:
            if node.op is not Op.ROPE:
                continue
            a = node.attrs
            tkey = (a.n_rot, float(a.theta), float(a.freq_scale))
            if tkey in plan.rope_tables:
                continue
            table = plan.rope_tables[tkey] = ("rope", len(plan.rope_tables))
            half = a.n_rot // 2
            for part in ("angles", "cos", "sin"):
                plan.constants[table + (part,)] = np.zeros(self.capacity * half, F32)
            # ggml's theta_scale = powf(base, -2/n_rot), the C library's (numerics.rope_angles)
            step = numerics.powf(a.theta, F32(-2.0) / F32(a.n_rot))
            plan.instrs.append(_Instr(
                S.OP_ROPE_TABLE, [_Ref(table + ("angles",)), _Ref(table + ("cos",)), _Ref(table + ("sin",)), half,
                                  self._libm_address("cosf"), self._libm_address("sinf")],
                (step, F32(a.freq_scale)), writes=(table + ("angles",), table + ("cos",), table + ("sin",)),
                row_local=True, width=half, unit=half))

    def _attention_kernels(self, group: int, n_kv_head: int, head_dim: int, softcap: bool,
                           threads: int) -> tuple[int, int, int]:
        """Addresses of the generated score and softmax kernels and the heads an item carries
        ((0, 0, 1): the numba path), for passes whose single row must still feed `threads` threads."""
        if head_dim % 64:
            return 0, 0, 1
        heads = heads_per_call(group, n_kv_head, threads)
        return self._kernel("scores", head_dim, heads), self._kernel("softmax", head_dim, heads, softcap), heads

    def _lower(self) -> _Plan:
        g, cap = self.graph, self.capacity
        plan = _Plan()
        quantized: dict = {}
        self._rope_tables(plan)
        for node in g.nodes:
            op, a = node.op, node.attrs
            ins = [g.node(i) for i in node.inputs]
            if op in (Op.INPUT, Op.PARAM, Op.STATE):
                continue
            out = ("v", node.id)
            out_rows = node.type.shape[0] == "R"
            width = node.type.shape[1] if len(node.type.shape) == 2 else 0
            if width:
                plan.f32_sizes[out] = cap * width
            if op is Op.EMBED and ins[0].type.ggml_type in EMBED_KINDS:
                raw = np.ascontiguousarray(self.weights.tensor(ins[0].attrs.tensor))
                self._weights_held.append(raw)  # the tape holds its address
                self._vocab = raw.shape[0]
                plan.instrs.append(_Instr(
                    S.OP_EMBED, [raw.ctypes.data, raw.strides[0], _Ref(out), width,
                                 EMBED_KINDS[ins[0].type.ggml_type]],
                    writes=(out,), row_local=True, width=width, unit=32))
            elif op is Op.EMBED:
                plan.instrs.append(_Instr(0, [], writes=(out,), python=_embed(ins[0], node, self)))
            elif op is Op.MATMUL:
                w = ins[1]
                k = ins[0].type.shape[1]
                if a.activations == "q8" and w.type.ggml_type in BIT_EXACT:
                    layout = LAYOUTS[w.type.ggml_type]
                    fmt = layout.activation
                    qkey = ("q", ins[0].id, fmt)
                    if qkey not in quantized:
                        block = 256 if fmt == "q8_k" else 32
                        e_row = {"q8_1": k // 32 * 4, "q8_k": k // 16 * 4}.get(fmt, 0)
                        plan.q_sizes[qkey] = (cap * k, cap * (k // block) * 4, cap * e_row)
                        quantized[qkey] = True
                        plan.instrs.append(_Instr(
                            S.OP_QUANT,
                            [_value(ins[0]), k, self._kernel("quant", fmt), _Ref(qkey, "q"), _Ref(qkey, "d"),
                             _Ref(qkey, "e"), block, e_row],
                            reads=(("v", ins[0].id),), writes=(qkey,), row_local=True, output_rows=out_rows,
                            width=k, unit=block))
                    raw = np.asarray(self.weights.tensor(w.attrs.tensor))
                    self._weights_held.append(raw)  # the tape holds its address
                    plan.instrs.append(_Instr(
                        S.OP_MATMUL,
                        [self._kernel("mm", layout.wtype, k), raw.ctypes.data, _Ref(qkey, "q"), _Ref(qkey, "d"),
                         _Ref(qkey, "e"), _Ref(out), node.type.shape[1]],
                        reads=(qkey,), writes=(out,), output_rows=out_rows))
                elif a.activations == "q8" and w.type.ggml_type in F.FLOAT_TYPES:
                    self._float_matmul(plan, node, ins[0], w, quantized)
                else:
                    plan.instrs.append(_Instr(0, [], reads=(("v", ins[0].id),), writes=(out,),
                                              python=_matmul(ins[0], w, node, self)))
            elif op is Op.RMS_NORM:
                wref, wsize = -1, 0
                if len(ins) == 2:
                    values = self.reference.weight(ins[1]).values.reshape(-1).astype(F32)
                    ckey = ("c", ins[1].attrs.tensor)
                    plan.constants[ckey] = values
                    wref, wsize = _Ref(ckey), values.size
                plan.instrs.append(_Instr(
                    S.OP_RMS_NORM, [_value(ins[0]), _Ref(out), width, a.group or width, wref, wsize], (F32(a.eps),),
                    reads=(("v", ins[0].id),), writes=(out,), row_local=True, output_rows=out_rows,
                    width=width, unit=16 if not a.group or a.group == width else a.group, whole_row=True))
            elif op is Op.ROPE:
                table = plan.rope_tables[(a.n_rot, float(a.theta), float(a.freq_scale))]
                plan.instrs.append(_Instr(
                    S.OP_ROPE, [_value(ins[0]), _Ref(out), a.n_head, a.head_dim, a.n_rot, int(a.neox),
                                _Ref(table + ("cos",)), _Ref(table + ("sin",))],
                    reads=(("v", ins[0].id), table + ("cos",), table + ("sin",)), writes=(out,), row_local=True,
                    output_rows=out_rows,
                    width=a.n_head * a.head_dim, unit=a.head_dim))
            elif op is Op.ATTENTION:
                layer = self.layer_index[ins[3].attrs.layer]
                kvkey = ("kv", layer)
                plan.instrs.append(_Instr(
                    S.OP_KV_STORE, [_value(ins[1]), _value(ins[2]), a.n_kv_head * a.head_dim, layer],
                    reads=(("v", ins[1].id), ("v", ins[2].id)), writes=(kvkey,), row_local=True,
                    width=a.n_kv_head * a.head_dim, unit=a.head_dim))  # as rotary splits the keys
                if a.softcap:
                    scale, cap_ = F32(F32(a.scale) / F32(a.softcap)), F32(a.softcap)
                else:
                    scale, cap_ = F32(a.scale), F32(0)
                shape = (a.n_head // a.n_kv_head, a.n_kv_head, a.head_dim, bool(a.softcap))
                # passes of several rows (prompts, drafts) give every thread rows: an item carries all
                # the query heads of a KV head, widening each key and value once for all of them; a
                # pass of one row splits them as the threads need (the column plan)
                plan.instrs.append(_Instr(
                    S.OP_ATTEND, [_value(ins[0]), _Ref(out), layer, a.n_head, a.n_kv_head, a.head_dim, a.window,
                                  *self._attention_kernels(*shape, threads=1), _f32_bits(scale), _f32_bits(cap_)],
                    (scale, cap_), reads=(("v", ins[0].id), kvkey), writes=(out,),
                    column_args={7: self._attention_kernels(*shape, threads=self.threads)}))
            elif op is Op.TAKE_ROWS:
                plan.instrs.append(_Instr(S.OP_TAKE_ROWS, [_value(ins[0]), _Ref(out), width],
                                          reads=(("v", ins[0].id),), writes=(out,), output_rows=True))
            elif op in _ELEMENTWISE:
                second = _value(ins[1]) if len(ins) == 2 else 0
                floats = ()
                if op is Op.SCALE:
                    floats = (F32(a.factor),)
                elif op is Op.SOFTCAP:
                    floats = (F32(a.cap), F32(F32(1) / F32(a.cap)))
                plan.instrs.append(_Instr(
                    _ELEMENTWISE[op], [_value(ins[0]), second, _Ref(out), width], floats,
                    reads=tuple(("v", i.id) for i in ins), writes=(out,), row_local=True, output_rows=out_rows,
                    width=width, unit=16))
            else:
                raise KineticError(f"the compiled step has no lowering for {op.value}", "Use --device reference.")
        return plan

    def _float_matmul(self, plan: _Plan, node: Node, x: Node, w: Node, converted: dict) -> None:
        """An F16/BF16/F32 matmul: x rounded once to what the kernel reads (row-local, shared by every
        matmul of that input and type, as a quantization is; F32 reads x itself), then the kernel on
        the weight as stored, threads splitting its columns."""
        wtype, k = w.type.ggml_type, x.type.shape[1]
        out_rows = node.type.shape[0] == "R"
        source, reads = _Ref(("v", x.id), "address"), (("v", x.id),)
        if wtype is not Q.F32:
            fmt, row_bytes = wtype.name.lower(), k * F.ACTIVATION_BYTES[wtype]
            rkey = ("q", x.id, fmt)
            if rkey not in converted:
                converted[rkey] = True
                plan.q_sizes[rkey] = (0, 0, self.capacity * row_bytes)
                plan.instrs.append(_Instr(  # OP_QUANT with blocks of one value, written through e
                    S.OP_QUANT, [_value(x), k, self._kernel("round", fmt), _Ref(rkey, "q"), _Ref(rkey, "d"),
                                 _Ref(rkey, "e"), 1, row_bytes],
                    reads=reads, writes=(rkey,), row_local=True, output_rows=out_rows, width=k, unit=16))
            source, reads = _Ref(rkey, "e"), (rkey,)
        raw = np.asarray(self.weights.tensor(w.attrs.tensor))
        self._weights_held.append(raw)  # the tape holds its address
        plan.instrs.append(_Instr(
            S.OP_MATMUL, [self._kernel("fmm", wtype, k), raw.ctypes.data, source, 0, 0, _Ref(("v", node.id)),
                          node.type.shape[1]],
            reads=reads, writes=(("v", node.id),), output_rows=out_rows))

    def _align_columns(self, plan: _Plan) -> None:
        """Let an op that only feeds an activation quantization split its columns in the
        quantization's blocks, so the column plan needs no barrier between them (the split of an
        elementwise op or of an RMS norm over whole rows is free to choose)."""
        producer: dict = {}
        for ins in plan.instrs:
            if ins.op == S.OP_QUANT:
                src = producer.get(ins.reads[0])
                free = src is not None and (src.op in _ELEMENTWISE.values() or (src.op == S.OP_RMS_NORM
                                                                              and src.unit == 16))
                if free and src.width == ins.width and src.output_rows == ins.output_rows:
                    src.unit = ins.unit
            for key in ins.writes:
                producer[key] = ins

    def _phases(self, plan: _Plan) -> None:
        """Barriers: after an op whose output (or input) a later op of the same phase touches across
        the threads' split; Python ops stand alone. Two plans: rows split (a pass of at least as
        many rows as threads) and columns split (fewer rows, e.g. decode), which needs more
        barriers; buffers are planned on the first, whose barriers the second keeps."""
        for columns in (False, True):
            phase = 0
            current: list[_Instr] = []
            for ins in plan.instrs:
                clash = ins.python is not None or any(_clash(p, ins, columns) for p in current)
                if clash and current:
                    if columns:
                        current[-1].column_barrier = True
                    else:
                        current[-1].barrier = True
                        phase += 1
                    current = []
                if not columns:
                    ins.phase = phase
                current.append(ins)

    def _allocate(self, plan: _Plan) -> None:
        last_use: dict = {}
        first_def: dict = {}
        for ins in plan.instrs:
            for key in ins.writes:
                first_def.setdefault(key, ins.phase)
            for key in ins.reads + ins.writes:
                last_use[key] = ins.phase
        for _name, node_id in self.graph.outputs:
            last_use[("v", node_id)] = 1 << 60
        self.offsets: dict = {}
        # constants first (never freed), then activations reusing same-size slots across barriers
        top = 0
        for key, values in plan.constants.items():
            self.offsets[key] = top
            top += _aligned(values.size)
        free: dict[int, list[tuple[int, int]]] = {}
        order = sorted(first_def, key=lambda k: first_def[k])
        qtop = 0
        qfree: dict[tuple, list[tuple[int, int]]] = {}
        self.q_offsets: dict = {}
        for key in order:
            if key in plan.f32_sizes:
                size = _aligned(plan.f32_sizes[key])
                slot = _take(free.setdefault(size, []), first_def[key])
                if slot is None:
                    slot, top = top, top + size
                self.offsets[key] = slot
                free[size].append((slot, last_use[key]))
            elif key in plan.q_sizes:
                sizes = tuple(_aligned(s, 64) for s in plan.q_sizes[key])
                slot = _take(qfree.setdefault(sizes, []), first_def[key])
                if slot is None:
                    slot, qtop = qtop, qtop + sum(sizes)
                self.q_offsets[key] = (slot, slot + sizes[0], slot + sizes[0] + sizes[1])
                qfree[sizes].append((slot, last_use[key]))
        self.arena = np.zeros(top + ALIGN, F32)
        self.qarena = np.zeros(qtop + 64, np.uint8)
        for key, values in plan.constants.items():
            self.arena[self.offsets[key]: self.offsets[key] + values.size] = values
        self.plan = plan

    def _encode(self, plan: _Plan) -> None:
        qbase = self.qarena.ctypes.data
        rows, column_rows = [], []
        frows = []
        for ins in plan.instrs:
            args = []
            for x in ins.args:
                if isinstance(x, _Ref):
                    if x.part == "address":  # an f32 arena buffer's address (a kernel reads it)
                        args.append(self.arena.ctypes.data + 4 * self.offsets[x.key])
                    elif x.part:
                        args.append(qbase + self.q_offsets[x.key]["qde".index(x.part)])
                    else:
                        args.append(self.offsets[x.key])
                else:
                    args.append(int(x))
            out_rows = S.FLAG_OUTPUT_ROWS if ins.output_rows else 0
            row = [ins.op, (S.FLAG_BARRIER if ins.barrier else 0) | out_rows] + args
            row += [0] * (S.TAPE_WIDTH - 2 - len(row)) + [ins.width, ins.unit]
            rows.append(row)
            column_flags = (S.FLAG_BARRIER if ins.column_barrier else 0) | out_rows | S.FLAG_COLUMNS
            column_row = [ins.op, column_flags] + row[2:]
            for i, values in (ins.column_args or {}).items():
                column_row[2 + i: 2 + i + len(values)] = values
            column_rows.append(column_row)
            frows.append(list(map(float, ins.floats)) + [0.0] * (4 - len(ins.floats)))
        self.tape = np.array(rows, np.int64).reshape(-1, S.TAPE_WIDTH)
        self.column_tape = np.array(column_rows, np.int64).reshape(-1, S.TAPE_WIDTH)
        self.cycles = np.zeros((len(rows), 2), np.int64)  # per op: cycles working, cycles waiting
        self.ftape = np.array(frows, np.float64).reshape(-1, 4)
        self.segments: list = []  # (start, end) of compiled runs, or a Python instr
        start = None
        for i, ins in enumerate(plan.instrs):
            if ins.python is not None:
                if start is not None:
                    self.segments.append((start, i))
                    start = None
                self.segments.append(ins)
            elif start is None:
                start = i
        if start is not None:
            self.segments.append((start, len(plan.instrs)))

    # -- running ----------------------------------------------------------------------------------

    def _threads_now(self) -> int:
        """All threads, unless recent passes kept spending much of their time waiting for a thread
        that another process keeps off its core: then one thread for a while (spinning barriers
        would collapse), then all again. One starved pass (a hiccup) changes nothing."""
        return 1 if time.monotonic() < self._solo_until else self.threads

    def profile(self) -> list[tuple[str, int, float, float]]:
        """Where the calling thread's time went since the step was built: (op, count, share of the
        compiled time working, share waiting at its barriers), largest first. Matmuls are named by
        their output width."""
        names = {getattr(S, k): k[3:].lower() for k in dir(S) if k.startswith("OP_")}
        total = max(int(self.cycles.sum()), 1)
        work: dict[str, list] = {}
        for i, row in enumerate(self.tape):
            name = names[int(row[0])] if row[0] else "python"
            if row[0] == S.OP_MATMUL:
                name += f" N={row[8]}"
            entry = work.setdefault(name, [0, 0, 0])
            entry[0] += 1
            entry[1] += int(self.cycles[i, 0])
            entry[2] += int(self.cycles[i, 1])
        rows = [(k, v[0], v[1] / total, v[2] / total) for k, v in work.items()]
        return sorted(rows, key=lambda r: -(r[2] + r[3]))

    def view(self, node_id: int, rows: int) -> np.ndarray:
        node = self.graph.node(node_id)
        width = node.type.shape[1]
        off = self.offsets[("v", node_id)]
        return self.arena[off: off + rows * width].reshape(rows, width)

    def run(self, graph: Graph, rows: PassRows, caches: KVView) -> PassResult:
        with self._lock:
            return self._run(rows, caches)

    def close(self) -> None:
        """Nothing to free on a device: the arenas go with the step, the worker threads serve the process."""

    def _run(self, rows: PassRows, caches: KVView) -> PassResult:
        n = len(rows.tokens)
        if n > self.capacity:
            self._build(max(n, 2 * self.capacity))
        n_out = len(rows.output_rows)
        self.pass_rows = rows
        tables = _PassTables(rows, caches, self.layers)
        positions = rows.positions.astype(np.int32, copy=False)
        tokens = rows.tokens.astype(np.int32, copy=False)
        low, high = (tokens[0], tokens[0]) if n == 1 else (tokens.min(initial=0), tokens.max(initial=0))
        if not (0 <= low and high < self._vocab):  # the embedding reads its table by token id
            raise KineticError(f"a token id is outside the vocabulary (0..{self._vocab - 1})",
                               "Check the token ids of the prompt.")
        common = (self.arena, self.arena.ctypes.data, n, n_out, rows.output_rows.astype(np.int32, copy=False),
                  tokens, positions,
                  tables.row_slot, tables.row_cidx, tables.slot_rows, tables.anc, tables.kv_addr, tables.clen,
                  tables.cpos_addr, self.gelu, self.barrier.ctypes.data, self.yield_addr, self.cycles)
        threads = self._threads_now()
        begin, waited = cycle_count(), 0
        for seg in self.segments:
            if isinstance(seg, tuple):
                tape = self.column_tape if n < threads else self.tape
                waited += _run_parallel(tape, self.ftape, seg, threads, common)
            else:
                seg.python(n, n_out)
        if threads > 1:
            self._starved = (self._starved << 1 | (waited > CONTENDED * (cycle_count() - begin))) & 0xFF
            if bin(self._starved).count("1") >= STARVED_PASSES:
                self._solo_until = time.monotonic() + SOLO_SECONDS
                self._starved = 0
        outputs = {name: self.view(node_id, n_out if per_output else n).copy()
                   for name, node_id, per_output in self._outputs}
        return PassResult(outputs, {})


def available_cpus() -> int:
    """The logical CPUs this process may run on (the default thread count, as llama.cpp's -t)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _f32_bits(x) -> int:
    return int(np.float32(x).view(np.uint32))


def _aligned(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


def _value(node: Node) -> _Ref:
    """The f32 arena buffer of a node's value."""
    return _Ref(("v", node.id))


def _clash(p: _Instr, ins: _Instr, columns: bool) -> bool:
    """Whether `ins` may not run in the same phase as the earlier `p`."""
    if p.python is not None:
        return True
    shared = (set(p.writes) & (set(ins.reads) | set(ins.writes))) | (set(p.reads) & set(ins.writes))
    if not shared:
        return False
    if not (p.row_local and ins.row_local and p.output_rows == ins.output_rows):
        return True
    if not columns:
        return False
    same_split = p.unit == ins.unit and p.width == ins.width and p.unit > 0
    return not same_split or (ins.whole_row and bool(shared & set(ins.reads))) or (
        p.whole_row and bool(shared & set(p.reads)))


def _take(slots: list[tuple[int, int]], phase: int) -> int | None:
    """A slot whose last reader ran in an earlier phase than `phase`."""
    for i, (slot, last) in enumerate(slots):
        if last < phase:
            del slots[i]
            return slot
    return None


def _embed(table: Node, node: Node, step: CompiledStep):
    raw = step.weights.tensor(table.attrs.tensor)

    def run(n: int, n_out: int) -> None:
        rows = dequantize_rows(raw, table.type.ggml_type, step.pass_rows.tokens)
        step.view(node.id, n)[:] = rows.reshape(n, -1)

    return run


def _matmul(x: Node, weight: Node, node: Node, step: CompiledStep):
    def run(n: int, n_out: int) -> None:
        rows = n_out if node.type.shape[0] == "R" else n
        step.view(node.id, rows)[:] = step.reference.matmul(step.view(x.id, rows), weight, node.attrs)

    return run


_CHAIN_TABLES: dict[int, tuple] = {}


class _PassTables:
    """Per-pass arrays the compiled attention reads: each row's cache slot and cache index, the pass
    rows of each slot in order, who sees whom among the pass rows, and the caches' addresses."""

    def __init__(self, rows: PassRows, caches: KVView, layers: list[int]):
        n = len(rows.tokens)
        if rows.chain_seq >= 0:
            self._one_chain(rows, caches.sequence(rows.chain_seq), layers, n)  # the usual pass
            return
        seqs = [int(s) for s in dict.fromkeys(rows.seqs.tolist())]
        slot_of = {s: i for i, s in enumerate(seqs)}
        self.row_slot = np.array([slot_of[int(s)] for s in rows.seqs], np.int32)
        counts = np.bincount(self.row_slot, minlength=len(seqs))
        self.slot_rows = np.full((len(seqs), max(counts)), -1, np.int32)
        self.clen = np.zeros(len(seqs), np.int64)
        self.cpos_addr = np.zeros(len(seqs), np.int64)
        self.kv_addr = np.zeros((len(seqs), len(layers), 2), np.int64)
        self.row_cidx = np.zeros(n, np.int32)
        filled = np.zeros(len(seqs), np.int64)
        for s, seq in enumerate(seqs):
            cache = caches.sequence(seq)
            cache.check_room(int(counts[s]))  # rows are written even when the pass is not committed
            self.clen[s] = cache.length
            self.cpos_addr[s] = cache.positions.ctypes.data
            self.kv_addr[s] = cache.addresses(layers)
        for r in range(n):
            s = self.row_slot[r]
            self.slot_rows[s, filled[s]] = r
            self.row_cidx[r] = self.clen[s] + filled[s]
            filled[s] += 1
        parents = rows.parents
        self.anc = np.zeros((n, n), np.uint8)
        for r in range(n):
            p = r
            while p >= 0:
                self.anc[r, p] = 1
                p = int(parents[p])

    def _one_chain(self, rows: PassRows, cache, layers: list[int], n: int) -> None:
        """One sequence's consecutive rows (a prompt chunk or a decode step): few numpy calls, as
        each costs tens of microseconds when a pass has just swept the caches."""
        cache.check_room(n)
        if n not in _CHAIN_TABLES:  # the tables that depend only on n (compiled code only reads them)
            _CHAIN_TABLES[n] = (np.zeros(n, np.int32), np.arange(n, dtype=np.int32)[None, :],
                                np.tri(n, dtype=np.uint8))
        self.row_slot, self.slot_rows, self.anc = _CHAIN_TABLES[n]
        self.clen = np.array([cache.length], np.int64)
        self.cpos_addr = np.array([cache.positions.ctypes.data], np.int64)
        self.kv_addr = cache.addresses(layers)[None]
        self.row_cidx = self.slot_rows[0] + np.int32(cache.length)


# -- one persistent pool of worker threads per process -----------------------------------------------

_workers: list[queue.SimpleQueue] = []
_lock = threading.Lock()


def _worker(inbox: queue.SimpleQueue) -> None:
    while True:
        S.drive(*inbox.get())


def _pool(n: int) -> list[queue.SimpleQueue]:
    with _lock:
        while len(_workers) < n:
            inbox = queue.SimpleQueue()
            threading.Thread(target=_worker, args=(inbox,), daemon=True,
                             name=f"kinetic-step-{len(_workers) + 1}").start()
            _workers.append(inbox)
        return _workers[:n]


def _run_parallel(tape, ftape, seg: tuple[int, int], threads: int, common: tuple) -> int:
    """Every thread runs tape[start:end]; the tape's closing barrier means that when the calling
    thread returns, the workers have finished their shares too (they touch nothing after it).
    Returns the cycles the calling thread waited at barriers."""
    start, end = seg
    for tid, inbox in enumerate(_pool(threads - 1), start=1):
        inbox.put((tape, ftape, start, end, tid, threads) + common)
    return S.drive(tape, ftape, start, end, 0, threads, *common)
