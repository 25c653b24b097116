"""`kinetic perplexity`: llama-perplexity's scores, its base-file format, and clean failures.

The expected numbers come from llama.cpp (b1-0c1e570, CPU, -t 2) on the first 1500 bytes of
tests/data/golden/apache-2.0.txt:
    llama-perplexity -m SmolLM2-135M-Instruct.Q4_1.gguf -f short.txt -c 16 --chunks 2 -t 2
    llama-perplexity -m gemma-3-270m-q4_k_m.gguf -f short.txt -c 16 --chunks 2 -b 1 -ub 1 -t 2
Gemma's reference runs one token per pass (-b 1 -ub 1): llama.cpp's prompt-batch Q4_K/Q6_K kernels
round differently from its decode kernels, and Kinetic follows the decode kernels for every row.
These digit-for-digit comparisons pin the "ggml" numerics mode (--numerics ggml), the one that follows
llama.cpp's decode path whatever the default is. The "fast" mode sums in other per-row orders; each
mode must stay within PPL_TOLERANCE of llama-perplexity's -c 128 figures on the long text,
tests/data/golden/common-licenses.txt (figures in tests/data/golden/perplexity.txt).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kinetic import perplexity as ppl
from kinetic.errors import KineticError
from tests.cli.test_cli import assert_clean_failure
from tests.conftest import ALL_NUMERICS, GGML_FLAG, GOLDEN, model_path

TEXT = GOLDEN / "apache-2.0.txt"
LONG_TEXT = GOLDEN / "common-licenses.txt"
PPL_TOLERANCE = 0.005  # issue 23: each mode's perplexity within 0.5 % of llama-perplexity's


def kinetic(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kinetic.cli.main", "perplexity", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def short_text(tmp_path) -> Path:
    path = tmp_path / "short.txt"
    path.write_bytes(TEXT.read_bytes()[:1500])
    return path


def random_logits(rng: np.random.Generator, n: int, n_vocab: int, spread: float = 4.0) -> np.ndarray:
    return (rng.standard_normal((n, n_vocab)) * spread).astype(np.float32)  # f32 [n, n_vocab]


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


# -- the scoring functions, without a model -------------------------------------------------------


def test_token_nll_is_log_softmax():
    """token_nll is -log_softmax(logits)[target], to float32 rounding of the logit differences."""
    rng = np.random.default_rng(0)
    logits = random_logits(rng, 40, 1001)
    targets = rng.integers(0, 1001, 40)
    expected = -log_softmax64(logits)[np.arange(40), targets]
    np.testing.assert_allclose(ppl.token_nll(logits, targets), expected, rtol=0, atol=1e-5)


def test_perplexity_sums_formula():
    """PPL = exp(mean nll) and its error = PPL * sqrt((mean(nll^2) - mean^2) / (n - 1))."""
    nll = np.array([1.0, 2.0, 3.0, 2.5])
    sums = ppl.PerplexitySums()
    sums.add(nll[:2])
    sums.add(nll[2:])
    assert sums.count == 4 and sums.ppl == pytest.approx(np.exp(nll.mean()))
    assert sums.uncertainty() == pytest.approx(np.exp(nll.mean()) * np.sqrt(nll.var() / 3))


def test_quantized_rows_hold_log_probs():
    """A stored row gives back every log-probability within 16 nats of the top one to half a step."""
    rng = np.random.default_rng(1)
    n_vocab = 777  # odd: the row is padded to an even width
    logits = random_logits(rng, 9, n_vocab)
    targets = rng.integers(0, n_vocab, 9)
    rows, nll = ppl.quantize_log_probs(logits, targets)
    assert rows.shape == (9, ppl.row_width(n_vocab)) == (9, 782) and rows.dtype == np.uint16
    assert (rows[:, -1] == 0).all()  # padding
    exact = log_softmax64(logits)
    stored = ppl.stored_log_probs(rows, n_vocab)
    scale = np.ascontiguousarray(rows[:, :4]).view(np.float32)[:, :1]
    near = exact > exact.max(axis=1, keepdims=True) - 16
    assert (np.abs(stored - exact)[near] <= (scale * 0.5 + 1e-5).repeat(n_vocab, 1)[near]).all()
    np.testing.assert_allclose(nll, -exact[np.arange(9), targets], atol=1e-4)


def test_base_file_round_trip(tmp_path):
    """What KldBaseWriter writes, read_kld_base reads back: header, tokens and every row, at the
    size llama-perplexity's format gives."""
    rng = np.random.default_rng(2)
    n_ctx, n_vocab = 16, 300
    chunks = rng.integers(0, n_vocab, (3, n_ctx)).astype(np.int32)
    path = tmp_path / "base.kld"
    written = []
    with ppl.KldBaseWriter(path, chunks, n_vocab) as writer:
        for chunk in chunks:
            rows, _ = ppl.quantize_log_probs(random_logits(rng, ppl.scored_rows(n_ctx), n_vocab), chunk[9:])
            writer.write_rows(rows)
            written.append(rows)
    data = path.read_bytes()
    assert data[:8] == b"_logits_" and np.frombuffer(data[8:20], "<i4").tolist() == [n_ctx, n_vocab, 3]
    assert len(data) == 20 + 4 * 3 * n_ctx + 2 * 3 * 7 * (n_vocab + 4)
    base = ppl.read_kld_base(path)
    assert (base.n_ctx, base.n_vocab, base.n_chunk) == (n_ctx, n_vocab, 3)
    np.testing.assert_array_equal(base.tokens, chunks)
    np.testing.assert_array_equal(np.asarray(base.rows), np.stack(written))


def test_kld_against_itself_is_zero():
    """A model compared with its own stored log-probabilities: KLD ~ 0, same top token, same PPL
    (every logit within the 16 nats the file keeps)."""
    rng = np.random.default_rng(3)
    logits = random_logits(rng, 50, 500, spread=2.0)
    targets = rng.integers(0, 500, 50)
    rows, nll = ppl.quantize_log_probs(logits, targets)
    sums = ppl.KldSums()
    sums.add(logits, rows, targets)
    assert sums.count == 50 and sums.same_top == 50
    assert abs(sums.kld / sums.count) < 1e-4
    assert sums.log_ppl()[0] == pytest.approx(nll.mean(), abs=1e-6)
    assert sums.log_ppl_base()[0] == pytest.approx(nll.mean(), abs=1e-3)


def test_truncated_or_foreign_base_file_fails(tmp_path):
    """A base file cut short, or one without the header, raises KineticError with a hint."""
    chunks = np.zeros((2, 8), np.int32)
    path = tmp_path / "base.kld"
    with ppl.KldBaseWriter(path, chunks, 10) as writer:
        writer.write_rows(np.zeros((6, ppl.row_width(10)), np.uint16))  # both chunks
    path.write_bytes(path.read_bytes()[:-2 * 3 * ppl.row_width(10)])  # cut to one chunk of two
    with pytest.raises(KineticError, match="truncated") as info:
        ppl.read_kld_base(path)
    assert info.value.hint
    path.write_bytes(b"not a kld file at all")
    with pytest.raises(KineticError, match="does not look like"):
        ppl.read_kld_base(path)


class RecordingEngine:
    """Stands in for the engine: records each pass and returns its output rows' positions as logits."""

    def __init__(self):
        self.passes = []

    def new_sequence(self):
        self.passes.append("new")
        return object()

    def forward(self, rows, seqs):
        self.passes.append(rows)
        return rows.positions[rows.output_rows].astype(np.float32)[:, None]


def test_chunk_logits_scores_second_half():
    """One fresh sequence per chunk, BOS first, the last token never fed, positions consecutive across
    passes, and logits for exactly positions n_ctx/2 .. n_ctx-2, in order."""
    engine = RecordingEngine()
    chunk = np.arange(100, 120, dtype=np.int32)
    got = list(ppl.chunk_logits(engine, chunk, bos_id=1, batch=6))
    passes = engine.passes[1:]
    assert engine.passes[0] == "new" and "new" not in passes
    fed = np.concatenate([p.tokens for p in passes])
    np.testing.assert_array_equal(fed, [1, *range(101, 119)])
    np.testing.assert_array_equal(np.concatenate([p.positions for p in passes]), np.arange(19))
    assert [row for row, _ in got] == [0, 2, 8]
    np.testing.assert_array_equal(np.concatenate([lg[:, 0] for _, lg in got]), np.arange(10, 19))


# -- the command on real models -------------------------------------------------------------------


def test_smollm2_matches_llama_perplexity(smollm2_path, short_text):
    """SmolLM2 (no BOS) at -c 16: the running and final estimates llama-perplexity prints."""
    proc = kinetic(str(smollm2_path), str(short_text), "-c", "16", "--chunks", "2", *GGML_FLAG)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[1]11.8735,[2]78.3754,\nFinal estimate: PPL = 78.3754 +/- 75.85977\n"


def test_gemma_matches_llama_perplexity(gemma_path, short_text):
    """Gemma 3 (BOS first in every chunk) at -c 16, in passes of 4 rows: llama-perplexity's numbers."""
    proc = kinetic(str(gemma_path), str(short_text), "-c", "16", "--chunks", "2", "-b", "4", *GGML_FLAG)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[1]4.3540,[2]4.9756,\nFinal estimate: PPL = 4.9756 +/- 3.59480\n"


def llama_perplexity_figure(model_file: str, text: str) -> float:
    """llama-perplexity's final estimate at -c 128 on the whole of `text` (a file name), as
    tests/data/golden/perplexity.txt records it for `model_file`."""
    section = ""
    for line in (GOLDEN / "perplexity.txt").read_text().splitlines():
        if line.startswith("llama-perplexity") or line.startswith("The same"):
            section = line
        elif line.startswith(model_file) and text in section:
            return float(line.split("PPL = ")[1].split()[0])
    raise AssertionError(f"{model_file} on {text} not in perplexity.txt")


NAMES = {"SmolLM2-135M-Instruct.Q4_1.gguf": "smollm2-135m", "gemma-3-270m-q4_k_m.gguf": "gemma3-270m"}


@pytest.mark.parametrize("numerics", ALL_NUMERICS)
@pytest.mark.parametrize("model_file", list(NAMES))
def test_within_half_a_percent_of_llama_perplexity_on_the_long_text(model_file, numerics):
    """Each numerics mode, -c 128 on the long text (~6,200 tokens): the final perplexity is within
    0.5 % of llama-perplexity's (its default batch, tests/data/golden/perplexity.txt). On the short
    text (~1,100 scored tokens) two equally exact engines differ by ~0.46 % (one standard deviation:
    activation quantization re-draws its rounding error with any last-bit change; docs/numerics.md),
    so a 0.5 % bar is only meaningful on the longer text."""
    proc = kinetic(str(model_path(NAMES[model_file])), str(LONG_TEXT), "-c", "128", "--numerics", numerics,
                   timeout=900)
    assert proc.returncode == 0, proc.stderr
    ours = float(proc.stdout.split("PPL = ")[1].split()[0])
    expected = llama_perplexity_figure(model_file, LONG_TEXT.name)
    assert abs(ours / expected - 1) <= PPL_TOLERANCE, f"{ours} against llama-perplexity's {expected}"


def test_kl_divergence_round_trip(smollm2_path, short_text, tmp_path):
    """A base file written by the command and read back with the same model: the same PPL, KLD 0,
    the same top token everywhere."""
    base = tmp_path / "base.kld"
    proc = kinetic(str(smollm2_path), str(short_text), "-c", "16", "--chunks", "2", "--kl-divergence-base",
                   str(base), *GGML_FLAG)
    assert proc.returncode == 0, proc.stderr
    assert base.stat().st_size == 20 + 4 * 2 * 16 + 2 * 2 * 7 * (49152 + 4)
    proc = kinetic(str(smollm2_path), "--kl-divergence", str(base), *GGML_FLAG)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("chunk") and len(lines) == 3
    chunk, q, _, _, ratio, _, _, kld, _, _, rms, _, _, _, same_top, *_ = lines[2].split()
    assert (chunk, q, same_top) == ("2", "78.3755", "100.000")
    assert abs(float(ratio)) < 1e-4 and abs(float(kld)) < 1e-4 and float(rms) < 0.01


def test_bad_inputs_fail_cleanly(smollm2_path, short_text, tmp_path):
    """Missing text, odd or tiny -c, a text too short for -c, a truncated base file and a base file
    for another vocabulary: exit 1 with a message and a hint."""
    model = str(smollm2_path)
    assert_clean_failure(kinetic(model, str(tmp_path / "missing.txt")), "cannot read")
    assert_clean_failure(kinetic(model, str(short_text), "-c", "17"), "-c must be an even number")
    assert_clean_failure(kinetic(model, str(short_text), "-c", "4"), "-c must be an even number")
    assert_clean_failure(kinetic(model, str(short_text), "-c", "512"), "needs at least 1024")
    foreign = tmp_path / "foreign.kld"
    with ppl.KldBaseWriter(foreign, np.zeros((1, 8), np.int32), 10) as writer:
        writer.write_rows(np.zeros((3, ppl.row_width(10)), np.uint16))
    assert_clean_failure(kinetic(model, "--kl-divergence", str(foreign)), "vocabulary of 10 tokens")
    foreign.write_bytes(foreign.read_bytes()[:-2])
    assert_clean_failure(kinetic(model, "--kl-divergence", str(foreign)), "truncated")
