"""JSON as a receipt may hold it: read whole or refused, with the reason named.

Owns: the parsing rules `read_receipt` applies before it looks at any field. A receipt file is at
most MAX_RECEIPT_BYTES of UTF-8; an object with a key twice is refused (a signed receipt must not
say one thing to the signature check and another to a reader that keeps the other copy); NaN,
Infinity and numbers too large for a double are refused (-Infinity stays: it is how a banned
token's logit bias is written); nesting deeper than MAX_DEPTH is refused (json's own recursion
limit, near a thousand, would otherwise end in a RecursionError). Does not own which fields a
receipt has (receipt.py).
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_RECEIPT_BYTES = 16 * 1024 * 1024  # a 128k-token context's ids and text take about 2 MiB
MAX_DEPTH = 32  # a receipt nests 4 deep; chat messages with content parts a few more


class JsonRefused(ValueError):
    """Text that is not JSON a receipt may hold; the message says why."""


def loads_strict(text: str) -> Any:
    """The JSON value of `text`, or JsonRefused naming what is wrong."""
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise JsonRefused(f"it nests deeper than {MAX_DEPTH} levels") from None
    except JsonRefused:
        raise
    except ValueError as exc:
        raise JsonRefused(f"it is not JSON: {exc}") from None
    if depth(value) > MAX_DEPTH:
        raise JsonRefused(f"it nests deeper than {MAX_DEPTH} levels")
    return value


def depth(value: Any) -> int:
    """How deeply lists and objects nest in `value` (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level + 1)
        if level + 1 <= MAX_DEPTH:  # deeper than that is refused anyway: stop counting
            stack.extend((child, level + 1) for child in children)
    return deepest


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JsonRefused(f"the key {key!r} appears twice in one object")
        out[key] = value
    return out


def _constant(name: str) -> float:
    if name == "-Infinity":
        return -math.inf
    raise JsonRefused(f"it holds {name}, which no receipt field takes")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JsonRefused(f"the number {text[:40]} is too large for a double")
    return value
