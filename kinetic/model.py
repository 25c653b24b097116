"""The Python API: `kinetic.Model`, one loaded model with its tokenizer, chat template and engine.

Owns: gluing the frontend (file, tokenizer, template, graph) to the runtime and the text-level
conveniences (tokenize, apply_chat_template, generate). Errors are KineticError with the CLI's
messages. generate() is an adapter over the runtime's generation loop (kinetic/runtime/generation.py,
the one the server's scheduler runs too); tokens are chosen by kinetic.runtime.sampling's Sampler
(llama.cpp's sampler chain, one uniform per token), with defaults from the file's general.sampling.*
keys.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kinetic import hub
from kinetic.compiler import compile_graph
from kinetic.embeddings import as_matrix, embedding_setup, inputs_to_ids, make_embedder, rerank_ids
from kinetic.errors import KineticError
from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import open_gguf
from kinetic.ktc.load import load_if_ktc, required_signer, stderr_note
from kinetic.limits import MAX_BATCH, check_threads
from kinetic.numerics_mode import choose_numerics
from kinetic.runtime.embedding import Embedder, is_embedding_graph
from kinetic.runtime.engine import DEFAULT_CONTEXT, Engine
from kinetic.runtime.generation import Generation, GenerationRequest, Generator, Piece
from kinetic.runtime.sampling import SamplingSettings, settings_from_metadata
from kinetic.runtime.sampling.settings import SettingError, token_limit
from kinetic.runtime.speculative import SpeculativeDecoder
from kinetic.runtime.warm import DEFAULT_MEMORY_BYTES, WarmStore, model_key
from kinetic.runtime.weights import GGUFWeights

if TYPE_CHECKING:
    from kinetic.frontend.template_pool import RenderBudget
    from kinetic.grammar import Grammar, GrammarMatcher
    from kinetic.runtime.engine import Sequence


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    stop_reason: str = ""  # "stop" (end of turn), "length" (max_tokens or context)
    tokens: list[int] = field(default_factory=list)
    sampling: SamplingSettings | None = None  # the settings used, with the seed actually drawn from
    drafted: int = 0  # RAD-1's guessed rows and the guesses it kept
    accepted: int = 0
    cached_tokens: int = 0  # prompt tokens not computed (Warm Start: an earlier call's state)
    draft_sources: dict[str, tuple[int, int]] = field(default_factory=dict)  # RAD-1: drafter -> (guessed, kept)


class Model:
    """A GGUF model ready to run: `Model("smollm2-135m").generate("The capital of France is")`."""

    def __init__(self, path_or_name: str | os.PathLike, *, n_ctx: int = DEFAULT_CONTEXT,
                 chat_template_file: str | os.PathLike | None = None, options: Options | None = None,
                 device: str = "cpu", threads: int | None = None, draft: bool = True,
                 gpu_layers: int | None = None, template_budget: RenderBudget | None = None,
                 require_signature: str | bytes | None = None, chat_template: str | None = None,
                 warm_start: bool = True, cache_dir: str | os.PathLike | None = None,
                 warm_memory_bytes: int = DEFAULT_MEMORY_BYTES, batch: int | None = None, pooling: str | None = None,
                 shortlist: bool = True, off: list[str] | str | None = None, lora=None,
                 prompt_pass: int | None = None):
        """`require_signature`: a public key (64 hex digits, a file holding them, or 32 bytes); only a
        .ktc file it signed loads. Without it, $KINETIC_REQUIRE_SIGNATURE when set (docs/security.md).
        `chat_template`: a built-in template's name (kinetic.frontend.chat.BUILTIN_TEMPLATES), as
        llama.cpp's --chat-template NAME, in place of the file's template.
        `warm_start`: keep the states prompts leave behind and start each prompt from the longest
        prefix stored (docs/warm-start.md; exact, so it changes only speed): in memory, up to
        `warm_memory_bytes`, and under `cache_dir` too when given (kept across restarts;
        kinetic.runtime.warm_disk.default_directory() is where the CLI keeps them).
        `batch`: prompt rows per pass, the grid prompts are cut on [default: the .ktc profile's, else 128].
        `prompt_pass`: the prompt rows one pass takes at most, whole grid chunks (Engine.prompt_pass;
        default: the .ktc profile's, else the engine's, 512 on the CPU); speed only, the same bits.
        `pooling`: an embedding model's pooling (none, mean, cls, last, rank) in place of the file's,
        as llama.cpp's --pooling (docs/embeddings.md).
        `shortlist`: score only the output layer's rows that can win when a request allows it
        (docs/shortlist.md; exact, so it changes only speed); False is --off shortlist.
        `off`: the command line's --off list (["rad1", "shortlist", "warm-start"], or "rad1,shortlist"),
        the same answer, only slower; `draft=False` is the older spelling of off=["rad1"].
        `lora`: LoRA adapters merged into the weights at load (docs/lora.md): a path, (path, scale), a
        kinetic.lora.Adapter, or a list of them.
        A model that cannot be loaded raises KineticError, a RuntimeError."""
        from kinetic.bench import parse_off
        from kinetic.lora import as_adapters, merge_adapters

        turned_off = parse_off(",".join(off) if isinstance(off, (list, tuple)) else off)
        draft = draft and "rad1" not in turned_off
        shortlist = shortlist and "shortlist" not in turned_off
        warm_start = warm_start and "warm-start" not in turned_off
        self.adapters = as_adapters(lora)
        _check_template_name(chat_template)
        threads = check_threads(threads)
        signer = required_signer(require_signature)
        self.path: Path = hub.resolve_model(path_or_name)
        # a .ktc file: checked (its graph against its weights), its graph and profile used (kinetic/ktc/load.py)
        self.ktc = load_if_ktc(self.path, require_signer=signer)
        if self.ktc and self.adapters:
            raise KineticError(f"{self.path.name} is a .ktc file; LoRA adapters merge into GGUF weights",
                               "Run the adapter with the GGUF file the .ktc was compiled from.")
        self.gguf = self.ktc.gguf if self.ktc else merge_adapters(open_gguf(self.path), self.adapters)
        # what a receipt records of how the graph was lowered and optimized (its numerics mode chosen here)
        self.options = replace(options or Options(), numerics=choose_numerics(
            requested=options and options.numerics, stored=self.ktc.numerics if self.ktc else None, device=device,
            note=stderr_note))
        self.graph = self.ktc.graph(self.options) if self.ktc else compile_graph(self.gguf, self.options)
        run = self.ktc.engine_settings(device, threads) if self.ktc else {"threads": threads}
        if batch is not None:
            run = {**run, "batch": _checked_batch(batch)}
        if prompt_pass is not None:
            run = {**run, "prompt_pass": _checked_batch(prompt_pass, "prompt pass")}
        self._embedding = embedding_setup(self.graph, self.gguf, n_ctx=n_ctx, pooling=pooling)
        if is_embedding_graph(self.graph):  # a pass holds a whole input (an encoder's rows see each other)
            run = {**run, "batch": self._embedding.max_tokens}
        self.engine = Engine(self.graph, GGUFWeights(self.gguf), n_ctx=n_ctx, device=device, gpu_layers=gpu_layers,
                             shortlist=shortlist, **run)
        self._chat_template_file = chat_template_file
        self._chat_template_name = chat_template
        self._template_budget = template_budget  # None: chat.DEFAULT_BUDGET (2 s, 16 MiB out, 512 MiB memory)
        self._tokenizer = None
        self._template = None
        self._generator: Generator | None = None
        self._draft = draft  # RAD-1 (docs/rad1.md): exact, so it changes only speed; False is --off rad1
        self._last: Generation | None = None
        self._embedder: Embedder | None = None
        self.warm: WarmStore | None = self._warm_store(cache_dir, warm_memory_bytes) if warm_start else None
        self._spare: Sequence | None = None  # the last call's sequence, cut back and continued by the next

    def _warm_store(self, cache_dir, memory_bytes: int) -> WarmStore:
        disk = None
        if cache_dir is not None:
            from kinetic.runtime.warm_disk import DiskTier

            disk = DiskTier(Path(cache_dir))
        key = functools.partial(model_key, model_file=self.path, graph=self.engine.graph, device=self.engine.device,
                                batch=self.engine.batch)
        if self.adapters:  # merged weights: the states depend on each adapter's file and scale too
            key = functools.partial(_with_adapters, key, tuple(self.adapters))
        return WarmStore(key, batch=self.engine.batch, memory_bytes=memory_bytes, disk=disk)

    @property
    def n_vocab(self) -> int:
        """Rows of the output layer (token ids 0..n_vocab-1; may exceed the tokenizer's vocabulary)."""
        return self.engine.n_vocab

    @property
    def n_ctx(self) -> int:
        """The context: prompt and answer together hold at most this many tokens."""
        return self.engine.n_ctx

    @property
    def name(self) -> str:
        """The model file's name without its extension."""
        return self.path.stem

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
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                         **template_kwargs)

    @property
    def chat_template(self):
        """The ChatTemplate apply_chat_template renders with (--chat-template-file, else the file's, else
        ChatML), loaded on first use; the server reads its source for reasoning and tool-call markers."""
        if self._template is None:
            from kinetic.frontend.chat import BUILTIN_TEMPLATES, DEFAULT_BUDGET, ChatTemplate

            budget, name = self._template_budget or DEFAULT_BUDGET, self._chat_template_name
            if name is not None:  # the built-in templates name no BOS or EOS token
                self._template = ChatTemplate(BUILTIN_TEMPLATES[name], origin=f"built-in {name} template",
                                              budget=budget)
            else:
                self._template = ChatTemplate.from_gguf(self.gguf, override_path=self._chat_template_file,
                                                        budget=budget)
        return self._template

    # -- embeddings (docs/embeddings.md) ---------------------------------------------------------------

    @property
    def embedder(self) -> Embedder:
        """The runtime's embedder for this model; refused for a model that is not an embedding model."""
        if self._embedder is None:
            if not is_embedding_graph(self.graph):
                raise KineticError(f"{self.path.name} is not an embedding model (no pooling in the file)",
                                   "Use an embedding model: bert, nomic-bert, or a decoder file with "
                                   "<arch>.pooling_type (Qwen3-Embedding). See docs/embeddings.md.")
            self._embedder = make_embedder(self.engine, self.graph, self.gguf, self._embedding)
        return self._embedder

    def embed(self, texts: str | list, normalize: bool = True, truncate: bool = False):
        """Embeddings of `texts` (a string, a list of strings, or lists of token ids): f32 [n, width]
        (pooling none: an array of f32 [tokens, width], one per input), L2-normalized by default.
        Several inputs share passes; each gets the vector it gets alone. An input longer than the
        context is refused unless `truncate`."""
        items = [texts] if isinstance(texts, str) else list(texts)
        if items and all(isinstance(t, int) for t in items):
            items = [items]  # one list of token ids
        ids = inputs_to_ids(self.tokenizer, items, n_vocab=self.tokenizer.vocab_size,
                            limit=self.embedder.max_tokens, truncate=truncate)
        return as_matrix(self.embedder.embed(ids, normalized=normalize))

    def rerank(self, query: str, documents: list[str], truncate: bool = False) -> list[float]:
        """Relevance scores of `documents` to `query` from a reranker's classification head (pooling
        rank), one per document in order, as llama-server's /rerank scores them."""
        limit = self.embedder.max_tokens
        pairs = [rerank_ids(self.tokenizer, self.gguf, query, doc) for doc in documents]
        return self.embedder.scores([p[:limit] for p in pairs] if truncate else pairs)

    # -- generation ----------------------------------------------------------------------------------

    def generate(self, prompt: str | list[int], max_tokens: int | None = None, temperature: float | None = None,
                 seed: int | None = None, stream: bool = False, return_tokens: bool = False, *,
                 sampling: SamplingSettings | None = None, grammar: Grammar | str | None = None,
                 draft: bool | None = None, stop: list[str] | tuple[str, ...] = (), **overrides):
        """Continue `prompt` (text, tokenized with special tokens parsed, or token ids).

        Returns the text (or the token ids with return_tokens=True); with stream=True, an iterator of
        text pieces (or of ids). Sampling: `sampling` (a SamplingSettings) if given, else the file's
        recommended settings (sampling_defaults()) with temperature 0, so without a temperature or
        settings the answer is greedy. `temperature`, `seed` and keyword overrides with llama.cpp's
        names (top_k=20, repeat_penalty=1.1, ...) replace single settings. `grammar` (a
        kinetic.grammar Grammar or GBNF text) holds the answer to it: disallowed tokens are masked
        before the sampler chain, and the answer ends ("stop") once the grammar allows nothing more.
        `draft` (default: the Model's) turns RAD-1's speculative decoding on or off; the tokens are
        the same either way. `stop`: strings that end the answer where they appear (not returned).
        """
        settings = self._sampling(sampling, temperature, seed, overrides)
        max_tokens = _checked_limit(max_tokens)
        ids = self._prompt_ids(prompt)
        matcher = None if grammar is None else self._grammar_matcher(grammar)
        request = GenerationRequest(tuple(ids), settings, max_tokens, grammar=matcher, draft=draft,
                                    stop=tuple(stop or ()))
        sequence, self._spare = (self._spare, None) if self.warm is not None else (None, None)
        self._last = self.generator.generate(request, sequence=sequence)
        events = self._returning(self._last)
        pieces = _token_ids(events) if return_tokens else _texts(events)
        if stream:
            return pieces
        return list(pieces) if return_tokens else "".join(pieces)

    def chat(self, messages: list[dict], max_tokens: int | None = None, temperature: float | None = None,
             seed: int | None = None, stream: bool = False, **kwargs):
        """Answer `messages` ([{"role": ..., "content": ...}]) through the model's chat template: the
        text, or an iterator of text pieces with stream=True. Other keywords are generate()'s."""
        prompt = self.apply_chat_template(messages, add_generation_prompt=True)
        return self.generate(prompt, max_tokens=max_tokens, temperature=temperature, seed=seed, stream=stream,
                             **kwargs)

    def _returning(self, generation: Generation) -> Iterator:
        """The generation's events; once it ends, its sequence is the one the next call continues."""
        try:
            yield from generation
        finally:
            if self.warm is not None:
                self._spare = generation.sequence

    @property
    def generator(self) -> Generator:
        """The runtime's generation loop for this model (kinetic/runtime/generation.py)."""
        if self._generator is None:
            self._generator = Generator(self.engine, self.tokenizer, draft=self._draft, warm=self.warm)
        return self._generator

    @property
    def draft(self) -> bool:
        return self._draft

    @draft.setter
    def draft(self, on: bool) -> None:
        self._draft = on
        if self._generator is not None:
            self._generator.draft = on

    @property
    def last_stats(self) -> GenerationStats:
        """What the last generate() call did, so far (its tokens, times, stop reason, RAD-1's rows)."""
        g = self._last
        if g is None:
            return GenerationStats()
        return GenerationStats(len(g.request.prompt), g.prompt_seconds, len(g.tokens), g.generate_seconds,
                               g.finish_reason, list(g.tokens), g.sampler.settings, g.drafted, g.accepted,
                               g.n_cached, g.stats.sources())

    def sampling_defaults(self) -> SamplingSettings:
        """llama.cpp's defaults with the file's general.sampling.* recommendations over them."""
        return settings_from_metadata(self.gguf.metadata)

    def _sampling(self, sampling: SamplingSettings | None, temperature: float | None, seed: int | None,
                  overrides: dict) -> SamplingSettings:
        base = sampling if sampling is not None else replace(self.sampling_defaults(), temperature=0.0)
        changes = dict(overrides)
        if temperature is not None:
            changes["temperature"] = temperature
        if seed is not None:
            changes["seed"] = seed
        try:
            return replace(base, **changes)
        except (TypeError, ValueError) as e:
            raise KineticError(f"bad sampling settings: {e}", "See docs/sampling.md for the settings and their "
                               "ranges.") from None

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

    def _grammar_matcher(self, grammar: Grammar | str) -> GrammarMatcher:
        """`grammar` (a Grammar or GBNF text) over this model's vocabulary."""
        from kinetic.grammar import GrammarMatcher, TokenVocab, parse_gbnf  # numba: on use

        vocab = TokenVocab.from_tokenizer(self.tokenizer)  # built once per tokenizer
        return GrammarMatcher(parse_gbnf(grammar) if isinstance(grammar, str) else grammar, vocab)

    def decoder(self) -> SpeculativeDecoder:
        """The model's RAD-1 decoder (one per engine: it learns pass costs and indexes every request)."""
        return self.generator.decoder


def _with_adapters(key, adapters: tuple) -> str:
    """Warm Start's key for merged weights: the model's key and each adapter's BLAKE3 and scale."""
    import hashlib

    facts = [key()] + [f"{a['blake3']}:{a['scale']!r}" for a in (adapter.record() for adapter in adapters)]
    return hashlib.sha256("\n".join(facts).encode()).hexdigest()


def _token_ids(generation: Generation) -> Iterator[int]:
    for event in generation:
        if isinstance(event, Piece):
            yield from (t.id for t in event.tokens)


def _texts(generation: Generation) -> Iterator[str]:
    for event in generation:
        if isinstance(event, Piece) and event.text:
            yield event.text


def _check_template_name(name: str | None) -> None:
    from kinetic.frontend.chat import BUILTIN_TEMPLATES

    if name is not None and name not in BUILTIN_TEMPLATES:
        raise KineticError(f"no built-in chat template named {name!r}",
                           f"Built in: {', '.join(BUILTIN_TEMPLATES)}; or pass a Jinja file with --chat-template-file.")


def _checked_limit(max_tokens) -> int | None:
    """max_tokens through the settings' one check (kinetic/runtime/sampling/settings.py): None or a
    negative count means no limit; anything but an integer is refused."""
    try:
        return token_limit(max_tokens)
    except SettingError as e:
        raise KineticError(f"bad max_tokens: {e.reason}", "Give a count of tokens, or None for no limit.") from None


def _checked_batch(batch, name: str = "batch") -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise KineticError(f"the {name} must be a whole number from 1 to {MAX_BATCH}, not {batch!r}",
                           "Leave it out for the default." if name != "batch"
                           else "Leave it out for the default, 128 prompt rows per pass.")
    return batch
