"""Chat templates: golden renderings of llama.cpp, the Hugging Face names templates use, errors."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from kinetic.errors import KineticError
from kinetic.frontend.chat import CHATML_TEMPLATE, MAX_TEMPLATE_BYTES, ChatTemplate
from kinetic.frontend.gguf_file import open_gguf
from tests.conftest import load_golden


@pytest.mark.parametrize(
    ("name", "fixture"), [("smollm2-135m", "smollm2_path"), ("gemma3-270m", "gemma_path")]
)
def test_golden_renderings(name, fixture, request):
    """Every golden chat[].rendered comes out exactly from its messages (Gemma's via the ChatML fallback)."""
    template = ChatTemplate.from_gguf(open_gguf(request.getfixturevalue(fixture)))
    assert template.is_chatml_fallback == (name == "gemma3-270m")
    for case in load_golden(name)["chat"]:
        assert template.render(case["messages"], add_generation_prompt=True) == case["rendered"]


def test_bos_and_eos_texts_come_from_the_vocabulary(gemma_path):
    """bos_token and eos_token are the texts of the file's BOS and EOS tokens."""
    template = ChatTemplate.from_gguf(open_gguf(gemma_path))
    assert (template.bos_token, template.eos_token) == ("<bos>", "<eos>")


def test_override_file_wins(gemma_path, tmp_path):
    """--chat-template-file replaces the file's template (or the fallback)."""
    path = tmp_path / "t.jinja"
    path.write_text("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    template = ChatTemplate.from_gguf(open_gguf(gemma_path), override_path=path)
    assert template.render([{"role": "user", "content": "hi"}]) == "<bos>[user]hi"


def test_missing_override_file_is_a_clear_error(gemma_path, tmp_path):
    with pytest.raises(KineticError, match="cannot read chat template file"):
        ChatTemplate.from_gguf(open_gguf(gemma_path), override_path=tmp_path / "missing.jinja")


@pytest.mark.parametrize(("make", "error"), [
    (lambda tmp: Path("/dev/zero"), "is not a regular file"),
    (lambda tmp: tmp, "is not a regular file"),
    (lambda tmp: _fifo(tmp / "fifo"), "is not a regular file"),
    (lambda tmp: _write(tmp / "big.jinja", b"{{ x }}" * 200_000), "is larger than 1024 KiB"),
    (lambda tmp: _write(tmp / "bin.jinja", b"\x89PNG\r\n\x1a\n\xff\xfe"), r"not UTF-8 text \(invalid byte at offset 0"),
    (lambda tmp: _write(tmp / "nul.jinja", b"{{ x }}\x00\x00"), "holds NUL bytes"),
])
def test_unusable_override_file_is_a_clear_error(gemma_path, tmp_path, make, error):
    """A device, directory, FIFO, oversized, non-UTF-8 or binary template file is refused at once with
    a KineticError naming the file (/dev/zero is not read until memory runs out, a FIFO does not block)."""
    path = make(tmp_path)
    start = time.monotonic()
    with pytest.raises(KineticError, match=error) as info:
        ChatTemplate.from_gguf(open_gguf(gemma_path), override_path=path)
    assert str(path) in info.value.message
    assert time.monotonic() - start < 5


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_oversized_template_source_is_refused():
    """A template over 1 MiB (from a GGUF file or a string) is refused before it is compiled."""
    with pytest.raises(KineticError, match="chat template is larger than 1024 KiB"):
        ChatTemplate.from_string("x" * (MAX_TEMPLATE_BYTES + 1))
    assert ChatTemplate.from_string("x" * MAX_TEMPLATE_BYTES).render([]) == "x" * MAX_TEMPLATE_BYTES


def test_generation_prompt_is_optional():
    """add_generation_prompt=False leaves the assistant header off."""
    template = ChatTemplate.from_string(CHATML_TEMPLATE)
    text = template.render([{"role": "user", "content": "x"}], add_generation_prompt=False)
    assert text == "<|im_start|>user\nx<|im_end|>\n"


def test_tojson_arguments_and_tools():
    """tojson takes indent, ensure_ascii, sort_keys, separators like Hugging Face's; tools arrive as given."""
    src = ("{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}"
           "|{{ {'b': 1, 'a': 'é'} | tojson(sort_keys=true) }}|{{ {'a': 'é'} | tojson(ensure_ascii=true) }}"
           "|{{ [1, 2] | tojson(separators=[',', ':']) }}")
    tools = [{"type": "function", "function": {"name": "f", "description": "<b>&"}}]
    out = ChatTemplate.from_string(src).render([], tools=tools).split("|")
    assert out[0] == json.dumps(tools)  # no HTML escaping, unlike Jinja's own tojson
    assert out[1] == json.dumps(tools[0], indent=2)
    assert out[2:] == ['{"a": "é", "b": 1}', '{"a": "\\u00e9"}', "[1,2]"]


def test_template_kwargs_reach_the_template():
    """chat_template_kwargs such as enable_thinking are visible as top-level names."""
    src = "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>{% endif %}ok"
    template = ChatTemplate.from_string(src)
    assert template.render([], enable_thinking=False) == "<think>\n\n</think>ok"
    assert template.render([]) == "ok"


def test_strftime_now_and_loop_controls():
    """strftime_now gives the year; {% break %} works (loopcontrols), {% generation %} renders its body."""
    src = ("{{ strftime_now('%Y') | length }}{% for m in messages %}"
           "{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
           "{% generation %}G{% endgeneration %}")
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert ChatTemplate.from_string(src).render(msgs) == "4aG"


def test_raise_exception_names_the_line():
    """raise_exception in a template becomes a KineticError with the message and the template line."""
    src = "one\n{% if messages[0].role != 'system' %}\n{{ raise_exception('System first!') }}\n{% endif %}"
    with pytest.raises(KineticError, match=r"at line 3: the template refused the conversation: System first"):
        ChatTemplate.from_string(src).render([{"role": "user", "content": "x"}])


def test_syntax_error_names_the_line():
    with pytest.raises(KineticError, match="syntax error at line 2"):
        ChatTemplate.from_string("ok\n{% for x in %}\n")


def test_runtime_error_names_the_line():
    """A type error inside the template reports its line instead of a Python traceback."""
    with pytest.raises(KineticError, match="at line 2: TypeError"):
        template = ChatTemplate.from_string("a\n{{ messages[0].content + 1 }}")
        template.render([{"role": "user", "content": "x"}])


def test_messages_are_not_mutated():
    """The template works on a copy; the caller's messages stay as they were."""
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(KineticError):
        ChatTemplate.from_string("{{ messages.append(1) }}").render(msgs)
    assert msgs == [{"role": "user", "content": "x"}]


def test_non_data_messages_are_refused():
    with pytest.raises(KineticError, match="cannot use"):
        ChatTemplate.from_string("x").render([{"role": "user", "content": object()}])
