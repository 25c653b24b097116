"""Lowering a Grammar to a byte-level program: rules of alternatives whose terminals are byte sets.

Owns: turning characters into UTF-8 bytes (a character class becomes alternatives of byte-range
sequences, so a token may end inside a character and the matcher never decodes UTF-8), expanding
repetitions as llama.cpp does (`S{m,n}` -> m copies of S then n-m nested optional rules, `S*` ->
`R ::= S R | ""`), and the whole-grammar checks: a root rule, no undefined rule, no left recursion.
Does not own: matching (matcher.py), parsing text (gbnf.py), token texts (the caller resolves them).

Surrogates (U+D800-U+DFFF) are never matched: they are not characters in UTF-8.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kinetic.grammar.gbnf import line_col
from kinetic.grammar.gbnf_ast import (
    MAX_CODE_POINT,
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
)

# Element kinds of the flat program.
END, BYTES, RULE, TOKEN, NOT_TOKEN = range(5)

Element = tuple[int, int]  # (kind, argument): byte-set index, rule index or token id

_SURROGATES = (0xD800, 0xDFFF)
_UTF8_LIMITS = (0x7F, 0x7FF, 0xFFFF, MAX_CODE_POINT)


@dataclass
class Program:
    """Flat form: `kinds[p]`, `args[p]` at each position p; every alternative ends with END.

    `alternatives[r]` holds the start position of each alternative of rule r; `bytesets[i]` is a
    256-bit int (bit b set: byte b matches)."""

    kinds: list[int]
    args: list[int]
    alternatives: list[tuple[int, ...]]
    rule_names: list[str]
    bytesets: list[int]
    root: int


# -- code points to UTF-8 byte ranges --------------------------------------------------------------


def normalize_ranges(ranges, negated: bool) -> list[tuple[int, int]]:
    """Sorted, merged code point ranges with surrogates removed; complemented when `negated`."""
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    if negated:
        gaps, start = [], 0
        for lo, hi in merged:
            if lo > start:
                gaps.append([start, lo - 1])
            start = hi + 1
        if start <= MAX_CODE_POINT:
            gaps.append([start, MAX_CODE_POINT])
        merged = gaps
    out = []
    s_lo, s_hi = _SURROGATES
    for lo, hi in merged:
        if hi < s_lo or lo > s_hi:
            out.append((lo, hi))
            continue
        if lo < s_lo:
            out.append((lo, s_lo - 1))
        if hi > s_hi:
            out.append((s_hi + 1, hi))
    return out


def utf8_sequences(lo: int, hi: int) -> list[tuple[tuple[int, int], ...]]:
    """The code points lo..hi (no surrogates inside) as UTF-8: a list of byte-range sequences,
    each matching exactly a contiguous block of the range (the classic split at encoding-length and
    continuation-byte boundaries)."""
    if lo > hi:
        return []
    for limit in _UTF8_LIMITS[:-1]:
        if lo <= limit < hi:
            return utf8_sequences(lo, limit) + utf8_sequences(limit + 1, hi)
    if hi <= 0x7F:
        return [((lo, hi),)]
    n = len(chr(lo).encode("utf-8"))
    for i in range(1, n):
        m = (1 << (6 * i)) - 1  # the low bits the last i continuation bytes carry
        if lo & ~m != hi & ~m:
            if lo & m:
                return utf8_sequences(lo, lo | m) + utf8_sequences((lo | m) + 1, hi)
            if hi & m != m:
                return utf8_sequences(lo, (hi & ~m) - 1) + utf8_sequences(hi & ~m, hi)
    a, b = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
    return [tuple(zip(a, b, strict=True))]


def _byte_mask(lo: int, hi: int) -> int:
    return ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)


# -- lowering --------------------------------------------------------------------------------------


class _Lowering:
    def __init__(self, grammar: Grammar, resolve_token: Callable[[Token], int] | None):
        self.grammar = grammar
        self.resolve_token = resolve_token
        self.names = list(grammar.rules)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.bodies: list[list[list[Element]] | None] = [None] * len(self.names)
        self.origin = list(self.names)  # the user rule each rule came from
        self.bytesets: list[int] = []
        self.byteset_index: dict[int, int] = {}
        self.class_rules: dict[tuple, int] = {}

    def error(self, problem: str, offset: int = -1) -> GrammarError:
        source = self.grammar.source
        if source is not None and offset >= 0:
            line, col = line_col(source, offset)
            problem = f"grammar error at line {line}, column {col}: {problem}"
        else:
            problem = f"grammar error: {problem}"
        return GrammarError(problem, "Grammars use llama.cpp's GBNF syntax (see docs/grammar.md).")

    def definition_offset(self, name: str) -> int:
        """Where rule `name` is defined in the grammar's text (its last definition), or -1."""
        source = self.grammar.source
        found = list(re.finditer(rf"^[ \t]*{re.escape(name)}[ \t]*::=", source or "", re.MULTILINE))
        return found[-1].start() if found else -1

    def new_rule(self, origin: str, body: list[list[Element]]) -> int:
        self.names.append(f"{origin}-{len(self.names)}")
        self.origin.append(origin)
        self.bodies.append(body)
        return len(self.names) - 1

    def byteset(self, mask: int) -> Element:
        idx = self.byteset_index.get(mask)
        if idx is None:
            idx = self.byteset_index[mask] = len(self.bytesets)
            self.bytesets.append(mask)
        return (BYTES, idx)

    def run(self) -> list[list[list[Element]]]:
        for name, body in self.grammar.rules.items():
            self.bodies[self.index[name]] = self.choice(body, name)
        return self.bodies  # type: ignore[return-value]

    def choice(self, choice: Choice, origin: str) -> list[list[Element]]:
        return [self.sequence(seq, origin) for seq in choice.alternatives]

    def sequence(self, seq, origin: str) -> list[Element]:
        out: list[Element] = []
        for item in seq:
            out.extend(self.item(item, origin))
        return out

    def item(self, item: Expr, origin: str) -> list[Element]:
        if isinstance(item, Literal):
            return [self.byteset(1 << b) for b in item.text.encode("utf-8")]
        if isinstance(item, CharClass):
            return self.char_class(normalize_ranges(item.ranges, item.negated), origin)
        if isinstance(item, AnyChar):
            return self.char_class(normalize_ranges([], True), origin)
        if isinstance(item, RuleRef):
            if item.name not in self.index:
                raise self.error(f"undefined rule '{item.name}' (used in rule '{origin}')", item.offset)
            return [(RULE, self.index[item.name])]
        if isinstance(item, Token):
            return [(NOT_TOKEN if item.negated else TOKEN, self.token_id(item))]
        if isinstance(item, Choice):
            return [(RULE, self.new_rule(origin, self.choice(item, origin)))]
        if isinstance(item, Repeat):
            return self.repeat(item, origin)
        raise TypeError(f"not a grammar item: {item!r}")

    def token_id(self, token: Token) -> int:
        if token.token_id is not None and self.resolve_token is None:
            return token.token_id
        if self.resolve_token is None:
            raise self.error(f"token {token.text} needs the model's vocabulary", token.offset)
        try:
            return self.resolve_token(token)
        except GrammarError as exc:
            raise self.error(exc.message, token.offset) from None

    def char_class(self, ranges: list[tuple[int, int]], origin: str) -> list[Element]:
        if not ranges:
            raise self.error("a character class that matches no character")
        if ranges[-1][1] <= 0x7F:  # ASCII only: one byte set
            mask = 0
            for lo, hi in ranges:
                mask |= _byte_mask(lo, hi)
            return [self.byteset(mask)]
        key = tuple(ranges)
        rule = self.class_rules.get(key)
        if rule is None:
            alts: list[list[Element]] = []
            ascii_mask = 0
            for lo, hi in ranges:
                for seq in utf8_sequences(lo, hi):
                    if len(seq) == 1:
                        ascii_mask |= _byte_mask(*seq[0])
                    else:
                        alts.append([self.byteset(_byte_mask(a, b)) for a, b in seq])
            if ascii_mask:
                alts.insert(0, [self.byteset(ascii_mask)])
            rule = self.class_rules[key] = self.new_rule(origin, alts)
        return [(RULE, rule)]

    def repeat(self, rep: Repeat, origin: str) -> list[Element]:
        body = self.item(rep.item, origin)
        if not body or rep.max == 0:
            return []
        if len(body) > 1 and (rep.min > 1 or rep.max != rep.min):
            body = [(RULE, self.new_rule(origin, [body]))]  # repeat a reference, not a copy
        out = body * rep.min
        if rep.max is None:
            loop = self.new_rule(origin, [])
            self.bodies[loop] = [body + [(RULE, loop)], []]
            out.append((RULE, loop))
        elif rep.max > rep.min:
            optional = self.new_rule(origin, [body, []])
            for _ in range(rep.max - rep.min - 1):
                optional = self.new_rule(origin, [body + [(RULE, optional)], []])
            out.append((RULE, optional))
        return out


def _flatten(bodies: list[list[list[Element]]]) -> tuple[list[int], list[int], list[tuple[int, ...]]]:
    kinds: list[int] = []
    args: list[int] = []
    starts: list[tuple[int, ...]] = []
    for body in bodies:
        rule_starts = []
        for alt in body:
            rule_starts.append(len(kinds))
            for kind, arg in alt:
                kinds.append(kind)
                args.append(arg)
            kinds.append(END)
            args.append(0)
        starts.append(tuple(rule_starts))
    return kinds, args, starts


def _left_recursion(bodies: list[list[list[Element]]]) -> list[int] | None:
    """A cycle of rules each reachable from the previous before any byte or token is matched."""
    n = len(bodies)
    nullable = [False] * n
    changed = True
    while changed:
        changed = False
        for r, body in enumerate(bodies):
            if not nullable[r] and any(all(k == RULE and nullable[a] for k, a in alt) for alt in body):
                nullable[r] = changed = True
    edges: list[set[int]] = [set() for _ in range(n)]
    for r, body in enumerate(bodies):
        for alt in body:
            for kind, arg in alt:
                if kind != RULE:
                    break
                edges[r].add(arg)
                if not nullable[arg]:
                    break
    color = [0] * n  # 0 new, 1 on the path, 2 done
    for start in range(n):
        if color[start]:
            continue
        path, stack = [start], [iter(sorted(edges[start]))]
        color[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                color[path.pop()] = 2
                stack.pop()
            elif color[nxt] == 1:
                return path[path.index(nxt):] + [nxt]
            elif color[nxt] == 0:
                color[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(edges[nxt])))
    return None


def compile_grammar(grammar: Grammar, resolve_token: Callable[[Token], int] | None = None) -> Program:
    """Lower and check a grammar; `resolve_token` turns `<text>` tokens into ids (with a vocabulary)."""
    if grammar.root not in grammar.rules:
        raise GrammarError(f"grammar error: the grammar has no '{grammar.root}' rule",
                           "Matching starts at the rule named root, e.g. root ::= \"yes\" | \"no\".")
    lowering = _Lowering(grammar, resolve_token)
    bodies = lowering.run()
    cycle = _left_recursion(bodies)
    if cycle is not None:
        origins = [lowering.origin[r] for r in cycle]  # the cycle's user rules, first one repeated last
        names = " -> ".join(n for i, n in enumerate(origins) if i == 0 or n != origins[i - 1] or i == len(origins) - 1)
        raise lowering.error(
            f"left recursion is not supported: rule '{origins[0]}' can reach itself "
            f"before matching anything ({names}), or a repetition repeats something that can be empty; "
            "rewrite `a ::= a x | y` as `a ::= y x*`", lowering.definition_offset(origins[0]))
    kinds, args, starts = _flatten(bodies)
    return Program(kinds, args, starts, lowering.names, lowering.bytesets, lowering.index[grammar.root])
