"""The server's settings (ServerOptions) and what every route shares (ServerState).

Defaults: llama-server's address, 127.0.0.1:8080 (Ollama's port, 11434, with --ollama), at most 64
connections, 30 s for a client to send its request. The body limit (16 MiB) is larger than any
prompt a context holds. One client address may hold at most 48 of the 64 connections, so 16 are always left for others
(http.py); 2 threads prepare requests (parse, render, tokenize) with 16 more waiting (offload.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from kinetic.runtime.sampling import SamplingSettings

DEFAULT_PORT, OLLAMA_PORT = 8080, 11434


def add_server_args(parser) -> None:
    """kinetic serve's flags for who may call it and what it signs (docs/server.md)."""
    parser.add_argument("--allowed-origins", metavar="LIST",
                        help="more web page origins allowed to call the server, comma-separated, * as a wildcard "
                             "(http://example.com, chrome-extension://*) [default: $KINETIC_ORIGINS; "
                             "$OLLAMA_ORIGINS is added]")
    parser.add_argument("--sign-key", metavar="FILE", help="sign receipts (\"receipt\": true) with this Ed25519 "
                                                           "secret key file")


def server_settings(args, environ=None) -> dict:
    """ServerOptions fields from add_server_args' flags and the environment; a bad key file fails here."""
    from kinetic.server.security import origin_patterns

    key = None
    if args.sign_key:
        from kinetic.ktc.keys import read_signing_key

        key = read_signing_key(args.sign_key)
    return {"allowed_origins": origin_patterns(args.allowed_origins, os.environ if environ is None else environ),
            "sign_key": key}


@dataclass(frozen=True)
class ServerOptions:
    alias: str | None = None  # the model's name in the API [default: the file's name without extension]
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None  # required as Bearer or X-Api-Key on every route but /health
    max_body_bytes: int = 16 * 1024 * 1024
    max_connections: int = 64  # beyond: an idle or slow connection makes room, else 503 (http.py)
    max_client_connections: int = 48  # from one client address; beyond: 503
    max_queued: int = 32  # requests waiting for the engine; beyond: 503
    request_seconds: float = 30.0  # a client has this long to send its request (and to take each write)
    cpu_workers: int = 2  # threads that prepare requests (parse, render, tokenize, compile grammars)
    max_preparing: int = 16  # requests waiting for one of those threads; beyond: 503
    parallel: int | None = 1  # slots: answers sharing each pass (Convoy); None: 4, fewer if memory is short
    sampling: SamplingSettings | None = None  # the server's default sampling [default: the model file's]
    device_name: str = "the CPU"
    allowed_origins: tuple[str, ...] = ()  # more Origins pages may call from (security.py; --allowed-origins)
    sign_key: object = None  # a nacl SigningKey: receipts are signed with it (--sign-key; receipts.py)


@dataclass
class ServerState:
    """Shared by every handler: the model, its engine thread and the server's settings."""

    model: object
    worker: object
    options: ServerOptions
    name: str
    defaults: SamplingSettings
    cpu: object  # the CpuPool (offload.py) that prepares requests off the event loop
    token_bound: object  # the vocabulary's TokenBound (fit.py): prompts refused before tokenizing
    started: float = field(default_factory=time.time)

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx
