"""The CUDA kernels of the mixture-of-experts ops (docs/moe.md), and the launches a MoE node makes.

Owns: the router kernels `gate` (ggml_soft_max or ggml_sigmoid of a row of router logits),
`select` (a row's top-k experts), `route_weights` (their renormalized, scaled weights), the slot
kernels `slot_rows` (a row copied once per slot, for the gate and up products that share it) and
`expert_gemv` (a GEMV kernel of gemv.py whose weight is the expert its row chose), `weighted_sum`, and
`launches`: the launches of one MoE node on a plan's buffers. Does not own the ops' meaning
(kinetic/ir/moe_reference.py, kinetic/ir/numerics/moe.py), the GEMV and quantizer texts (gemv.py,
quantize.py), buffers (plan.py) or where experts live (kinetic/codegen/common/flywheel.py).

Routing stays on the device, so a pass is still one recording: the chosen experts are written by
`select` as exact small integers in an f32 buffer, and every later kernel reads them from device
memory (kernel.py: whatever changes between passes is read, never passed). The router kernels run one
thread per row (lane 0 of a one-warp block): a router row is a few dozen values, and one thread walks
them in exactly the reference's order (the softmax's max, its blocks of 16 exps summed as
_mm512_reduce_add_ps into a double, its tail by the C library's expf; the weights' sum in a double),
so no order question arises. moe_matmul is a GEMV per (row, slot): slot s of row r is GEMV row
r * n_used + s, reading the quantized copy of its own input and expert ids[r, s]'s bytes of the
stacked weight (`w_all + id * EXPERT_BYTES`); its arithmetic is the plain GEMV's, so each slot equals
the reference's product of that expert alone, and no row reads another's. There is no tiled GEMM for
experts (the rows of a tile may each want another expert): prompts run the GEMV per slot row.
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda import gemv, quantize
from kinetic.codegen.cuda.kernel import Kernel, Param, f32_literal, name_tag
from kinetic.ir.graph import Graph, Node
from kinetic.ir.numerics.moe import WEIGHT_SUM_FLOOR
from kinetic.ir.ops import Op

THREADS = 256  # per block of the per-value kernels (slot_rows, weighted_sum)
ROW_FORMATS = ("q8_0", "q8_1", "q8_k")  # activation formats a quantizer writes (the rest: float rows)
OPS = frozenset({Op.MOE_GATE, Op.MOE_SELECT, Op.MOE_WEIGHTS, Op.MOE_MATMUL, Op.MOE_SUM})


def _one_thread(name: str, params: tuple[Param, ...], enums: str, code: str) -> Kernel:
    """A kernel of one warp per row whose lane 0 computes the whole row (`code`, row BY)."""
    body = f"""\
  enum {{ {enums} }};
BODY
  LANES {{
    if (LANE_ID == 0) {{
{code}
    }}
  }}
"""
    return Kernel(name, "router", 32, 1, params, body)


def gate(n_expert: int, gating: str) -> Kernel:
    """probs f32 [rows, E] from logits f32 [rows, E]: ggml_soft_max (the max; ggml_v_expf on each
    block of 16, each block's 16 values summed as _mm512_reduce_add_ps and added into a double; the
    C library's expf on the tail, each added into the double; times the float of 1 / sum) or
    ggml_sigmoid (1 / (1 + expf(0 - x)))."""
    params = (Param("x", "const float*"), Param("y", "float*"))
    if gating == "sigmoid":
        code = """\
      const long at = (long)BY * E;
      for (int i = 0; i < E; ++i)
        ST(float, y, at + i, k_div(1.0f, k_add(1.0f, k_expf_libc(k_sub(0.0f, LD(float, x, at + i))))));"""
    elif gating == "softmax":
        code = """\
      const long at = (long)BY * E;
      float m = LD(float, x, at);
      for (int i = 1; i < E; ++i) { const float v = LD(float, x, at + i); m = v > m ? v : m; }
      double total = 0.0;
      // a block's _mm512_reduce_add_ps: h8[j] = e[8+j] + e[j], h4[j] = h8[4+j] + h8[j],
      // then (h4[0] + h4[2]) + (h4[1] + h4[3]); one h4 at a time (fewer live registers)
      const auto e = [&](int i) { return k_expf_ggml(k_sub(LD(float, x, at + i), m)); };
      const auto h4 = [&](int lo, int j) {
        return k_add(k_add(e(lo + 12 + j), e(lo + 4 + j)), k_add(e(lo + 8 + j), e(lo + j)));
      };
      for (int lo = 0; lo < BLOCKED; lo += 16) {
        const float even = k_add(h4(lo, 0), h4(lo, 2));
        total = k_dadd(total, (double)k_add(even, k_add(h4(lo, 1), h4(lo, 3))));
      }
      for (int i = BLOCKED; i < E; ++i) total = k_dadd(total, (double)k_expf_libc(k_sub(LD(float, x, at + i), m)));
      const float inv = k_d2f(k_ddiv(1.0, total));
      for (int i = 0; i < E; ++i) {
        const float s = k_sub(LD(float, x, at + i), m);
        ST(float, y, at + i, k_mul(i < BLOCKED ? k_expf_ggml(s) : k_expf_libc(s), inv));
      }"""
    else:
        raise NotImplementedError(f"{gating} gating")
    return _one_thread(f"moe_gate_{gating}_e{n_expert}", params, f"E = {n_expert}, BLOCKED = {n_expert // 16 * 16}",
                       code)


def select(n_expert: int, n_used: int, biased: bool) -> Kernel:
    """ids [rows, k] (exact integers in f32) of each row's k highest scores (probs, plus the bias
    when given: one f32 add), highest first, ties to the lower expert: slot j takes the best expert
    after slot j-1's in that order."""
    params = (Param("p", "const float*"), *((Param("bias", "const float*"),) if biased else ()),
              Param("ids", "float*"))
    score = "k_add(LD(float, p, at + i), LD(float, bias, i))" if biased else "LD(float, p, at + i)"
    code = f"""\
      const long at = (long)BY * E;
      int prev = -1;
      float prev_s = 0.0f;
      for (int j = 0; j < K; ++j) {{
        int best = -1;
        float best_s = 0.0f;
        for (int i = 0; i < E; ++i) {{
          const float s = {score};
          const bool after = prev < 0 || s < prev_s || (s == prev_s && i > prev);
          if (after && (best < 0 || s > best_s)) {{ best = i; best_s = s; }}
        }}
        ST(float, ids, (long)BY * K + j, (float)best);
        prev = best; prev_s = best_s;
      }}"""
    return _one_thread(f"moe_select_e{n_expert}_k{n_used}{'_b' if biased else ''}", params,
                       f"E = {n_expert}, K = {n_used}", code)


def route_weights(n_expert: int, n_used: int, normalize: bool, scale: float) -> Kernel:
    """w f32 [rows, k]: the chosen experts' probabilities; when `normalize`, each divided by their
    sum (a double, in slot order, rounded to f32 and clamped at F16's smallest normal); times
    `scale` unless it is 0 or 1."""
    params = (Param("p", "const float*"), Param("ids", "const float*"), Param("w", "float*"))
    chosen = "LD(float, p, (long)BY * E + (int)LD(float, ids, (long)BY * K + j))"
    total = f"""\
      double sum = 0.0;
      for (int j = 0; j < K; ++j) sum = k_dadd(sum, (double){chosen});
      float total = k_d2f(sum);
      total = total > {f32_literal(WEIGHT_SUM_FLOOR)} ? total : {f32_literal(WEIGHT_SUM_FLOOR)};
""" if normalize else ""
    value = f"k_div({chosen}, total)" if normalize else chosen
    if scale not in (0.0, 1.0):
        value = f"k_mul({value}, {f32_literal(scale)})"
    code = total + f"      for (int j = 0; j < K; ++j) ST(float, w, (long)BY * K + j, {value});"
    tag = f"{'_n' if normalize else ''}{'' if scale in (0.0, 1.0) else '_s' + name_tag(scale)}"
    return _one_thread(f"moe_weights_e{n_expert}_k{n_used}{tag}", params, f"E = {n_expert}, K = {n_used}", code)


def _per_value(name: str, params: tuple[Param, ...], width: int, enums: str, code: str) -> Kernel:
    body = f"""\
  enum {{ W = {width}, {enums} }};
BODY
  LANES {{
    const int i = BX * {THREADS} + TID;
    if (i < W) {{
{code}
    }}
  }}
"""
    return Kernel(name, "pointwise", THREADS, -(-width // THREADS), params, body)


def slot_rows(n_used: int, width: int) -> Kernel:
    """out f32 [rows * k, width]: row r of x f32 [rows, width] copied to rows r*k .. r*k + k-1 (bits kept)."""
    params = (Param("x", "const float*"), Param("out", "float*"))
    code = "      ST(float, out, (long)BY * W + i, LD(float, x, (long)(BY / U) * W + i));"
    return _per_value(f"moe_slot_rows_u{n_used}_w{width}", params, width, f"U = {n_used}", code)


def weighted_sum(n_used: int, width: int) -> Kernel:
    """out f32 [rows, width] = y[slot 0] * w[0] + y[slot 1] * w[1] + ..., each product rounded, added
    in slot order (ggml_mul, then the ggml_add chain), from y f32 [rows, k * width] and w f32 [rows, k]."""
    params = (Param("y", "const float*"), Param("w", "const float*"), Param("out", "float*"))
    code = """\
      const long at = (long)BY * K * W + i;
      float total = k_mul(LD(float, y, at), LD(float, w, (long)BY * K));
      for (int s = 1; s < K; ++s)
        total = k_add(total, k_mul(LD(float, y, at + (long)s * W), LD(float, w, (long)BY * K + s)));
      ST(float, out, (long)BY * W + i, total);"""
    return _per_value(f"moe_sum_k{n_used}_w{width}", params, width, f"K = {n_used}", code)


def expert_bytes(wtype: Q, n_out: int, k: int) -> int:
    """Bytes of one expert's [n_out, k] matrix in a stacked weight as the device holds it (F32 as f32)."""
    block, size = GGML_QUANT_SIZES[wtype]
    return n_out * (k // block) * size


def expert_gemv(wtype: Q, n_expert: int, n_out: int, k: int, *, stride: int | None = None) -> Kernel:
    """gemv.gemv's kernel over a stacked [E, n_out, k] weight: row BY (a slot) reads the expert
    ids[BY] chose, `stride` bytes apart (default: the stack's own, one expert's bytes; Flywheel's
    expert cache: its slot size, experts.py). Parameters: w_all, ids, then the GEMV's activations and y."""
    plain = gemv.gemv(wtype, n_out, k)
    if "BODY\n" not in plain.body or plain.params[0].name != "w":
        raise NotImplementedError(f"the {wtype.name} GEMV's text has no place for an expert's weight")
    stride = expert_bytes(wtype, n_out, k) if stride is None else stride
    pick = f"  const u8* w = w_all + (long)(int)LD(float, ids, BY) * {stride}L;\n"
    body = plain.body.replace("BODY\n", "BODY\n" + pick, 1)
    params = (Param("w_all", "const u8*"), Param("ids", "const float*"), *plain.params[1:])
    return Kernel(f"moe_{plain.name}_e{n_expert}_s{stride}", plain.kind, plain.threads, plain.blocks_x, params, body)


# ---- the renderer's rows and the plan's launches ------------------------------------------------

def render(node: Node, graph: Graph) -> list[Kernel]:
    """The kernels one MoE node launches, in order."""
    a, ins = node.attrs, [graph.node(i) for i in node.inputs]
    if node.op is Op.MOE_GATE:
        return [gate(int(node.type.shape[1]), a.gating)]
    if node.op is Op.MOE_SELECT:
        return [select(int(ins[0].type.shape[1]), a.n_used, len(ins) == 2)]
    if node.op is Op.MOE_WEIGHTS:
        return [route_weights(int(ins[0].type.shape[1]), int(ins[1].type.shape[1]), a.normalize, a.scale)]
    if node.op is Op.MOE_SUM:
        return [weighted_sum(int(ins[1].type.shape[1]), int(node.type.shape[1]))]
    return _matmul_kernels(node, ins)


def _matmul_kernels(node: Node, ins: list[Node]) -> list[Kernel]:
    """[slot_rows when the slots share one input,] [the quantizer of the weight's 8-bit format,] the
    expert GEMV."""
    x, w, ids = ins
    n_expert, n_out, k = (int(d) for d in w.type.shape)
    n_used, wtype = int(ids.type.shape[1]), w.type.ggml_type
    if node.attrs.activations != "q8":
        raise NotImplementedError("float-activation expert matmuls (activations=f32)")
    if wtype not in gemv.ALL:
        raise NotImplementedError(f"{wtype.name} expert weights")
    fmt = gemv.activation_format(wtype)
    kernels = [slot_rows(n_used, k)] if int(x.type.shape[1]) == k and n_used > 1 else []
    kernels += [quantize.quantize(fmt, k)] if fmt in ROW_FORMATS else []
    return kernels + [expert_gemv(wtype, n_expert, n_out, k)]


def launches(node: Node, graph: Graph, kernels: list[Kernel], *, ins: list, out, n: int, weight, take,
             experts=None):
    """(kernel name, rows, args) of one MoE node over n rows: `ins` its inputs' buffers (None for a
    weight), `weight(node_id)` a weight's device buffer, `take(*nbytes)` scratch live as long as the
    node's value. With Flywheel's expert cache (`experts`, experts.py) the chosen experts go through
    its host steps (a callable in place of a kernel name): after moe_select the placement, after
    each expert GEMV the rows of the experts run on the CPU."""
    if experts is not None:
        return experts.launches(node, kernels, ins=ins, out=out, n=n, take=take,
                                plain=lambda: launches(node, graph, kernels, ins=ins, out=out, n=n, weight=weight,
                                                       take=take))
    if node.op is Op.MOE_SELECT:
        bias = (weight(node.inputs[1]),) if len(node.inputs) == 2 else ()
        return [(kernels[0].name, n, (ins[0], *bias, out))]
    if node.op is not Op.MOE_MATMUL:
        return [(kernels[0].name, n, (*ins, out))]
    x, w, ids = (graph.node(i) for i in node.inputs)
    k, n_used = int(w.type.shape[2]), int(ids.type.shape[1])
    rows, src, steps = n * n_used, ins[0], list(kernels)
    result = []
    if steps[0].name.startswith("moe_slot_rows"):
        (copies,) = take(rows * k * 4)
        result.append((steps.pop(0).name, rows, (src, copies)))
        src = copies
    acts = (src,)
    if len(steps) == 2:  # the quantizer: values, scales (and Q8_1's sums) of every slot row
        fmt = gemv.activation_format(w.type.ggml_type)
        block = 256 if fmt == "q8_k" else 32
        sums = (rows * (k // 32) * 4,) if fmt == "q8_1" else ()
        acts = tuple(take(rows * k, rows * (k // block) * 4, *sums))
        result.append((steps.pop(0).name, rows, (src, *acts)))
    result.append((steps[0].name, rows, (weight(node.inputs[1]), ins[2], *acts, out)))
    return result
