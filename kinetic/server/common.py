"""What the three APIs' routes share: preparing a request off the event loop, the engine round trip, SSE.

Owns: `prepared` (the body read on the event loop, then parsed and turned into what the route needs,
prompt and grammar included, in one call on the CpuPool: offload.py), waiting for a whole answer
while watching for the client to leave (a disconnect cancels the job at its next token), the
server-sent-events and NDJSON framing, and per-token log-probability entries in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import traceback
from collections.abc import Callable
from typing import TypeVar

import msgspec
from litestar import MediaType, Request, Response

from kinetic.server.body import Fields, parse_json, read_body
from kinetic.server.errors import ApiError, error_body
from kinetic.server.offload import LARGE_BYTES, Cancel
from kinetic.server.options import ServerState
from kinetic.server.worker import Finished, Job, TokenInfo

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
log = logging.getLogger("kinetic.server")


def state_of(request: Request) -> ServerState:
    return request.app.state.kinetic


T = TypeVar("T")


async def prepared(request: Request, build: Callable[[Fields, Cancel], T], json_only: bool = False) -> T:
    """build(fields, cancel) on the CpuPool, given the body's JSON (parsed there too). Everything a
    route does with a request before the engine takes it belongs in `build`: nothing that can take
    CPU time in proportion to the body runs on the event loop."""
    state = state_of(request)
    opts = state.options
    raw = await read_body(request, opts.max_body_bytes, opts.request_seconds, json_only=json_only)
    return await state.cpu.run(lambda cancel: build(Fields(parse_json(raw)), cancel), receive=request.receive,
                               large=len(raw) >= LARGE_BYTES)


async def whole_answer(job: Job, request: Request) -> tuple[str, list[TokenInfo], Finished]:
    """The job's whole answer; if the client disconnects first, the job is cancelled."""
    answer = asyncio.ensure_future(job.result())
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not answer.done():
            answer.cancel()
            job.cancelled.set()
    if not answer.done() or answer.cancelled():
        raise ApiError(400, "the client went away")  # nobody reads this
    return answer.result()


async def _disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read by now)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def guarded(events, path: str, frame):
    """A response stream that ends with an error event instead of a cut connection if a bug strikes
    after the headers went out (the traceback goes to the server's log, never to the client)."""
    try:
        async for chunk in events:
            yield chunk
    except Exception as e:
        log.error("internal error while streaming %s:\n%s", path, "".join(traceback.format_exception(e)))
        yield frame(error_body(path, 500, f"internal error: {type(e).__name__}"))


def json_response(obj) -> Response:
    """A JSON answer encoded where this is called (on the CpuPool for answers that can be large:
    /tokenize of a 16 MiB body lists about four million ids)."""
    return Response(msgspec.json.encode(obj), media_type=MediaType.JSON)


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def ndjson(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def token_text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def openai_logprob(t: TokenInfo) -> dict:
    """One entry of choices[].logprobs.content (chat completions)."""
    return {"token": token_text(t.piece), "logprob": t.logprob, "bytes": list(t.piece),
            "top_logprobs": [{"token": token_text(p), "logprob": lp, "bytes": list(p)} for _, p, lp in t.top]}


def legacy_logprobs(tokens: list[TokenInfo], offset: int) -> dict:
    """choices[].logprobs of /v1/completions: tokens, token_logprobs, top_logprobs, text_offset."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t in tokens:
        text = token_text(t.piece)
        out["tokens"].append(text)
        out["token_logprobs"].append(t.logprob)
        out["top_logprobs"].append({token_text(p): lp for _, p, lp in t.top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def usage(fin: Finished) -> dict:
    return {"prompt_tokens": fin.prompt_tokens, "completion_tokens": fin.generated_tokens,
            "total_tokens": fin.prompt_tokens + fin.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": fin.cached_tokens}}


def timings(fin: Finished) -> dict:
    """llama-server's timings object: prompt_n counts the prompt tokens that ran, cache_n those reused."""
    pm, gm = fin.prompt_seconds * 1000, fin.generate_seconds * 1000
    ran = fin.prompt_tokens - fin.cached_tokens
    return {"cache_n": fin.cached_tokens, "prompt_n": ran, "prompt_ms": pm,
            "prompt_per_token_ms": pm / ran if ran else 0.0,
            "prompt_per_second": ran / fin.prompt_seconds if fin.prompt_seconds else 0.0,
            "predicted_n": fin.generated_tokens, "predicted_ms": gm,
            "predicted_per_token_ms": gm / fin.generated_tokens if fin.generated_tokens else 0.0,
            "predicted_per_second": fin.generated_tokens / fin.generate_seconds if fin.generate_seconds else 0.0}
