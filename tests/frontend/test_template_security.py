"""Template injection: payloads from public exploits must fail cleanly and touch nothing.

Each payload tries to create a marker file through Python internals; the test asserts a KineticError
and that the marker does not exist afterwards. A broken sandbox would create the file, so the test
can fail.
"""

from __future__ import annotations

import pytest

from kinetic.errors import KineticError
from kinetic.frontend.chat import ChatTemplate

PAYLOADS = {
    "class-mro-subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals-via-self": (
        "{{ self.__init__.__globals__.__builtins__.__import__('os').system('touch MARKER') }}"
    ),
    "cycler-init-globals": "{{ cycler.__init__.__globals__.os.popen('touch MARKER').read() }}",
    "joiner-init-globals": "{{ joiner.__init__.__globals__.os.system('touch MARKER') }}",
    "namespace-init-globals": "{{ namespace.__init__.__globals__.os.system('touch MARKER') }}",
    "lipsum-globals": "{{ lipsum.__globals__['os'].popen('touch MARKER').read() }}",
    "lipsum-globals-builtins": "{{ lipsum.__globals__.__builtins__.open('MARKER', 'w').write('x') }}",
    "template-reference-context": (
        "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('touch MARKER').read() }}"
    ),
    # CVE-2024-34359 (llama-cpp-python): the chat template from a GGUF file walks the subclasses of
    # object to reach os through a warnings class and runs a shell command.
    "cve-2024-34359": (
        "{% for x in ().__class__.__base__.__subclasses__() %}{% if \"warning\" in x.__name__ %}"
        "{{ x()._module.__builtins__['__import__']('os').popen('touch MARKER').read() }}"
        "{% endif %}{% endfor %}"
    ),
    # CVE-2026-5760 style (SGLang): a model's template rendered without a sandbox reaches os through
    # the globals of a Jinja helper and runs a command while the prompt is built.
    "cve-2026-5760-style": (
        "{% set x = lipsum.__globals__ %}{% for m in messages %}{{ m.content }}{% endfor %}"
        "{{ x['os'].system('touch MARKER') }}"
    ),
    "attr-filter-dunder": "{{ ''|attr('__class__')|attr('__mro__') }}",
    "format-string-attribute": "{{ '{0.__class__.__init__.__globals__}'.format(cycler) }}",
    "getattr-via-item": "{{ cycler['__init__']['__globals__']['os'].system('touch MARKER') }}",
    "config-items": "{{ config.items() }}{{ request.application.__globals__ }}",
    "huge-repeat": "{{ 'x' * 10000000000 }}",
    "huge-power": "{{ 10 ** 100000000 }}",
    "huge-range": "{% for i in range(100000000000) %}{% endfor %}",
    "list-mutation": "{% set l = [1] %}{{ l.append(2) }}{{ messages.clear() }}",
}


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_payload_fails_cleanly_without_side_effect(name, tmp_path, monkeypatch):
    """The payload raises KineticError (not a Python internals error) and no marker file appears."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "MARKER"
    source = PAYLOADS[name].replace("MARKER", str(marker))
    messages = [{"role": "user", "content": "hello"}]
    with pytest.raises(KineticError) as info:
        ChatTemplate.from_string(source).render(messages)
    assert "chat template" in info.value.message
    assert not marker.exists()
    assert messages == [{"role": "user", "content": "hello"}]


def test_marker_check_can_fail(tmp_path):
    """The side-effect check is real: an unsandboxed Jinja2 render of a payload does create the marker."""
    import jinja2

    marker = tmp_path / "MARKER"
    source = PAYLOADS["lipsum-globals"].replace("MARKER", str(marker))
    jinja2.Environment().from_string(source).render()
    assert marker.exists()
