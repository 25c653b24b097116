"""A float64 ground truth for `kinetic perplexity`: a plain numpy forward pass of a llama-architecture
GGUF model (SmolLM2) in float64, scored on exactly the chunks and positions Kinetic scores.

Owns: reading the weights (the `gguf` package's dequantize, so nothing of Kinetic's weight decoding is
shared), the forward pass (RMS norm, normal-layout rotary, grouped-query attention with an exact
softmax, SwiGLU, tied or separate output) in float64, and three numerics variants that separate the
sources of error:
    exact   float64 everywhere, dequantized weights, unquantized activations;
    kv16    exact, but keys, values and queries rounded to f16 as Kinetic's f16 cache holds them;
    actq    kv16, and every matmul input quantized as Kinetic's kernels quantize it (Q8_0 blocks for
            Q8_0 weights; Q8_1 for Q4_1: q, d rounded to f16, and the minimum's term taken from
            s = f16(d * sum q), as ggml and both of Kinetic's orders do), the dots then exact in float64.
What remains between `actq` and Kinetic is the float32 arithmetic (accumulation orders, f16 value
accumulator in ggml's attention, f32 norms and rotary). Chunks and scored positions follow
kinetic/perplexity.py (split_chunks; BOS first where the model adds one; positions n_ctx/2 .. n_ctx-2,
each predicting the next token). Hand-written on purpose: a reference must not share Kinetic's code
paths; the activation quantizers are imported from kinetic.ir.numerics.activations because they are
the kernels' definition, which `actq` is meant to reproduce. Does not own the comparison
(benchmarks/perplexity_compare.py) or Kinetic's own NLLs (benchmarks/perplexity_nll.py).

    python benchmarks/perplexity_f64.py MODEL.gguf TEXT -c 128 --variant exact -o /tmp/ppl11/smol_exact.npz
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize
from perplexity_common import save_run, scoring_parser  # beside this script, on sys.path when run

VARIANTS = ("exact", "kv16", "actq")


@dataclass(frozen=True)
class Hparams:
    n_layer: int
    n_embd: int
    n_head: int
    n_kv_head: int
    head_dim: int
    rope_base: float
    eps: float
    arch: str = "llama"
    window: int = 0  # gemma3's sliding window (0: none)
    rope_base_local: float = 10000.0  # gemma3's rotary base on sliding-window layers


@dataclass
class Linear:
    """A weight as float64 [n_out, K], with its type and, for Q4_1, the per-block minimums [n_out, K/32]."""

    w: np.ndarray
    qtype: Q
    mins: np.ndarray | None = None


def _field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _q4_1_minimums(raw: np.ndarray, n_out: int) -> np.ndarray:
    """Q4_1 blocks are (d f16, m f16, 16 bytes of nibbles): the m of each block, f64 [n_out, K/32]."""
    blocks = raw.reshape(n_out, -1, 20)
    return blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float64)


def load(path: str) -> tuple[Hparams, dict[str, Linear], np.ndarray]:
    """Hyperparameters, every tensor by GGUF name, and the token embedding f64 [n_vocab, n_embd]."""
    r = GGUFReader(path)
    arch = _field(r, "general.architecture")
    if arch not in ("llama", "gemma3"):
        raise SystemExit(f"{path}: architecture {arch!r}; this ground truth implements llama and gemma3")
    n_embd, n_head = _field(r, f"{arch}.embedding_length"), _field(r, f"{arch}.attention.head_count")
    hp = Hparams(n_layer=_field(r, f"{arch}.block_count"), n_embd=n_embd, n_head=n_head,
                 n_kv_head=_field(r, f"{arch}.attention.head_count_kv", n_head),
                 head_dim=_field(r, f"{arch}.attention.key_length", n_embd // n_head),
                 rope_base=float(_field(r, f"{arch}.rope.freq_base", 10000.0)),
                 eps=float(_field(r, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5 if arch == "llama" else 1e-6)),
                 arch=arch, window=int(_field(r, f"{arch}.attention.sliding_window", 0)),
                 rope_base_local=float(_field(r, f"{arch}.rope.freq_base_swa", 10000.0)))
    tensors = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float64)
        mins = _q4_1_minimums(t.data, w.shape[0]) if t.tensor_type == Q.Q4_1 else None
        if t.tensor_type in (Q.Q5_1, Q.Q4_0):
            raise SystemExit(f"{t.name}: {t.tensor_type.name}; actq does not emulate this type's dot")
        tensors[t.name] = Linear(w=w, qtype=t.tensor_type, mins=mins)
    return hp, tensors, tensors["token_embd.weight"].w


@cache
def _loaded(path: str) -> tuple[Hparams, dict[str, Linear], np.ndarray]:
    return load(path)


def logits_after(path: str, tokens: list[int], variant: str = "actq") -> np.ndarray:
    """The ground truth's logits f64 [n_vocab] after `tokens` (the conformance check's truth at a
    divergence: kinetic/runtime/conformance.with_truth); each model file is read once a process."""
    hp, tensors, _ = _loaded(path)
    return forward(np.array(tokens), np.array([len(tokens) - 1]), hp, tensors, variant)[0]


# -- the numerics variants ------------------------------------------------------------------------


def _round_f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


def matmul(x: np.ndarray, lin: Linear, variant: str) -> np.ndarray:
    """x f64 [T, K] @ lin.w.T -> f64 [T, n_out]; in "actq" the input quantized as the kernel quantizes it."""
    if variant != "actq":
        return x @ lin.w.T
    from kinetic.ir.numerics.activations import activation_format, q8_1_sums, quantize_q8_0, quantized_activations

    x32 = x.astype(np.float32)
    if lin.mins is None:  # Q8_0 / Q8_K blocks (or f32): the dot of the kernel's activation values
        return quantized_activations(x32, activation_format(lin.qtype)).astype(np.float64) @ lin.w.T
    q, d = quantize_q8_0(x32)  # int8 [T, K/32, 32], f32 [T, K/32] (f16-rounded scale)
    xq = (q.astype(np.float64) * d[:, :, None].astype(np.float64)).reshape(x.shape)
    y = xq @ lin.w.T
    if lin.mins is not None:  # the minimum's term uses s = f16(d_unrounded * sum q), not sum(xq)
        s = q8_1_sums(x32).astype(np.float64)  # [T, K/32]
        y += (s - xq.reshape(q.shape).sum(axis=2)) @ lin.mins.T
    return y


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w


def rope_normal(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Rotary in the normal (interleaved) layout on x f64 [T, heads, hd]: pairs (2i, 2i+1)."""
    hd = x.shape[-1]
    theta = positions[:, None].astype(np.float64) * base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, hp: Hparams, variant: str, *,
              scale: float | None = None, window: int = 0) -> np.ndarray:
    """Causal grouped-query attention, exact softmax: q [T, n_head, hd], k/v [T, n_kv, hd] -> [T, n_head*hd].
    scale defaults to 1/sqrt(head_dim); window > 0 hides keys window or more positions back."""
    if variant != "exact":  # the f16 cache: keys and values stored as f16, the query rounded to f16
        q, k, v = _round_f16(q), _round_f16(k), _round_f16(v)
    t = q.shape[0]
    group = hp.n_head // hp.n_kv_head
    kh = np.repeat(k, group, axis=1).transpose(1, 0, 2)  # [n_head, T, hd]: head h reads kv head h // group
    vh = np.repeat(v, group, axis=1).transpose(1, 0, 2)
    scores = np.einsum("thd,hsd->hts", q, kh) * (1 / np.sqrt(hp.head_dim) if scale is None else scale)
    back = np.arange(t)[:, None] - np.arange(t)[None, :]  # query position - key position
    scores[:, (back < 0) | ((back >= window) if window else False)] = -np.inf
    scores -= scores.max(axis=2, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=2, keepdims=True)
    return np.einsum("hts,hsd->thd", p, vh).reshape(t, -1)


# -- the forward pass -----------------------------------------------------------------------------


def forward(tokens: np.ndarray, out_rows: np.ndarray, hp: Hparams, t: dict[str, Linear], variant: str,
            capture: dict | None = None) -> np.ndarray:
    """The architecture's forward pass (llama here, gemma3 in perplexity_f64_gemma3.py)."""
    if hp.arch == "gemma3":
        import perplexity_f64_gemma3

        return perplexity_f64_gemma3.forward(tokens, out_rows, hp, t, variant)
    return forward_llama(tokens, out_rows, hp, t, variant, capture)


def forward_llama(tokens: np.ndarray, out_rows: np.ndarray, hp: Hparams, t: dict[str, Linear], variant: str,
            capture: dict | None = None) -> np.ndarray:
    """Logits f64 [len(out_rows), n_vocab] of the given rows of one sequence starting at position 0.
    `capture`, when given, receives each matmul's input by (layer, GGUF name) and each layer's rotated
    q, k, v by (layer, "qkv"), for op-level error measurements (benchmarks/numerics_op_error.py)."""

    def mm(x: np.ndarray, layer: int, name: str) -> np.ndarray:
        if capture is not None:
            capture[(layer, name)] = x
        return matmul(x, t[f"blk.{layer}.{name}.weight" if layer >= 0 else name], variant)

    x = t["token_embd.weight"].w[tokens]  # f64 [T, n_embd]
    pos = np.arange(len(tokens))
    n_t = len(tokens)
    for i in range(hp.n_layer):
        h = rms_norm(x, t[f"blk.{i}.attn_norm.weight"].w, hp.eps)
        q = mm(h, i, "attn_q").reshape(n_t, hp.n_head, hp.head_dim)
        k = mm(h, i, "attn_k").reshape(n_t, hp.n_kv_head, hp.head_dim)
        v = mm(h, i, "attn_v").reshape(n_t, hp.n_kv_head, hp.head_dim)
        q, k = rope_normal(q, pos, hp.rope_base), rope_normal(k, pos, hp.rope_base)
        if capture is not None:
            capture[(i, "qkv")] = (q, k, v)
        x = x + mm(attention(q, k, v, hp, variant), i, "attn_output")
        h = rms_norm(x, t[f"blk.{i}.ffn_norm.weight"].w, hp.eps)
        gate, up = mm(h, i, "ffn_gate"), mm(h, i, "ffn_up")
        x = x + mm(gate / (1.0 + np.exp(-gate)) * up, i, "ffn_down")
    h = rms_norm(x[out_rows], t["output_norm.weight"].w, hp.eps)
    return mm(h, -1, "output.weight" if "output.weight" in t else "token_embd.weight")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def tokenize(path: str, text_path: str) -> tuple[list[int], int | None]:
    """The text's tokens as `kinetic perplexity` makes them (Kinetic's tokenizer: only the tokens are
    shared, not the arithmetic) and the BOS each chunk starts with, or None."""
    from kinetic.cli.perplexity_cmd import _read_text
    from kinetic.frontend.gguf_file import GGUFFile
    from kinetic.frontend.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(GGUFFile(path))
    bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
    return tok.encode(_read_text(text_path), add_special=True, parse_special=False), bos


def perturb_embedding(tensors: dict[str, Linear], eps: float, seed: int) -> None:
    """Multiplies every token embedding value by (1 + eps * N(0, 1)): a rounding-sized change of the
    input, to measure how far the rest of the pass carries it (the sensitivity of the perplexity)."""
    emb = tensors["token_embd.weight"]
    noise = np.random.default_rng(seed).standard_normal(emb.w.shape)
    tensors["token_embd.weight"] = Linear(w=emb.w * (1 + eps * noise), qtype=emb.qtype, mins=emb.mins)


def score(path: str, text_path: str, *, n_ctx: int, variant: str, keep_logits: int,
          max_chunks: int = -1, perturb: float = 0.0, seed: int = 0,
          partial: str | None = None) -> dict[str, np.ndarray]:
    """Per scored token nll f64 [n] (and target, chunk), logits f64->f32 of the first keep_logits chunks.
    With `partial`, the NLLs of the chunks done so far are written there after every chunk (a long
    run on a busy machine leaves usable results when stopped)."""
    hp, tensors, _ = load(path)
    if perturb:
        perturb_embedding(tensors, perturb, seed)
    tokens, bos = tokenize(path, text_path)
    n_chunk = len(tokens) // n_ctx if max_chunks < 0 else min(len(tokens) // n_ctx, max_chunks)
    chunks = np.asarray(tokens[: n_chunk * n_ctx], np.int64).reshape(n_chunk, n_ctx)
    first = n_ctx // 2
    scored = np.arange(first, n_ctx - 1)
    nll, kept = [], []
    for i, chunk in enumerate(chunks):
        fed = chunk[:-1].copy()
        if bos is not None:
            fed[0] = bos
        logits = forward(fed, scored, hp, tensors, variant)
        nll.append(-log_softmax(logits)[np.arange(len(scored)), chunk[scored + 1]])
        if i < keep_logits:
            kept.append(logits.astype(np.float32))
        if partial:
            done = np.concatenate(nll)
            np.savez(partial, nll=done, target=chunks[: i + 1, first + 1 :].reshape(-1).astype(np.int32),
                     chunk=np.repeat(np.arange(i + 1, dtype=np.int32), len(scored)))
    out = {"nll": np.concatenate(nll), "target": chunks[:, first + 1 :].reshape(-1).astype(np.int32),
           "chunk": np.repeat(np.arange(n_chunk, dtype=np.int32), len(scored))}
    if kept:
        out["logits"] = np.concatenate(kept)
    return out


def main() -> None:
    ap = scoring_parser(__doc__)
    ap.add_argument("--variant", choices=VARIANTS, default="exact")
    ap.add_argument("--perturb", type=float, default=0.0, metavar="EPS",
                    help="multiply the embedding values by 1 + EPS * N(0, 1) (a sensitivity test)")
    ap.add_argument("--seed", type=int, default=0, help="the seed of --perturb's noise")
    ap.add_argument("--partial", metavar="FILE", help="write the NLLs of the chunks done so far to FILE after each")
    args = ap.parse_args()
    started = time.perf_counter()
    out = score(args.model, args.text, n_ctx=args.ctx_size, variant=args.variant, keep_logits=args.keep_logits,
                max_chunks=args.chunks, perturb=args.perturb, seed=args.seed, partial=args.partial)
    save_run(args.output, out, f"f64/{args.variant}", started)


if __name__ == "__main__":
    main()
