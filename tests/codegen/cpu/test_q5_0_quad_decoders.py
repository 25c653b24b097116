"""Q5_0's decode in the "block_chain" order on VNNI hosts has two pair decoders for its column quads
(matmul_columns_ir): `pair_q5_0_multishift` where the host has AVX-512 VBMI, `pair_q5_0_heads`
elsewhere. Both must give the reference's bits; a host runs only one of them by default, so the
other is forced here."""

from __future__ import annotations

import pytest
from cpu_kernel_helpers import assert_bits, chain_case, chain_reference
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu import matmul_columns_ir
from kinetic.codegen.cpu.jit import Jit
from kinetic.codegen.cpu.matmul import quantized_matmul
from kinetic.codegen.cpu.matmul_ir import render_matmul
from kinetic.codegen.cpu.target import host

VNNI = host().supports("vnni")
VBMI = VNNI and "avx512vbmi" in host().flags


def _decode_bits(jit: Jit) -> None:
    """One row (decode) over K = 32 .. 2048, N = 1 .. 37 (whole quads and a partial one) and 1 or 3
    threads: every output is the reference's block_chain value, bit for bit."""
    for k, n in ((32, 1), (96, 9), (640, 37), (2048, 16)):
        x, w = chain_case(Q.Q5_0, n, k, 1, seed=7)
        want = chain_reference(x, w, Q.Q5_0)
        for threads in (1, 3):
            got = quantized_matmul(x, w, Q.Q5_0, jit=jit, variant="vnni", threads=threads, order="block_chain")
            assert_bits(got, want, f"K={k} N={n} threads={threads}")


@pytest.mark.skipif(not VNNI, reason="the quads' own pair decoders are the vnni variant's")
def test_the_decoder_without_vbmi_equals_the_reference(tmp_path, monkeypatch):
    """With the VBMI decoder taken away (a host without VBMI), pair_q5_0_heads' kernel gives the
    reference's bits."""
    monkeypatch.setattr(matmul_columns_ir, "QUAD_PAIRS_VBMI", {})
    _decode_bits(Jit(tmp_path))  # a Jit of its own: matmul's kernel cache is keyed by it


@pytest.mark.skipif(not VBMI, reason="needs AVX-512 VBMI (vpmultishiftqb)")
def test_the_vbmi_decoder_equals_the_reference(tmp_path):
    """pair_q5_0_multishift's kernel (the default on this host) gives the reference's bits."""
    _decode_bits(Jit(tmp_path))


@pytest.mark.skipif(not VBMI, reason="needs AVX-512 VBMI (vpmultishiftqb)")
def test_only_the_fast_orders_decode_takes_vpmultishiftqb():
    """Q5_0's block_chain kernel calls vpmultishiftqb; its ggml-order kernel and Q5_1's do not (their
    IR is unchanged by the VBMI decoder)."""
    def ir(wtype: Q, order: str | None) -> str:
        return render_matmul(wtype, 640, "vnni", 8, order=order)[0]

    assert "pmultishift" in ir(Q.Q5_0, "block_chain")
    assert "pmultishift" not in ir(Q.Q5_0, None)
    assert "pmultishift" not in ir(Q.Q5_1, "block_chain")
