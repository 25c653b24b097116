"""A small Gemma 4 style vocabulary and llama.cpp's token ids on it, for tests/data/tokenizer-gemma4.

Owns: building the vocabulary (a BPE trained with the `tokenizers` library on U+2581-for-space text,
plus Gemma 4's special tokens, <0xXX> byte tokens and newline-run tokens), writing it as a GGUF file
with tokenizer.ggml.model "gemma4" and no tensors, and recording what llama.cpp does on it: ids for
every text of TEXTS (plain, and with add_special + parse_special), its detokenization of those ids,
and each token's attributes and end-of-generation flag. Does not own the tests that read the data
(tests/frontend/test_tokenizer_gemma4.py) nor Kinetic's tokenizer.

No real Gemma 4 file is reachable from this machine, so the vocabulary is made here. It follows what
llama.cpp's converter writes for Gemma 4 (conversion/gemma.py): every score -1000, byte tokens of type
BYTE, special tokens CONTROL, the chat parser's visible tokens USER_DEFINED, add_bos_token true,
add_space_prefix false, no tokenizer.ggml.pre. Two deliberate departures test the edge cases: the
byte token <0x9F> is missing (llama.cpp then drops that byte) and "</s>" is a normal token (llama.cpp
takes it out of the end-of-generation set when "<|tool_response>" exists). The hyperparameters are
copied from the shared synthetic gemma4 file so llama.cpp's loader accepts the file (vocab_only).

    LLAMA_CPP_LIB_PATH=~/.cache/kinetic-ref/llama.cpp/build/bin \\
    LLAMA_CPP_PY=~/.cache/kinetic-ref/lcp/llama_cpp_python-0.3.36/llama_cpp \\
    .venv/bin/python scripts/make_gemma4_tokenizer_data.py
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
from pathlib import Path

import gguf
from tokenizers import Tokenizer, models, normalizers, trainers

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "tokenizer-gemma4"
HPARAMS_DONOR = ROOT / "tests" / "data" / "synthetic" / "gemma4" / "gemma4.gguf"
CORPUS = ROOT / "tests" / "data" / "golden" / "apache-2.0.txt"
TOOLS = Path(os.environ.get("SYNTH_TOOLS", "/work/shared/tools"))

CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|image|>", "<|audio|>"]
VISIBLE = ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
           '<|"|>']
MISSING_BYTES = {0x9F}
VARIANT_PRES = ("gemma4", "sarvam-moe")  # tokenizer.ggml.pre values recorded on a "gpt2" copy
NEWLINE_RUNS = ["\n", "\n\n", "\n\n\n", "\n\n\n\n"]  # normal tokens, as in Gemma 4; no run of 5 or more
TRAINED_SIZE = 2600
EXTRA_TRAINING = [
    "def add(a, b):", "    return a + b  # sum of two numbers, 42", "for i in range(10):  print(i)",
    "The quick brown fox jumps over the lazy dog near the river bank.", "Hello, world! What's up?",
    "日本語のテキストです。中文测试文本。한국어 텍스트.", "Ελληνικά Русский текст עברית العربية",
    "Tiếng Việt có dấu, café naïve résumé", "3.14159 2718281828 1,000,000 $42.00 100%",
    "\t\tTabbed\tcolumns\there", "<div class=\"x\">html</div> {\"json\": [1, 2]}",
]

# Hard cases: starts/ends with spaces, runs of spaces and newlines, tabs, CJK, emoji, byte fallback,
# special tokens and Gemma 4's chat markers, literal U+2581, clean-up of spaces.
TEXTS = [
    "", " ", "  ", "   ", "\n", "\n\n", "\n\n\n", "\n\n\n\n", "\n\n\n\n\n", "\n\n\n\n\n\n\n\n\n", " \n", "\n ",
    "\n \n", " \n\n ", "\t", "\t\t", " \t ", "\r\n", "\r\n\r\n", "a\rb",
    "Hello world", " Hello world", "Hello world ", "  Hello  world  ", "Hello   world\n\nBye",
    "a\n\n\nb", "a\n\n\n\n\n\nb", "line1\nline2\r\nline3\n", "    indented code",
    "def add(a, b):\n    return a + b  # sum of two numbers, 42",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "日本語のテキスト", "中文测试", "한국어", "ไทย ქართული हिन्दी", "🧑🏽‍🚀 👨‍👩‍👧 🇫🇷", "😀", "e\u0301 ﬁ Ω≈ç√∫",
    "\u200b\u200d\u2028\ufeff\u3000", "\x00\x01\x1f\x7f", "\u2581", "a\u2581b", "\u2581\u2581 x \u2581",
    "<bos>", "<eos>", "<bos>Hello", "Hello<eos>", "<|turn>user\nHi<turn|>\n<|turn>model\n",
    "<bos><|turn>system\nYou are helpful.<turn|>\n<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n",
    "<|channel>thought\nhmm<channel|>The answer", '<|tool_call>call:f{a:<|"|>x<|"|>}<tool_call|>',
    "<|tool_response>response:f{ok}<tool_response|>", "</s>", "a</s>b", "<start_of_turn>", "<|turn><|turn>",
    "<|turn", "turn|>", "<<|turn>>", "<|image|> <|audio|>", " <|turn> ", "<unk><pad><mask>",
    "Hello , world . What ' s up ? I 'm here , you 're there , we 've gone !", "don't won't it's",
    "12345678901234567890", "3.14159 1,000,000", "$42.00 100% #1 @user",
    "Tiếng Việt café naïve", "Ελληνικά Русский עברית العربية",
    "<div class=\"x\">html</div> {\"json\": [1, 2]}",
]


def build_vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges (the trained BPE's, then one merge over newlines)."""
    model = models.BPE(byte_fallback=False)
    trainer = trainers.BpeTrainer(vocab_size=TRAINED_SIZE, min_frequency=2, limit_alphabet=160, show_progress=False,
                                  initial_alphabet=["\u2581"])
    hf = Tokenizer(model)
    hf.normalizer = normalizers.Replace(" ", "\u2581")
    lines = [ln for ln in CORPUS.read_text(encoding="utf-8").split("\n") if ln.strip()]
    hf.train_from_iterator(lines + EXTRA_TRAINING, trainer=trainer)
    state = json.loads(hf.to_str())["model"]
    trained = sorted(state["vocab"], key=state["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    T = gguf.TokenType
    tokens = CONTROL + VISIBLE
    types = [T.CONTROL] * len(CONTROL) + [T.USER_DEFINED] * len(VISIBLE)
    for b in range(256):
        if b not in MISSING_BYTES:
            tokens.append(f"<0x{b:02X}>")
            types.append(T.BYTE)
    taken = set(tokens)
    for text in trained + NEWLINE_RUNS + ["</s>"]:
        if text not in taken:
            taken.add(text)
            tokens.append(text)
            types.append(T.NORMAL)
    return tokens, [int(t) for t in types], merges + ["\n \n"]


def hparams() -> dict:
    """The donor file's non-tokenizer metadata as {key: (value, value type)}."""
    reader = gguf.GGUFReader(str(HPARAMS_DONOR))
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith(("GGUF.", "tokenizer.")) or key == "general.architecture":
            continue
        vtype = field.types[-1]
        meta[key] = (field.contents(), vtype)
    return meta


def write_file(path: Path, model: str = "gemma4", pre: str | None = None) -> None:
    """The vocabulary as tokenizer.ggml.model `model` (with tokenizer.ggml.pre `pre` if given)."""
    import synth_models as sm

    tokens, types, merges = build_vocabulary()
    G = gguf.GGUFValueType
    meta = hparams()
    meta["general.name"] = ("gemma4 tokenizer test vocabulary", G.STRING)
    meta.update({
        "tokenizer.ggml.model": (model, G.STRING),
        "tokenizer.ggml.tokens": (tokens, G.STRING),
        "tokenizer.ggml.scores": ([-1000.0] * len(tokens), G.FLOAT32),
        "tokenizer.ggml.token_type": (types, G.INT32),
        "tokenizer.ggml.merges": (merges, G.STRING),
        "tokenizer.ggml.bos_token_id": (tokens.index("<bos>"), G.UINT32),
        "tokenizer.ggml.eos_token_id": (tokens.index("<eos>"), G.UINT32),
        "tokenizer.ggml.unknown_token_id": (tokens.index("<unk>"), G.UINT32),
        "tokenizer.ggml.padding_token_id": (tokens.index("<pad>"), G.UINT32),
        "tokenizer.ggml.add_bos_token": (True, G.BOOL),
        "tokenizer.ggml.add_space_prefix": (False, G.BOOL),
    })
    if pre is not None:
        meta["tokenizer.ggml.pre"] = (pre, G.STRING)
    sm.write_gguf(str(path), "gemma4", meta, [])


def record(path: Path) -> dict:
    """llama.cpp's answers on the file: ids, detokenizations, attributes, EOG flags."""
    import synth_models as sm

    L = sm.llama()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp refused {path}")
    vocab = L.llama_model_get_vocab(model)

    def tokenize(text: str, special: bool) -> list[int]:
        data = text.encode("utf-8")
        buf = (L.llama_token * (len(data) + 8))()
        n = L.llama_tokenize(vocab, data, len(data), buf, len(buf), special, special)
        assert n >= 0, text
        return list(buf[:n])

    def detokenize(ids: list[int], remove_special: bool) -> str:
        arr = (L.llama_token * max(1, len(ids)))(*ids)
        out = ctypes.create_string_buffer(16 * len(ids) + 64)
        n = L.llama_detokenize(vocab, arr, len(ids), out, len(out), remove_special, not remove_special)
        assert n >= 0
        return out.raw[:n].decode("utf-8", errors="replace")

    cases = []
    for text in TEXTS:
        ids, ids_special = tokenize(text, False), tokenize(text, True)
        cases.append({
            "text": text, "ids": ids, "ids_add_special_parse_special": ids_special,
            "detokenized": detokenize(ids, False),
            "detokenized_skip_special": detokenize(ids_special, True),
        })
    n_vocab = L.llama_vocab_n_tokens(vocab)
    return {
        "file": path.name,
        "llama_cpp": "b1-0c1e570 (vocab_only, llama_tokenize / llama_detokenize)",
        "bos": L.llama_vocab_bos(vocab), "eos": L.llama_vocab_eos(vocab),
        "add_bos": bool(L.llama_vocab_get_add_bos(vocab)),
        "eog_ids": [i for i in range(n_vocab) if L.llama_vocab_is_eog(vocab, i)],
        "attrs": [int(L.llama_vocab_get_attr(vocab, i)) for i in range(n_vocab)],
        "cases": cases,
    }


def main() -> None:
    sys.path.insert(0, str(TOOLS))
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "gemma4-vocab.gguf"
    write_file(path)
    doc = record(path)
    # The same vocabulary as byte-level BPE files naming an SPM-style pre-tokenizer (ids only; the
    # tests rebuild these files' metadata from gemma4-vocab.gguf).
    doc["variants"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in VARIANT_PRES:
            variant = Path(tmp) / f"gpt2-{pre}.gguf"
            write_file(variant, model="gpt2", pre=pre)
            found = record(variant)
            doc["variants"][pre] = {"add_bos": found["add_bos"], "eog_ids": found["eog_ids"], "cases": [
                {k: c[k] for k in ("ids", "ids_add_special_parse_special", "detokenized")} for c in found["cases"]
            ]}
    (OUT / "llama-cpp.json").write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes), {len(doc['cases'])} cases")


if __name__ == "__main__":
    main()
