"""GBNF parsing: llama.cpp's syntax into the AST, printing back, and errors that name line and column."""

from __future__ import annotations

import pytest

from kinetic.grammar import GrammarError, parse_gbnf
from kinetic.grammar.compile import compile_grammar, utf8_sequences
from kinetic.grammar.gbnf_ast import AnyChar, CharClass, Choice, Literal, Repeat, RuleRef, Token

GRAMMARS = [
    'root ::= "yes" | "no"\n',
    "root ::= [a-z0-9_-]+ [^\\n]* . \"\\x41\\u00e9\\U0001F600\\t\\\\\\\"\"\n",
    # rules continue after | and inside parentheses across lines; comments anywhere
    """# a list
root ::= ( "- " item )+   # one or more
item ::= [^\\n]+ "\\n" |
         "x"
""",
    'root ::= ("a" "b"?){2,5} "c"{3} "d"{1,} ("e" | "f"){0,2} ""\n',
    "root ::= [\\]\\[\\-\\\\^] [\\x00-\\x1F] ( | \"a\")\n",
    'root ::= <[12]> !<[3]> "x" <think> !</think>*\n',
    'root ::= value\nvalue ::= "[" (value ("," value)*)? "]" | [0-9]+\n',
    'a-rule ::= "α" [α-ω] [^"]\nroot ::= a-rule\n',
]


@pytest.mark.parametrize("text", GRAMMARS)
def test_round_trip(text):
    """Printing a parsed grammar and parsing it again gives the same grammar, and printing is a fixpoint."""
    grammar = parse_gbnf(text)
    printed = grammar.to_gbnf()
    again = parse_gbnf(printed)
    assert again == grammar
    assert again.to_gbnf() == printed


def test_structure():
    """Alternatives, sequences, groups, repetitions and classes parse into the AST they mean."""
    grammar = parse_gbnf('root ::= "ab" [^a-c\\n] . item* ("x" | )\nitem ::= "i"{2,}\n')
    assert grammar.rules["root"] == Choice(((
        Literal("ab"),
        CharClass(((ord("a"), ord("c")), (10, 10)), negated=True),
        AnyChar(),
        Repeat(RuleRef("item"), 0, None),
        Choice(((Literal("x"),), ())),
    ),))
    assert grammar.rules["item"] == Choice(((Repeat(Literal("i"), 2, None),),))


def test_escapes():
    """Each escape llama.cpp knows decodes to its code point."""
    grammar = parse_gbnf(r'root ::= "\x41\u00E9\U0001F600\t\r\n\\\"\[\]\-"' + "\n")
    assert grammar.rules["root"].alternatives[0][0] == Literal('A\u00e9\U0001F600\t\r\n\\"[]-')


def test_tokens():
    """Token items: by id, by text, negated."""
    items = parse_gbnf("root ::= <[7]> !<[8]> <|im_end|> !<x>\n").rules["root"].alternatives[0]
    assert items == (Token(7), Token(8, negated=True), Token(text="<|im_end|>"), Token(text="<x>", negated=True))


def test_last_definition_wins():
    """A rule defined twice keeps its last definition, as in llama.cpp."""
    grammar = parse_gbnf('root ::= "a"\nroot ::= "b"\n')
    assert grammar.rules["root"] == Choice(((Literal("b"),),))


@pytest.mark.parametrize("text, problem, line, column", [
    ('root ::= "a\\q"\n', "bad escape: unknown escape '\\\\q'", 1, 12),
    ('root ::= "\\x4g"\n', "bad escape: '\\x' needs 2 hex digits", 1, 11),
    ('root ::= "\\U00110000"\n', "beyond the last Unicode code point", 1, 11),
    ('root ::= "abc\n', "unterminated string literal", 1, 10),
    ('root ::= [ab', "unterminated character class", 1, 10),
    ('root ::= [z-a]\n', "is backwards", 1, 10),
    ('root "a"\n', "expected '::=' after rule name 'root'", 1, 6),
    ('root ::= "a"\n  "b"\n', "expected a rule name", 2, 3),
    ('root ::= ("a"\n', "expected ')' to close the group opened at line 1, column 10", 2, 1),
    ('root ::= * "a"\n', "'*' has nothing before it to repeat", 1, 10),
    ('root ::= "a"{3,1}\n', "maximum below its minimum", 1, 13),
    ('root ::= "a"{2001}\n', "above 2000", 1, 13),
    ('root ::= "a"{x}\n', "expected a number, found 'x'", 1, 14),
    ('root ::= "a" )\n', "unexpected ')' in rule 'root'", 1, 14),
    ('root ::= <[12\n', "expected ']>'", 1, 14),
    ("", "the grammar is empty", 1, 1),
    ("root ::= \"\\uD800\"\n", "surrogate", 1, 10),
])
def test_syntax_errors(text, problem, line, column):
    """A syntax error names the line, the column and the problem."""
    with pytest.raises(GrammarError) as info:
        parse_gbnf(text)
    message = str(info.value)
    assert f"line {line}, column {column}:" in message
    assert problem in message


@pytest.mark.parametrize("text, problem, where", [
    ('root ::= "a" missing\n', "undefined rule 'missing' (used in rule 'root')", "line 1, column 14"),
    ('start ::= "a"\n', "the grammar has no 'root' rule", None),
    ('root ::= root "a" | "b"\n', "left recursion is not supported: rule 'root'", None),
    ('root ::= a\na ::= b "x"\nb ::= "y"? a\n', "rule 'a' can reach itself before matching anything (a -> b -> a)",
     "line 2, column 1"),
    ('root ::= ("a"?)*\n', "left recursion is not supported", None),
])
def test_grammar_errors(text, problem, where):
    """Whole-grammar errors (undefined rules, no root, left recursion, direct or through rules that
    can be empty) are GrammarErrors naming the problem, with the place when there is one."""
    with pytest.raises(GrammarError) as info:
        compile_grammar(parse_gbnf(text))
    assert problem in str(info.value)
    if where:
        assert where in str(info.value)


def test_token_text_needs_vocabulary():
    """A `<text>` token cannot be compiled without a vocabulary."""
    with pytest.raises(GrammarError, match="needs the model's vocabulary"):
        compile_grammar(parse_gbnf("root ::= <think>\n"))


def _covers(ranges, encoded: bytes) -> bool:
    return len(ranges) == len(encoded) and all(a <= b <= z for (a, z), b in zip(ranges, encoded, strict=True))


@pytest.mark.parametrize("lo, hi", [(0, 0x7F), (0x80, 0x7FF), (0x41, 0x10FFFF), (0x7FF, 0x800), (0xE000, 0x10FFFF),
                                    (0x3B1, 0x3C9), (0x1F600, 0x1F64F), (0xFFF0, 0x10010)])
def test_utf8_sequences_cover_exactly(lo, hi):
    """The byte-range sequences of a code point range match exactly the UTF-8 of its code points."""
    seqs = utf8_sequences(lo, hi)
    probe = sorted({lo, hi, lo + 1, hi - 1, (lo + hi) // 2, *range(lo, min(hi, lo + 300)),
                    *range(max(lo, hi - 300), hi + 1)} - set(range(0xD800, 0xE000)))
    for cp in probe:
        encoded = chr(cp).encode("utf-8")
        hits = [s for s in seqs if _covers(s, encoded)]
        assert len(hits) == 1, hex(cp)
    for outside in (lo - 1, hi + 1):
        if 0 <= outside <= 0x10FFFF and not 0xD800 <= outside < 0xE000:
            encoded = chr(outside).encode("utf-8")
            assert not any(_covers(s, encoded) for s in seqs)
