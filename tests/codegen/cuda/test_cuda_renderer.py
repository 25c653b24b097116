"""The CUDA renderer on real op mixes (the synthetic model graphs), and `--device cuda`'s honesty when
CUDA cannot be used here."""

from __future__ import annotations

import pytest

from kinetic.codegen.cuda import device
from kinetic.codegen.cuda.renderer import CudaRenderer
from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.ops import Op
from kinetic.passes.pipeline import run_pipeline
from tests.synthetic import synthetic_path

# what has no CUDA kernel yet (the runtime's gathers, float-weight matmuls)
NOT_YET = {Op.EMBED, Op.TAKE_ROWS}


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_every_compute_op_of_a_model_has_kernels(family):
    """After the pass pipeline, every norm, rotary, attention, elementwise op and quantized matmul of the
    family's graph maps to kernels; what is left is the embedding lookup, row gathers and F16/BF16
    matmuls, each named with its reason."""
    graph = run_pipeline(lower(open_gguf(synthetic_path(family))))
    rendering = CudaRenderer().render(graph)
    for node_id, why in rendering.unsupported.items():
        node = graph.node(node_id)
        float_matmul = node.op is Op.MATMUL and graph.node(node.inputs[1]).type.dtype in ("f16", "bf16", "f32")
        assert node.op in NOT_YET or float_matmul, why
    covered = {graph.node(i).op for i, ks in rendering.kernels.items() if ks}
    assert {Op.MATMUL, Op.RMS_NORM, Op.ROPE, Op.ATTENTION, Op.ADD} <= covered


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
