"""Named groups of raw ncu metrics: the units the profiling tree collects.

A section (``--section SpeedOfLight``) brings every metric its file lists and ncu
schedules replay passes for all of them; the classification needs a few. A group
names the metrics one question needs (is memory or compute busy? are global
accesses coalesced? which pipe is saturated?), so a tree leaf can ask for exactly
those with ``--metrics``. Launch statistics, occupancy limits and theoretical
occupancy are in every report whatever is asked (no replay pass).

Groups whose name ends in ``_sass`` are instruction-level metrics: ncu patches the
kernel's SASS to count them (the SourceCounters machinery), which costs more than
hardware counters. Every name here appears in a ``--set full`` report too, so a
full profile can be cut down to what a group collects (tree refinement does).

Pure data.
"""

from __future__ import annotations

from kernel_lsp.core import profile as P

GROUPS: dict[str, tuple[str, ...]] = {
    "throughput": (P.M_DURATION_NS, P.M_MEMORY_PCT, P.M_SM_PCT, P.M_ACHIEVED_OCC),
    "memory_units": (P.M_DRAM_PCT, P.M_L1_PCT, P.M_L2_PCT, P.M_L1_HIT, P.M_L2_HIT),
    "coalescing": (P.M_SECTORS_LD, P.M_REQUESTS_LD, P.M_SECTORS_ST, P.M_REQUESTS_ST),
    "coalescing_sass": (P.M_GLOBAL_SECTORS_THEORETICAL, P.M_GLOBAL_SECTORS_IDEAL),
    "bank_conflicts": (
        P.M_BANK_CONFLICTS_LD,
        P.M_BANK_CONFLICTS_ST,
        P.M_SHARED_REQ_LD,
        P.M_SHARED_REQ_ST,
    ),
    "shared_sass": (P.M_SHARED_WAVEFRONTS, P.M_SHARED_WAVEFRONTS_IDEAL),
    "pipes": (
        P.M_FMA_PIPE_PCT,
        "sm__inst_executed_pipe_fp64.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
        P.M_TENSOR_PIPE_PCT,
        "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
        P.M_IPC,
    ),
    "stalls": tuple(P.stall_metric(r) for r in P.STALL_REASONS),
    "divergence": (P.M_BRANCH_UNIFORM_PCT, P.M_DIVERGENT_TARGETS),
}
