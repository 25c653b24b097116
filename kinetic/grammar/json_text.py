"""GBNF text builders for JSON: the primitive rules, literals, repetitions and integer ranges.

Owns: the text of the rules every JSON grammar shares (as llama.cpp writes them, but `space` compact: `char`,
`string`, `number` with at most 16 integral and 16 decimal digits, `value`, `object`, `array`, the
date / time / uuid formats), GBNF literals, `repetition` and `integer_range` (decimal strings
without leading zeros between two bounds).
Does not own: reading schemas (json_schema.py).
"""

from __future__ import annotations

import math

BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")

PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    # Whitespace inside JSON: none or one space, the first two of llama.cpp's alternatives (it also allows
    # "\n"{1,2} [ \t]{0,20}); a small model held to JSON pads with newlines when they are allowed (SmolLM2's
    # forced tool calls: 50.0 tokens each with them, 35.0 without; docs/grammar.md).
    "space": ('| " "', ()),
    # Between a tool call's markers and its JSON (<tool_call>\n{...}\n</tool_call>, after </think>): llama.cpp's
    # whole `space`, since templates teach newlines there.
    "markup-space": ('| " " | "\\n"{1,2} [ \\t]{0,20}', ()),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": ('"\\"" char* "\\""', ("char",)),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "number": ('"-"? integral-part ("." decimal-part)? ([eE] [-+]? integral-part)?',
               ("integral-part", "decimal-part")),
    "integer": ('"-"? integral-part', ("integral-part",)),
    "boolean": ('"true" | "false"', ()),
    "null": ('"null"', ()),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space (string ":" space value ("," space string ":" space value)*)? space "}"',
               ("space", "string", "value")),
    "array": ('"[" space (value ("," space value)*)? space "]"', ("space", "value")),
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             '[0-9a-fA-F]{12} "\\""', ()),
    "date": ('[0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])', ()),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? '
             '("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": ('"\\"" date "\\""', ("date",)),
    "time-string": ('"\\"" time "\\""', ("time",)),
    "date-time-string": ('"\\"" date-time "\\""', ("date-time",)),
}
# Python literals instead of JSON's for true, false and null (LFM2's Python-call tool format).
PYTHON_PRIMITIVES = {"boolean": ('"True" | "False"', ()), "null": ('"None"', ())}
def literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02X}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def repetition(item: str, low: int, high: int | None, separator: str = "") -> str:
    """GBNF for `low`..`high` copies of `item`, `separator` between them."""
    if high == 0:
        return ""
    counts = lambda lo, hi: "" if (lo, hi) == (1, 1) else (  # noqa: E731
        f"{{{lo}}}" if lo == hi else f"{{{lo},{'' if hi is None else hi}}}")
    if not separator:
        return f"({item}){counts(low, high)}"
    rest_high = None if high is None else high - 1
    rest = "" if rest_high == 0 else f" ({separator} {item}){counts(max(low - 1, 0), rest_high)}"
    seq = f"{item}{rest}"
    return f"({seq})?" if low == 0 else seq


def _same_length(lo: str, hi: str) -> list[str]:
    """Alternatives matching the decimal strings from lo to hi (same length, lo <= hi)."""
    if lo == hi:
        return [f'"{lo}"']
    if lo[0] == hi[0]:
        return [f'"{lo[0]}" ({" | ".join(_same_length(lo[1:], hi[1:]))})']
    n = len(lo) - 1
    low_full = set(lo[1:]) <= {"0"}   # lo's first digit takes every tail
    high_full = set(hi[1:]) <= {"9"}
    first = int(lo[0]) + (0 if low_full else 1)
    last = int(hi[0]) - (0 if high_full else 1)
    alts = []
    if not low_full:
        alts.append(f'"{lo[0]}" ({" | ".join(_same_length(lo[1:], "9" * n))})')
    if first <= last:
        digit = f"[{first}]" if first == last else f"[{first}-{last}]"
        alts.append(digit + (f" [0-9]{{{n}}}" if n > 1 else " [0-9]" if n == 1 else ""))
    if not high_full:
        alts.append(f'"{hi[0]}" ({" | ".join(_same_length("0" * n, hi[1:]))})')
    return alts


_MAX_DIGITS = 16  # as the integral-part rule: an unbounded integer has at most 16 digits


def _non_negative(low: int, high: int | None) -> list[str]:
    """Alternatives for the integers low..high (high None: unbounded), written without leading zeros."""
    a = str(low)
    if high is not None and len(str(high)) == len(a):
        return _same_length(a, str(high))
    alts = _same_length(a, "9" * len(a))
    longest = _MAX_DIGITS if high is None else len(str(high)) - 1
    if longest > len(a):
        alts.append(f"[1-9] [0-9]{{{len(a)},{longest - 1}}}")
    if high is not None:
        alts += _same_length("1" + "0" * (len(str(high)) - 1), str(high))
    return alts


def integer_range(low: int | None, high: int | None) -> str:
    """GBNF for the integers from low to high (None: unbounded on that side)."""
    alts = []
    if low is None or low < 0:  # negatives, as "-" and a magnitude from -min(high, -1) to -low
        mag_low = 1 if high is None or high >= 0 else -high
        mag_high = None if low is None else -low
        alts.append(f'"-" ({" | ".join(_non_negative(mag_low, mag_high))})')
    if high is None or high >= 0:
        alts += _non_negative(max(low or 0, 0), high)
    return " | ".join(alts)


def integer_bounds(schema: dict, error) -> tuple[int | None, int | None]:
    low = high = None
    for key in BOUNDS:
        value = schema.get(key)
        if value is None or isinstance(value, bool):
            continue
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise error(f"'{key}' must be a number")
        if key == "minimum":
            low = _max(low, math.ceil(value))
        elif key == "exclusiveMinimum":
            low = _max(low, math.floor(value) + 1)
        elif key == "maximum":
            high = _min(high, math.floor(value))
        else:
            high = _min(high, math.ceil(value) - 1)
    # draft 4: exclusiveMinimum / exclusiveMaximum are booleans that qualify minimum / maximum
    if schema.get("exclusiveMinimum") is True and isinstance(schema.get("minimum"), (int, float)):
        low = math.floor(schema["minimum"]) + 1
    if schema.get("exclusiveMaximum") is True and isinstance(schema.get("maximum"), (int, float)):
        high = math.ceil(schema["maximum"]) - 1
    return low, high


def _max(a, b):
    return b if a is None else max(a, b)


def _min(a, b):
    return b if a is None else min(a, b)
