"""OpenAI's Responses API: POST /v1/responses (whole or streamed) and GET /v1/responses/{id}.

Owns: the response object and its stream of events. The request is read into the chat request it
means by responses_input.py (input items, instructions, tools, text.format, previous_response_id)
and runs as the chat route's (chat_run.py). Calls come back as function_call output items, text as
a message item with an output_text part, reasoning as a reasoning item. Streamed: the events
response.created, response.in_progress, then per item response.output_item.added,
response.content_part.added, response.output_text.delta, ...done (response.function_call_arguments
.delta / .done for a call), response.output_item.done, and last response.completed
(response.incomplete when max_output_tokens cut the answer, as OpenAI). Each answer is kept in
this process's ResponseStore unless `"store": false`, so a later request continues it with
previous_response_id.
"""

from __future__ import annotations

import secrets
import time

from litestar import Request, Response, get, post
from litestar.response import Stream

from kinetic.server import chat_run
from kinetic.server.body import Fields
from kinetic.server.chat_run import Done
from kinetic.server.common import SSE_HEADERS, guarded, sse, state_of
from kinetic.server.errors import ApiError, error_body, path_of
from kinetic.server.responses_input import STORED, Asked, ResponseStore, Stored, read_request
from kinetic.server.worker import Failed


def response_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def store_of(request: Request) -> ResponseStore:
    state = request.app.state
    if "kinetic_responses" not in state:  # on the event loop: no other task runs between test and set
        state.kinetic_responses = ResponseStore()
    return state.kinetic_responses


# -- the answer ---------------------------------------------------------------------------------------------


def _usage(fin) -> dict:
    return {"input_tokens": fin.prompt_tokens, "input_tokens_details": {"cached_tokens": fin.cached_tokens},
            "output_tokens": fin.generated_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": fin.prompt_tokens + fin.generated_tokens}


def _text_item(item_id: str, text: str, status: str = "completed") -> dict:
    content = [_text_part(text)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_item(item_id: str, text: str) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(item_id: str, call, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": response_id("call"), "name": call.name,
            "arguments": call.arguments_json() if status == "completed" else "", "status": status}


def _finished(head: dict, output: list[dict], fin) -> dict:
    cut = fin.finish_reason == "length"
    return {**head, "status": "incomplete" if cut else "completed", "output": output, "usage": _usage(fin),
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None}


def _answer_message(output: list[dict]) -> dict:
    """The response's output as the assistant message a later request continues from."""
    text = "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


def _keep(request: Request, asked: Asked, response: dict) -> None:
    if asked.echo["store"]:
        history = [*asked.history, _answer_message(response["output"])]
        store_of(request).put(response["id"], Stored(history, response))


@post(["/v1/responses"], status_code=200)
async def responses(request: Request) -> Response:
    store = store_of(request)
    asked: list[Asked] = []

    def translate(f: Fields) -> dict:
        asked.append(read_request(f, store))
        return asked[0].body

    ready = await chat_run.prepare(request, translate)
    job = chat_run.submit(request, ready)
    head = {"id": response_id("resp"), "object": "response", "created_at": int(time.time()),
            "model": state_of(request).name, **asked[0].echo}
    if ready.common.stream:
        path = path_of(request)
        events = _stream(job, ready, head, request, asked[0])
        return Stream(guarded(events, path, _error_event), media_type="text/event-stream", headers=SSE_HEADERS)
    done = await chat_run.whole(job, request, ready)
    output = ([_reasoning_item(response_id("rs"), done.reasoning)] if done.reasoning else []) + \
        ([_text_item(response_id("msg"), done.content)] if done.content or not done.calls else []) + \
        [_call_item(response_id("fc"), c) for c in done.calls]
    response = _finished(head, output, done.fin)
    _keep(request, asked[0], response)
    return Response(response)


@get(["/v1/responses/{response_id:str}"], sync_to_thread=False)
def stored_response(request: Request) -> dict:
    response_id = request.path_params["response_id"]
    found = store_of(request).get(response_id)
    if found is None:
        raise ApiError(404, f"No response with id '{response_id}' (responses are kept in this server's memory, "
                            f"the last {STORED})", param="response_id")
    return found.response


def _error_event(body: dict) -> bytes:
    return _frame({"type": "error", **body["error"]})


def _frame(data: dict) -> bytes:
    return f"event: {data['type']}\n".encode() + sse(data)


class _Events:
    """The stream's events, numbered, and the output items as they are written."""

    def __init__(self, head: dict):
        self.head = head
        self.number = 0
        self.output: list[dict] = []
        self.open: dict | None = None  # the message or reasoning item being written
        self.text = ""

    def __call__(self, kind: str, **data) -> bytes:
        frame = _frame({"type": kind, "sequence_number": self.number, **data})
        self.number += 1
        return frame

    def write(self, kind: str, text: str) -> list[bytes]:
        if not text:
            return []
        frames = []
        if self.open is None or self.open["type"] != kind:
            frames = self.close()
            item_id = response_id("msg" if kind == "message" else "rs")
            self.open = _text_item(item_id, "", "in_progress") if kind == "message" else \
                {**_reasoning_item(item_id, ""), "content": []}
            frames.append(self("response.output_item.added", output_index=len(self.output), item=self.open))
            if kind == "message":
                frames.append(self("response.content_part.added", item_id=item_id, output_index=len(self.output),
                                   content_index=0, part=_text_part("")))
        self.text += text
        delta = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        frames.append(self(delta, item_id=self.open["id"], output_index=len(self.output), content_index=0,
                           delta=text, **({"logprobs": []} if kind == "message" else {})))
        return frames

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        item, index, text = self.open, len(self.output), self.text
        self.open, self.text = None, ""
        if item["type"] == "reasoning":
            done = _reasoning_item(item["id"], text)
            frames = [self("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                           text=text)]
        else:
            done = _text_item(item["id"], text)
            frames = [self("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                           text=text, logprobs=[]),
                      self("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                           part=_text_part(text))]
        self.output.append(done)
        return frames + [self("response.output_item.done", output_index=index, item=done)]

    def call(self, call) -> list[bytes]:
        frames, index = self.close(), len(self.output)
        done = _call_item(response_id("fc"), call)
        started = {**done, "arguments": "", "status": "in_progress"}
        self.output.append(done)
        return frames + [self("response.output_item.added", output_index=index, item=started),
                         self("response.function_call_arguments.delta", item_id=done["id"], output_index=index,
                              delta=done["arguments"]),
                         self("response.function_call_arguments.done", item_id=done["id"], output_index=index,
                              name=done["name"], arguments=done["arguments"]),
                         self("response.output_item.done", output_index=index, item=done)]


async def _stream(job, ready, head: dict, request: Request, asked: Asked):
    events = _Events(head)
    started = {**head, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield events("response.created", response=started)
    yield events("response.in_progress", response=started)
    async for item in chat_run.deltas(job, ready):
        if isinstance(item, Failed):
            yield _error_event(error_body(path_of(request), item.status, item.message))
            return
        frames = events.write("reasoning", item.reasoning) + events.write("message", item.content)
        if isinstance(item, Done):
            for call in item.calls:
                frames += events.call(call)
            frames += events.close()
            response = _finished(head, events.output, item.fin)
            _keep(request, asked, response)
            kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
            frames.append(events(kind, response=response))
        for frame in frames:
            yield frame


ROUTES = [responses, stored_response]
