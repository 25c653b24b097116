"""Pre-tokenizers of BPE vocabularies: which regexes split the text, and a few flags.

Owns: the table from a GGUF `tokenizer.ggml.pre` name to llama.cpp's behaviour for that name.
Does not own: applying the regexes (the `tokenizers` library does, see backends.py).

The regexes are facts about llama.cpp, not code: they are the `regex_exprs` lists of
`llm_tokenizer_bpe` and the name-to-type mapping in `llama_vocab::impl::load`
(llama.cpp src/llama-vocab.cpp, build b1-0c1e570 and later for qwen35). Each list is applied in
order; every regex splits the pieces the previous one left, keeping the text between matches as
pieces of its own, which is `tokenizers`' Split(behavior="isolated").
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.errors import KineticError

# GPT-2's word regex as llama.cpp writes it (its custom splitter also takes a lone whitespace
# character that nothing else matched, which "isolated" splitting does too).
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

# Llama 3's regex with the case-insensitive contractions spelled out (llama.cpp's "adapted" form).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen 2: Llama 3's with single digits.
QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen 3.5: Qwen 2's with combining marks (\p{M}) kept in words and out of punctuation runs.
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Hunyuan dense (and DeepSeek V3): digit triples, CJK/kana runs, then the word regex.
HUNYUAN_DENSE = (
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# SentencePiece-style BPE (Gemma 4, Sarvam): the only split is between newline runs and the rest.
NEWLINE_RUNS = r"[^\n]+|[\n]+"
# What llama.cpp uses for "default" (and, with a warning, for a file that names no pre-tokenizer).
DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp pre-tokenizes for one `tokenizer.ggml.pre` value."""

    regexes: tuple[str, ...]
    clean_spaces: bool = True  # llama.cpp's clean_up_tokenization_spaces when detokenizing
    ignore_merges: bool = False  # a whole pre-token found in the vocabulary is taken as is
    add_bos: bool = False  # default when the file has no tokenizer.ggml.add_bos_token
    # SentencePiece-style BPE (Gemma 4): spaces become U+2581 before splitting, merges run on raw
    # UTF-8 (no GPT-2 byte map), a piece with no token falls back to <0xNN> byte tokens, and a
    # NORMAL token's U+2581 prints as a space (llama.cpp's escape_whitespaces, byte_encode off).
    escape_whitespaces: bool = False
    whole_newline_runs: bool = False  # a piece of only newlines that is a token is taken whole
    force_add_bos: bool = False  # BOS is added even where the file says add_bos_token = false


_LLAMA3_KIND = PreTokenizer((LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_KIND = PreTokenizer((QWEN2,), clean_spaces=False)
_STARCODER_KIND = PreTokenizer((r"\p{N}", GPT2))
_GEMMA4_KIND = PreTokenizer((NEWLINE_RUNS,), add_bos=True, escape_whitespaces=True, whole_newline_runs=True,
                            force_add_bos=True)

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer(DEFAULT),
    # llama.cpp LLAMA_VOCAB_PRE_TYPE_LLAMA3 names
    "llama3": _LLAMA3_KIND,
    "llama-v3": _LLAMA3_KIND,
    "llama-bpe": _LLAMA3_KIND,
    "falcon3": _LLAMA3_KIND,
    "falcon-h1": _LLAMA3_KIND,
    "lfm2": _LLAMA3_KIND,
    "dbrx": PreTokenizer((LLAMA3,)),
    "smaug-bpe": PreTokenizer((LLAMA3,)),
    # LLAMA_VOCAB_PRE_TYPE_QWEN2 / QWEN35
    "qwen2": _QWEN2_KIND,
    "deepseek-r1-qwen": _QWEN2_KIND,
    "stablelm2": PreTokenizer((QWEN2,)),
    "qwen35": PreTokenizer((QWEN35,), clean_spaces=False),
    # STARCODER family: digits alone, then GPT-2's regex
    "smollm": PreTokenizer((r"\p{N}", GPT2), clean_spaces=False),
    "refact": _STARCODER_KIND,
    "starcoder": _STARCODER_KIND,
    # GPT2 family
    "gpt-2": PreTokenizer((GPT2,)),
    "phi-2": PreTokenizer((GPT2,)),
    "exaone4": PreTokenizer((GPT2,)),
    "hunyuan-dense": PreTokenizer(HUNYUAN_DENSE, clean_spaces=False),
    # LLAMA_VOCAB_PRE_TYPE_GEMMA4: also what tokenizer.ggml.model "gemma4" always uses
    "gemma4": _GEMMA4_KIND,
    "granite-embed-multi-311m": _GEMMA4_KIND,
    "sarvam-moe": PreTokenizer((NEWLINE_RUNS,), clean_spaces=False, escape_whitespaces=True),
}


def pre_tokenizer(name: str | None) -> PreTokenizer:
    """The pre-tokenizer for a `tokenizer.ggml.pre` value; a missing one means "default"."""
    if not name:
        return PRE_TOKENIZERS["default"]
    try:
        return PRE_TOKENIZERS[name]
    except KeyError:
        raise KineticError(
            f'unsupported pre-tokenizer "{name}"',
            "Kinetic supports: " + ", ".join(sorted(PRE_TOKENIZERS)) + ". File an issue naming the model.",
        ) from None
