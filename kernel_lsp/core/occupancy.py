"""Theoretical occupancy per compute capability, as NVIDIA's occupancy calculator computes it.

Limits come from the CUDA C++ Programming Guide, "Technical Specifications per
Compute Capability", and the allocation rules of ``cuda_occupancy.h`` (the
header behind ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``):

* registers are allocated per warp in units of 256 registers
  (``ceil(regs_per_thread * 32 / 256) * 256``), and each of the SM's 4
  sub-partitions holds a quarter of the register file: warps that fit per SM =
  ``floor((regs_per_sm / 4) / regs_per_warp) * 4``;
* shared memory per block is ``static + dynamic + reserved`` (1 KiB reserved
  per block from compute capability 8.0 on, used by the runtime) rounded up to
  the allocation granularity; the driver picks the largest carveout, so the
  per-SM budget is the architecture's maximum shared memory per SM;
* a block whose shared memory exceeds the per-block maximum (opt-in) or whose
  registers exceed 64 Ki per block cannot launch: 0 active blocks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ArchLimits:
    compute_capability: str
    """``"9.0"``-style."""
    max_threads_per_sm: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int
    max_registers_per_block: int
    max_registers_per_thread: int
    register_allocation_unit: int
    """Registers are given to a warp in multiples of this many (256)."""
    sub_partitions_per_sm: int
    shared_bytes_per_sm: int
    """Largest shared-memory carveout per SM, bytes."""
    max_shared_bytes_per_block: int
    """Largest shared memory one block may use (with the opt-in attribute), bytes."""
    shared_allocation_unit_bytes: int
    reserved_shared_bytes_per_block: int
    """Shared memory the runtime reserves per block (1 KiB on >= 8.0), bytes."""
    max_threads_per_block: int = 1024
    warp_size: int = 32


def _limits(
    cc: str, threads: int, blocks: int, smem_sm_kib: int, smem_block_kib: int, granularity: int, reserved: int
) -> ArchLimits:
    return ArchLimits(
        compute_capability=cc,
        max_threads_per_sm=threads,
        max_warps_per_sm=threads // 32,
        max_blocks_per_sm=blocks,
        registers_per_sm=65536,
        max_registers_per_block=65536,
        max_registers_per_thread=255,
        register_allocation_unit=256,
        sub_partitions_per_sm=4,
        shared_bytes_per_sm=smem_sm_kib * 1024,
        max_shared_bytes_per_block=smem_block_kib * 1024,
        shared_allocation_unit_bytes=granularity,
        reserved_shared_bytes_per_block=reserved,
    )


#: Per compute capability (Programming Guide, tables 21/22 of CUDA 12.x/13.0).
ARCH_LIMITS: dict[str, ArchLimits] = {
    limits.compute_capability: limits
    for limits in (
        _limits("7.0", 2048, 32, 96, 96, 256, 0),  # V100
        _limits("7.2", 2048, 32, 96, 96, 256, 0),  # Xavier
        _limits("7.5", 1024, 16, 64, 64, 256, 0),  # Turing
        _limits("8.0", 2048, 32, 164, 163, 128, 1024),  # A100
        _limits("8.6", 1536, 16, 100, 99, 128, 1024),  # GA10x
        _limits("8.7", 1536, 16, 164, 163, 128, 1024),  # Orin
        _limits("8.9", 1536, 24, 100, 99, 128, 1024),  # Ada
        _limits("9.0", 2048, 32, 228, 227, 128, 1024),  # H100/H200
        _limits("10.0", 2048, 32, 228, 227, 128, 1024),  # B200
        _limits("12.0", 1536, 32, 128, 99, 128, 1024),  # RTX 50
    )
}

_ARCH = re.compile(r"^(?:sm_|compute_|sm|cc)?(\d+)(?:\.(\d+))?[af]?$")
LIMITERS = ("threads", "blocks_per_sm", "registers", "shared_memory")
"""Possible limiters; on a tie the first in this order is reported (at 100% the warps are the limit)."""


def compute_capability(arch: str) -> str | None:
    """``"sm_90"``, ``"sm_90a"``, ``"compute_86"``, ``"90"``, ``"9.0"`` -> ``"9.0"``; None when unrecognised."""
    m = _ARCH.match(arch.strip().lower())
    if m is None:
        return None
    major, minor = m.group(1), m.group(2)
    if minor is None:
        if len(major) < 2:
            return None
        major, minor = major[:-1], major[-1]
    return f"{int(major)}.{int(minor)}"


def arch_limits(arch: str) -> ArchLimits | None:
    cc = compute_capability(arch)
    return ARCH_LIMITS.get(cc) if cc is not None else None


@dataclass(frozen=True)
class Occupancy:
    arch: str
    """Compute capability, ``"9.0"``-style."""
    threads_per_block: int
    registers_per_thread: int | None
    shared_bytes_per_block: int
    """Static + dynamic shared memory the kernel asks for, bytes."""
    allocated_shared_bytes_per_block: int
    """After the per-block reserve and rounding to the allocation unit, bytes."""
    warps_per_block: int
    active_blocks_per_sm: int
    active_warps_per_sm: int
    max_warps_per_sm: int
    occupancy_pct: float
    """Active warps / maximum warps per SM, 0-100."""
    limiter: str
    """One of :data:`LIMITERS`."""
    blocks_limit_threads: int
    """Blocks per SM allowed by the warp (thread) slots."""
    blocks_limit_blocks_per_sm: int
    blocks_limit_registers: int | None
    """None when the register count is unknown (then registers are not considered)."""
    blocks_limit_shared_memory: int


def theoretical_occupancy(
    arch: str, threads_per_block: int, registers_per_thread: int | None, shared_bytes_per_block: int
) -> Occupancy | None:
    """Theoretical occupancy of one kernel launch configuration; None for an unknown ``arch``.

    A configuration that cannot launch (more than 1024 threads, more registers
    or shared memory than one block may have) gives 0 active blocks with the
    offending resource as limiter.
    """
    limits = arch_limits(arch)
    if limits is None:
        return None
    shared = max(0, shared_bytes_per_block)
    allocated_shared = _round_up(shared + limits.reserved_shared_bytes_per_block, limits.shared_allocation_unit_bytes)
    warps_per_block = max(1, math.ceil(threads_per_block / limits.warp_size))

    by_threads = limits.max_warps_per_sm // warps_per_block
    if not 0 < threads_per_block <= limits.max_threads_per_block:
        by_threads = 0
    by_blocks = limits.max_blocks_per_sm
    by_registers = None if registers_per_thread is None else _blocks_by_registers(limits, registers_per_thread, warps_per_block)
    if shared > limits.max_shared_bytes_per_block:
        by_shared = 0
    else:
        by_shared = limits.shared_bytes_per_sm // allocated_shared if allocated_shared else limits.max_blocks_per_sm

    candidates = {"threads": by_threads, "blocks_per_sm": by_blocks, "registers": by_registers, "shared_memory": by_shared}
    active_blocks = min(v for v in candidates.values() if v is not None)
    limiter = next(name for name in LIMITERS if candidates[name] == active_blocks)
    active_warps = active_blocks * warps_per_block
    return Occupancy(
        arch=limits.compute_capability,
        threads_per_block=threads_per_block,
        registers_per_thread=registers_per_thread,
        shared_bytes_per_block=shared,
        allocated_shared_bytes_per_block=allocated_shared,
        warps_per_block=warps_per_block,
        active_blocks_per_sm=active_blocks,
        active_warps_per_sm=active_warps,
        max_warps_per_sm=limits.max_warps_per_sm,
        occupancy_pct=100.0 * active_warps / limits.max_warps_per_sm,
        limiter=limiter,
        blocks_limit_threads=by_threads,
        blocks_limit_blocks_per_sm=by_blocks,
        blocks_limit_registers=by_registers,
        blocks_limit_shared_memory=by_shared,
    )


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _blocks_by_registers(limits: ArchLimits, registers_per_thread: int, warps_per_block: int) -> int:
    if registers_per_thread > limits.max_registers_per_thread:
        return 0
    # ptxas never reports 0 registers for a real kernel, but an empty kernel may: it still needs a slot.
    regs_per_warp = _round_up(max(1, registers_per_thread) * limits.warp_size, limits.register_allocation_unit)
    if regs_per_warp * warps_per_block > limits.max_registers_per_block:
        return 0
    per_sub_partition = (limits.registers_per_sm // limits.sub_partitions_per_sm) // regs_per_warp
    return (per_sub_partition * limits.sub_partitions_per_sm) // warps_per_block
