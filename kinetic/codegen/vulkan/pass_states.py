"""The recurrent states of a Vulkan pass: what the host writes for each row's starting state, and what
it reads back after the pass.

Owns: `PassStates` (per pass: each row's parent, u32 [T] (-1 for a row without a parent in the pass);
per state a `walk` buffer f32 [2T, rows*width] whose first T rows hold, for each parentless row, its
sequence's committed state (KVView.recurrent) and whose last T rows the kernels fill with the state
after each row (recurrent_scan.py); `read`: each state after the rows the runtime may keep,
rows.state_rows, every row when None, for PassResult.new_state) and `f32_values` (a small f32 weight's
buffer: the conv taps, A, D). Does not own the kernels that walk the rows (recurrent_scan.py), keeping
states between passes (kinetic/runtime/recurrent.py: keep(), snapshots and rollbacks rewrite them there)
or the other per-pass inputs (recorder.py).

Why the host writes and reads the states (a documented host step, as the CUDA runner's pass_states):
a sequence's committed state lives in the runtime (its RecurrentState), which the CPU step reads as
well; each pass writes the state of each row that starts from it into the mapped walk buffer (one
copy, no dispatch) and reads back only the states the runtime keeps (a committing pass: one per
sequence; a verify pass: every row, for keep(path)). A row with a parent in the pass reads its
parent's state on the device. The walk costs 2T x state size a pass and must fit one binding
(maxStorageBufferRange): a longer pass is a KineticError saying how many rows fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kinetic.errors import KineticError
from kinetic.ir.graph import Node
from kinetic.ir.rows import KVView, PassRows

if TYPE_CHECKING:
    from kinetic.codegen.vulkan.device import DeviceBuffer
    from kinetic.codegen.vulkan.model import VulkanModel

F32 = np.float32


class PassStates:
    """The walk buffers of one pass's recurrent states, made as the recorder meets each state."""

    def __init__(self, model: VulkanModel, rows: PassRows, kv: KVView):
        self.model, self.rows, self.kv = model, rows, kv
        self.n_rows = len(rows.tokens)
        self._parents: DeviceBuffer | None = None
        self._walks: dict[str, tuple[DeviceBuffer, tuple[int, int]]] = {}

    def parents(self) -> DeviceBuffer:
        """Each row's parent row in the pass, -1 (0xFFFFFFFF) for none; written once per pass."""
        if self._parents is None:
            parents = np.asarray(self.rows.parents, np.int32)
            if np.any(parents >= np.arange(len(parents))):
                raise ValueError("a pass lists each row after its parent")
            self._parents = self.model.buffer(("parents",), parents.nbytes)
            self._parents.write(parents.view(np.uint32))
        return self._parents

    def walk(self, state: Node) -> DeviceBuffer:
        """The walk buffer of a recurrent_state node, the committed state of each parentless row's
        sequence written into its row."""
        name, shape = state.attrs.name, (int(state.type.shape[0]), int(state.type.shape[1]))
        size = shape[0] * shape[1]
        nbytes = 2 * self.n_rows * size * 4
        limit = self.model.device.caps.max_storage_buffer_range
        if nbytes > limit:
            fit = limit // (2 * size * 4)
            raise KineticError(f"a pass of {self.n_rows} rows needs {nbytes} bytes of recurrent state "
                               f"{name!r} in one Vulkan binding (maxStorageBufferRange {limit})",
                               f"Use passes of at most {fit} rows (a smaller --batch / prompt chunk), or --device cpu.")
        buf = self.model.buffer(("walk", name), nbytes)
        roots = np.flatnonzero(np.asarray(self.rows.parents) < 0)
        for row in roots:
            committed = np.asarray(self.kv.recurrent(int(self.rows.seqs[row]), name), F32).reshape(-1)
            buf.write(committed, int(row) * size * 4)
        self._walks[name] = (buf, shape)
        return buf

    def read(self) -> dict[str, dict[int, np.ndarray]]:
        """Each state after the rows the runtime may keep: {name: {row: f32 [rows, width]}}."""
        state_rows = self.rows.state_rows
        kept = range(self.n_rows) if state_rows is None else [int(r) for r in state_rows]
        out: dict[str, dict[int, np.ndarray]] = {}
        for name, (buf, shape) in self._walks.items():
            size = shape[0] * shape[1]
            out[name] = {k: buf.read(F32, size, (self.n_rows + k) * size * 4).reshape(shape) for k in kept}
        return out


def f32_values(model: VulkanModel, param: Node) -> DeviceBuffer:
    """The buffer of a small f32 weight (the conv taps f32 [C, K], A and D f32 [n_head] or [n_head, 1]):
    a vector as uploaded, a matrix as its raw GGUF rows, which for F32 are its values in order."""
    name = param.attrs.tensor
    if name in model.weights:
        return model.weights[name]
    parts = model.parts[name]
    if len(parts) != 1:
        raise KineticError(f"the f32 weight {name} is split across Vulkan bindings", "Use --device cpu.")
    return parts[0][2]
