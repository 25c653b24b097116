"""create_app(model, options): the Litestar app that serves one loaded model over three APIs.

The engine thread starts with the app and stops with it. Handlers never run the model themselves:
they prepare a request on the CpuPool (offload.py), hand the engine worker a GenerationRequest and
stream its events back. After a large request (1 MiB or more) the heap is trimmed, so the memory
its body, JSON and prompt took goes back to the system (offload.ReleaseAfterLarge).
"""

from __future__ import annotations

from litestar import Litestar
from litestar.middleware import DefineMiddleware

from kinetic.server import (
    anthropic_api,
    embedding_api,
    llama_api,
    ollama_api,
    openai_api,
    page,
    prefill_api,
    responses_api,
)
from kinetic.server.errors import EXCEPTION_HANDLERS
from kinetic.server.fit import TokenBound
from kinetic.server.offload import CpuPool, ReleaseAfterLarge
from kinetic.server.options import ServerOptions, ServerState
from kinetic.server.security import Guard
from kinetic.server.worker import EngineWorker


def create_app(model, options: ServerOptions | None = None) -> Litestar:
    options = options or ServerOptions()
    defaults = options.sampling or model.sampling_defaults()
    worker = EngineWorker(model, max_queued=options.max_queued, slots=options.parallel)
    _ = model.chat_template  # loaded now: a broken template fails at start, not on every request
    state = ServerState(model=model, worker=worker, options=options, name=options.alias or model.path.stem,
                        defaults=defaults, cpu=CpuPool(options.cpu_workers, options.max_preparing),
                        token_bound=TokenBound.of(model.tokenizer))
    app = Litestar(
        route_handlers=[*openai_api.ROUTES, *llama_api.ROUTES, *ollama_api.ROUTES, *anthropic_api.ROUTES,
                        *responses_api.ROUTES, *page.ROUTES, *embedding_api.ROUTES, *prefill_api.ROUTES],
        before_request=embedding_api.refuse_generation,
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[ReleaseAfterLarge, DefineMiddleware(Guard, options=options)],
        on_startup=[lambda: worker.start()],
        on_shutdown=[lambda: worker.stop(), lambda: finish_warm_writes(model)],
        request_max_body_size=options.max_body_bytes + 1,  # body.read_body enforces the limit itself
        openapi_config=None,
        debug=False,
    )
    app.state.kinetic = state
    return app


def finish_warm_writes(model) -> None:
    """Write Warm Start's queued state files before the server exits: after a graceful shutdown on
    SIGTERM, uvicorn ends the process by the signal itself, which skips the disk tier's exit hook."""
    warm = getattr(model, "warm", None)
    if warm is not None and warm.disk is not None:
        warm.disk.close()

