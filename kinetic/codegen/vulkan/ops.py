"""Vulkan's kernels by op, rendered once per device, and single ops run from numpy arrays (`VulkanOps`).

Owns: the kernel cache (each kernel's cache key and renderer named once, in the `*_kernel` methods
the whole-model table kinetic/codegen/vulkan/kernels.py also calls), the grid of a dispatch, the
dispatches of a quantized matmul (the activation quantizer, then the matvec), and the op-level
entries the kernel tests call: upload the inputs, record the op's dispatches into one command
buffer, read the result back. Does not own the arithmetic (the renderers), which node gets which
kernel (kernels.py: KERNELS) nor a pass's buffers (recorder.py, planned by common/buffers.py).
"""

from __future__ import annotations

import struct

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.vulkan import (
    attention,
    elementwise,
    embed,
    gather,
    layer_norm,
    matvec,
    matvec_f32,
    matvec_float,
    matvec_k,
    norm,
    rope,
)
from kinetic.codegen.vulkan.device import Dispatch, Kernel, Unsupported, VulkanDevice, VulkanError
from kinetic.ir import numerics
from kinetic.ir.quants import QUANT_TYPES

F32 = np.float32
SUPPORTED_WEIGHTS = matvec.SUPPORTED + matvec_k.SUPPORTED + matvec_float.SUPPORTED + matvec_f32.SUPPORTED


def check_weight_type(wtype: Q) -> None:
    """Refuse a weight type without a Vulkan matmul kernel, saying what is supported."""
    if wtype not in SUPPORTED_WEIGHTS:
        names = ", ".join(t.name for t in SUPPORTED_WEIGHTS)
        raise Unsupported(f"{wtype.name} weights have no Vulkan matmul kernel yet (supported: {names}); "
                          "this matmul must run on another device")


class VulkanOps:
    """Op-level execution on one device; kernels are rendered once per (op, shape, attributes)."""

    def __init__(self, device: VulkanDevice, f64_norm: bool | None = None, use_subgroups: bool = True):
        self.device = device
        self.target = device.target
        self.f64_norm = device.caps.shader_float64 if f64_norm is None else f64_norm
        self.use_subgroups = use_subgroups
        self._kernels: dict[tuple, Kernel] = {}
        self._gelu_table = None
        self._expf_table = None

    def kernel(self, key: tuple, render) -> Kernel:
        if key not in self._kernels:
            self._kernels[key] = render()
        return self._kernels[key]

    def grid(self, groups: int) -> tuple[int, int, int]:
        """A 2-D grid of at least `groups` workgroups, rows of at most the device's x limit."""
        limit = self.device.caps.max_workgroup_count[0]
        return (min(groups, limit), -(-groups // limit), 1) if groups else (1, 1, 1)

    # ---- each kernel's key and renderer -------------------------------------------------------
    def elementwise_kernel(self, op: str, factor: float = 1.0) -> Kernel:
        return self.kernel(("elementwise", op, factor if op in ("scale", "softcap") else None),
                           lambda: elementwise.render_elementwise(self.target, op, factor))

    def add_bias_kernel(self, width: int) -> Kernel:
        return self.kernel(("add_bias", width), lambda: elementwise.render_add_bias(width))

    def rms_norm_kernel(self, width: int, group: int, eps: float, weight_len: int) -> Kernel:
        f64 = self.f64_norm
        return self.kernel(("rms_norm", width, group, float(eps), weight_len, f64),
                           lambda: norm.render_rms_norm(self.target, width, group, eps, weight_len, f64))

    def layer_norm_kernel(self, width: int, eps: float, weighted: bool) -> Kernel:
        if not self.f64_norm:  # the mean is a float64 chain (layer_norm.py)
            raise Unsupported("layer_norm needs float64 shaders (shaderFloat64), which this device lacks")
        return self.kernel(("layer_norm", width, float(eps), weighted),
                           lambda: layer_norm.render_layer_norm(width, eps, weighted))

    def rope_kernel(self, n_head: int, head_dim: int, n_rot: int, neox: bool) -> Kernel:
        return self.kernel(("rope", n_head, head_dim, n_rot, neox),
                           lambda: rope.render_rope(self.target, n_head, head_dim, n_rot, neox))

    def attention_kernel(self, a) -> Kernel:
        return self.kernel(("attention", a.n_head, a.n_kv_head, a.head_dim, float(a.scale), float(a.softcap)),
                           lambda: attention.render_attention(self.target, a.n_head, a.n_kv_head, a.head_dim,
                                                              a.scale, a.softcap))

    def kv_store_kernel(self, width: int) -> Kernel:
        return self.kernel(("kv_store", width), lambda: gather.render_kv_store(width))

    def embed_q8_0_kernel(self, width: int) -> Kernel:
        return self.kernel(("embed_q8_0", width), lambda: gather.render_embed_q8_0(width))

    def embed_kernel(self, wtype: Q, width: int) -> Kernel:
        """The lookup from a table of `wtype` (Q8_0, the K-quants, F16, BF16: embed.SUPPORTED)."""
        if wtype is Q.Q8_0:
            return self.embed_q8_0_kernel(width)
        return self.kernel(("embed", wtype, width), lambda: embed.render_embed(wtype, width))

    def take_rows_kernel(self, width: int) -> Kernel:
        return self.kernel(("take_rows", width), lambda: gather.render_take_rows(width))

    def columns_kernel(self, width: int, start: int, count: int) -> Kernel:
        return self.kernel(("columns", width, start, count), lambda: gather.render_columns(width, start, count))

    def place_columns_kernel(self, count: int, total: int) -> Kernel:
        return self.kernel(("place_columns", count, total), lambda: gather.render_place_columns(count, total))

    def gelu_table(self) -> np.ndarray:
        """ggml's f16 GELU table as f32 (what the gelu kernels read)."""
        if self._gelu_table is None:
            self._gelu_table = numerics.gelu_table().astype(F32)
        return self._gelu_table

    def expf_table(self):
        """glibc's expf table on the device (uploaded once)."""
        if self._expf_table is None:
            self._expf_table = self.device.upload(attention.expf_table_words())
        return self._expf_table

    # ---- quantized matmul ---------------------------------------------------------------------
    def upload_weight(self, raw: np.ndarray, wtype: Q):
        """A weight's raw GGUF bytes [n_out, row_bytes] on the device, refused with the reason when
        the type has no kernel or the tensor exceeds one binding (the model runner splits it first)."""
        check_weight_type(wtype)
        raw = np.ascontiguousarray(raw)
        raw = raw if raw.dtype == np.uint8 else raw.view(np.uint8)  # F16 values: their bytes
        limit = self.device.caps.max_storage_buffer_range
        if raw.nbytes + 16 > limit:
            raise VulkanError(f"a {raw.nbytes}-byte weight exceeds one binding (maxStorageBufferRange {limit}); "
                              "splitting weights across bindings is not implemented yet")
        padded = np.zeros(-(-(raw.nbytes + 4) // 4) * 4, np.uint8)  # room for the last straddling read
        padded[: raw.nbytes] = raw.reshape(-1)
        return self.device.upload(padded)

    def matmul_dispatches(self, xbuf, ybuf, wbuf, wtype: Q, rows: int, k: int, n_out: int, alloc,
                          expert_ids=None) -> list[Dispatch]:
        """The dispatches of y f32 [rows, n_out] = x f32 [rows, K] @ w.T: the activation quantizer,
        then the matvec. Their three scratch buffers come from alloc(slot, nbytes) (the caller owns
        them). With `expert_ids` (u32 [rows]), w is a stack of experts' [n_out, K] matrices and row r
        is multiplied by expert expert_ids[r]'s (matvec.expert_row; moe_matmul, vulkan/moe.py)."""
        check_weight_type(wtype)
        experts = expert_ids is not None
        ids = [expert_ids] if experts else []
        fmt = numerics.activation_format(wtype)  # "q8_0", "q8_1" (Q8_0 with sums), "q8_k", "f16" or "bf16"
        if wtype in matvec_f32.SUPPORTED:  # no quantizer: the f32 rows as they are
            mv = self.kernel(("matvec_f32", n_out, k, experts),
                             lambda: matvec_f32.render_matvec_f32(self.target, n_out, k, experts))
            return [Dispatch(mv, [wbuf, xbuf, ybuf, *ids], (-(-n_out // matvec_f32.OUTPUTS_PER_GROUP), rows, 1))]
        if wtype in matvec_float.SUPPORTED:  # no quantizer: the kernel rounds the f32 rows itself
            f64 = self.device.caps.shader_float64
            mv = self.kernel(("matvec_float", wtype, n_out, k, f64, experts),
                             lambda: matvec_float.render_matvec_float(self.target, wtype, n_out, k, f64, experts))
            return [Dispatch(mv, [wbuf, xbuf, ybuf, *ids], (-(-n_out // matvec_float.OUTPUTS_PER_GROUP), rows, 1))]
        block = GGML_QUANT_SIZES[Q.Q8_K if fmt == "q8_k" else Q.Q8_0][0]  # values per activation block
        if k % block:
            raise Unsupported(f"matmul: K = {k} is not a multiple of {block} for {wtype.name}")
        nblocks = rows * k // block
        qbuf, dbuf = alloc(0, rows * k), alloc(1, nblocks * 4)
        if fmt == "q8_k":
            quant = self.kernel(("quantize_k",), matvec_k.render_quantize_q8_k)
            mv = self.kernel(("matvec_k", wtype, n_out, k, self.use_subgroups, experts),
                             lambda: matvec_k.render_matvec_k(self.target, wtype, n_out, k, self.use_subgroups,
                                                              experts))
            extra = alloc(2, rows * k // 16 * 4)  # Q8_K sums of 16
            qargs, margs = [xbuf, qbuf, dbuf, extra], [wbuf, qbuf, dbuf, extra, ybuf]
            quant_groups = self.grid(-(-nblocks // matvec_k.QUANT_WORKGROUP))
        else:
            with_sums = fmt == "q8_1"
            quant = self.kernel(("quantize", with_sums), lambda: matvec.render_quantize_q8(with_sums))
            mv = self.kernel(("matvec", wtype, n_out, k, self.use_subgroups, experts),
                             lambda: matvec.render_matvec(self.target, wtype, n_out, k, self.use_subgroups, experts))
            extra = alloc(2, nblocks * 4)  # Q8_1 sums
            qargs = [xbuf, qbuf, dbuf] + ([extra] if with_sums else [])
            margs = [wbuf, qbuf, dbuf] + ([extra] if with_sums else []) + [ybuf]
            quant_groups = self.grid(-(-nblocks // matvec.QUANT_WORKGROUP))
        return [Dispatch(quant, qargs, quant_groups, struct.pack("<I", nblocks)),
                Dispatch(mv, [*margs, *ids], (-(-n_out // matvec.ROWS_PER_GROUP), rows, 1))]

    # ---- single ops from numpy arrays (the kernel tests) ---------------------------------------
    def _run(self, kernel: Kernel, arrays: list[np.ndarray], out_shape, groups: int, push: bytes = b""):
        dev = self.device
        bufs = [dev.upload(np.ascontiguousarray(a)) for a in arrays]
        out = dev.buffer(int(np.prod(out_shape)) * 4)
        try:
            dev.run([Dispatch(kernel, [*bufs, out], self.grid(groups), push)])
            return out.read(F32, int(np.prod(out_shape))).reshape(out_shape)
        finally:
            for b in [*bufs, out]:
                dev.free(b)

    def elementwise(self, op: str, *xs: np.ndarray, factor: float = 1.0) -> np.ndarray:
        k = self.elementwise_kernel(op, factor)
        arrays = [np.asarray(x, F32) for x in xs]
        if op in ("gelu", "geglu"):
            arrays.insert(len(xs), self.gelu_table())
        n = arrays[0].size
        return self._run(k, arrays, arrays[0].shape, -(-n // elementwise.WORKGROUP), struct.pack("<I", n))

    def rms_norm(self, x: np.ndarray, eps: float, group: int = 0, weight: np.ndarray | None = None) -> np.ndarray:
        """f32 [rows, width] -> f32 [rows, width], as the interpreter's rms_norm (weight optional)."""
        rows, width = x.shape
        g = group or width
        k = self.rms_norm_kernel(width, g, eps, 0 if weight is None else weight.size)
        arrays = [np.asarray(x, F32)] + ([] if weight is None else [np.asarray(weight, F32).reshape(-1)])
        return self._run(k, arrays, (rows, width), rows * (width // g))

    def rope(self, x: np.ndarray, positions: np.ndarray, a) -> np.ndarray:
        """Rotary embedding of f32 [rows, n_head*head_dim] at the given positions, as a RopeAttrs `a`
        says (its scaling in the cos/sin tables)."""
        rows, n_head, head_dim = x.shape[0], a.n_head, a.head_dim
        cos, sin = numerics.rope_cos_sin(np.asarray(positions), a.rotary)
        k = self.rope_kernel(n_head, head_dim, a.n_rot, a.neox)
        n = rows * n_head * (head_dim // 2)
        return self._run(k, [np.asarray(x, F32), cos, sin], x.shape, -(-n // rope.WORKGROUP), struct.pack("<I", rows))

    def matmul(self, x: np.ndarray, raw: np.ndarray, wtype: Q, weight_buffer=None) -> np.ndarray:
        """x f32 [rows, K] @ w.T for raw quantized w [n_out, row_bytes]: f32 [rows, n_out], with the
        activations quantized to Q8_0 / Q8_1 / Q8_K on the device first (numerics.matmul's default
        path), both dispatches in one command buffer."""
        check_weight_type(wtype)
        rows, k = x.shape
        n_out = raw.shape[0]
        dev = self.device
        wbuf = weight_buffer or self.upload_weight(raw, wtype)
        xbuf, ybuf = dev.upload(np.asarray(x, F32)), dev.buffer(rows * n_out * 4)
        scratch = []

        def alloc(_slot: int, nbytes: int):
            scratch.append(dev.buffer(nbytes))
            return scratch[-1]

        try:
            dev.run(self.matmul_dispatches(xbuf, ybuf, wbuf, wtype, rows, k, n_out, alloc))
            return ybuf.read(F32, rows * n_out).reshape(rows, n_out)
        finally:
            for b in (xbuf, ybuf, *scratch) + (() if weight_buffer else (wbuf,)):
                dev.free(b)

    def expf(self, x: np.ndarray) -> np.ndarray:
        """The C library's expf of f32 values, on the device (attention's softmax exponential)."""
        k = self.kernel(("expf",), attention.render_expf_map)
        x = np.asarray(x, F32)
        xbuf, out = self.device.upload(x), self.device.buffer(x.nbytes)
        try:
            self.device.run([Dispatch(k, [xbuf, self.expf_table(), out], self.grid(-(-x.size // attention.WORKGROUP)),
                                      struct.pack("<I", x.size))])
            return out.read(F32, x.size).reshape(x.shape)
        finally:
            self.device.free(xbuf)
            self.device.free(out)

    def attention(self, q: np.ndarray, keys: np.ndarray, vals: np.ndarray, visible: np.ndarray, a) -> np.ndarray:
        """numerics.attention_online on the device: q f32 [rows, n_head*hd], keys/vals f16
        [n, n_kv*hd], visible bool [rows, n]."""
        rows = q.shape[0]
        k = self.attention_kernel(a)
        n = keys.shape[0]
        arrays = [np.asarray(q, F32), np.ascontiguousarray(keys, np.float16).view(np.uint32),
                  np.ascontiguousarray(vals, np.float16).view(np.uint32), np.asarray(visible, np.uint32),
                  np.zeros(rows, np.uint32)]  # every row's cache starts at key 0
        dev = self.device
        bufs = [dev.upload(x) for x in arrays]
        out = dev.buffer(q.size * 4)
        try:
            dev.run([Dispatch(k, [*bufs, self.expf_table(), out], self.grid(rows * a.n_head), struct.pack("<I", n))])
            return out.read(F32, q.size).reshape(q.shape)
        finally:
            for b in [*bufs, out]:
                dev.free(b)

    def kv_store(self, x: np.ndarray, slots: np.ndarray, cache: np.ndarray) -> np.ndarray:
        """cache f16 [cache_rows, width] with rows `slots` replaced by f16(x): the device's store."""
        rows, width = x.shape
        k = self.kv_store_kernel(width)
        dev = self.device
        bufs = [dev.upload(np.asarray(x, F32)), dev.upload(np.asarray(slots, np.uint32))]
        cbuf = dev.upload(np.ascontiguousarray(cache, np.float16).view(np.uint32))
        try:
            dev.run([Dispatch(k, [*bufs, cbuf], self.grid(-(-rows * width // 2 // gather.WORKGROUP)),
                              struct.pack("<I", rows))])
            return cbuf.read(np.uint32, cache.size // 2).view(np.float16).reshape(cache.shape)
        finally:
            for b in [*bufs, cbuf]:
                dev.free(b)

    def embed(self, raw: np.ndarray, wtype: Q, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of a table of `wtype` (raw GGUF rows u8 [vocab, row_bytes]) as f32 [rows, n_embd]."""
        facts = QUANT_TYPES[wtype]
        n_embd = raw.shape[1] // facts.block_bytes * facts.block
        k = self.embed_kernel(wtype, n_embd)
        padded = np.zeros(-(-(raw.size + 4) // 4) * 4, np.uint8)
        padded[: raw.size] = raw.reshape(-1)
        rows = len(ids)
        return self._run(k, [padded.view(np.uint32), np.asarray(ids, np.uint32)], (rows, n_embd),
                         -(-rows * n_embd // gather.WORKGROUP), struct.pack("<3I", rows, 0, raw.shape[0]))

    def embed_q8_0(self, raw: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of a Q8_0 table (raw bytes u8 [vocab, row_bytes]) as f32 [rows, n_embd]."""
        q8_0 = QUANT_TYPES[Q.Q8_0]
        n_embd = raw.shape[1] // q8_0.block_bytes * q8_0.block
        k = self.embed_q8_0_kernel(n_embd)
        padded = np.zeros(-(-(raw.size + 4) // 4) * 4, np.uint8)
        padded[: raw.size] = raw.reshape(-1)
        rows = len(ids)
        return self._run(k, [padded.view(np.uint32), np.asarray(ids, np.uint32)], (rows, n_embd),
                         -(-rows * n_embd // gather.WORKGROUP), struct.pack("<3I", rows, 0, raw.shape[0]))
