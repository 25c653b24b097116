"""Kinetic on Ray Serve: N engine replicas behind one ingress that routes by prefix affinity.

Owns: the two deployments and the application they make (`build_application`).

* `EngineReplica` (one deployment per replica, `replica-0`, `replica-1`, ..., each num_replicas=1,
  so Ray restarts each one on its own and the ingress can address each by name): builds the very
  app `kinetic serve` builds (serve_cmd.build_server) and serves it with the same uvicorn policy
  (kinetic/server/http.py) on a private port of its node. Its health check fails when that server
  or its engine thread has stopped; Ray then restarts it.
* `Ingress` (the HTTP entry Ray Serve's proxy sends every path to): picks a replica (routing.py on
  the key of affinity.py) and forwards the raw request to it with httpx, relaying the answer's
  status, headers and body as they come (streams included), with `X-Kinetic-Replica: NAME` added.

Why forward raw HTTP rather than call the replica through Ray with parsed requests: the replica runs
the single-process server's own routes, so every API (OpenAI, llama-server, Ollama, Anthropic,
Responses, embeddings, /metrics, the chat page), its validation, errors, streaming and limits are
one implementation; the ingress knows nothing of any API but where its affinity key sits.

Faults: a replica that cannot be reached is skipped for DOWN_S (its conversations go to the next
replica on the ring) and asked for its new address afterwards (Ray restarts it on a new port). A
request whose replica fails before answering gets 503 with Retry-After; a stream whose replica
fails midway ends with one error event. Does not own the command line (launch.py, deploy.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import httpx
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from kinetic.scaleout import metrics
from kinetic.scaleout.affinity import affinity_key
from kinetic.scaleout.routing import DEFAULT_OVERLOAD, Router

REPLICA_HEADER = "X-Kinetic-Replica"
DOWN_S = 3.0  # a replica that could not be reached is skipped this long, then asked again
ADDRESS_S = 2.0  # how long the ingress waits for a replica to say where it listens
RETRY_AFTER_S = 2
NODE_ADDRESS = "node"  # bind_host meaning: the address of the node the replica runs on (for clusters)
# headers of one connection (and date/server, which the ingress's own server writes): never forwarded
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade",
                        "proxy-connection", "te", "trailer", "date", "server"})


QUIET = {"log_level": "WARNING", "enable_access_log": False}  # Ray's per-request lines; Kinetic's own go to stderr


@serve.deployment(health_check_period_s=2, health_check_timeout_s=30, logging_config=QUIET)
class EngineReplica:
    """One Kinetic engine: `kinetic serve`'s app on a private port (args: serve's parsed flags;
    bind_host: 127.0.0.1 on one machine, NODE_ADDRESS on a cluster)."""

    def __init__(self, args, name: str, bind_host: str):
        from kinetic.cli.serve_cmd import build_server
        from kinetic.server.http import make_server

        if bind_host == NODE_ADDRESS:
            from ray.util import get_node_ip_address

            bind_host = get_node_ip_address()
        args.host, args.port, args.replicas = bind_host, 0, None
        app, options, sock = build_server(args)
        self.name = name
        self.url = f"http://{bind_host}:{options.port}"
        self.worker = app.state.kinetic.worker
        self.server = make_server(app, options)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"{name}: the server stopped while starting")
            time.sleep(0.01)

    def address(self) -> dict:
        return {"name": self.name, "url": self.url, "pid": os.getpid()}

    def check_health(self) -> None:
        if not self.thread.is_alive() or not self.worker.running:
            raise RuntimeError(f"{self.name}: its server or engine thread has stopped")

    def __del__(self) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.should_exit = True


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0}, logging_config=QUIET)
class Ingress:
    """The one HTTP entry: routes each request to a replica and relays its answer."""

    def __init__(self, replicas: list, overload: int = DEFAULT_OVERLOAD):
        self.handles = {f"replica-{i}": handle for i, handle in enumerate(replicas)}
        self.router = Router(overload=overload)
        for name in self.handles:
            self.router.add(name)
        self.urls: dict[str, dict] = {}
        self.down_until: dict[str, float] = {}
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0), limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=64))

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if path == "/metrics":
            return await self._metrics(request)
        if path == "/scaleout/replicas":
            return JSONResponse(await self._replicas())
        body = await request.body()
        key = affinity_key(body) if request.method == "POST" else None
        tried: set[str] = set()
        while True:
            self.router.down = {n for n, until in self.down_until.items() if until > time.monotonic()}
            name = self.router.pick(key, exclude=frozenset(tried))
            if name is None:
                return _unavailable(path, "no replica is answering")
            tried.add(name)
            address = await self._address(name)
            if address is None:
                continue
            self.router.started(name)
            try:
                upstream = await self.client.send(self._upstream_request(request, address["url"], body), stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):  # nothing was sent: another replica may answer
                self.router.finished(name)
                self._lost(name)
                continue
            except httpx.TransportError:
                self.router.finished(name)
                self._lost(name)
                return _unavailable(path, f"{name} failed before answering")
            except BaseException:
                self.router.finished(name)
                raise
            headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            headers[REPLICA_HEADER] = name
            return StreamingResponse(self._relay(upstream, name), status_code=upstream.status_code, headers=headers)

    def _upstream_request(self, request: Request, url: str, body: bytes) -> httpx.Request:
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        if "host" in request.headers:
            headers.append(("x-forwarded-host", request.headers["host"]))
        target = url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return self.client.build_request(request.method, target, headers=headers, content=body)

    async def _relay(self, upstream: httpx.Response, name: str):
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except httpx.TransportError:
            self._lost(name)
            yield _stream_error(upstream.headers.get("content-type", ""), f"{name} failed midway; retry the request")
        finally:
            self.router.finished(name)
            await upstream.aclose()

    async def _address(self, name: str) -> dict | None:
        if name not in self.urls:
            try:
                self.urls[name] = await asyncio.wait_for(self.handles[name].address.remote(), ADDRESS_S)
            except Exception:  # starting, restarting or gone: Ray says which only in its logs
                self.down_until[name] = time.monotonic() + DOWN_S
                return None
        return self.urls[name]

    def _lost(self, name: str) -> None:
        """`name` did not answer: skip it for DOWN_S, then ask where it listens again."""
        self.urls.pop(name, None)
        self.down_until[name] = time.monotonic() + DOWN_S

    async def _replicas(self) -> list[dict]:
        rows = []
        for name in self.handles:
            address = await self._address(name)
            rows.append({"name": name, "up": address is not None, "in_flight": self.router.in_flight.get(name, 0),
                         **(address or {})})
        return rows

    async def _metrics(self, request: Request) -> Response:
        auth = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "x-api-key")}

        async def one(name: str) -> str | None:
            address = await self._address(name)
            if address is None:
                return None
            try:
                answer = await self.client.get(address["url"] + "/metrics", headers=auth, timeout=5.0)
            except httpx.TransportError:
                self._lost(name)
                return None
            return answer.text if answer.status_code == 200 else None

        texts = await asyncio.gather(*(one(name) for name in self.handles))
        merged = metrics.merge(dict(zip(self.handles, texts, strict=True)))
        return PlainTextResponse(merged, media_type="text/plain; version=0.0.4")


def _unavailable(path: str, why: str) -> Response:
    from kinetic.server.errors import error_body

    message = f"{why}; try again in {RETRY_AFTER_S} s"
    return JSONResponse(error_body(path, 503, message), status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


def _stream_error(content_type: str, message: str) -> bytes:
    error = {"message": message, "type": "unavailable_error", "code": 503}
    if "event-stream" in content_type:
        return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
    return json.dumps({"error": message}).encode() + b"\n"  # Ollama's newline-delimited JSON


def build_application(args, *, replicas: int, threads: int, bind_host: str = "127.0.0.1",
                      overload: int = DEFAULT_OVERLOAD):
    """The Ray Serve application: `replicas` EngineReplicas of `threads` threads each, one Ingress."""
    args.threads = threads
    resources = {"num_cpus": threads, "num_gpus": 1 if args.device == "cuda" else 0}  # a GPU replica: one each
    engines = [EngineReplica.options(name=f"replica-{i}", ray_actor_options=resources)
               .bind(args, f"replica-{i}", bind_host) for i in range(replicas)]
    return Ingress.bind(engines, overload)
