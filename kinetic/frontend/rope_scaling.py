"""A layer's rotary parameters as llama.cpp sets them up: the file's scaling (none, linear, YaRN), its
`rope_freqs` tensor (llama3-style scaling, Gemma 4's proportional rotary) and the command line's
overrides (`--rope-scaling`, `--rope-freq-base`, `--yarn-*`: `RopeOverrides`).

Owns: `RopeOverrides` (llama.cpp's context parameters for rotary, common/arg.cpp; None is "not
given", which is llama.cpp's 0 / -1), `overriding` (the overrides lower() applies while a family
builds, so every family's `hp.rope` call sees them without passing them along) and `rope_attrs`, the
one place the file's keys, llama.cpp's defaults and the overrides meet (llama-model.cpp's
hyperparameter loading, llama-context.cpp's context setup, llama_model::get_rope_freq_base/scale
for sliding-window layers). Does not own the arithmetic (kinetic/ir/numerics/rotary.py) nor the
command line (kinetic/cli/rope_options.py).

llama.cpp's rules, in order: the type is the override, else the file's rope.scaling.type (default
"linear"); the scale is the override, else 1 / rope.scaling.factor (or rope.scale_linear; 0 = 1);
type "none" forces scale 1; YaRN's extrapolation mix defaults to 1 under YaRN and 0 otherwise; with
a mix, the attention factor becomes get_mscale(1/scale) / (1 + 0.1 ln(1/scale)) (libllama is built
without FMA: each product rounded), cancelling most of the magnitude ggml multiplies in again; the
file's rope.scaling.attn_factor multiplies it last. YaRN's original context is the override, else
rope.scaling.original_context_length, else context_length. A sliding-window layer keeps its own base
and scale 1 (rope_freq_scale_train_swa); the base and scale overrides do not reach it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from kinetic.errors import KineticError, ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.ir.numerics import F32, logf
from kinetic.ir.ops import RopeAttrs

SCALING_TYPES = ("none", "linear", "yarn")  # what Kinetic applies; llama.cpp also knows longrope
ROPE_FREQS = "rope_freqs.weight"


@dataclass(frozen=True)
class RopeOverrides:
    """Rotary settings given on the command line or to Model(options=...); None keeps the file's (or
    llama.cpp's default). Checked when made: a bad value is a KineticError naming the flag."""

    scaling: str | None = None  # --rope-scaling none|linear|yarn
    freq_base: float | None = None  # --rope-freq-base
    freq_scale: float | None = None  # --rope-freq-scale (--rope-scale N gives 1/N)
    yarn_orig_ctx: int | None = None  # --yarn-orig-ctx
    yarn_ext_factor: float | None = None  # --yarn-ext-factor
    yarn_attn_factor: float | None = None  # --yarn-attn-factor
    yarn_beta_fast: float | None = None  # --yarn-beta-fast
    yarn_beta_slow: float | None = None  # --yarn-beta-slow

    def __post_init__(self):
        if self.scaling is not None and self.scaling not in SCALING_TYPES:
            raise unknown_scaling(self.scaling, "--rope-scaling")
        positive = {"--rope-freq-base": self.freq_base, "--rope-freq-scale": self.freq_scale}
        for flag, value in positive.items():
            if value is not None and not (math.isfinite(value) and value > 0):
                raise KineticError(f"{flag} must be a positive number, not {value}",
                                   f"Leave {flag} out to use the model's own value.")
        finite = {"--yarn-ext-factor": self.yarn_ext_factor, "--yarn-attn-factor": self.yarn_attn_factor,
                  "--yarn-beta-fast": self.yarn_beta_fast, "--yarn-beta-slow": self.yarn_beta_slow}
        for flag, value in finite.items():
            if value is not None and not math.isfinite(value):
                raise KineticError(f"{flag} must be a finite number, not {value}", f"Give {flag} a number such as 1.")
        if self.yarn_orig_ctx is not None and not 0 <= self.yarn_orig_ctx <= hp.MAX_CONTEXT:
            raise KineticError(f"--yarn-orig-ctx must be a context size in tokens, not {self.yarn_orig_ctx}",
                               "Give the model's training context, such as --yarn-orig-ctx 32768.")


def unknown_scaling(name: str, where: str) -> KineticError:
    return KineticError(f"{name} rotary scaling ({where}) is not supported",
                        f"Kinetic applies these rotary scaling types: {', '.join(SCALING_TYPES)}; "
                        "frequency factors come from the file's rope_freqs tensor.")


_NONE = RopeOverrides()
_OVERRIDES: contextvars.ContextVar[RopeOverrides | None] = contextvars.ContextVar("rope_overrides", default=None)


@contextlib.contextmanager
def overriding(overrides: RopeOverrides) -> Iterator[None]:
    """Within the block, rope_attrs applies these overrides (lower() wraps a family's build in it)."""
    token = _OVERRIDES.set(overrides)
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def rope_attrs(gguf: GGUFFile, *, n_head: int, head_dim: int, neox: bool, theta: float | None = None,
               swa: bool = False, freq_factors: bool = True) -> RopeAttrs:
    """The rotary node's attributes for one layer. `theta`: a base in place of the file's (a
    sliding-window base); `swa`: a sliding-window layer (scale 1, no base or scale override);
    `freq_factors`: the layer divides its angles by the file's rope_freqs tensor when it has one."""
    o = _OVERRIDES.get() or _NONE
    n_rot = hp.key(gguf, "rope.dimension_count", head_dim)
    if n_rot % 2 or n_rot > head_dim:
        raise hp._refuse(gguf, "rope.dimension_count", n_rot, f"an even number from 2 to the head size ({head_dim})")
    scaling = o.scaling or _file_scaling(gguf)
    scale = 1.0 if scaling == "none" else (o.freq_scale or _file_scale(gguf))  # the context's (cparams)
    base = theta if theta is not None else hp.key(gguf, "rope.freq_base", 10000.0)
    if not swa and o.freq_base:
        base = o.freq_base
    ext = _given(o.yarn_ext_factor, 1.0 if scaling == "yarn" else 0.0)
    attn = yarn_attn_factor(float(F32(1) / F32(scale))) if ext else _given(o.yarn_attn_factor, 1.0)
    orig = o.yarn_orig_ctx or hp.key(gguf, "rope.scaling.original_context_length", 0) or \
        hp.key(gguf, "context_length", 0)
    if ext and not orig:
        raise ModelFileError(gguf.path.name, f"{gguf.architecture}.context_length", "is missing",
                             "the training context (YaRN's original context)", "Give it with --yarn-orig-ctx N.")
    return RopeAttrs(n_head, head_dim, n_rot, _f32(base), neox, freq_scale=1.0 if swa else _f32(scale),
                     yarn_orig_ctx=int(orig) if ext else 0, yarn_ext_factor=_f32(ext),
                     yarn_attn_factor=_f32(F32(attn) * F32(hp.key(gguf, "rope.scaling.attn_factor", 1.0))),
                     yarn_beta_fast=_f32(_given(o.yarn_beta_fast, 32.0)),
                     yarn_beta_slow=_f32(_given(o.yarn_beta_slow, 1.0)),
                     freq_factors=_freq_factors(gguf, n_rot) if freq_factors else ())


def _given(value: float | None, default: float) -> float:
    """llama.cpp's reading of a YaRN parameter: a negative one (its -1) is not given."""
    return value if value is not None and value >= 0 else default


def _f32(value) -> float:
    """A float32 value (llama.cpp keeps every rotary parameter in float) as the attributes hold it."""
    return float(F32(value))


def _file_scaling(gguf: GGUFFile) -> str:
    name = hp.key(gguf, "rope.scaling.type", "linear")
    if name not in SCALING_TYPES:
        raise unknown_scaling(repr(name), f"{gguf.architecture}.rope.scaling.type in {gguf.path.name}")
    return name


def _file_scale(gguf: GGUFFile) -> float:
    """1 / rope.scaling.factor (or the older rope.scale_linear), 1 when absent or 0, as float32."""
    factor = hp.key(gguf, "rope.scaling.factor", None)
    if factor is None:
        factor = hp.key(gguf, "rope.scale_linear", 0.0)
    return 1.0 if factor == 0.0 else float(F32(1) / F32(factor))


def yarn_attn_factor(factor: float) -> float:
    """llama-context.cpp: get_mscale(factor, 1) * (1 / (1 + 0.1 logf(factor))), float32 operations
    each rounded (libllama is built without FMA contraction)."""
    f = F32(factor)
    mscale = F32(1) if f <= 1 else F32(F32(F32(0.1) * logf(f)) + F32(1))
    cancel = F32(F32(1) / F32(F32(1) + F32(F32(0.1) * logf(f))))
    return float(F32(mscale * cancel))


def _freq_factors(gguf: GGUFFile, n_rot: int) -> tuple[float, ...]:
    """The rope_freqs tensor's n_rot/2 values (llama.cpp: f32 {n_rot/2}); () when the file has none."""
    info = gguf.tensors.get(ROPE_FREQS)
    if info is None:
        return ()
    if info.type != GGMLQuantizationType.F32 or tuple(info.ne) != (n_rot // 2,):
        raise ModelFileError(gguf.path.name, f"tensor {ROPE_FREQS}", f"is {info.type.name} {list(info.ne)}",
                             f"F32 [{n_rot // 2}] (one frequency factor per rotated pair)")
    values = np.asarray(gguf.array(ROPE_FREQS), np.float32).reshape(-1)
    if not (np.all(np.isfinite(values)) and np.all(values > 0)):
        raise ModelFileError(gguf.path.name, f"tensor {ROPE_FREQS}", "holds a factor that is not a positive "
                             "finite number", "positive frequency factors")
    return tuple(float(v) for v in values)
