"""`kinetic compile --dump-ir`: one parseable, verified IR file per phase, also beside -o (tests/ktc covers -o).

(It lives beside the passes because --dump-ir is the pipeline's window; it drives the CLI.)
"""

from __future__ import annotations

from kinetic.cli.main import main
from kinetic.ir.graph import verify
from kinetic.ir.text import parse_graph
from kinetic.passes import PIPELINE


def test_dump_ir_writes_each_phase(smollm2_path, tmp_path, capsys):
    """00-lowered.ir then one file per phase, the CPU's device phase (the default device) last; each
    parses, verifies, and the summary counts match."""
    (tmp_path / "07-stale.ir").write_text("left from an earlier dump")
    (tmp_path / "notes.txt").write_text("not ours")
    assert main(["compile", str(smollm2_path), "--dump-ir", str(tmp_path)]) == 0
    expected = ["00-lowered.ir"] + [f"{i:02d}-{p.name}.ir" for i, p in enumerate(PIPELINE, start=1)]
    expected.append(f"{len(PIPELINE) + 1:02d}-device.ir")
    assert sorted(p.name for p in tmp_path.glob("*.ir")) == expected
    assert (tmp_path / "notes.txt").exists()
    summary = capsys.readouterr().out
    for name in expected:
        graph = parse_graph((tmp_path / name).read_text())
        verify(graph)
        phase = name[3:-3]
        line = next(ln for ln in summary.splitlines() if ln.split()[:1] == [phase])
        assert int(line.split()[1]) == len(graph.nodes)
    first, last = (parse_graph((tmp_path / n).read_text()) for n in (expected[0], expected[-2]))
    assert len(last.nodes) < len(first.nodes)
    assert 'quantize(' in (tmp_path / expected[-1]).read_text()


def test_dump_ir_and_output_together(smollm2_path, tmp_path, capsys):
    """-o with --dump-ir writes both: the phase files and a .ktc whose graph is the last pipeline
    phase's (the generic graph; the CPU's device phase comes after it)."""
    from kinetic.ktc import Kind, KtcFile

    out = tmp_path / "model.ktc"
    assert main(["compile", str(smollm2_path), "-o", str(out), "--dump-ir", str(tmp_path / "ir")]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    last = (tmp_path / "ir" / f"{len(PIPELINE):02d}-{PIPELINE[-1].name}.ir").read_text()
    assert KtcFile.open(out).text(Kind.GRAPH) == last


def test_dump_ir_for_a_device_ends_with_its_device_phase(smollm2_path, tmp_path, capsys):
    """--device cuda adds the device phase as the last file: the graph CUDA's runner runs, with its
    fused forms; the summary's pipeline hash covers it; -o with a device other than the CPU is refused."""
    assert main(["compile", str(smollm2_path), "--dump-ir", str(tmp_path), "--device", "cuda"]) == 0
    names = sorted(p.name for p in tmp_path.glob("*.ir"))
    assert names[-1] == f"{len(PIPELINE) + 1:02d}-device.ir"
    device_text = (tmp_path / names[-1]).read_text()
    verify(parse_graph(device_text))
    assert "add_rms_norm(" in device_text and "rope_pair(" in device_text and "in_producer=true" in device_text
    cuda_hash = capsys.readouterr().out.split("pipeline ")[-1].split()[0]
    assert main(["compile", str(smollm2_path)]) == 0
    assert capsys.readouterr().out.split("pipeline ")[-1].split()[0] != cuda_hash
    assert main(["compile", str(smollm2_path), "-o", str(tmp_path / "m.ktc"), "--device", "cuda"]) == 2
    assert "--device cpu" in capsys.readouterr().err
