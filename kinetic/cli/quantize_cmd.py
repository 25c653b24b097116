"""`kinetic quantize IN OUT TYPE [NTHREADS]`: a GGUF model written in another quantization, byte for
byte the file llama-quantize writes (without an importance matrix).

Reads F32, F16, BF16 or Q8_0 weights (llama-quantize needs --allow-requantize for Q8_0; here it is
accepted and changes nothing). Progress on stderr when it is a terminal. OUT is never written over
without --force, never over IN, and appears only once complete (kinetic/outputs.py). The work is
kinetic/quantize/run.py.
"""

from __future__ import annotations

import argparse
import sys
import time

from tqdm.auto import tqdm

from kinetic.errors import KineticError
from kinetic.limits import check_threads
from kinetic.outputs import check_output
from kinetic.quantize import mixtures
from kinetic.quantize import run as quantize_run

TYPES_HELP = ", ".join(mixtures.TARGETS)


def add_parser(sub) -> None:
    p = sub.add_parser("quantize", help="write a model in another quantization, as llama-quantize does",
                       description="Quantize a GGUF model (F32, F16, BF16 or Q8_0 weights) to TYPE; the output is "
                                   "byte for byte llama-quantize's.")
    p.add_argument("input", metavar="IN", help="the .gguf file to read")
    p.add_argument("output", metavar="OUT", help="the .gguf file to write")
    p.add_argument("type", metavar="TYPE", help=f"the quantization: {TYPES_HELP}")
    p.add_argument("nthreads", nargs="?", type=int, metavar="NTHREADS", help="threads, as llama-quantize takes them")
    p.add_argument("-t", "--threads", type=int, metavar="N", help="threads [default: every CPU]")
    p.add_argument("--force", action="store_true", help="replace OUT when it exists")
    p.add_argument("--allow-requantize", action="store_true",
                   help="accepted for llama-quantize's command lines; Q8_0 input is always allowed")
    p.add_argument("--imatrix", metavar="FILE", help="not supported yet (refused)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.imatrix is not None:
        raise KineticError("--imatrix is not supported yet: kinetic quantize writes llama-quantize's output "
                           "without an importance matrix",
                           "Leave --imatrix out, or use llama-quantize for importance-matrix quantization.")
    threads = check_threads(args.threads if args.threads is not None else args.nthreads)
    check_output(args.output, inputs=quantize_run.input_labels(args.input), force=args.force)
    the_plan = quantize_run.plan(args.input, args.type)  # refuses a bad input or type before any work
    total = sum(job.source.n_elements for job in the_plan.jobs)
    start = time.perf_counter()
    with tqdm(total=total, unit="w", unit_scale=True, desc=f"quantize {the_plan.target.name}",
              file=sys.stderr, disable=None, leave=False) as bar:
        quantize_run.quantize_file(args.input, args.output, args.type, threads=threads, force=args.force,
                                   progress=bar.update, prepared=the_plan)
    seconds = time.perf_counter() - start
    sys.stderr.write(f"kinetic quantize: wrote {args.output} ({the_plan.target.name}, "
                     f"{the_plan.size / 2**20:.1f} MiB) in {seconds:.1f} s\n")
    return 0
