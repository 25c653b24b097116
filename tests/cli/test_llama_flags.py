"""llama.cpp's flags on run, chat, serve and bench (kinetic/cli/llama_flags.py): every row of the one
table parses as llama.cpp parses it (spellings, values read) and has the outcome the table says."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from kinetic.cli import main as cli
from kinetic.cli.llama_flags import LLAMA_FLAGS, ROPE_MODULE, Outcome, rows_for, table_text

COMMANDS = ("run", "chat", "serve", "bench")
ARG_CPP = Path.home() / ".cache/kinetic-ref/llama.cpp/common/arg.cpp"

# The flags of the documentation's "llama.cpp flags" table (docs/cli.md), each of which the table covers.
DOCUMENTED = """-m -p -n -c -t -s --temp --top-k --top-p --min-p --repeat-penalty --host --port --mmproj -sys
--system-prompt --temperature -dev -np -ctk -ctv -a -rea -ngl --n-gpu-layers -fa --flash-attn --jinja --mmap -cb
--cont-batching -nocb --no-cont-batching --no-warmup --metrics --slots --no-webui --embedding --embeddings -no-cnv
--no-conversation -st --single-turn -b --batch-size -ub --ubatch-size -tb --threads-batch --cache-reuse --numa --prio
--poll -to --timeout --threads-http -sm --split-mode -ts --tensor-split -mg --main-gpu -ot --override-tensor -cnv
--conversation -i --interactive --interactive-first --chat-template -md --model-draft --draft --draft-max
--draft-min -ngld -hf --hf-repo -mu --model-url -f --file --image --control-vector --control-vector-scaled --grammar
--grammar-file -j --json-schema --api-key-file --ssl-key-file --ssl-cert-file --mlock --no-mmap --lora --lora-scaled
--rope-scaling --rope-scale --rope-freq-base --rope-freq-scale --yarn-orig-ctx""".split()
OLDER_LLAMA_CPP = {"--mlock", "--mmap", "--no-mmap"}  # replaced by --load-mode in the reference build

# A value each MAPPED row's Kinetic option takes.
SAMPLE = {"-m": "model.gguf", "-p": "hello", "-n": "5", "-c": "1024", "-t": "2", "--seed": "42", "--temp": "0.5",
          "--top-k": "5", "--top-p": "0.9", "--min-p": "0.1", "--repeat-penalty": "1.1", "--host": "0.0.0.0",
          "--port": "9000", "--system": "be brief", "--device": "cpu", "--parallel": "2", "--alias": "x",
          "--reasoning": "on", "-ngl": "0", "--chat-template": "chatml", "--pooling": "mean",
          "--lora": "adapter.gguf", "--lora-scaled": "adapter.gguf:0.5"}


@functools.cache
def parser():
    return cli.build_parser()


def parse(command: str, *argv: str):
    args, extra = parser().parse_known_args([command, *argv])
    return args, extra


def values_for(row) -> list[str]:
    if row.nargs == 0:
        return []
    if row.outcome is Outcome.MAPPED:
        return [SAMPLE[row.note]]
    return [row.choices[0] if row.choices else "1"]


CASES = [(command, row, spelling) for command in COMMANDS for row in rows_for(command)
         for spelling in row.spellings if row.note != ROPE_MODULE]


@pytest.mark.parametrize(("command", "row", "spelling"), CASES,
                         ids=[f"{c}{s}" for c, _, s in CASES])
def test_every_row_parses_as_llama_cpp_does(command, row, spelling, capsys):
    """Each spelling reads exactly its row's values (the model after it stays the model) and then:
    MAPPED gives what the Kinetic option gives, ACCEPTED parses, REFUSED exits 2 saying what to use."""
    argv = [spelling, *values_for(row), "MODEL"]
    if row.outcome is Outcome.REFUSED:
        with pytest.raises(SystemExit) as stop:
            parse(command, *argv)
        assert stop.value.code == 2
        assert f"kinetic: {spelling} is a llama.cpp flag: {row.note}" in capsys.readouterr().err
        return
    args, extra = parse(command, *argv)
    assert args.model == "MODEL" and extra == []
    if row.outcome is Outcome.MAPPED:
        assert vars(args) == vars(parse(command, row.note, *values_for(row), "MODEL")[0])


@pytest.mark.parametrize(("llama", "kinetic"), [("CUDA0", "cuda"), ("none", "cpu"), ("Vulkan0", "vulkan"),
                                                ("cpu", "cpu")])
def test_device_names_translate(llama, kinetic):
    """-dev takes llama.cpp's device names (CUDA0, Vulkan0, none) as Kinetic's devices."""
    assert parse("run", "-dev", llama, "MODEL")[0].device == kinetic


def test_the_issue_examples_parse_as_llama_cpp(capsys):
    """-sys is the system prompt (not -s ys), -md a draft model (refused, not -m d), -ts 1,1 a tensor
    split (refused, not a thread count), --chat-template a template name."""
    args, _ = parse("run", "MODEL", "-sys", "be brief", "-fa", "on", "--chat-template", "chatml", "hi")
    assert (args.system, args.chat_template, args.sampling_seed) == ("be brief", "chatml", None)
    for flag, value in (("-md", "draft.gguf"), ("-ts", "1,1")):
        with pytest.raises(SystemExit):
            parse("run", "MODEL", flag, value, "hi")
        assert f"{flag} is a llama.cpp flag" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("run", "MODEL", "--chat-template", "llama3", "hi")
    assert "choose from 'chatml'" in capsys.readouterr().err


def test_every_documented_flag_has_a_row():
    """The documentation's llama.cpp flags are all in the table, for run, chat or serve."""
    spelled = {s for row in LLAMA_FLAGS for s in row.spellings if row.commands & {"run", "chat", "serve"}}
    assert sorted(set(DOCUMENTED) - spelled) == []


def test_no_flag_has_two_outcomes_on_one_command():
    """On each command a spelling has one row."""
    for command in COMMANDS:
        spellings = [s for row in rows_for(command) for s in row.spellings]
        assert len(spellings) == len(set(spellings)), command


def test_help_llama_prints_the_table(capsys):
    """--help-llama prints every row of the command, with its outcome, and exits 0."""
    with pytest.raises(SystemExit) as stop:
        parse("serve", "--help-llama")
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out == table_text("serve")
    assert "-ts, --tensor-split VALUE" in out and "Kinetic runs the model wholly on one device" in out


def llama_cpp_arities() -> dict[str, int]:
    """Every spelling common/arg.cpp defines, with the values it reads (0 or 1)."""
    text = ARG_CPP.read_text()
    arities: dict[str, int] = {}
    group = r'\{\s*("[^"]+"(?:\s*,\s*"[^"]+")*)\s*\}'
    for m in re.finditer(r"common_arg\(\s*" + group + r"(?:\s*,\s*" + group + r")?\s*,\s*", text):
        rest = text[m.end():]
        takes = 0
        first = re.match(r'"(?:[^"\\]|\\.)*"\s*(.)', rest, re.S)
        if first and first.group(1) == ",":
            after = rest[first.end():].lstrip()
            takes = 0 if after.startswith("[") else 1
        for spellings in (m.group(1), m.group(2) or ""):
            for s in re.findall(r'"([^"]+)"', spellings):
                arities.setdefault(s, takes)
    return arities


@pytest.mark.skipif(not ARG_CPP.is_file(), reason="llama.cpp's source is not on this machine")
def test_rows_match_llama_cpp_source():
    """Every spelling in the table that llama.cpp's common/arg.cpp defines reads as many values there
    as here; every row but the older builds' --mlock/--mmap/--no-mmap is in arg.cpp."""
    arities = llama_cpp_arities()
    assert arities["-ngl"] == 1 and arities["--jinja"] == 0 and arities["-no-cnv"] == 0  # the reader works
    for row in LLAMA_FLAGS:
        known = [s for s in row.spellings if s in arities]
        assert known or set(row.spellings) <= OLDER_LLAMA_CPP, row.spellings
        for s in known:
            assert arities[s] == (0 if row.nargs == 0 else 1), (s, row.nargs)


def test_the_documentation_lists_every_spelling():
    """docs/cli.md's "llama.cpp flags" table names every spelling of the table."""
    doc = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    section = doc[doc.index("## llama.cpp flags"):]
    assert [s for row in LLAMA_FLAGS for s in row.spellings if f"`{s}`" not in section] == []


def test_chat_template_by_name(smollm2_path):
    """--chat-template chatml renders plain ChatML in place of the file's own template (SmolLM2's adds
    a default system prompt); a name Kinetic does not have is refused with the names it has."""
    from kinetic.errors import KineticError
    from kinetic.model import Model

    messages = [{"role": "user", "content": "Hi"}]
    own = Model(smollm2_path, n_ctx=256, threads=2).apply_chat_template(messages)
    named = Model(smollm2_path, n_ctx=256, threads=2, chat_template="chatml").apply_chat_template(messages)
    assert "<|im_start|>system" in own and named == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(KineticError, match="no built-in chat template named 'llama3'") as err:
        Model(smollm2_path, n_ctx=256, chat_template="llama3")
    assert "chatml" in err.value.hint
