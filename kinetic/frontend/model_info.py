"""What a GGUF file holds, read from its header only: the facts `kinetic info` prints.

Owns: collecting those facts into a ModelInfo (name, architecture and whether Kinetic supports it,
size and parameter count, context, layers and width, prediction block, weight types, tokenizer,
chat template) and rendering them as text or as a JSON-ready dict. Does not own parsing the file
(gguf_file), the family registry (families) or tokenization.

Nothing here touches tensor data or decodes a whole vocabulary, so it stays instant on any file;
every metadata value is type-checked, so a file with odd values still gets a report.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from gguf import GGUFValueType

from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import GGUFFile, open_gguf

TOKENIZER_MODELS = frozenset({"gpt2", "gemma4", "llama"})


def supported_architectures() -> frozenset[str]:
    """The `general.architecture` names the family registry answers to (imported lazily: only
    `kinetic info` and loading need it)."""
    from kinetic.frontend import families

    return frozenset(families.supported_architectures())


def supported_pre_tokenizers() -> frozenset[str]:
    """The BPE pre-tokenizers the tokenizer implements (its table, imported lazily like the registry)."""
    from kinetic.frontend.tokenizer.pretok import PRE_TOKENIZERS

    return frozenset(PRE_TOKENIZERS)


@dataclass(frozen=True)
class WeightGroup:
    """All tensors of one type: how many and how many bytes they take."""

    type: str
    tensors: int
    bytes: int


@dataclass(frozen=True)
class TokenizerInfo:
    model: str | None  # tokenizer.ggml.model: gpt2 (byte-level BPE), llama (SentencePiece), ...
    pre: str | None  # tokenizer.ggml.pre, the BPE pre-tokenizer
    supported: bool  # whether Kinetic has this model and (for BPE) this pre-tokenizer
    tokens: int | None
    bos_token_id: int | None
    bos_token: str | None
    add_bos: bool  # whether a prompt starts with BOS
    eos_token_id: int | None
    eos_token: str | None


@dataclass(frozen=True)
class ModelInfo:
    file: str
    name: str | None
    architecture: str | None
    supported: bool
    size_bytes: int
    parameters: int
    context_length: int | None
    layers: int | None
    width: int | None
    nextn_predict_layers: int  # > 0: the file has a prediction block that drafts tokens
    weights: tuple[WeightGroup, ...]  # largest first
    tokenizer: TokenizerInfo
    chat_template_bytes: int | None  # None: the file has no chat template

    @property
    def prediction(self) -> bool:
        return self.nextn_predict_layers > 0


def read_model_info(path: str | os.PathLike) -> ModelInfo:
    """Open the file's header and collect what `kinetic info` reports."""
    return describe(open_gguf(path))


def describe(gguf: GGUFFile) -> ModelInfo:
    """The facts `kinetic info` reports about an open file."""
    meta = gguf.metadata
    arch = _str(meta, "general.architecture")

    def arch_int(suffix: str) -> int | None:
        return _int(meta, f"{arch}.{suffix}") if arch else None

    template = _str(meta, "tokenizer.chat_template")
    return ModelInfo(
        file=gguf.path.name,
        name=_str(meta, "general.name"),
        architecture=arch,
        supported=arch in supported_architectures(),
        size_bytes=gguf.file_size,
        parameters=sum(t.n_elements for t in gguf.tensors.values()),
        context_length=arch_int("context_length"),
        layers=arch_int("block_count"),
        width=arch_int("embedding_length"),
        nextn_predict_layers=arch_int("nextn_predict_layers") or 0,
        weights=_weight_groups(gguf),
        tokenizer=_tokenizer_info(gguf),
        chat_template_bytes=None if template is None else len(template.encode("utf-8")),
    )


def _weight_groups(gguf: GGUFFile) -> tuple[WeightGroup, ...]:
    counts: dict[str, list[int]] = {}
    for t in gguf.tensors.values():
        entry = counts.setdefault(t.type.name, [0, 0])
        entry[0] += 1
        entry[1] += t.nbytes
    groups = (WeightGroup(name, n, size) for name, (n, size) in counts.items())
    return tuple(sorted(groups, key=lambda g: (-g.bytes, g.type)))


def _tokenizer_info(gguf: GGUFFile) -> TokenizerInfo:
    meta = gguf.metadata
    model = _str(meta, "tokenizer.ggml.model")
    pre = _str(meta, "tokenizer.ggml.pre")
    known_pre = pre or "default"  # llama.cpp reads a missing pre-tokenizer as "default"
    supported = model in TOKENIZER_MODELS and (model != "gpt2" or known_pre in supported_pre_tokenizers())
    from kinetic.frontend.tokenizer.vocab import effective_add_bos

    add_bos = effective_add_bos(model, known_pre, meta.get("tokenizer.ggml.add_bos_token"))
    bos_id = _int(meta, "tokenizer.ggml.bos_token_id")
    eos_id = _int(meta, "tokenizer.ggml.eos_token_id")
    tokens = meta.array_length("tokenizer.ggml.tokens")
    return TokenizerInfo(
        model=model,
        pre=pre,
        supported=supported,
        tokens=tokens,
        bos_token_id=bos_id,
        bos_token=_token_text(gguf, bos_id),
        add_bos=add_bos and bos_id is not None,
        eos_token_id=eos_id,
        eos_token=_token_text(gguf, eos_id),
    )


def _token_text(gguf: GGUFFile, token_id: int | None) -> str | None:
    """The text of one token, without decoding the vocabulary; None when there is no such token."""
    meta = gguf.metadata
    key = "tokenizer.ggml.tokens"
    if token_id is None or meta.array_item_type(key) != GGUFValueType.STRING:
        return None
    if not 0 <= token_id < (meta.array_length(key) or 0):
        return None
    try:
        return meta.array_item(key, token_id)
    except KineticError:
        return f"<token {token_id}: not valid UTF-8>"


def _str(meta, key: str) -> str | None:
    value = meta.get(key) if meta.value_type(key) == GGUFValueType.STRING else None
    return value if isinstance(value, str) else None


def _int(meta, key: str) -> int | None:
    if meta.array_length(key) is not None:
        return None
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- rendering ---------------------------------------------------------------------------------------

LABEL_WIDTH = 15


def to_json(info: ModelInfo) -> dict[str, Any]:
    """The same facts as the text report, as a JSON-ready dict."""
    out = asdict(info)
    out["prediction"] = info.prediction
    out["weights"] = [asdict(g) for g in info.weights]
    return out


def format_text(info: ModelInfo) -> str:
    """The report as docs/cli.md shows it (`kinetic info`): a file line, then indented label/value rows."""
    rows = [
        ("name", info.name or "none"),
        ("architecture", _architecture(info)),
        ("size", f"{info.size_bytes / 1024**3:.2f} GiB, {_count(info.parameters)} parameters"),
        ("context", f"{info.context_length} tokens" if info.context_length is not None else "unknown"),
        ("layers", f"{_or_unknown(info.layers)}, width {_or_unknown(info.width)}"),
        ("prediction", "yes (drafts for speculative decoding)" if info.prediction else "no"),
    ]
    lines = [info.file]
    lines += [_row(label, value) for label, value in rows]
    lines += _weight_rows(info.weights)
    lines.append(_row("tokenizer", _tokenizer(info.tokenizer)))
    template = "none" if info.chat_template_bytes is None else f"{info.chat_template_bytes} bytes"
    lines.append(_row("chat template", template))
    return "\n".join(lines)


def _row(label: str, value: str) -> str:
    return f"  {label:<{LABEL_WIDTH}}{value}"


def _weight_rows(weights: tuple[WeightGroup, ...]) -> list[str]:
    if not weights:
        return [_row("weights", "none")]
    type_width = max(6, max(len(g.type) for g in weights) + 2)
    values = [
        f"{g.type:<{type_width}}{g.tensors:>5} tensors{g.bytes / 1024**2:10.1f} MiB" for g in weights
    ]
    indent = " " * (2 + LABEL_WIDTH)
    return [_row("weights", values[0])] + [indent + v for v in values[1:]]


def _architecture(info: ModelInfo) -> str:
    if info.architecture is None:
        return "none (general.architecture is missing)"
    return info.architecture if info.supported else f"{info.architecture} (not supported yet)"


def _tokenizer(tok: TokenizerInfo) -> str:
    if tok.model is None:
        return "none"
    if tok.model not in TOKENIZER_MODELS:
        kind = f"{tok.model} (not supported yet)"
    elif tok.model == "gpt2" and not tok.supported:
        kind = f'{tok.model} (unsupported pre-tokenizer "{tok.pre or "none"}")'
    else:
        kind = f"{tok.model} ({tok.pre})" if tok.pre else tok.model
    bos = tok.bos_token if tok.add_bos and tok.bos_token is not None else "none"
    eos = tok.eos_token if tok.eos_token is not None else "none"
    return f"{kind}, {_or_unknown(tok.tokens)} tokens, BOS {bos}, EOS {eos}"


def _count(n: int) -> str:
    if n >= 10**9:
        return f"{n / 1e9:.2f} B"
    return f"{n / 1e6:.2f} M"


def _or_unknown(value: int | None) -> str:
    return "unknown" if value is None else str(value)
