"""The template-payload corpus: templates that ask for unbounded time, memory or output.

Every payload must end in a KineticError that names the chat template (or a normal short render)
within the time budget plus the kill grace, while the renderer's peak resident memory stays under
the memory budget. The first ten runaways are the ones issue 16 found getting past the old
in-process caps; the rest are others of the same kinds (widths, fills, joins, doubling, recursion,
big integers).
Each runs under the default budget (2 s, 16 MiB of output, 512 MiB of memory), the one servers use.
"""

from __future__ import annotations

import resource
import time

import pytest

from kinetic.errors import KineticError
from kinetic.frontend.chat import DEFAULT_BUDGET, ChatTemplate
from kinetic.frontend.template_pool import GRACE_S, POOL

TIME, MEMORY, OUTPUT = "time budget", "memory budget", "output passed its budget"
RECURSION, SANDBOX, VALUE = "recursed too deeply", "sandbox forbids", "ValueError"
STOPPED = "renderer stopped"  # killed by the parent past the grace, inside one long C call
# Which limit a runaway reaches first depends on the machine's speed and load (a doubling string is
# out of memory on an idle machine and out of time on a busy one); any of them is a clean refusal.
BUDGET = {TIME, MEMORY, OUTPUT, STOPPED}

RUNAWAYS = {  # name -> a template that never stops asking for time, memory or output by itself
    "nested-loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "output-loop": "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"
                   "{% endfor %}",
    "tilde-doubling-namespace": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "plus-doubling-namespace": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                               "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "percent-width": "{{ '%0999999999d' % 1 }}",
    "format-filter": "{{ '%0999999999d'|format(1) }}",
    "center-filter": "{{ 'x'|center(999999999) }}",
    "indent-filter": "{{ 'a\nb'|indent(999999999) }}",
    "str-format-width": "{{ '{:999999999}'.format(1) }}",
    "tojson-indent": "{{ messages|tojson(indent=999999999) }}",
    "percent-star-width": "{{ '%*d' % (999999999, 1) }}",
    "nested-format-spec": "{{ '{:>{w}}'.format('x', w=999999999) }}",
    "ljust-method": "{{ 'x'.ljust(999999999) }}",
    "expandtabs-method": "{{ '\t'.expandtabs(999999999) }}",
    "replace-empty": "{{ ('x' * 1000000)|replace('', 'y' * 1000) }}",
    "join-separator": "{{ range(100000)|join('x' * 1000000) }}",
    "batch-fill": "{{ range(10)|batch(999999999, 'x')|list|length }}",
    "list-doubling": "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
                     "{% endfor %}{{ ns.l|length }}",
    "sum-of-lists": "{{ ([[1] * 1000000] * 1000)|sum(start=[])|length }}",
    "set-growth-loop": "{% set ns = namespace(s='') %}{% for i in range(100000) %}"
                       "{% set ns.s = ns.s ~ ('x' * 100000) %}{% endfor %}",
    "int-squaring": "{% set ns = namespace(n=10) %}{% for i in range(100) %}{% set ns.n = ns.n * ns.n %}"
                    "{% endfor %}{{ ns.n > 1 }}",
    "lipsum-paragraphs": "{{ lipsum(999999999) }}",
}
PAYLOADS = {  # name -> (template, the outcomes it may end in; "" is a normal short render)
    **{name: (source, BUDGET) for name, source in RUNAWAYS.items()},
    "macro-recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {RECURSION}),
    "recursive-loop": ("{% for i in range(100000) recursive %}{{ loop(range(100000)) }}{% endfor %}",
                       {RECURSION} | BUDGET),
    "strftime-width": ("{{ strftime_now('%0999999999Y') }}", BUDGET | {""}),
    "repeat-past-cap": ("{{ 'x' * 1000000 * 1000 }}", {SANDBOX}),
    "power-past-cap": ("{{ 10 ** 100000000 }}", {SANDBOX}),
    "huge-int-to-text": ("{{ (10 ** 1000) ** 1000 }}", {VALUE}),
}
MESSAGES = [{"role": "user", "content": "hello"}]
RSS_BOUND = DEFAULT_BUDGET.max_memory_bytes + 64 * 1024 * 1024  # the budget plus the renderer's own ~25 MB


def _outcome(source: str) -> str:
    try:
        text = ChatTemplate.from_string(source).render(MESSAGES)
    except KineticError as error:
        assert error.message.startswith("chat template"), error.message
        kinds = (TIME, MEMORY, OUTPUT, RECURSION, SANDBOX, VALUE, STOPPED)
        return next((kind for kind in kinds if kind in error.message), error.message)
    assert len(text) < 1000
    return ""


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_payload_ends_cleanly_within_the_budget(name):
    """The payload ends in one of its expected outcomes, within the time budget plus the kill grace,
    with the renderer's peak RSS under the memory budget plus its own size."""
    source, expected = PAYLOADS[name]
    start = time.monotonic()
    outcome = _outcome(source)
    elapsed = time.monotonic() - start
    assert outcome in expected
    assert elapsed < DEFAULT_BUDGET.timeout_s + GRACE_S + 3.0  # 3 s for starting a fresh renderer
    assert POOL.peak_rss_bytes < RSS_BOUND


def test_memory_the_template_asks_for_is_not_the_callers():
    """A template that builds a 100-million-character string leaves this process's peak RSS where it was."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert _outcome("{{ '%0100000000d' % (messages|length) }}") == OUTPUT
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert after - before < 64 * 1024 * 1024
