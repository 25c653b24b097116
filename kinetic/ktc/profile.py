"""The profile section: which device class a .ktc file was prepared for and with which settings.

Owns: the device class of this machine (`cpu-x86_64-avx512vnni`, `cpu-x86_64-avx2`,
`cpu-x86_64-scalar`, `cpu-aarch64-scalar`), the Profile record and its JSON form, and the default
profile `kinetic compile` writes (`"tuned": false`). `kinetic compile --tune` writes a tuned one
(kinetic/ktc/tune.py): threads, `prompt_pass` (the prompt rows a CPU pass takes at most; absent in an
untuned profile: the engine's default) and the quantized matmul kernels (`matmul_tile`, and
`matmul_narrow`: the weight types whose prompt tiles stay off the wide paths;
kinetic/codegen/cpu/matmul_choice.py) measured best on this machine, `"tuned": true`, and the numbers
in `measured`; they change speed, never a bit. A profile read from a file is checked field by field:
types, and batch and prompt_pass from 1 to MAX_BATCH (4096), threads to MAX_THREADS (1024) and
matmul tile to MAX_TILE (1024), and `matmul_narrow` GGML type names, so no profile can size an
allocation or start threads by itself (the loader uses a tile only when it is one of
matmul_choice.TILES).
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, fields

from gguf import GGMLQuantizationType

from kinetic.limits import MAX_BATCH

MAX_THREADS = 1024  # a profile's thread count; at run time more than kinetic.limits allows falls back
MAX_TILE = 1024

# The CPU codegen's int8 dot variants (kinetic/codegen/cpu/target.py) by the name a class uses.
_VARIANT_CLASS = {"vnni": "avx512vnni", "avx2": "avx2", "generic": "scalar"}
_MACHINE = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
OPTIONAL = ("measured", "matmul_narrow", "prompt_pass")  # fields a profile may leave out (older files do)


def cpu_variant() -> str:
    from kinetic.codegen.cpu.target import host

    return host().best_variant()


def device_class(device: str = "cpu") -> str:
    """The class of machine that decides a profile: device, architecture, instruction set."""
    if device != "cpu":
        raise ValueError(f"no device class for {device!r}")
    machine = platform.machine().lower()
    return f"cpu-{_MACHINE.get(machine, machine)}-{_VARIANT_CLASS[cpu_variant()]}"


@dataclass(frozen=True)
class Profile:
    device: str  # "cpu"
    device_class: str  # device_class() of the machine it was made for
    kernel_variant: str  # the int8 dot variant: vnni, avx2 or generic
    threads: int | None  # CPU threads; None: every logical CPU of the machine that runs it
    batch: int  # prompt rows per forward pass
    matmul_tile: int  # output rows one matmul kernel call produces
    tuned: bool  # measured by a search (kinetic compile --tune), or the defaults
    kinetic_version: str
    pipeline_hash: str  # kinetic.passes.pipeline_hash() of the build that optimized the graph
    measured: dict | None = None  # a tuned profile's search: limit, CPUs, run sizes, medians (docs/FORMAT.md)
    matmul_narrow: tuple[str, ...] = ()  # weight types (GGML names) whose full tiles skip the wide paths
    prompt_pass: int | None = None  # prompt rows a CPU pass takes at most; None: Engine.default_prompt_pass

    def to_json(self) -> dict:
        data = asdict(self)
        if data["measured"] is None:  # an untuned profile's JSON stays as it was
            del data["measured"]
        if not self.matmul_narrow:
            del data["matmul_narrow"]
        else:
            data["matmul_narrow"] = list(self.matmul_narrow)
        if self.prompt_pass is None:  # older readers and files: the field is absent
            del data["prompt_pass"]
        return data

    def matmul_choice(self):
        """The CPU step's kernel choice this profile records (kinetic/codegen/cpu/matmul_choice.py)."""
        from kinetic.codegen.cpu.matmul_choice import MatmulChoice

        return MatmulChoice(tile=self.matmul_tile, narrow=frozenset(self.matmul_narrow))

    @classmethod
    def from_json(cls, data: dict) -> Profile:
        """Raises ValueError naming the first field that is missing or has the wrong type."""
        types = {"device": str, "device_class": str, "kernel_variant": str, "threads": (int, type(None)),
                 "batch": int, "matmul_tile": int, "tuned": bool, "kinetic_version": str, "pipeline_hash": str,
                 "measured": (dict, type(None)), "matmul_narrow": list, "prompt_pass": int}
        values = {}
        for f in fields(cls):
            if f.name in OPTIONAL and f.name not in data:  # optional: defaults leave them out
                continue
            if f.name not in data:
                raise ValueError(f"it has no {f.name!r}")
            value = data[f.name]
            allowed = types[f.name] if isinstance(types[f.name], tuple) else (types[f.name],)
            if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
                raise ValueError(f"its {f.name!r} is {value!r}")
            values[f.name] = value
        for name, high in (("batch", MAX_BATCH), ("matmul_tile", MAX_TILE), ("threads", MAX_THREADS),
                           ("prompt_pass", MAX_BATCH)):
            value = values.get(name)
            if value is not None and not 1 <= value <= high:
                raise ValueError(f"its {name!r} is {value}, outside 1..{high}")
        if "matmul_narrow" in values:
            names = values["matmul_narrow"]
            if not all(isinstance(n, str) and n in GGMLQuantizationType.__members__ for n in names):
                raise ValueError(f"its 'matmul_narrow' is {names!r}, not a list of GGML type names")
            values["matmul_narrow"] = tuple(names)
        return cls(**values)


def default_profile(device: str = "cpu") -> Profile:
    """The CPU device's own defaults on this machine, recorded."""
    from kinetic import __version__
    from kinetic.codegen.cpu.matmul import DEFAULT_TILE
    from kinetic.passes import pipeline_hash
    from kinetic.runtime.engine import DEFAULT_BATCH

    return Profile(device=device, device_class=device_class(device), kernel_variant=cpu_variant(), threads=None,
                   batch=DEFAULT_BATCH, matmul_tile=DEFAULT_TILE, tuned=False, kinetic_version=__version__,
                   pipeline_hash=pipeline_hash())
