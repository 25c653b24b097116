"""kinetic/lora.py on small synthetic files: the flags' spellings, the merge's arithmetic, and each
kind of mismatched adapter refused with what differs."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.ir.quants import dequantize
from kinetic.lora import Adapter, join_scaled_pairs, merge_adapters, parse_lora_flags
from tests.lora.adapter_file import AdapterRecipe, write_adapter

LLAMA = Path(__file__).resolve().parents[1] / "data" / "synthetic" / "llama" / "llama.gguf"
RECIPE = AdapterRecipe(targets=("attn_q", "ffn_down"), rank=4, alpha=8.0, seed=5)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> Path:
    return write_adapter(LLAMA, tmp_path_factory.mktemp("lora") / "a.gguf", RECIPE)


def test_flag_spellings_give_files_and_scales_in_order():
    """--lora A,B is scale 1 each; --lora-scaled A:0.5,B:2 and the older `--lora-scaled FILE SCALE`
    give their scales."""
    argv = join_scaled_pairs(["run", "m", "--lora-scaled", "c.gguf", "0.25", "--lora-scaled", "d.gguf:2", "p"])
    assert argv == ["run", "m", "--lora-scaled", "c.gguf:0.25", "--lora-scaled", "d.gguf:2", "p"]
    adapters = parse_lora_flags(["a.gguf,b.gguf"], ["c.gguf:0.25", "d.gguf:2,e.gguf:-1"])
    assert [(a.path.name, a.scale) for a in adapters] == [("a.gguf", 1.0), ("b.gguf", 1.0), ("c.gguf", 0.25),
                                                           ("d.gguf", 2.0), ("e.gguf", -1.0)]
    with pytest.raises(KineticError, match="has no scale"):
        parse_lora_flags(None, ["c.gguf"])
    with pytest.raises(KineticError, match="not a number"):
        parse_lora_flags(None, ["c.gguf:half"])


def test_merged_weight_is_w_plus_scaled_b_times_a(adapter):
    """Each adapted weight becomes dequant(W) + scale·alpha/rank·(B·A), summed in float32 and stored as
    F16 (F32 for an F32 or BF16 base); the others keep their bytes."""
    base = open_gguf(LLAMA)
    merged = merge_adapters(base, [Adapter(adapter, 0.5)])
    reader = gguf.GGUFReader(str(adapter))
    pairs = {t.name: np.array(t.data) for t in reader.tensors}
    for name, info in base.tensors.items():
        if f"{name}.lora_a" in pairs:
            a, b = pairs[f"{name}.lora_a"], pairs[f"{name}.lora_b"]
            want = dequantize(base.array(name), info.type).reshape(info.shape) + (b @ a) * np.float32(0.5 * 8.0 / 4)
            float_base = info.type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.BF16)
            kind, dtype = (gguf.GGMLQuantizationType.F32, np.float32) if float_base else \
                (gguf.GGMLQuantizationType.F16, np.float16)
            assert merged.tensors[name].type == kind
            np.testing.assert_array_equal(merged.array(name), want.astype(dtype))
        else:
            assert merged.tensors[name] == info
            assert np.array_equal(merged.raw(name), base.raw(name))
    assert any(f"{name}.lora_a" in pairs for name in base.tensors)


def test_two_adapters_add_up(adapter, tmp_path):
    """Two adapters (or one twice at half scale) merge as the sum of their terms."""
    base = open_gguf(LLAMA)
    once = merge_adapters(base, [Adapter(adapter, 1.0)])
    twice = merge_adapters(base, [Adapter(adapter, 0.5), Adapter(adapter, 0.5)])
    for name in once._merged:
        np.testing.assert_allclose(once.array(name).astype(np.float32), twice.array(name).astype(np.float32),
                                   rtol=2**-10, atol=1e-6)


def _rewrite(src: Path, out: Path, *, arch=None, kind="adapter", adapter_type="lora", drop=None, rename=None,
             reshape=None) -> Path:
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(out), arch or "llama")
    writer.add_type(kind)
    writer.add_string("adapter.type", adapter_type)
    writer.add_float32("adapter.lora.alpha", 8.0)
    for t in reader.tensors:
        if t.name == drop:
            continue
        data = np.array(t.data)
        if t.name == reshape:
            data = np.concatenate([data, data], axis=0)
        writer.add_tensor(rename.get(t.name, t.name) if rename else t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _first_pair(adapter: Path) -> str:
    return next(t.name for t in gguf.GGUFReader(str(adapter)).tensors).removesuffix(".lora_a")


@pytest.mark.parametrize(("change", "message"), [
    ({"arch": "qwen2"}, r"an adapter for 'qwen2'; the model is 'llama'"),
    ({"kind": "model"}, r"general.type is 'model', not 'adapter'"),
    ({"adapter_type": "control_vector"}, r"a 'control_vector' adapter"),
    ({"drop": "FIRST.lora_b"}, r"FIRST has no lora_b tensor"),
    ({"rename": {"FIRST.lora_a": "blk.99.attn_q.weight.lora_a", "FIRST.lora_b": "blk.99.attn_q.weight.lora_b"}},
     r"adapts blk.99.attn_q.weight, which the model does not have"),
    ({"reshape": "FIRST.lora_b"}, r"FIRST is \[\d+, \d+\] in the model but the adapter's B·A is \[\d+, \d+\]"),
])
def test_a_mismatched_adapter_is_refused_with_what_differs(adapter, tmp_path, change, message):
    """Another architecture, not an adapter, another adapter type, half a pair, a tensor the model
    lacks, other shapes: each refused with a KineticError naming the difference."""
    first = _first_pair(adapter)
    change = {k: (v.replace("FIRST", first) if isinstance(v, str) else
                  {a.replace("FIRST", first): b for a, b in v.items()} if isinstance(v, dict) else v)
              for k, v in change.items()}
    bad = _rewrite(adapter, tmp_path / "bad.gguf", **change)
    with pytest.raises(KineticError, match=message.replace("FIRST", first.replace(".", r"\."))):
        merge_adapters(open_gguf(LLAMA), [Adapter(bad)])
