"""GBNF, llama.cpp's grammar syntax: a parser with line/column errors.

Owns: reading grammar text into a `Grammar` (named rules of alternatives of sequences) exactly as
llama.cpp's parser reads it (rule names `[a-zA-Z0-9-]+`, newlines end a rule except inside
parentheses or after `|`, `#` comments, escapes `\\x \\u \\U \\t \\r \\n \\\\ \\" \\[ \\] \\-`, character
classes with ranges and `^`, `.`, `* + ? {m} {m,} {m,n}`, tokens `<[id]>` / `<text>` / `!<...>`).
Does not own: the tree it builds and printing it back as text (gbnf_ast.py), checks that need the
whole grammar (undefined rules, left recursion: compile.py) or a vocabulary (token texts: matcher.py).

A rule defined twice keeps its last definition, as in llama.cpp.
"""

from __future__ import annotations

from kinetic.grammar.gbnf_ast import (
    MAX_CODE_POINT,
    MAX_REPETITION,
    AnyChar,
    CharClass,
    Choice,
    Expr,
    Grammar,
    GrammarError,
    Literal,
    Repeat,
    RuleRef,
    Token,
    show_code_point,
)

_SIMPLE_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def _is_word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


def _is_digit(c: str) -> bool:
    return c != "" and c in "0123456789"


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of `offset` in `text`."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.rules: dict[str, Choice] = {}

    # -- helpers

    def error(self, problem: str, offset: int | None = None) -> GrammarError:
        line, col = line_col(self.text, self.pos if offset is None else offset)
        return GrammarError(f"grammar error at line {line}, column {col}: {problem}",
                            "Grammars use llama.cpp's GBNF syntax (see docs/grammar.md).")

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.text[i] if i < len(self.text) else ""

    def space(self, newline_ok: bool) -> None:
        """Blanks and `#` comments; newlines too when `newline_ok`."""
        text, n = self.text, len(self.text)
        while self.pos < n:
            c = text[self.pos]
            if c == "#":
                while self.pos < n and text[self.pos] not in "\r\n":
                    self.pos += 1
            elif c in " \t" or (newline_ok and c in "\r\n"):
                self.pos += 1
            else:
                break

    def name(self) -> str:
        return self._run_of(_is_word, "a rule name")

    def integer(self) -> int:
        return int(self._run_of(_is_digit, "a number"))

    def _run_of(self, accepts, what: str) -> str:
        """The longest run of characters `accepts` takes, at least one (else an error expecting `what`)."""
        start = self.pos
        while accepts(self.peek()):
            self.pos += 1
        if self.pos == start:
            raise self.error(f"expected {what}, found {self._found()}")
        return self.text[start:self.pos]

    def _found(self) -> str:
        c = self.peek()
        return "the end of the grammar" if not c else repr(c)

    # -- grammar structure

    def grammar(self) -> Grammar:
        self.space(True)
        if self.pos >= len(self.text):
            raise self.error("the grammar is empty")
        while self.pos < len(self.text):
            self.rule()
        return Grammar(self.rules, source=self.text)

    def rule(self) -> None:
        name = self.name()
        self.space(False)
        if not self.text.startswith("::=", self.pos):
            raise self.error(f"expected '::=' after rule name '{name}', found {self._found()}")
        self.pos += 3
        self.space(True)
        body = self.alternatives(nested=False)
        c = self.peek()
        if c == "\r":
            self.pos += 2 if self.peek(1) == "\n" else 1
        elif c == "\n":
            self.pos += 1
        elif c:
            raise self.error(f"unexpected {c!r} in rule '{name}' (expected a newline or the end)")
        self.rules.pop(name, None)  # a redefinition moves to the end, as the last one wins
        self.rules[name] = body
        self.space(True)

    def alternatives(self, nested: bool) -> Choice:
        alts = [self.sequence(nested)]
        while self.peek() == "|":
            self.pos += 1
            self.space(True)
            alts.append(self.sequence(nested))
        return Choice(tuple(alts))

    def sequence(self, nested: bool) -> tuple[Expr, ...]:
        items: list[Expr] = []
        while self.pos < len(self.text):
            c = self.peek()
            start = self.pos
            if c == '"':
                items.append(self.literal())
            elif c == "[":
                items.append(self.char_class())
            elif c in "<!":
                items.append(self.token())
            elif _is_word(c):
                items.append(RuleRef(self.name(), start))
            elif c == "(":
                self.pos += 1
                self.space(True)
                items.append(self.alternatives(nested=True))
                if self.peek() != ")":
                    raise self.error(f"expected ')' to close the group opened at {self._where(start)}, "
                                     f"found {self._found()}")
                self.pos += 1
            elif c == ".":
                self.pos += 1
                items.append(AnyChar())
            elif c in "*+?{":
                low, high = self.repetition()
                if not items:
                    raise self.error(f"{c!r} has nothing before it to repeat", start)
                items[-1] = Repeat(items[-1], low, high)
            else:
                break
            self.space(nested)
        return tuple(items)

    def _where(self, offset: int) -> str:
        line, col = line_col(self.text, offset)
        return f"line {line}, column {col}"

    def repetition(self) -> tuple[int, int | None]:
        c = self.peek()
        self.pos += 1
        if c != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        start = self.pos - 1
        self.space(False)
        low = self.integer()
        self.space(False)
        if self.peek() == "}":
            high: int | None = low
        elif self.peek() == ",":
            self.pos += 1
            self.space(False)
            high = self.integer() if _is_digit(self.peek()) else None
            self.space(False)
            if self.peek() != "}":
                raise self.error(f"expected '}}' to close the repetition, found {self._found()}")
        else:
            raise self.error(f"expected ',' or '}}' in the repetition, found {self._found()}")
        self.pos += 1
        if low > MAX_REPETITION or (high is not None and high > MAX_REPETITION):
            raise self.error(f"repetition counts above {MAX_REPETITION} are not supported", start)
        if high is not None and high < low:
            raise self.error(f"repetition {{{low},{high}}} has its maximum below its minimum", start)
        return low, high

    def char(self) -> int:
        """One character of a literal or class, escapes decoded, as a code point."""
        c = self.peek()
        if not c:
            raise self.error("unexpected end of the grammar inside a literal or character class")
        start = self.pos
        if c != "\\":
            self.pos += 1
            return ord(c)
        e = self.peek(1)
        if e in _SIMPLE_ESCAPES:
            self.pos += 2
            return ord(_SIMPLE_ESCAPES[e])
        if e in _HEX_ESCAPES:
            size = _HEX_ESCAPES[e]
            digits = self.text[self.pos + 2:self.pos + 2 + size]
            if len(digits) != size or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"bad escape: '\\{e}' needs {size} hex digits", start)
            value = int(digits, 16)
            if value > MAX_CODE_POINT:
                raise self.error(f"bad escape: U+{value:X} is beyond the last Unicode code point", start)
            self.pos += 2 + size
            return value
        shown = "the end of the grammar" if not e else repr("\\" + e)
        raise self.error(f"bad escape: unknown escape {shown}", start)

    def literal(self) -> Literal:
        start = self.pos
        self.pos += 1
        chars = []
        while self.peek() != '"':
            if not self.peek():
                raise self.error("unterminated string literal", start)
            chars.append(self.char())
        self.pos += 1
        for cp in chars:
            if 0xD800 <= cp <= 0xDFFF:
                raise self.error(f"U+{cp:04X} is a surrogate, which UTF-8 cannot hold", start)
        return Literal("".join(map(chr, chars)))

    def char_class(self) -> CharClass:
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges = []
        while self.peek() != "]":
            if not self.peek():
                raise self.error("unterminated character class", start)
            low = self.char()
            high = low
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                high = self.char()
                if high < low:
                    backwards = f"{show_code_point(low)}-{show_code_point(high)}"
                    raise self.error(f"character range {backwards} is backwards", start)
            ranges.append((low, high))
        self.pos += 1
        return CharClass(tuple(ranges), negated)

    def token(self) -> Token:
        start = self.pos
        negated = self.peek() == "!"
        if negated:
            self.pos += 1
        if self.peek() != "<":
            raise self.error(f"expected '<' after '!', found {self._found()}")
        self.pos += 1
        if self.peek() == "[":
            self.pos += 1
            token_id = self.integer()
            if self.text[self.pos:self.pos + 2] != "]>":
                raise self.error(f"expected ']>' to close the token id, found {self._found()}")
            self.pos += 2
            return Token(token_id=token_id, negated=negated, offset=start)
        end = self.text.find(">", self.pos)
        if end < 0:
            raise self.error("unterminated token: expected '>'", start)
        text = "<" + self.text[self.pos:end + 1]
        self.pos = end + 1
        return Token(text=text, negated=negated, offset=start)


def parse_gbnf(text: str) -> Grammar:
    """Parse GBNF text; a GrammarError names the line, column and problem."""
    if not isinstance(text, str):
        raise GrammarError(f"a grammar must be text, not {type(text).__name__}")
    return _Parser(text).grammar()
