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

Rules that decide where work runs (the device phase, kinetic/passes/device_fusion.py) also ask where
nodes stand in the order: `readers(node)`, `earlier_readers(node)` (the readers before the root),
`is_earlier(node)`; they may add a node before the root (`insert`, which takes a fresh id), read the
`context` `apply_rules` was given (a device's fusions), and leave alone the nodes in `keep`
(never a root, and `kept(node)` tells a rule not to fold them into another node's work).
"""

from __future__ import annotations

from collections import Counter, defaultdict
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

    def __init__(self, root: Node, bound: dict[str, Node], uses: Counter, sweep: _Sweep | None = None):
        self.root = root
        self._bound = bound
        self._uses = uses
        self._sweep = sweep
        self.inserted: list[Node] = []  # nodes `insert` made, placed before the root if the rule fires
        self.context = sweep.context if sweep else None

    def node(self, node_id: int) -> Node:
        """The node with this id as the graph stands (rewritten already if it comes before the root)."""
        return self._sweep.node(node_id)

    def readers(self, node: Node) -> list[Node]:
        """The nodes that read `node`, in graph order (the root included if it reads it)."""
        return self._sweep.readers(node.id, self.root)

    def earlier_readers(self, node: Node) -> list[Node]:
        """The readers of `node` that come before the root."""
        return [self._sweep.emitted[i] for i in self._sweep.readers_before[node.id]]

    def is_earlier(self, node: Node) -> bool:
        """Whether `node` comes before the root."""
        return node.id in self._sweep.emitted

    def kept(self, node: Node) -> bool:
        """Whether `node` is one apply_rules was told to keep as it is (its `keep`)."""
        return node.id in self._sweep.keep

    def insert(self, op: Op, inputs: tuple[Node, ...], attrs: object = None) -> Node:
        """A new node with a fresh id, placed just before the root when the rule returns a result."""
        attrs = OPS[op].attrs() if attrs is None else attrs
        node = Node(self._sweep.fresh_id(), op, attrs, tuple(n.id for n in inputs),
                    infer_type(op, [n.type for n in inputs], attrs))
        self.inserted.append(node)
        return node

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


def _first_rewrite(node: Node, rules: tuple[Rule, ...], sweep: _Sweep):
    for r in rules:
        bound: dict[str, Node] = {}
        if match(r.pattern, node, sweep.emitted, bound):
            m = Match(node, bound, sweep.uses, sweep)
            result = r.rewrite(m)
            if result is not None:
                return r, result, m.inserted
    return None, None, []


# ---- the engine ---------------------------------------------------------------------------------


def apply_rules(graph: Graph, rules: tuple[Rule, ...], *, context: object = None,
                keep: frozenset[int] = frozenset()) -> Graph:
    """Rewrite `graph` with `rules` until no rule fires anywhere; rules see `context` (Match.context)
    and never rewrite a node whose id is in `keep`."""
    for _ in range(MAX_SWEEPS):
        sweep = _Sweep(graph, context, keep)
        graph, fired = sweep.run(tuple(rules))
        if not fired:
            return graph
    raise RuntimeError(f"rules {[r.name for r in rules]} did not settle after {MAX_SWEEPS} sweeps")


def _count_uses(graph: Graph) -> Counter:
    uses: Counter = Counter()
    for n in graph.nodes:
        uses.update(n.inputs)
    uses.update(node_id for _, node_id in graph.outputs)
    return uses


class _Sweep:
    """One pass over the nodes in order: what has been emitted so far, and who reads whom."""

    def __init__(self, graph: Graph, context: object, keep: frozenset[int]):
        self.graph, self.context, self.keep = graph, context, keep
        self.uses = _count_uses(graph)
        self.alias: dict[int, int] = {}  # dropped node id -> the emitted node that stands for it
        self.emitted: dict[int, Node] = {}
        self.readers_before: defaultdict[int, list[int]] = defaultdict(list)  # id -> emitted readers
        self.users = graph.users()  # the readers as the sweep found them (for nodes not yet visited)
        self._next_id = max((n.id for n in graph.nodes), default=-1) + 1

    def fresh_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def node(self, node_id: int) -> Node:
        return self.emitted.get(node_id) or self.graph.node(node_id)

    def readers(self, node_id: int, root: Node) -> list[Node]:
        later = [self.graph.node(u) for u in self.users.get(node_id, ())
                 if u not in self.emitted and u not in self.alias and u != root.id]
        now = [root] if node_id in root.inputs else []
        return [self.emitted[i] for i in self.readers_before[node_id]] + now + later

    def emit(self, node: Node) -> None:
        self.emitted[node.id] = node
        for i in dict.fromkeys(node.inputs):
            self.readers_before[i].append(node.id)

    def run(self, rules: tuple[Rule, ...]) -> tuple[Graph, int]:
        """The new graph and how many rewrites fired."""
        fired = 0
        for node in self.graph.nodes:
            node = replace(node, inputs=tuple(self.alias.get(i, i) for i in node.inputs))
            for _ in range(MAX_REWRITES_PER_NODE):
                r, result, inserted = (None, None, []) if node.id in self.keep else _first_rewrite(node, rules, self)
                if result is None:
                    break
                fired += 1
                for new in inserted:
                    self.uses.update(new.inputs)
                    self.emit(new)
                self.uses.subtract(node.inputs)
                if result.id != node.id:
                    _check_existing(result, self.emitted, r)
                    self.uses[result.id] += self.uses[node.id]
                    self.alias[node.id] = result.id
                    break
                self.uses.update(result.inputs)
                node = result
            else:
                raise RuntimeError(f"rules keep rewriting %{node.id}")
            if node.id not in self.alias:
                self.emit(node)
        outputs = tuple((name, self.alias.get(i, i)) for name, i in self.graph.outputs)
        return Graph(tuple(self.emitted.values()), outputs, self.graph.meta), fired


def _check_existing(result: Node, emitted: dict[int, Node], r: Rule) -> None:
    if emitted.get(result.id) != result:
        raise RuntimeError(f"rule {r.name} returned %{result.id}, which is neither new nor in the graph")
