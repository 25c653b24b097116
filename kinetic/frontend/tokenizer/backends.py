"""The ways a text fragment becomes ids, once special tokens are split out of it.

Owns: byte-level BPE (`gpt2`), SentencePiece-style BPE (`gemma4`) and SentencePiece (`llama`) built
on the `tokenizers` library, and WordPiece (`bert`) in plain Python; the disk cache for the
SentencePiece merge table.
Does not own: special tokens, BOS/EOS, detokenizing (core.py).

A fragment here never contains a special token llama.cpp would have split out first.
Each backend has `encode(fragments) -> list[int]` (the ids of all fragments, in order).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import unicodedata
from pathlib import Path

import blake3
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from kinetic.frontend.tokenizer.vocab import Attr, Vocab
from kinetic.user_cache import cache_dir

CACHE_FORMAT = "spm-merges-v1"


class _HFBackend:
    """A `tokenizers.Tokenizer` with no added tokens, run on already-partitioned text."""

    def __init__(self, hf: Tokenizer):
        self.hf = hf

    def encode(self, fragments: list[str]) -> list[int]:
        return [i for ids in self.encode_each(fragments) for i in ids]

    def encode_each(self, fragments: list[str]) -> list[list[int]]:
        """The ids of each fragment. Always the batch encoder, even for one fragment: it runs
        without the GIL (Tokenizer.encode holds it throughout, so a long prompt tokenized on a
        server's worker thread froze the event loop for seconds) and skips the offsets nobody
        reads, about twice as fast."""
        return [enc.ids for enc in self.hf.encode_batch_fast(fragments, add_special_tokens=False)]


def build_bpe(vocab: Vocab) -> _HFBackend:
    """Byte-level BPE: the pre-tokenizer's regexes, GPT-2's byte-to-character map, merges by rank.

    llama.cpp ranks a merge "a b" by its line in tokenizer.ggml.merges, splitting at the first space
    after the first character; the first of duplicate pairs keeps its rank. A merge whose parts or
    result are not tokens cannot yield a token and is left out (`tokenizers` refuses it).
    """
    assert vocab.pre is not None
    hf = Tokenizer(_bpe_model(vocab, dict(vocab.token_to_id), ignore_merges=vocab.pre.ignore_merges))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in vocab.pre.regexes]
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    return _HFBackend(hf)


def _bpe_model(vocab: Vocab, ids: dict[str, int], **options) -> models.BPE:
    """A `tokenizers` BPE over `ids` with the file's merges in rank order, as llama.cpp splits them.

    A merge whose parts or result are not tokens cannot yield a token and is left out (`tokenizers`
    refuses it), as is a repeated pair (llama.cpp keeps its first rank). Checking every merge costs
    about a second on Gemma 4's half a million, so `tokenizers` is first handed them unchecked and
    the list is filtered only if it refuses them or holds a repeat.
    """
    pairs = [(line[:cut], line[cut + 1 :]) for line in vocab.merges for cut in (line.find(" ", 1),) if cut > 0]
    if len(pairs) == len(vocab.merges) and len(set(pairs)) == len(pairs):
        try:
            return models.BPE(ids, pairs, **options)
        except Exception:  # `tokenizers` raises a plain Exception for a merge outside the vocabulary
            pass
    usable: dict[tuple[str, str], None] = {}
    for a, b in pairs:
        if a in ids and b in ids and a + b in ids:
            usable.setdefault((a, b))
    return models.BPE(ids, list(usable), **options)


class SpmStyleBpe:
    """BPE over raw UTF-8 with U+2581 for spaces (llama.cpp's "gemma4" pre-tokenizer).

    Spaces become U+2581, the text splits into runs of newlines and runs of anything else, and each
    run is merged by the file's ranks from single characters (`tokenizers` does the merging). A
    character with no token becomes its bytes' <0xNN> tokens; llama.cpp drops a byte whose token
    the vocabulary lacks, which `tokenizers` would not (it falls back to all bytes or none), so every
    missing byte token is given a stand-in id past the vocabulary that `encode` drops. A run of
    newlines that is itself a token is taken whole (`whole_newline_runs`), as llama.cpp does since
    its merges may not reach it; that check, and the newline split, are the Python part here.
    """

    def __init__(self, vocab: Vocab):
        ids = dict(vocab.token_to_id)
        self.n_tokens = len(vocab.tokens)
        for b in range(256):
            ids.setdefault(f"<0x{b:02X}>", self.n_tokens + b)
        self.hf = _HFBackend(Tokenizer(_bpe_model(vocab, ids, byte_fallback=True)))
        assert vocab.pre is not None
        self.split = re.compile("|".join(vocab.pre.regexes))
        self.whole = {t: i for t, i in vocab.token_to_id.items() if t and not t.strip("\n")} \
            if vocab.pre.whole_newline_runs else {}

    def encode(self, fragments: list[str]) -> list[int]:
        runs = [run for fragment in fragments for run in self.split.findall(fragment.replace(" ", "\u2581"))]
        merged = iter(self.hf.encode_each([run for run in runs if run not in self.whole]))
        out: list[int] = []
        for run in runs:
            out.extend([self.whole[run]] if run in self.whole else next(merged))
        return [i for i in out if i < self.n_tokens]


# -- SentencePiece ---------------------------------------------------------------------------------


def build_spm(vocab: Vocab, cache_dir: Path | None) -> _HFBackend:
    """SentencePiece BPE as llama.cpp runs it, expressed as a `tokenizers` BPE model.

    llama.cpp starts from single characters and repeatedly joins the adjacent pair whose joined
    text is a token with the highest score (leftmost on ties); characters no token covers become
    `<0xNN>` byte tokens. That is BPE whose merges are every split (a, b) of every token t with a, b
    tokens, ranked by t's score (high first): pairs that make the same token are adjacent in rank,
    so the order between them never decides anything. Spaces become U+2581 before merging.

    Building the merge list is the slow part (about 2 s for a 262k vocabulary), so it is cached on
    disk in `tokenizers`' own vocab.json/merges.txt form, keyed by a hash of the vocabulary.
    """
    key = _vocab_key(vocab)
    folder = cache_dir / key if cache_dir is not None else None
    model = None
    if folder is not None and (folder / "merges.txt").is_file():
        try:
            files = str(folder / "vocab.json"), str(folder / "merges.txt")
            model = models.BPE.from_file(*files, byte_fallback=True)
        except Exception:  # a damaged cache entry is rebuilt below
            model = None
    if model is None:
        merges = spm_merges(vocab)
        model = models.BPE(dict(vocab.token_to_id), merges, byte_fallback=True)
        if folder is not None:
            _store(folder, vocab, merges)
    hf = Tokenizer(model)
    hf.normalizer = normalizers.Replace(" ", "\u2581")
    return _HFBackend(hf)


def spm_merges(vocab: Vocab) -> list[tuple[str, str]]:
    """Every split of every token into two tokens, ordered by the joined token's score (high first)."""
    ids = vocab.token_to_id
    scores = vocab.scores or [0.0] * len(vocab.tokens)
    # Text never holds a space here (it became U+2581) nor a character that is a user-defined token
    # by itself (Gemma's "\n", "\t"): those are split out first, so merges over them never apply.
    user_chars = {t for i, t in enumerate(vocab.tokens) if len(t) == 1 and vocab.attrs[i] & Attr.USER_DEFINED}
    unseen = {" "} | user_chars
    unseen.discard("\u2581")
    ranked: list[tuple[float, int, int]] = []
    for i, text in enumerate(vocab.tokens):
        if vocab.attrs[i] & Attr.BYTE or len(text) < 2 or any(c in text for c in unseen):
            continue
        for k in range(1, len(text)):
            if text[:k] in ids and text[k:] in ids:
                ranked.append((-scores[i], i, k))
    ranked.sort()
    tokens = vocab.tokens
    return [(tokens[i][:k], tokens[i][k:]) for _, i, k in ranked]


def _vocab_key(vocab: Vocab) -> str:
    h = blake3.blake3(CACHE_FORMAT.encode())
    h.update("\0".join(vocab.tokens).encode("utf-8", "surrogatepass"))
    h.update(json.dumps(vocab.scores).encode())
    h.update(bytes(int(a) & 0x7F for a in vocab.attrs))
    return h.hexdigest()[:32]


def _store(folder: Path, vocab: Vocab, merges: list[tuple[str, str]]) -> None:
    """Write the cache entry atomically; a merge that merges.txt cannot spell disables caching."""
    if any(c in part for a, b in merges for part in (a, b) for c in " \n\r"):
        return
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
        (tmp / "vocab.json").write_text(json.dumps(vocab.token_to_id, ensure_ascii=False), encoding="utf-8")
        with open(tmp / "merges.txt", "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n")
            f.writelines(f"{a} {b}\n" for a, b in merges)
        os.replace(tmp, folder)
    except OSError:
        pass  # the cache is an optimisation; a read-only home still tokenizes


def default_cache_dir() -> Path:
    return cache_dir("tokenizers")


# -- WordPiece -------------------------------------------------------------------------------------


class WordPiece:
    """llama.cpp's WordPiece (`bert`): NFD, lower case, split at spaces and punctuation, then the
    longest vocabulary entry at each position of U+2581 + word; a word with a gap becomes [UNK].

    The GGUF vocabulary marks word starts with U+2581 instead of marking continuations with "##",
    which is why this does not map onto `tokenizers`' WordPiece; BERT models are small inputs.
    """

    def __init__(self, vocab: Vocab):
        self.ids = vocab.token_to_id
        self.unk = vocab.unk_id
        self.max_len = max(len(t) for t in vocab.tokens)

    def encode(self, fragments: list[str]) -> list[int]:
        out: list[int] = []
        for fragment in fragments:
            for word in _bert_words(fragment):
                out.extend(self._word(word))
        return out

    def _word(self, word: str) -> list[int]:
        text = "\u2581" + word
        n, i, found = len(text), 0, []
        while i < n:
            for j in range(min(n, i + self.max_len), i, -1):
                tid = self.ids.get(text[i:j])
                if tid is not None:
                    found.append(tid)
                    i = j
                    break
            else:
                return [self.unk] if self.unk is not None else []
        return found


def _is_chinese(cp: int) -> bool:
    # CJK ranges as llama.cpp's llm_tokenizer_wpm_session::is_chinese_char lists them.
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B920 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def _bert_words(text: str) -> list[str]:
    words, current = [], []
    for ch in unicodedata.normalize("NFD", text):
        cat = unicodedata.category(ch)
        cp = ord(ch)
        if ch.isspace() or cat == "Zs":
            if current:
                words.append("".join(current))
                current = []
            continue
        if cp == 0 or cp == 0xFFFD or cat in ("Cc", "Cf", "Co", "Cs"):
            continue
        low = ch.lower()[0]
        if cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or _is_chinese(cp):
            if current:
                words.append("".join(current))
                current = []
            words.append(low)
        else:
            current.append(low)
    if current:
        words.append("".join(current))
    return words
