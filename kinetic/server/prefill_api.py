"""POST /v1/prefill: Zero Wait for apps (seed 001, "Prefill").

Owns: the route. Its body is that of a chat completion (messages, tools and chat_template_kwargs
matter; the rest is checked as the chat route checks it); the prompt is rendered as the chat route
renders it, cut just before the last word of the last message (that word may still grow) and one
token more (the text's last token may merge with what is typed next), and handed to the scheduler as
a prefill (GenerationRequest.prefill_only): it runs only the whole batches the real request would run
first, from where that request would start, gives way when a real request comes, and its state stays
in its slot and in Warm Start's store. Answers `{"object": "prefill", "cached_tokens": N}`, N the
prompt tokens the next request finds ready (0, running nothing, with Warm Start off).
Does not own the prefill itself (kinetic/runtime/generation.py, scheduler.py) nor the chat route's
preparation (openai_api.prepare_chat).

It never changes an answer: the request that follows resumes from whatever the prefill left, which
is exactly what a cold run computes (kinetic/runtime/warm.py), and recomputes the rest.
"""

from __future__ import annotations

from dataclasses import replace

from litestar import Request, Response, post

from kinetic.server.common import prepared, state_of, whole_answer
from kinetic.server.openai_api import prepare_chat
from kinetic.server.options import ServerState
from kinetic.server.prompts import messages_from, tokenize
from kinetic.server.worker import GenerationRequest


def prefix_before_last_word(text: str, last_content: str) -> str | None:
    """The rendered prompt `text` cut just before the last word of the last message (whose content
    is `last_content`); None when the message's text cannot be found in the prompt."""
    content = last_content.rstrip()
    at = text.rfind(content) if content else -1
    if at < 0:
        return None
    words = content.rsplit(None, 1)
    kept = len(content) - len(words[-1]) if words else 0
    return text[:at + kept]


def prefill_request(state: ServerState, f, cancel) -> GenerationRequest | None:
    """The prefill the body asks for (None: nothing to run ahead)."""
    ready = prepare_chat(state, f, cancel)
    messages = messages_from(f)
    content = messages[-1].get("content")
    cut = prefix_before_last_word(ready.prompt.text, content if isinstance(content, str) else "")
    if cut is None:
        return None
    ids = tokenize(state, cut)[:-1]  # the last token may still merge with the text that follows
    ids = ids[:len(ready.generation.prompt) - 1]
    if not ids:
        return None
    return replace(ready.generation, prompt=tuple(ids), grammar=None, prefill_only=True)


@post(["/v1/prefill"], status_code=200)
async def prefill(request: Request) -> Response:
    state = state_of(request)
    generation = await prepared(request, lambda f, cancel: prefill_request(state, f, cancel), json_only=True)
    held = 0
    if generation is not None and state.model.warm is not None:  # --no-prompt-cache: nothing would be reused
        job = state.worker.submit(generation)
        _, _, fin = await whole_answer(job, request)
        held = fin.held_tokens
    return Response({"object": "prefill", "cached_tokens": held})


ROUTES = [prefill]
