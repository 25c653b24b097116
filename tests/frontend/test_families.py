"""Family descriptors: every registered family loads its synthetic file and matches llama.cpp's
logits; loading is strict about tensors; unknown architectures are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kinetic.errors import KineticError
from kinetic.frontend.families import supported_architectures
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from tests.synthetic import (
    SYNTHETIC,
    logits_beside_llama_cpp,
    rewrite_gguf,
    synthetic_arch,
    synthetic_files,
    synthetic_path,
)


def test_every_family_has_a_synthetic_file():
    """Completeness: each registered architecture has the shared synthetic GGUF with llama.cpp's outputs
    and at least one file of another shape (a family is checked on several shapes, not on one file);
    every such file is run by the llama.cpp comparison here and by every device in
    test_family_devices.py, which both take their files from synthetic_files()."""
    files = synthetic_files() + synthetic_files(embeddings=True)
    for arch in supported_architectures():
        assert synthetic_path(arch).is_file(), f"no synthetic file for {arch}"
        assert (SYNTHETIC / arch / f"{arch}.npz").is_file()
        shapes = [name for name in files if synthetic_arch(name) == arch]
        assert len(shapes) >= 2, f"{arch} has no synthetic file of another shape (scripts/synth_shapes.py)"


@pytest.mark.parametrize("name", synthetic_files())
def test_synthetic_logits_match_llama_cpp(name):
    """Our logits at every prompt position stay within rounding-flip distance of llama.cpp's, and the
    top token agrees wherever llama.cpp's top two are not close (every shape of every family)."""
    for logits, top_ids, top_logits in logits_beside_llama_cpp(name):
        ours = np.take_along_axis(logits, top_ids, axis=1)
        # logits have a standard deviation of ~2.4; an 8-bit activation rounding flip moves them ~0.1
        assert np.abs(ours - top_logits).max() < 0.4
        clear = (top_logits[:, 0] - top_logits[:, 1]) > 0.3
        assert np.array_equal(logits.argmax(axis=1)[clear], top_ids[clear, 0])


def test_renamed_tensor_is_named(tmp_path):
    """A tensor the family has no place for fails loading with its name."""
    path = rewrite_gguf(synthetic_path("llama"), tmp_path / "renamed.gguf",
                        rename={"blk.1.ffn_up.weight": "blk.1.ffn_upp.weight"})
    with pytest.raises(KineticError, match=r"blk\.1\.ffn_up\.weight is missing"):
        lower(open_gguf(path))


def test_extra_tensor_is_named(tmp_path):
    """A tensor nobody asks for is refused by name, never silently skipped."""
    path = rewrite_gguf(synthetic_path("llama"), tmp_path / "extra.gguf",
                        extra={"blk.0.attn_q.bias": np.zeros(256, np.float32)})
    with pytest.raises(KineticError, match=r"blk\.0\.attn_q\.bias has no place in family llama"):
        lower(open_gguf(path))


def test_missing_tensor_is_named(tmp_path):
    path = rewrite_gguf(synthetic_path("gemma3"), tmp_path / "missing.gguf", drop={"blk.2.post_ffw_norm.weight"})
    with pytest.raises(KineticError, match=r"blk\.2\.post_ffw_norm\.weight is missing"):
        lower(open_gguf(path))


def test_unknown_architecture_is_refused(tmp_path):
    path = rewrite_gguf(synthetic_path("llama"), tmp_path / "arch.gguf", set_kv={"general.architecture": "llama9"})
    with pytest.raises(KineticError, match="architecture llama9 is not supported yet"):
        lower(open_gguf(path))


def test_unknown_rotary_scaling_is_refused_by_name(tmp_path):
    """A rotary scaling type Kinetic does not apply (phi3's longrope) is refused with its name and the
    types that are supported."""
    path = rewrite_gguf(synthetic_path("llama"), tmp_path / "longrope.gguf",
                        set_kv={"llama.rope.scaling.type": "longrope"})
    with pytest.raises(KineticError, match="'longrope' rotary scaling .* is not supported") as refused:
        lower(open_gguf(path))
    assert "none, linear, yarn" in refused.value.hint


def test_synthetic_metadata_is_what_the_json_says():
    for name in synthetic_files() + synthetic_files(embeddings=True):
        meta = json.loads((SYNTHETIC / name / f"{name}.json").read_text())
        gguf = open_gguf(synthetic_path(name))
        assert gguf.architecture == meta["arch"]
        assert len(gguf.tensors) == len(meta["tensors"])
