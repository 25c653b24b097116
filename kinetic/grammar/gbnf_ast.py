"""GBNF's grammar tree: the node types, `Grammar` (named rules), GrammarError, and printing as text.

Owns: the AST every grammar becomes (`Literal`, `CharClass`, `AnyChar`, `RuleRef`, `Token`,
`Repeat`, `Choice`, `Grammar`), the limits llama.cpp sets (`MAX_CODE_POINT`, `MAX_REPETITION`),
`GrammarError`, and `Grammar.to_gbnf()`, text that parses (gbnf.py) back to the same Grammar.
Does not own: reading text (gbnf.py), whole-grammar checks and lowering to bytes (compile.py),
JSON Schemas (json_schema.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinetic.errors import KineticError

MAX_CODE_POINT = 0x10FFFF
MAX_REPETITION = 2000  # llama.cpp's MAX_REPETITION_THRESHOLD: larger counts are refused


class GrammarError(KineticError):
    """A grammar, schema or tool list that cannot be compiled; the server answers it with a 400."""


# -- the AST ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Literal:
    """A string of code points matched in order: `"abc"`."""

    text: str


@dataclass(frozen=True)
class CharClass:
    """`[a-z_]` or `[^\\n]`: inclusive code point ranges (a single character is a range of one)."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True)
class AnyChar:
    """`.`: any one character (any valid UTF-8 code point)."""


@dataclass(frozen=True)
class RuleRef:
    name: str
    offset: int = field(default=-1, compare=False)  # where the reference was written (for errors)


@dataclass(frozen=True)
class Token:
    """`<[id]>`, `<text>` (a text that is one token of the model's vocabulary), negated with `!`."""

    token_id: int | None = None
    text: str | None = None
    negated: bool = False
    offset: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class Repeat:
    """`item{min,max}`; max None is unbounded (`*` is {0,}, `+` is {1,}, `?` is {0,1})."""

    item: Expr
    min: int
    max: int | None


@dataclass(frozen=True)
class Choice:
    """Alternatives, each a sequence of items; a group `( ... )` or a rule's body."""

    alternatives: tuple[tuple[Expr, ...], ...]


Expr = Literal | CharClass | AnyChar | RuleRef | Token | Repeat | Choice


@dataclass
class Grammar:
    """Named rules in the order they were first defined; `root` is where matching starts."""

    rules: dict[str, Choice]
    root: str = "root"
    source: str | None = field(default=None, compare=False)  # the text it was parsed from, if any

    def to_gbnf(self) -> str:
        return "".join(f"{name} ::= {_print_choice(body)}\n" for name, body in self.rules.items())

    def __str__(self) -> str:
        return self.to_gbnf()


# -- printing --------------------------------------------------------------------------------------


def show_code_point(cp: int, in_class: bool = False) -> str:
    """One code point as GBNF writes it in a literal, or in a character class with `in_class`."""
    c = chr(cp)
    specials = {"\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\"}
    if c in specials:
        return specials[c]
    if in_class and c in "]-^[":
        return "\\" + c if c != "^" else "\\x5E"
    if not in_class and c == '"':
        return '\\"'
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02X}"
    if 0xD800 <= cp <= 0xDFFF or not c.isprintable():
        return f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"
    return c


def _print_item(item: Expr) -> str:
    if isinstance(item, Literal):
        return '"' + "".join(show_code_point(ord(c)) for c in item.text) + '"'
    if isinstance(item, CharClass):
        body = "".join(show_code_point(lo, True) if lo == hi
                       else f"{show_code_point(lo, True)}-{show_code_point(hi, True)}" for lo, hi in item.ranges)
        return "[" + ("^" if item.negated else "") + body + "]"
    if isinstance(item, AnyChar):
        return "."
    if isinstance(item, RuleRef):
        return item.name
    if isinstance(item, Token):
        inner = f"<[{item.token_id}]>" if item.token_id is not None else item.text
        return ("!" if item.negated else "") + inner
    if isinstance(item, Choice):
        return "(" + _print_choice(item) + ")"
    if isinstance(item, Repeat):
        return _print_item(item.item) + _print_counts(item.min, item.max)
    raise TypeError(f"not a grammar item: {item!r}")


def _print_counts(low: int, high: int | None) -> str:
    if (low, high) == (0, None):
        return "*"
    if (low, high) == (1, None):
        return "+"
    if (low, high) == (0, 1):
        return "?"
    if high == low:
        return f"{{{low}}}"
    return f"{{{low},{'' if high is None else high}}}"


def _print_choice(choice: Choice) -> str:
    return " | ".join(" ".join(_print_item(i) for i in seq) for seq in choice.alternatives)
