"""Checking a .ktc file's graph against the weights it runs on, before any kernel sees either.

Owns: what the runtime takes from a graph on trust, checked once when a .ktc file's graph is used.
Anyone can edit an unsigned .ktc file and recompute its hashes, so a stored graph is hostile input:
* every param names a tensor of the weights section and has that tensor's type and shape (kernels
  read the tensor's bytes with the sizes the param's type gives);
* the graph verifies (kinetic.ir.graph.verify: every other node's type follows from its inputs);
* every integer attribute is a count, size or index, so none is negative (the specs compare products
  such as n_head * head_dim, which two negative values pass), attention has at least one head of at
  least one value, every float attribute (rotary frequency factors included) is finite;
* each KV-cache state node is the only one of its layer, has type kv[], is read by an attention and
  has the head count and head size of every attention that reads it (the cache is allocated from
  the state node, the kernels write what the attention says);
* the graph has a `logits` output f32[R, n_vocab] and every embedding table has at least n_vocab
  rows (the runtime accepts tokens below n_vocab and the embedding kernel reads their rows);
* the tokenizer's values have their types and it has no token past n_vocab.
Every failure is a KtcError naming the section (graph or tokenizer). Does not own the IR's specs
(kinetic/ir/ops.py) or reading the graph's text (kinetic/ir/text.py).
"""

from __future__ import annotations

import math
from pathlib import Path

from kinetic.errors import ModelFileError
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.tokenizer.vocab import check_vocab
from kinetic.ir.graph import Graph, Node, verify
from kinetic.ir.ops import Op, attr_fields
from kinetic.ir.types import R, TensorType, param_type
from kinetic.ktc.reader import KtcError

_HINT = "The file was edited or written by a faulty tool; compile it again from the .gguf file."


def check_graph(path: Path, graph: Graph, gguf: GGUFFile) -> None:
    """Raise a KtcError unless `graph` can run on `gguf`'s weights and tokenizer as it says."""
    _check_params(path, graph, gguf)
    try:
        verify(graph)
    except Exception as exc:  # a spec that divides by a zero head count raises ZeroDivisionError, say
        raise _graph_error(path, f"does not verify: {exc}") from None
    _check_attributes(path, graph)
    _check_states(path, graph)
    n_vocab = _check_vocabulary(path, graph)
    try:
        n_tokens = check_vocab(gguf.metadata, path.name)
    except ModelFileError as exc:
        raise KtcError(path, "tokenizer", f"section tokenizer: {exc.message}", _HINT) from None
    if n_tokens > n_vocab:
        raise KtcError(path, "tokenizer", f"section tokenizer has {n_tokens} tokens, more than the graph's "
                       f"{n_vocab} logits", _HINT)


def _graph_error(path: Path, what: str) -> KtcError:
    return KtcError(path, "graph", f"section graph {what}", _HINT)


def _check_params(path: Path, graph: Graph, gguf: GGUFFile) -> None:
    for node in graph.params():
        name = getattr(node.attrs, "tensor", None)
        info = gguf.tensors.get(name) if isinstance(name, str) else None
        if info is None:
            raise _graph_error(path, f"reads tensor {name!r}, which the weights section does not hold")
        actual = param_type(info.type, info.shape)
        if node.type != actual:
            raise _graph_error(path, f"gives tensor {name} the type {node.type}; the weights section holds it "
                               f"as {actual}")


def _check_attributes(path: Path, graph: Graph) -> None:
    for node in graph.nodes:
        for name, value in attr_fields(node.attrs):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if isinstance(value, int) and value < 0 or isinstance(value, float) and not math.isfinite(value):
                raise _graph_error(path, f"gives %{node.id} = {node.op.value} the attribute {name}={value}")
        if node.op is Op.ATTENTION and min(node.attrs.n_head, node.attrs.n_kv_head, node.attrs.head_dim) < 1:
            raise _graph_error(path, f"gives attention %{node.id} no heads or empty heads")
        if node.op in (Op.ROPE, Op.ROPE_PAIR) and not all(map(math.isfinite, node.attrs.freq_factors)):
            raise _graph_error(path, f"gives %{node.id} = {node.op.value} a frequency factor that is not finite")


def _check_states(path: Path, graph: Graph) -> None:
    states: dict[int, Node] = {}  # layer -> its state node
    read: set[int] = set()
    for node in graph.nodes:
        if node.op is Op.STATE:
            if node.type != TensorType("kv", ()) or node.attrs.layer in states:
                raise _graph_error(path, f"has a second or mistyped KV-cache state for layer {node.attrs.layer} "
                                   f"(%{node.id})")
            states[node.attrs.layer] = node
        elif node.op is Op.ATTENTION:
            a, state = node.attrs, graph.node(node.inputs[3])
            read.add(state.id)
            if (state.attrs.n_kv_head, state.attrs.head_dim) != (a.n_kv_head, a.head_dim):
                raise _graph_error(path, f"has attention %{node.id} with {a.n_kv_head} KV heads of {a.head_dim} "
                                   f"over a cache of {state.attrs.n_kv_head} of {state.attrs.head_dim}")
    unread = next((n for n in states.values() if n.id not in read), None)
    if unread is not None:
        raise _graph_error(path, f"has a KV-cache state %{unread.id} that no attention reads")


def _check_vocabulary(path: Path, graph: Graph) -> int:
    """n_vocab, the logits' width, after checking every embedding table has a row for each."""
    try:
        logits = graph.output("logits").type
    except KeyError:
        raise _graph_error(path, "has no logits output") from None
    if logits.dtype != "f32" or len(logits.shape) != 2 or logits.shape[0] != R or not isinstance(logits.shape[1], int):
        raise _graph_error(path, f"has logits of type {logits}, not f32[R,n_vocab]")
    n_vocab = logits.shape[1]
    for node in graph.nodes:
        if node.op is Op.EMBED:
            rows = graph.node(node.inputs[0]).type.shape[0]
            if not isinstance(rows, int) or rows < n_vocab:
                raise _graph_error(path, f"embeds tokens with %{node.id} from a table of {rows} rows, fewer "
                                   f"than the {n_vocab} logits")
    return n_vocab
