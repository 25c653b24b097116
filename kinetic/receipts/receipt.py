"""The receipt record: what one answer was made from, as JSON, and its Ed25519 signature.

Owns: the receipt's fields (docs/receipts.md), the canonical bytes a signature covers, signing and
checking a signature, reading a receipt back (strict JSON, every field's type and the values a
rerun uses checked) and writing it (through kinetic.outputs). Does not own the
hashes (hashing.py), running a model or rerunning a receipt (verify.py).

The canonical form: the receipt without its "signature" member, as JSON with keys sorted, no spaces
(separators "," and ":"), non-ASCII characters written as themselves, encoded as UTF-8; floats as
Python writes them (the shortest text that reads back as the same double; -inf as -Infinity).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kinetic.devices import DEVICE_NAMES
from kinetic.errors import KineticError
from kinetic.frontend.blocks import Options
from kinetic.frontend.rope_scaling import RopeOverrides
from kinetic.ir.orders import DEFAULT_NUMERICS, NUMERICS
from kinetic.outputs import Inputs, write_output
from kinetic.receipts.hashing import build_hash, file_blake3, token_hash
from kinetic.receipts.strict_json import MAX_RECEIPT_BYTES, JsonRefused, loads_strict
from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.sampling.settings import SettingError

RECEIPT_VERSION = 1
_HINT = "The receipt is damaged or was not written by `kinetic run --receipt`."


def device_class_of(device: str) -> str:
    """The class that decides the bits: the CPU's (cpu-x86_64-avx2, ...) or the numpy reference's."""
    if device == "reference":
        return "reference-numpy"
    from kinetic.ktc.profile import device_class

    return device_class(device)


def device_settings(n_ctx: int, options: Options | None = None) -> dict[str, Any]:
    """The load settings that can change the bits or the length of an answer. Threads and the prompt
    batch are not among them: threads split rows, never a sum, and every row's sums are the same in
    any batch (docs/numerics.md), so neither changes a bit. Rotary overrides (--rope-*, --yarn-*)
    are recorded under "rope" only when some are given, as {field: value} of RopeOverrides; the
    numerics mode (kinetic/ir/orders.py) always, under "numerics" (a receipt without it was made
    before the fast mode existed, in "ggml": options_from_settings)."""
    options = options or Options()
    settings = {"ctx-size": n_ctx, "activations": options.activations, "kv-type": options.kv_dtype,
                "numerics": options.numerics or DEFAULT_NUMERICS}
    rope = {f.name: getattr(options.rope, f.name) for f in fields(RopeOverrides)
            if getattr(options.rope, f.name) is not None}
    if rope:
        settings["rope"] = rope
    return settings


def options_from_settings(settings: dict[str, Any]) -> Options:
    """The lowering options a receipt's device settings record; no numerics mode means "ggml" (receipts
    written before the fast mode existed, or when it was left out for ggml's), whatever the default."""
    return Options(activations=settings["activations"], kv_dtype=settings["kv-type"],
                   rope=RopeOverrides(**settings.get("rope", {})), numerics=settings.get("numerics", "ggml"))


def tokens_record(ids: list[int]) -> dict[str, Any]:
    return {"count": len(ids), "blake3": token_hash(ids), "ids": [int(t) for t in ids]}


@dataclass(frozen=True)
class Answer:
    """What one answer was made from and what it was: everything a receipt records."""

    model_path: Path
    device: str
    n_ctx: int
    input: Any  # the chat messages (list of {role, content}), the prompt text, or None for token ids
    prompt_ids: list[int]
    sampling: SamplingSettings  # with the seed actually used
    max_tokens: int | None
    finish: str  # "stop" or "length"
    text: str
    output_ids: list[int]
    options: Options | None = None  # how the graph was lowered (Model.options); None: the defaults
    adapters: tuple = ()  # the LoRA adapters merged at load (kinetic.lora.Adapter: file and scale)


def make_receipt(answer: Answer, signing_key=None) -> dict[str, Any]:
    """The receipt of an answer, signed when a nacl SigningKey is given."""
    from kinetic import __version__

    if answer.sampling.random_seed:
        raise ValueError("a receipt needs the seed actually used, not a request for a fresh one")
    path = answer.model_path
    receipt = {
        "receipt": RECEIPT_VERSION,
        "kinetic": {"version": __version__, "build": build_hash()},
        "model": {"file": path.name, "path": str(path), "size": path.stat().st_size, "blake3": file_blake3(path)},
        "device": {"class": device_class_of(answer.device), "name": DEVICE_NAMES.get(answer.device, answer.device),
                   "settings": device_settings(answer.n_ctx, answer.options)},
        "input": answer.input,
        "prompt": tokens_record(answer.prompt_ids),
        "sampling": {**answer.sampling.as_dict(), "max_tokens": answer.max_tokens, "stop": []},
        "output": {"finish": answer.finish, "text": answer.text, "tokens": tokens_record(answer.output_ids)},
    }
    if answer.adapters:  # each adapter's file, BLAKE3 and scale (docs/lora.md)
        receipt["model"]["adapters"] = [adapter.record() for adapter in answer.adapters]
    return sign(receipt, signing_key) if signing_key is not None else receipt


# -- signing ------------------------------------------------------------------------------------------


def canonical_bytes(receipt: dict[str, Any]) -> bytes:
    """What the signature covers: every member but "signature", as compact sorted JSON in UTF-8."""
    body = {k: v for k, v in receipt.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sign(receipt: dict[str, Any], signing_key) -> dict[str, Any]:
    signature = signing_key.sign(canonical_bytes(receipt)).signature
    return {**{k: v for k, v in receipt.items() if k != "signature"},
            "signature": {"public_key": bytes(signing_key.verify_key).hex(), "ed25519": signature.hex()}}


def signature_valid(receipt: dict[str, Any]) -> bool | None:
    """None when unsigned; else whether the signature is the public key's over the canonical bytes."""
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    sig = receipt.get("signature")
    if sig is None:
        return None
    try:
        VerifyKey(bytes.fromhex(sig["public_key"])).verify(canonical_bytes(receipt), bytes.fromhex(sig["ed25519"]))
    except (BadSignatureError, ValueError, TypeError, KeyError):
        return False
    return True


# -- reading and writing ------------------------------------------------------------------------------

# Every member and its type; a receipt missing one, or with another type, does not read.
_SHAPE: dict[str, Any] = {
    "receipt": int,
    "kinetic": {"version": str, "build": str},
    "model": {"file": str, "path": str, "size": int, "blake3": str},
    "device": {"class": str, "name": str, "settings": {"ctx-size": int, "activations": str, "kv-type": str}},
    "input": object,  # messages, text or null: any JSON value
    "prompt": {"count": int, "blake3": str, "ids": list},
    "sampling": dict,
    "output": {"finish": str, "text": str, "tokens": {"count": int, "blake3": str, "ids": list}},
}


_DEVICE_CHOICES = {"activations": ("q8", "f32"), "kv-type": ("f16", "f32")}
_FINISHES = ("stop", "length")
CTX_MAX = 2**31 - 1


def read_receipt(path: str | os.PathLike) -> dict[str, Any]:
    """The receipt in a file, every member checked: strict JSON (strict_json.py), each member's
    type, the values a rerun uses (token ids, load settings, sampling settings and the seed). A
    KineticError names the first thing wrong."""
    path = Path(path)
    receipt = _parse(path)
    if not isinstance(receipt, dict):
        raise KineticError(f"{path} does not hold a receipt object", _HINT)
    _check_shape(receipt, _SHAPE, path, "")
    if receipt["receipt"] != RECEIPT_VERSION:
        raise KineticError(f"{path} is a version {receipt['receipt']} receipt; this Kinetic reads version "
                           f"{RECEIPT_VERSION}", "Verify it with the Kinetic version that made it.")
    _check_values(receipt, path)
    sig = receipt.get("signature")
    if sig is not None and not (isinstance(sig, dict) and isinstance(sig.get("public_key"), str)
                                and isinstance(sig.get("ed25519"), str)):
        raise KineticError(f"{path}: signature must hold public_key and ed25519 as hex text", _HINT)
    settings_from_receipt(receipt, path)
    return receipt


def _parse(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RECEIPT_BYTES + 1)
    except OSError as exc:
        raise KineticError(f"cannot read {path}: {exc.strerror or exc}", "Check the receipt's path.") from None
    if len(data) > MAX_RECEIPT_BYTES:
        raise KineticError(f"{path} is larger than a receipt can be ({MAX_RECEIPT_BYTES // 2**20} MiB)", _HINT)
    try:
        return loads_strict(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise KineticError(f"{path} is not UTF-8 text", _HINT) from None
    except JsonRefused as exc:
        raise KineticError(f"{path} is not a receipt: {exc}", _HINT) from None


def _check_values(receipt: dict[str, Any], path: Path) -> None:
    """The values a rerun uses, beyond their types."""
    for where in (receipt["prompt"]["ids"], receipt["output"]["tokens"]["ids"]):
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in where):
            raise KineticError(f"{path}: a token id is not an integer from 0 to 2**32 - 1", _HINT)
    settings = receipt["device"]["settings"]
    if not 1 <= settings["ctx-size"] <= CTX_MAX:
        raise KineticError(f"{path}: device.settings.ctx-size is {settings['ctx-size']}, not from 1 to {CTX_MAX}",
                           _HINT)
    for name, choices in _DEVICE_CHOICES.items():
        if settings[name] not in choices:
            raise KineticError(f"{path}: device.settings.{name} is {settings[name]!r}, not one of {choices}", _HINT)
    _check_rope(settings.get("rope", {}), path)
    if settings.get("numerics", "ggml") not in NUMERICS:
        raise KineticError(f"{path}: device.settings.numerics is {settings['numerics']!r}, not one of {NUMERICS}",
                           _HINT)
    if receipt["output"]["finish"] not in _FINISHES:
        raise KineticError(f"{path}: output.finish is {receipt['output']['finish']!r}, not one of {_FINISHES}",
                           _HINT)
    if receipt["model"]["size"] < 0:
        raise KineticError(f"{path}: model.size is negative", _HINT)


def _check_rope(rope: Any, path: Path) -> None:
    """device.settings.rope, when present: an object of RopeOverrides' fields with their types and ranges
    (the overrides' own validation)."""
    kinds = {f.name: f.type for f in fields(RopeOverrides)}
    if not isinstance(rope, dict) or not set(rope) <= set(kinds):
        raise KineticError(f"{path}: device.settings.rope is not an object of {sorted(kinds)}", _HINT)
    for name, value in rope.items():
        want = str if "str" in str(kinds[name]) else int if "int" in str(kinds[name]) else (int, float)
        if isinstance(value, bool) or not isinstance(value, want):
            raise KineticError(f"{path}: device.settings.rope.{name} is {value!r}, not a {kinds[name]}", _HINT)
    try:
        RopeOverrides(**rope)
    except KineticError as exc:
        raise KineticError(f"{path}: device.settings.rope: {exc.message}", _HINT) from None


def _check_shape(value: Any, shape: Any, path: Path, where: str) -> None:
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            raise KineticError(f"{path}: {where or 'the receipt'} is not an object", _HINT)
        for key, inner in shape.items():
            if key not in value:
                raise KineticError(f"{path} has no {where + key!r}", _HINT)
            _check_shape(value[key], inner, path, f"{where}{key}.")
    elif not isinstance(value, shape) or (shape is int and isinstance(value, bool)):
        raise KineticError(f"{path}: {where[:-1]!r} is {value!r}, not {shape.__name__}", _HINT)


def settings_from_receipt(receipt: dict[str, Any], path: str | os.PathLike = "the receipt"
                          ) -> tuple[SamplingSettings, int | None]:
    """The recorded sampling settings (with their seed) and token limit, checked by the settings'
    one validation (a float seed, a top_p of 2, ... are refused naming the setting)."""
    recorded = dict(receipt["sampling"])
    max_tokens = recorded.pop("max_tokens", None)
    stop = recorded.pop("stop", [])
    names = {f.name for f in fields(SamplingSettings)}
    unknown = sorted(set(recorded) - names)
    missing = sorted(names - set(recorded))
    if unknown or missing or stop:
        what = (f"unknown sampling settings {unknown}" if unknown else f"no {missing} in its sampling settings"
                if missing else "stop strings, which `kinetic run` does not take yet")
        raise KineticError(f"{path} has {what}", "Verify it with the Kinetic version that made it.")
    if recorded["seed"] is None:
        raise KineticError(f"{path} records no seed", _HINT)
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 0):
        raise KineticError(f"{path}: sampling.max_tokens is {max_tokens!r}, not a count", _HINT)
    recorded = {k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()}
    try:
        return SamplingSettings(**recorded), max_tokens
    except SettingError as exc:
        raise KineticError(f"{path}: sampling.{exc.setting} {exc.reason}", _HINT) from None


def write_receipt(receipt: dict[str, Any], path: str | os.PathLike, *, force: bool = False,
                  inputs: Inputs | None = None) -> None:
    """Two-space indented JSON, each list of numbers on one line (as docs/receipts.md shows),
    written by kinetic.outputs: never over an existing file without force, never over an input."""
    write_output(path, _pretty(receipt, 0) + "\n", inputs=inputs, force=force)


def _pretty(value: Any, depth: int) -> str:
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {_pretty(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + _pretty(v, depth + 1) for v in value) + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def summary(receipt: dict[str, Any]) -> str:
    """`LFM3.gguf, 15 prompt and 18 output tokens, seed 42, made on cpu-x86_64-avx2 by Kinetic 0.1.0
    (build 378534cb64f30a15)`."""
    return (f"{receipt['model']['file']}, {receipt['prompt']['count']} prompt and "
            f"{receipt['output']['tokens']['count']} output tokens, seed {receipt['sampling'].get('seed')}, made on "
            f"{receipt['device']['class']} by Kinetic {receipt['kinetic']['version']} "
            f"(build {receipt['kinetic']['build']})")
