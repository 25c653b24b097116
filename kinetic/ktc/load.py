"""Loading a .ktc file to run it: checked, joined into the frontend's view, graph and profile read.

Owns: what loading verifies and what it trusts. Every load checks the structure (header, manifest,
placement, zero padding), the signature if there is one, and the BLAKE3 of every small section. The
weights section is hashed too, unless a stamp shows that this very file was fully hashed before:
the stamp records the file's device, inode, size, modification and change times (ns) and its
manifest check, and lives in $XDG_CACHE_HOME/kinetic/ktc-verified/. Any write to the file changes
its change time, which no user can set back, so a file with a flipped byte is hashed again and
refused. `kinetic verify` always hashes everything.

The profile is used when this machine's device class is the one it was made for; otherwise the CPU
device's own defaults run and one note says so. Its matmul kernels (tile, wide paths) go to the CPU
step, and its prompt pass (when it names one) to the engine; they change speed only. A tuned
profile's thread count is used only on a machine with as many CPUs as the one it was tuned on (its
batch on any machine of the class). The stored graph is used when this build's pipeline hash and the
lowering options are the ones it was made with; otherwise the graph is made again from the weights
(with a note when the build differs). Either way it is checked against the weights and tokenizer
before it is returned (graph_check.py): an edited file with valid hashes is refused there, before
any kernel runs. A profile's thread count above what kinetic.limits allows on this machine is
replaced by the default, with a note.

A required signer (`require_signer`: an Ed25519 public key, from --require-signature, Model's
require_signature or $KINETIC_REQUIRE_SIGNATURE) is checked first: an unsigned file, a file signed
by another key, or a GGUF file (which cannot be signed) is refused with a SignatureRequiredError.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from kinetic.errors import KineticError, SignatureRequiredError
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.ktc import layout as L
from kinetic.ktc.gguf_sections import join_gguf
from kinetic.ktc.graph_check import check_graph
from kinetic.ktc.layout import Kind
from kinetic.ktc.profile import Profile, device_class
from kinetic.ktc.reader import KtcError, KtcFile
from kinetic.user_cache import cache_dir, file_stamp, write_json

REQUIRE_SIGNATURE_ENV = "KINETIC_REQUIRE_SIGNATURE"


def stderr_note(line: str) -> None:
    sys.stderr.write(f"kinetic: note: {line}\n")


class LoadedKtc:
    """A verified .ktc file: `gguf` (what the frontend reads), `profile`, `metadata`."""

    def __init__(self, path: str | os.PathLike, *, note: Callable[[str], None] = stderr_note,
                 use_stamps: bool = True, hash_weights: bool = True, require_signer: bytes | None = None):
        """`hash_weights=False` (for `kinetic info`) leaves the weights section's hash unchecked;
        `require_signer` refuses the file unless that public key signed it."""
        self.file = KtcFile.open(path)
        self.path = self.file.path
        self.note = note
        if require_signer is not None:
            check_signer(self.file, require_signer)
        for kind in Kind:
            if kind is not Kind.WEIGHTS and self.file.has(kind):
                self.file.check_hash(kind)
        if hash_weights and not (use_stamps and _stamp_matches(self.file)):
            before = _stamp(self.file)
            self.file.check_hash(Kind.WEIGHTS)
            if use_stamps and _stamp(self.file) == before:  # unchanged while it was hashed
                _write_stamp(self.file, before)
        self.profile = _profile(self.file)
        self.metadata = self.file.json(Kind.METADATA)
        self.gguf: GGUFFile = join_gguf(self.file)

    def graph(self, options=None):
        """The optimized graph: the stored one when this build would make the same, else made again."""
        from kinetic.compiler import compile_graph
        from kinetic.frontend.blocks import Options
        from kinetic.ir.graph import verify
        from kinetic.ir.text import parse_graph
        from kinetic.passes import pipeline_hash

        options = options or Options(numerics=self.numerics)  # none asked for: the stored graph's mode
        same_options = asdict(options) == self.stored_lowering
        same_build = self.profile.pipeline_hash == pipeline_hash()
        if same_options and same_build:
            try:
                graph = parse_graph(self.file.text(Kind.GRAPH))
                verify(graph)
            except KtcError:
                raise
            except Exception as exc:
                raise KtcError(self.path, "graph", f"section graph does not read as a valid graph: {exc}",
                               "The file was written by a faulty tool; compile it again from the .gguf file.") from None
        else:
            if same_options:
                self.note(f"{self.path.name} was optimized by another Kinetic build (kinetic "
                          f"{self.profile.kinetic_version}); optimizing its graph again")
            graph = compile_graph(self.gguf, options)
        check_graph(self.path, graph, self.gguf)
        return graph

    @property
    def stored_lowering(self) -> dict | None:
        """The lowering options the stored graph was made with (metadata "lowering"; None when that is
        not an object); a file from before the numerics modes holds ggml's orders."""
        lowering = self.metadata.get("lowering")
        return {"numerics": "ggml", **lowering} if isinstance(lowering, dict) else None

    @property
    def numerics(self) -> str:
        """The numerics mode of the stored graph ("ggml" or "fast", kinetic/ir/orders.py); "ggml" for
        a mode this build does not know (the options then differ, and the graph is made again)."""
        from kinetic.ir.orders import NUMERICS

        stored = (self.stored_lowering or {}).get("numerics")
        return stored if stored in NUMERICS else "ggml"

    def engine_settings(self, device: str, threads: int | None) -> dict:
        """Engine keywords from the profile when it fits this machine (threads given win)."""
        if device != self.profile.device:
            return {"threads": threads}
        here = device_class(device)
        if here != self.profile.device_class:
            self.note(f"{self.path.name} was prepared for {self.profile.device_class}, this machine is {here}; "
                      "running with the defaults for this machine")
            return {"threads": threads}
        settings = {"threads": threads if threads is not None else self._profile_threads(),
                    "batch": self.profile.batch, "matmul": self._profile_matmul()}
        if self.profile.prompt_pass is not None:  # a tuned pass size (absent: the engine's default)
            settings["prompt_pass"] = self.profile.prompt_pass
        return settings

    def _profile_matmul(self):
        """The profile's matmul kernels (a tuned profile's tile and wide paths: speed only, the same
        bits); None (the defaults) when its tile is not one the tuner tries."""
        from kinetic.codegen.cpu.matmul_choice import TILES

        if self.profile.matmul_tile not in TILES:
            self.note(f"{self.path.name}'s profile asks for matmul tiles of {self.profile.matmul_tile} rows, "
                      f"not one of {', '.join(map(str, TILES))}; running with the default kernels")
            return None
        return self.profile.matmul_choice()

    def _profile_threads(self) -> int | None:
        """The profile's thread count; None (every CPU) when it was tuned on a machine with another
        number of CPUs, where the measured best count says little."""
        from kinetic.codegen.cpu.step import available_cpus
        from kinetic.limits import check_threads, max_threads

        tuned_on = (self.profile.measured or {}).get("cpus")
        if self.profile.tuned and isinstance(tuned_on, int) and tuned_on != available_cpus():
            self.note(f"{self.path.name} was tuned on a machine with {tuned_on} CPUs, this one has "
                      f"{available_cpus()}; running with threads for this machine")
            return None
        try:
            return check_threads(self.profile.threads)
        except KineticError:
            self.note(f"{self.path.name}'s profile asks for {self.profile.threads} threads, more than "
                      f"{max_threads()} on this machine; running with threads for this machine")
            return None


def check_signer(file: KtcFile, public_key: bytes) -> None:
    """Refuse the file unless it is signed by `public_key` (its signature was verified on open)."""
    sig = file.signature
    if sig is not None and sig.public_key == public_key:
        return
    who = "is unsigned" if sig is None else f"is signed by {sig.public_key_hex}"
    raise SignatureRequiredError(f"{file.path.name} {who}; a signature by {public_key.hex()} is required",
                                 "Get the file from the publisher whose key you trust, or sign it with "
                                 "`kinetic compile MODEL.gguf -o MODEL.ktc --sign-key KEY`.")


def required_signer(spec: str | bytes | None = None) -> bytes | None:
    """The public key files must be signed by: `spec` (64 hex digits, a file holding them, or 32 raw
    bytes), else $KINETIC_REQUIRE_SIGNATURE, else None (any file, signed or not)."""
    from kinetic.ktc.keys import read_public_key

    if isinstance(spec, bytes):
        if len(spec) != 32:
            raise KineticError(f"a public key is 32 bytes, not {len(spec)}", "Give it as 64 hex digits.")
        return spec
    if spec is not None:
        return read_public_key(str(spec))
    from_env = os.environ.get(REQUIRE_SIGNATURE_ENV, "").strip()
    if not from_env:
        return None
    try:
        return read_public_key(from_env)
    except KineticError as exc:
        raise KineticError(f"${REQUIRE_SIGNATURE_ENV}: {exc.message}", exc.hint) from None


def _profile(file: KtcFile) -> Profile:
    try:
        return Profile.from_json(file.json(Kind.PROFILE))
    except ValueError as exc:
        raise KtcError(file.path, "profile", f"section profile is not a valid profile: {exc}",
                       "The file was written by a faulty tool; compile it again from the .gguf file.") from None


# -- stamps: "this file, unchanged since, was fully hashed" -----------------------------------------


def stamp_dir() -> Path:
    return cache_dir("ktc-verified")


def _stamp_path(file: KtcFile) -> Path:
    return stamp_dir() / (L.digest(os.fsencode(file.path.resolve())).hex()[:32] + ".json")


def _stamp(file: KtcFile) -> dict:
    return {"path": str(file.path.resolve()), **file_stamp(file.path), "manifest": file.manifest_digest.hex()}


def _stamp_matches(file: KtcFile) -> bool:
    try:
        return json.loads(_stamp_path(file).read_text()) == _stamp(file)
    except (OSError, ValueError):
        return False


def _write_stamp(file: KtcFile, stamp: dict) -> None:
    write_json(_stamp_path(file), stamp)


def load_if_ktc(path: str | os.PathLike, *, note: Callable[[str], None] = stderr_note,
                require_signer: bytes | None = None) -> LoadedKtc | None:
    """The loaded .ktc file at path, or None when path is not a .ktc file (a .gguf, say). With
    `require_signer`, only a .ktc file signed by that key loads; anything else is refused."""
    from kinetic.ktc.reader import is_ktc

    if is_ktc(path):
        return LoadedKtc(path, note=note, require_signer=require_signer)
    if require_signer is not None:
        raise SignatureRequiredError(f"{Path(path).name} is not a .ktc file, and only a .ktc file can carry the "
                                     f"signature by {require_signer.hex()} that is required",
                                     "Compile and sign it (`kinetic compile MODEL.gguf -o MODEL.ktc --sign-key "
                                     "KEY`), or ask its publisher for a signed .ktc file.")
    return None
