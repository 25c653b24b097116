"""One chat answer for the APIs that are OpenAI's chat route in another shape (/v1/messages,
/v1/responses): the request, translated into OpenAI's chat fields, goes through the chat route's
own preparation (openai_api: the template, tools and their generic fallback, grammars, sampling),
so the answer is the one /v1/chat/completions gives; the reply comes back read as reasoning, text
and tool calls, whole or as a stream of deltas.

Owns: that round trip. Does not own the translation into OpenAI's fields nor the response shapes
(anthropic_api.py, responses_api.py), nor reading a reply (reply.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from litestar import Request

from kinetic.frontend.output_parsing import ToolCall
from kinetic.server.body import Fields
from kinetic.server.common import prepared, state_of, whole_answer
from kinetic.server.openai_api import ChatPrepared, prepare_chat
from kinetic.server.reply import ReplyStream, parse_whole
from kinetic.server.worker import Failed, Finished, Job, Piece


@dataclass(frozen=True)
class Delta:
    """Text that can go to the client now."""

    reasoning: str
    content: str


@dataclass(frozen=True)
class Done:
    """The end of an answer: the last text, the tool calls, and the generation's account."""

    reasoning: str
    content: str
    calls: list[ToolCall]
    fin: Finished


async def prepare(request: Request, translate: Callable[[Fields], dict]) -> ChatPrepared:
    """The request's body read, translated to OpenAI's chat fields and prepared as the chat route
    prepares its own, all on the CpuPool (common.prepared)."""
    state = state_of(request)

    def build(f: Fields, cancel) -> ChatPrepared:
        return prepare_chat(state, Fields(translate(f)), cancel)

    return await prepared(request, build, json_only=True)


def submit(request: Request, ready: ChatPrepared) -> Job:
    return state_of(request).worker.submit(ready.generation)


async def whole(job: Job, request: Request, ready: ChatPrepared) -> Done:
    """The whole answer, read (a client that leaves first cancels the job)."""
    text, _, fin = await whole_answer(job, request)
    reply = parse_whole(text, ready.prompt, ready.tools)
    return Done(reply.reasoning_content or "", reply.content, list(reply.tool_calls), fin)


async def deltas(job: Job, ready: ChatPrepared) -> AsyncIterator[Delta | Done | Failed]:
    """The answer as it is written: Delta events, then Done (or Failed)."""
    reply = ReplyStream(ready.prompt, ready.tools)
    async for event in job.events():
        if isinstance(event, Piece):
            reasoning, content = reply.feed(event.text)
            if reasoning or content:
                yield Delta(reasoning, content)
        elif isinstance(event, Failed):
            yield event
            return
        else:
            reasoning, content, calls = reply.finish()
            yield Done(reasoning, content, calls, event)
