"""Builders for the layers that carry a recurrent state instead of a KV cache, and the decoder loop of
the hybrid families that mix them with attention.

Owns: `short_conv` (lfm2's gated short convolution: in_proj into b, c and x, conv of b*x over a
rolling cache of the last kernel-1 rows, gated by c, out_proj), `mamba2` (a Mamba-2 mixer with its
sizes, `Mamba2`), `recurrent_state` (a layer's per-sequence state handle, named for the runtime),
`kv_heads_per_layer` (which layers are recurrent: 0 KV heads) and `hybrid_decoder` (embedding,
layers whose mixer is chosen per layer, each pre-normed and followed by a pre-normed feed-forward,
then the head).
Does not own the shared blocks (blocks.py: norms, linear, attention, ffn, strict tensor checks) nor
what the ops compute (kinetic/ir/reference.py, docs/recurrent.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.ir.ops import ColumnsAttrs, Op, RecurrentStateAttrs, SsmScanAttrs
from kinetic.ir.types import TensorType

Mixer = Callable[[int, int], int]  # (layer index, normed rows f32 [T, n_embd]) -> f32 [T, n_embd]


def kv_heads_per_layer(g: GGUFFile, *, n_layer: int, n_head: int) -> tuple[int, ...]:
    """Each layer's KV heads from `attention.head_count_kv` (one value, or an array of one per layer):
    0 marks a recurrent layer, else a divisor of the head count (llama.cpp's is_recr)."""
    name = f"{g.architecture}.attention.head_count_kv"
    raw = g.metadata.get(name)
    values = raw.tolist() if hasattr(raw, "tolist") else raw
    values = [values] * n_layer if isinstance(values, int) else values  # one value for every layer
    if not isinstance(values, list) or len(values) != n_layer:
        raise ModelFileError(g.path.name, name, f"is {values}", f"one value, or an array of one per layer "
                             f"({n_layer}): 0 for a recurrent layer, else the layer's KV heads")
    for il, kv in enumerate(values):
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 0 or (kv and n_head % kv):
            raise ModelFileError(g.path.name, f"{name}[{il}]", f"is {kv!r}",
                                 f"0 or a divisor of attention.head_count ({n_head})")
    return tuple(values)


def recurrent_state(m: Blocks, *, name: str, layer: int, rows: int, width: int) -> int:
    """The handle of a per-sequence recurrent state f32 [rows, width] the runtime keeps under `name`."""
    return m.node(Op.RECURRENT_STATE, (), RecurrentStateAttrs(name, layer), TensorType("rs", (rows, width)))


def short_conv(m: Blocks, x: int, *, layer: int, kernel: int) -> int:
    """lfm2's short-convolution block on normed rows x, f32 [T, n_embd] in and out:
    b, c, h = in_proj(x) split in three; y = out_proj(c * conv(b * h)), conv a causal depthwise
    convolution of `kernel` taps whose state is the last kernel-1 rows of b * h."""
    p = f"blk.{layer}.shortconv."
    width = m.width(x)
    bch = m.linear(x, p + "in_proj.weight", n_out=3 * width, why=f"{width} in, b, c and x of {width} each out")
    b, c, h = (m.node(Op.COLUMNS, (bch,), ColumnsAttrs(i * width, width)) for i in range(3))
    weight = m.weight(p + "conv.weight", (kernel, width), f"shortconv.l_cache {kernel} taps per channel")
    state = recurrent_state(m, name=f"conv.{layer}", layer=layer, rows=kernel - 1, width=width)
    conv = m.node(Op.SHORT_CONV, (m.node(Op.MUL, (b, h)), weight, state))
    return m.linear(m.node(Op.MUL, (c, conv)), p + "out_proj.weight", n_out=width, why=f"{width} in and out")


def hybrid_decoder(m: Blocks, *, n_layer: int, eps: float, mixer: Mixer, act: Act = Act.SILU,
                   output_norm: str = "output_norm.weight", embedding_scale: float = 0.0,
                   residual_scale: float = 0.0, ffn: Callable[[int, int], int] | None = None) -> int:
    """Embedding (times embedding_scale when given), n_layer layers x += mixer(il, attn_norm(x));
    x += ffn(ffn_norm(x)) (each branch times residual_scale when given: granite's multipliers), then
    the head; returns the logits, f32 [R, n_vocab]. `ffn(h, layer)` replaces the gated feed-forward
    (lfm2moe's experts, moe_blocks.py)."""
    def residual(x: int, h: int) -> int:
        return m.add(x, m.scale(h, residual_scale) if residual_scale else h)

    x = m.embed("token_embd.weight", m.input("tokens"))  # f32 [T, n_embd]
    if embedding_scale:
        x = m.scale(x, embedding_scale)
    for il in range(n_layer):
        p = f"blk.{il}."
        x = residual(x, mixer(il, m.rms_norm(x, p + "attn_norm.weight", eps=eps)))
        h = m.rms_norm(x, p + "ffn_norm.weight", eps=eps)
        x = residual(x, ffn(h, il) if ffn else m.ffn(h, layer=il, act=act))
    return m.head(x, eps=eps, norm=output_norm)  # f32 [R, n_vocab]


@dataclass(frozen=True)
class Mamba2:
    """A Mamba-2 layer's sizes, from the file's ssm.* keys."""

    d_conv: int  # conv taps
    d_inner: int  # x and z width: n_head x head_dim
    d_state: int
    n_head: int  # ssm.time_step_rank
    n_group: int  # B and C groups

    @property
    def conv_width(self) -> int:
        return self.d_inner + 2 * self.n_group * self.d_state  # x, B, C

    @classmethod
    def read(cls, g: GGUFFile) -> Mamba2:
        """The sizes, refused unless they divide as Mamba-2 and Kinetic's scan need (by key)."""
        dims = cls(d_conv=hp.key(g, "ssm.conv_kernel"), d_inner=hp.key(g, "ssm.inner_size"),
                   d_state=hp.key(g, "ssm.state_size"), n_head=hp.key(g, "ssm.time_step_rank"),
                   n_group=hp.key(g, "ssm.group_count"))
        checks = (("ssm.time_step_rank", dims.n_head, dims.d_inner % dims.n_head == 0,
                   f"a divisor of ssm.inner_size ({dims.d_inner})"),
                  ("ssm.group_count", dims.n_group, dims.n_group == 1,
                   "1 (grouped norms over several groups are not supported yet)"))
        for suffix, value, ok, expected in checks:
            if not ok:
                raise ModelFileError(g.path.name, f"{g.architecture}.{suffix}", f"is {value}", expected)
        return dims


def mamba2(m: Blocks, x: int, *, layer: int, dims: Mamba2, eps: float, optional_norm: bool = False) -> int:
    """A Mamba-2 mixer on normed rows x, f32 [T, n_embd] in and out (llama.cpp's build_mamba2_layer):
    ssm_in into z, xBC and dt; xBC through the causal conv (state: its last d_conv - 1 rows), its
    bias and SiLU, split into x, B and C; y = scan(x, dt + dt_bias, A, B, C) + x * D (state: per
    head, head_dim x d_state); silu(z) * y, RMS-normed with ssm_norm (which a file may leave out when
    `optional_norm`: falcon-h1); ssm_out."""
    p, d = f"blk.{layer}.", dims
    width, head_dim = m.width(x), d.d_inner // d.n_head
    zxbcdt = m.linear(x, p + "ssm_in.weight", n_out=d.d_inner + d.conv_width + d.n_head,
                      why=f"{width} in, z, x, B, C and dt out")
    z, xbc, dt = (m.node(Op.COLUMNS, (zxbcdt,), ColumnsAttrs(start, n))
                  for start, n in ((0, d.d_inner), (d.d_inner, d.conv_width), (d.d_inner + d.conv_width, d.n_head)))
    kernel = m.weight(p + "ssm_conv1d.weight", (d.d_conv, d.conv_width), f"ssm.conv_kernel {d.d_conv} taps per channel")
    conv_state = recurrent_state(m, name=f"conv.{layer}", layer=layer, rows=d.d_conv - 1, width=d.conv_width)
    xbc = m.node(Op.SHORT_CONV, (xbc, kernel, conv_state))
    if m.has(p + "ssm_conv1d.bias"):
        xbc = m.node(Op.ADD_BIAS, (xbc, m.weight(p + "ssm_conv1d.bias", (d.conv_width,), "one per conv channel")))
    xbc = m.node(Op.SILU, (xbc,))
    group_width = d.n_group * d.d_state
    xs, b, c = (m.node(Op.COLUMNS, (xbc,), ColumnsAttrs(start, n))
                for start, n in ((0, d.d_inner), (d.d_inner, group_width), (d.d_inner + group_width, group_width)))
    dt = m.node(Op.ADD_BIAS, (dt, m.weight(p + "ssm_dt.bias", (d.n_head,), "one per SSM head")))
    decay = m.weight(p + "ssm_a", (1, d.n_head), "one decay per SSM head")
    skip = m.weight(p + "ssm_d", (1, d.n_head), "one skip factor per SSM head")
    ssm_state = recurrent_state(m, name=f"ssm.{layer}", layer=layer, rows=d.d_inner, width=d.d_state)
    scan = SsmScanAttrs(d.n_head, head_dim, d.n_group, d.d_state)
    y = m.node(Op.SSM_SCAN, (xs, dt, decay, b, c, skip, ssm_state), scan)
    y = m.node(Op.MUL, (m.node(Op.SILU, (z,)), y))  # ggml_swiglu_split(z, y)
    if not optional_norm or m.has(p + "ssm_norm.weight"):
        y = m.rms_norm(y, p + "ssm_norm.weight", eps=eps)
    return m.linear(y, p + "ssm_out.weight", n_out=width, why=f"{d.d_inner} in, the width {width} out")
