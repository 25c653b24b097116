"""Op-level error of the two CPU numerics orders against float64, on a real model's own activations.

Owns: running the float64 ground truth (benchmarks/perplexity_f64.py, variant "actq") over one chunk
while capturing every matmul's input and every layer's rotated q, k, v; then, on exactly those
inputs, Kinetic's reference arithmetic (kinetic.ir.numerics: `matmul` with order None = ggml's and
"block_chain" = the fast order; `attention_online` in "key_chain_f16" and "key_chain_f16_acc32")
against the float64 result of the same quantized inputs (the same Q8_0/Q8_1 activations, the same f16
q/k/v; only the float arithmetic differs). Prints per op kind the relative RMS error of each order
(||y - y64|| / ||y64||), the share of outputs where each order is the closer one, and for scale the
error activation quantization itself makes (the float64 dot of quantized against unquantized inputs). This separates
accumulation error from activation quantization: an extra rounding in one order shows up here as a
larger error, whatever the perplexity does. Does not own the model or the orders.

    python benchmarks/numerics_op_error.py MODEL.gguf TEXT --layers 0,1,15,29
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np
import perplexity_f64 as f64  # beside this script: `python benchmarks/X.py` puts the folder on sys.path
from gguf import GGUFReader

from kinetic.ir.numerics.attention import attention_online
from kinetic.ir.numerics.dots import matmul as kinetic_matmul
from kinetic.ir.numerics.weights import DequantizedWeight

MATMULS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def relative_rms(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sqrt(((y.astype(np.float64) - ref) ** 2).sum() / (ref**2).sum()))


def capture_chunk(path: str, text: str, n_ctx: int) -> tuple[f64.Hparams, dict, dict]:
    hp, tensors, _ = f64.load(path)
    tokens, bos = f64.tokenize(path, text)
    fed = np.asarray(tokens[: n_ctx - 1], np.int64)
    if bos is not None:
        fed[0] = bos
    capture: dict = {}
    f64.forward(fed, np.arange(n_ctx // 2, n_ctx - 1), hp, tensors, "actq", capture)
    return hp, tensors, capture


def matmul_errors(path: str, tensors: dict, capture: dict, layers: list[int]) -> dict[str, list[float]]:
    raw = {t.name: t for t in GGUFReader(path).tensors}
    errors: dict[str, list[float]] = {"ggml": [], "fast": [], "fast_closer": [], "quantization": []}
    names = [(i, n) for i in layers for n in MATMULS] + [(-1, "token_embd.weight")]
    for layer, name in names:
        gname = f"blk.{layer}.{name}.weight" if layer >= 0 else name
        x = capture[(layer, name if layer >= 0 else gname)].astype(np.float32)
        t = raw[gname]
        w = DequantizedWeight(np.asarray(t.data).reshape(t.data.shape[0], -1), t.tensor_type)
        y64 = f64.matmul(x.astype(np.float64), tensors[gname], "actq")
        y_ggml, y_fast = kinetic_matmul(x, w), kinetic_matmul(x, w, order="block_chain")
        errors["quantization"].append(relative_rms(y64, x.astype(np.float64) @ tensors[gname].w.T))
        errors["ggml"].append(relative_rms(y_ggml, y64))
        errors["fast"].append(relative_rms(y_fast, y64))
        e_g, e_f = np.abs(y_ggml - y64), np.abs(y_fast - y64)
        errors["fast_closer"].append(float(np.mean(e_f < e_g) / max(np.mean(e_f != e_g), 1e-12)))
        print(f"  {gname:28s} rel. RMS error  ggml {errors['ggml'][-1]:.3e}  fast {errors['fast'][-1]:.3e}"
              f"  fast closer on {100 * errors['fast_closer'][-1]:.0f} % of the outputs where they differ"
              f"  (activation quantization {errors['quantization'][-1]:.2e})")
    return errors


def attention_errors(hp: f64.Hparams, capture: dict, layers: list[int]) -> None:
    for layer in layers:
        q, k, v = (f64._round_f16(a) for a in capture[(layer, "qkv")])
        y64 = f64.attention(q, k, v, hp, "exact")  # already f16-rounded: exact softmax, float64 sums
        n = len(q)
        visible = np.tril(np.ones((n, n), bool))
        res = {}
        for order in ("key_chain_f16", "key_chain_f16_acc32"):
            a = SimpleNamespace(n_head=hp.n_head, n_kv_head=hp.n_kv_head, head_dim=hp.head_dim,
                                scale=float(np.float32(1 / np.sqrt(hp.head_dim))), softcap=0.0, order=order)
            res[order] = attention_online(q.reshape(n, -1).astype(np.float32), k.reshape(n, -1).astype(np.float16),
                                          v.reshape(n, -1).astype(np.float16), visible, a)
        print(f"  layer {layer:2d} attention rel. RMS error  ggml (f16 acc) "
              f"{relative_rms(res['key_chain_f16'], y64):.3e}  fast (f32 acc) "
              f"{relative_rms(res['key_chain_f16_acc32'], y64):.3e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("-c", "--ctx-size", type=int, default=128)
    ap.add_argument("--layers", default="0,1,15,29")
    args = ap.parse_args()
    layers = [int(i) for i in args.layers.split(",")]
    hp, tensors, capture = capture_chunk(args.model, args.text, args.ctx_size)
    print("matmuls (Kinetic's reference in each order against float64 on the same quantized activations):")
    errs = matmul_errors(args.model, tensors, capture, layers)
    print(f"  geometric mean rel. error: ggml {np.exp(np.mean(np.log(errs['ggml']))):.3e}, "
          f"fast {np.exp(np.mean(np.log(errs['fast']))):.3e}; activation quantization's own error "
          f"{np.exp(np.mean(np.log(errs['quantization']))):.3e}")
    print("attention (Kinetic's reference in each order against float64 on the same f16 q, k, v):")
    attention_errors(hp, capture, layers)


if __name__ == "__main__":
    main()
