"""Perplexity and KL divergence, computed as llama.cpp's llama-perplexity computes them.

Owns: cutting a token stream into chunks (BOS first where the model adds one), running a chunk
through the engine for the logits of its scored half, the negative log-likelihoods with the same
float/double split as llama.cpp, the running and final estimates with their uncertainties, and
llama-perplexity's `--kl-divergence-base` file (written and read byte for byte in its format).
Does not own: reading the text file, command-line options or printing (kinetic/cli/perplexity_cmd.py).

The scoring rule: in a chunk of n_ctx tokens only positions first = n_ctx/2 .. n_ctx-2 are scored,
each predicting the token after it, so every scored token has at least n_ctx/2 tokens of context.

The base file, all little-endian:
    b"_logits_", n_ctx i32, n_vocab i32, n_chunk i32, tokens i32 [n_chunk * n_ctx],
    then per chunk (n_ctx - 1 - n_ctx/2) rows of nv = 2*((n_vocab+1)/2) + 4 uint16 each: a row starts
    with two f32 (scale, min_log_prob) and holds round((logit - min_logit) / scale) for each token,
    where min_logit = max(min logit, max logit - 16) and scale = (max - min_logit) / 65535; a token's
    log-probability is scale * q + min_log_prob.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kinetic.errors import KineticError
from kinetic.ir.rows import PassRows
from kinetic.outputs import Inputs, atomic_output, check_output

MAGIC = b"_logits_"
HEADER_BYTES = len(MAGIC) + 3 * 4
LOG_PROB_FLOOR = np.float32(16.0)  # log-probabilities more than this below the top one are stored as 0
ROW_BLOCK = 16  # rows per numpy block when scoring, to bound temporaries on 262k-token vocabularies


def row_width(n_vocab: int) -> int:
    """uint16 values per stored row: two f32 (four uint16), then the vocabulary padded to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_rows(n_ctx: int) -> int:
    """How many positions of a chunk are scored: n_ctx/2 .. n_ctx-2."""
    return n_ctx - 1 - n_ctx // 2


# -- chunks and logits ----------------------------------------------------------------------------


def split_chunks(tokens: list[int], n_ctx: int, max_chunks: int = -1) -> np.ndarray:
    """The first whole chunks of the token stream, i32 [n_chunk, n_ctx]; max_chunks < 0 takes all."""
    n_chunk = len(tokens) // n_ctx
    if max_chunks >= 0:
        n_chunk = min(n_chunk, max_chunks)
    return np.asarray(tokens[: n_chunk * n_ctx], np.int32).reshape(n_chunk, n_ctx)


def chunk_logits(engine, chunk: np.ndarray, bos_id: int | None, batch: int) -> Iterator[tuple[int, np.ndarray]]:
    """Runs one chunk through a fresh sequence, batch rows per pass; yields (row, logits f32 [n, n_vocab])
    for the scored positions in order, `row` counting from the first scored position.

    The chunk's first token becomes BOS when bos_id is given (llama-perplexity does the same). The
    last token is never fed: it is only predicted, and attention is causal.
    """
    fed = chunk[:-1].copy()
    if bos_id is not None:
        fed[0] = bos_id
    first, last = len(chunk) // 2, len(chunk) - 2
    seq = engine.new_sequence()
    for start in range(0, len(fed), batch):
        piece = fed[start : start + batch]
        wanted = np.arange(max(first, start), min(last, start + len(piece) - 1) + 1) - start
        rows = PassRows.chain(piece, start)
        if len(wanted) == 0:  # still fills the cache; one output row is the cheapest the engine allows
            engine.forward(replace(rows, output_rows=np.array([len(piece) - 1], np.int32)), {0: seq})
            continue
        logits = engine.forward(replace(rows, output_rows=wanted.astype(np.int32)), {0: seq})
        yield start + int(wanted[0]) - first, logits


# -- negative log-likelihoods ---------------------------------------------------------------------


def _max_and_log_sum_exp(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the max logit (f32) and log(sum(expf(logit - max))) summed in double (f64)."""
    top = logits.max(axis=1)
    sum_exp = np.exp(logits - top[:, None]).sum(axis=1, dtype=np.float64)
    return top, np.log(sum_exp)


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log p(target) per row, f64 [n]: (logit - max) in f32, the log-sum-exp in double."""
    out = np.empty(len(targets), np.float64)
    for i in range(0, len(targets), ROW_BLOCK):
        block, tok = logits[i : i + ROW_BLOCK], targets[i : i + ROW_BLOCK]
        top, lse = _max_and_log_sum_exp(block)
        picked = block[np.arange(len(tok)), tok]
        out[i : i + ROW_BLOCK] = lse - (picked - top).astype(np.float64)
    return out


def quantize_log_probs(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stored rows, uint16 [n, row_width], and -log p(target) computed in f32 as llama.cpp does
    when it writes a base file, f64 [n]."""
    n, n_vocab = logits.shape
    rows = np.zeros((n, row_width(n_vocab)), np.uint16)
    nll = np.empty(n, np.float64)
    for i in range(0, n, ROW_BLOCK):
        block, tok = logits[i : i + ROW_BLOCK], targets[i : i + ROW_BLOCK]
        top, lse = _max_and_log_sum_exp(block)
        lse = lse.astype(np.float32)
        low = np.maximum(block.min(axis=1), top - LOG_PROB_FLOOR)
        scale = (top - low) / np.float32(65535)
        header = np.stack([scale, low - top - lse], axis=1).astype(np.float32)  # f32 [b, 2]
        rows[i : i + len(block), :4] = header.view(np.uint16)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(scale != 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
        q = np.rint(inv[:, None] * (block - low[:, None]))
        q = np.where(block > low[:, None], q, 0).astype(np.int32).astype(np.uint16)  # C's int -> uint16
        rows[i : i + len(block), 4 : 4 + n_vocab] = q
        nll[i : i + ROW_BLOCK] = top + lse - block[np.arange(len(tok)), tok]
    return rows, nll


def stored_log_probs(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """Log-probabilities from stored rows, f32 [n, n_vocab]: scale * q + min_log_prob."""
    header = np.ascontiguousarray(rows[:, :4]).view(np.float32)  # f32 [n, 2]
    return header[:, :1] * rows[:, 4 : 4 + n_vocab] + header[:, 1:2]


# -- estimates ------------------------------------------------------------------------------------


@dataclass
class PerplexitySums:
    """Running sums of the scored tokens' -log p; PPL = exp(mean)."""

    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0

    def add(self, nll: np.ndarray) -> None:
        self.nll += float(nll.sum())
        self.nll2 += float((nll * nll).sum())
        self.count += len(nll)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.count)

    def uncertainty(self) -> float | None:
        """PPL's standard error, ppl * sqrt(var(nll) / (count - 1)); None where the variance is not positive."""
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        return math.sqrt(var / (self.count - 1)) * self.ppl if var > 0 else None


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """Mean and its standard error; the error is 0 for 10 or fewer values (llama.cpp's rule)."""
    if count < 1:
        return 0.0, 0.0
    mean = total / count
    var = total2 / count - mean * mean
    return mean, (math.sqrt(var / (count - 1)) if var > 0 and count > 10 else 0.0)


@dataclass
class KldSums:
    """Sums over scored tokens comparing a model (Q) with stored base log-probabilities."""

    nll: float = 0.0
    nll2: float = 0.0
    nll_base: float = 0.0
    nll_base2: float = 0.0
    nll_nll_base: float = 0.0
    kld: float = 0.0
    kld2: float = 0.0
    p_diff: float = 0.0
    p_diff2: float = 0.0
    p_diff4: float = 0.0
    max_p_diff: float = 0.0
    same_top: int = 0
    count: int = 0
    kld_values: list[np.ndarray] = field(default_factory=list)  # f32 per token, for the percentiles
    p_diff_values: list[np.ndarray] = field(default_factory=list)

    def add(self, logits: np.ndarray, base_rows: np.ndarray, targets: np.ndarray) -> None:
        for i in range(0, len(targets), ROW_BLOCK):
            self._add_block(logits[i : i + ROW_BLOCK], base_rows[i : i + ROW_BLOCK], targets[i : i + ROW_BLOCK])

    def _add_block(self, logits: np.ndarray, base_rows: np.ndarray, targets: np.ndarray) -> None:
        # Each quantity in f32 where llama.cpp keeps a float, summed in double.
        n = np.arange(len(targets))
        top, lse = _max_and_log_sum_exp(logits)
        lse = lse.astype(np.float32)
        nll = top + lse - logits[n, targets]  # f32 [b]
        base = stored_log_probs(base_rows, logits.shape[1])  # f32 [b, n_vocab]
        nll_base = -base[n, targets]
        self.nll += float(nll.sum(dtype=np.float64))
        self.nll2 += float((nll * nll).sum(dtype=np.float64))
        self.nll_base += float(nll_base.sum(dtype=np.float64))
        self.nll_base2 += float((nll_base * nll_base).sum(dtype=np.float64))
        self.nll_nll_base += float((nll * nll_base).sum(dtype=np.float64))
        # KL(base || Q) = sum p_base (log p_base - log q), over base tokens within 16 nats of the floor
        log_norm = (top + lse)[:, None]
        terms = np.exp(base) * (base - logits + log_norm)
        kld = np.where(base > -LOG_PROB_FLOOR, terms, 0).sum(axis=1, dtype=np.float64)
        self.kld += float(kld.sum())
        self.kld2 += float((kld * kld).sum())
        self.same_top += int(np.count_nonzero(logits.argmax(axis=1) == base.argmax(axis=1)))
        self.count += len(targets)
        p_diff = np.exp(-nll) - np.exp(-nll_base)  # f32 [b]
        p_diff2 = (p_diff * p_diff).astype(np.float64)
        self.p_diff += float(p_diff.sum(dtype=np.float64))
        self.p_diff2 += float(p_diff2.sum())
        self.p_diff4 += float((p_diff2 * p_diff2).sum())
        self.max_p_diff = max(self.max_p_diff, float(np.abs(p_diff).max(initial=0)))
        self.kld_values.append(kld.astype(np.float32))
        self.p_diff_values.append(p_diff)

    def log_ppl(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.nll, self.nll2, self.count)

    def log_ppl_base(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.nll_base, self.nll_base2, self.count)

    def log_ppl_covariance(self) -> float:
        if self.count < 10:
            return 0.0
        n = self.count
        return (self.nll_nll_base / n - (self.nll / n) * (self.nll_base / n)) / (n - 1)

    def log_ppl_ratio(self) -> tuple[float, float]:
        (q, dq), (b, db) = self.log_ppl(), self.log_ppl_base()
        return q - b, math.sqrt(max(dq * dq + db * db - 2.0 * self.log_ppl_covariance(), 0.0))

    def p_diff_rms(self) -> tuple[float, float]:
        mse, dmse = mean_and_uncertainty(self.p_diff2, self.p_diff4, self.count)
        rms = math.sqrt(mse)
        return rms, (0.5 / rms * dmse if rms > 0 else 0.0)

    def same_top_p(self) -> tuple[float, float]:
        p = self.same_top / self.count
        return p, (math.sqrt(p * (1 - p) / (self.count - 1)) if self.count > 1 else 0.0)


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama.cpp's interpolated percentile of an ascending array, in f32."""
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    p = np.float32(fraction) * np.float32(len(sorted_values) - 1)
    ip = int(p)
    p -= np.float32(ip)
    hi = sorted_values[min(ip + 1, len(sorted_values) - 1)]
    return float((np.float32(1) - p) * sorted_values[ip] + p * hi)


def median(sorted_values: np.ndarray) -> float:
    n = len(sorted_values)
    if n % 2:
        return float(sorted_values[n // 2])
    return float(np.float32(0.5) * (sorted_values[n // 2] + sorted_values[n // 2 - 1]))


# -- the base file --------------------------------------------------------------------------------


class _Incomplete(Exception):
    """Ends a base file's atomic write without putting it in place (not every row came)."""


class KldBaseWriter:
    """Writes a base file: the header and tokens at once, then each chunk's rows as they come.

    Through kinetic.outputs: the path is refused when it exists (unless force) or is one of
    `inputs`; the rows go to a temporary file that close() puts in place only when every row the
    header promises was written, so an interrupted run leaves no base file (and an older one as it
    was)."""

    def __init__(self, path: str | os.PathLike, chunks: np.ndarray, n_vocab: int, *, force: bool = False,
                 inputs: Inputs | None = None):
        self.path = check_output(path, inputs=inputs, force=force)
        self.n_vocab = n_vocab
        n_chunk, n_ctx = chunks.shape
        self._rows_left = n_chunk * scored_rows(n_ctx)
        self._output = atomic_output(self.path, force=force)
        self._file = self._output.__enter__()  # left by close()
        self._file.write(MAGIC + np.array([n_ctx, n_vocab, n_chunk], "<i4").tobytes())
        self._file.write(chunks.astype("<i4").tobytes())

    def write_rows(self, rows: np.ndarray) -> None:
        self._file.write(rows.astype("<u2").tobytes())
        self._rows_left -= len(rows)

    def close(self) -> None:
        """Put the file in place if it is complete; else remove what was written."""
        output, self._output = self._output, None
        if output is None:
            return
        if self._rows_left == 0:
            output.__exit__(None, None, None)
        else:
            output.__exit__(_Incomplete, _Incomplete(), None)

    def __enter__(self) -> KldBaseWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class KldBase:
    """A base file, read lazily: tokens i32 [n_chunk, n_ctx]; chunk_rows(i) gives uint16 [rows, nv]."""

    path: Path
    n_ctx: int
    n_vocab: int
    tokens: np.ndarray
    rows: np.ndarray  # uint16 [n_chunk, scored_rows(n_ctx), row_width(n_vocab)], memory-mapped

    @property
    def n_chunk(self) -> int:
        return len(self.tokens)


def read_kld_base(path: str | os.PathLike) -> KldBase:
    """Opens and checks a base file written by llama-perplexity or by Kinetic."""
    path = Path(path)
    if not path.is_file():
        raise KineticError(f"no such file: {path}", "Write one first with --kl-divergence-base FILE.")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[: len(MAGIC)] != MAGIC:
        raise KineticError(f"{path} does not look like a file of log-probabilities (no {MAGIC.decode()} header)",
                           "Give a file written with --kl-divergence-base by kinetic or llama-perplexity.")
    n_ctx, n_vocab, n_chunk = (int(v) for v in np.frombuffer(head, "<i4", 3, len(MAGIC)))
    if n_ctx < 4 or n_vocab < 1 or n_chunk < 1:
        raise KineticError(f"{path} has a bad header (n_ctx {n_ctx}, n_vocab {n_vocab}, {n_chunk} chunks)",
                           "The file is damaged; write it again with --kl-divergence-base.")
    rows_offset = HEADER_BYTES + 4 * n_chunk * n_ctx
    shape = (n_chunk, scored_rows(n_ctx), row_width(n_vocab))
    expected = rows_offset + 2 * math.prod(shape)
    if size < expected:
        raise KineticError(f"{path} is truncated: {size} bytes, its header promises {expected}",
                           "The file is incomplete; write it again with --kl-divergence-base.")
    tokens = np.fromfile(path, "<i4", n_chunk * n_ctx, offset=HEADER_BYTES).reshape(n_chunk, n_ctx)
    rows = np.memmap(path, "<u2", "r", rows_offset, shape)
    return KldBase(path, n_ctx, n_vocab, tokens, rows)
