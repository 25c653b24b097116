"""`kinetic serve MODEL`: the OpenAI, llama-server and Ollama APIs over HTTP (docs/server.md).

Prints one line once it listens, `Serving NAME on the CPU at http://127.0.0.1:8080/v1`, and runs
until Ctrl+C. llama-server's command line works: llama.cpp's flags are read from the one table
(llama_flags.py) that run, chat and bench read too.
The sampler flags set the server's default sampling (over the model file's recommendations).
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace

from kinetic.cli.llama_flags import SERVE, add_llama_flags
from kinetic.cli.rope_options import add_rope_arguments
from kinetic.cli.runtime_options import (
    add_context_arg,
    add_device_args,
    add_lora_args,
    add_numerics_arg,
    add_off_arg,
    add_signature_arg,
    add_template_arg,
    check_runtime_args,
    load_model,
)
from kinetic.cli.sampling_options import add_sampling_args, sampling_changes
from kinetic.devices import DEVICE_NAMES
from kinetic.errors import KineticError
from kinetic.runtime.scheduler import DEFAULT_SLOTS


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
    from kinetic.server.options import add_server_args

    add_server_args(p)  # --allowed-origins, --sign-key (kinetic/server/options.py)
    add_context_arg(p)
    p.add_argument("-t", "--threads", type=int, metavar="N", help="CPU threads [default: every logical CPU]")
    add_device_args(p)
    add_template_arg(p)
    p.add_argument("--template-timeout", type=float, default=2.0, metavar="SECONDS",
                   help="wall-clock budget of one chat template render (docs/chat-templates.md) [default: 2]")
    p.add_argument("-np", "--parallel", type=int, metavar="N",
                   help="slots: requests answered at once, sharing each pass, each answer what it is alone "
                        f"(docs/server.md) [default: {DEFAULT_SLOTS}, fewer if their caches do not fit in memory]")
    p.add_argument("--max-queue", type=int, default=32, metavar="N",
                   help="requests that may wait for a slot; beyond, 503 with Retry-After (as Ollama's "
                        "OLLAMA_MAX_QUEUE; llama-server has no bound) [default: 32]")
    p.add_argument("--replicas", type=int, metavar="N",
                   help="N engines on Ray Serve behind one endpoint, each conversation routed back to its "
                        "replica; -t is then each replica's threads [default: the cores split between them] "
                        "(pip install 'kinetic-engine[scale]'; docs/scale-out.md)")
    add_off_arg(p)
    add_lora_args(p)
    add_signature_arg(p)
    p.add_argument("--embedding", "--embeddings", action="store_true",
                   help="serve embeddings only (an embedding model serves them anyway; docs/embeddings.md)")
    p.add_argument("--pooling", choices=("none", "mean", "cls", "last", "rank"),
                   help="an embedding model's pooling in place of the file's")
    p.add_argument("--reranking", "--rerank", action="store_true",
                   help="serve /rerank with the model's classification head (pooling rank)")
    add_sampling_args(p)
    add_rope_arguments(p)  # llama.cpp's --rope-* / --yarn-* (rope_options.py); load_model applies them
    add_numerics_arg(p)  # --numerics (runtime_options.py); load_model applies it
    add_llama_flags(p, SERVE)
    p.set_defaults(run=run)


def embedding_options(args: argparse.Namespace) -> dict:
    """--pooling, and --reranking's pooling rank, for the Model (docs/embeddings.md)."""
    if args.reranking and args.pooling not in (None, "rank"):
        raise KineticError(f"--reranking ranks with pooling rank, not --pooling {args.pooling}",
                           "Leave --pooling out with --reranking.")
    pooling = "rank" if args.reranking else args.pooling
    return {} if pooling is None else {"pooling": pooling}


def check_embedding_model(args: argparse.Namespace, model) -> None:
    """--embedding, --pooling and --reranking need an embedding model (its file names a pooling)."""
    from kinetic.runtime.embedding import is_embedding_graph

    flags = (("--reranking", args.reranking), ("--embedding", args.embedding), ("--pooling", args.pooling))
    flag = next((name for name, given in flags if given), None)
    if flag and not is_embedding_graph(model.graph):
        raise KineticError(f"{flag} needs an embedding model; {model.path.name} is a text model",
                           "Serve an embedding model (bert, nomic-bert, or a decoder file with a pooling type); "
                           "see docs/embeddings.md.")


def run(args: argparse.Namespace) -> int:
    if args.replicas is not None:
        from kinetic.scaleout.launch import serve_replicas  # Ray Serve: an optional extra (docs/scale-out.md)

        return serve_replicas(args)
    app, options, sock = build_server(args)
    from kinetic.server.http import serve

    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"Serving {app.state.kinetic.name} on {options.device_name} at http://{host}:{options.port}/v1", flush=True)
    serve(app, options, sock)
    return 0


def build_server(args: argparse.Namespace):
    """(app, options, socket): the flags checked, the socket bound, the model loaded, the app built;
    `kinetic serve` serves it, and so does each replica of a scaled-out one (kinetic/scaleout)."""
    from kinetic.frontend.chat import RenderBudget
    from kinetic.server.app import create_app
    from kinetic.server.http import bind
    from kinetic.server.options import DEFAULT_PORT, OLLAMA_PORT, ServerOptions, server_settings
    from kinetic.server.security import is_loopback

    spec = args.model_flag or args.model
    if not spec:
        raise KineticError("no model given", "Usage: kinetic serve MODEL; see `kinetic serve --help`.")
    check_runtime_args(args)
    for flag, value in (("-t", args.threads), ("--parallel", args.parallel)):
        if value is not None and value <= 0:
            raise KineticError(f"{flag} must be positive, not {value}", "See `kinetic serve --help`.")
    if args.max_queue < 0:
        raise KineticError(f"--max-queue must be 0 or more, not {args.max_queue}", "Example: --max-queue 32")
    port = args.port if args.port is not None else (OLLAMA_PORT if args.ollama else DEFAULT_PORT)
    if not 0 <= port <= 65535:
        raise KineticError(f"--port must be from 0 to 65535, not {port}", "Example: --port 8080")
    if not 0 < args.template_timeout < float("inf"):
        raise KineticError(f"--template-timeout must be a positive number of seconds, not {args.template_timeout}",
                           "Example: --template-timeout 2")
    budget = RenderBudget(timeout_s=args.template_timeout)
    changes = sampling_changes(args)
    logging.basicConfig(level=logging.WARNING, format="kinetic: %(message)s")
    if not is_loopback(args.host):
        sys.stderr.write(f"kinetic: listening on {args.host} lets anyone who can reach this address use the model"
                         + ("" if args.api_key else "; pair it with --api-key") + "\n")
    sock = bind(args.host, port)
    model = load_model(args, spec, template_budget=budget, **embedding_options(args))  # sets args.device
    check_embedding_model(args, model)
    options = ServerOptions(alias=args.alias, host=args.host, port=sock.getsockname()[1], api_key=args.api_key,
                            parallel=args.parallel, max_queued=args.max_queue,
                            sampling=replace(model.sampling_defaults(), **changes),
                            device_name=DEVICE_NAMES[args.device], **server_settings(args))
    return create_app(model, options), options, sock


