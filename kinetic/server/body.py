"""Reading a request: the body (size limit, deadline, content type), its JSON, and typed fields.

Owns: turning bytes from a client into a dict and every value read from it into the type it must
have, or an ApiError 400 that names the field (`options.temperature must be a number, not "hot"`).
Unknown fields are ignored, as OpenAI clients send extras (user, metadata, store). Does not own
what the fields mean (params.py and the API modules).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from litestar import Request
from litestar.exceptions import InternalServerException

from kinetic.server.errors import ApiError

_MISSING = object()


async def read_body(request: Request, max_bytes: int, deadline_s: float, json_only: bool = False) -> bytes:
    """The whole body, at most max_bytes (413 beyond), within deadline_s of now (408 after).
    json_only: refuse other content types with 415, as the OpenAI routes do (llama-server's and
    Ollama's routes take any content type, as those servers do). Parse it with parse_json, off the
    event loop (common.prepared)."""
    if json_only:
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise ApiError(415, f"send the body as application/json, not {_shown(kind) if kind else 'no content type'}")
    declared = request.headers.get("content-length", "").strip()
    if declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, f"the request body is larger than {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    end = time.monotonic() + deadline_s
    stream = request.stream().__aiter__()
    while True:
        left = end - time.monotonic()
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), timeout=max(left, 0.001))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {deadline_s:g} seconds") from None
        except InternalServerException:  # Litestar's "client disconnected prematurely"
            raise ApiError(400, "the client went away before sending its whole body") from None
        size += len(chunk)
        if size > max_bytes:
            raise ApiError(413, f"the request body is larger than {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400 saying what is wrong with it."""
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object")
    try:
        value = json.loads(raw, parse_constant=_no_constants, parse_float=_finite)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") \
            from None
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}"[:200]) from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {_json_kind(value)}")
    return value


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} is too large")
    return value


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


class Fields:
    """Typed access to one JSON object's fields; `prefix` names where it sits ("options.")."""

    def __init__(self, data: dict, prefix: str = ""):
        self.data = data
        self.prefix = prefix

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def bad(self, name: str, what: str) -> ApiError:
        value = self.data.get(name)
        return ApiError(400, f"{self.prefix}{name} must be {what}, not {_shown(value)}", param=self.prefix + name)

    def raw(self, name: str, default: Any = None) -> Any:
        value = self.data.get(name, _MISSING)
        return default if value is _MISSING or value is None else value

    def number(self, name: str, lo: float | None = None, hi: float | None = None) -> float | None:
        value = self.data.get(name)
        if value is None:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.bad(name, _range("a number", lo, hi))
        return float(value)

    def integer(self, name: str, lo: int | None = None, hi: int | None = None) -> int | None:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or (lo is not None and value < lo) \
                or (hi is not None and value > hi):
            raise self.bad(name, _range("an integer", lo, hi))
        return value

    def boolean(self, name: str, default: bool | None = None) -> bool | None:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.bad(name, "true or false")
        return value

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.bad(name, "a string")
        return value

    def obj(self, name: str) -> dict | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.bad(name, "an object")
        return value

    def array(self, name: str) -> list | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.bad(name, "a list")
        return value

    def strings(self, name: str, most: int = 64, longest: int = 1000, single: bool = True) -> tuple[str, ...]:
        """A list of strings (or one string when `single`), empty strings dropped."""
        value = self.data.get(name)
        if value is None:
            return ()
        items = [value] if single and isinstance(value, str) else value
        if not isinstance(items, list) or len(items) > most \
                or not all(isinstance(s, str) and len(s) <= longest for s in items):
            one = "a string or " if single else ""
            raise self.bad(name, f"{one}a list of at most {most} strings of at most {longest} characters")
        return tuple(s for s in items if s)


def _range(kind: str, lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"{kind} from {lo:g} to {hi:g}"
    if lo is not None:
        return f"{kind} of at least {lo:g}"
    if hi is not None:
        return f"{kind} of at most {hi:g}"
    return kind
