"""`kinetic run MODEL [PROMPT]`: one answer, streamed to stdout, with a status line on stderr.

The prompt goes through the model's chat template as one user message (after --system); --raw
continues the prompt as it is; --prompt-ids takes token ids. Without a prompt, stdin is read.
The sampler flags carry llama.cpp's names; unset ones come from the model file's general.sampling.*
keys, then llama.cpp's defaults (docs/sampling.md).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace

from kinetic.devices import DEVICE_NAMES, device_choices, device_help, resolve_device
from kinetic.errors import KineticError
from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.sampling.settings import SettingError


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
    add_sampling_args(p)
    p.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N", help="context size in tokens")
    p.add_argument("--chat-template-file", metavar="FILE", help="use this Jinja chat template")
    p.add_argument("-t", "--threads", type=int, metavar="N", help="CPU threads [default: every logical CPU]")
    add_device_args(p)
    add_off_arg(p)
    add_signature_arg(p)
    p.add_argument("--receipt", metavar="FILE", help="also write a receipt of the answer to FILE (docs/receipts.md); "
                   "never over an existing file or an input of the command")
    p.add_argument("--force", action="store_true", help="replace the --receipt FILE when it exists")
    p.add_argument("--sign-key", metavar="FILE", help="sign the receipt with this Ed25519 secret key file")
    p.set_defaults(run=run, collect_words=_collect_words)


def add_signature_arg(p: argparse.ArgumentParser) -> None:
    """--require-signature KEY, for every command that loads a model to run it (docs/security.md)."""
    p.add_argument("--require-signature", metavar="PUBLIC_KEY",
                   help="run only a .ktc file signed by this Ed25519 public key (64 hex digits, or a file holding "
                        "them); GGUF files cannot be signed and are refused [default: $KINETIC_REQUIRE_SIGNATURE]")


def add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=device_choices(),
                   help=f"{device_help()} [default: cpu, or cuda with -ngl N > 0]")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=int, metavar="N",
                   help="most layers on the GPU, as llama.cpp's -ngl: 0 means --device cpu, any other N --device "
                        "cuda with at most N layers (the last ones) on the GPU, the rest on the CPU "
                        "[default: as many as fit]")


def device_choice(args: argparse.Namespace) -> str:
    """The device --device and -ngl ask for together (then resolved by resolve_device for auto)."""
    n = args.gpu_layers
    if n is not None and n < 0:
        raise KineticError(f"-ngl must be 0 or more, not {n}", "-ngl 99 puts every layer on the GPU; -ngl 0 none.")
    if n == 0:
        if args.device not in (None, "cpu", "auto"):
            raise KineticError(f"-ngl 0 runs on the CPU, but --device {args.device} was asked for",
                               "Drop one of the two.")
        return "cpu"
    if n is not None:
        return args.device or "cuda"
    return args.device or "cpu"


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
    changes = sampling_changes(args)
    key = _receipt_key(args)
    _check_receipt_path(args, spec)  # before any work: a refused path costs nothing
    off = parse_off(args.off)
    args.device = resolve_device(device_choice(args))  # auto: the device it picks (lines say why others were skipped)
    model = Model(spec, n_ctx=args.ctx_size, chat_template_file=args.chat_template_file, device=args.device,
                  threads=args.threads, draft="rad1" not in off, gpu_layers=args.gpu_layers,
                  require_signature=args.require_signature)
    if args.prompt_ids is not None:
        prompt_in, given = _parse_ids(args.prompt_ids), None  # the receipt's input: None for ids
    else:
        text = prompt if prompt is not None else sys.stdin.read()
        if args.raw:
            prompt_in = given = text
        else:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            messages.append({"role": "user", "content": text})
            prompt_in, given = model.apply_chat_template(messages, add_generation_prompt=True), messages
    if args.receipt:  # the receipt records the very ids the model is given
        prompt_in = prompt_in if isinstance(prompt_in, list) else model.tokenize(prompt_in, parse_special=True)
    max_tokens = None if args.n_predict <= 0 else args.n_predict
    sampling = _settings(model.sampling_defaults(), changes)
    answer = []
    for piece in model.generate(prompt_in, max_tokens=max_tokens, sampling=sampling, stream=True):
        answer.append(piece)
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    s = model.last_stats
    answer_speed = s.generated_tokens / s.generate_seconds if s.generate_seconds else 0.0
    prompt_speed = s.prompt_tokens / s.prompt_seconds if s.prompt_seconds else 0.0
    sys.stderr.write(f"[{s.generated_tokens} tokens at {answer_speed:.1f} tok/s; prompt {s.prompt_tokens} "
                     f"tokens at {prompt_speed:.1f} tok/s on {DEVICE_NAMES[args.device]}]\n")
    if args.receipt:
        _write_receipt(args, model, given, prompt_in, max_tokens, "".join(answer), key)
    return 0


def _receipt_key(args: argparse.Namespace):
    """The signing key (read before the model loads, so a bad key file fails at once), or None."""
    if args.sign_key is None:
        return None
    if not args.receipt:
        raise KineticError("--sign-key signs a receipt, and no --receipt FILE was given",
                           "Add --receipt FILE, or leave out --sign-key.")
    from kinetic.ktc.keys import read_signing_key

    return read_signing_key(args.sign_key)


def _receipt_inputs(args: argparse.Namespace, model_path) -> dict:
    """The command's input files, which the receipt is never written over (kinetic.outputs)."""
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

    check_output(args.receipt, inputs=_receipt_inputs(args, resolve_model(spec)), force=args.force)


def _write_receipt(args: argparse.Namespace, model, given, ids: list[int], max_tokens: int | None, text: str,
                   key) -> None:
    from kinetic.receipts import Answer, make_receipt, write_receipt

    s = model.last_stats
    answer = Answer(model_path=model.path, device=args.device, n_ctx=args.ctx_size, input=given, prompt_ids=ids,
                    sampling=s.sampling, max_tokens=max_tokens, finish=s.stop_reason, text=text,
                    output_ids=list(s.tokens))
    write_receipt(make_receipt(answer, key), args.receipt, force=args.force, inputs=_receipt_inputs(args, model.path))
    sys.stderr.write(f"receipt written to {args.receipt} (seed {s.sampling.seed}{', signed' if key else ''})\n")




def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise KineticError(f"--prompt-ids takes integers separated by commas, not {text!r}",
                           "Example: --prompt-ids 504,3575,282") from None


# -- sampler flags (llama.cpp's spellings, common/arg.cpp) ---------------------------------------------

# (flags, settings field, type, metavar, help)
_SAMPLING_FLAGS = (
    (("--temp", "--temperature"), "temperature", float, "T",
     "temperature; 0 always picks the likeliest token [default: the model's, else 0.8]"),
    (("--top-k",), "top_k", int, "N", "sample from the N likeliest tokens; 0 for all [default: 40]"),
    (("--top-p",), "top_p", float, "P", "sample from the likeliest tokens that add up to P; 1 for all "
                                        "[default: 0.95]"),
    (("--min-p",), "min_p", float, "P", "skip tokens less than P times as likely as the best [default: 0.05]"),
    (("--typical", "--typical-p"), "typical_p", float, "P", "locally typical sampling; 1 for none [default: 1]"),
    (("--top-nsigma", "--top-n-sigma"), "top_n_sigma", float, "N",
     "keep tokens within N standard deviations of the best logit; -1 for none [default: -1]"),
    (("--repeat-penalty",), "repeat_penalty", float, "X", "penalty for repeating recent tokens; 1 for none "
                                                          "[default: 1]"),
    (("--repeat-last-n",), "repeat_last_n", int, "N", "recent tokens the penalties look at; 0 for none, "
                                                      "-1 for the whole context [default: 64]"),
    (("--presence-penalty",), "presence_penalty", float, "X", "subtracted from the logit of a recent token "
                                                              "[default: 0]"),
    (("--frequency-penalty",), "frequency_penalty", float, "X", "subtracted once per time a recent token was "
                                                                "seen [default: 0]"),
    (("--dry-multiplier",), "dry_multiplier", float, "X", "DRY repetition penalty; 0 for none [default: 0]"),
    (("--dry-base",), "dry_base", float, "X", "DRY's base, at least 1 [default: 1.75]"),
    (("--dry-allowed-length",), "dry_allowed_length", int, "N", "repeats longer than N get DRY's penalty "
                                                                "[default: 2]"),
    (("--dry-penalty-last-n",), "dry_penalty_last_n", int, "N", "tokens DRY scans; 0 for none, -1 for the "
                                                                "whole context [default: 64]"),
    (("--xtc-probability",), "xtc_probability", float, "P", "XTC: the chance of dropping the likeliest tokens; "
                                                            "0 for none [default: 0]"),
    (("--xtc-threshold",), "xtc_threshold", float, "P", "XTC: drop every token at least this likely but the "
                                                        "least likely [default: 0.1]"),
    (("--mirostat",), "mirostat", int, "N", "Mirostat 1 or 2 in place of the other samplers; 0 for none "
                                            "[default: 0]"),
    (("--mirostat-lr",), "mirostat_eta", float, "X", "Mirostat's learning rate, eta [default: 0.1]"),
    (("--mirostat-ent",), "mirostat_tau", float, "X", "Mirostat's target entropy, tau [default: 5]"),
    (("-s", "--seed"), "seed", int, "N", "seed for repeatable sampling; -1 for a fresh one [default: fresh]"),
)


def add_off_arg(p: argparse.ArgumentParser) -> None:
    """--off LIST, as kinetic bench takes it; run and serve act on rad1 (drafting off, same tokens)."""
    p.add_argument("--off", metavar="LIST", help="speed technologies to turn off, comma-separated: rad1 "
                   "(RAD-1's drafting; the answer is the same, only slower), shortlist, torque, warm-start")


def parse_off(text: str | None) -> list[str]:
    from kinetic.bench import parse_off as parse  # the one list of names

    return parse(text)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The sampler flags, for every command that generates."""
    for flags, field, kind, metavar, text in _SAMPLING_FLAGS:
        p.add_argument(*flags, dest=f"sampling_{field}", type=kind, metavar=metavar, help=text)
    p.add_argument("--dry-sequence-breaker", dest="sampling_breakers", action="append", metavar="TEXT",
                   help="text that ends a repetition for DRY, repeatable, replacing the defaults "
                        "('\\n', ':', '\"', '*'); none for none")
    p.add_argument("-l", "--logit-bias", dest="sampling_bias", action="append", metavar="TOKEN_ID(+/-)BIAS",
                   help="add BIAS to a token's logit, such as 15043+1 or 15043-inf; repeatable")


def sampling_changes(args: argparse.Namespace) -> dict:
    """The settings the flags set (checked now, before the model loads)."""
    changes = {field: getattr(args, f"sampling_{field}") for _, field, *_ in _SAMPLING_FLAGS
               if getattr(args, f"sampling_{field}") is not None}
    if args.sampling_breakers is not None:
        breakers: list[str] = []
        for text in args.sampling_breakers:
            breakers = [] if text == "none" else [*breakers, text]
        changes["dry_sequence_breakers"] = tuple(breakers)
    if args.sampling_bias:
        changes["logit_bias"] = tuple(_parse_bias(text) for text in args.sampling_bias)
    _settings(SamplingSettings(), changes)
    return changes


_BIAS = re.compile(r"^\s*(\d+)\s*([+-])\s*(\S+)\s*$")


def _parse_bias(text: str) -> tuple[int, float]:
    match = _BIAS.match(text)
    try:
        if match is None:
            raise ValueError
        return int(match[1]), float(match[3]) * (-1.0 if match[2] == "-" else 1.0)
    except ValueError:
        raise KineticError(f"--logit-bias takes TOKEN_ID+BIAS or TOKEN_ID-BIAS, not {text!r}",
                           "Example: --logit-bias 15043+1 (likelier) or --logit-bias 15043-inf (never).") from None


def _settings(base: SamplingSettings, changes: dict) -> SamplingSettings:
    """`base` with the flags' changes, checked by the settings' one validation (LIMITS); a refusal
    names the flag."""
    try:
        return replace(base, **changes)
    except SettingError as e:
        flag = _FLAG_OF.get(e.setting, e.setting)
        raise KineticError(f"bad sampling flag: {flag} {e.reason}", "See `kinetic run --help` and docs/sampling.md.") \
            from None


_FLAG_OF = {field: [f for f in flags if f.startswith("--")][0] for flags, field, *_ in _SAMPLING_FLAGS} | {
    "dry_sequence_breakers": "--dry-sequence-breaker", "logit_bias": "--logit-bias"}
