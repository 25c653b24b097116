"""A JSON Schema `pattern` (an ECMA-262 regular expression) as a GBNF expression over a JSON string's
characters.

Owns: the regex subset Kinetic supports: literals and escapes (`\\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH`,
escaped metacharacters), `.`, classes `[...]` / `[^...]` with ranges and `\\d \\w \\s` (and their
negations), groups `( )` and `(?: )`, alternation, quantifiers `* + ? {m} {m,} {m,n}` (a lazy `?`
suffix is accepted: it cannot change which strings match), `^` at the start and `$` at the end.
Backreferences, lookarounds, word boundaries and named groups are refused with a GrammarError.
Does not own: the surrounding string rule (json_schema.py).

A pattern is a search, as JSON Schema says: without `^` (or `$`) any characters may come before
(after) the match. Characters are written as a JSON string holds them: `"` and `\\` as `\\"` and
`\\\\`, a newline, tab or carriage return as `\\n`, `\\t`, `\\r`; other control characters cannot be
matched.
"""

from __future__ import annotations

from kinetic.grammar.compile import normalize_ranges
from kinetic.grammar.gbnf_ast import MAX_REPETITION, GrammarError

ANY_JSON_CHAR = 'char'  # the converter's rule for one character of a JSON string

_DIGIT = [(0x30, 0x39)]
_WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
          (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
_CLASS_ESCAPES = {"d": (_DIGIT, False), "D": (_DIGIT, True), "w": (_WORD, False), "W": (_WORD, True),
                  "s": (_SPACE, False), "S": (_SPACE, True)}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
_JSON_ESCAPED = {ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r"}
_MUST_ESCAPE = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F))  # raw in no JSON string
_META = set("\\^$.|?*+()[]{}/-")


def _gbnf_literal(text: str) -> str:
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02X}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _class_char(cp: int) -> str:
    if chr(cp) in "]-\\^[" or cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02X}" if cp < 0x100 else f"\\u{cp:04X}"
    if 0xD800 <= cp <= 0xDFFF or not chr(cp).isprintable():
        return f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"
    return chr(cp)


def _subtract(span: tuple[int, int], cuts) -> list[tuple[int, int]]:
    pieces = [span]
    for cut_lo, cut_hi in cuts:
        kept = []
        for a, b in pieces:
            if b < cut_lo or a > cut_hi:
                kept.append((a, b))
                continue
            if a < cut_lo:
                kept.append((a, cut_lo - 1))
            if b > cut_hi:
                kept.append((cut_hi + 1, b))
        pieces = kept
    return pieces


def class_expression(ranges: list[tuple[int, int]]) -> str:
    """GBNF for one JSON-string character from the code point set `ranges` (normalized)."""
    raw: list[tuple[int, int]] = []
    escaped: list[str] = []
    for lo, hi in ranges:
        for cp in _JSON_ESCAPED:
            if lo <= cp <= hi:
                escaped.append(_gbnf_literal(_JSON_ESCAPED[cp]))
        raw.extend(_subtract((lo, hi), _MUST_ESCAPE))
    alts = []
    if raw:
        body = "".join(_class_char(a) if a == b else f"{_class_char(a)}-{_class_char(b)}" for a, b in raw)
        alts.append(f"[{body}]")
    alts.extend(escaped)
    if not alts:
        raise GrammarError("the pattern has a character class that no JSON string character can match")
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


class _RegexParser:
    def __init__(self, pattern: str, where: str):
        self.p = pattern
        self.i = 0
        self.where = where

    def error(self, problem: str) -> GrammarError:
        return GrammarError(f"schema error at {self.where}: pattern {self.p!r}: {problem} (at character {self.i + 1})",
                            "Kinetic supports a subset of regular expressions in patterns (see docs/grammar.md).")

    def peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def parse(self) -> str:
        anchored_start = self.peek() == "^"
        if anchored_start:
            self.i += 1
        body = self.alternation()
        anchored_end = False
        if self.peek() == "$":
            anchored_end = True
            self.i += 1
        if self.i < len(self.p):
            if self.peek() == ")":
                raise self.error("unbalanced ')'")
            raise self.error(f"{self.peek()!r} is only supported at the end of the pattern")
        parts = [] if anchored_start else [f"{ANY_JSON_CHAR}*"]
        parts.append(f"({body})")
        if not anchored_end:
            parts.append(f"{ANY_JSON_CHAR}*")
        return " ".join(parts)

    def alternation(self) -> str:
        alts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence())
        return " | ".join(a if a else '""' for a in alts)

    def sequence(self) -> str:
        items: list[str] = []
        while self.i < len(self.p) and self.peek() not in "|)":
            if self.peek() == "$":
                if self.i == len(self.p) - 1:
                    break
                raise self.error("'$' is only supported at the end of the pattern")
            atom = self.atom()
            items.append(self.quantified(atom))
        return " ".join(items)

    def quantified(self, atom: str) -> str:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            out = f"({atom}){c}"
        elif c == "{" and self._counted():
            low, high = self._counts()
            if low > MAX_REPETITION or (high is not None and high > MAX_REPETITION):
                raise self.error(f"repetition counts above {MAX_REPETITION} are not supported")
            if high is not None and high < low:
                raise self.error("a repetition's maximum is below its minimum")
            out = f"({atom}){{{low}}}" if high == low else f"({atom}){{{low},{'' if high is None else high}}}"
        else:
            return atom
        if self.peek() == "?":  # lazy: the same strings match
            self.i += 1
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and self._counted()):
            raise self.error("a quantifier cannot follow another quantifier")
        return out

    def _counted(self) -> bool:
        j = self.p.find("}", self.i)
        inner = self.p[self.i + 1:j] if j > 0 else ""
        return bool(inner) and all(c in "0123456789," for c in inner) and inner[0] != "," and inner.count(",") <= 1

    def _counts(self) -> tuple[int, int | None]:
        j = self.p.index("}", self.i)
        inner = self.p[self.i + 1:j]
        self.i = j + 1
        if "," not in inner:
            return int(inner), int(inner)
        low, high = inner.split(",")
        return int(low), (int(high) if high else None)

    def atom(self) -> str:
        c = self.peek()
        if c == "(":
            self.i += 1
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                raise self.error("lookarounds and named groups are not supported")
            body = self.alternation()
            if self.peek() != ")":
                raise self.error("a group is not closed")
            self.i += 1
            return f"({body or chr(34) * 2})"
        if c == "[":
            return class_expression(self.char_class())
        if c == ".":
            self.i += 1
            return class_expression(normalize_ranges([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)], True))
        if c in "*+?":
            raise self.error(f"{c!r} has nothing to repeat")
        if c == "^":
            raise self.error("'^' is only supported at the start of the pattern")
        if c == "\\":
            ranges = self.escape(in_class=False)
            return class_expression(ranges)
        self.i += 1
        return class_expression([(ord(c), ord(c))])

    def escape(self, in_class: bool) -> list[tuple[int, int]]:
        self.i += 1
        e = self.peek()
        if not e:
            raise self.error("the pattern ends with a lone backslash")
        self.i += 1
        if e in _CLASS_ESCAPES:
            ranges, negated = _CLASS_ESCAPES[e]
            return normalize_ranges(ranges, negated)
        if e in _CHAR_ESCAPES:
            cp = ord(_CHAR_ESCAPES[e])
        elif e in "xu":
            size = 2 if e == "x" else 4
            digits = self.p[self.i:self.i + size]
            if len(digits) != size or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"'\\{e}' needs {size} hex digits")
            self.i += size
            cp = int(digits, 16)
        elif e == "b" and in_class:
            cp = 0x08
        elif e.isdigit() or e in "bBk":
            raise self.error(f"'\\{e}' (backreferences and word boundaries) is not supported")
        elif e in _META or not e.isalnum():
            cp = ord(e)
        else:
            raise self.error(f"unknown escape '\\{e}'")
        return [(cp, cp)]

    def char_class(self) -> list[tuple[int, int]]:
        self.i += 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            if not self.peek():
                raise self.error("a character class is not closed")
            lo = self.class_atom()
            single = len(lo) == 1 and lo[0][0] == lo[0][1]
            if single and self.peek() == "-" and self.p[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self.class_atom()
                if len(hi) != 1 or hi[0][0] != hi[0][1] or hi[0][0] < lo[0][0]:
                    raise self.error("a bad range in a character class")
                ranges.append((lo[0][0], hi[0][0]))
            else:
                ranges.extend(lo)
        self.i += 1
        return normalize_ranges(ranges, negated)

    def class_atom(self) -> list[tuple[int, int]]:
        if self.peek() == "\\":
            return self.escape(in_class=True)
        c = self.peek()
        self.i += 1
        return [(ord(c), ord(c))]


def pattern_to_gbnf(pattern: str, where: str = "#") -> str:
    """GBNF (over the characters of a JSON string, without its quotes) for strings the pattern matches."""
    if not isinstance(pattern, str):
        raise GrammarError(f"schema error at {where}: 'pattern' must be a string")
    return _RegexParser(pattern, where).parse()
