"""`--numerics {ggml,fast}` from the command line to the graph: compile's --dump-ir shows the fast
mode's orders, a .ktc file keeps its mode (and runs in it without the flag), a Model and its receipt
settings carry the mode, a device that follows only ggml's orders runs ggml with a note, and every
command that compiles a model takes the flag."""

from __future__ import annotations

import pytest

from kinetic.cli.main import build_parser, main
from kinetic.errors import KineticError
from kinetic.frontend.blocks import Options
from kinetic.ir.ops import Op
from kinetic.ir.text import parse_graph
from kinetic.ktc import Kind
from kinetic.numerics_mode import choose_numerics
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
    and the summary names the mode; without the flag they are ggml's (lanes8, Q4_0 block_chain)."""
    fast = dumped_orders(tmp_path / "fast", "--numerics", "fast")
    assert "numerics fast" in capsys.readouterr().out
    assert all(fast[t] == {"block_chain"} for t in ("Q8_0", "Q5_0", "Q4_1", "Q5_1", "Q4_0"))
    ggml = dumped_orders(tmp_path / "ggml")
    assert "numerics ggml" in capsys.readouterr().out
    assert all(ggml[t] == {"lanes8"} for t in ("Q8_0", "Q5_0", "Q4_1", "Q5_1")) and ggml["Q4_0"] == {"block_chain"}


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


def test_a_model_carries_its_mode_into_the_graph_and_the_receipt_settings():
    """Model(options=Options(numerics="fast")) compiles the fast orders and records the mode in its
    options; a receipt's device settings hold it and read back to the same Options; ggml's leave it out."""
    from kinetic.model import Model
    from kinetic.receipts.receipt import device_settings, options_from_settings

    model = Model(synthetic_path("llama"), n_ctx=64, device="reference", options=Options(numerics="fast"),
                  warm_start=False)
    assert model.options.numerics == "fast" and matmul_orders(model.graph)["Q4_1"] == {"block_chain"}
    settings = device_settings(64, model.options)
    assert settings["numerics"] == "fast" and options_from_settings(settings).numerics == "fast"
    assert "numerics" not in device_settings(64, Options(numerics="ggml"))
    assert options_from_settings(device_settings(64, Options(numerics="ggml"))).numerics == "ggml"


def test_choose_numerics_prefers_the_flag_then_the_file_then_the_default():
    """The flag wins over a .ktc file's mode, the file's over the default; a device that follows only
    ggml gets ggml with one note (none when nobody asked); an unknown mode is refused."""
    notes: list[str] = []

    def pick(requested: str | None, stored: str | None, device: str) -> str:
        return choose_numerics(requested=requested, stored=stored, device=device, note=notes.append)

    assert pick("ggml", "fast", "cpu") == "ggml" and pick(None, "fast", "cpu") == "fast"
    assert pick(None, None, "cpu") == "ggml" and pick("fast", None, "reference") == "fast"
    assert notes == []
    assert pick("fast", None, "cuda") == "ggml" and len(notes) == 1
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
