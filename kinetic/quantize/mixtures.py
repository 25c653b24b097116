"""Which type each tensor gets: llama-quantize's choice for a target (src/llama-quant.cpp), rule for rule.

Owns: the targets `kinetic quantize` writes (`TARGETS`: llama.cpp's file-type codes and default
types), the order llama-quantize writes tensors in (by layer number, then by name), which tensors it
quantizes at all (2-D and up, names ending in "weight", not norms, routers, position embeddings...),
the mixtures (the _M and _S files' per-layer choices for attn_v, ffn_down, attn_output, attn_qkv,
the output and tied-embedding rule, the 8-expert and 70B bumps) and the fallbacks for rows that are
not whole blocks (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q3_K -> Q4_0, else F16). The counters
llama-quantize keeps (the i-th attn_v, the i-th ffn_down) advance in the same order here.

Does not own encoding (encoders.py) or the file's layout (gguf_out.py). The importance-matrix and
IQ-type branches of llama-quantize are left out: the targets here never reach them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kinetic.errors import KineticError

T = GGMLQuantizationType


@dataclass(frozen=True)
class Target:
    """A file type llama-quantize writes: its general.file_type code and its default tensor type."""

    name: str
    file_type: int
    default: GGMLQuantizationType


TARGETS = {t.name: t for t in (
    Target("F32", 0, T.F32), Target("F16", 1, T.F16), Target("BF16", 32, T.BF16),
    Target("Q8_0", 7, T.Q8_0), Target("Q6_K", 18, T.Q6_K),
    Target("Q5_K_M", 17, T.Q5_K), Target("Q5_K_S", 16, T.Q5_K), Target("Q5_1", 9, T.Q5_1), Target("Q5_0", 8, T.Q5_0),
    Target("Q4_K_M", 15, T.Q4_K), Target("Q4_K_S", 14, T.Q4_K), Target("Q4_1", 3, T.Q4_1), Target("Q4_0", 2, T.Q4_0),
    Target("Q3_K_M", 12, T.Q3_K),
)}
FLOAT_TYPES = (T.F32, T.F16, T.BF16)

# name fragments llama-quantize never quantizes (tensor_allows_quantization)
_KEEP_FRAGMENTS = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                   "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
                   "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
                   "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
                   "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
                   "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
                   "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd",
                   "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
                   "mm.a.code_embd")
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")
# (category, fragment) in tensor_get_category's order; the first match decides
_CATEGORY_FRAGMENTS = (("attn_qkv", "attn_qkv.weight"), ("attn_kv_b", "attn_kv_b.weight"), ("attn_v", "attn_v.weight"),
                       ("attn_k", "attn_k.weight"), ("attn_q", "attn_q.weight"),
                       ("attn_output", "attn_output.weight"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                       ("ffn_down", "ffn_down"))
_ATTN_V_LIKE = ("attn_v", "attn_qkv", "attn_kv_b")
_FALLBACK = {T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
# architectures whose loader calls a model of this many layers 70B (the 70B attn_v bump)
_LAYERS_70B = {"qwen2": 80, "deci": 80, "olmo": 80, "jais2": 68}
_LAYER = re.compile(r"blk\.\s*([+-]?\d+)")


@dataclass(frozen=True)
class ModelFacts:
    """What the mixtures read about the model besides its tensors."""

    arch: str
    n_layer: int
    n_expert: int = 0
    is_70b: bool = False


def is_70b(arch: str, n_layer: int, n_head: int | None, n_head_kv: int | None, n_expert: int) -> bool:
    if arch == "llama":
        return n_expert <= 1 and n_layer == 80 and n_head != n_head_kv
    return _LAYERS_70B.get(arch) == n_layer


def layer_of(name: str) -> int:
    """The layer sscanf("blk.%d.") reads from a name, -1 for none."""
    match = _LAYER.match(name)
    return int(match.group(1)) if match else -1


def write_order(names: list[str]) -> list[str]:
    """llama-quantize's tensor order: by layer number (no layer first), then by name."""
    return sorted(names, key=lambda n: (layer_of(n), n.encode("utf-8")))


def category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    return next((cat for cat, fragment in _CATEGORY_FRAGMENTS if fragment in name), "other")


def allows_quantization(name: str, dims: tuple[int, ...]) -> bool:
    if len(dims) < 2 or not name.endswith("weight"):
        return False
    return not any(f in name for f in _KEEP_FRAGMENTS) and name not in _KEEP_NAMES


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


@dataclass
class _Counters:
    n_attention_wv: int
    n_layer: int
    tied_embeddings: bool
    i_attention_wv: int = 0
    i_ffn: dict = field(default_factory=lambda: {"ffn_down": 0, "ffn_gate": 0, "ffn_up": 0})


def choose_types(tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType]], target: Target,
                 model: ModelFacts) -> list[GGMLQuantizationType]:
    """The type llama-quantize writes for each tensor, given in write order as (name, dims, type)."""
    counters = _Counters(n_attention_wv=sum(category(n) in _ATTN_V_LIKE for n, _, _ in tensors),
                         n_layer=model.n_layer,
                         tied_embeddings=not any(category(n) == "output" for n, _, _ in tensors))
    return [_tensor_type(name, dims, qtype, target, model, counters) for name, dims, qtype in tensors]


def _tensor_type(name, dims, qtype, target: Target, model: ModelFacts, counters: _Counters) -> GGMLQuantizationType:
    if not allows_quantization(name, dims):
        return qtype
    if target.default in FLOAT_TYPES:
        return target.default
    return fallback(name, dims, _mixture_type(name, dims, target, model, counters))


def fallback(name: str, dims: tuple[int, ...], qtype: GGMLQuantizationType) -> GGMLQuantizationType:
    """tensor_type_fallback: a type whose blocks fit the rows, F16 when none does."""
    ncols = dims[0]
    if ncols % GGML_QUANT_SIZES[qtype][0] == 0:
        return qtype
    if qtype in _FALLBACK:
        qtype = _FALLBACK[qtype]
    elif GGML_QUANT_SIZES[qtype][0] > 32:
        raise KineticError(f"{name}: no fallback for {qtype.name} rows of {ncols} values")
    return qtype if ncols % GGML_QUANT_SIZES[qtype][0] == 0 else T.F16


def _mixture_type(name, dims, target: Target, model: ModelFacts, c: _Counters) -> GGMLQuantizationType:
    """llama_tensor_get_type_impl for the targets in TARGETS."""
    new, ftype, cat, falcon = target.default, target.name, category(name), model.arch == "falcon"
    if cat == "output" or (c.tied_embeddings and cat == "token_embd"):
        if falcon or dims[0] % GGML_QUANT_SIZES[new][0]:
            return T.Q8_0
        return new if new == T.Q8_0 else T.Q6_K
    if cat in _ATTN_V_LIKE:
        i = c.i_attention_wv
        if ftype == "Q3_K_M":
            new = T.Q5_K if i < 2 else T.Q4_K
        elif ftype in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, c.n_attention_wv):
            new = T.Q6_K
        elif ftype == "Q4_K_S" and i < 4:
            new = T.Q5_K
        if model.is_70b and new in (T.Q3_K, T.Q4_K):
            new = T.Q5_K
        if model.n_expert == 8:
            new = T.Q8_0
        c.i_attention_wv += 1
        return new
    if cat == "attn_k":
        return T.Q8_0 if model.n_expert == 8 else new
    if cat == "ffn_down":
        return _ffn_down_type(name, new, ftype, model, c)
    if cat == "attn_output":
        if not falcon and model.n_expert == 8 and ftype in ("Q3_K_M", "Q4_K_S", "Q4_K_M"):
            return T.Q5_K
        if not falcon and model.n_expert != 8 and ftype == "Q3_K_M":
            return T.Q4_K
        return new
    if cat in ("ffn_gate", "ffn_up"):
        _layer_info(name, cat, model, c)
        c.i_ffn[cat] += 1
    return new


def _ffn_down_type(name, new, ftype: str, model: ModelFacts, c: _Counters) -> GGMLQuantizationType:
    i_layer, n_layer = _layer_info(name, "ffn_down", model, c)
    falcon = model.arch == "falcon"
    more = _use_more_bits(i_layer, n_layer)
    if ftype == "Q3_K_M":
        new = T.Q5_K if i_layer < n_layer // 16 else T.Q4_K if (not falcon or more) else T.Q3_K
    elif ftype == "Q4_K_M":
        if falcon:
            new = T.Q6_K if i_layer < n_layer // 16 else T.Q5_K if more else T.Q4_K
        elif more:
            new = T.Q6_K
    elif ftype == "Q5_K_M" and more:
        new = T.Q6_K
    elif ftype == "Q4_K_S" and not falcon and i_layer < n_layer // 8:
        new = T.Q5_K
    c.i_ffn["ffn_down"] += 1
    return new


def _layer_info(name: str, cat: str, model: ModelFacts, c: _Counters) -> tuple[int, int]:
    """(layer, layers): the counter's value, or for mixtures of experts the layer in the name."""
    if model.n_expert <= 1:
        return c.i_ffn[cat], c.n_layer
    layer = layer_of(name)
    if not 0 <= layer < c.n_layer:
        raise KineticError(f"cannot tell the layer of {name} (the file has {c.n_layer} layers)",
                           "The file's tensor names are not llama.cpp's; it cannot be quantized as it is.")
    return layer, c.n_layer
