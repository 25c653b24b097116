"""`kinetic bench MODEL`: llama-bench's pp512 and tg128 and the edit256 test on Kinetic; --compare:
llama.cpp, and ik_llama.cpp when its llama-bench is found.

The measuring, the table, the JSON and the card live in kinetic.bench*; this module reads the command
line, checks it before anything slow starts, and prints. With --compare the engines take turns, one
at a time (none slows another), -r rounds of: Kinetic's pp and tg runs, llama.cpp's llama-bench
-r 1, ik_llama.cpp's llama-bench -r 1; then Kinetic's edit test and llama.cpp's through llama-server.
"""

from __future__ import annotations

import argparse
import json

from kinetic.cli.llama_flags import BENCH, add_llama_flags
from kinetic.cli.runtime_options import add_device_args, add_numerics_arg, choose_device
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
        "speculative decoding (--llama-spec), and prints a card with both; ik_llama.cpp's llama-bench too when "
        "it is found (--compare-ik), its rounds taking turns with the others'. The table's last line gives "
        "decode's bandwidth: bytes read per token times tokens per second against the machine's measured "
        "read bandwidth.",
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
    add_numerics_arg(p)
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
        "--compare-ik",
        default=None,
        metavar="IK_LLAMA_BENCH",
        help="with --compare: ik_llama.cpp's llama-bench (a file or its folder) [default: $KINETIC_IK_LLAMA_BENCH, "
        "else ~/.cache/kinetic-ref/ik_llama.cpp/build/bin/llama-bench; left out with a line when not found]",
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
    from kinetic import bench, bench_llama, bench_report

    args.model = args.model_flag or args.model
    _check(args)
    args.device = choose_device(args)
    off = bench.parse_off(args.off)
    if args.compare is None:
        result = bench.run_bench(
            args.model, threads=args.threads, repetitions=args.repetitions, device=args.device, off=off,
            n_prompt=args.n_prompt, n_gen=args.n_gen, n_edit=args.edit_tokens, numerics=args.numerics,
        )
        print(json.dumps(bench_report.to_json(result), indent=2) if args.json else bench_report.table(result))
        return _exit_code(result)
    exe = bench_llama.find_llama_bench(args.compare)
    ik = bench_llama.find_ik_llama_bench(args.compare_ik)
    return _compare(args, off, exe, ik)


def _compare(args: argparse.Namespace, off: list[str], exe, ik) -> int:
    """Kinetic, llama.cpp and ik_llama.cpp (when found) taking turns, -r rounds; then the edit tests."""
    from kinetic import bench, bench_card, bench_llama, bench_llama_edit, bench_report

    session = bench.BenchSession(
        args.model, threads=args.threads, repetitions=args.repetitions, device=args.device, off=off,
        n_prompt=args.n_prompt, n_gen=args.n_gen, n_edit=args.edit_tokens, numerics=args.numerics,
    )
    gpu = DEVICES[session.result.device].gpu  # llama.cpp on the same device: every layer on its GPU
    engines = [(exe, bench_llama.LLAMA_CPP)] + ([(ik, bench_llama.IK_LLAMA_CPP)] if ik else [])
    rounds: dict[str, list] = {name: [] for _, name in engines}
    llama_bench_tests = args.n_prompt > 0 or args.n_gen > 0  # -p 0 -n 0: the edit test alone
    for _ in range(args.repetitions):
        session.time_round()
        for program, name in engines if llama_bench_tests else []:
            rounds[name].append(bench_llama.run_llama_bench(
                program, session.result.path, threads=session.result.threads, repetitions=1,
                n_prompt=args.n_prompt, n_gen=args.n_gen, gpu=gpu, engine=name,
            ))
    result = session.finish()
    theirs = bench_llama.merge_rounds(rounds[bench_llama.LLAMA_CPP])
    fast = bench_llama.merge_rounds(rounds[bench_llama.IK_LLAMA_CPP], bench_llama.IK_LLAMA_CPP) if ik else None
    if not args.json:
        print(bench_report.table(result) + "\n", flush=True)
    edit = None
    if result.edit is not None:  # llama.cpp's edit test, one llama-server at a time, after llama-bench
        edit = bench_llama_edit.run_llama_edit(
            bench_llama.find_llama_server(exe), result.path, threads=result.threads, repetitions=args.repetitions,
            n_edit=args.edit_tokens, spec_type=args.llama_spec, gpu=gpu,
        )
    if args.json:
        print(json.dumps(bench_card.card_json(result, theirs, edit, fast), indent=2))
    else:
        print(bench_card.card(result, theirs, edit, fast))
    return _exit_code(result)


def _exit_code(result) -> int:
    return 1 if result.edit and not result.edit.identical else 0  # drafting changed the answer: a bug


def _check(args: argparse.Namespace) -> None:
    if not args.model:
        raise KineticError("no model given", "Usage: kinetic bench MODEL; see `kinetic bench --help`.")
    if args.threads is not None and args.threads < 1:
        raise KineticError(f"-t must be at least 1, not {args.threads}", "Give a thread count such as -t 4.")
    if args.repetitions < 1:
        raise KineticError(f"-r must be at least 1, not {args.repetitions}", "Give a number of runs such as -r 3.")
    if args.compare_ik is not None and args.compare is None:
        raise KineticError("--compare-ik names ik_llama.cpp's llama-bench for --compare", "Add --compare.")
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
