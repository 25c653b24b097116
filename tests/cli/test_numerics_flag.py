"""`--numerics {ggml,fast}` from the command line to the graph: compile's --dump-ir shows the fast
mode's orders, a .ktc file keeps its mode (and runs in it without the flag; a file that records none
runs ggml), a Model and its receipt settings carry the mode, the default is the fast mode where the
device follows it, a device that follows only ggml's orders runs ggml (with a note when another mode
was asked for), and every command that compiles a model takes the flag."""

from __future__ import annotations

import pytest

from kinetic.cli.main import build_parser, main
from kinetic.errors import KineticError
from kinetic.frontend.blocks import Options
from kinetic.ir.ops import Op
from kinetic.ir.orders import DEFAULT_NUMERICS
from kinetic.ir.text import parse_graph
from kinetic.ktc import Kind
from kinetic.numerics_mode import choose_numerics, default_numerics
from kinetic.passes import PIPELINE
from tests.synthetic import synthetic_path

LAST_PHASE = f"{len(PIPELINE):02d}-{PIPELINE[-1].name}.ir"


def matmul_orders(graph) -> dict[str, set[str]]:
    """weight type name -> the orders of the q8 matmuls reading weights of that type."""
    found: dict[str, set[str]] = {}
    for n in graph.nodes:
        if n.op is Op.MATMUL and n.attrs.activations == "q8":
            found.setdefault(graph.node(n.inputs[1]).type.ggml_type.name, set()).add(n.attrs.order)
    return found


def dumped_orders(tmp_path, *flags: str) -> dict[str, set[str]]:
    assert main(["compile", str(synthetic_path("llama")), "--dump-ir", str(tmp_path), *flags]) == 0
    return matmul_orders(parse_graph((tmp_path / LAST_PHASE).read_text()))


def test_compile_numerics_fast_dumps_block_chain(tmp_path, capsys):
    """--numerics fast: every Q8_0 / Q5_0 / Q4_1 / Q5_1 / Q4_0 matmul is order=block_chain in the dump
    and the summary names the mode; --numerics ggml gives ggml's (lanes8, Q4_0 block_chain); without
    the flag the CPU compiles the default mode's."""
    fast = dumped_orders(tmp_path / "fast", "--numerics", "fast")
    assert "numerics fast" in capsys.readouterr().out
    assert all(fast[t] == {"block_chain"} for t in ("Q8_0", "Q5_0", "Q4_1", "Q5_1", "Q4_0"))
    ggml = dumped_orders(tmp_path / "ggml", "--numerics", "ggml")
    assert "numerics ggml" in capsys.readouterr().out
    assert all(ggml[t] == {"lanes8"} for t in ("Q8_0", "Q5_0", "Q4_1", "Q5_1")) and ggml["Q4_0"] == {"block_chain"}
    assert dumped_orders(tmp_path / "default") == {"fast": fast, "ggml": ggml}[DEFAULT_NUMERICS]
    assert f"numerics {DEFAULT_NUMERICS}" in capsys.readouterr().out


def test_a_device_without_the_fast_orders_compiles_ggml_with_a_note(tmp_path, capsys):
    """--device vulkan follows ggml's orders only: --numerics fast compiles ggml's, saying so once."""
    orders = dumped_orders(tmp_path, "--numerics", "fast", "--device", "vulkan")
    assert orders["Q8_0"] == {"lanes8"}
    assert "--numerics fast is not one --device vulkan follows" in capsys.readouterr().err


def test_a_ktc_file_keeps_its_mode(tmp_path, capsys):
    """compile -o --numerics fast records the mode in the metadata; loading the file without a mode
    uses its stored (fast) graph without compiling again; asking for ggml compiles ggml's orders."""
    from kinetic.ktc.load import LoadedKtc

    out = tmp_path / "fast.ktc"
    assert main(["compile", str(synthetic_path("llama")), "-o", str(out), "--numerics", "fast"]) == 0
    notes: list[str] = []
    ktc = LoadedKtc(out, note=notes.append)
    assert ktc.numerics == "fast" and ktc.stored_lowering["numerics"] == "fast"
    stored = ktc.graph()
    assert stored == parse_graph(ktc.file.text(Kind.GRAPH)) and notes == []
    assert matmul_orders(stored)["Q8_0"] == {"block_chain"}
    assert matmul_orders(ktc.graph(Options(numerics="ggml")))["Q8_0"] == {"lanes8"}


def test_a_fast_ktc_file_on_a_device_that_follows_only_ggml_runs_ggml(tmp_path, capsys):
    """A .ktc file compiled in the fast mode, loaded for CUDA (here its host emulation), is compiled
    again in ggml's orders with one note naming the file's mode, and its answer is the one of the
    same model compiled for --numerics ggml on the reference interpreter."""
    from kinetic.model import Model

    out = tmp_path / "fast.ktc"
    assert main(["compile", str(synthetic_path("llama")), "-o", str(out), "--numerics", "fast"]) == 0
    capsys.readouterr()
    cuda = Model(out, n_ctx=64, device="cuda-emulated", warm_start=False, draft=False)
    assert capsys.readouterr().err.count("the .ktc file's numerics mode fast is not one --device cuda-emulated") == 1
    assert cuda.options.numerics == "ggml" and matmul_orders(cuda.graph)["Q8_0"] == {"lanes8"}
    reference = Model(out, n_ctx=64, device="reference", options=Options(numerics="ggml"), warm_start=False,
                      draft=False)
    answers = []
    for model in (cuda, reference):
        model.generate([1, 5, 9, 2], max_tokens=4)
        answers.append(model.last_stats.tokens)
    assert answers[0] == answers[1] and len(answers[0]) == 4


def test_a_ktc_file_that_records_no_mode_runs_ggml_without_a_note(tmp_path, monkeypatch, capsys):
    """A .ktc file from before the numerics modes (metadata.lowering without "numerics") holds ggml's
    orders: it loads in ggml whatever the default, from its stored graph, silently."""
    import kinetic.ktc.build as build
    from kinetic.compiler import compile_graph
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.ir.text import print_graph
    from kinetic.model import Model

    def without_numerics(*args, **kwargs):
        record = real_record(*args, **kwargs)
        del record["lowering"]["numerics"]
        return record

    real_record = build.metadata_record
    monkeypatch.setattr(build, "metadata_record", without_numerics)
    gguf = open_gguf(synthetic_path("llama"))
    out = tmp_path / "old.ktc"
    build.build_ktc(gguf, compile_graph(gguf, Options(numerics="ggml")), out)
    model = Model(out, n_ctx=64, device="reference", warm_start=False)
    assert model.options.numerics == "ggml" and capsys.readouterr().err == ""
    assert print_graph(model.graph) == model.ktc.file.text(Kind.GRAPH)
    assert matmul_orders(model.graph)["Q8_0"] == {"lanes8"}


def test_a_model_carries_its_mode_into_the_graph_and_the_receipt_settings():
    """Model(options=Options(numerics="fast")) compiles the fast orders and records the mode in its
    options; a receipt's device settings hold it (ggml's too) and read back to the same Options; a
    receipt without it (written before the modes) reads as ggml's."""
    from kinetic.model import Model
    from kinetic.receipts.receipt import device_settings, options_from_settings

    model = Model(synthetic_path("llama"), n_ctx=64, device="reference", options=Options(numerics="fast"),
                  warm_start=False)
    assert model.options.numerics == "fast" and matmul_orders(model.graph)["Q4_1"] == {"block_chain"}
    settings = device_settings(64, model.options)
    assert settings["numerics"] == "fast" and options_from_settings(settings).numerics == "fast"
    ggml = device_settings(64, Options(numerics="ggml"))
    assert ggml["numerics"] == "ggml" and options_from_settings(ggml).numerics == "ggml"
    del ggml["numerics"]
    assert options_from_settings(ggml).numerics == "ggml"


def test_choose_numerics_prefers_the_flag_then_the_file_then_the_default():
    """The flag wins over a .ktc file's mode, the file's over the device's default (DEFAULT_NUMERICS on
    the CPU and the reference, ggml on Vulkan and CUDA, silently); a device that follows only ggml gets
    ggml with one note when the flag or the file asked for another mode; an unknown mode is refused."""
    notes: list[str] = []

    def pick(requested: str | None, stored: str | None, device: str) -> str:
        return choose_numerics(requested=requested, stored=stored, device=device, note=notes.append)

    assert pick("ggml", "fast", "cpu") == "ggml" and pick(None, "fast", "cpu") == "fast"
    assert pick(None, "ggml", "cpu") == "ggml" and pick("fast", None, "reference") == "fast"
    assert pick(None, None, "cpu") == pick(None, None, "reference") == DEFAULT_NUMERICS == default_numerics("cpu")
    assert pick(None, None, "cuda") == pick(None, None, "vulkan") == default_numerics("vulkan") == "ggml"
    assert notes == []
    assert pick("fast", None, "cuda") == "ggml" and len(notes) == 1
    assert pick(None, "fast", "vulkan") == "ggml" and len(notes) == 2
    with pytest.raises(KineticError, match="unknown numerics mode"):
        pick("quick", None, "cpu")


@pytest.mark.parametrize("command", ["compile", "run", "chat", "serve", "bench", "perplexity"])
def test_every_compiling_command_takes_the_flag(command):
    """Each command that compiles a model parses --numerics fast, and refuses a mode that is not one."""
    parser = build_parser()
    assert parser.parse_args([command, "model.gguf", "--numerics", "fast"]).numerics == "fast"
    assert parser.parse_args([command, "model.gguf"]).numerics is None
    with pytest.raises(SystemExit):
        parser.parse_args([command, "model.gguf", "--numerics", "quick"])
