"""What a command buffer is made of: kernels, buffers, dispatches, and where barriers go between them.

Owns: `Kernel` (a compute shader with its bindings' access, workgroup size and push constants),
`DeviceBuffer` (a mapped storage buffer), `Dispatch` (a kernel on buffers over a grid) and
`barrier_points`, the rule VulkanDevice.run records barriers by (the pass recorder plans buffers by
it too). Does not own creating any of them on a device (device.py) or rendering kernels.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Kernel:
    """A compute shader and what running it needs: binding i is a storage buffer, read-only when
    readonly[i]; push constants of push_size bytes; full_subgroups asks the pipeline for full
    subgroups (a kernel whose reduction maps lanes to work needs them)."""

    name: str
    spirv: bytes
    readonly: tuple[bool, ...]
    local_size: tuple[int, int, int]
    push_size: int = 0
    full_subgroups: bool = False

    @property
    def key(self) -> str:
        return hashlib.sha256(self.spirv).hexdigest()[:16]


@dataclass
class DeviceBuffer:
    handle: object
    memory: object
    size: int
    mapping: object  # cffi buffer over the mapped memory

    def write(self, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        self.mapping[offset : offset + data.size] = data.tobytes()

    def read(self, dtype, count: int | None = None, offset: int = 0) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = (self.size - offset) // dtype.itemsize if count is None else count
        return np.frombuffer(self.mapping, dtype, count, offset).copy()


@dataclass
class Dispatch:
    kernel: Kernel
    buffers: Sequence[DeviceBuffer]
    groups: tuple[int, int, int]
    push: bytes = b""


def barrier_points(dispatches: Sequence[Dispatch]) -> list[bool]:
    """Where `VulkanDevice.run` puts a compute-to-compute barrier: before each dispatch that reads or
    writes a buffer written since the last barrier, or writes one read since (a buffer is known by
    its identity, so stand-ins for buffers not yet chosen work too)."""
    points, written, read = [], set(), set()
    for d in dispatches:
        mine_r = {id(b) for b in d.buffers}
        mine_w = {id(b) for b, ro in zip(d.buffers, d.kernel.readonly, strict=True) if not ro}
        barrier = bool(mine_r & written or mine_w & read)
        if barrier:
            written, read = set(), set()
        written |= mine_w
        read |= mine_r
        points.append(barrier)
    return points
