"""The device phase's rules: the work a device's kernels do in one launch, made visible in the IR.

Owns: `Fusions`, what a device declares its kernels fuse (each device names its own: CUDA's is
kinetic/codegen/cuda/renderer.py's FUSIONS, and the fused ops its runner.Capabilities lists include
these forms), the rules that produce the device forms of the IR (`add_rms_norm`, `rope_pair`,
`quantize`; kinetic/ir/ops.py), the three passes that apply them
(`DEVICE_PASSES`, run by pipeline.lower_for_device after the generic pipeline), and `computed_by`
and `quantized_in_producer`, which tell a device which values a fused node's launch computes. Does
not own the kernels, or when a device lowers (its runner does, at open: kinetic/codegen/cuda/model.py).

A rule fires only for a capability the device declares, so a device that declares none (the
default `Fusions()`) never sees a device form and runs the generic graph. Every device form
means exactly the op it stands for (its reference is that op's, kinetic/ir/reference.py), so the
phase is exact: the interpreter gives the same bits before and after (tests/passes/
test_device_fusion.py). What a form adds is which launch computes which value; where a launch
computes two values, the IR keeps one node per value and the fused node names the other:

    rms_norm(add(a, b) = s, w)          -> add_rms_norm(s, w)     s's launch computes the norm too
    rope(x, p) = e ... rope(y, p)       -> rope_pair(y, p, e)     one launch at the later rotation
                                                                  computes e too
    matmul(x, w) {q8}                   -> matmul(quantize(x) {format(w)}, w)   one quantize per
                                                                  (x, format), shared by its matmuls
    quantize(x) {f}                     -> quantize(x) {f, in_producer}         x's launch writes the
                                                                  quantized rows too

`keep` (the first layers of a model split between devices, which run elsewhere) are never changed
and never folded into another node's launch. The phase keeps every node id (a new quantize node takes
a fresh one), so a device can relate the graph it was given to the one it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gguf import GGMLQuantizationType

from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import QUANTIZED_ROWS, Op, QuantizeAttrs
from kinetic.ir.quants import QUANT_TYPES
from kinetic.passes.rewrite import Match, apply_rules, pat, rule


@dataclass(frozen=True)
class Fusions:
    """What a device's kernels compute in one launch; the device phase makes only these forms."""

    # weight types whose q8 matmuls read their rows from a quantize node (one quantization of a row
    # for every matmul that reads it)
    quantized_matmuls: frozenset[GGMLQuantizationType] = frozenset()
    add_rms_norm: bool = False  # a residual add and the whole-row RMS norm of its sum
    rope_pair: bool = False  # an attention's query and key rotations (same positions and tables)
    # (producer op, format): producers whose launch also writes their rows quantized, whole rows of
    # whole blocks; attention quantizes per head (whole blocks of a head; Q8_K: a head of 256 values)
    quantize_in: frozenset[tuple[Op, str]] = frozenset()

    def forms(self) -> frozenset[Op]:
        """The device forms the phase can make for these fusions."""
        made = {Op.ADD_RMS_NORM: self.add_rms_norm, Op.ROPE_PAIR: self.rope_pair,
                Op.QUANTIZE: bool(self.quantized_matmuls)}
        return frozenset(op for op, on in made.items() if on)

    def describe(self) -> dict:
        """The fusions as plain, sorted data (pipeline_hash reads it)."""
        return {"quantized_matmuls": sorted(t.name for t in self.quantized_matmuls),
                "add_rms_norm": self.add_rms_norm, "rope_pair": self.rope_pair,
                "quantize_in": sorted(f"{op.value}:{fmt}" for op, fmt in self.quantize_in)}


# ---- add + norm ---------------------------------------------------------------------------------


@rule(pat(Op.RMS_NORM, name="norm"))  # (with or without its weight: input 0 is checked below)
def fuse_add_rms_norm(m: Match) -> Node | None:
    """rms_norm(s = add(a, b), w) -> add_rms_norm(s, w)   for a whole-row norm, the first of s.

    The launch that computes s computes the norm too; its other input is a weight, there before s.
    """
    norm = m["norm"]
    s = m.node(norm.inputs[0])
    if not m.context.add_rms_norm or s.op is not Op.ADD or m.kept(s) or norm.attrs.group not in (0, norm.type.shape[1]):
        return None
    if any(r.op is Op.ADD_RMS_NORM for r in m.earlier_readers(s)):  # s's launch computes one norm
        return None
    if len(norm.inputs) == 2 and m.node(norm.inputs[1]).op is not Op.PARAM:
        return None
    return m.make(Op.ADD_RMS_NORM, tuple(m.node(i) for i in norm.inputs), norm.attrs)


# ---- rotary pairs -------------------------------------------------------------------------------


def _below_scales(m: Match, node: Node) -> Node:
    """The value under any scales (Gemma scales its queries after the rotation)."""
    while node.op is Op.SCALE:
        node = m.node(node.inputs[0])
    return node


def _attention_partner(m: Match, rotation: Node) -> Node | None:
    """The other rotation (q for k, k for q) of the attention that reads `rotation` through scales."""
    frontier = [rotation]
    while frontier:
        node = frontier.pop()
        for reader in m.readers(node):
            if reader.op is Op.SCALE:
                frontier.append(reader)
            elif reader.op is Op.ATTENTION and node.id in reader.inputs[:2]:
                other = reader.inputs[1] if reader.inputs[0] == node.id else reader.inputs[0]
                return _below_scales(m, m.node(other))
    return None


@rule(pat(Op.ROPE, name="late"))
def pair_rotations(m: Match) -> Node | None:
    """rope(y, p) -> rope_pair(y, p, e)   where e = rope(x, p) is the other rotation of the same
    attention, earlier in the graph, with the same tables (attributes equal but the head count).

    One launch at the later rotation computes both, so nothing may read e before it: every reader of
    e comes after the later rotation.
    """
    late = m["late"]
    if not m.context.rope_pair:
        return None
    early = _attention_partner(m, late)
    if early is None or early.op is not Op.ROPE or not m.is_earlier(early) or m.kept(early):
        return None
    if early.inputs[1] != late.inputs[1] or replace(early.attrs, n_head=0) != replace(late.attrs, n_head=0):
        return None
    if m.earlier_readers(early):
        return None
    return m.make(Op.ROPE_PAIR, (m.node(late.inputs[0]), m.node(late.inputs[1]), early), late.attrs)


# ---- quantized rows -----------------------------------------------------------------------------


@rule(pat(Op.MATMUL, pat(name="x"), pat(Op.PARAM, name="w"), name="mm"))
def quantize_matmul_input(m: Match) -> Node | None:
    """matmul(x, w) {q8} -> matmul(quantize(x) {format(w)}, w)   one quantize per (x, format).

    format(w) is the format w's dots take (QUANT_TYPES' activation); the first such matmul gets a new
    quantize node placed before it, the later ones read that one.
    """
    x, w, mm = m["x"], m["w"], m["mm"]
    wtype = w.type.ggml_type
    if mm.attrs.activations != "q8" or x.op is Op.QUANTIZE or wtype not in m.context.quantized_matmuls:
        return None
    fmt = QUANT_TYPES[wtype].activation
    if fmt not in QUANTIZED_ROWS:
        return None
    shared = [r for r in m.earlier_readers(x) if r.op is Op.QUANTIZE and r.attrs.format == fmt]
    rows = shared[0] if shared else m.insert(Op.QUANTIZE, (x,), QuantizeAttrs(fmt))
    return m.make(Op.MATMUL, (rows, w), mm.attrs)


def _whole_blocks(producer: Node, fmt: str) -> bool:
    """Whether the producer's launch writes whole blocks of `fmt`: per row, or per head (attention)."""
    block = QUANTIZED_ROWS[fmt]
    if producer.op is Op.ATTENTION:
        return producer.attrs.head_dim % block == 0 and (fmt != "q8_k" or producer.attrs.head_dim == block)
    if producer.op is Op.RMS_NORM and producer.attrs.group not in (0, producer.type.shape[1]):
        return False
    return producer.type.shape[1] % block == 0


@rule(pat(Op.QUANTIZE, pat(name="x"), name="q"))
def quantize_in_producer(m: Match) -> Node | None:
    """quantize(x) {f} -> quantize(x) {f, in_producer}   where x's launch can write f rows, for one
    quantize of x (the first).

    x's launch writes the quantized rows beside its own, so the quantize node launches nothing.
    """
    x, q = m["x"], m["q"]
    fmt = q.attrs.format
    if q.attrs.in_producer or (x.op, fmt) not in m.context.quantize_in or m.kept(x):
        return None
    if not _whole_blocks(x, fmt):
        return None
    if any(r.op is Op.QUANTIZE and r.attrs.in_producer for r in m.earlier_readers(x)):
        return None
    return m.make(Op.QUANTIZE, (x,), replace(q.attrs, in_producer=True))


# ---- the passes ---------------------------------------------------------------------------------

DevicePass = Callable[[Graph, Fusions, frozenset], Graph]


def fuse_launches(graph: Graph, caps: Fusions, keep: frozenset[int] = frozenset()) -> Graph:
    """add_rms_norm and rope_pair, where the device declares them."""
    return apply_rules(graph, (fuse_add_rms_norm, pair_rotations), context=caps, keep=keep)


def share_quantized_rows(graph: Graph, caps: Fusions, keep: frozenset[int] = frozenset()) -> Graph:
    """A quantize node before the q8 matmuls of the weight types the device declares."""
    return apply_rules(graph, (quantize_matmul_input,), context=caps, keep=keep)


def quantize_in_producers(graph: Graph, caps: Fusions, keep: frozenset[int] = frozenset()) -> Graph:
    """Quantize nodes whose producer's launch writes them, where the device declares the producer."""
    return apply_rules(graph, (quantize_in_producer,), context=caps, keep=keep)


# in this order: a quantize node is shared before a producer takes it in
DEVICE_PASSES: tuple[DevicePass, ...] = (fuse_launches, share_quantized_rows, quantize_in_producers)


def computed_by(graph: Graph) -> dict[int, int]:
    """node id -> the fused node whose launch computes it: an add_rms_norm's add -> the norm (which
    launches where the add stands), a rope_pair's other rotation -> the pair (which launches where it
    stands)."""
    out: dict[int, int] = {}
    for node in graph.nodes:
        if node.op is Op.ADD_RMS_NORM:
            out[node.inputs[0]] = node.id
        elif node.op is Op.ROPE_PAIR:
            out[node.inputs[2]] = node.id
    return out


def quantized_in_producer(graph: Graph) -> dict[int, Node]:
    """producer id -> the in-producer quantize node whose rows its launch writes."""
    return {n.inputs[0]: n for n in graph.nodes if n.op is Op.QUANTIZE and n.attrs.in_producer}
