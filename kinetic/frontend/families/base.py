"""What a family descriptor is: the architectures it answers to, how it builds a graph, and the facts
`kinetic info` names about one of its files.

Owns: the Family record and the facts every decoder family shares (attention heads, rotary layout,
base and scaling, norm epsilon), which a family's own `facts` extends with what is distinctive about
it (multipliers, where its norms sit, sliding windows). Does not own reading the values (hparams.py
checks each one; a bad value raises its ModelFileError here too) or printing them (kinetic/cli/info_cmd.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.ir.ops import RopeAttrs

Facts = Callable[[GGUFFile], dict[str, str]]  # label -> one line of text, in the order shown


def attention_fact(d: hp.Decoder) -> str:
    """Heads, their width and the grouping of KV heads: "8 heads x 64, 2 KV heads (GQA 4)"."""
    kv = "MHA" if d.n_kv_head == d.n_head else f"GQA {d.n_head // d.n_kv_head}"
    return f"{_count(d.n_head, 'head')} x {d.head_dim}, {_count(d.n_kv_head, 'KV head')} ({kv})"


def rotary_fact(rope: RopeAttrs | None) -> str:
    """Layout, rotated width, base and scaling of a rotary configuration; None is no rotary."""
    if rope is None:
        return "none"
    layout = "NeoX halves" if rope.neox else "interleaved pairs"
    width = "the whole head" if rope.n_rot == rope.head_dim else f"{rope.n_rot} of {rope.head_dim} values"
    return f"{layout} over {width}, base {number(rope.theta)}, {scaling_fact(rope)}"


def number(value: float) -> str:
    """A value as the file would show it: 1000000 rather than 1e+06, 0.22 rather than 0.220000."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def scaling_fact(rope: RopeAttrs) -> str:
    """The rotary scaling a configuration applies, or "no scaling"."""
    parts = []
    if rope.freq_scale != 1.0:
        kind = "YaRN" if rope.yarn_ext_factor else "linear"
        parts.append(f"{kind} scaling x{1 / rope.freq_scale:g}")
    if rope.yarn_orig_ctx:
        parts.append(f"original context {rope.yarn_orig_ctx}")
    if rope.freq_factors:
        parts.append(f"per-pair frequency factors from rope_freqs ({len(rope.freq_factors)} values)")
    return ", ".join(parts) or "no scaling"


def decoder_facts(gguf: GGUFFile, *, default_eps: float, neox: bool) -> dict[str, str]:
    """The facts of a decoder family: attention, rotary (NeoX or interleaved layout) and norm epsilon."""
    d = hp.decoder(gguf, default_eps=default_eps)
    rope = hp.rope(gguf, n_head=d.n_head, head_dim=d.head_dim, neox=neox)
    return {"attention": attention_fact(d), "rotary": rotary_fact(rope), "norm eps": f"{d.eps:g}"}


def llama_facts(gguf: GGUFFile) -> dict[str, str]:
    """Llama's facts (interleaved rotary, eps 1e-5 unless the file says), the default of a family."""
    return decoder_facts(gguf, default_eps=1e-5, neox=False)


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    build: Callable[[Blocks], int]  # builds every layer and the head; returns the logits node
    facts: Facts = llama_facts  # what `kinetic info` names about a file of this family
