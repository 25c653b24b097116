"""Attention of query rows over an f16 KV cache, as CUDA C, in the reference's order.

Owns: the attention kernel for an f16 cache (keys and values as f16 bits, a visibility mask per row
and key, which the runtime derives from the pass's row table). Does not own: the cache's layout or
which keys a row sees (the runtime: common/pass_caches.py), or the meaning (numerics.attention_online).

The kernel reads the number of mask columns from device memory (meta[0]), each row's mask at a
fixed stride (`mask_stride`, a literal in its text: the cache's capacity) and each row's cache from
kv_rows (its first row in the device's pool of caches, common/kv_mirror.py: key j of row r is pool
row kv_rows[r][1] + j), so one launch replays in a CUDA graph for every pass, and rows of several
sequences (Convoy) share a launch, each over its own cache. Keys at or past meta[0] are never read,
whatever the buffers hold there.

The reference is ggml's CPU flash attention for one query row, and this kernel follows it exactly:
one warp per (row, head); lane t holds head values 32i + t. Per visible key, in cache order:

* the score is ggml_vec_dot_f16's order: its 64 float lanes are chains a_t, a_{t+32} held by lane t
  (one fma per chunk of 64, exact products of f16 values), then (acc0+acc2)+(acc1+acc3) and
  _mm512_reduce_add_ps, which are the butterfly a_t + a_{t+32}, then lane ^ 16, 8, 4, 2, 1;
* the online softmax with the C library's expf (glibc's algorithm in double precision, prelude.py),
  the f16 accumulator rounded after every step (scale: f32 product rounded to f16; add: an fma
  rounded to f16), S = fma(S, ms, vs), and out = acc * (1/S).

Because the reference's softmax is one chain over the keys, the kernel does not split the keys
(flash-decoding's split-KV would need a split order defined in the reference first; see
docs/devices.md). Soft-capping needs the C library's tanhf and is not rendered yet.
"""

from __future__ import annotations

from kinetic.codegen.cuda import pointwise
from kinetic.codegen.cuda.kernel import Kernel, Param, f32_literal, name_tag

HEADS_PER_BLOCK = 4  # one warp per head


def _check(n_head: int, n_kv_head: int, head_dim: int, softcap: float, mask_stride: int, most: int = 0) -> None:
    if softcap:
        raise NotImplementedError("attention soft-capping (the reference calls the C library's tanhf)")
    if head_dim % 64 or (most and head_dim > most):
        limit = f" up to {most}" if most else ""
        raise NotImplementedError(f"attention head size {head_dim}: only multiples of 64{limit} (ggml's whole chunks)")
    if n_head % n_kv_head:
        raise ValueError(f"{n_head} heads do not share {n_kv_head} kv heads evenly")
    if mask_stride < 1:
        raise ValueError(f"attention mask stride {mask_stride}: a mask row holds at least one key")


def _load_q(per_lane: int, spaces: int) -> str:
    """Lane t's query values 32i + t of the head at `qrow`, rounded to f16 (ggml's vec_dot_f16 input)."""
    return "\n".join(f"{' ' * spaces}L(q{i}) = k_h2f(k_f2h(LD(float, q, qrow + {32 * i} + LANE_ID)));"
                     for i in range(per_lane))


def _score(per_lane: int, spaces: int) -> str:
    """Lane t's part of the score of the key at `krow` in ggml_vec_dot_f16's order (two chains per
    lane over the chunks of 64, then their sum), into L(score); the butterfly follows in uniform code."""
    pad = " " * spaces
    dot = "\n".join(f"{pad}a0 = k_fma(L(q{2 * c}), k_h2f(LD(u16, keys, krow + {64 * c} + LANE_ID)), a0);\n"
                    f"{pad}a1 = k_fma(L(q{2 * c + 1}), k_h2f(LD(u16, keys, krow + {64 * c + 32} + LANE_ID)), a1);"
                    for c in range(per_lane // 2))
    return f"{pad}float a0 = 0.0f, a1 = 0.0f;\n{dot}\n{pad}L(score) = k_add(a0, a1);"


def _score_sum(spaces: int) -> str:
    return "".join(f"{' ' * spaces}SHFL_XOR(other, score, {m}); LANES {{ L(score) = k_add(L(score), L(other)); }}\n"
                   for m in (16, 8, 4, 2, 1))


def attention(n_head: int, n_kv_head: int, head_dim: int, scale: float, softcap: float = 0.0, *,
              mask_stride: int) -> Kernel:
    """out f32 [rows, n_head*head_dim] from q f32 [rows, n_head*head_dim], keys and values as f16 bits
    u16 [pool rows, n_kv_head*head_dim] (the pool of caches), mask u8 [rows, mask_stride] (1: the row
    sees its cache's key), meta i32 [n_keys, 0] and kv_rows i32 [rows, 2] (per row the pool row its
    key was stored at, kv_store's, and the first pool row of its cache, read here: key j is pool
    row base + j). Keys past mask_stride are seen by no row (n_keys above it counts as mask_stride)."""
    _check(n_head, n_kv_head, head_dim, softcap, mask_stride)
    per_lane = head_dim // 32
    params = (Param("q", "const float*"), Param("keys", "const u16*"), Param("values", "const u16*"),
              Param("mask", "const u8*"), Param("meta", "const int*"), Param("kv_rows", "const int*"),
              Param("out", "float*"))
    decl = "".join(f"  LANE(float, q{i});\n  LANE(float, acc{i});\n" for i in range(per_lane))
    lanes = range(per_lane)
    load_q = _load_q(per_lane, 6)
    zero = " ".join(f"L(acc{i}) = 0.0f;" for i in range(per_lane))
    update = "\n".join(
        f"        L(acc{i}) = k_h2f(k_f2h(k_fma(k_h2f(LD(u16, values, krow + {32 * i} + LANE_ID)), vs,\n"
        f"                                      k_h2f(k_f2h(k_mul(L(acc{i}), ms))))));" for i in range(per_lane))
    store = "\n".join(f"      ST(float, out, qrow + {32 * i} + LANE_ID, k_mul(L(acc{i}), inv));" for i in lanes)
    body = f"""\
{decl}  LANE(float, score);
  LANE(float, other);
  LANE(float, m);
  LANE(float, s_sum);
  enum {{ NH = {n_head}, GROUP = {n_head // n_kv_head}, HD = {head_dim}, KVW = {n_kv_head * head_dim},
         MASK_STRIDE = {mask_stride} }};
BODY
  const int head = BX * {HEADS_PER_BLOCK} + WARP;
  const int cached = LD(int, meta, 0);
  const int n_keys = cached < MASK_STRIDE ? cached : MASK_STRIDE;
  const long cache_row = LD(int, kv_rows, 2 * BY + 1);  // the row's cache in the pool
  if (head < NH) {{
    LANES {{
      const long qrow = (long)BY * NH * HD + (long)head * HD;
{load_q}
      {zero}
      L(m) = k_bits2f(0xff800000u);
      L(s_sum) = 0.0f;
    }}
    for (int j = 0; j < n_keys; ++j) {{
      if (!LD(u8, mask, (long)BY * MASK_STRIDE + j)) continue;
      LANES {{
        const long krow = (cache_row + j) * KVW + (long)(head / GROUP) * HD;
{_score(per_lane, 8)}
      }}
{_score_sum(6)}\
      LANES {{
        const long krow = (cache_row + j) * KVW + (long)(head / GROUP) * HD;
        const float s = k_mul(L(score), {f32_literal(scale)});
        const bool new_max = s > L(m);
        const float e = k_expf_libc(new_max ? k_sub(L(m), s) : k_sub(s, L(m)));
        const float ms = new_max ? e : 1.0f, vs = new_max ? 1.0f : e;
        if (new_max) L(m) = s;
{update}
        L(s_sum) = k_fma(L(s_sum), ms, vs);
      }}
    }}
    LANES {{
      const long qrow = (long)BY * NH * HD + (long)head * HD;
      const float inv = L(s_sum) == 0.0f ? 0.0f : k_div(1.0f, L(s_sum));
{store}
    }}
  }}
"""
    name = f"attention_h{n_head}_kv{n_kv_head}_d{head_dim}_s{name_tag(scale)}_m{mask_stride}"
    return Kernel(name, "attention", 32 * HEADS_PER_BLOCK, -(-n_head // HEADS_PER_BLOCK), params, body)


PAR_WARPS = 8  # warps per block of attention_rows
PAR_THREADS = 32 * PAR_WARPS


def attention_rows(n_head: int, n_kv_head: int, head_dim: int, scale: float, softcap: float = 0.0, *,
                   mask_stride: int, quantize: str | None = None) -> Kernel:
    """attention() with the keys' work in parallel: one warp per (row, head) leaves the GPU idle in a
    decode step, and in any pass each key costs it a chain of dependent steps. Here one block of 8
    warps per (row, head), the same values in three phases, with a scratch f32 [rows, n_head, 2,
    mask_stride]:

    1. every key's score, the 8 warps on different keys (each score in attention()'s order);
    2. the softmax factors of every key in parallel: the running maximum before key j is the maximum
       of the earlier visible scores, which each thread gets for its segment of keys from the other
       segments' maxima (max is exact, whatever the grouping), so `new_max`, expf's argument and
       (ms, vs) are attention()'s values, key by key;
    3. the accumulation, the one chain that stays sequential: thread d < head_dim runs value d's
       f16 chain over the keys in order, and every thread the sum S (the same operations as before).

    The output is attention()'s bit for bit; the per-key chain is an fma and two roundings instead of
    a dot product, a butterfly and expf. quantize ("q8_0" or "q8_1"): also writes the output row
    quantized for the output projection (xq, xd, Q8_1's xs), warp w the head's values 32w..32w+31,
    one block, as quantize.quantize(fmt, n_head * head_dim) gives them from `out`; "q8_k" for heads
    of 256 values, each block's head one super-block (pointwise.q8_k_reduce / q8_k_store)."""
    _check(n_head, n_kv_head, head_dim, softcap, mask_stride, most=PAR_THREADS)
    per_lane = head_dim // 32
    params = (Param("q", "const float*"), Param("keys", "const u16*"), Param("values", "const u16*"),
              Param("mask", "const u8*"), Param("meta", "const int*"), Param("kv_rows", "const int*"),
              Param("scratch", "float*"),
              Param("out", "float*"), *pointwise.quantized_params(quantize))
    decl = "".join(f"  LANE(float, q{i});\n" for i in range(per_lane))
    width, shared = n_head * head_dim, 4 * PAR_THREADS
    if quantize == "q8_k" and head_dim != PAR_THREADS:
        raise NotImplementedError(f"a Q8_K output row needs heads of {PAR_THREADS} values (one super-block)")
    if quantize == "q8_k":
        decl += pointwise.Q8K_LANES + f"  enum {{ QK = {width}, QNB = {width // 256} }};\n"
        shared += pointwise.Q8K_SHARED_BYTES
    elif quantize:
        decl += pointwise.QUANT_LANES[quantize] + f"  enum {{ QK = {width}, QNB = {width // 32} }};\n"
    # uniform values each stretch between barriers declares again, in a block of its own (the emulation
    # runs the stretches apart; on CUDA they share one scope)
    setup = """\
  const int head = BX;
  const int cached = LD(int, meta, 0);
  const int n_keys = cached < MASK_STRIDE ? cached : MASK_STRIDE;
  const int mrow = BY * MASK_STRIDE;  // rows x capacity stays under 2^31 (the mask's own size)
  const long base = ((long)BY * NH + head) * 2 * MASK_STRIDE;  // scores, then ms; vs at + MASK_STRIDE
  const int cache_row = LD(int, kv_rows, 2 * BY + 1);  // the row's cache in the pool
"""
    if quantize == "q8_k":  # the block's 256 values are one super-block: a barrier between its two halves
        quantized = (pointwise.q8_k_reduce() + "  }\n  BARRIER();\n  {\n" + setup
                     + pointwise.q8_k_store("(long)BY * QK + (long)head * HD + TID", "(long)BY * QNB + head"))
    elif quantize:
        quantized = f"""\
  if (WARP < HD / 32) {{
    const int c = head * (HD / 32) + WARP;
{pointwise.quantize_block(quantize)}  }}
"""
    else:
        quantized = ""
    body = f"""\
{decl}  LANE(float, score);
  LANE(float, other);
  SHARED(float, segmax, {PAR_THREADS});
  enum {{ NH = {n_head}, GROUP = {n_head // n_kv_head}, HD = {head_dim}, KVW = {n_kv_head * head_dim},
         MASK_STRIDE = {mask_stride}, THREADS = {PAR_THREADS} }};
BODY
  {{
{setup}  LANES {{
    const long qrow = (long)BY * NH * HD + (long)head * HD;
{_load_q(per_lane, 4)}
  }}
  for (int j = WARP; j < n_keys; j += {PAR_WARPS}) {{
    if (!LD(u8, mask, mrow + j)) continue;
    LANES {{
      const long krow = ((long)cache_row + j) * KVW + (long)(head / GROUP) * HD;
{_score(per_lane, 6)}
    }}
{_score_sum(4)}\
    LANES {{ if (LANE_ID == 0) ST(float, scratch, base + j, k_mul(L(score), {f32_literal(scale)})); }}
  }}
  }}
  BARRIER();
  {{
{setup}  LANES {{
    const int seg = (n_keys + THREADS - 1) / THREADS;
    const int first = TID * seg, last = first + seg < n_keys ? first + seg : n_keys;
    float top = k_bits2f(0xff800000u);
    for (int j = first; j < last; ++j) {{
      if (!LD(u8, mask, mrow + j)) continue;
      const float s = LD(float, scratch, base + j);
      if (s > top) top = s;
    }}
    segmax[TID] = top;
  }}
  }}
  BARRIER();
  {{
{setup}  LANES {{
    const int seg = (n_keys + THREADS - 1) / THREADS;
    const int first = TID * seg, last = first + seg < n_keys ? first + seg : n_keys;
    float m = k_bits2f(0xff800000u);
    for (int u = 0; u < TID; ++u) {{
      if (segmax[u] > m) m = segmax[u];
    }}
    for (int j = first; j < last; ++j) {{
      if (!LD(u8, mask, mrow + j)) continue;
      const float s = LD(float, scratch, base + j);
      const bool new_max = s > m;
      const float e = k_expf_libc(new_max ? k_sub(m, s) : k_sub(s, m));
      if (new_max) m = s;
      ST(float, scratch, base + j, new_max ? e : 1.0f);
      ST(float, scratch, base + MASK_STRIDE + j, new_max ? 1.0f : e);
    }}
  }}
  }}
  BARRIER();
  {{
{setup}  LANES {{
    if (TID < HD) {{
      const long vcol = (long)(head / GROUP) * HD + TID;
      float acc = 0.0f, s_sum = 0.0f;
      for (int j = 0; j < n_keys; ++j) {{
        if (!LD(u8, mask, mrow + j)) continue;
        const float ms = LD(float, scratch, base + j), vs = LD(float, scratch, base + MASK_STRIDE + j);
        const float v = k_h2f(LD(u16, values, ((long)cache_row + j) * KVW + vcol));
        acc = k_h2f(k_f2h(k_fma(v, vs, k_h2f(k_f2h(k_mul(acc, ms))))));
        s_sum = k_fma(s_sum, ms, vs);
      }}
      const float inv = s_sum == 0.0f ? 0.0f : k_div(1.0f, s_sum);
      ST(float, out, (long)BY * NH * HD + (long)head * HD + TID, k_mul(acc, inv));
      {"L(qv) = k_mul(acc, inv);" if quantize else ""}
    }}
  }}
{quantized}  }}
"""
    name = f"attention_rows_h{n_head}_kv{n_kv_head}_d{head_dim}_s{name_tag(scale)}_m{mask_stride}"
    name += f"_{quantize}" if quantize else ""
    return Kernel(name, "attention", PAR_THREADS, n_head, params, body, shared_bytes=shared)
