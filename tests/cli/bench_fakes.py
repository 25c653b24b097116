"""What the `kinetic bench` tests share: running the command in-process, and fake llama.cpp programs.

The fake llama-bench prints llama-bench's JSON shape (taken from a real `llama-bench -o json` run) with
known speeds and logs its argv; the fake llama-server answers --help with a --spec-type line, /health
with 200, and streams a chat answer as llama-server's OpenAI endpoint does, logging its argv, its pid
and the request. llama.cpp itself is never run.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

from kinetic.cli import main as cli


def kinetic(capsys, *args: str) -> tuple[int, str, str]:
    """Runs `kinetic ARGS` in this process: (exit code, stdout, stderr)."""
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def llama_bench_json(n_prompt: int, n_gen: int, samples: list[float]) -> dict:
    """One test of `llama-bench -o json`, with the fields Kinetic reads and a few it ignores."""
    return {
        "build_commit": "0c1e570",
        "build_number": 4242,
        "cpu_info": "AMD EPYC",
        "backends": "CPU",
        "model_size": 96576768,
        "model_n_params": 134515008,
        "n_threads": 2,
        "n_gpu_layers": 0,
        "flash_attn": 1,
        "devices": "none",
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "avg_ts": sum(samples) / len(samples),
        "stddev_ts": 1.0,
        "samples_ts": samples,
    }


FAKE_LLAMA_BENCH = """#!{python}
import json, pathlib, sys
args = sys.argv[1:]
if "--help" in args:
    print("  -fa, --flash-attn <on|off|auto>   (default: auto)")
    print("  -dev, --device <dev0/dev1/...>    (default: auto)")
    sys.exit(0)
here = pathlib.Path(sys.argv[0]).parent
(here / "argv.json").write_text(json.dumps(args))
pp, tg = json.loads((here / "answer.json").read_text())
pp["n_prompt"] = int(args[args.index("-p") + 1])
tg["n_gen"] = int(args[args.index("-n") + 1])
print(json.dumps([pp, tg], indent=2))
"""


def write_fake_llama_bench(folder: Path) -> tuple[Path, Path]:
    """A llama-bench in `folder` that answers pp best 400 t/s, tg best 200 t/s; (it, the file it logs its argv to)."""
    answer = [llama_bench_json(0, 0, [380.0, 400.0]), llama_bench_json(0, 0, [200.0, 190.0])]
    (folder / "answer.json").write_text(json.dumps(answer))
    exe = folder / "llama-bench"
    exe.write_text(FAKE_LLAMA_BENCH.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, folder / "argv.json"


FAKE_LLAMA_SERVER = """#!{python}
import json, os, pathlib, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
if "--help" in args:
    print("{spec_line}")
    print("-dev,  --device <dev1,dev2,..>          devices")
    sys.exit(0)
here = pathlib.Path(sys.argv[0]).parent
(here / "server_argv.json").write_text(json.dumps(args))
(here / "server_pid").write_text(str(os.getpid()))
ANSWER = json.loads((here / "server_answer.json").read_text())

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        (here / "server_request.json").write_text(json.dumps(request))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        def send(chunk):
            self.wfile.write(("data: " + json.dumps(chunk) + "\\n\\n").encode())
            self.wfile.flush()
        send({{"choices": [{{"delta": {{"role": "assistant", "content": None}}, "finish_reason": None}}]}})
        for piece in ANSWER:
            time.sleep(0.01)
            send({{"choices": [{{"delta": {{"content": piece}}, "finish_reason": None}}]}})
        time.sleep(0.01)
        send({{"choices": [{{"delta": {{}}, "finish_reason": "stop"}}]}})
        send({{"choices": [], "usage": {{"completion_tokens": len(ANSWER) + 1, "prompt_tokens": 99}}}})
        self.wfile.write(b"data: [DONE]\\n\\n")

HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
"""
SPEC_LINE = "--spec-type none,draft-simple,ngram-simple,ngram-mod   speculative decoding types"


def write_fake_server(folder, answer: list[str], spec_line: str = SPEC_LINE):
    """A llama-server that answers --help with `spec_line`, /health with 200, and streams `answer` piece by piece."""
    (folder / "server_answer.json").write_text(json.dumps(answer))
    exe = folder / "llama-server"
    exe.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable, spec_line=spec_line))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe
