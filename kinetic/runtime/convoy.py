"""Convoy's policy: which running answers put their rows into the next pass.

Owns: `compose`, the choice of the parts of one pass among the answers that want rows, and its
bound (`PassBudget`). Does not own the answers (generation.py), the pass itself (Engine.run), nor
the queue, the slots or the thread (scheduler.py).

The policy, per pass:
* every decoding answer (one that has its first token) is in it, with its one decode row or its
  draft tree: decoding never waits for a prompt;
* answers still reading their prompt add one part each while the prompt rows of the pass stay within
  `prompt_rows` (default: one grid chunk, `engine.batch` rows); the one that has read the fewest
  prompt tokens goes first (arrival order on ties), so a long prompt neither holds the decoders back
  by more than one chunk per pass nor starves a short prompt that arrives behind it; one prompt part
  always gets in, so every prompt advances;
* a part's size is set before it is asked for (the scheduler's `_bound_prompt`): an answer running
  beside others reads at most min(`prompt_rows`, Engine.prompt_pass) rows a pass (one grid chunk by
  default); one running alone reads the engine's big prompt passes (Engine.prompt_pass, 512 rows on
  the CPU: several grid chunks at once, cheaper a row). So a request that arrives while a lone
  prompt is read waits at most for the one big pass already asked for, then the bound holds;
* a device with a row limit (Capabilities.max_rows) takes parts in that order while they fit, the
  first one always.

Exactness does not depend on the policy: a row's bits do not depend on the other rows of its pass
(batch invariance), so any composition gives every answer what it gets alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kinetic.runtime.engine import SeqRows


class Member(Protocol):
    """A running answer as the policy sees it."""

    id: int  # arrival order
    want: SeqRows  # the rows it wants in the next pass

    @property
    def decoding(self) -> bool:
        """It has its first token: its rows are one decode row or a draft tree."""

    @property
    def n_prompt_processed(self) -> int:
        """Prompt tokens already in its cache."""


@dataclass(frozen=True)
class PassBudget:
    prompt_rows: int  # prompt rows a pass takes beside the decode rows (one chunk always gets in)
    max_rows: int | None = None  # the device's rows per pass (None: any number)


def compose(members: Sequence[Member], budget: PassBudget) -> list[Member]:
    """The members whose rows share the next pass, in the order of their parts (see the module's
    policy). Never empty when members is not."""
    decoding = sorted((m for m in members if m.decoding), key=lambda m: m.id)
    reading = sorted((m for m in members if not m.decoding), key=lambda m: (m.n_prompt_processed, m.id))
    chosen: list[Member] = []
    rows = prompt_rows = 0
    for m in decoding + reading:
        n = len(m.want.rows.tokens)
        if budget.max_rows is not None and chosen and rows + n > budget.max_rows:
            continue
        if not m.decoding:
            if prompt_rows and prompt_rows + n > budget.prompt_rows:
                continue
            prompt_rows += n
        chosen.append(m)
        rows += n
    return chosen
