"""`kinetic serve MODEL`: the OpenAI, llama-server and Ollama APIs over HTTP (docs/server.md).

Prints one line once it listens, `Serving NAME on the CPU at http://127.0.0.1:8080/v1`, and runs
until Ctrl+C. llama-server's command line works: its flags for what Kinetic does by itself are
accepted and ignored, and the few with no equivalent stop with a line saying what to use.
The sampler flags set the server's default sampling (over the model file's recommendations).
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace

from kinetic.cli.run_cmd import (
    add_device_args,
    add_off_arg,
    add_sampling_args,
    add_signature_arg,
    device_choice,
    parse_off,
    sampling_changes,
)
from kinetic.devices import DEVICE_NAMES, resolve_device
from kinetic.errors import KineticError

# llama-server flags Kinetic takes and ignores: (flags, takes a value)
_IGNORED = (
    (("-b", "--batch-size"), True),
    (("-ub", "--ubatch-size"), True),
    (("-tb", "--threads-batch"), True), (("--threads-http",), True), (("-to", "--timeout"), True),
    (("--cache-reuse",), True), (("--jinja",), False), (("--metrics",), False), (("--slots",), False),
    (("--no-webui",), False), (("-cb", "--cont-batching"), False), (("-nocb", "--no-cont-batching"), False),
    (("--no-warmup",), False), (("--mlock",), False), (("--mmap",), False), (("--no-mmap",), False),
)

# llama-server flags with no equivalent: what to do instead
_REFUSED = (
    (("-hf", "--hf-repo", "-mu", "--model-url"), "download with kinetic pull <org>/<repo>, then serve it by name"),
    (("-sm", "--split-mode", "-ts", "--tensor-split", "-mg", "--main-gpu", "-ot", "--override-tensor"),
     "Kinetic runs the model wholly on one device; choose it with --device"),
    (("--ssl-key-file", "--ssl-cert-file"), "the server speaks plain HTTP; put a TLS proxy in front"),
    (("--api-key-file",), "pass the key itself with --api-key"),
    (("--grammar", "--grammar-file", "-j", "--json-schema"), "constrained output is requested per request, "
                                                             "through grammar and response_format"),
    (("-md", "--model-draft", "--draft", "--draft-max", "--draft-min", "-ngld"),
     "speculative decoding needs no draft model"),
    (("--chat-template",), "built-in template names are not supported; pass a Jinja file with --chat-template-file"),
    (("--mmproj",), "vision models are not supported yet"),
    (("--lora", "--lora-scaled"), "LoRA adapters are not supported yet"),
    (("--embedding", "--embeddings", "--reranking"), "embedding and reranking models are not supported yet"),
)


class _Refuse(argparse.Action):
    def __init__(self, option_strings, dest, what: str = "", **kwargs):
        super().__init__(option_strings, dest, nargs="?", **kwargs)
        self.what = what

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is a llama.cpp flag: {self.what}")


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve OpenAI-, llama-server- and Ollama-compatible APIs",
                       description="Serve a model over HTTP: the OpenAI API under /v1, llama-server's and "
                                   "Ollama's. See docs/server.md.")
    p.add_argument("model", nargs="?", help="a .gguf or .ktc file or a downloaded model's name")
    p.add_argument("-m", "--model", dest="model_flag", metavar="MODEL", help="the model, as llama-server takes it")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on [default: 127.0.0.1]")
    p.add_argument("--port", type=int, metavar="PORT", help="port [default: 8080, or 11434 with --ollama; "
                                                            "0 picks a free one]")
    p.add_argument("--ollama", action="store_true", help="listen on Ollama's port, 11434")
    p.add_argument("-a", "--alias", metavar="NAME", help="model name the API reports [default: the file's name]")
    p.add_argument("--api-key", metavar="KEY", help="require Authorization: Bearer KEY (or X-Api-Key: KEY) on "
                                                    "every route but /health")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N", help="context size per request, prompt "
                                                                                 "and answer [default: 4096]")
    p.add_argument("-t", "--threads", type=int, metavar="N", help="CPU threads [default: every logical CPU]")
    add_device_args(p)
    p.add_argument("--chat-template-file", metavar="FILE", help="use this Jinja chat template")
    p.add_argument("--template-timeout", type=float, default=2.0, metavar="SECONDS",
                   help="wall-clock budget of one chat template render (docs/chat-templates.md) [default: 2]")
    p.add_argument("-np", "--parallel", type=int, default=1, metavar="N",
                   help="accepted; requests take turns on the engine for now [default: 1]")
    add_off_arg(p)
    add_signature_arg(p)
    add_sampling_args(p)
    for flags, takes_value in _IGNORED:
        kind = {"nargs": 1} if takes_value else {"action": "store_true"}
        p.add_argument(*flags, dest=f"ignored_{flags[-1].lstrip('-')}", help=argparse.SUPPRESS, **kind)
    p.add_argument("-fa", "--flash-attn", nargs="?", choices=("on", "off", "auto"), help=argparse.SUPPRESS)
    for flags, what in _REFUSED:
        p.add_argument(*flags, action=_Refuse, what=what, help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kinetic.frontend.chat import RenderBudget
    from kinetic.model import Model
    from kinetic.server.app import create_app
    from kinetic.server.http import bind, serve
    from kinetic.server.options import DEFAULT_PORT, OLLAMA_PORT, ServerOptions
    from kinetic.server.security import is_loopback

    spec = args.model_flag or args.model
    if not spec:
        raise KineticError("no model given", "Usage: kinetic serve MODEL; see `kinetic serve --help`.")
    for flag, value in (("-c", args.ctx_size), ("-t", args.threads), ("--parallel", args.parallel)):
        if value is not None and value <= 0:
            raise KineticError(f"{flag} must be positive, not {value}", "See `kinetic serve --help`.")
    port = args.port if args.port is not None else (OLLAMA_PORT if args.ollama else DEFAULT_PORT)
    if not 0 <= port <= 65535:
        raise KineticError(f"--port must be from 0 to 65535, not {port}", "Example: --port 8080")
    if not 0 < args.template_timeout < float("inf"):
        raise KineticError(f"--template-timeout must be a positive number of seconds, not {args.template_timeout}",
                           "Example: --template-timeout 2")
    budget = RenderBudget(timeout_s=args.template_timeout)
    changes = sampling_changes(args)
    off = parse_off(args.off)
    logging.basicConfig(level=logging.WARNING, format="kinetic: %(message)s")
    if not is_loopback(args.host):
        sys.stderr.write(f"kinetic: listening on {args.host} lets anyone who can reach this address use the model"
                         + ("" if args.api_key else "; pair it with --api-key") + "\n")
    sock = bind(args.host, port)
    args.device = resolve_device(device_choice(args))  # auto: the device it picks (lines say why others were skipped)
    model = Model(spec, n_ctx=args.ctx_size, chat_template_file=args.chat_template_file, device=args.device,
                  threads=args.threads, draft="rad1" not in off, gpu_layers=args.gpu_layers, template_budget=budget,
                  require_signature=args.require_signature)
    options = ServerOptions(alias=args.alias, host=args.host, port=sock.getsockname()[1], api_key=args.api_key,
                            parallel=args.parallel, sampling=replace(model.sampling_defaults(), **changes),
                            device_name=DEVICE_NAMES[args.device])
    app = create_app(model, options)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"Serving {app.state.kinetic.name} on {options.device_name} at http://{host}:{options.port}/v1", flush=True)
    serve(app, options, sock)
    return 0


