"""`kinetic bench MODEL`: llama-bench's pp512 and tg128 and the edit256 test on Kinetic; --compare: llama.cpp.

The measuring, the table, the JSON and the card live in kinetic.bench; this module reads the command
line, checks it before anything slow starts, and prints. Kinetic runs first, then llama-bench, then
llama.cpp's edit test through llama-server (never two at once, so none slows another).
"""

from __future__ import annotations

import argparse
import json

from kinetic.cli.llama_flags import BENCH, add_llama_flags
from kinetic.cli.runtime_options import add_device_args, choose_device
from kinetic.devices import DEVICES
from kinetic.errors import KineticError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="measure prompt and generation speed, as llama-bench does",
        description="Time a 512-token prompt (pp512), 128 generated tokens (tg128) and edit256 (a greedy chat "
        "answer of up to 256 tokens that sends back a short Python file with a variable renamed, with RAD-1 "
        "drafting, checked against plain decoding), each the best of -r runs, and print a table like "
        "llama-bench's with load time and peak memory. --compare also runs "
        "llama.cpp's llama-bench on the same file, then the edit request through llama-server with its "
        "speculative decoding (--llama-spec), and prints a card with both.",
    )
    p.add_argument("model", nargs="?", help="a .gguf or .ktc file or a downloaded model's name")
    p.add_argument("-m", "--model", dest="model_flag", metavar="MODEL", help="the model, as llama-bench takes it")
    p.add_argument(
        "-t",
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads [default: a .ktc file's tuned profile's, else all logical CPUs]",
    )
    p.add_argument(
        "-r",
        "--repetitions",
        type=int,
        default=3,
        metavar="N",
        help="runs of each test; the best is reported [default: 3]",
    )
    p.add_argument(
        "-p",
        "--n-prompt",
        type=int,
        default=512,
        metavar="N",
        help="prompt tokens of the pp test; 0 skips it [default: 512]",
    )
    p.add_argument(
        "-n",
        "--n-gen",
        type=int,
        default=128,
        metavar="N",
        help="generated tokens of the tg test; 0 skips it [default: 128]",
    )
    add_device_args(p)
    p.add_argument(
        "--off",
        metavar="LIST",
        help="speed technologies to turn off, comma-separated: rad1 (edit256 runs without drafting), shortlist, "
        "torque, warm-start",
    )
    p.add_argument(
        "--compare",
        nargs="?",
        const="",
        default=None,
        metavar="LLAMA_BENCH",
        help="also run llama.cpp's llama-bench (this path, else PATH and the usual folders) and print a card with both",
    )
    p.add_argument(
        "--llama-spec",
        default="ngram-mod",
        metavar="TYPE",
        help="with --compare: llama-server's --spec-type for llama.cpp's edit test, e.g. ngram-simple "
        "[default: ngram-mod]",
    )
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--edit-tokens", type=int, default=256, metavar="N", help=argparse.SUPPRESS)  # tests: a short edit
    add_llama_flags(p, BENCH)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kinetic import bench, bench_card, bench_llama, bench_llama_edit, bench_report

    args.model = args.model_flag or args.model
    _check(args)
    args.device = choose_device(args)
    off = bench.parse_off(args.off)
    exe = bench_llama.find_llama_bench(args.compare) if args.compare is not None else None
    result = bench.run_bench(
        args.model,
        threads=args.threads,
        repetitions=args.repetitions,
        device=args.device,
        off=off,
        n_prompt=args.n_prompt,
        n_gen=args.n_gen,
        n_edit=args.edit_tokens,
    )
    code = 1 if result.edit and not result.edit.identical else 0  # drafting changed the answer: a bug
    if exe is None:
        print(json.dumps(bench_report.to_json(result), indent=2) if args.json else bench_report.table(result))
        return code
    if not args.json:
        print(bench_report.table(result) + "\n", flush=True)
    gpu = DEVICES[result.device].gpu  # llama.cpp on the same device: every layer on its GPU
    theirs = bench_llama.run_llama_bench(exe, result.path, threads=result.threads, repetitions=args.repetitions,
                                         n_prompt=args.n_prompt, n_gen=args.n_gen, gpu=gpu)
    edit = None
    if result.edit is not None:  # llama.cpp's edit test, one llama-server at a time, after llama-bench
        edit = bench_llama_edit.run_llama_edit(
            bench_llama.find_llama_server(exe),
            result.path,
            threads=result.threads,
            repetitions=args.repetitions,
            n_edit=args.edit_tokens,
            spec_type=args.llama_spec,
            gpu=gpu,
        )
    print(
        json.dumps(bench_card.card_json(result, theirs, edit), indent=2)
        if args.json
        else bench_card.card(result, theirs, edit)
    )
    return code


def _check(args: argparse.Namespace) -> None:
    if not args.model:
        raise KineticError("no model given", "Usage: kinetic bench MODEL; see `kinetic bench --help`.")
    if args.threads is not None and args.threads < 1:
        raise KineticError(f"-t must be at least 1, not {args.threads}", "Give a thread count such as -t 4.")
    if args.repetitions < 1:
        raise KineticError(f"-r must be at least 1, not {args.repetitions}", "Give a number of runs such as -r 3.")
    if args.compare is not None and args.model.lower().endswith(".ktc"):
        raise KineticError(
            "--compare runs llama-bench, which reads .gguf files, not .ktc files",
            "Compare on the .gguf file the .ktc was compiled from.",
        )
    counts = (args.n_prompt, args.n_gen, args.edit_tokens)
    if min(counts) < 0 or sum(counts) == 0:
        raise KineticError(
            f"-p {args.n_prompt} -n {args.n_gen} --edit-tokens {args.edit_tokens} measures nothing",
            "Give -p and -n as token counts of 0 or more, not both 0 (defaults: -p 512 -n 128).",
        )
