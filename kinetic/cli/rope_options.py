"""llama.cpp's rotary flags on run, chat and serve: `--rope-scaling`, `--rope-scale`, `--rope-freq-base`,
`--rope-freq-scale` and `--yarn-*` (common/arg.cpp), as the same names and meanings.

Owns: `add_rope_arguments(parser)` and `lowering_options(args)`, which turns the parsed flags into the
lowering Options (kinetic/frontend/blocks.py) whose `rope` overrides every layer's rotary where the
model is lowered (kinetic/frontend/rope_scaling.py: the one place the file's values, llama.cpp's
defaults and these meet). Does not own what the values do. A .ktc file's stored graph was lowered
without overrides: given one, Model lowers its weights again with them (kinetic/ktc/load.py compares
the lowering options).

As in llama.cpp: `--rope-scale N` is `--rope-freq-scale 1/N` (the later of the two wins); a base or
scale of 0 keeps the model's; negative YaRN factors and betas keep llama.cpp's defaults; YaRN's
attention factor is recomputed whenever YaRN is on (only `rope.scaling.attn_factor` in the file
multiplies it), so `--yarn-attn-factor` matters without YaRN only.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kinetic.errors import KineticError

if TYPE_CHECKING:  # the frontend loads when a model does, not when the command line is read
    from kinetic.frontend.blocks import Options
    from kinetic.frontend.rope_scaling import RopeOverrides

SCALING_METAVAR = "{none,linear,yarn}"  # rope_scaling.SCALING_TYPES (tests/cli/test_rope_options.py)


class _FreqScale(argparse.Action):
    """--rope-freq-scale N and --rope-scale N into one value, the later flag winning: (flag, N)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, (option_string, values))


def add_rope_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("rotary scaling (llama.cpp's flags)")
    g.add_argument("--rope-scaling", metavar=SCALING_METAVAR,
                   help="RoPE frequency scaling method [default: the model's, else linear]")
    g.add_argument("--rope-scale", dest="rope_freq_scale", type=float, action=_FreqScale, metavar="N",
                   help="RoPE context scaling factor: expands the context by N (--rope-freq-scale 1/N)")
    g.add_argument("--rope-freq-base", type=float, metavar="N", help="RoPE base frequency [default: the model's]")
    g.add_argument("--rope-freq-scale", dest="rope_freq_scale", type=float, action=_FreqScale, metavar="N",
                   help="RoPE frequency scaling factor: expands the context by 1/N [default: the model's]")
    g.add_argument("--yarn-orig-ctx", type=int, metavar="N",
                   help="YaRN: the model's original context size [default: the model's training context]")
    g.add_argument("--yarn-ext-factor", type=float, metavar="N",
                   help="YaRN: extrapolation mix factor (0 = full interpolation) [default: 1 with YaRN, else 0]")
    g.add_argument("--yarn-attn-factor", type=float, metavar="N",
                   help="YaRN: attention magnitude scale [default: 1; recomputed when YaRN is on]")
    g.add_argument("--yarn-beta-slow", type=float, metavar="N", help="YaRN: high correction dim or alpha [default: 1]")
    g.add_argument("--yarn-beta-fast", type=float, metavar="N", help="YaRN: low correction dim or beta [default: 32]")


def rope_overrides(args: argparse.Namespace) -> RopeOverrides:
    """The flags as overrides (None where not given); a bad value is a KineticError naming its flag."""
    from kinetic.frontend.rope_scaling import RopeOverrides

    return RopeOverrides(
        scaling=args.rope_scaling, freq_base=args.rope_freq_base or None, freq_scale=_freq_scale(args.rope_freq_scale),
        yarn_orig_ctx=args.yarn_orig_ctx or None, yarn_ext_factor=args.yarn_ext_factor,
        yarn_attn_factor=args.yarn_attn_factor, yarn_beta_fast=args.yarn_beta_fast,
        yarn_beta_slow=args.yarn_beta_slow)


def lowering_options(args: argparse.Namespace) -> Options | None:
    """The lowering Options the flags ask for (the rotary overrides and --numerics, where the command
    has it); None when none was given (the model's own rotary, and a .ktc file's stored graph stays
    usable)."""
    from kinetic.frontend.blocks import Options
    from kinetic.frontend.rope_scaling import RopeOverrides

    overrides, numerics = rope_overrides(args), getattr(args, "numerics", None)
    return None if overrides == RopeOverrides() and numerics is None else Options(rope=overrides, numerics=numerics)


def _freq_scale(given: tuple[str, float] | None) -> float | None:
    if given is None:
        return None
    flag, value = given
    if flag == "--rope-scale":
        if not value > 0:
            raise KineticError(f"--rope-scale must be a positive factor, not {value}",
                               "Give the factor that expands the context, such as --rope-scale 4.")
        import numpy as np

        return float(np.float32(1) / np.float32(value))  # 1.0f / stof(value)
    return value or None  # 0: the model's, as llama.cpp reads it
