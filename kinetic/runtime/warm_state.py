"""Warm Start's prefix states and the facts that name them: `State` (a token prefix's KV cache rows,
every layer, with their positions, and a recurrent model's snapshot), its copy out of a cache and its
arrays as the disk tier stores them; `model_key` (everything that changes a state's rows);
`grid_floor` and `common_prefix`.

Does not own: keeping, finding or restoring states (warm.py's WarmStore), costs (warm_costs.py),
files (warm_disk.py). kinetic/runtime/warm.py re-exports every name here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import blake3
import numpy as np

if TYPE_CHECKING:
    from kinetic.ir.graph import Graph
    from kinetic.runtime.kv_cache import KVCache


def grid_floor(n: int, batch: int) -> int:
    """The last grid point at or before n (chunks end at multiples of batch from position 0)."""
    return n // batch * batch


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two i32 arrays share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def model_key(*, model_file: Path, graph: Graph, device: str, batch: int) -> str:
    """Everything that changes a state's rows: the model file's BLAKE3, the compiled graph (its text
    holds rope overrides, the cache type and each reduction's order), the pass pipeline's hash, the
    device and its class (the CPU's kernel variant), the build (kernel generators and their compilers)
    and the batch (the grid)."""
    from kinetic.ir.text import print_graph
    from kinetic.passes.pipeline import pipeline_hash
    from kinetic.receipts.hashing import build_hash, file_blake3
    from kinetic.receipts.receipt import device_class_of

    try:
        device_class = device_class_of(device)
    except ValueError:  # a GPU: its runner's name decides (kernels are generated per device)
        device_class = device
    facts = [file_blake3(model_file), hashlib.sha256(print_graph(graph).encode()).hexdigest(), pipeline_hash(),
             device, device_class, build_hash(), str(batch)]
    return blake3.blake3("\n".join(facts).encode()).hexdigest()


@dataclass
class State:
    """KV cache rows [0, n) of the token prefix `tokens` (i32 [n]): per layer keys and values
    [n, width] in the cache dtype, and each row's position. A model with recurrent layers adds
    `recurrent`, each state f32 [rows, width] after exactly the n tokens (a snapshot,
    kinetic/runtime/snapshots.py): such a state is restored only whole, at n."""

    tokens: np.ndarray
    positions: np.ndarray
    k: dict[int, np.ndarray]
    v: dict[int, np.ndarray]
    recurrent: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return self.kv_bytes + sum(a.nbytes for a in self.recurrent.values())

    @property
    def kv_bytes(self) -> int:
        return sum(a.nbytes for a in self.k.values()) + sum(a.nbytes for a in self.v.values())

    def bytes_per_row(self) -> int:
        return self.kv_bytes // max(len(self.tokens), 1)

    def restore_bytes(self, held: int, n: int) -> int:
        """Bytes a restore to n copies onto a sequence holding `held` of its rows."""
        return (n - held) * self.bytes_per_row() + sum(a.nbytes for a in self.recurrent.values())

    @staticmethod
    def copied(cache: KVCache, tokens: np.ndarray, recurrent: dict[str, np.ndarray] | None = None) -> State:
        n = len(tokens)
        return State(tokens.copy(), cache.positions[:n].copy(), {layer: k[:n].copy() for layer, k in cache.k.items()},
                     {layer: v[:n].copy() for layer, v in cache.v.items()},
                     {name: s.copy() for name, s in (recurrent or {}).items()})

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"tokens": self.tokens, "positions": self.positions}
        out.update({f"k{layer}": k for layer, k in self.k.items()})
        out.update({f"v{layer}": v for layer, v in self.v.items()})
        out.update({f"r:{name}": s for name, s in self.recurrent.items()})
        return out

    @staticmethod
    def from_arrays(arrays: dict[str, np.ndarray], widths: dict[int, int], dtype,
                    shapes: dict[str, tuple[int, int]]) -> State | None:
        """The state a disk entry holds, or None when its arrays do not fit this engine's cache and
        recurrent states (`shapes`: name -> (rows, width))."""
        tokens, positions = arrays.get("tokens"), arrays.get("positions")
        if tokens is None or positions is None or tokens.ndim != 1 or positions.shape != tokens.shape:
            return None
        n, k, v, recurrent = len(tokens), {}, {}, {}
        expected = [(f"{name}{layer}", (n, width), np.dtype(dtype), into, layer)
                    for layer, width in widths.items() for name, into in (("k", k), ("v", v))]
        expected += [(f"r:{name}", tuple(shape), np.dtype(np.float32), recurrent, name)
                     for name, shape in shapes.items()]
        for key, shape, kind, into, slot in expected:
            a = arrays.get(key)
            if a is None or a.shape != shape or a.dtype != kind:
                return None
            into[slot] = a
        if len(arrays) != 2 + len(expected):
            return None
        return State(tokens.astype(np.int32), positions.astype(np.int32), k, v, recurrent)
