"""The llama-like decoder builder (kinetic/frontend/layers.py) and the attention options the qwen3,
ernie4_5 and hunyuan-dense families add on it: what each family reads from its file beyond the
shared synthetic files' llama.cpp comparison (tests/frontend/test_families.py)."""

from __future__ import annotations

import json
import re

import pytest

from kinetic.errors import ModelFileError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.ops import Op
from tests.gguf_variants import KV, V, variant
from tests.synthetic import SYNTHETIC, synthetic_path


def _llama_cpp_base(name: str) -> float:
    """The rotary base llama.cpp's loader settled on, from its load log stored with the file."""
    log = json.loads((SYNTHETIC / name / f"{name}.json").read_text())["load_log_excerpt"]
    return float(next(re.search(r"freq_base_train\s*=\s*(\S+)", line)[1] for line in log if "freq_base_train" in line))


def _rope_bases(name_or_path) -> set[float]:
    path = synthetic_path(name_or_path) if isinstance(name_or_path, str) else name_or_path
    return {n.attrs.theta for n in lower(open_gguf(path)).nodes if n.op is Op.ROPE}


def test_hunyuan_alpha_gives_llama_cpps_base():
    """A hunyuan-dense file's rope.scaling.alpha folds into the rotary base exactly as llama.cpp's
    loader does (float32: base * alpha^(head/(head-2)); float64 would land ~4 away)."""
    assert _rope_bases("hunyuan-dense-alpha") == {_llama_cpp_base("hunyuan-dense-alpha")}
    assert _rope_bases("hunyuan-dense") == {_llama_cpp_base("hunyuan-dense")} == {10000.0}


CASES = [
    ("multi-section rotary", "hunyuan-dense",
     {"hunyuan-dense.rope.dimension_sections": KV(V.ARRAY, [16, 16, 0, 0], V.INT32)},
     "hunyuan-dense.rope.dimension_sections"),
    ("partial rotary", "qwen3", {"qwen3.rope.dimension_count": KV(V.UINT32, 32)}, "qwen3.rope.dimension_count"),
    ("partial rotary", "ernie4_5", {"ernie4_5.rope.dimension_count": KV(V.UINT32, 32)},
     "ernie4_5.rope.dimension_count"),
    ("alpha of a two-value head", "hunyuan-dense",
     {"hunyuan-dense.rope.scaling.alpha": KV(V.FLOAT32, 2.0), "hunyuan-dense.attention.key_length": KV(V.UINT32, 2),
      "hunyuan-dense.attention.value_length": KV(V.UINT32, 2)}, "hunyuan-dense.rope.scaling.alpha"),
]


@pytest.mark.parametrize(("case", "arch", "set_kv", "key"), CASES, ids=[f"{c[1]}: {c[0]}" for c in CASES])
def test_what_a_family_cannot_run_is_refused_by_key(tmp_path, case, arch, set_kv, key):
    """A value llama.cpp's graph for the family does not handle (or handles by crashing) is a
    ModelFileError naming its key, before any tensor shape is checked."""
    path = variant(synthetic_path(arch), tmp_path / f"{arch}.gguf", set_kv=set_kv)
    with pytest.raises(ModelFileError) as info:
        lower(open_gguf(path))
    assert info.value.key == key


def test_qk_norm_after_rope_reads_rotated_values():
    """hunyuan-dense norms q and k after rotary, qwen3 before: the per-head norms' inputs are rope
    outputs in one and projections in the other."""
    def norm_inputs(arch: str) -> set[Op]:
        graph = lower(open_gguf(synthetic_path(arch)))
        by_id = {n.id: n for n in graph.nodes}
        return {by_id[n.inputs[0]].op for n in graph.nodes if n.op is Op.RMS_NORM and n.attrs.group}

    assert norm_inputs("hunyuan-dense") == {Op.ROPE}
    assert norm_inputs("qwen3") == {Op.MATMUL}


def test_info_names_the_norm_order_and_the_folded_base():
    """`kinetic info`'s facts for hunyuan-dense give the base llama.cpp rotates with (alpha folded in)
    and say the q/k norms come after rotary; qwen3's say before."""
    from kinetic.frontend.families import family_for
    from kinetic.frontend.families.base import number

    def facts(name: str) -> dict[str, str]:
        g = open_gguf(synthetic_path(name))
        return family_for(g.architecture).facts(g)

    alpha = facts("hunyuan-dense-alpha")
    assert f"base {number(_llama_cpp_base('hunyuan-dense-alpha'))}," in alpha["rotary"]
    assert "alpha 1000" in alpha["rotary"]
    assert alpha["norms"].endswith("after rotary") and facts("qwen3")["norms"].endswith("before rotary")
