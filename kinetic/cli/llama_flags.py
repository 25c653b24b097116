"""llama.cpp's command-line flags on Kinetic's commands: one table, read by run, chat, serve and bench.

Owns: `LLAMA_FLAGS`, every llama.cpp flag the documentation lists (spellings and argument counts as
llama.cpp's common/arg.cpp reads them), each with its outcome on each command: MAPPED (the Kinetic
option it is another name for), ACCEPTED (parsed and not needed, with the reason) or REFUSED (a
usage error, exit 2, saying what to use instead); `add_llama_flags(parser, command)`, which
registers the table's rows on a command's parser, and `--help-llama`, which prints them.
Does not own the Kinetic options themselves (each command module defines its own; a MAPPED row
only adds llama.cpp's other spellings of one) nor the rotary flags (kinetic/cli/rope_options.py
defines them; their rows here say so and register nothing).

argparse has no public way to look an option up by its spelling, so `_target` reads the parser's
`_option_string_actions` (stable since Python 3.2); the table test checks every MAPPED row resolves.
"""

from __future__ import annotations

import argparse
import enum
import re
import sys
from dataclasses import dataclass

RUN, CHAT, SERVE, BENCH = "run", "chat", "serve", "bench"
ALL = frozenset({RUN, CHAT, SERVE, BENCH})
GENERATE = frozenset({RUN, CHAT})  # the commands that take a prompt (llama-cli, llama-completion)
LOADS = frozenset({RUN, CHAT, SERVE})  # the commands with the runtime options (-c, --device, ...)
ROPE_MODULE = "kinetic.cli.rope_options"


class Outcome(enum.Enum):
    MAPPED = "works, as"
    ACCEPTED = "accepted and not needed:"
    REFUSED = "refused:"


@dataclass(frozen=True)
class LlamaFlag:
    """One llama.cpp flag on some commands. `nargs`: the values llama.cpp reads after it (0, 1, or
    "?" for a value it may go without). `note`: MAPPED, the Kinetic option (or ROPE_MODULE);
    ACCEPTED, why Kinetic does not need it; REFUSED, what to use instead. `choices`: the values
    llama.cpp takes, checked on ACCEPTED rows. `values`: MAPPED, llama.cpp value patterns
    (case-insensitive regular expressions) and the Kinetic value each becomes."""

    spellings: tuple[str, ...]
    nargs: int | str
    outcome: Outcome
    note: str
    commands: frozenset[str] = ALL
    choices: tuple[str, ...] | None = None
    values: tuple[tuple[str, str], ...] = ()


def _mapped(spellings, nargs, target, commands=LOADS, **kw) -> LlamaFlag:
    return LlamaFlag(tuple(spellings), nargs, Outcome.MAPPED, target, frozenset(commands), **kw)


def _accepted(spellings, nargs, why, commands=ALL, **kw) -> LlamaFlag:
    return LlamaFlag(tuple(spellings), nargs, Outcome.ACCEPTED, why, frozenset(commands), **kw)


def _refused(spellings, nargs, instead, commands=ALL) -> LlamaFlag:
    return LlamaFlag(tuple(spellings), nargs, Outcome.REFUSED, instead, frozenset(commands))


_ON_OFF_AUTO = ("on", "off", "auto", "1", "0", "true", "false", "enabled", "disabled")
_BY_ITSELF = "Kinetic does this by itself"
_ONE_DEVICE = "Kinetic runs the model wholly on one device; choose it with --device"
_NO_DRAFT = "speculative decoding is automatic and needs no draft model"

LLAMA_FLAGS: tuple[LlamaFlag, ...] = (
    # -- the same option under llama.cpp's name --------------------------------------------------
    _mapped(("-m", "--model"), 1, "-m", ALL),
    _mapped(("-p", "--prompt"), 1, "-p", GENERATE),
    _mapped(("-n", "--predict", "--n-predict"), 1, "-n", GENERATE),
    _mapped(("-c", "--ctx-size"), 1, "-c"),
    _mapped(("-t", "--threads"), 1, "-t", ALL),
    _mapped(("-s", "--seed"), 1, "--seed"),
    _mapped(("--temp", "--temperature"), 1, "--temp"),
    _mapped(("--top-k",), 1, "--top-k"),
    _mapped(("--top-p",), 1, "--top-p"),
    _mapped(("--min-p",), 1, "--min-p"),
    _mapped(("--repeat-penalty",), 1, "--repeat-penalty"),
    _mapped(("--host",), 1, "--host", {SERVE}),
    _mapped(("--port",), 1, "--port", {SERVE}),
    _mapped(("-sys", "--system-prompt"), 1, "--system", GENERATE),
    _mapped(("-dev", "--device"), 1, "--device", ALL,
            values=(("none|cpu", "cpu"), (r"cuda\d*", "cuda"), (r"vulkan\d*", "vulkan"))),
    _mapped(("-np", "--parallel"), 1, "--parallel", {SERVE}),
    _mapped(("-a", "--alias"), 1, "--alias", {SERVE}),
    _mapped(("-rea", "--reasoning"), 1, "--reasoning", GENERATE),
    _mapped(("-ngl", "--gpu-layers", "--n-gpu-layers"), 1, "-ngl", ALL),
    _mapped(("--chat-template",), 1, "--chat-template"),
    _mapped(("--ignore-eos",), 0, "--ignore-eos", {CHAT}),
    *(_mapped((flag,), 1, ROPE_MODULE, {RUN, CHAT, SERVE}) for flag in (
        "--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx",
        "--yarn-ext-factor", "--yarn-attn-factor", "--yarn-beta-fast", "--yarn-beta-slow")),
    # -- parsed, and not needed ---------------------------------------------------------------------
    _accepted(("-np", "--parallel"), 1, "one conversation runs at a time", GENERATE),
    _accepted(("-rea", "--reasoning"), 1, "each request chooses (chat_template_kwargs.enable_thinking, or "
              "Ollama's think)", {SERVE}, choices=_ON_OFF_AUTO),
    _accepted(("-fa", "--flash-attn"), "?", "attention is always fused, in one pass over the cache",
              choices=_ON_OFF_AUTO),
    _accepted(("--jinja",), 0, "chat templates always run as Jinja, in a sandbox"),
    _accepted(("--mmap",), 0, "GGUF files are always memory-mapped"),
    _accepted(("--no-mmap",), 0, "the file is memory-mapped read-only, which costs no extra memory"),
    _accepted(("--mlock",), 0, "the mapped weights are read on every pass, so the system keeps them in memory"),
    _accepted(("-lm", "--load-mode"), 1, "GGUF files are always memory-mapped"),
    _accepted(("-cb", "--cont-batching"), 0, _BY_ITSELF),
    _accepted(("-nocb", "--no-cont-batching"), 0, _BY_ITSELF),
    _accepted(("--no-warmup",), 0, "kernels are compiled once and cached, with no warm-up pass to skip"),
    _accepted(("--metrics",), 0, "/metrics is always served", {SERVE}),
    _accepted(("--slots",), 0, "/slots is always served", {SERVE}),
    _accepted(("--no-webui", "--no-ui"), 0, "the chat page at / is always served"),
    _accepted(("-no-cnv", "--no-conversation"), 0, "kinetic run answers one prompt", {RUN, SERVE, BENCH}),
    _accepted(("-cnv", "--conversation"), 0, "kinetic chat is a conversation", {CHAT}),
    _accepted(("-i", "--interactive"), 0, "kinetic chat is interactive", {CHAT}),
    _accepted(("-if", "--interactive-first"), 0, "kinetic chat waits for the first message", {CHAT}),
    _accepted(("-st", "--single-turn"), 0, "kinetic run answers one prompt", {RUN, SERVE, BENCH}),
    _accepted(("-b", "--batch-size"), 1, "Kinetic sizes its prompt passes itself"),
    _accepted(("-ub", "--ubatch-size"), 1, "Kinetic sizes its prompt passes itself"),
    _accepted(("-tb", "--threads-batch"), 1, "-t sets the threads of every pass"),
    _accepted(("--cache-reuse",), 1, _BY_ITSELF),
    _accepted(("--numa",), 1, _BY_ITSELF),
    _accepted(("--prio",), 1, _BY_ITSELF),
    _accepted(("--poll",), 1, _BY_ITSELF),
    _accepted(("-to", "--timeout"), 1, _BY_ITSELF),
    _accepted(("--threads-http",), 1, _BY_ITSELF),
    _accepted(("-ctk", "--cache-type-k"), 1, "the cache holds f16, llama.cpp's default (other types are "
              "not supported yet)", LOADS, choices=("f16",)),
    _accepted(("-ctv", "--cache-type-v"), 1, "the cache holds f16, llama.cpp's default (other types are "
              "not supported yet)", LOADS, choices=("f16",)),
    # -- no equivalent ----------------------------------------------------------------------------
    _refused(("-sm", "--split-mode"), 1, _ONE_DEVICE),
    _refused(("-ts", "--tensor-split"), 1, _ONE_DEVICE),
    _refused(("-mg", "--main-gpu"), 1, _ONE_DEVICE),
    _refused(("-ot", "--override-tensor"), 1, _ONE_DEVICE),
    _accepted(("-cmoe", "--cpu-moe"), 0, "Kinetic places a mixture-of-experts model's experts itself "
              "(Flywheel, docs/moe.md); on the CPU every expert runs there", LOADS),
    _accepted(("-ncmoe", "--n-cpu-moe"), 1, "Kinetic places a mixture-of-experts model's experts itself "
              "(Flywheel, docs/moe.md); on the CPU every expert runs there", LOADS),
    _refused(("-cnv", "--conversation"), 0, "use kinetic chat <model>", {RUN, SERVE, BENCH}),
    _refused(("-no-cnv", "--no-conversation"), 0, "for one answer, use kinetic run <model> <prompt>", {CHAT}),
    _refused(("-st", "--single-turn"), 0, "for one answer, use kinetic run <model> <prompt>", {CHAT}),
    _refused(("-i", "--interactive"), 0, "use kinetic chat <model>", {RUN, SERVE, BENCH}),
    _refused(("-if", "--interactive-first"), 0, "use kinetic chat <model>", {RUN, SERVE, BENCH}),
    _refused(("-sys", "--system-prompt"), 1, "the system prompt is part of each request's messages", {SERVE}),
    _refused(("-md", "--model-draft", "--spec-draft-model"), 1, _NO_DRAFT),
    _refused(("--draft", "--draft-n", "--draft-max"), 1, _NO_DRAFT),
    _refused(("--draft-min", "--draft-n-min"), 1, _NO_DRAFT),
    _refused(("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl"), 1, _NO_DRAFT),
    _refused(("-hf", "-hfr", "--hf-repo"), 1, "download with kinetic pull <org>/<repo>[:<quant>], then run it "
             "by name"),
    _refused(("-mu", "--model-url"), 1, "download with kinetic pull <org>/<repo>[:<quant>], then run it by name"),
    _refused(("-f", "--file"), 1, "pipe the prompt in: kinetic run <model> < prompt.txt"),
    _refused(("--image", "--audio", "--video"), 1, "images, audio and video are not supported yet"),
    _refused(("-mm", "--mmproj"), 1, "vision models are not supported yet"),
    _mapped(("--lora",), 1, "--lora"),  # kinetic.lora: merged at load (docs/lora.md)
    _mapped(("--lora-scaled",), 1, "--lora-scaled"),
    _refused(("--lora", "--lora-scaled"), 1, "run the adapter with kinetic run/chat/serve MODEL --lora FILE",
             {BENCH}),
    _refused(("--control-vector",), 1, "control vectors are not supported yet"),
    _refused(("--control-vector-scaled",), 1, "control vectors are not supported yet"),
    _refused(("--grammar",), 1, "constrained output is in the server, through grammar and response_format"),
    _refused(("--grammar-file",), 1, "constrained output is in the server, through grammar and response_format"),
    _refused(("-j", "--json-schema"), 1, "constrained output is in the server, through grammar and "
             "response_format"),
    _mapped(("--embedding", "--embeddings"), 0, "--embedding", {SERVE}),
    _refused(("--embedding", "--embeddings"), 0, "embeddings are served: kinetic serve MODEL --embedding, or "
             "kinetic.Model(MODEL).embed(texts)", {RUN, CHAT, BENCH}),
    _mapped(("--reranking", "--rerank"), 0, "--reranking", {SERVE}),
    _refused(("--reranking", "--rerank"), 0, "reranking is served: kinetic serve MODEL --reranking",
             {RUN, CHAT, BENCH}),
    _mapped(("--pooling",), 1, "--pooling", {SERVE}),
    _refused(("--pooling",), 1, "pooling is an embedding server's: kinetic serve MODEL --embedding --pooling TYPE",
             {RUN, CHAT, BENCH}),
    _refused(("--ignore-eos",), 0, "kinetic chat takes it; in the server, each request sets ignore_eos",
             {RUN, SERVE}),
    _refused(("--api-key-file",), 1, "pass the key itself with --api-key"),
    _refused(("--ssl-key-file",), 1, "the server speaks plain HTTP; put a TLS proxy in front"),
    _refused(("--ssl-cert-file",), 1, "the server speaks plain HTTP; put a TLS proxy in front"),
)


def rows_for(command: str) -> list[LlamaFlag]:
    return [row for row in LLAMA_FLAGS if command in row.commands]


def add_llama_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Register the table's rows for `command` on its parser (after the command's own options, which
    MAPPED rows point at), and --help-llama."""
    parser.add_argument("--help-llama", action=_HelpLlama, command=command,
                        help="list llama.cpp's flags and what each does here, then exit")
    for row in rows_for(command):
        if row.outcome is Outcome.MAPPED:
            _add_mapped(parser, row)
        elif row.outcome is Outcome.ACCEPTED:
            takes = {"action": "store_true"} if row.nargs == 0 else {
                "nargs": _argparse_nargs(row.nargs), "choices": row.choices,
                "const": True if row.nargs == "?" else None}
            parser.add_argument(*row.spellings, dest=f"llama_{row.spellings[-1].lstrip('-').replace('-', '_')}",
                                default=argparse.SUPPRESS, help=argparse.SUPPRESS, **takes)
        else:
            parser.add_argument(*row.spellings, nargs=_argparse_nargs(row.nargs), action=_Refuse,
                                instead=row.note, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                                help=argparse.SUPPRESS)


def _argparse_nargs(nargs: int | str):
    return 0 if nargs == 0 else None if nargs == 1 else nargs


def _target(parser: argparse.ArgumentParser, spelling: str) -> argparse.Action | None:
    return parser._option_string_actions.get(spelling)  # no public lookup (module docstring)


def _add_mapped(parser: argparse.ArgumentParser, row: LlamaFlag) -> None:
    if row.note == ROPE_MODULE:
        return  # kinetic/cli/rope_options.py defines these under llama.cpp's own spellings
    target = _target(parser, row.note)
    if target is None:
        raise AssertionError(f"{row.spellings[0]} maps to {row.note}, which this parser lacks")
    new = [s for s in row.spellings if _target(parser, s) is None]
    clashing = [s for s in row.spellings if _target(parser, s) not in (None, target)]
    if clashing:
        raise AssertionError(f"{clashing} already means something else than {row.note}")
    if not new:
        return
    common = {"dest": target.dest, "default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
    if target.nargs == 0:  # a switch
        parser.add_argument(*new, action="store_const", const=target.const, **common)
        return
    parser.add_argument(*new, type=_translating(row, target.type), choices=target.choices,
                        metavar=target.metavar, **common)


def _translating(row: LlamaFlag, kind):
    """The target's type, after llama.cpp's value names become Kinetic's (-dev CUDA0 -> cuda)."""
    def convert(text: str):
        for pattern, value in row.values:
            if re.fullmatch(pattern, text, flags=re.IGNORECASE):
                text = value
                break
        return kind(text) if kind is not None else text

    convert.__name__ = getattr(kind, "__name__", "value")  # argparse names the type in its errors
    return convert


class _Refuse(argparse.Action):
    """A llama.cpp flag with no equivalent: reads its values as llama.cpp would, then stops (exit 2)."""

    def __init__(self, option_strings, dest, instead: str = "", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.instead = instead

    def __call__(self, parser, namespace, values, option_string=None):
        parser.exit(2, f"kinetic: {option_string} is a llama.cpp flag: {self.instead}\n"
                       f"Run `{parser.prog} --help-llama` for llama.cpp's flags and what each does here.\n")


class _HelpLlama(argparse.Action):
    def __init__(self, option_strings, dest, command: str = "", **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.command = command

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write(table_text(self.command))
        parser.exit(0)


def table_text(command: str) -> str:
    """The rows for `command`, grouped by outcome, as --help-llama prints them."""
    lines = [f"llama.cpp flags on kinetic {command} (docs/cli.md, \"llama.cpp flags\"):"]
    for outcome in Outcome:
        rows = [r for r in rows_for(command) if r.outcome is outcome]
        if not rows:
            continue
        lines.append("")
        lines.append({Outcome.MAPPED: "Work as in llama.cpp, under these Kinetic options:",
                      Outcome.ACCEPTED: "Accepted and not needed:",
                      Outcome.REFUSED: "Refused (exit 2), with what to use instead:"}[outcome])
        for row in rows:
            flags = ", ".join(row.spellings) + ("" if row.nargs == 0 else " [VALUE]" if row.nargs == "?"
                                                 else " VALUE")
            note = ("the rotary options (see --help)" if row.note == ROPE_MODULE else row.note)
            lines.append(f"  {flags:<44} {note}")
    return "\n".join(lines) + "\n"
