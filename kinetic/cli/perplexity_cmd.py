"""`kinetic perplexity MODEL TEXTFILE`: llama-perplexity's score of a model on a text.

Prints the running estimate after every chunk ("[1]x,[2]y,...") and "Final estimate: PPL = X +/- Y"
on stdout, progress on stderr. --kl-divergence-base FILE also saves the log-probabilities in
llama-perplexity's format; --kl-divergence FILE compares the model against such a file, on the
tokens stored in it, and prints llama-perplexity's table and statistics. The scoring itself lives
in kinetic/perplexity.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from kinetic import perplexity as ppl
from kinetic.cli.runtime_options import add_numerics_arg
from kinetic.errors import KineticError

DEFAULT_CONTEXT = 512
MIN_CONTEXT = 8


def add_parser(sub) -> None:
    p = sub.add_parser("perplexity", help="score a model on a text as llama-perplexity does",
                       description="Perplexity of a model on a text, scored as llama.cpp's llama-perplexity "
                                   "scores it, and KL divergence against a saved base model.")
    p.add_argument("model", nargs="?", help="a .gguf file or a downloaded model's name")
    p.add_argument("textfile", nargs="?", help="the text to score (not needed with --kl-divergence)")
    p.add_argument("-m", "--model", dest="model_flag", metavar="MODEL", help="the model, as llama.cpp takes it")
    p.add_argument("-f", "--file", dest="file_flag", metavar="FILE", help="the text, as llama.cpp takes it")
    p.add_argument("-c", "--ctx-size", type=int, default=DEFAULT_CONTEXT, metavar="N",
                   help=f"tokens per chunk; the second half of each is scored [default: {DEFAULT_CONTEXT}]")
    p.add_argument("--chunks", type=int, default=-1, metavar="N", help="score at most N chunks [default: all]")
    p.add_argument("-b", "--batch-size", type=int, metavar="N",
                   help="rows per forward pass [default: the engine's prompt batch]")
    p.add_argument("--kl-divergence-base", metavar="FILE",
                   help="save the log-probabilities to FILE (llama-perplexity's format; never over an existing file)")
    p.add_argument("--force", action="store_true", help="replace the --kl-divergence-base FILE when it exists")
    p.add_argument("--kl-divergence", nargs="?", const="", metavar="FILE",
                   help="compare with the base log-probabilities in FILE (or in --kl-divergence-base's FILE)")
    p.add_argument("-t", "--threads", type=int, metavar="N", help="CPU threads [default: the engine's]")
    add_numerics_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    spec = args.model_flag or args.model
    if not spec:
        raise KineticError("no model given", "Usage: kinetic perplexity MODEL TEXTFILE; see `kinetic perplexity "
                                             "--help`.")
    if args.batch_size is not None and args.batch_size <= 0:
        raise KineticError(f"-b must be positive, not {args.batch_size}", "Give a batch size such as -b 64.")
    if args.threads is not None and args.threads <= 0:
        raise KineticError(f"-t must be positive, not {args.threads}", "Give a thread count such as -t 4.")
    if args.kl_divergence is not None:
        return _run_kl_divergence(args, spec)
    return _run_perplexity(args, spec)


# -- perplexity -----------------------------------------------------------------------------------


def _run_perplexity(args: argparse.Namespace, spec: str) -> int:
    n_ctx = args.ctx_size
    if n_ctx < MIN_CONTEXT or n_ctx % 2:
        raise KineticError(f"-c must be an even number of at least {MIN_CONTEXT}, not {n_ctx}",
                           "Give a chunk size such as -c 512.")
    text = _read_text(args.file_flag or args.textfile or (args.model if args.model_flag else None))
    model = _load(spec, n_ctx, args.threads, args.numerics)
    tokens = model.tokenize(text, add_special=True, parse_special=False)
    if len(tokens) < 2 * n_ctx:
        raise KineticError(f"the text has {len(tokens)} tokens; -c {n_ctx} needs at least {2 * n_ctx}",
                           "Use a longer text or a smaller -c.")
    chunks = ppl.split_chunks(tokens, n_ctx, args.chunks)
    if len(chunks) == 0:
        raise KineticError("--chunks 0 leaves nothing to score", "Give --chunks 1 or more, or leave it out.")
    batch = args.batch_size or model.engine.batch
    _say(f"perplexity: calculating perplexity over {len(chunks)} chunks, n_ctx={n_ctx}, batch_size={batch}")
    text_path = args.file_flag or args.textfile or (args.model if args.model_flag else None)
    writer = ppl.KldBaseWriter(args.kl_divergence_base, chunks, model.engine.n_vocab, force=args.force,
                               inputs={"the model file": model.path, "the text file": text_path}) \
        if args.kl_divergence_base else None
    sums = ppl.PerplexitySums()
    try:
        for i, chunk in enumerate(chunks):
            started = time.perf_counter()
            for row, logits in ppl.chunk_logits(model.engine, chunk, _bos(model), batch):
                targets = chunk[n_ctx // 2 + row + 1 : n_ctx // 2 + row + 1 + len(logits)]
                if writer:
                    rows, nll = ppl.quantize_log_probs(logits, targets)
                    writer.write_rows(rows)
                else:
                    nll = ppl.token_nll(logits, targets)
                sums.add(nll)
            if i == 0:
                _say_eta(time.perf_counter() - started, len(chunks))
            _out(f"[{i + 1}]{sums.ppl:.4f},")
    finally:
        if writer:
            writer.close()
    _out("\n")
    unc = sums.uncertainty()
    if unc is None:
        _say("perplexity: unexpected negative standard deviation of log(prob)")
        return 1
    _out(f"Final estimate: PPL = {sums.ppl:.4f} +/- {unc:.5f}\n")
    return 0


# -- KL divergence --------------------------------------------------------------------------------


_TABLE_HEAD = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              "
               "Δp RMS            Same top p")


def _run_kl_divergence(args: argparse.Namespace, spec: str) -> int:
    path = args.kl_divergence or args.kl_divergence_base
    if not path:
        raise KineticError("--kl-divergence needs the base file",
                           "Give it as --kl-divergence FILE (a file written with --kl-divergence-base).")
    if args.kl_divergence and args.kl_divergence_base:
        raise KineticError("--kl-divergence FILE reads a base file, --kl-divergence-base FILE writes one",
                           "Give one of them; llama.cpp's form is --kl-divergence-base FILE --kl-divergence.")
    base = ppl.read_kld_base(path)
    if args.textfile or args.file_flag:
        _say("perplexity: the text file is not used: --kl-divergence scores the tokens stored in the base file")
    model = _load(spec, base.n_ctx, args.threads, args.numerics)
    if base.n_vocab != model.engine.n_vocab:
        raise KineticError(f"{base.path} was written for a vocabulary of {base.n_vocab} tokens, the model has "
                           f"{model.engine.n_vocab}", "Compare models that share the base model's tokenizer.")
    if base.tokens.min() < 0 or base.tokens.max() >= base.n_vocab:
        raise KineticError(f"{base.path} holds token ids outside 0..{base.n_vocab - 1}",
                           "The file is damaged; write it again with --kl-divergence-base.")
    n_chunk = base.n_chunk if args.chunks < 0 else min(base.n_chunk, args.chunks)
    batch = args.batch_size or model.engine.batch
    _say(f"kl_divergence: computing over {n_chunk} chunks, n_ctx={base.n_ctx}, batch_size={batch}")
    sums, first = ppl.KldSums(), base.n_ctx // 2
    for i in range(n_chunk):
        started, chunk, stored = time.perf_counter(), base.tokens[i], base.rows[i]
        for row, logits in ppl.chunk_logits(model.engine, chunk, _bos(model), batch):
            targets = chunk[first + row + 1 : first + row + 1 + len(logits)]
            sums.add(logits, np.asarray(stored[row : row + len(logits)]), targets)
        if i == 0:
            _say_eta(time.perf_counter() - started, n_chunk)
            _out("\n" + _TABLE_HEAD + "\n")
        _out(_table_line(i + 1, sums) + "\n")
    _out("\n")
    if sums.count >= 100:  # llama.cpp keeps the statistics for at least 100 tokens
        _out(_kld_report(sums))
    return 0


def _table_line(chunk: int, s: ppl.KldSums) -> str:
    log_ppl, unc = s.log_ppl()
    ratio, ratio_unc = s.log_ppl_ratio()
    kld, kld_unc = ppl.mean_and_uncertainty(s.kld, s.kld2, s.count)
    rms, rms_unc = s.p_diff_rms()
    top, top_unc = s.same_top_p()
    return (f"{chunk:4d}    {np.exp(log_ppl):9.4f} ± {np.exp(log_ppl) * unc:9.4f}    {ratio:10.5f} ± {ratio_unc:10.5f}"
            f"    {kld:10.5f} ± {kld_unc:10.5f}    {100 * rms:6.3f} ± {100 * rms_unc:6.3f} %"
            f"    {100 * top:6.3f} ± {100 * top_unc:6.3f} %")


def _kld_report(s: ppl.KldSums) -> str:
    (log_q, dq), (log_b, db) = s.log_ppl(), s.log_ppl_base()
    q, b = np.exp(log_q), np.exp(log_b)
    cov = s.log_ppl_covariance()
    ratio, ratio_unc = s.log_ppl_ratio()
    diff_unc = np.sqrt(max((q * dq) ** 2 + (b * db) ** 2 - 2.0 * q * b * cov, 0.0))
    kld, kld_unc = ppl.mean_and_uncertainty(s.kld, s.kld2, s.count)
    p_diff, p_diff_unc = ppl.mean_and_uncertainty(s.p_diff, s.p_diff2, s.count)
    rms, rms_unc = s.p_diff_rms()
    top, top_unc = s.same_top_p()
    klds, p_diffs = np.sort(np.concatenate(s.kld_values)), np.sort(np.concatenate(s.p_diff_values))
    lines = ["====== Perplexity statistics ======",
             f"Mean PPL(Q)                   : {q:10.6f} ± {q * dq:10.6f}",
             f"Mean PPL(base)                : {b:10.6f} ± {b * db:10.6f}",
             f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * cov / (dq * db) if dq * db else 0.0:6.2f}%",
             f"Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6f} ± {ratio_unc:10.6f}",
             f"Mean PPL(Q)/PPL(base)         : {np.exp(ratio):10.6f} ± {np.exp(ratio) * ratio_unc:10.6f}",
             f"Mean PPL(Q)-PPL(base)         : {q - b:10.6f} ± {diff_unc:10.6f}", "",
             "====== KL divergence statistics ======",
             f"Mean    KLD: {kld:10.6f} ± {kld_unc:10.6f}",
             f"Maximum KLD: {klds[-1]:10.6f}"]
    lines += [f"{label}   KLD: {ppl.percentile(klds, f):10.6f}" for label, f in _KLD_PERCENTILES[:4]]
    lines.append(f"Median  KLD: {ppl.median(klds):10.6f}")
    lines += [f"{label}   KLD: {ppl.percentile(klds, f):10.6f}" for label, f in _KLD_PERCENTILES[4:]]
    lines += [f"Minimum KLD: {klds[0]:10.6f}", "", "====== Token probability statistics ======",
              f"Mean    Δp: {100 * p_diff:6.3f} ± {100 * p_diff_unc:5.3f} %",
              f"Maximum Δp: {100 * p_diffs[-1]:6.3f}%"]
    lines += [f"{label}   Δp: {100 * ppl.percentile(p_diffs, f):6.3f}%" for label, f in _P_DIFF_PERCENTILES[:5]]
    lines.append(f"Median  Δp: {100 * ppl.median(p_diffs):6.3f}%")
    lines += [f"{label}   Δp: {100 * ppl.percentile(p_diffs, f):6.3f}%" for label, f in _P_DIFF_PERCENTILES[5:]]
    lines += [f"Minimum Δp: {100 * p_diffs[0]:6.3f}%",
              f"RMS Δp    : {100 * rms:6.3f} ± {100 * rms_unc:5.3f} %",
              f"Same top p: {100 * top:6.3f} ± {100 * top_unc:5.3f} %"]
    return "\n".join(lines) + "\n"


_KLD_PERCENTILES = (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900),
                    ("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001))
_P_DIFF_PERCENTILES = (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900), ("75.0%", 0.750),
                       ("25.0%", 0.250), ("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001))


# -- helpers --------------------------------------------------------------------------------------


def _read_text(path: str | None) -> str:
    """The file's text; like llama.cpp's -f, one trailing newline is dropped."""
    if not path:
        raise KineticError("no text file given", "Usage: kinetic perplexity MODEL TEXTFILE (e.g. wiki.test.raw).")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise KineticError(f"cannot read {path}: {exc.strerror}", "Give the path of a text file to score.") from None
    text = data.decode("utf-8", errors="replace")
    return text[:-1] if text.endswith("\n") else text


def _load(spec: str, n_ctx: int, threads: int | None, numerics: str | None):
    from kinetic.frontend.blocks import Options
    from kinetic.model import Model

    return Model(spec, n_ctx=n_ctx, threads=threads, options=Options(numerics=numerics) if numerics else None)


def _bos(model) -> int | None:
    """The token each chunk starts with, where the model adds BOS."""
    tok = model.tokenizer
    return tok.bos_id if tok.add_bos and tok.bos_id is not None else None


def _say_eta(seconds: float, n_chunk: int) -> None:
    total = int(seconds * n_chunk)
    hours = f"{total // 3600} hours " if total >= 3600 else ""
    _say(f"perplexity: {seconds:.2f} seconds per pass - ETA {hours}{total % 3600 / 60:.2f} minutes")


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
