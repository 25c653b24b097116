"""Fuzzing .ktc files whose sections were edited and re-hashed: a clean refusal or a normal answer.

Anyone can edit an unsigned .ktc file and write it again with valid hashes (here: kinetic's own
write_ktc), so every section is hostile input. From a compiled synthetic model (llama with a chat
template, and gemma3) each case edits one section and rewrites the file:
* graph (both models): each param of layer 0 and the head given another shape (dimensions doubled,
  halved, plus one, swapped, dropped) or type, with every node after it re-typed to match, so the
  graph still verifies; each integer and float attribute of layer 0's and the head's nodes set to
  hostile values (0, -1, 3, 2^31-1, -2^31; 0, -1, NaN, infinity; again re-typed); structural edits
  (the embedding reading another table, the logits another node, two KV states of one layer, a
  renamed input, no logits);
* profile (llama): each field set to hostile values (0, -1, 10^9, 100000, wrong types), deep nesting,
  a huge integer, not an object;
* metadata (llama): other lowering options (the graph is then made again from the weights), wrong
  types, deep nesting;
* tokenizer (llama): per-token arrays short, long or of other types, tokens stored as integers;
* weights (llama): hostile hyperparameters, read when the lowering options send loading to the weights;
* chat template (llama): bytes that are not UTF-8.
Each case loads the file, applies the chat template and generates one token in a child process
(tests/load_worker.py): a signal fails the test with the case's name, and so does any exception that
is not a KineticError. Counts: see test_case_counts; about 10 s on 2 CPUs.
"""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from pathlib import Path

import pytest

from kinetic.cli.main import main
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import LEAVES, Op, attr_fields, infer_type
from kinetic.ir.text import parse_graph, print_graph
from kinetic.ir.types import TensorType
from kinetic.ktc import Kind
from tests.gguf_variants import KV, V, variant
from tests.ktc_variants import read_sections, rewrite
from tests.load_worker import run_cases
from tests.synthetic import rewrite_gguf, synthetic_path

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<a>"
ARCHS = ("llama", "gemma3")
INTS = (0, -1, 3, 2**31 - 1, -(2**31))
FLOATS = (0.0, -1.0, float("nan"), float("inf"))
PROFILE_VALUES = (0, -1, 10**9, 100_000, "x", None, 1.5, {"cpus": 10**9})
DTYPES = ("q8_0", "q4_0", "f32", "f16")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, dict[Kind, bytes]]:
    """Each synthetic model compiled to .ktc, as its sections' bytes."""
    out = {}
    for arch in ARCHS:
        folder = tmp_path_factory.mktemp(arch)
        gguf = rewrite_gguf(synthetic_path(arch), folder / f"{arch}.gguf", set_kv={"tokenizer.chat_template": TEMPLATE})
        assert main(["compile", str(gguf), "-o", str(folder / f"{arch}.ktc")]) == 0
        out[arch] = read_sections(folder / f"{arch}.ktc")
    return out


# -- graph edits ---------------------------------------------------------------------------------------


def retyped(graph: Graph, changed: dict[int, Node]) -> Graph:
    """The graph with some nodes replaced and every later type re-inferred where its spec allows
    (kept as written where it does not), so an edit reaches the loader as a consistent graph."""
    nodes: dict[int, Node] = {}
    for node in graph.nodes:
        node = changed.get(node.id, node)
        if node.op not in LEAVES or node.op is Op.INPUT:
            try:
                node = dataclasses.replace(node, type=infer_type(node.op, [nodes[i].type for i in node.inputs],
                                                                 node.attrs))
            except Exception:
                pass
        nodes[node.id] = node
    return Graph(tuple(nodes.values()), graph.outputs, graph.meta)


def _layer0(graph: Graph) -> list[Node]:
    """Nodes up to the second layer's first param, and the head's."""
    second = next(n.id for n in graph.params() if n.attrs.tensor.startswith("blk.1."))
    head = next(n.id for n in graph.params() if n.attrs.tensor == "output_norm.weight")
    return [n for n in graph.nodes if n.id < second or n.id >= head]


def param_edits(graph: Graph) -> list[tuple[str, Graph]]:
    cases = []
    for node in (n for n in _layer0(graph) if n.op is Op.PARAM):
        shape = node.type.shape
        shapes = {"doubled": tuple(d * 2 for d in shape), "halved": tuple(max(d // 2, 1) for d in shape),
                  "plus one": tuple(d + 1 for d in shape), "swapped": shape[::-1], "dropped": shape[1:] or (2,)}
        for what, new in ((w, s) for w, s in shapes.items() if s != shape):
            edit = dataclasses.replace(node, type=TensorType(node.type.dtype, new))
            cases.append((f"{node.attrs.tensor} {what}", retyped(graph, {node.id: edit})))
        for dtype in DTYPES:
            if dtype != node.type.dtype:
                edit = dataclasses.replace(node, type=TensorType(dtype, shape))
                cases.append((f"{node.attrs.tensor} as {dtype}", retyped(graph, {node.id: edit})))
    return cases


def attribute_edits(graph: Graph) -> list[tuple[str, Graph]]:
    cases = []
    for node in _layer0(graph):
        for name, value in attr_fields(node.attrs):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            for new in INTS if isinstance(value, int) else FLOATS:
                edit = dataclasses.replace(node, attrs=dataclasses.replace(node.attrs, **{name: new}))
                cases.append((f"%{node.id} {node.op.value} {name}={new}", retyped(graph, {node.id: edit})))
    return cases


def structural_edits(graph: Graph) -> list[tuple[str, Graph]]:
    embed = next(n for n in graph.nodes if n.op is Op.EMBED)
    tables = [n for n in graph.params() if len(n.type.shape) == 2 and n.id != embed.inputs[0]]
    states = [n for n in graph.nodes if n.op is Op.STATE]
    inputs = [n for n in graph.nodes if n.op is Op.INPUT]
    cases = [(f"embed reads {t.attrs.tensor}", retyped(graph, {embed.id: dataclasses.replace(
        embed, inputs=(t.id, embed.inputs[1]))})) for t in tables[:4]]
    cases += [(f"logits are %{i}", dataclasses.replace(graph, outputs=(("logits", i),)))
              for i in (0, embed.id, graph.nodes[-2].id)]
    cases.append(("no logits", dataclasses.replace(graph, outputs=(("other", graph.nodes[-1].id),))))
    cases.append(("two states of layer 0", retyped(graph, {states[1].id: dataclasses.replace(
        states[1], attrs=dataclasses.replace(states[1].attrs, layer=0))})))
    for node in inputs:
        for name in ("tokens", "positions", "output_rows", "other"):
            if name != node.attrs.name:
                edit = dataclasses.replace(node, attrs=dataclasses.replace(node.attrs, name=name))
                cases.append((f"input %{node.id} named {name}", retyped(graph, {node.id: edit})))
    return cases


# -- cases per section ---------------------------------------------------------------------------------


def graph_cases(sections: dict[Kind, bytes]) -> list[tuple[str, dict[Kind, bytes]]]:
    graph = parse_graph(sections[Kind.GRAPH].decode())
    edits = param_edits(graph) + attribute_edits(graph) + structural_edits(graph)
    return [(f"graph: {name}", {Kind.GRAPH: print_graph(g).encode()}) for name, g in edits]


def json_cases(sections: dict[Kind, bytes], kind: Kind) -> list[tuple[str, dict[Kind, bytes]]]:
    data = json.loads(sections[kind])
    cases = []
    for field in data:
        for value in PROFILE_VALUES:
            cases.append((f"{kind.label}: {field}={value!r}", {kind: json.dumps({**data, field: value}).encode()}))
    deep = "[" * 100_000 + "]" * 100_000
    cases.append((f"{kind.label}: deep nesting", {kind: f'{{"x": {deep}}}'.encode()}))
    cases.append((f"{kind.label}: an array", {kind: b"[1, 2]"}))
    cases.append((f"{kind.label}: a huge integer", {kind: b'{"batch": 1' + b"0" * 5000 + b"}"}))
    return cases


def metadata_cases(sections: dict[Kind, bytes]) -> list[tuple[str, dict[Kind, bytes]]]:
    """Other lowering options send loading to the weights (the graph is made again from them)."""
    data = json.loads(sections[Kind.METADATA])
    relower = json.dumps({**data, "lowering": {**data["lowering"], "kv_dtype": "f32"}}).encode()
    hostile = [(name, edit) for name, edit in json_cases(sections, Kind.METADATA)
               if name.startswith("metadata: lowering=") or "=" not in name]
    return [("metadata: lowering f32 cache", {Kind.METADATA: relower}), *hostile]


def gguf_section_cases(sections: dict[Kind, bytes], kind: Kind, edits: dict[str, KV],
                       work: Path) -> list[tuple[str, dict[Kind, bytes]]]:
    """A GGUF section with one key changed; weights edits also send loading to the weights."""
    src = work / f"{kind.label}.gguf"
    src.write_bytes(sections[kind])
    cases = []
    for key, value in edits.items():
        data = variant(src, work / "edited.gguf", set_kv={key: value}).read_bytes()
        case = {kind: data}
        if kind is Kind.WEIGHTS:
            case.update(metadata_cases(sections)[0][1])
        cases.append((f"{kind.label}: {key}={value.value!r}"[:120], case))
    return cases


def all_cases(arch: str, sections: dict[Kind, bytes], work: Path) -> list[tuple[str, dict[Kind, bytes]]]:
    work.mkdir(parents=True, exist_ok=True)
    n = 2048  # tokens in both synthetic vocabularies
    tokenizer = {"tokenizer.ggml.token_type": KV(V.ARRAY, [1] * (n - 1), V.INT32),
                 "tokenizer.ggml.tokens": KV(V.ARRAY, list(range(n)), V.INT32),
                 "tokenizer.ggml.scores": KV(V.ARRAY, [0.0] * (n + 1), V.FLOAT32),
                 "tokenizer.ggml.bos_token_id": KV(V.STRING, "x"),
                 "tokenizer.ggml.model": KV(V.UINT32, 1),
                 "tokenizer.ggml.add_bos_token": KV(V.STRING, "yes")}
    weights = {f"{arch}.attention.head_count": KV(V.UINT32, 0), f"{arch}.block_count": KV(V.STRING, "3"),
               f"{arch}.attention.layer_norm_rms_epsilon": KV(V.FLOAT32, -1.0),
               f"{arch}.embedding_length": KV(V.UINT32, 1), f"{arch}.rope.freq_base": KV(V.FLOAT32, float("nan"))}
    cases = [("unchanged", {})] + graph_cases(sections)
    if arch != "llama":  # the other sections do not depend on the family
        return cases
    return (cases + json_cases(sections, Kind.PROFILE) + metadata_cases(sections)
            + gguf_section_cases(sections, Kind.TOKENIZER, tokenizer, work)
            + gguf_section_cases(sections, Kind.WEIGHTS, weights, work)
            + [("chat template: not UTF-8", {Kind.CHAT_TEMPLATE: b"\xff\xfe{{"})])


@pytest.mark.parametrize("arch", ARCHS)
def test_rehashed_edits_are_refused_or_served(arch, sources, tmp_path):
    """Every edited and re-hashed section: a KineticError or an answer, never a signal or another
    exception; every graph edit that changes what a kernel would read is refused."""
    cases = all_cases(arch, sources[arch], tmp_path / "sections")
    outcomes = run_cases([(f"ktc:{name}", partial(rewrite, sources[arch], edits)) for name, edits in cases],
                         tmp_path / "work")
    internal = {name: o.detail for name, o in outcomes.items() if o.kind == "internal"}
    assert not internal, "\n".join(f"{k}: {v}" for k, v in internal.items())
    assert outcomes["ktc:unchanged"].kind == "ok"
    served = [name for name, o in outcomes.items() if o.kind == "ok" and name.startswith("ktc:graph: ")
              and (" as " in name or name.split()[-1] in ("doubled", "halved", "plus one", "swapped", "dropped"))]
    assert not served, f"a param's type or shape changed and the file still ran: {served}"


def test_case_counts(sources, tmp_path):
    """The suite's size is what docs/security.md states."""
    counts = {arch: len(all_cases(arch, sources[arch], tmp_path / arch)) for arch in ARCHS}
    assert counts == {"llama": 362, "gemma3": 349}, counts


def test_retyped_keeps_an_unchanged_graph(sources):
    """The fuzzer's re-typing is the identity on a valid graph (so an edit is the only change)."""
    graph = parse_graph(sources["llama"][Kind.GRAPH].decode())
    assert retyped(graph, {}) == graph
