"""Theoretical occupancy against values worked out by hand with NVIDIA's calculator rules.

Each case lists the per-limit block counts so a wrong rule shows which limit broke.
Register rule: regs/warp = ceil(regs*32/256)*256; warps by registers =
floor(16384 / regs_per_warp) * 4 sub-partitions.
"""

from __future__ import annotations

import pytest

from kernel_lsp.core.occupancy import ARCH_LIMITS, compute_capability, theoretical_occupancy

CASES = [
    # arch, threads, regs, smem -> blocks, warps, pct, limiter
    ("sm_90", 256, 32, 0, 8, 64, 100.0, "threads"),
    ("sm_90", 256, 128, 0, 2, 16, 25.0, "registers"),  # 4096 regs/warp -> 4 warps per sub-partition
    ("sm_90", 256, 40, 0, 6, 48, 75.0, "registers"),  # 1280 regs/warp -> 12 per sub-partition -> 48 warps
    ("sm_90", 256, 255, 0, 1, 8, 12.5, "registers"),  # 8192 regs/warp -> 2 per sub-partition
    ("sm_90", 32, 16, 0, 32, 32, 50.0, "blocks_per_sm"),
    ("sm_90", 1024, 64, 0, 1, 32, 50.0, "registers"),  # 64 Ki regs hold 32 warps of 64 regs
    ("sm_90", 128, 32, 100 * 1024, 2, 8, 12.5, "shared_memory"),  # (100 KiB + 1 KiB) -> 228/101 = 2
    ("sm_80", 128, 32, 48 * 1024, 3, 12, 18.75, "shared_memory"),  # 164 KiB / 49 KiB = 3
    ("sm_86", 256, 32, 0, 6, 48, 100.0, "threads"),  # 1536 threads per SM
    ("sm_89", 64, 32, 0, 24, 48, 100.0, "threads"),  # 24 blocks x 2 warps = the 48-warp limit
    ("sm_86", 64, 32, 0, 16, 32, 32 / 48 * 100, "blocks_per_sm"),
    ("sm_75", 1024, 32, 0, 1, 32, 100.0, "threads"),
    ("sm_70", 256, 64, 0, 4, 32, 50.0, "registers"),
    ("sm_70", 96, 64, 0, 10, 30, 30 / 64 * 100, "registers"),  # 32 warps / 3 per block
    ("sm_90", 256, None, 0, 8, 64, 100.0, "threads"),  # unknown registers are not a limit
]


@pytest.mark.parametrize(("arch", "threads", "regs", "smem", "blocks", "warps", "pct", "limiter"), CASES)
def test_calculator_values(arch: str, threads: int, regs: int | None, smem: int, blocks: int, warps: int, pct: float, limiter: str) -> None:
    occ = theoretical_occupancy(arch, threads, regs, smem)
    assert occ is not None
    assert (occ.active_blocks_per_sm, occ.active_warps_per_sm, occ.limiter) == (blocks, warps, limiter)
    assert occ.occupancy_pct == pytest.approx(pct)


def test_per_limit_counts_and_reserve() -> None:
    occ = theoretical_occupancy("sm_90", 256, 64, 4000)
    assert occ is not None
    # 4000 + 1024 reserved -> 5120 after rounding to 128 bytes; 233472 / 5120 = 45
    assert occ.allocated_shared_bytes_per_block == 5120
    assert occ.blocks_limit_shared_memory == 45
    assert (occ.blocks_limit_threads, occ.blocks_limit_blocks_per_sm, occ.blocks_limit_registers) == (8, 32, 4)
    # Volta has no reserve and a 256-byte unit.
    volta = theoretical_occupancy("sm_70", 256, 64, 4000)
    assert volta is not None and volta.allocated_shared_bytes_per_block == 4096


@pytest.mark.parametrize(
    ("threads", "regs", "smem", "limiter"),
    [
        (2048, 32, 0, "threads"),
        (0, 32, 0, "threads"),
        (1024, 128, 0, "registers"),  # 128 Ki registers per block: launch fails
        (256, 256, 0, "registers"),
        (128, 32, 228 * 1024, "shared_memory"),
    ],
)
def test_unlaunchable_configurations(threads: int, regs: int, smem: int, limiter: str) -> None:
    occ = theoretical_occupancy("sm_90", threads, regs, smem)
    assert occ is not None
    assert occ.active_blocks_per_sm == 0 and occ.occupancy_pct == 0.0
    assert occ.limiter == limiter


@pytest.mark.parametrize(
    ("arch", "cc"),
    [("sm_90", "9.0"), ("sm_90a", "9.0"), ("compute_86", "8.6"), ("75", "7.5"), ("8.9", "8.9"), ("sm_100", "10.0"), ("sm_120f", "12.0"), ("banana", None), ("9", None)],
)
def test_arch_names(arch: str, cc: str | None) -> None:
    assert compute_capability(arch) == cc


def test_unknown_arch_is_none() -> None:
    assert theoretical_occupancy("sm_35", 256, 32, 0) is None


def test_table_covers_required_architectures() -> None:
    assert {"7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0"} <= set(ARCH_LIMITS)
