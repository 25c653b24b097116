"""The CUDA renderer on real op mixes (the synthetic model graphs), and `--device cuda`'s honesty when
CUDA cannot be used here."""

from __future__ import annotations

from dataclasses import replace

import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda import device
from kinetic.codegen.cuda.renderer import CudaRenderer
from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.ops import Op, SoftcapAttrs
from kinetic.passes.pipeline import run_pipeline
from tests.conftest import device_passes
from tests.synthetic import synthetic_path


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_every_compute_op_of_a_model_has_kernels(family):
    """After the pass pipeline and CUDA's device phase, every norm, rotary, attention, elementwise op,
    row gather, quantize, quantized matmul and Q8_0 embedding lookup of the family's graph maps to
    kernels (the fused forms included); what is left is embedding tables of other types and F16/BF16
    matmuls, each named with its reason."""
    renderer = CudaRenderer()
    graph = renderer.lower(run_pipeline(lower(open_gguf(synthetic_path(family))), device_passes("cuda")))
    rendering = renderer.render(graph)
    for node_id, why in rendering.unsupported.items():
        node = graph.node(node_id)
        float_matmul = node.op is Op.MATMUL and graph.node(node.inputs[1]).type.dtype in ("f16", "bf16", "f32")
        other_table = node.op is Op.EMBED and graph.node(node.inputs[0]).type.ggml_type is not Q.Q8_0
        assert float_matmul or other_table, why
    covered = {graph.node(i).op for i, ks in rendering.kernels.items() if ks}
    assert {Op.MATMUL, Op.RMS_NORM, Op.ADD_RMS_NORM, Op.ROPE_PAIR, Op.ATTENTION, Op.TAKE_ROWS} <= covered


def test_attention_kernels_take_the_mask_stride():
    """An attention node becomes the cache store and the attention kernels (one warp per (row, head)
    for many rows, eight for few), whose mask stride is the renderer's (the runtime's cache capacity),
    named in the kernel; where its launch writes its output projection's quantized row, the
    quantizer follows for passes the one-warp kernel runs."""
    renderer = CudaRenderer(mask_stride=640)
    graph = renderer.lower(run_pipeline(lower(open_gguf(synthetic_path("llama"))), device_passes("cuda")))
    node = next(n for n in graph.nodes if n.op is Op.ATTENTION)
    store, attend, parallel, *after = renderer.node_kernels(node, graph)
    assert [k.kind for k in after] == (["quantize"] if "_q8_" in parallel.name else [])
    assert store.kind == "gather" and store.name.startswith("kv_store_")
    assert attend.kind == "attention" and attend.name.endswith("_m640")
    assert parallel.kind == "attention" and parallel.name.startswith("attention_rows_")
    assert "_m640" in parallel.name


def test_device_cuda_fails_with_the_reason_when_unusable():
    """Where CUDA cannot be used (no NVRTC, no CuPy, no driver, no GPU), require_cuda raises a KineticError
    that names the reason in one line and suggests another device; where it can, it passes."""
    reason = device.unavailable_reason()
    if reason is None:
        device.require_cuda()
        return
    assert "\n" not in reason
    with pytest.raises(KineticError, match="device 'cuda' is not usable") as err:
        device.require_cuda()
    assert reason in err.value.message and "--device cpu" in err.value.hint


def test_cuda_declares_only_forms_its_table_renders(monkeypatch):
    """Every device form CUDA's fusions make and every fused op its capabilities list has a row in
    KERNELS (a form without a row would be refused on every model); a node whose op has no row is
    refused as such (soft-capping here, its row taken out: every op has a CUDA row today)."""
    from kinetic.codegen.cuda.renderer import CAPABILITIES, FUSIONS, KERNELS

    assert FUSIONS.forms() == {Op.ADD_RMS_NORM, Op.ROPE_PAIR, Op.QUANTIZE}
    assert CAPABILITIES.fused_ops <= set(KERNELS) and FUSIONS.forms() <= CAPABILITIES.fused_ops
    assert {op for op, _ in FUSIONS.quantize_in} <= set(KERNELS)
    graph = run_pipeline(lower(open_gguf(synthetic_path("llama"))), device_passes("cuda"))
    add = next(n for n in graph.nodes if n.op is Op.ADD)
    capped = replace(graph, nodes=tuple(replace(n, op=Op.SOFTCAP, attrs=SoftcapAttrs(30.0), inputs=n.inputs[:1])
                                        if n is add else n for n in graph.nodes))
    monkeypatch.delitem(KERNELS, Op.SOFTCAP)
    assert CudaRenderer().render(capped).unsupported[add.id] == "softcap: no CUDA kernel for op softcap"
