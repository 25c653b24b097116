"""The HTTP server: OpenAI's API under /v1, Anthropic's, llama-server's and Ollama's, and a chat page,
from one Litestar app.

Owns: requests and responses (validation, each API's shapes and errors, streaming), and the
limits and checks a server open to clients needs. Does not own sampling (kinetic/runtime/sampling),
text reading (output_parsing), generation (kinetic/runtime/generation.py) or the queue of requests
and the engine thread (kinetic/runtime/scheduler.py). `kinetic serve` (kinetic/cli/serve_cmd.py) runs it;
docs/server.md describes the endpoints and fields.

    app.py          create_app(model, options): the Litestar app and its routes
    openai_api.py   /v1/...: chat completions, completions, models, health
    llama_api.py    /completion, /tokenize, /detokenize, /props, /slots, /health
    ollama_api.py   /api/...: chat, generate, show, tags, ps, version
    anthropic_api.py  /v1/messages: Anthropic's Messages API, run as the OpenAI chat route
    responses_api.py  /v1/responses: OpenAI's Responses API (its answers and events)
    responses_input.py  its request read as a chat request; the store previous_response_id reads
    chat_run.py     what those two share: the chat route's preparation, the reply whole or as deltas
    page.py         the chat page at / (static/: HTML, script, style sheet) and /v1 in a browser
    metrics.py      /metrics: Prometheus text under llama-server's names
    common.py       what the three APIs' routes share: preparing off the loop, the engine round trip, SSE
    worker.py       EngineWorker / Job: the scheduler's events brought back to the event loop
    offload.py      CpuPool: request preparation off the event loop; memory handed back after large ones
    fit.py          TokenBound: prompts refused from their byte length before tokenizing
    body.py         reading a request: size limit, deadline, content type, JSON, typed fields
    params.py       API fields -> SamplingSettings, one reader for the three APIs
    prompts.py      prompts from requests: chat messages through the template, text, token ids
    constraints.py  which grammar a request asks for, compiled once and cached (GrammarCache)
    reply.py        a chat answer read as reasoning, text and tool calls
    generic_tools.py  tools on a template without a call format: llama.cpp's generic JSON fallback
    receipts.py     "receipt": true: the receipt of an answer, as `kinetic run --receipt` writes it
    textstream.py   streamed text, piece by piece: the reasoning block and tool-call markers
    errors.py       ApiError and each API family's error shape
    security.py     the API key, pages from other sites and apps (--allowed-origins), DNS rebinding
    http.py         uvicorn, deadlines, the connection policy
    options.py      ServerOptions (the settings) and ServerState (what every route shares)
"""

from typing import Any

__all__ = ["ServerOptions", "create_app"]


def __getattr__(name: str) -> Any:
    """create_app and ServerOptions on first use: importing a module of this package (the terminal
    chat reads textstream.py) must not load Litestar, which costs ~0.8 s on every `kinetic` command."""
    if name == "create_app":
        from kinetic.server.app import create_app

        return create_app
    if name == "ServerOptions":
        from kinetic.server.options import ServerOptions

        return ServerOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
