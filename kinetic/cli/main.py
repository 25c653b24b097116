"""The `kinetic` command: parses the command line and dispatches to one module per subcommand.

Each subcommand is a module in kinetic/cli/ with `add_parser(subparsers)` and `run(args) -> int`,
listed once in COMMANDS. A copy or link of the executable named llama-server, llama-cli or
llama-completion runs as serve, chat (run when given a prompt) and run (`AS_LLAMA`).
Exit codes: 0 success, 1 the command failed, 2 invalid command line.
Every error prints `kinetic: MESSAGE` and then a line saying what to do; no traceback reaches the
user unless KINETIC_DEBUG is set.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from kinetic import __version__
from kinetic.errors import KineticError

# Subcommand modules, in the order `kinetic --help` lists them.
COMMANDS = ("run", "chat", "serve", "compile", "info", "pull", "models", "fit", "doctor", "bench", "perplexity",
            "verify", "verify-receipt", "keygen", "quantize")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# llama.cpp's program names -> the command a copy of kinetic under that name runs. llama-cli runs
# `run` (which becomes a chat when it has no prompt and stdin is a terminal, as llama-cli does).
AS_LLAMA = {"llama-server": "serve", "llama-cli": "run", "llama-completion": "run"}


class _Parser(argparse.ArgumentParser):
    """argparse that ends a usage error with a line saying what to do, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"kinetic: {message}\nRun `{self.prog} --help` for the options.\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kinetic", description="Run GGUF language models, compiled for this machine.")
    parser.add_argument("--version", action="version", version=f"kinetic {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"kinetic.cli.{name.replace('-', '_')}_cmd")
        module.add_parser(sub)
    return parser


def program_command(program: str) -> str | None:
    """The command a program name stands for (llama-server -> serve; `.exe` and paths ignored)."""
    name = os.path.basename(program)
    name = name[:-4] if name.lower().endswith(".exe") else name
    return AS_LLAMA.get(name)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
        command = program_command(sys.argv[0])
        if command is not None:
            argv = [command, *argv]
    parser = build_parser()
    from kinetic.lora import join_scaled_pairs

    args, extra = parser.parse_known_args(join_scaled_pairs(argv))  # llama.cpp's --lora-scaled FILE SCALE
    if extra:
        # A command may take free words after its options (`kinetic run MODEL --raw TEXT ...`).
        if getattr(args, "collect_words", None) and not any(w.startswith("-") and len(w) > 1 for w in extra):
            args.collect_words(args, extra)
        else:
            parser.error("unrecognized arguments: " + " ".join(extra))
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.run(args) or EXIT_OK)
    except KineticError as exc:
        sys.stderr.write(f"kinetic: {exc.message}\n")
        sys.stderr.write((exc.hint or "Run `kinetic COMMAND --help` for the options.") + "\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write("kinetic: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        if os.environ.get("KINETIC_DEBUG"):
            raise
        sys.stderr.write(f"kinetic: internal error: {type(exc).__name__}: {exc}\n")
        sys.stderr.write("This is a bug in Kinetic; rerun with KINETIC_DEBUG=1 for the traceback and report it.\n")
        return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
