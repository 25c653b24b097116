"""A local stand-in for the Hugging Face hub's file API, for `kinetic pull org/repo` tests.

It answers the requests huggingface_hub makes for a pull, as huggingface.co answers them:
* GET /api/models/{org}/{repo}[/revision/{rev}]: the repository's info with `sha` (its commit) and
  `siblings`, each with size, blobId and, for LFS files, lfs {size, sha256, pointerSize}; an unknown
  repository is a 404 with X-Error-Code: RepoNotFound;
* GET|HEAD /{org}/{repo}/resolve/{rev}/{path}: for an LFS file a 302 to /cdn/{sha256} with
  X-Repo-Commit, X-Linked-Etag, X-Linked-Size and Location; a small file is served in place;
* GET /cdn/{sha256}: the bytes, with Range support (206 and Content-Range), ETag, Content-Length.

Tests can make the first transfer of a file break off half way (`cut_first`), serve altered bytes
(`corrupt`), and read every request it saw (`requests`: method, path, Range, Authorization).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubFile:
    data: bytes | None = None  # the bytes, or
    path: str | None = None  # a file to serve them from
    lfs: bool = True
    sha256: str | None = None  # computed when not given

    def read(self) -> bytes:
        if self.data is None:
            with open(self.path, "rb") as f:
                self.data = f.read()
        return self.data

    def digest(self) -> str:
        if self.sha256 is None:
            self.sha256 = hashlib.sha256(self.read()).hexdigest()
        return self.sha256


@dataclass
class Hub:
    repos: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    cut_first: bool = False
    corrupt: bool = False
    requests: list[dict] = field(default_factory=list)
    _cut_done: set = field(default_factory=set)

    def by_sha(self, sha: str) -> HubFile | None:
        return next((f for files in self.repos.values() for f in files.values() if f.lfs and f.digest() == sha), None)


def _handler(hub: Hub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def do_HEAD(self):
            self._route(head=True)

        def do_GET(self):
            self._route(head=False)

        def _route(self, head: bool):
            path = self.path.split("?")[0]
            hub.requests.append({"method": self.command, "path": path, "range": self.headers.get("Range"),
                                 "authorization": self.headers.get("Authorization")})
            if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path):
                return self._info(m[1])
            if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path):
                return self._resolve(m[1], m[2], head)
            if m := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
                f = hub.by_sha(m[1])
                return self._bytes(f, head) if f else self._error(404, "EntryNotFound")
            self._error(404, "RepoNotFound")

        def _info(self, repo: str):
            files = hub.repos.get(repo)
            if files is None:
                return self._error(404, "RepoNotFound")
            siblings = []
            for name, f in files.items():
                data = f.read()
                entry = {"rfilename": name, "size": len(data),
                         "blobId": hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()}
                if f.lfs:
                    entry["lfs"] = {"size": len(data), "sha256": f.digest(), "pointerSize": 134}
                siblings.append(entry)
            body = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                               "siblings": siblings}).encode()
            self._send(200, body, {"Content-Type": "application/json"})

        def _resolve(self, repo: str, name: str, head: bool):
            f = hub.repos.get(repo, {}).get(name)
            if f is None:
                return self._error(404, "EntryNotFound" if repo in hub.repos else "RepoNotFound")
            if not f.lfs:
                return self._bytes(f, head, {"X-Repo-Commit": COMMIT})
            host = self.headers.get("Host")
            self._send(302, b"", {"Location": f"http://{host}/cdn/{f.digest()}", "X-Repo-Commit": COMMIT,
                                  "X-Linked-Etag": f'"{f.digest()}"', "X-Linked-Size": str(len(f.read())),
                                  "ETag": '"pointer"'}, head=head)

        def _bytes(self, f: HubFile, head: bool, extra: dict | None = None):
            data = f.read()
            if hub.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            start = 0
            status = 200
            headers = {"ETag": f'"{f.digest()}"', "Accept-Ranges": "bytes", **(extra or {})}
            if m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or ""):
                start, status = int(m[1]), 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            key = f.digest()
            if hub.cut_first and not head and key not in hub._cut_done:
                hub._cut_done.add(key)
                return self._send_cut(status, body, headers)
            self._send(status, body, headers, head=head)

        def _send_cut(self, status: int, body: bytes, headers: dict):
            """Promise the whole body, send half of it, and drop the connection."""
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)

        def _error(self, status: int, code: str):
            body = json.dumps({"error": code}).encode()
            self._send(status, body, {"Content-Type": "application/json", "X-Error-Code": code})

        def _send(self, status: int, body: bytes, headers: dict, head: bool = False):
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self.wfile.write(body)

    return Handler


class HubServer:
    """The server on a free local port, in a thread; `url` is what HF_ENDPOINT is set to."""

    def __init__(self, hub: Hub):
        self.hub = hub
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
