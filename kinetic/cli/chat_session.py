"""One terminal conversation with a model: its messages, its cache, and its last answer.

Owns: `ChatSession`, the state `kinetic chat` keeps between turns (the messages, the system prompt,
reasoning on or off, the sampling settings) and one turn: render the conversation through the
model's chat template, keep the part of the conversation's sequence that the new prompt starts with
and feed only the rest, run the runtime's generation loop (kinetic/runtime/generation.py) and split
the streamed text into reasoning and content (the server's ReasoningSplitter). Each turn's answer
is what a fresh run of the same prompt gives: the kept cache entries are what a fresh prefill
computes (batch invariance), so a receipt of any turn verifies by rerunning it alone.

Zero Wait (seed 000): `run_ahead(draft)` runs the conversation with the message being typed up to
just before its last word (and one token less: the text's last token may merge with the next
keystroke), only in whole batches from where the answer will start (GenerationRequest.prefill_only,
as /v1/prefill), never to the end of the turn. It gives way at once to `answer` and to a newer
draft: both cancel it, and it stops after the pass in flight. What it ran stays in the conversation's
sequence, so after Enter only what is new runs; the answer is the one a cold run gives (the runs
ahead are cut on the same grid, docs/warm-start.md).
Does not own the terminal (chat_cmd.py: which edits reach run_ahead, from which thread), generation or
sampling.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from kinetic.errors import KineticError
from kinetic.runtime.generation import Finished, GenerationRequest, Piece
from kinetic.runtime.sampling import SamplingSettings
from kinetic.server.textstream import THINK_CLOSE, THINK_OPEN, ReasoningSplitter

REASONING, CONTENT = "reasoning", "content"


@dataclass(frozen=True)
class Turn:
    """One finished answer: what went in and what came out (everything a receipt needs)."""

    messages: list[dict]  # the conversation the template rendered, the new user message last
    prompt_ids: list[int]
    reused: int  # prompt tokens already in the conversation's cache
    text: str  # the answer as generated, reasoning included
    finished: Finished


class ChatSession:
    def __init__(self, model, sampling: SamplingSettings, *, max_tokens: int | None = None,
                 system: str | None = None, reasoning: str = "off", ignore_eos: bool = False):
        self.model = model
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos  # go on past the end of turn (llama.cpp's --ignore-eos)
        self.system = system or None
        self.reasoning = reasoning  # "on", "off" or "auto" (the template's own choice)
        self.messages: list[dict] = []
        self.last: Turn | None = None
        self._sequence = None  # the engine sequence holding the conversation so far
        self._rendered = ""  # the last prompt's text
        self._running = threading.Lock()  # one answer or run ahead at a time on the sequence
        self._guard = threading.Lock()  # guards the two fields below
        self._ahead: threading.Event | None = None  # cancels the run ahead in flight
        self._answering = False  # an answer waits or runs: no run ahead starts

    @property
    def thinks(self) -> bool:
        """The model's template knows reasoning blocks (<think> ... </think>)."""
        source = self.model.chat_template.source
        return THINK_OPEN in source and THINK_CLOSE in source

    @property
    def cached(self) -> int:
        """Tokens of the conversation in its cache (its prompt and answer but the answer's last token)."""
        return 0 if self._sequence is None else len(self._sequence.tokens)

    def clear(self) -> None:
        """A new conversation (the system prompt stays); the cache is rolled back on the next turn."""
        self.messages = []

    def set_system(self, text: str | None) -> None:
        self.system = text or None
        self.clear()

    def toggle_reasoning(self) -> str:
        self.reasoning = "off" if self.reasoning == "on" else "on"
        return self.reasoning

    def set_sampling(self, **changes) -> SamplingSettings:
        from kinetic.cli.sampling_options import apply_sampling

        self.sampling = apply_sampling(self.sampling, changes)
        return self.sampling

    def run_ahead(self, draft: str, cancelled: threading.Event | None = None) -> int:
        """Zero Wait: run the conversation with `draft` as the next message up to just before its last
        word, in whole batches (module docstring); returns the conversation's tokens now held. A newer
        run ahead or an answer cancels it after the pass in flight; it runs nothing while an answer
        waits or runs, nor with Warm Start off (nothing would be reused)."""
        cancelled = cancelled or threading.Event()
        with self._guard:
            if self._answering or getattr(self.model, "warm", None) is None:
                return self.cached
            if self._ahead is not None:
                self._ahead.set()
            self._ahead = cancelled
        with self._running:
            if cancelled.is_set():
                return self.cached
            ids = self._ahead_ids(draft)
            if not ids:
                return self.cached
            sequence, _ = self._reuse(ids + [-1])  # keeps all of ids the sequence shares
            request = GenerationRequest(tuple(ids), self.sampling, prefill_only=True)
            for _ in self.model.generator.generate(request, cancelled, sequence=sequence):
                pass
            return self.cached

    def cancel_ahead(self) -> None:
        """Stop the run ahead in flight after its pass (a newer draft is coming)."""
        with self._guard:
            if self._ahead is not None:
                self._ahead.set()

    def _ahead_ids(self, draft: str) -> list[int]:
        """The prompt ids a run ahead may compute for `draft` ([] when there is no whole word yet)."""
        from kinetic.server.prefill_api import prefix_before_last_word

        messages = self._with_system() + [{"role": "user", "content": draft}]
        try:
            ids = self._prompt_ids(messages)
        except KineticError:  # too long for the context: the answer will say so
            return []
        cut = prefix_before_last_word(self._rendered, draft)
        if cut is None:
            return []
        ahead = self.model.tokenize(cut, add_special=True, parse_special=True)[:-1]
        return ahead[:len(ids) - 1]

    def answer(self, text: str, cancelled: threading.Event | None = None) -> Iterator[tuple[str, str]]:
        """Ask `text`: yields (REASONING or CONTENT, text) as the answer streams; afterwards `last` is
        the turn and the answer (as far as it got, when cancelled) is part of the conversation. A run
        ahead in flight stops after its pass; what it ran is reused."""
        with self._guard:
            self._answering = True
            if self._ahead is not None:
                self._ahead.set()
        try:
            with self._running:
                yield from self._answer(text, cancelled)
        finally:
            with self._guard:
                self._answering = False

    def _answer(self, text: str, cancelled: threading.Event | None) -> Iterator[tuple[str, str]]:
        messages = self._with_system() + [{"role": "user", "content": text}]
        ids = self._prompt_ids(messages)
        sequence, reused = self._reuse(ids)
        request = GenerationRequest(tuple(ids), self.sampling, self.max_tokens, ignore_eos=self.ignore_eos)
        generation = self.model.generator.generate(request, cancelled, sequence=sequence)
        started = self.thinks and self._rendered.rstrip().endswith(THINK_OPEN)
        splitter = ReasoningSplitter(started=started) if self.thinks else None
        pieces: list[str] = []
        finished = None
        for event in generation:
            if isinstance(event, Piece) and event.text:
                pieces.append(event.text)
                yield from _split(splitter, event.text)
            elif isinstance(event, Finished):
                finished = event
        if splitter is not None:
            reasoning, content = splitter.flush()
            yield from ((kind, t) for kind, t in ((REASONING, reasoning), (CONTENT, content)) if t)
        answer = "".join(pieces)
        reused = finished.cached_tokens if finished is not None else reused  # Warm Start may restore more
        self.last = Turn(messages, ids, reused, answer, finished)
        if answer or finished.generated_tokens:
            self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]

    def _with_system(self) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.messages

    def _prompt_ids(self, messages: list[dict]) -> list[int]:
        kwargs = {} if self.reasoning == "auto" or not self.thinks else {"enable_thinking": self.reasoning == "on"}
        self._rendered = self.model.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
        ids = self.model.tokenize(self._rendered, add_special=True, parse_special=True)
        if len(ids) >= self.model.n_ctx:
            raise KineticError(f"the conversation has {len(ids)} tokens and the context holds {self.model.n_ctx}",
                               "Type /clear to start a new conversation, or start chat with a larger -c.")
        return ids

    def _reuse(self, ids: list[int]):
        """The conversation's sequence cut back to the longest prefix it shares with `ids` (at least one
        token of `ids` left to feed), and how many tokens that keeps."""
        engine = self.model.engine
        if self._sequence is None:
            self._sequence = engine.new_sequence()
        held = self._sequence.tokens
        keep = 0
        limit = min(len(held), len(ids) - 1) if getattr(self.model, "warm", None) is not None else 0  # --off warm-start
        while keep < limit and held[keep] == ids[keep]:
            keep += 1
        engine.rollback(self._sequence, keep)
        return self._sequence, keep

    def settings_text(self) -> str:
        s = self.sampling
        fields = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")
        return ", ".join(f"{name} {getattr(s, name)}" for name in fields)


def _split(splitter: ReasoningSplitter | None, text: str) -> Iterator[tuple[str, str]]:
    if splitter is None:
        yield CONTENT, text
        return
    reasoning, content = splitter.feed(text)
    if reasoning:
        yield REASONING, reasoning
    if content:
        yield CONTENT, content
