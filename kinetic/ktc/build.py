"""Making a .ktc file from a GGUF file and its optimized graph (what `kinetic compile -o` writes).

Owns: choosing the sections' contents: the GGUF split (gguf_sections.py), the graph in the IR's
text form, the default profile and the metadata record. The metadata holds no time stamp and no
host name, so the same model, build and key give the same bytes. Does not own lowering or the pass
pipeline (the caller runs them) or the byte layout (layout.py, writer.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.ir.graph import Graph
from kinetic.ir.orders import DEFAULT_NUMERICS
from kinetic.ktc import layout as L
from kinetic.ktc.gguf_sections import split_gguf
from kinetic.ktc.layout import Entry, Kind
from kinetic.ktc.profile import Profile, default_profile
from kinetic.ktc.writer import SectionData, write_ktc


def build_ktc(gguf: GGUFFile, graph: Graph, out: str | os.PathLike, *, device: str = "cpu",
              signing_key=None, profile: Profile | None = None, overwrite: bool = False,
              options: Options | None = None) -> list[Entry]:
    """Write `out` from an open GGUF file and the graph the pipeline made of it with the lowering
    `options` (None: the defaults, in the default numerics mode); an existing `out` is replaced only
    with overwrite. Returns the manifest entries."""
    from kinetic.ir.text import print_graph

    parts = split_gguf(gguf)
    profile = profile or default_profile(device)
    sections = [
        SectionData(Kind.WEIGHTS, parts.weights),
        SectionData(Kind.TOKENIZER, [parts.tokenizer]),
        SectionData(Kind.GRAPH, [print_graph(graph).encode("utf-8")]),
        SectionData(Kind.PROFILE, [_json(profile.to_json())]),
        SectionData(Kind.METADATA, [_json(metadata_record(gguf, profile, options))]),
    ]
    if parts.chat_template is not None:
        sections.append(SectionData(Kind.CHAT_TEMPLATE, [parts.chat_template.encode("utf-8")]))
    return write_ktc(Path(out), sections, signing_key, overwrite=overwrite)


def metadata_record(gguf: GGUFFile, profile: Profile, options: Options | None = None) -> dict:
    """Where the file came from: the source GGUF (name, size, BLAKE3) and the lowering options (their
    numerics mode made concrete: the one the graph's orders are in)."""
    options = options or Options()
    options = replace(options, numerics=options.numerics or DEFAULT_NUMERICS)
    name = gguf.metadata.get("general.name")
    source_hash = L.digest(np.memmap(gguf.path, dtype=np.uint8, mode="r")).hex()
    return {
        "name": name if isinstance(name, str) else None,
        "architecture": gguf.architecture,
        "source": {"file": gguf.path.name, "size": gguf.file_size, "blake3": source_hash},
        "lowering": asdict(options),
        "kinetic_version": profile.kinetic_version,
    }


def _json(value: dict) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
