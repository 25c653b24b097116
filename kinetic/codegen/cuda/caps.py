"""What each NVIDIA architecture Kinetic compiles for offers, and the limits its kernels keep: data.

Owns: the table of architectures (the CUDA programming guide's "technical specifications per compute
capability": shared memory, registers, resident threads) and the per-kind budgets every kernel is
held to (registers per thread, no spills, static shared memory). Does not own: compiling
(nvrtc.py) or choosing launch shapes (the renderers choose; tests check them against this table).
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.codegen.cuda.kernel import Kernel
from kinetic.codegen.cuda.nvrtc import Resources


@dataclass(frozen=True)
class Arch:
    name: str  # NVRTC's --gpu-architecture, e.g. "sm_90"
    family: str
    shared_per_block: int  # bytes a block may use with the opt-in attribute
    shared_per_sm: int
    threads_per_sm: int  # resident threads
    registers_per_sm: int = 65536
    registers_per_thread: int = 255
    static_shared: int = 48 * 1024  # bytes of __shared__ a block may declare without the opt-in
    warp: int = 32
    dp4a: bool = True  # __dp4a exists from sm_61 on

    @property
    def compute_capability(self) -> tuple[int, int]:
        digits = self.name.removeprefix("sm_")
        return int(digits[:-1]), int(digits[-1])


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("sm_75", "Turing", 64 * 1024, 64 * 1024, 1024),
        Arch("sm_80", "Ampere (A100)", 163 * 1024, 164 * 1024, 2048),
        Arch("sm_86", "Ampere (RTX 30)", 99 * 1024, 100 * 1024, 1536),
        Arch("sm_89", "Ada", 99 * 1024, 100 * 1024, 1536),
        Arch("sm_90", "Hopper", 227 * 1024, 228 * 1024, 2048),
        Arch("sm_100", "Blackwell (B200)", 227 * 1024, 228 * 1024, 2048),
        Arch("sm_120", "Blackwell (RTX 50)", 99 * 1024, 100 * 1024, 1536),
    )
}


@dataclass(frozen=True)
class Budget:
    """What a kernel of one kind may use on every architecture (tests fail above it)."""

    registers: int  # per thread
    shared: int  # bytes of static shared memory


# Registers: 64 per thread keeps 32 warps resident per SM on every listed architecture (65536 / 64 /
# 32), which a bandwidth-bound GEMV needs to hide memory latency; every kind gets the same (measured
# today: at most 52, a GEMV on sm_75). The GEMM holds its tile's accumulators too (gemv.GEMM_ROWS is
# chosen to fit: at most 62, Q6_K on sm_75). No kind may spill or keep a stack frame.
BUDGETS: dict[str, Budget] = {
    "gemv": Budget(registers=64, shared=0),
    "gemm": Budget(registers=64, shared=0),
    "quantize": Budget(registers=64, shared=0),
    "norm": Budget(registers=64, shared=1024),
    "pointwise": Budget(registers=64, shared=96),  # a Q8_K quantizing launch: each warp's maximum
    "rope": Budget(registers=64, shared=0),
    "attention": Budget(registers=64, shared=1120),  # attention_rows: segment maxima (+ a Q8_K row's 96)
    "gather": Budget(registers=64, shared=0),
    # the MoE router (moe.py): one thread per row walks a few dozen values with the softmax's 16 expf
    # inlined; a launch has one warp per row, so registers bound nothing that matters (measured: at
    # most 89, sm_75)
    "router": Budget(registers=128, shared=0),
    # layer_norm (layer_norm.py): one warp per row whose reductions run on lane 0 in float64, 16 squares
    # held at once to keep _mm512_reduce_add_ps's order; a launch has one warp per row, so registers
    # bound nothing that matters (measured: 76 on sm_120)
    "layer_norm": Budget(registers=128, shared=1024),
}


def arch_for(major: int, minor: int) -> str | None:
    """The listed architecture whose cubin runs on a device of this compute capability, if any: the
    same major version, the highest minor not above the device's (cubins run on later minors of
    their major); None when only PTX fits."""
    same = [a for a in ARCHS.values() if a.compute_capability[0] == major and a.compute_capability[1] <= minor]
    return max(same, key=lambda a: a.compute_capability).name if same else None


def violations(kernel: Kernel, res: Resources, arch: Arch) -> list[str]:
    """What one compiled kernel breaks of its kind's budget and the architecture's limits (empty: none)."""
    budget, name = BUDGETS[kernel.kind], kernel.name
    out = []
    if res.registers > budget.registers:
        out.append(f"{name} on {arch.name}: {res.registers} registers, budget {budget.registers}")
    if res.spill_stores or res.spill_loads:
        out.append(f"{name} on {arch.name}: spills ({res.spill_stores} bytes stored, {res.spill_loads} loaded)")
    if res.stack:
        out.append(f"{name} on {arch.name}: {res.stack} bytes of stack frame (local memory)")
    if res.shared > min(budget.shared, arch.static_shared):
        out.append(f"{name} on {arch.name}: {res.shared} bytes of shared memory, budget {budget.shared}")
    if kernel.threads * res.registers > arch.registers_per_sm:
        out.append(f"{name} on {arch.name}: a block of {kernel.threads} threads does not fit one SM's registers")
    return out
