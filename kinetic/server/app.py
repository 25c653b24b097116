"""create_app(model, options): the Litestar app that serves one loaded model over three APIs.

The engine thread starts with the app and stops with it. Handlers never run the model themselves:
they validate a request, hand the engine worker a GenerationRequest and stream its events back.
"""

from __future__ import annotations

from litestar import Litestar
from litestar.middleware import DefineMiddleware

from kinetic.server import llama_api, ollama_api, openai_api
from kinetic.server.errors import EXCEPTION_HANDLERS
from kinetic.server.options import ServerOptions, ServerState
from kinetic.server.security import Guard
from kinetic.server.worker import EngineWorker


def create_app(model, options: ServerOptions | None = None) -> Litestar:
    options = options or ServerOptions()
    defaults = options.sampling or model.sampling_defaults()
    worker = EngineWorker(model, max_queued=options.max_queued)
    _ = model.chat_template  # loaded now: a broken template fails at start, not on every request
    state = ServerState(model=model, worker=worker, options=options, name=options.alias or model.path.stem,
                        defaults=defaults)
    app = Litestar(
        route_handlers=[*openai_api.ROUTES, *llama_api.ROUTES, *ollama_api.ROUTES],
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[DefineMiddleware(Guard, options=options)],
        on_startup=[lambda: worker.start()],
        on_shutdown=[lambda: worker.stop()],
        request_max_body_size=options.max_body_bytes + 1,  # body.read_body enforces the limit itself
        openapi_config=None,
        debug=False,
    )
    app.state.kinetic = state
    return app
