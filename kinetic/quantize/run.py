"""Quantizing one GGUF file into another: read, plan, encode, write whole or not at all.

Owns: `plan` (the input read and checked, each tensor's new type, the output's metadata) and
`quantize_file` (the tensors encoded in chunks of rows on a thread pool, numpy releasing the GIL,
written in order into a temporary file that replaces OUT only when complete: kinetic/outputs.py).
A tensor whose type does not change is copied as it is, as llama-quantize copies it.

Does not own the per-tensor choices (mixtures.py), the encoders (encoders.py) or the layout
(gguf_out.py); the command line is kinetic/cli/quantize_cmd.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import GGUFFile, TensorInfo
from kinetic.outputs import atomic_output, check_output
from kinetic.quantize import gguf_out, mixtures
from kinetic.quantize.encoders import ENCODERS, READABLE, to_float

CHUNK_VALUES = 1 << 18  # values per task: numpy calls stay worth their overhead, arrays stay in cache


@dataclass(frozen=True)
class Job:
    """One output tensor: where its data comes from (the input's tensor) and what it becomes."""

    source: TensorInfo
    slot: gguf_out.TensorSlot

    @property
    def copied(self) -> bool:
        return self.source.type == self.slot.type


@dataclass(frozen=True)
class Plan:
    target: mixtures.Target
    source: GGUFFile
    metadata: bytes
    jobs: list[Job]

    @property
    def size(self) -> int:
        last = self.jobs[-1].slot if self.jobs else None
        return len(self.metadata) + (gguf_out.pad(last.offset + last.nbytes) if last else 0)


def input_labels(src) -> dict:
    """What check_output is told about the input (it is never written over)."""
    return {"the input model": src}


def _int_key(gguf: GGUFFile, key: str, default: int | None = None) -> int | None:
    value = gguf.metadata.get(key, default)
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else default


def model_facts(gguf: GGUFFile) -> mixtures.ModelFacts:
    arch = gguf.architecture
    n_layer = _int_key(gguf, f"{arch}.block_count", 0)
    n_expert = _int_key(gguf, f"{arch}.expert_count", 0)
    n_head, n_head_kv = (_int_key(gguf, f"{arch}.attention.{k}") for k in ("head_count", "head_count_kv"))
    return mixtures.ModelFacts(arch=arch, n_layer=n_layer, n_expert=n_expert,
                               is_70b=mixtures.is_70b(arch, n_layer, n_head, n_head_kv, n_expert))


def plan(path: str | os.PathLike, target_name: str) -> Plan:
    """What quantizing `path` to `target_name` writes, checked before anything is written. The
    input is read by kinetic's GGUF reader, which refuses a damaged or foreign file with the reason."""
    target = target_of(target_name)
    gguf = GGUFFile(path)
    if gguf.alignment != gguf_out.ALIGNMENT:
        raise KineticError(f"{path} is aligned to {gguf.alignment} bytes; llama-quantize writes 32-byte "
                           "alignment only", "Quantize a file with the default alignment.")
    tensors = [(t.name, gguf_out.ggml_dims(t.ne), t.type) for t in gguf.tensors.values()]
    slots, olds = output_tensors(tensors, target, model_facts(gguf))
    for slot, old in zip(slots, olds, strict=True):
        if old != slot.type and old not in READABLE:
            raise KineticError(f"{path}: tensor {slot.name} is {old.name}; kinetic quantize reads F32, F16, BF16 and "
                               "Q8_0 weights only", "Quantize from the model's F16/BF16/F32 (or Q8_0) file.")
    with open(path, "rb") as f:
        head = np.frombuffer(f.read(gguf.data_offset), np.uint8)  # the input's metadata
    metadata = gguf_out.metadata_bytes(gguf_out.copied_kv_bytes(head), target.file_type, slots)
    return Plan(target, gguf, metadata, [Job(gguf.tensors[slot.name], slot) for slot in slots])


def output_tensors(tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType]], target: mixtures.Target,
                   model: mixtures.ModelFacts) -> tuple[list[gguf_out.TensorSlot], list[GGMLQuantizationType]]:
    """The output's tensors (name, dims, type, offset) in llama-quantize's order, from the input's
    (name, dims, type) in any order, and each one's input type."""
    by_name = {name: (dims, qtype) for name, dims, qtype in tensors}
    ordered = [(name, *by_name[name]) for name in mixtures.write_order(list(by_name))]
    types = mixtures.choose_types(ordered, target, model)
    slots = gguf_out.layout([(name, dims, new) for (name, dims, _), new in zip(ordered, types, strict=True)])
    return slots, [old for _, _, old in ordered]


def target_of(name: str) -> mixtures.Target:
    target = mixtures.TARGETS.get(name.upper())
    if target is None:
        raise KineticError(f"unknown quantization type {name!r}",
                           "Choose one of: " + ", ".join(mixtures.TARGETS) + ".")
    return target


def encode_tensor(the_plan: Plan, job: Job, pool: ThreadPoolExecutor | None) -> Iterator[bytes | np.ndarray]:
    """The output bytes of one tensor, chunk by chunk in row order (a copied tensor as the mapped
    input's bytes, never loaded whole)."""
    raw = the_plan.source.raw(job.source.name)  # uint8, mapped
    if job.copied:
        yield raw
        return
    ncols = job.slot.dims[0]
    rows = raw.reshape(-1, raw.size // (job.source.n_elements // ncols))  # uint8 [rows, row_bytes]
    step = max(1, CHUNK_VALUES // ncols)
    encode = ENCODERS[job.slot.type]

    def chunk(start: int) -> bytes:
        return encode(to_float(rows[start:start + step], job.source.type, ncols)).tobytes()

    starts = range(0, rows.shape[0], step)
    yield from (pool.map(chunk, starts) if pool else map(chunk, starts))


def quantize_file(src: str | os.PathLike, dst: str | os.PathLike, target_name: str, *, threads: int | None = None,
                  force: bool = False, progress: Callable[[int], None] | None = None,
                  prepared: Plan | None = None) -> Plan:
    """Write `dst`: `src` quantized to `target_name` (by `prepared`, plan(src, target_name) made
    earlier, when given). progress(n) is told each tensor's value count once it is written."""
    out_path = check_output(dst, inputs=input_labels(src), force=force)
    the_plan = prepared or plan(src, target_name)
    workers = threads or os.cpu_count() or 1
    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        with atomic_output(out_path, force=force, size=the_plan.size) as out:
            out.write(the_plan.metadata)
            for job in the_plan.jobs:
                _write_tensor(out, the_plan, job, pool)
                if progress:
                    progress(job.source.n_elements)
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)  # after Ctrl+C, chunks not started are dropped
    return the_plan


def _write_tensor(out, the_plan: Plan, job: Job, pool: ThreadPoolExecutor | None) -> None:
    written = 0
    for data in encode_tensor(the_plan, job, pool):
        out.write(data)
        written += len(data)
    if written != job.slot.nbytes:
        raise KineticError(f"internal error: {job.slot.name} came out as {written} bytes, not {job.slot.nbytes}; "
                           "nothing was written")
    out.write(bytes(gguf_out.pad(written) - written))
