"""The `kinetic` command as a user runs it: exit codes, error lines, and `kinetic info` output."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kinetic import __version__


def kinetic(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kinetic.cli.main", *args], capture_output=True,
                          text=True, timeout=120)


def assert_clean_failure(proc: subprocess.CompletedProcess, message: str) -> None:
    """Exit 1, a `kinetic: ` line naming the problem, then one line saying what to do; no traceback."""
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("kinetic: ") and message in lines[0]
    assert lines[1] and not lines[1].startswith("kinetic: ")
    assert "Traceback" not in proc.stderr


def test_version():
    """--version prints the package version and exits 0."""
    proc = kinetic("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"kinetic {__version__}"


def test_info_help():
    """`kinetic info --help` describes the command and its --json flag."""
    proc = kinetic("info", "--help")
    assert proc.returncode == 0 and "--json" in proc.stdout and "header" in proc.stdout


def test_unknown_flag_is_a_usage_error():
    """An unknown flag exits 2 with a `kinetic: ` line and a line pointing to --help."""
    proc = kinetic("info", "--frobnicate", "x.gguf")
    assert proc.returncode == 2
    assert proc.stderr.startswith("kinetic: ") and "--help" in proc.stderr.splitlines()[-1]


def test_missing_file(tmp_path):
    """A path that does not exist fails cleanly."""
    assert_clean_failure(kinetic("info", str(tmp_path / "missing.gguf")), "no model file or known model")


def test_corrupted_file(tmp_path, smollm2_path):
    """A real header with its tensor count overwritten fails cleanly, naming the file."""
    data = bytearray(smollm2_path.read_bytes()[:4096])
    data[8:16] = (2**62).to_bytes(8, "little")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(bytes(data))
    assert_clean_failure(kinetic("info", str(bad)), "broken.gguf is not a valid GGUF file")


def test_not_a_gguf_file(tmp_path):
    """A text file fails cleanly with the wrong-magic message."""
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello")
    assert_clean_failure(kinetic("info", str(bad)), "instead of b'GGUF'")


@pytest.mark.parametrize("flags, message", [
    (["--repeat-penalty", "0"], "--repeat-penalty must be a number greater than 0"),
    (["--mirostat", "3"], "--mirostat must be an integer from 0 to 2"),
    (["-l", "15043*2"], "--logit-bias takes TOKEN_ID+BIAS"),
])
def test_bad_sampling_flag_fails_cleanly(tmp_path, flags, message):
    """A sampler flag llama.cpp would refuse fails with a clear error, before the model is loaded."""
    assert_clean_failure(kinetic("run", str(tmp_path / "missing.gguf"), "hi", *flags), message)


def test_info_smollm2(smollm2_path):
    """`kinetic info` on SmolLM2 prints the file line and its facts."""
    proc = kinetic("info", str(smollm2_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.splitlines()[0] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    for fact in ("architecture   llama\n", "layers         30, width 576", "Q4_1    210 tensors",
                 "F32      61 tensors", "Q8_0      1 tensors", "tokenizer      gpt2 (smollm), 49152 tokens",
                 "chat template  368 bytes"):
        assert fact in out, fact


def test_info_gemma_json(gemma_path):
    """`kinetic info --json` on Gemma 3 prints one JSON object with its facts."""
    proc = kinetic("info", str(gemma_path), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["architecture"], data["layers"], data["width"]) == ("gemma3", 18, 640)
    assert {w["type"]: w["tensors"] for w in data["weights"]} == {
        "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9, "F32": 109}
    assert data["tokenizer"]["model"] == "llama" and data["chat_template_bytes"] is None


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_info_by_short_name(name, request):
    """A downloaded model is found by its short name."""
    request.getfixturevalue("smollm2_path" if name.startswith("smollm2") else "gemma_path")
    proc = kinetic("info", name)
    assert proc.returncode == 0, proc.stderr
    assert "architecture" in proc.stdout


@pytest.mark.parametrize("flags", [["--device", "cuda"], ["--device", "cuda", "-ngl", "99"],
                                   ["--device", "cuda", "--gpu-layers", "12"]])
def test_cuda_without_a_gpu_fails_with_the_reason(smollm2_path, flags):
    """--device cuda (with or without -ngl N) fails here with the reason (no driver, no GPU) and a hint,
    never a traceback; -ngl alone runs on the CPU instead (test_defaults.py). On a GPU it runs
    (tests/codegen/cuda)."""
    from kinetic.codegen.cuda.device import unavailable_reason

    if unavailable_reason() is None:
        pytest.skip("CUDA is usable here")
    proc = kinetic("run", str(smollm2_path), "hi", "-n", "1", *flags)
    assert_clean_failure(proc, "--device cuda cannot run here")
    assert "Use --device cpu." in proc.stderr


@pytest.mark.parametrize("flags", [[], ["-ngl", "10"]], ids=["whole", "split"])
def test_device_cuda_end_to_end_on_the_emulation(smollm2_path, flags):
    """`kinetic run --device cuda-emulated` through the whole CUDA path (Model, the runtime, drafting,
    the sampler) on the host emulation of its kernels, whole and split with -ngl 10 (20 layers on the
    CPU): the same answer as --device cpu, and one line saying where it ran."""
    from kinetic.codegen.cuda import emulator

    if emulator.unavailable_reason():
        pytest.skip(emulator.unavailable_reason())
    args = ("run", str(smollm2_path), "--raw", "The capital of France is", "-n", "4", "--temp", "0")
    cpu = kinetic(*args, "--device", "cpu")
    cuda = kinetic(*args, "--device", "cuda-emulated", *flags)
    assert cpu.returncode == 0 and cuda.returncode == 0, cuda.stderr
    assert cuda.stdout == cpu.stdout
    assert "host emulation of its kernels" in cuda.stderr
    if "-ngl" in flags:
        assert "10 of 30 layers on the host emulation of the CUDA kernels, the rest on the CPU" in cuda.stderr


def test_ngl_zero_runs_on_the_cpu_and_contradictions_are_refused(smollm2_path):
    """-ngl 0 means the CPU (as llama.cpp's); with --device cuda it is a contradiction, said plainly;
    a negative -ngl is refused."""
    proc = kinetic("run", str(smollm2_path), "hi", "-n", "1", "--temp", "0", "-ngl", "0")
    assert proc.returncode == 0, proc.stderr
    assert_clean_failure(kinetic("run", str(smollm2_path), "hi", "-n", "1", "-ngl", "0", "--device", "cuda"),
                         "-ngl 0 runs on the CPU")
    assert_clean_failure(kinetic("run", str(smollm2_path), "hi", "-n", "1", "-ngl", "-2"), "-ngl must be 0 or more")


def test_device_auto_runs_on_the_cpu_here_saying_why(smollm2_path):
    """--device auto tries CUDA, then a Vulkan GPU, then the CPU: on a machine without either (CI:
    no NVIDIA driver, lavapipe or no Vulkan) it runs on the CPU after one line per device skipped."""
    from kinetic.devices import resolve_device

    lines: list[str] = []
    if resolve_device("auto", lines.append) != "cpu":
        pytest.skip(f"this machine has a GPU auto would use: {lines}")
    proc = kinetic("run", str(smollm2_path), "hi", "-n", "1", "--temp", "0", "--device", "auto")
    assert proc.returncode == 0, proc.stderr
    skips = [line for line in proc.stderr.splitlines() if line.startswith("auto: ")]
    assert skips == lines and len(skips) == 2, proc.stderr
    assert skips[0].startswith("auto: skipping CUDA: ") and skips[1].startswith("auto: skipping Vulkan")
