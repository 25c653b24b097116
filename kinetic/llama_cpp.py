"""`kinetic.llama_cpp`: the commonly used part of llama-cpp-python's `Llama` class, on kinetic.Model.

Owns: `Llama` with llama-cpp-python's (0.3.x) signatures, defaults and response shapes: the
constructor (model_path, n_ctx, n_threads, n_gpu_layers, seed, verbose, chat_format, embedding,
lora_path, lora_scale), `__call__` / `create_completion` (stream, stop, echo), `create_chat_completion`
(stream, stop) through the model's chat template, `embed` / `create_embedding`, `tokenize` /
`detokenize` (bytes, as llama-cpp-python's), `n_ctx()`, `token_bos()`, `token_eos()`, and
`Llama.from_pretrained` through Kinetic's pull machinery (kinetic.hub.pull). What it does not cover
(grammars, tools, response_format, logprobs, suffix, functions, logits processors) raises
NotImplementedError naming the argument, never silently ignored. A failed load raises RuntimeError
(KineticError), as llama-cpp-python raises ValueError/RuntimeError.

Does not own: generation (kinetic.Model), the `llama_cpp` import name (the llama-cpp-kinetic
distribution in distributions/llama-cpp-kinetic makes `import llama_cpp` load this module).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kinetic.errors import KineticError
from kinetic.runtime.engine import DEFAULT_CONTEXT

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama-cpp-python's "a fresh seed"
_COMPLETION_DEFAULTS = {"temperature": 0.8, "top_p": 0.95, "min_p": 0.05, "typical_p": 1.0, "top_k": 40,
                        "repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
_CHAT_DEFAULTS = {**_COMPLETION_DEFAULTS, "temperature": 0.2}


def _refuse_unsupported(**given: Any) -> None:
    """NotImplementedError for the first argument given a value Kinetic's Llama does not implement."""
    for name, value in given.items():
        if value not in (None, False, [], {}, 0):
            raise NotImplementedError(f"kinetic.llama_cpp.Llama does not implement {name} (docs/python.md lists "
                                      "what it covers; kinetic serve's OpenAI API has tools, grammars and JSON output)")


class Llama:
    """A GGUF model with llama-cpp-python's `Llama` interface (the module docstring lists what it covers)."""

    def __init__(self, model_path: str, *, n_gpu_layers: int = 0, seed: int = LLAMA_DEFAULT_SEED,
                 n_ctx: int = 512, n_batch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None, embedding: bool = False, lora_base: str | None = None,
                 lora_scale: float = 1.0, lora_path: str | None = None, chat_format: str | None = None,
                 verbose: bool = True, **kwargs):
        from kinetic.model import Model

        _refuse_unsupported(lora_base=lora_base, draft_model=kwargs.get("draft_model"),
                            chat_handler=kwargs.get("chat_handler"), vocab_only=kwargs.get("vocab_only"),
                            kv_overrides=kwargs.get("kv_overrides"), tokenizer=kwargs.get("tokenizer"),
                            **{k: v for k, v in kwargs.items() if k not in _SPEED_ONLY and v != _UNSET.get(k)})
        if chat_format is not None and chat_format not in _builtin_templates():
            raise NotImplementedError(f"kinetic.llama_cpp.Llama has no chat_format {chat_format!r}; leave it out for "
                                      f"the model's own template, or name one of {', '.join(_builtin_templates())}")
        self.model_path = str(model_path)
        self.verbose = verbose
        self._seed = seed
        self._embedding = embedding
        self.chat_format = chat_format
        lora = [(lora_path, lora_scale)] if lora_path else None
        self._model = Model(model_path, n_ctx=n_ctx if n_ctx > 0 else DEFAULT_CONTEXT, threads=n_threads,
                            device=_device(n_gpu_layers, verbose),
                            chat_template=chat_format, lora=lora)
        self.n_batch = n_batch

    # -- llama-cpp-python's small accessors ------------------------------------------------------------

    def n_ctx(self) -> int:
        return self._model.n_ctx

    def n_vocab(self) -> int:
        return self._model.n_vocab

    def token_bos(self) -> int:
        return _special(self._model, "bos")

    def token_eos(self) -> int:
        return _special(self._model, "eos")

    @property
    def metadata(self) -> dict[str, str]:
        return {k: str(v) for k, v in self._model.gguf.metadata.items() if isinstance(v, (str, int, float, bool))}

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text` (bytes, as llama-cpp-python takes)."""
        if isinstance(text, str):
            raise TypeError("tokenize takes bytes, as llama-cpp-python's does: text.encode('utf-8')")
        return self._model.tokenize(text.decode("utf-8", errors="replace"), add_special=add_bos,
                                    parse_special=special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes:
        """The text of `tokens` as UTF-8 bytes."""
        return self._model.detokenize(list(tokens)).encode("utf-8")

    # -- completion ------------------------------------------------------------------------------------

    def __call__(self, prompt: str | list[int], **kwargs):
        return self.create_completion(prompt, **kwargs)

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, model: str | None = None,
                          grammar=None, logit_bias: dict[int, float] | None = None, **kwargs):
        """A text completion, or with stream=True an iterator of completion chunks (llama-cpp-python's shapes)."""
        _refuse_unsupported(suffix=suffix, logprobs=logprobs, grammar=grammar, **_unsupported(kwargs))
        settings = dict(temperature=temperature, top_p=top_p, min_p=min_p, typical_p=typical_p, top_k=top_k,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, logit_bias=logit_bias or ())
        pieces = self._pieces(prompt, max_tokens, settings, stop, seed)
        head = {"id": f"cmpl-{uuid.uuid4()}", "object": "text_completion", "created": int(time.time()),
                "model": model or self.model_path}
        prefix = (prompt if isinstance(prompt, str) else self._model.detokenize(list(prompt))) if echo else ""
        if stream:
            return self._completion_chunks(head, prefix, pieces)
        text = prefix + "".join(pieces)
        return {**head, "choices": [{"text": text, "index": 0, "logprobs": None,
                                     "finish_reason": self._finish()}], "usage": self._usage()}

    def _completion_chunks(self, head: dict, prefix: str, pieces: Iterator[str]) -> Iterator[dict]:
        if prefix:
            yield {**head, "choices": [{"text": prefix, "index": 0, "logprobs": None, "finish_reason": None}]}
        for piece in pieces:
            yield {**head, "choices": [{"text": piece, "index": 0, "logprobs": None, "finish_reason": None}]}
        yield {**head, "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": self._finish()}]}

    # -- chat ------------------------------------------------------------------------------------------

    def create_chat_completion(self, messages: list[dict], functions=None, function_call=None, tools=None,
                               tool_choice=None, temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | list[str] | None = None, seed: int | None = None, response_format=None,
                               max_tokens: int | None = None, presence_penalty: float = 0.0,
                               frequency_penalty: float = 0.0, repeat_penalty: float = 1.0, model: str | None = None,
                               logit_bias: dict[int, float] | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None, grammar=None, **kwargs):
        """A chat answer through the model's template, or with stream=True an iterator of chunks whose
        first delta is {"role": "assistant"} and last {} with the finish reason (llama-cpp-python's shapes)."""
        _refuse_unsupported(functions=functions, function_call=function_call, tools=tools, tool_choice=tool_choice,
                            response_format=response_format, logprobs=logprobs, top_logprobs=top_logprobs,
                            grammar=grammar, **_unsupported(kwargs))
        prompt = self._model.apply_chat_template(messages, add_generation_prompt=True)
        settings = dict(temperature=temperature, top_p=top_p, min_p=min_p, typical_p=typical_p, top_k=top_k,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, logit_bias=logit_bias or ())
        pieces = self._pieces(prompt, max_tokens, settings, stop, seed)
        head = {"id": f"chatcmpl-{uuid.uuid4()}", "model": model or self.model_path, "created": int(time.time())}
        if stream:
            return self._chat_chunks(head, pieces)
        text = "".join(pieces)
        return {**head, "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                             "finish_reason": self._finish()}], "usage": self._usage()}

    def _chat_chunks(self, head: dict, pieces: Iterator[str]) -> Iterator[dict]:
        chunk = {**head, "object": "chat.completion.chunk"}
        yield {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                     "finish_reason": None}]}
        for piece in pieces:
            yield {**chunk, "choices": [{"index": 0, "delta": {"content": piece}, "logprobs": None,
                                         "finish_reason": None}]}
        yield {**chunk, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": self._finish()}]}

    # -- embeddings ------------------------------------------------------------------------------------

    def embed(self, input: str | list[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        """One embedding (a list of floats) for a string, or a list of them for a list of strings."""
        if not self._embedding:
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        texts = [input] if isinstance(input, str) else list(input)
        vectors = self._model.embed(texts, normalize=normalize, truncate=truncate)
        out = [[float(x) for x in v] for v in vectors]
        result = out[0] if isinstance(input, str) else out
        if return_count:
            return result, sum(len(self._model.tokenize(t)) for t in texts)
        return result

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict:
        """OpenAI's embedding response shape, as llama-cpp-python returns it."""
        texts = [input] if isinstance(input, str) else list(input)
        vectors, count = self.embed(texts, return_count=True)
        return {"object": "list", "data": [{"object": "embedding", "embedding": v, "index": i}
                                           for i, v in enumerate(vectors)],
                "model": model or self.model_path, "usage": {"prompt_tokens": count, "total_tokens": count}}

    # -- from the Hugging Face Hub -----------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, additional_files=None,
                        local_dir: str | None = None, cache_dir: str | None = None, **kwargs) -> Llama:
        """Download `filename` (a file name or a glob such as "*q8_0.gguf") of `repo_id` with Kinetic's
        pull (the models folder, or `local_dir`), then load it with `kwargs`."""
        from kinetic import hub

        _refuse_unsupported(additional_files=additional_files)
        file = _matching_file(repo_id, filename) if filename else None
        folder = Path(local_dir or cache_dir) if (local_dir or cache_dir) else None
        verbose = kwargs.get("verbose", True)
        path = hub.pull(repo_id, file=file, folder=folder, progress=False,
                        out=print if verbose else (lambda _line: None))
        return cls(model_path=str(path), **kwargs)

    # -- shared ------------------------------------------------------------------------------------------

    def _pieces(self, prompt, max_tokens, settings: dict, stop, seed) -> Iterator[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        seed = self._seed if seed is None else seed
        return self._model.generate(prompt, max_tokens=None if max_tokens is None or max_tokens <= 0 else max_tokens,
                                    seed=None if seed in (LLAMA_DEFAULT_SEED, -1) else seed, stream=True,
                                    stop=stops, **settings)

    def _finish(self) -> str | None:
        return self._model.last_stats.stop_reason or None

    def _usage(self) -> dict:
        stats = self._model.last_stats
        return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
                "total_tokens": stats.prompt_tokens + stats.generated_tokens}


def _unsupported(kwargs: dict) -> dict:
    """llama-cpp-python's other call keywords: refused by name (through _refuse_unsupported) when
    given a value, except those left at the value that means "off" (mirostat 0, tfs_z 1)."""
    off = {"tfs_z": 1.0, "mirostat_mode": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1}
    return {name: value for name, value in kwargs.items() if not (name in off and value == off[name])}


# Constructor keywords at llama-cpp-python's "unspecified" values, which mean the file's own settings.
_UNSET = {"rope_scaling_type": -1, "pooling_type": -1, "rope_freq_base": 0.0, "rope_freq_scale": 0.0,
          "yarn_ext_factor": -1.0, "yarn_attn_factor": 1.0, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0,
          "yarn_orig_ctx": 0, "type_k": None, "type_v": None}

# Constructor keywords that change only speed, memory or logging, never an answer: accepted.
# (vocab_only, kv_overrides, tokenizer, draft_model and chat_handler are refused when given, in __init__.)
_SPEED_ONLY = {"split_mode", "main_gpu", "tensor_split", "rpc_servers", "vocab_only", "use_mmap", "use_mlock",
               "kv_overrides", "n_ubatch", "logits_all", "offload_kqv", "flash_attn", "op_offload", "swa_full",
               "no_perf", "last_n_tokens_size", "numa", "spm_infill", "tokenizer", "draft_model", "chat_handler"}


def _special(model, which: str) -> int:
    value = model.gguf.metadata.get(f"tokenizer.ggml.{which}_token_id")
    return -1 if value is None else int(value)


def _device(n_gpu_layers: int, verbose: bool) -> str:
    """n_gpu_layers 0: the CPU; any other value: --device auto (CUDA, a Vulkan GPU, else the CPU),
    saying on stderr which devices it skipped when verbose, as llama-cpp-python logs its loading."""
    if n_gpu_layers == 0:
        return "cpu"
    from kinetic.devices import resolve_device

    return resolve_device("auto", say=None if verbose else (lambda _line: None))


def _builtin_templates() -> tuple[str, ...]:
    from kinetic.frontend.chat import BUILTIN_TEMPLATES

    return tuple(BUILTIN_TEMPLATES)


def _matching_file(repo_id: str, pattern: str) -> str:
    """The repository's file that `pattern` (a name or a glob) names; the first in name order."""
    import fnmatch

    if not any(c in pattern for c in "*?["):
        return pattern
    from kinetic import hf_pull

    _, files = hf_pull.repo_files(repo_id)
    names = sorted(f.path for f in files if fnmatch.fnmatch(f.path, pattern))
    if not names:
        raise KineticError(f"{repo_id} has no file matching {pattern!r}", "Check the filename pattern.")
    return names[0]
