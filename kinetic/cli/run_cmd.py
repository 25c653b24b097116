"""`kinetic run MODEL [PROMPT]`: one answer, streamed to stdout, with a status line on stderr.

The prompt goes through the model's chat template as one user message (after --system); --raw
continues the prompt as it is; --prompt-ids takes token ids. Without a prompt, stdin is read.
Sampling flags beyond --temp and --seed arrive with the sampler chain (issue 6).
"""

from __future__ import annotations

import argparse
import sys

from kinetic.errors import KineticError


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="answer one prompt", description="Answer one prompt with a model.")
    p.add_argument("model", nargs="?", help="a .gguf file or a downloaded model's name")
    p.add_argument("prompt", nargs="?", help="the prompt (default: read stdin)")
    p.add_argument("-m", "--model", dest="model_flag", metavar="MODEL", help="the model, as llama.cpp takes it")
    p.add_argument("-p", "--prompt", dest="prompt_flag", metavar="TEXT", help="the prompt, as llama.cpp takes it")
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("--raw", action="store_true", help="continue the prompt as it is, without the chat template")
    p.add_argument("--prompt-ids", metavar="IDS", help="comma-separated token ids to continue (implies --raw)")
    p.add_argument("-n", "--n-predict", type=int, default=-1, metavar="N",
                   help="most tokens in the answer; -1 or 0 for no limit [default: no limit]")
    p.add_argument("--temp", type=float, default=0.0, metavar="T",
                   help="temperature; 0 always picks the likeliest token [default: 0]")
    p.add_argument("-s", "--seed", type=int, metavar="N", help="seed for repeatable sampling")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N", help="context size in tokens")
    p.add_argument("--chat-template-file", metavar="FILE", help="use this Jinja chat template")
    p.add_argument("-t", "--threads", type=int, metavar="N", help="CPU threads [default: every logical CPU]")
    p.add_argument("--device", choices=("cpu", "reference"), default="cpu",
                   help="cpu: generated kernels; reference: the numpy reference interpreter [default: cpu]")
    p.set_defaults(run=run, collect_words=_collect_words)


def _collect_words(args: argparse.Namespace, words: list[str]) -> None:
    """Words argparse could not place (given after options) continue the positionals in order."""
    for word in words:
        if args.model is None:
            args.model = word
        elif args.prompt is None:
            args.prompt = word
        else:
            args.prompt += " " + word


def run(args: argparse.Namespace) -> int:
    from kinetic.model import Model

    spec = args.model_flag or args.model
    prompt = args.prompt_flag if args.prompt_flag is not None else (args.prompt if args.model_flag is None
                                                                    else args.model)
    if args.model_flag and args.model and args.prompt is None and args.prompt_flag is None:
        prompt = args.model
    if not spec:
        raise KineticError("no model given", "Usage: kinetic run MODEL [PROMPT]; see `kinetic run --help`.")
    if args.ctx_size <= 0:
        raise KineticError(f"-c must be positive, not {args.ctx_size}", "Give a context size such as -c 4096.")
    if args.threads is not None and args.threads <= 0:
        raise KineticError(f"-t must be positive, not {args.threads}", "Give a thread count such as -t 4.")
    model = Model(spec, n_ctx=args.ctx_size, chat_template_file=args.chat_template_file, device=args.device,
                  threads=args.threads)
    if args.prompt_ids is not None:
        prompt_in = _parse_ids(args.prompt_ids)
    else:
        text = prompt if prompt is not None else sys.stdin.read()
        if args.raw:
            prompt_in = text
        else:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            messages.append({"role": "user", "content": text})
            prompt_in = model.apply_chat_template(messages, add_generation_prompt=True)
    max_tokens = None if args.n_predict <= 0 else args.n_predict
    for piece in model.generate(prompt_in, max_tokens=max_tokens, temperature=args.temp, seed=args.seed,
                                stream=True):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    s = model.last_stats
    answer_speed = s.generated_tokens / s.generate_seconds if s.generate_seconds else 0.0
    prompt_speed = s.prompt_tokens / s.prompt_seconds if s.prompt_seconds else 0.0
    sys.stderr.write(f"[{s.generated_tokens} tokens at {answer_speed:.1f} tok/s; prompt {s.prompt_tokens} "
                     f"tokens at {prompt_speed:.1f} tok/s on {_DEVICE_NAMES[args.device]}]\n")
    return 0


_DEVICE_NAMES = {"cpu": "the CPU", "reference": "the CPU (reference interpreter)"}


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise KineticError(f"--prompt-ids takes integers separated by commas, not {text!r}",
                           "Example: --prompt-ids 504,3575,282") from None
