"""llama.cpp's rotary flags (kinetic/cli/rope_options.py): each one changes the lowered graph's rotary
attributes as llama.cpp's flag changes its rotary parameters, bad values are refused naming the flag,
and a .ktc file's graph is lowered again with them."""

from __future__ import annotations

import pytest

from kinetic.cli import main as cli
from kinetic.cli.main import main
from kinetic.cli.rope_options import SCALING_METAVAR, lowering_options
from kinetic.errors import KineticError
from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.frontend.rope_scaling import SCALING_TYPES, RopeOverrides, yarn_attn_factor
from kinetic.ir.ops import Op
from kinetic.ktc.load import LoadedKtc
from tests.synthetic import synthetic_path


def _flags(*argv: str, command: str = "run"):
    return cli.build_parser().parse_args([command, "model", *argv])


def _rope(name: str, *argv: str):
    """The first rotary node's attributes of synthetic file `name` lowered with these flags."""
    graph = lower(open_gguf(synthetic_path(name)), lowering_options(_flags(*argv)))
    return next(n.attrs for n in graph.nodes if n.op is Op.ROPE)


def test_no_flag_keeps_the_files_own_rotary_and_the_stored_graph():
    """Without a flag there are no lowering options at all (a .ktc file's stored graph stays usable)."""
    assert lowering_options(_flags()) is None
    assert _rope("llama-linear").freq_scale == 0.25  # the file's linear x4


@pytest.mark.parametrize("command", ["run", "chat", "serve"])
def test_every_command_that_loads_a_model_takes_the_flags(command):
    """run, chat and serve parse all nine flags into the same overrides."""
    args = _flags("--rope-scaling", "yarn", "--rope-freq-base", "20000", "--rope-freq-scale", "0.5",
                  "--yarn-orig-ctx", "128", "--yarn-ext-factor", "0.5", "--yarn-attn-factor", "0.9",
                  "--yarn-beta-fast", "16", "--yarn-beta-slow", "2", command=command)
    assert lowering_options(args).rope == RopeOverrides("yarn", 20000.0, 0.5, 128, 0.5, 0.9, 16.0, 2.0)


def test_rope_scale_n_is_freq_scale_one_over_n_and_the_later_flag_wins():
    """--rope-scale 4 is --rope-freq-scale 0.25 (as on a file with linear factor 4); of the two
    flags, the one given last counts, as llama.cpp reads them in order."""
    plain = _rope("llama")
    assert plain.freq_scale == 1.0
    assert _rope("llama", "--rope-scale", "4") == _rope("llama", "--rope-freq-scale", "0.25")
    assert _rope("llama", "--rope-freq-scale", "0.25").freq_scale == _rope("llama-linear").freq_scale == 0.25
    assert _rope("llama", "--rope-freq-scale", "0.5", "--rope-scale", "4").freq_scale == 0.25
    assert _rope("llama", "--rope-scale", "4", "--rope-freq-scale", "0.5").freq_scale == 0.5


def test_scaling_none_undoes_the_files_scale_and_base_replaces_its_base():
    """--rope-scaling none forces scale 1 on a linearly scaled file; --rope-freq-base N is the base;
    a base or scale of 0 keeps the file's (llama.cpp's 'not given')."""
    assert _rope("llama-linear", "--rope-scaling", "none").freq_scale == 1.0
    assert _rope("llama", "--rope-freq-base", "500000").theta == 500000.0
    assert _rope("llama-linear", "--rope-freq-base", "0", "--rope-freq-scale", "0") == _rope("llama-linear")


def test_yarn_flags_set_the_ramp_the_original_context_and_the_attention_factor():
    """--rope-scaling yarn on a linear x4 file: extrapolation mix 1, the original context from
    --yarn-orig-ctx (else the file's context length), the attention factor llama.cpp's context
    computes (overriding --yarn-attn-factor), the betas as given."""
    a = _rope("llama-linear", "--rope-scaling", "yarn", "--yarn-orig-ctx", "32", "--yarn-attn-factor", "0.5",
              "--yarn-beta-fast", "16", "--yarn-beta-slow", "2")
    assert (a.freq_scale, a.yarn_ext_factor, a.yarn_orig_ctx) == (0.25, 1.0, 32)
    assert a.yarn_attn_factor == yarn_attn_factor(4.0) and (a.yarn_beta_fast, a.yarn_beta_slow) == (16.0, 2.0)
    assert _rope("llama-linear", "--rope-scaling", "yarn").yarn_orig_ctx == 4096  # llama.context_length
    off = _rope("qwen2-yarn", "--yarn-ext-factor", "0", "--yarn-attn-factor", "0.5")
    assert (off.yarn_ext_factor, off.yarn_attn_factor, off.freq_scale) == (0.0, 0.5, 0.25)
    assert _rope("qwen2-yarn", "--yarn-ext-factor", "-1") == _rope("qwen2-yarn")  # negative: the default


@pytest.mark.parametrize("argv,named", [
    (("--rope-scaling", "longrope"), "longrope"),
    (("--rope-freq-base", "-5"), "--rope-freq-base"),
    (("--rope-freq-base", "nan"), "--rope-freq-base"),
    (("--rope-freq-scale", "-0.5"), "--rope-freq-scale"),
    (("--rope-scale", "0"), "--rope-scale"),
    (("--yarn-orig-ctx", "-1"), "--yarn-orig-ctx"),
    (("--yarn-ext-factor", "inf"), "--yarn-ext-factor"),
    (("--yarn-beta-fast", "nan"), "--yarn-beta-fast"),
])
def test_bad_values_are_refused_naming_the_flag(argv, named):
    """A scaling type Kinetic does not apply, a base or scale that is not positive, a context below 0
    and a factor that is not finite: each a KineticError naming the flag or type."""
    with pytest.raises(KineticError, match=named):
        lowering_options(_flags(*argv))


def test_an_unknown_scaling_names_the_supported_ones():
    with pytest.raises(KineticError) as refused:
        lowering_options(_flags("--rope-scaling", "longrope"))
    assert "none, linear, yarn" in refused.value.hint and SCALING_METAVAR == "{" + ",".join(SCALING_TYPES) + "}"


def test_a_ktc_graph_is_lowered_again_with_the_overrides(tmp_path):
    """A .ktc file keeps its stored graph without overrides and is lowered again from its weights with
    them, so the flags reach the graph a .ktc file runs."""
    out = tmp_path / "llama.ktc"
    assert main(["compile", str(synthetic_path("llama")), "-o", str(out)]) == 0
    ktc = LoadedKtc(out, note=lambda line: None)
    ropes = lambda g: [n.attrs for n in g.nodes if n.op is Op.ROPE]  # noqa: E731
    assert {a.freq_scale for a in ropes(ktc.graph(None))} == {1.0}
    assert {a.freq_scale for a in ropes(ktc.graph(Options(rope=RopeOverrides(freq_scale=0.25))))} == {0.25}


def test_sliding_window_layers_keep_their_own_base_and_no_scale():
    """gemma3's sliding-window layers keep rope.freq_base_swa and scale 1 whatever the flags say
    (llama.cpp's get_rope_freq_base / get_rope_freq_scale); its global layers take the flags."""
    graph = lower(open_gguf(synthetic_path("gemma3")),
                  lowering_options(_flags("--rope-freq-base", "123456", "--rope-freq-scale", "0.5")))
    bases = {(n.attrs.theta, n.attrs.freq_scale) for n in graph.nodes if n.op is Op.ROPE}
    assert bases == {(123456.0, 0.5), (10000.0, 1.0)}
