"""The sampler flags, under llama.cpp's names (common/arg.cpp), for every command that generates.

Owns: the flag list (`add_sampling_args`), reading it into SamplingSettings changes checked before the
model loads (`sampling_changes`), and applying changes with the flag's name in any refusal
(`apply_sampling`). Unset flags leave the model file's general.sampling.* recommendations, then
llama.cpp's defaults (docs/sampling.md). Does not own the settings or their limits
(kinetic/runtime/sampling/settings.py).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

from kinetic.errors import KineticError
from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.sampling.settings import SettingError

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
    apply_sampling(SamplingSettings(), changes)
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


def apply_sampling(base: SamplingSettings, changes: dict) -> SamplingSettings:
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
