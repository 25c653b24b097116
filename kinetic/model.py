"""The Python API: `kinetic.Model`, one loaded model with its tokenizer, chat template and engine.

Owns: gluing the frontend (file, tokenizer, template, graph) to the runtime and the text-level
conveniences (tokenize, apply_chat_template, generate). Errors are KineticError with the CLI's
messages. Sampling here is greedy or plain temperature sampling; the full sampler chain arrives
with RAD-1 (issue 6).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kinetic import hub
from kinetic.errors import KineticError
from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.passes import PassOptions, run_pipeline
from kinetic.runtime.engine import DEFAULT_CONTEXT, Engine
from kinetic.runtime.weights import GGUFWeights


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    stop_reason: str = ""  # "stop" (end of turn), "length" (max_tokens or context)
    tokens: list[int] = field(default_factory=list)


class Model:
    """A GGUF model ready to run: `Model("smollm2-135m").generate("The capital of France is")`."""

    def __init__(self, path_or_name: str | os.PathLike, *, n_ctx: int = DEFAULT_CONTEXT,
                 chat_template_file: str | os.PathLike | None = None, options: Options | None = None,
                 device: str = "cpu", threads: int | None = None):
        self.path: Path = hub.resolve_model(path_or_name)
        self.gguf = open_gguf(self.path)
        self.graph = _optimize(lower(self.gguf, options))
        self.engine = Engine(self.graph, GGUFWeights(self.gguf), n_ctx=n_ctx, device=device, threads=threads)
        self._chat_template_file = chat_template_file
        self._tokenizer = None
        self._template = None
        self.last_stats = GenerationStats()

    @property
    def name(self) -> str:
        return str(self.gguf.metadata.get("general.name") or self.path.stem)

    # -- text ----------------------------------------------------------------------------------------

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from kinetic.frontend.tokenizer import Tokenizer

            self._tokenizer = Tokenizer.from_gguf(self.gguf)
        return self._tokenizer

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list | None = None, **template_kwargs) -> str:
        if self._template is None:
            from kinetic.frontend.chat import ChatTemplate

            self._template = ChatTemplate.from_gguf(self.gguf, override_path=self._chat_template_file)
        return self._template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                     **template_kwargs)

    # -- generation ----------------------------------------------------------------------------------

    def generate(self, prompt: str | list[int], max_tokens: int | None = None, temperature: float | None = None,
                 seed: int | None = None, stream: bool = False, return_tokens: bool = False):
        """Continue `prompt` (text, tokenized with special tokens parsed, or token ids).

        Returns the text (or the token ids with return_tokens=True); with stream=True, an iterator of
        text pieces (or of ids). temperature None or 0 is greedy.
        """
        ids = self._prompt_ids(prompt)
        pieces = self._generate_ids(ids, max_tokens, temperature, seed)
        if return_tokens:
            return pieces if stream else list(pieces)
        text = self._as_text(pieces)
        return text if stream else "".join(text)

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=True, parse_special=True)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise KineticError("the prompt is empty", "Give a prompt with at least one token.")
        bad = [t for t in ids if not 0 <= t < self.engine.n_vocab]
        if bad:
            raise KineticError(f"token id {bad[0]} is outside the vocabulary (0..{self.engine.n_vocab - 1})",
                               "Check the token ids of the prompt.")
        if len(ids) >= self.engine.n_ctx:
            raise KineticError(f"the prompt has {len(ids)} tokens, the context holds {self.engine.n_ctx}",
                               "Use a larger context (-c N) or a shorter prompt.")
        return ids

    def _generate_ids(self, ids: list[int], max_tokens: int | None, temperature: float | None,
                      seed: int | None) -> Iterator[int]:
        stats = self.last_stats = GenerationStats(prompt_tokens=len(ids))
        room = self.engine.n_ctx - len(ids)
        limit = room if max_tokens is None or max_tokens < 0 else min(max_tokens, room)
        rng = np.random.default_rng(seed)
        stop = set(self.tokenizer.eot_ids)
        seq = self.engine.new_sequence()
        start = time.perf_counter()
        logits = self.engine.prefill(seq, ids)
        stats.prompt_seconds = time.perf_counter() - start
        start = time.perf_counter()
        stats.stop_reason = "length"
        for _ in range(limit):
            token = _pick(logits, temperature, rng)
            stats.tokens.append(token)
            stats.generated_tokens += 1
            if token in stop:
                stats.stop_reason = "stop"
                break
            yield token
            if stats.generated_tokens < limit:
                logits = self.engine.decode(seq, token)
        stats.generate_seconds = time.perf_counter() - start

    def _as_text(self, ids: Iterator[int]) -> Iterator[str]:
        decoder = self.tokenizer.stream_decoder(skip_special=True)
        for token in ids:
            piece = decoder.push(token)
            if piece:
                yield piece
        tail = decoder.flush()
        if tail:
            yield tail


def _pick(logits: np.ndarray, temperature: float | None, rng: np.random.Generator) -> int:
    """Greedy for temperature None/<=0; else one uniform draw against the softmax at that temperature."""
    if not temperature or temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    cdf = np.cumsum(p / p.sum())
    return int(min(np.searchsorted(cdf, rng.random(), side="right"), len(cdf) - 1))


def _optimize(graph):
    """The lowered graph through the pass pipeline (verified after every pass)."""
    return run_pipeline(graph, PassOptions())
