"""`kinetic run MODEL [PROMPT]`: one answer, streamed to stdout, with a status line on stderr.

The prompt goes through the model's chat template as one user message (after --system); --raw
continues the prompt as it is; --prompt-ids takes token ids. Without a prompt, stdin is read; when
stdin is a terminal, run becomes `kinetic chat` (llama-cli's behaviour). The options are shared:
sampler flags (sampling_options.py), runtime options with their defaults (runtime_options.py) and
llama.cpp's spellings (llama_flags.py). Receipts: `write_answer_receipt`, which chat's /receipt uses too.
"""

from __future__ import annotations

import argparse
import sys

from kinetic.cli.llama_flags import RUN, add_llama_flags
from kinetic.cli.runtime_options import add_runtime_args, check_runtime_args, load_model
from kinetic.cli.sampling_options import add_sampling_args, apply_sampling, sampling_changes
from kinetic.devices import DEVICE_NAMES
from kinetic.errors import KineticError

REASONING = ("on", "off", "auto")


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="answer one prompt", description="Answer one prompt with a model.")
    p.add_argument("model", nargs="?", help="a .gguf file or a downloaded model's name")
    p.add_argument("prompt", nargs="?", help="the prompt (default: read stdin; a terminal on stdin opens a chat)")
    p.add_argument("-m", "--model", dest="model_flag", metavar="MODEL", help="the model, as llama.cpp takes it")
    p.add_argument("-p", "--prompt", dest="prompt_flag", metavar="TEXT", help="the prompt, as llama.cpp takes it")
    add_generation_args(p, reasoning_default="auto")
    p.add_argument("--raw", action="store_true", help="continue the prompt as it is, without the chat template")
    p.add_argument("--prompt-ids", metavar="IDS", help="comma-separated token ids to continue (implies --raw)")
    add_runtime_args(p)
    p.add_argument("--receipt", metavar="FILE", help="also write a receipt of the answer to FILE (docs/receipts.md); "
                   "never over an existing file or an input of the command")
    p.add_argument("--force", action="store_true", help="replace the --receipt FILE when it exists")
    p.add_argument("--sign-key", metavar="FILE", help="sign the receipt with this Ed25519 secret key file")
    add_llama_flags(p, RUN)
    p.set_defaults(run=run, collect_words=_collect_words)


def add_generation_args(p: argparse.ArgumentParser, *, reasoning_default: str) -> None:
    """The options of every command that answers prompts: --system, -n, --reasoning, the sampler flags."""
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("-n", "--n-predict", type=int, default=-1, metavar="N",
                   help="most tokens per answer; -1 or 0 for no limit [default: no limit]")
    p.add_argument("--reasoning", choices=REASONING, default=reasoning_default,
                   help="the model's reasoning (its template's enable_thinking), as llama.cpp's -rea; auto leaves "
                        f"the template's own choice [default: {reasoning_default}]")
    add_sampling_args(p)


def template_kwargs(reasoning: str) -> dict:
    """--reasoning as chat template variables: on/off set enable_thinking, auto leaves it unset."""
    return {} if reasoning == "auto" else {"enable_thinking": reasoning == "on"}


def _collect_words(args: argparse.Namespace, words: list[str]) -> None:
    """Words argparse could not place (given after options) continue the positionals in order."""
    for word in words:
        if args.model is None:
            args.model = word
        elif args.prompt is None:
            args.prompt = word
        else:
            args.prompt += " " + word


def _model_and_prompt(args: argparse.Namespace) -> tuple[str, str | None]:
    spec = args.model_flag or args.model
    prompt = args.prompt_flag if args.prompt_flag is not None else (args.prompt if args.model_flag is None
                                                                    else args.model)
    if args.model_flag and args.model and args.prompt is None and args.prompt_flag is None:
        prompt = args.model
    if not spec:
        raise KineticError("no model given", "Usage: kinetic run MODEL [PROMPT]; see `kinetic run --help`.")
    return spec, prompt


def run(args: argparse.Namespace) -> int:
    spec, prompt = _model_and_prompt(args)
    if prompt is None and args.prompt_ids is None and not args.raw and not args.receipt and _stdin_is_terminal():
        from kinetic.cli import chat_cmd  # llama-cli without a prompt: a conversation

        args.model, args.model_flag = spec, None
        return chat_cmd.run(args)
    check_runtime_args(args)
    changes = sampling_changes(args)
    key = receipt_key(args.sign_key, args.receipt)
    _check_receipt_path(args, spec)  # before any work: a refused path costs nothing
    model = load_model(args, spec)
    if args.prompt_ids is not None:
        prompt_in, given = _parse_ids(args.prompt_ids), None  # the receipt's input: None for ids
    else:
        text = prompt if prompt is not None else sys.stdin.read()
        if args.raw:
            prompt_in = given = text
        else:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            messages.append({"role": "user", "content": text})
            prompt_in = model.apply_chat_template(messages, add_generation_prompt=True,
                                                  **template_kwargs(args.reasoning))
            given = messages
    if args.receipt:  # the receipt records the very ids the model is given
        prompt_in = prompt_in if isinstance(prompt_in, list) else model.tokenize(prompt_in, parse_special=True)
    max_tokens = None if args.n_predict <= 0 else args.n_predict
    sampling = apply_sampling(model.sampling_defaults(), changes)
    answer = []
    for piece in model.generate(prompt_in, max_tokens=max_tokens, sampling=sampling, stream=True):
        answer.append(piece)
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    s = model.last_stats
    sys.stderr.write(status_line(s.generated_tokens, s.generate_seconds, s.prompt_tokens, s.prompt_seconds,
                                 args, cached=s.cached_tokens, drafts=s.draft_sources) + "\n")
    if args.receipt:
        from kinetic.receipts import Answer

        record = Answer(model_path=model.path, device=args.device, n_ctx=model.n_ctx, input=given,
                        prompt_ids=prompt_in, sampling=s.sampling, max_tokens=max_tokens, finish=s.stop_reason,
                        text="".join(answer), output_ids=list(s.tokens), options=model.options,
                        adapters=tuple(model.adapters))
        write_answer_receipt(record, args.receipt, force=args.force, key=key,
                             inputs=receipt_inputs(args, model.path))
    return 0


def status_line(generated: int, generate_seconds: float, prompt: int, prompt_seconds: float,
                args: argparse.Namespace, *, cached: int = 0, drafts: dict | None = None) -> str:
    """`[45 tokens at 25.5 tok/s; prompt 37 tokens at 62.8 tok/s on the CPU; context 8192 (the model's)]`;
    with `cached` prompt tokens restored by Warm Start, `prompt 37 tokens at 62.8 tok/s, 512 cached`;
    when RAD-1 drafted (`drafts`: drafter -> (guessed, kept)), `; drafts kept 61% (context 70%, mtp 12%)`."""
    answer_speed = generated / generate_seconds if generate_seconds else 0.0
    ran = prompt - cached
    prompt_speed = ran / prompt_seconds if prompt_seconds else 0.0
    reused = f", {cached} cached" if cached else ""
    return (f"[{generated} tokens at {answer_speed:.1f} tok/s; prompt {ran} tokens at {prompt_speed:.1f} tok/s"
            f"{reused} on {DEVICE_NAMES[args.device]}; context {args.context.tokens} ({args.context.why})"
            f"{drafts_kept(drafts or {})}]")


def drafts_kept(drafts: dict) -> str:
    """`; drafts kept 61% (context 70%, mtp 12%)`: the share of RAD-1's guessed tokens kept, in all and
    per drafter (drafter -> (guessed, kept)), most guesses first; "" when nothing was drafted."""
    guessed = sum(g for g, _ in drafts.values())
    if not guessed:
        return ""
    kept = sum(k for _, k in drafts.values())
    ranked = sorted(((g, k, name) for name, (g, k) in drafts.items() if g), key=lambda item: -item[0])
    each = ", ".join(f"{name} {100 * k / g:.0f}%" for g, k, name in ranked)
    return f"; drafts kept {100 * kept / guessed:.0f}% ({each})"


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


# -- receipts (run --receipt, chat's /receipt) -------------------------------------------------------

def receipt_key(sign_key: str | None, receipt: str | None):
    """The signing key (read before the model loads, so a bad key file fails at once), or None."""
    if sign_key is None:
        return None
    if not receipt:
        raise KineticError("--sign-key signs a receipt, and no --receipt FILE was given",
                           "Add --receipt FILE, or leave out --sign-key.")
    from kinetic.ktc.keys import read_signing_key

    return read_signing_key(sign_key)


def receipt_inputs(args: argparse.Namespace, model_path) -> dict:
    """The command's input files, which a receipt is never written over (kinetic.outputs)."""
    return {"the model file": model_path, "the --sign-key file": args.sign_key,
            "the --chat-template-file": args.chat_template_file}


def _check_receipt_path(args: argparse.Namespace, spec: str) -> None:
    if not args.receipt:
        if args.force:
            raise KineticError("--force replaces an existing --receipt FILE, and no --receipt was given",
                               "Add --receipt FILE, or leave out --force.")
        return
    from kinetic.hub import resolve_model
    from kinetic.outputs import check_output

    check_output(args.receipt, inputs=receipt_inputs(args, resolve_model(spec)), force=args.force)


def write_answer_receipt(answer, path: str, *, force: bool, key, inputs: dict) -> None:
    """Write the receipt of `answer` (a kinetic.receipts.Answer) to `path`, signed with `key` if any."""
    from kinetic.receipts import make_receipt, write_receipt

    write_receipt(make_receipt(answer, key), path, force=force, inputs=inputs)
    sys.stderr.write(f"receipt written to {path} (seed {answer.sampling.seed}{', signed' if key else ''})\n")


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise KineticError(f"--prompt-ids takes integers separated by commas, not {text!r}",
                           "Example: --prompt-ids 504,3575,282") from None
