"""The IR's text form: a printer and a parser that round-trip exactly.

Owns: `print_graph(graph) -> str` and `parse_graph(text) -> Graph`, with
`parse_graph(print_graph(g)) == g` for every graph (node ids, attributes, floats, outputs, meta).
Reads each op's attributes and shape inference from its spec (kinetic/ir/ops.py, `OPS`); does not
own what ops compute (kinetic/ir/reference.py).

The form, one statement per line (docs/ir.md describes it in full):

    meta family = "llama"
    %3 = param() {tensor="blk.0.ffn_gate.weight"} : q4_1[1536,576]
    %12 = matmul(%10, %3) {activations="q8"} : f32[T,1536]
    %13 = silu(%12) : f32[T,1536]
    output logits = %13

Every attribute field is printed, defaults included, so a stored file keeps its meaning if a default
changes later; the parser fills in defaults a hand-written line leaves out. The one exception is a
reduction's `order` before the batch-invariance pass has written it (empty: not assigned yet), which
is left out, so a dump shows orders from that phase on. Floats print with
`repr`, which reads back to the same double. Lines starting with `#` and blank lines are ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, fields

from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import OPS, Op, VerifyError, infer_type
from kinetic.ir.types import TensorType

HEADER = "# kinetic ir"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_NODE = re.compile(
    r"%(?P<id>\d+)\s*=\s*(?P<op>[a-z_0-9]+)\s*\((?P<inputs>[^)]*)\)\s*"
    r"(?P<attrs>\{.*\})?\s*:\s*(?P<type>[a-z0-9_]+\[[^\]]*\])"
)
_NAMED = re.compile(r"(?P<kind>meta|output)\s+(?P<key>\"(?:[^\"\\]|\\.)*\"|[^\s=]+)\s*=\s*(?P<value>.+)")
_ATTR = re.compile(r'\s*(?P<key>[a-z_][a-z0-9_]*)\s*=\s*(?P<value>"(?:[^"\\]|\\.)*"|\[[^\]]*\]|[^,}\s"\[]+)\s*'
                   r'(?P<end>[,}])')
_OPS_BY_NAME = {op.value: op for op in Op}


class IRParseError(ValueError):
    """Text that is not a valid graph; the message names the line."""

    def __init__(self, line_no: int, message: str):
        super().__init__(f"line {line_no}: {message}")
        self.line_no = line_no


# ---- printing -----------------------------------------------------------------------------------


def print_graph(graph: Graph) -> str:
    """The text form of `graph`: a header comment, meta lines, one line per node, output lines."""
    lines = [HEADER]
    lines += [f"meta {_print_key(key)} = {_print_string(value)}" for key, value in graph.meta]
    lines += [print_node(node) for node in graph.nodes]
    lines += [f"output {_print_key(name)} = %{node_id}" for name, node_id in graph.outputs]
    return "\n".join(lines) + "\n"


def print_node(node: Node) -> str:
    """One node: `%id = op(%a, %b) {field=value, ...} : type` (no braces for attribute-less ops)."""
    inputs = ", ".join(f"%{i}" for i in node.inputs)
    attrs = ", ".join(f"{f.name}={_print_value(getattr(node.attrs, f.name))}" for f in fields(node.attrs)
                      if not (f.name == "order" and getattr(node.attrs, f.name) == ""))
    attrs_text = f" {{{attrs}}}" if attrs else ""
    return f"%{node.id} = {node.op.value}({inputs}){attrs_text} : {node.type}"


def _print_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return _print_string(value)
    if isinstance(value, tuple) and all(isinstance(v, float) for v in value):
        return "[" + ", ".join(repr(v) for v in value) + "]"
    raise TypeError(f"attribute value {value!r} has no text form")


def _print_string(value: str) -> str:
    return json.dumps(value)


def _print_key(key: str) -> str:
    return key if _NAME.fullmatch(key) else _print_string(key)


# ---- parsing ------------------------------------------------------------------------------------


def parse_graph(text: str, *, check_types: bool = True) -> Graph:
    """The graph `text` describes; raises IRParseError naming the first bad line.

    With check_types, every non-leaf node's type is re-inferred from its inputs as it is read, so a
    wrong type is reported at its line rather than later by the verifier.
    """
    nodes: dict[int, Node] = {}
    outputs: list[tuple[str, int]] = []
    meta: list[tuple[str, str]] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("%"):
            node = _parse_node(line, line_no, nodes)
            if check_types:
                _check_type(node, nodes, line_no)
            nodes[node.id] = node
            continue
        kind, key, value = _parse_named(line, line_no)
        if kind == "meta":
            meta.append((key, _parse_string(value, line_no)))
        else:
            outputs.append((key, _parse_output_ref(value, line_no, nodes)))
    return Graph(tuple(nodes.values()), tuple(outputs), tuple(meta))


def _parse_node(line: str, line_no: int, defined: dict[int, Node]) -> Node:
    m = _NODE.fullmatch(line)
    if m is None:
        raise IRParseError(line_no, f"expected `%id = op(%inputs) {{attrs}} : type`, got {line!r}")
    node_id = int(m["id"])
    if node_id in defined:
        raise IRParseError(line_no, f"%{node_id} is defined twice")
    op = _OPS_BY_NAME.get(m["op"])
    if op is None:
        raise IRParseError(line_no, f"unknown op {m['op']!r}")
    inputs = _parse_inputs(m["inputs"], line_no, defined)
    attrs = _parse_attrs(op, m["attrs"] or "", line_no)
    try:
        type_ = TensorType.parse(m["type"])
    except ValueError as exc:
        raise IRParseError(line_no, str(exc)) from None
    return Node(node_id, op, attrs, inputs, type_)


def _parse_inputs(text: str, line_no: int, defined: dict[int, Node]) -> tuple[int, ...]:
    inputs = []
    for part in (p.strip() for p in text.split(",")) if text.strip() else ():
        if not re.fullmatch(r"%\d+", part):
            raise IRParseError(line_no, f"an input must be %id, got {part!r}")
        ref = int(part[1:])
        if ref not in defined:
            raise IRParseError(line_no, f"%{ref} is used before it is defined")
        inputs.append(ref)
    return tuple(inputs)


def _parse_attrs(op: Op, text: str, line_no: int) -> object:
    """The op's attribute dataclass from `{key=value, ...}`; missing fields take their defaults."""
    cls = OPS[op].attrs
    declared = {f.name: f for f in fields(cls)}
    values: dict[str, object] = {}
    body = text.strip()
    if body:
        for key, literal in _split_attrs(body, line_no):
            if key not in declared:
                raise IRParseError(line_no, f"{op.value} has no attribute {key!r}")
            if key in values:
                raise IRParseError(line_no, f"attribute {key!r} given twice")
            values[key] = _parse_value(literal, str(declared[key].type), key, line_no)
    missing = [n for n, f in declared.items() if n not in values and f.default is MISSING]
    if missing:
        raise IRParseError(line_no, f"{op.value} needs attribute(s) {', '.join(missing)}")
    return cls(**values)


def _split_attrs(body: str, line_no: int) -> list[tuple[str, str]]:
    """`{a=1, b="x"}` -> [("a", "1"), ("b", '"x"')]."""
    if body == "{}":
        return []
    pairs, pos = [], 1
    while pos < len(body):
        m = _ATTR.match(body, pos)
        if m is None:
            raise IRParseError(line_no, f"bad attributes at {body[pos:]!r}")
        pairs.append((m["key"], m["value"]))
        pos = m.end()
        if m["end"] == "}":
            break
    if pos != len(body):
        raise IRParseError(line_no, f"unexpected text after attributes: {body[pos:]!r}")
    return pairs


def _parse_value(literal: str, annotation: str, key: str, line_no: int) -> object:
    """A literal read as the field's declared type (an int literal is accepted for a float field)."""
    try:
        if annotation == "str":
            return _parse_string(literal, line_no)
        if annotation == "bool":
            return {"true": True, "false": False}[literal]
        if annotation == "int":
            return int(literal)
        if annotation == "float":
            return float(literal)
        if annotation == "tuple[float, ...]" and literal.startswith("[") and literal.endswith("]"):
            return tuple(float(v) for v in literal[1:-1].split(",") if v.strip())
    except (KeyError, ValueError):
        raise IRParseError(line_no, f"attribute {key} must be {annotation}, got {literal}") from None
    raise IRParseError(line_no, f"attribute {key} has type {annotation}, which has no text form")


def _parse_string(literal: str, line_no: int) -> str:
    literal = literal.strip()
    try:
        value = json.loads(literal) if literal.startswith('"') else None
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, str):
        raise IRParseError(line_no, f"expected a quoted string, got {literal}")
    return value


def _parse_named(line: str, line_no: int) -> tuple[str, str, str]:
    m = _NAMED.fullmatch(line)
    if m is None:
        raise IRParseError(line_no, f"expected a node, `meta KEY = \"VALUE\"` or `output NAME = %id`, got {line!r}")
    key = m["key"]
    key = _parse_string(key, line_no) if key.startswith('"') else key
    return m["kind"], key, m["value"].strip()


def _parse_output_ref(value: str, line_no: int, defined: dict[int, Node]) -> int:
    if not re.fullmatch(r"%\d+", value):
        raise IRParseError(line_no, f"an output must name a node as %id, got {value!r}")
    ref = int(value[1:])
    if ref not in defined:
        raise IRParseError(line_no, f"output names %{ref}, which is not defined")
    return ref


def _check_type(node: Node, defined: dict[int, Node], line_no: int) -> None:
    if OPS[node.op].infer is None:  # weights and caches carry their type
        if node.inputs:
            raise IRParseError(line_no, f"{node.op.value} takes no inputs")
        return
    try:
        expected = infer_type(node.op, [defined[i].type for i in node.inputs], node.attrs)
    except VerifyError as exc:
        raise IRParseError(line_no, str(exc)) from None
    if expected != node.type:
        raise IRParseError(line_no, f"%{node.id} has type {node.type}, but {node.op.value} gives {expected}")
