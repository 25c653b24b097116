"""The runtime options that run, chat and serve share, and the defaults that make them optional.

Owns: --device and -ngl (`add_device_args`, `choose_device`: auto unless told, a GPU when one is
usable, else the CPU, with one line when -ngl asked for a GPU there is none of), -c (`add_context_arg`,
`choose_context`: the model's training context, at most 32768, and at most what half the free memory
holds), --chat-template NAME (`add_template_arg`) and --numerics (`add_numerics_arg`; lowering_options
carries it to the Model). Does not own the device registry
(kinetic/devices.py), the sampler flags (run_cmd) nor llama.cpp's other spellings (llama_flags.py).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from kinetic.cli.rope_options import add_rope_arguments, lowering_options
from kinetic.devices import DEVICES, device_choices, device_help, resolve_device
from kinetic.errors import KineticError
from kinetic.frontend.chat import BUILTIN_TEMPLATES

CONTEXT_CAP = 32768  # the default context never exceeds this, whatever the model was trained on
CONTEXT_FLOOR = 4096  # nor, when memory caps it, falls below this (unless the model's own is smaller)
FALLBACK_CONTEXT = 4096  # when the file does not say its training context


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")


# -- where the model runs -----------------------------------------------------------------------------

def add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=device_choices(), help=f"{device_help()} [default: auto]")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=int, metavar="N",
                   help="most layers on the GPU, as llama.cpp's -ngl: 0 means --device cpu; any other N a GPU "
                        "(CUDA, else Vulkan) with at most N layers (the last ones) on it and the rest on the CPU, "
                        "or the CPU with one line saying so when no GPU is usable [default: as many as fit]")


def choose_device(args: argparse.Namespace, say=_say) -> str:
    """The device --device and -ngl ask for together, resolved: a named device as it is; `auto`
    given explicitly with one line per device it skips; auto by default quietly; -ngl N > 0 a GPU
    when one is usable, else the CPU with one line saying so."""
    n, asked = args.gpu_layers, args.device
    if n is not None and n < 0:
        raise KineticError(f"-ngl must be 0 or more, not {n}", "-ngl 99 puts every layer on the GPU; -ngl 0 none.")
    if n == 0:
        if asked not in (None, "cpu", "auto"):
            raise KineticError(f"-ngl 0 runs on the CPU, but --device {asked} was asked for", "Drop one of the two.")
        return "cpu"
    if asked not in (None, "auto"):
        return asked
    if asked == "auto" and n is None:
        return resolve_device("auto", say)
    skipped: list[str] = []
    chosen = resolve_device("auto", skipped.append)
    if n is not None and not DEVICES[chosen].gpu:
        reasons = "; ".join(line.removeprefix("auto: skipping ") for line in skipped)
        say(f"kinetic: -ngl {n} asks for a GPU and none is usable here ({reasons}); running on the CPU")
    return chosen


# -- how many tokens a conversation holds -------------------------------------------------------------

def add_context_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--ctx-size", type=int, metavar="N",
                   help=f"most tokens per conversation, prompt and answer together; 0 for all the model "
                        f"supports [default: the model's training context, at most {CONTEXT_CAP} and at most "
                        f"what half the free memory holds]")


@dataclass(frozen=True)
class ContextChoice:
    tokens: int
    why: str  # for the status line: "the model's", "capped at 32768", "to fit memory", "-c"


def choose_context(args: argparse.Namespace, model_path) -> ContextChoice:
    """-c when given (0: the model's whole training context); else the model's training context, at
    most CONTEXT_CAP, and at most what half the available memory holds (a multiple of 1024, at least
    CONTEXT_FLOOR)."""
    asked = args.ctx_size
    if asked is not None and asked < 0:
        raise KineticError(f"-c must be 0 or more, not {asked}", "Give a context size such as -c 8192, or 0 for "
                                                                   "the model's own.")
    if asked:
        return ContextChoice(asked, "-c")
    trained, per_token = _context_facts(model_path)
    if trained is None:
        return ContextChoice(FALLBACK_CONTEXT, "the default: the file does not say its own")
    if asked == 0:
        return ContextChoice(trained, "the model's")
    tokens, why = (CONTEXT_CAP, f"capped at {CONTEXT_CAP}") if trained > CONTEXT_CAP else (trained, "the model's")
    fits = _tokens_that_fit(per_token)
    if fits is not None and fits < tokens:
        tokens, why = max(min(CONTEXT_FLOOR, trained), fits // 1024 * 1024), "to fit memory"
    return ContextChoice(tokens, why)


def _context_facts(model_path) -> tuple[int | None, int | None]:
    """(the training context, the KV cache's bytes per token) from a GGUF file's header; (None, None)
    for a file that is not GGUF (a .ktc file: its context is not read here)."""
    from kinetic.frontend.gguf_file import open_gguf

    try:
        meta = open_gguf(model_path).metadata
    except (KineticError, OSError, ValueError):
        return None, None
    arch = meta.get("general.architecture")
    trained = meta.get(f"{arch}.context_length")
    if not isinstance(trained, int) or trained <= 0:
        return None, None
    return trained, _kv_bytes_per_token(meta, arch)


def _kv_bytes_per_token(meta, arch: str) -> int | None:
    """Keys and values of one token over every layer, in f16; None when the header leaves it unclear."""
    import numpy as np  # metadata arrays (per-layer head counts) come as numpy arrays

    layers, heads = meta.get(f"{arch}.block_count"), meta.get(f"{arch}.attention.head_count")
    kv_heads = meta.get(f"{arch}.attention.head_count_kv", heads)
    width = meta.get(f"{arch}.embedding_length")
    if not isinstance(layers, int) or not isinstance(width, int) or not np.any(heads):
        return None
    per_layer = list(np.ravel(kv_heads)) if np.ndim(kv_heads) else [kv_heads] * layers
    head_count = heads if isinstance(heads, int) else max(heads)
    key = meta.get(f"{arch}.attention.key_length") or width // head_count
    value = meta.get(f"{arch}.attention.value_length") or key
    return sum(int(h) for h in per_layer) * (key + value) * 2


def _tokens_that_fit(per_token: int | None) -> int | None:
    from kinetic.runtime.kv_cache import available_memory

    free = available_memory()
    if per_token is None or free is None:
        return None
    return free // 2 // per_token


# -- chat templates by name ---------------------------------------------------------------------------

def add_template_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat-template-file", metavar="FILE", help="use this Jinja chat template")
    p.add_argument("--chat-template", metavar="NAME", choices=tuple(BUILTIN_TEMPLATES),
                   help=f"use a built-in template by name, as llama.cpp's --chat-template NAME: "
                        f"{', '.join(BUILTIN_TEMPLATES)}")


def check_template_args(args: argparse.Namespace) -> None:
    if args.chat_template and args.chat_template_file:
        raise KineticError("--chat-template and --chat-template-file both name a template", "Give one of the two.")


# -- the rest of the runtime options, and loading the model they describe -----------------------------

def add_off_arg(p: argparse.ArgumentParser) -> None:
    """--off LIST, as kinetic bench takes it; run, chat and serve act on rad1 (drafting off, same tokens),
    shortlist (the whole output layer every token, same tokens) and warm-start; and Warm Start's
    --cache-dir and --no-prompt-cache (docs/warm-start.md)."""
    p.add_argument("--off", metavar="LIST", help="speed technologies to turn off, comma-separated: rad1 "
                   "(RAD-1's drafting), shortlist (the output layer's shortcut), torque, warm-start; the answer is the "
                   "same, only slower")
    p.add_argument("--cache-dir", metavar="DIR", help="where Warm Start keeps prompt states "
                   "[default: kinetic/warm in the user's cache directory]")
    p.add_argument("--no-prompt-cache", action="store_true", help="run every prompt from its first token; "
                   "same as --off warm-start")


def warm_settings(args: argparse.Namespace) -> dict:
    """Model's Warm Start keywords for --off warm-start, --no-prompt-cache and --cache-dir."""
    from kinetic.runtime.warm_disk import default_directory

    if args.no_prompt_cache or "warm-start" in parse_off(args.off):
        return {"warm_start": False}
    return {"warm_start": True, "cache_dir": args.cache_dir or default_directory()}


def parse_off(text: str | None) -> list[str]:
    from kinetic.bench import parse_off as parse  # the one list of names

    return parse(text)


def add_lora_args(p: argparse.ArgumentParser) -> None:
    """--lora FILE[,FILE] and --lora-scaled FILE:SCALE[,...] (and FILE SCALE), as llama.cpp's: adapters
    merged into the weights at load (kinetic/lora.py, docs/lora.md)."""
    p.add_argument("--lora", action="append", metavar="FILE[,FILE]", help="LoRA adapters in llama.cpp's GGUF "
                   "format, merged into the model at load (scale 1); repeatable")
    p.add_argument("--lora-scaled", action="append", metavar="FILE:SCALE[,...]", help="LoRA adapters with a "
                   "scale each (llama.cpp's FILE SCALE form works too); repeatable")


def lora_adapters(args: argparse.Namespace) -> list:
    from kinetic.lora import parse_lora_flags

    return parse_lora_flags(getattr(args, "lora", None), getattr(args, "lora_scaled", None))


def add_signature_arg(p: argparse.ArgumentParser) -> None:
    """--require-signature KEY, for every command that loads a model to run it (docs/security.md)."""
    p.add_argument("--require-signature", metavar="PUBLIC_KEY",
                   help="run only a .ktc file signed by this Ed25519 public key (64 hex digits, or a file holding "
                        "them); GGUF files cannot be signed and are refused [default: $KINETIC_REQUIRE_SIGNATURE]")


def add_numerics_arg(p: argparse.ArgumentParser) -> None:
    """--numerics MODE, for every command that compiles a model's graph (docs/numerics.md). Its choices
    refuse an unknown mode before a model is resolved or downloaded; kinetic/numerics_mode.py checks
    the name again for the Python API."""
    from kinetic.ir.orders import DEFAULT_NUMERICS, NUMERICS

    p.add_argument("--numerics", choices=NUMERICS, metavar="{" + ",".join(NUMERICS) + "}",
                   help="the reductions' order of summation: ggml (llama.cpp's CPU decode path, bit for bit) or "
                        "fast (one float chain per output: faster on the CPU, as exact and batch-invariant, other "
                        f"last bits); devices that follow only ggml's orders run ggml [default: a .ktc file's own, "
                        f"else {DEFAULT_NUMERICS} where the device follows it, else ggml]")


def add_runtime_args(p: argparse.ArgumentParser) -> None:
    """The runtime options of run and chat (serve adds its own between them)."""
    add_context_arg(p)
    p.add_argument("-t", "--threads", type=int, metavar="N", help="CPU threads [default: every logical CPU]")
    add_device_args(p)
    add_template_arg(p)
    add_off_arg(p)
    add_lora_args(p)
    add_signature_arg(p)
    add_rope_arguments(p)  # llama.cpp's --rope-* / --yarn-* (rope_options.py)
    add_numerics_arg(p)


def check_runtime_args(args: argparse.Namespace) -> None:
    """What can be refused before anything loads."""
    if args.threads is not None and args.threads <= 0:
        raise KineticError(f"-t must be positive, not {args.threads}", "Give a thread count such as -t 4.")
    check_template_args(args)
    parse_off(args.off)
    lora_adapters(args)


def load_model(args: argparse.Namespace, spec: str, **extra):
    """The Model the runtime options describe; sets args.device and args.context (a ContextChoice)
    to what was chosen. The first run's kernel compilation shows as progress (compile_progress)."""
    from kinetic.cli.compile_progress import CompileProgress
    from kinetic.hub import resolve_model
    from kinetic.model import Model

    args.context = choose_context(args, resolve_model(spec))
    args.device = choose_device(args)
    with CompileProgress.shown():
        model = Model(spec, n_ctx=args.context.tokens, chat_template_file=args.chat_template_file,
                      chat_template=args.chat_template, device=args.device, threads=args.threads,
                      draft="rad1" not in parse_off(args.off), shortlist="shortlist" not in parse_off(args.off),
                      gpu_layers=args.gpu_layers,
                      require_signature=args.require_signature, options=lowering_options(args),
                      lora=lora_adapters(args), **warm_settings(args), **extra)
        warm_up(model)
    return model


def warm_up(model) -> None:
    """One pass of one token on a throwaway sequence, so a first run compiles its kernels here, under
    the progress line, rather than inside the first prompt's timing. Costs one decode pass."""
    engine = model.engine
    engine.prefill(engine.new_sequence(), [0])
