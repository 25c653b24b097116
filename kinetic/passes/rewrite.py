"""Local rewrites: node patterns, rules, and the engine that applies a list of rules to a graph.

Owns: `Pat` (what a node must look like), `Rule` (a pattern plus a function that returns a
replacement node or None), the `rule` decorator, and `apply_rules(graph, rules)`. Rules are plain
tuples, so rule lists compose with `+`. Does not own any particular rewrite: those live in the pass
modules, each rule with its algebra in its docstring.

A rule's function gets a `Match`: the matched root, the nodes bound by name, how many users each node
has, and `make(...)` to build the replacement. It returns either a new node (built with `make`,
which gives it the root's id and an inferred type) or an existing node that the root becomes (for
example `scale(x, 1.0) -> x`). The engine walks the nodes in order, applies rules until none fires
and repeats whole sweeps until a sweep changes nothing. Replaced nodes are dropped; producers that
lose their last user are left for dead-code elimination.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import OPS, Op, infer_type

MAX_SWEEPS = 64  # a rule list that has not settled by then rewrites in a cycle
MAX_REWRITES_PER_NODE = 64


@dataclass(frozen=True)
class Pat:
    """Matches a node whose op is one of `ops` (any op when None) and whose inputs match `inputs`
    in order (any inputs when None), binding it to `name`. A commutative pattern of two inputs also
    tries them swapped. A name bound twice must bind the same node."""

    ops: frozenset[Op] | None = None
    inputs: tuple[Pat, ...] | None = None
    name: str | None = None
    commutative: bool = False


def pat(op: Op | None = None, *inputs: Pat, name: str | None = None, commutative: bool = False) -> Pat:
    """`pat(Op.MUL, pat(Op.SILU, pat(name="a")), pat(name="b"), commutative=True)`."""
    return Pat(
        ops=None if op is None else frozenset({op}),
        inputs=tuple(inputs) if inputs else None,
        name=name,
        commutative=commutative,
    )


class Match:
    """A successful match: the root, its named nodes, and the context a rule may consult."""

    def __init__(self, root: Node, bound: dict[str, Node], uses: Counter):
        self.root = root
        self._bound = bound
        self._uses = uses

    def __getitem__(self, name: str) -> Node:
        return self._bound[name]

    def uses(self, node: Node) -> int:
        """How many node inputs and graph outputs read `node` (dead readers included)."""
        return self._uses[node.id]

    def make(self, op: Op, inputs: tuple[Node, ...], attrs: object = None) -> Node:
        """A new node replacing the root: same id, type inferred from the inputs."""
        attrs = OPS[op].attrs() if attrs is None else attrs
        type_ = infer_type(op, [n.type for n in inputs], attrs)
        return Node(self.root.id, op, attrs, tuple(n.id for n in inputs), type_)


@dataclass(frozen=True)
class Rule:
    pattern: Pat
    rewrite: Callable[[Match], Node | None]

    @property
    def name(self) -> str:
        return self.rewrite.__name__


def rule(pattern: Pat) -> Callable[[Callable[[Match], Node | None]], Rule]:
    """Decorator: `@rule(pat(...))` over a rewrite function makes it a Rule."""

    def wrap(fn: Callable[[Match], Node | None]) -> Rule:
        return Rule(pattern, fn)

    return wrap


# ---- matching -----------------------------------------------------------------------------------


def match(pattern: Pat, node: Node, nodes: dict[int, Node], bound: dict[str, Node]) -> bool:
    """Whether `node` matches `pattern`; on success `bound` holds the named nodes."""
    if pattern.ops is not None and node.op not in pattern.ops:
        return False
    if pattern.name is not None:
        if pattern.name in bound and bound[pattern.name].id != node.id:
            return False
        bound[pattern.name] = node
    if pattern.inputs is None:
        return True
    if len(pattern.inputs) != len(node.inputs):
        return False
    orders = [node.inputs]
    if pattern.commutative and len(node.inputs) == 2:
        orders.append(node.inputs[::-1])
    for order in orders:
        trial = dict(bound)
        if all(match(p, nodes[i], nodes, trial) for p, i in zip(pattern.inputs, order, strict=True)):
            bound.update(trial)
            return True
    return False


def _first_rewrite(node: Node, rules: tuple[Rule, ...], nodes: dict[int, Node], uses: Counter):
    for r in rules:
        bound: dict[str, Node] = {}
        if match(r.pattern, node, nodes, bound):
            result = r.rewrite(Match(node, bound, uses))
            if result is not None:
                return r, result
    return None, None


# ---- the engine ---------------------------------------------------------------------------------


def apply_rules(graph: Graph, rules: tuple[Rule, ...]) -> Graph:
    """Rewrite `graph` with `rules` until no rule fires anywhere."""
    for _ in range(MAX_SWEEPS):
        graph, fired = _sweep(graph, tuple(rules))
        if not fired:
            return graph
    raise RuntimeError(f"rules {[r.name for r in rules]} did not settle after {MAX_SWEEPS} sweeps")


def _count_uses(graph: Graph) -> Counter:
    uses: Counter = Counter()
    for n in graph.nodes:
        uses.update(n.inputs)
    uses.update(node_id for _, node_id in graph.outputs)
    return uses


def _sweep(graph: Graph, rules: tuple[Rule, ...]) -> tuple[Graph, int]:
    """One pass over the nodes in order; returns the new graph and how many rewrites fired."""
    uses = _count_uses(graph)
    alias: dict[int, int] = {}  # dropped node id -> the emitted node that stands for it
    emitted: dict[int, Node] = {}
    fired = 0
    for node in graph.nodes:
        node = replace(node, inputs=tuple(alias.get(i, i) for i in node.inputs))
        for _ in range(MAX_REWRITES_PER_NODE):
            r, result = _first_rewrite(node, rules, emitted, uses)
            if result is None:
                break
            fired += 1
            uses.subtract(node.inputs)
            if result.id != node.id:
                _check_existing(result, emitted, r)
                uses[result.id] += uses[node.id]
                alias[node.id] = result.id
                break
            uses.update(result.inputs)
            node = result
        else:
            raise RuntimeError(f"rules keep rewriting %{node.id}")
        if node.id not in alias:
            emitted[node.id] = node
    outputs = tuple((name, alias.get(i, i)) for name, i in graph.outputs)
    return Graph(tuple(emitted.values()), outputs, graph.meta), fired


def _check_existing(result: Node, emitted: dict[int, Node], r: Rule) -> None:
    if emitted.get(result.id) != result:
        raise RuntimeError(f"rule {r.name} returned %{result.id}, which is neither new nor in the graph")
