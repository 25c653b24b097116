"""The HTTP server: OpenAI's API under /v1, llama-server's and Ollama's, from one Litestar app.

Owns: requests and responses (validation, the three APIs' shapes and errors, streaming), and the
limits and checks a server open to clients needs. Does not own sampling (kinetic/runtime/sampling),
text reading (output_parsing), generation (kinetic/runtime/generation.py) or the queue of requests
and the engine thread (kinetic/runtime/scheduler.py). `kinetic serve` (kinetic/cli/serve_cmd.py) runs it;
docs/server.md describes the endpoints and fields.

    app.py         create_app(model, options)          worker.py     jobs: the scheduler's events
    openai_api.py  /v1/...                              llama_api.py  /completion, /tokenize, /props, ...
    ollama_api.py  /api/...                             http.py       uvicorn, deadlines, connection policy
    offload.py     CpuPool: request preparation off the event loop; memory handed back after large ones
    fit.py         TokenBound: prompts refused from their byte length before tokenizing
    body.py, params.py, prompts.py, reply.py, textstream.py: reading requests and streamed answers
"""

from kinetic.server.app import create_app
from kinetic.server.options import ServerOptions

__all__ = ["ServerOptions", "create_app"]
