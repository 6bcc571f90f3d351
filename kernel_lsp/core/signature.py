"""The numeric performance signature shared by profiling, the knowledge base and the optimizer.

A signature is a ``dict[str, float]`` whose keys are the names below; any key may
be missing (unknown). Percentages are 0–100. The profiler fills it from ncu
metrics (``KernelProfile.signature()``); the knowledge base matches states on it.
"""

from __future__ import annotations

from typing import Final

#: key -> what it measures (and the ncu metric it usually comes from).
SIGNATURE_KEYS: Final[dict[str, str]] = {
    "dram_throughput_pct": "DRAM throughput, % of peak (dram__throughput.avg.pct_of_peak_sustained_elapsed)",
    "memory_throughput_pct": "Max of L1/L2/DRAM throughput, % of peak (gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed)",
    "sm_throughput_pct": "SM (compute) throughput, % of peak (sm__throughput.avg.pct_of_peak_sustained_elapsed)",
    "achieved_occupancy_pct": "Achieved occupancy, % of the SM's warp slots (sm__warps_active.avg.pct_of_peak_sustained_active)",
    "theoretical_occupancy_pct": "Theoretical occupancy, % (sm__maximum_warps_per_active_cycle_pct)",
    "l1_hit_rate_pct": "L1/TEX hit rate, % (l1tex__t_sector_hit_rate.pct)",
    "l2_hit_rate_pct": "L2 hit rate, % (lts__t_sector_hit_rate.pct)",
    "global_sectors_per_request": "Global load sectors per request (ideal 4 for 4-byte coalesced loads)",
    "excessive_sectors_pct": "Share of global sectors that were excessive (uncoalesced), %",
    "shared_bank_conflicts_per_request": "Shared-memory bank conflicts per shared request",
    "branch_divergence_pct": "Divergent branches, % of branches",
    "registers_per_thread": "Registers per thread (launch__registers_per_thread)",
    "shared_bytes_per_block": "Static + dynamic shared memory per block, bytes",
    "waves_per_sm": "Waves per SM (launch__waves_per_multiprocessor)",
    "grid_blocks": "Blocks in the grid",
    "block_threads": "Threads per block",
    "duration_us": "Kernel duration, microseconds (gpu__time_duration.sum)",
    "ipc": "Executed instructions per cycle per SM (sm__inst_executed.avg.per_cycle_active)",
    "fp32_pipe_pct": "FMA pipe utilisation, % of peak",
    "tensor_pipe_pct": "Tensor pipe utilisation, % of peak",
    "stall_long_scoreboard_pct": "Warp stall share: waiting on L1TEX (global/local) data, %",
    "stall_short_scoreboard_pct": "Warp stall share: waiting on MIO (shared memory, special math), %",
    "stall_barrier_pct": "Warp stall share: waiting at a barrier, %",
    "stall_mio_throttle_pct": "Warp stall share: MIO queue full, %",
    "stall_lg_throttle_pct": "Warp stall share: local/global queue full, %",
    "stall_math_pipe_throttle_pct": "Warp stall share: math pipe busy, %",
    "stall_wait_pct": "Warp stall share: fixed-latency dependency, %",
    "stall_not_selected_pct": "Warp stall share: eligible but not selected, %",
    "stall_membar_pct": "Warp stall share: memory barrier, %",
    "stall_branch_resolving_pct": "Warp stall share: branch resolving, %",
}
