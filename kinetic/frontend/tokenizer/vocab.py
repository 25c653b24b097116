"""The vocabulary as the GGUF file states it, with the fix-ups llama.cpp applies on load.

Owns: reading `tokenizer.ggml.*` into plain Python data (token texts, attributes, scores, merges,
special ids, add-BOS/EOS flags) and deciding, as llama.cpp does, which tokens end generation and
which are matched in raw text (a "gemma4" vocabulary is BPE with the "gemma4" pre-tokenizer and
always adds BOS, as llama.cpp runs it). Every value is typed before it is read (`check_vocab`, which
loading also runs without decoding the strings): the tokens and merges are arrays of strings, the token
types integers and the scores numbers (no NaN), one per token, the model, pre-tokenizer and chat
template strings, flags booleans, special ids integers; anything else is a ModelFileError naming the
key. A special id outside the vocabulary falls back to the default, as llama.cpp's does (with a
warning there).
Does not own: splitting or merging text (backends.py), the public API (core.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from kinetic.errors import KineticError, ModelFileError
from kinetic.frontend.tokenizer.pretok import PRE_TOKENIZERS, PreTokenizer, pre_tokenizer


class TokenType(IntEnum):
    """`tokenizer.ggml.token_type` values (gguf's TokenType)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class Attr:
    """llama.cpp's token attributes: the type plus per-token strip flags.

    Plain ints, not an IntFlag: a vocabulary has 262k of them and enum arithmetic is slow."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


_TYPE_TO_ATTR = {
    TokenType.NORMAL: Attr.NORMAL,
    TokenType.UNKNOWN: Attr.UNKNOWN,
    TokenType.CONTROL: Attr.CONTROL,
    TokenType.USER_DEFINED: Attr.USER_DEFINED,
    TokenType.UNUSED: Attr.UNUSED,
    TokenType.BYTE: Attr.BYTE,
}

# Token texts llama.cpp treats as end of generation (and forces to CONTROL), from
# llama_vocab::impl::load in src/llama-vocab.cpp (b1-0c1e570).
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})
# Where one of these ends generation, "</s>" is an ordinary token (Gemma 4, PLaMo), same source.
NORMAL_S_MARKERS = ("<|tool_response>", "<|plamo:eos|>")
# Fill-in-the-middle tokens that also end generation (pad, repo, file separator), same source.
FIM_EOG_TEXTS = {
    "tokenizer.ggml.fim_pad_token_id": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "tokenizer.ggml.fim_rep_token_id": (
        "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    ),
    "tokenizer.ggml.fim_sep_token_id": ("<|file_sep|>",),
}
# gpt-oss: always rendered, matched in raw text like user-defined tokens.
ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# Per vocabulary type: llama.cpp's default special ids and flags before the file's own keys.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"bos": 1, "eos": 2, "unk": 0, "sep": None, "add_bos": True, "add_space_prefix": True},
    "gpt2": {"bos": 11, "eos": 11, "unk": None, "sep": None, "add_bos": False, "add_space_prefix": False},
    "bert": {"bos": 101, "eos": None, "unk": 100, "sep": 102, "add_bos": True, "add_space_prefix": False},
    # BPE with the "gemma4" pre-tokenizer whatever the file's tokenizer.ggml.pre says
    "gemma4": {"bos": None, "eos": None, "unk": None, "sep": None, "add_bos": True, "add_space_prefix": False},
}
BPE_MODELS = ("gpt2", "gemma4")  # vocabularies with merges and a pre-tokenizer


@dataclass
class Vocab:
    """Everything the tokenizer needs from the file, already fixed up the way llama.cpp does."""

    model: str  # "gpt2" (byte-level BPE), "gemma4" (SentencePiece-style BPE), "llama" (SentencePiece), "bert"
    pre_name: str
    pre: PreTokenizer | None
    tokens: list[str]
    attrs: list[int]  # Attr bits per token
    scores: list[float] | None
    merges: list[str]
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    sep_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    eog_ids: set[int] = field(default_factory=set)
    token_to_id: dict[str, int] = field(default_factory=dict)

    @property
    def byte_level(self) -> bool:
        """Token texts are GPT-2's byte-to-character map (not U+2581 for spaces and raw UTF-8)."""
        return self.model in BPE_MODELS and not (self.pre is not None and self.pre.escape_whitespaces)

    @property
    def specials_for_matching(self) -> list[int]:
        """Control, user-defined and unknown tokens, longest text first (llama.cpp's special cache)."""
        match = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN
        ids = [i for i, a in enumerate(self.attrs) if a & match]
        return sorted(ids, key=lambda i: -len(self.tokens[i].encode("utf-8")))


def pre_tokenizer_name(model: str | None, file_pre: str | None) -> str:
    """The pre-tokenizer llama.cpp runs: "gemma4" for a gemma4 vocabulary whatever the file says,
    otherwise the file's tokenizer.ggml.pre, "default" where it has none."""
    return "gemma4" if model == "gemma4" else file_pre or "default"


def default_add_bos(model: str | None, pre_name: str | None) -> bool:
    """llama.cpp's add_bos when the file does not say: the pre-tokenizer's for BPE, the vocabulary
    type's otherwise (False for an unknown one)."""
    if model in BPE_MODELS:
        pre = PRE_TOKENIZERS.get(pre_tokenizer_name(model, pre_name))
        return bool(pre is not None and pre.add_bos)
    return bool(_DEFAULTS.get(model, {}).get("add_bos", False))


def effective_add_bos(model: str | None, pre_name: str | None, file_value) -> bool:
    """Whether llama.cpp adds BOS: the file's add_bos_token (a bool) or the default, forced on for
    the gemma4 pre-tokenizer (its workaround for Gemma 4 files that say false)."""
    pre = PRE_TOKENIZERS.get(pre_tokenizer_name(model, pre_name))
    forced = model in BPE_MODELS and pre is not None and pre.force_add_bos
    if isinstance(file_value, (bool, np.bool_)):
        return forced or bool(file_value)
    return forced or default_add_bos(model, pre_name)


def read_vocab(meta) -> Vocab:
    """Read `tokenizer.ggml.*` from a GGUF metadata mapping (or a dict of the same values)."""
    n = check_vocab(meta)
    model = meta.get("tokenizer.ggml.model")
    if model not in _DEFAULTS:
        raise KineticError(
            f'unsupported tokenizer model "{model}"',
            "Kinetic reads gpt2 (byte-level BPE), gemma4 (SentencePiece-style BPE), llama (SentencePiece) "
            "and bert (WordPiece) vocabularies.",
        )
    if not n:
        raise KineticError("the file has no tokenizer.ggml.tokens", "The GGUF file has no vocabulary.")
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(meta["tokenizer.ggml.tokens"])]  # llama.cpp's names
    types = meta.get("tokenizer.ggml.token_type")
    attrs = [Attr.NORMAL] * n if types is None else [_TYPE_TO_ATTR.get(t, Attr.UNDEFINED) for t in _list(types)]
    scores = meta.get("tokenizer.ggml.scores")
    defaults = _DEFAULTS[model]
    pre_name = pre_tokenizer_name(model, meta.get("tokenizer.ggml.pre"))
    pre = pre_tokenizer(pre_name) if model in BPE_MODELS else None
    merges = list(meta.get("tokenizer.ggml.merges") or []) if model in BPE_MODELS else []
    if model in BPE_MODELS and meta.get("tokenizer.ggml.merges") is None:
        raise KineticError("the BPE vocabulary has no tokenizer.ggml.merges", "The GGUF file is incomplete.")

    def special(key: str, default: int | None) -> int | None:
        value = _token_id(meta, f"tokenizer.ggml.{key}_token_id", n)
        return value if value is not None else (default if default is not None and 0 <= default < n else None)

    def flag(key: str, default: bool) -> bool:
        value = meta.get(f"tokenizer.ggml.{key}")
        return default if value is None else value

    vocab = Vocab(
        model=model,
        pre_name=pre_name,
        pre=pre,
        tokens=tokens,
        attrs=attrs,
        scores=None if scores is None else _list(scores),
        merges=merges,
        bos_id=special("bos", defaults["bos"]),
        eos_id=special("eos", defaults["eos"]),
        unk_id=special("unknown", defaults["unk"]),
        sep_id=special("seperator", special("separator", defaults["sep"])),
        add_bos=effective_add_bos(model, pre_name, meta.get("tokenizer.ggml.add_bos_token")),
        add_eos=flag("add_eos_token", False),
        add_space_prefix=flag("add_space_prefix", defaults["add_space_prefix"]),
        clean_spaces=pre.clean_spaces if pre else model == "bert",
        token_to_id={t: i for i, t in enumerate(tokens)},
    )
    _fix_up(vocab, meta)
    return vocab


# -- checking every value's type before anything reads it --------------------------------------------

# key -> the kind of its one value (_SCALARS) or of every element (_ARRAYS); "number": an int or float
_SCALARS = {"tokenizer.ggml.model": "string", "tokenizer.ggml.pre": "string", "tokenizer.chat_template": "string"}
_SCALARS.update({f"tokenizer.ggml.{k}": "bool" for k in ("add_bos_token", "add_eos_token", "add_space_prefix")})
_SCALARS.update({f"tokenizer.ggml.{k}_token_id": "int" for k in (
    "bos", "eos", "unknown", "seperator", "separator", "padding", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")})
_ARRAYS = {"tokenizer.ggml.tokens": "string", "tokenizer.ggml.merges": "string",
           "tokenizer.ggml.token_type": "int", "tokenizer.ggml.scores": "number"}
_EXPECTED = {"string": "a string", "bool": "true or false", "int": "an integer", "number": "a number"}
_EXPECTED_ARRAY = {"string": "an array of strings", "int": "an array of integers", "number": "an array of numbers"}
_GGUF_KIND = {"STRING": "string", "BOOL": "bool", "FLOAT32": "float", "FLOAT64": "float"}  # others: integers


def check_vocab(meta, file: str | None = None) -> int:
    """Check that every `tokenizer.ggml.*` value Kinetic reads has its type, and that the per-token
    arrays have one value per token (scores with no NaN), without decoding the token strings; a
    ModelFileError names the first key that does not (and `file`, when given). Returns the number
    of tokens (0: none)."""
    for key, kind in _SCALARS.items():
        found = _kind_of(meta, key)
        if found is not None and (found[1] is not None or not _fits(found[0], kind)):
            raise ModelFileError(file, key, f"is {_describe(found)}", _EXPECTED[kind])
    n = 0
    for key, kind in _ARRAYS.items():
        found = _kind_of(meta, key)
        if found is None:
            continue
        if found[1] is None or not _fits(found[0], kind):
            raise ModelFileError(file, key, f"is {_describe(found)}", _EXPECTED_ARRAY[kind])
        if key == "tokenizer.ggml.tokens":
            n = found[1]
        elif key != "tokenizer.ggml.merges" and found[1] != n:
            raise ModelFileError(file, key, f"has {found[1]} values", f"one per token ({n})")
    scores = meta.get("tokenizer.ggml.scores")
    nan = np.flatnonzero(np.isnan(np.asarray(scores, dtype=np.float64))) if scores is not None else ()
    if len(nan):
        raise ModelFileError(file, "tokenizer.ggml.scores", f"holds NaN at token {int(nan[0])}", "a number per token")
    return n


def _fits(found: str, kind: str) -> bool:
    return found == kind or (kind == "number" and found in ("int", "float"))


def _kind_of(meta, key: str) -> tuple[str, int | None] | None:
    """(element kind, array length or None for one value) without decoding an array; None if absent.
    Kinds: string, bool, int, float, mixed (a list of several kinds), other."""
    if hasattr(meta, "array_item_type"):  # GGUF metadata: the stored types
        vtype = meta.value_type(key)
        if vtype is None:
            return None
        if vtype.name == "ARRAY":
            item = meta.array_item_type(key).name
            return _GGUF_KIND.get(item, "int"), meta.array_length(key)
        return _value_kind(meta[key]), None
    if key not in meta or meta[key] is None:
        return None
    value = meta[key]
    if isinstance(value, np.ndarray):
        return {"b": "bool", "i": "int", "u": "int", "f": "float"}.get(value.dtype.kind, "other"), len(value)
    if isinstance(value, (list, tuple)):
        kinds = {_value_kind(v) for v in value}
        return (kinds.pop() if len(kinds) == 1 else "mixed" if kinds else "string"), len(value)
    return _value_kind(value), None


def _value_kind(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    return "string" if isinstance(value, str) else "other"


def _describe(found: tuple[str, int | None]) -> str:
    kind, length = found
    names = {"string": "string", "bool": "boolean", "int": "integer", "float": "number"}
    if length is None:
        name = names.get(kind, "value of another type")
        return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
    return f"an array of {length} {names.get(kind, 'mixed value')}s"


def _list(values) -> list:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _token_id(meta, key: str, n: int) -> int | None:
    """A token id (its type already checked): None when absent or outside the vocabulary, where the
    caller's default applies, as in llama.cpp."""
    value = meta.get(key)
    return int(value) if value is not None and 0 <= value < n else None


def _fix_up(vocab: Vocab, meta) -> None:
    """llama.cpp's load-time fix-ups: end-of-generation tokens, forced types, strip flags."""
    ids = vocab.token_to_id
    eog: set[int] = set()
    for key, names in FIM_EOG_TEXTS.items():
        fim = _token_id(meta, key, len(vocab.tokens))
        if fim is None:
            fim = next((ids[t] for t in names if t in ids), None)
        if fim is not None:
            eog.add(fim)
            vocab.attrs[fim] |= Attr.CONTROL
    for text in EOG_TEXTS:
        if text in ids:
            eog.add(ids[text])
            vocab.attrs[ids[text]] |= Attr.CONTROL
    for text in ALWAYS_RENDERED:
        if text in ids:
            vocab.attrs[ids[text]] = Attr.USER_DEFINED
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = _token_id(meta, key, len(vocab.tokens))
        if value is not None:
            eog.add(value)
    if vocab.eos_id is not None:
        eog.add(vocab.eos_id)
    eog_ids = {vocab.tokens[i]: i for i in sorted(eog, reverse=True)}  # text -> lowest such EOG id
    # gpt-oss (o200k_harmony) and solar-open: <|end|> ends a message, not generation.
    if "<|end|>" in eog_ids and ("<|return|>" in eog_ids or "<|flush|>" in eog_ids) and (
        "<|call|>" in eog_ids or "<|calls|>" in eog_ids
    ):
        eog.discard(eog_ids["<|end|>"])
        vocab.attrs[eog_ids["<|end|>"]] = Attr.USER_DEFINED
    if "</s>" in eog_ids and any(t in eog_ids for t in NORMAL_S_MARKERS):
        eog.discard(eog_ids["</s>"])
        vocab.attrs[eog_ids["</s>"]] = Attr.NORMAL
    vocab.eog_ids = eog
    _strip_flags(vocab, meta)


def _strip_flags(vocab: Vocab, meta) -> None:
    """Per-model strip attributes llama.cpp sets by name (jina's <mask>, Phi-3's specials)."""
    ids = vocab.token_to_id
    name = str(meta.get("general.name") or "").lower()
    arch = str(meta.get("general.architecture") or "")
    if any(p in vocab.pre_name for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        a in arch for a in ("nomic-bert-moe", "jina-bert-v3")
    ):
        if "<mask>" in ids:
            vocab.attrs[ids["<mask>"]] |= Attr.LSTRIP
    elif "phi-3" in name or "phi3" in name:
        for i in vocab.specials_for_matching:
            vocab.attrs[i] |= Attr.RSTRIP
        if "</s>" in ids:
            vocab.attrs[ids["</s>"]] |= Attr.RSTRIP
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            if text in ids:
                vocab.attrs[ids[text]] &= ~Attr.RSTRIP
