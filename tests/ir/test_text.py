"""The IR text form: print -> parse gives the same graph, hand-written text parses, and bad text
is refused with the line that is wrong."""

from __future__ import annotations

import math

import pytest

from kinetic.ir.graph import Graph, Node, verify
from kinetic.ir.ops import Op, ParamAttrs, RmsNormAttrs, ScaleAttrs
from kinetic.ir.text import IRParseError, parse_graph, print_graph, print_node
from kinetic.ir.types import f32


@pytest.mark.parametrize("fixture", ["smollm2_path", "gemma_path"])
def test_real_model_graph_round_trips(fixture, request):
    """parse(print(g)) == g for both real models, and printing the parsed graph gives the same text."""
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower

    graph = lower(open_gguf(request.getfixturevalue(fixture)))
    text = print_graph(graph)
    parsed = parse_graph(text)
    assert parsed == graph
    assert [n.attrs for n in parsed.nodes] == [n.attrs for n in graph.nodes]
    assert parsed.outputs == graph.outputs and parsed.meta == graph.meta
    assert print_graph(parsed) == text


HAND_WRITTEN = """
# a comment, then a blank line

meta family = "toy"
meta "odd key" = "a \\"quoted\\" value"
%0   =   input()   {name = "tokens"}   :   i32[T]
%1 = param() {tensor="token_embd.weight"} : f32[16,8]
%5 = embed(%1,%0) : f32[T,8]
%9 = rms_norm(%5) {eps=1} : f32[T,8]
%10 = scale(%9) {factor=1e-3} : f32[T,8]
output out = %10
"""


def test_hand_written_text_parses():
    """Free spacing, comments, sparse ids, quoted keys, an int literal for a float and omitted
    defaulted attributes all read as meant, and the result verifies."""
    graph = parse_graph(HAND_WRITTEN)
    verify(graph)
    assert [n.id for n in graph.nodes] == [0, 1, 5, 9, 10]
    assert graph.node(5).inputs == (1, 0)
    assert graph.node(9).attrs == RmsNormAttrs(eps=1.0, group=0)
    assert isinstance(graph.node(9).attrs.eps, float)
    assert graph.node(10).attrs == ScaleAttrs(factor=0.001)
    assert graph.meta == (("family", "toy"), ("odd key", 'a "quoted" value'))
    assert graph.outputs == (("out", 10),)
    assert parse_graph(print_graph(graph)) == graph


@pytest.mark.parametrize("factor", [0.1 + 0.2, 1e-300, 5e-324, 25.298221281347036, -0.0, math.inf, 1 / 3])
def test_floats_round_trip_exactly(factor):
    """Every double, tiny, negative zero and infinite included, reads back to the same bits."""
    text = f"""
%0 = input() {{name="tokens"}} : i32[T]
%1 = param() {{tensor="t"}} : f32[4,8]
%2 = embed(%1, %0) : f32[T,8]
%3 = scale(%2) {{factor={factor!r}}} : f32[T,8]
output out = %3
"""
    got = parse_graph(print_graph(parse_graph(text))).node(3).attrs.factor
    assert got.hex() == float(factor).hex()


def test_strings_with_special_characters_round_trip():
    """Tensor names, meta keys and values with quotes, backslashes, braces and non-ASCII survive."""
    name = 'w"ei\\ght}, {x=1} : f32[1] \u00e9'
    param = Node(0, Op.PARAM, ParamAttrs(tensor=name), (), f32(4))
    graph = Graph((param,), (("out put", 0),), (("k e y", 'v"al\\ue'), ("family", "toy")))
    assert parse_graph(print_graph(graph)) == graph


def test_node_line_shape():
    """A node prints as `%id = op(%a, %b) {fields} : type`; attribute-less ops have no braces."""
    graph = parse_graph(HAND_WRITTEN)
    assert print_node(graph.node(5)) == "%5 = embed(%1, %0) : f32[T,8]"
    assert print_node(graph.node(9)) == "%9 = rms_norm(%5) {eps=1.0, group=0} : f32[T,8]"
    assert graph.node(9).op is Op.RMS_NORM


GOOD = '%0 = input() {name="tokens"} : i32[T]\n%1 = param() {tensor="t"} : f32[16,8]\n'

BAD = [
    (GOOD + "%2 = embedd(%1, %0) : f32[T,8]", 3, "unknown op 'embedd'"),
    (GOOD + "%2 = embed(%1, %7) : f32[T,8]", 3, "%7 is used before it is defined"),
    (GOOD + '%1 = input() {name="positions"} : i32[T]', 3, "%1 is defined twice"),
    (GOOD + "%2 = embed(%1, %0) : f33[T,8]", 3, "unknown dtype"),
    (GOOD + "%2 = embed(%1, %0) : f32[Q,8]", 3, "unknown symbolic dimension"),
    (GOOD + "%2 = embed(%1, %0) : f32[T,9]", 3, "but embed gives f32[T,8]"),
    (GOOD + "%2 = embed(%1, %0) : f32[T,8]\n%3 = scale(%2) : f32[T,8]", 4, "needs attribute(s) factor"),
    (GOOD + "%2 = embed(%1, %0) : f32[T,8]\n%3 = scale(%2) {factr=2.0} : f32[T,8]", 4, "no attribute 'factr'"),
    (GOOD + "%2 = embed(%1, %0) : f32[T,8]\n%3 = scale(%2) {factor=two} : f32[T,8]", 4, "must be float"),
    (GOOD + "%2 = embed(%1, %0) : f32[T,8]\n%3 = scale(%2) {factor=2.0, factor=3.0} : f32[T,8]", 4,
     "given twice"),
    (GOOD + '%2 = param() {tensor="t} : f32[4]', 3, "bad attributes"),
    (GOOD + "%2 = silu(%1, %0) : f32[T,8]", 3, "silu takes 1 inputs"),
    (GOOD + "%2 = silu(0) : f32[T,8]", 3, "an input must be %id"),
    (GOOD + "%2 = embed(%1, %0)", 3, "expected `%id = op"),
    (GOOD + "output logits = %5", 3, "output names %5, which is not defined"),
    (GOOD + "output logits = 1", 3, "an output must name a node"),
    (GOOD + "meta family = llama", 3, "expected a quoted string"),
    (GOOD + "graph {", 3, "expected a node"),
]


@pytest.mark.parametrize(("text", "line", "message"), BAD)
def test_malformed_text_names_its_line(text, line, message):
    """Each kind of mistake is an IRParseError that names the line and says what is wrong."""
    with pytest.raises(IRParseError) as info:
        parse_graph(text)
    assert info.value.line_no == line
    assert str(info.value).startswith(f"line {line}: ")
    assert message in str(info.value)


def test_type_check_can_be_left_to_the_verifier():
    """With check_types=False a wrong type parses, and the verifier is what refuses it."""
    from kinetic.ir.ops import VerifyError

    graph = parse_graph(GOOD + "%2 = embed(%1, %0) : f32[T,9]\noutput o = %2", check_types=False)
    with pytest.raises(VerifyError, match="spec says f32"):
        verify(graph)
