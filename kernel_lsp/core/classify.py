"""Bottleneck classification of a kernel profile, with the evidence that decided it.

The coarse class follows Nsight Compute's own speed-of-light reading: a kernel
whose memory or compute throughput reaches 60 % of peak is bound by the larger
of the two; below that it is waiting, either because too few warps fit on an SM
(occupancy-limited) or because the warps it has are stalled (latency-bound).
The finer class then names the cause where the collected metrics show it
(uncoalesced accesses, bank conflicts, a saturated pipe, the resource limiting
occupancy, the dominant stall reason). Barriers are read from the stall counters
before any pipe or cache: a kernel whose warps wait at ``__syncthreads`` for most
of their stalls is barrier-bound even where its throughput reads as busy (a
shared-memory reduction's levels keep the LSU pipe and L1 busy between barriers,
and how busy differs between collections; the stall shares do not). A metric that was not collected never
decides anything: the finer class is None when its evidence is missing, which is
exactly what the profiling tree must avoid for the kernels where it matters.

Pure: metrics in, a frozen :class:`Bottleneck` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kernel_lsp.core import profile as P

MEMORY_BOUND = "memory-bound"
COMPUTE_BOUND = "compute-bound"
LATENCY_BOUND = "latency-bound"
OCCUPANCY_LIMITED = "occupancy-limited"
UNKNOWN = "unknown"

#: Finer classes, each with the coarse class it usually refines and what it means
#: (bank conflicts and divergence also appear under latency-bound kernels).
DETAILS: dict[str, tuple[str, str]] = {
    "uncoalesced-access": (MEMORY_BOUND, "global accesses move many more sectors than they use"),
    "shared-bank-conflicts": (MEMORY_BOUND, "shared-memory accesses serialise on bank conflicts"),
    "dram-bandwidth": (MEMORY_BOUND, "DRAM bandwidth is saturated"),
    "cache-bandwidth": (MEMORY_BOUND, "L1/L2 throughput, not DRAM, is the limit"),
    "divergence": (COMPUTE_BOUND, "warps split at branches; lanes idle"),
    "fp32-pipe": (COMPUTE_BOUND, "the FMA (fp32) pipe is saturated"),
    "fp64-pipe": (COMPUTE_BOUND, "the fp64 pipe is saturated"),
    "xu-pipe": (COMPUTE_BOUND, "the special-function (XU) pipe is saturated"),
    "tensor-pipe": (COMPUTE_BOUND, "the tensor pipe is saturated"),
    "alu-pipe": (COMPUTE_BOUND, "the integer/logic (ALU) pipe is saturated"),
    "lsu-pipe": (COMPUTE_BOUND, "load/store instruction issue (LSU pipe) is saturated"),
    "low-occupancy-registers": (OCCUPANCY_LIMITED, "registers per thread limit the warps per SM"),
    "low-occupancy-shared": (OCCUPANCY_LIMITED, "shared memory per block limits the blocks per SM"),
    "low-occupancy-block-size": (OCCUPANCY_LIMITED, "the block size or block limit caps the warps per SM"),
    "insufficient-parallelism": (LATENCY_BOUND, "the grid is too small to fill the GPU"),
    "memory-latency": (LATENCY_BOUND, "warps wait on global/local memory (long scoreboard)"),
    "shared-memory-latency": (LATENCY_BOUND, "warps wait on shared memory or the MIO queue"),
    "barrier-stalls": (LATENCY_BOUND, "warps wait at __syncthreads barriers"),
    "dependency-latency": (LATENCY_BOUND, "warps wait on fixed-latency dependencies (little ILP)"),
    "memory-queue": (LATENCY_BOUND, "the local/global memory queue is full"),
}


@dataclass(frozen=True)
class Thresholds:
    """Cut-offs of the classification; percentages are 0-100."""

    high_throughput_pct: float = 60.0
    """Throughput (memory or SM) at which a kernel counts as bound by it (ncu's SOL rule)."""
    low_theoretical_occupancy_pct: float = 40.0
    """Theoretical occupancy below which a kernel that is not throughput-bound is occupancy-limited."""
    excessive_sectors_pct: float = 25.0
    """Share of global sectors beyond what coalesced accesses need (SourceCounters) that counts as uncoalesced."""
    shared_excessive_pct: float = 50.0
    """Share of shared-memory wavefronts beyond the ideal (SourceCounters) that counts as bank conflicts."""
    bank_conflicts_per_request: float = 1.0
    """Bank conflicts per shared instruction (MemoryWorkloadAnalysis_Tables), the other bank-conflict test."""
    divergence_pct: float = 20.0
    dram_pct: float = 60.0
    pipe_pct: float = 50.0
    """Pipe utilisation at which a compute-bound kernel is bound by that pipe."""
    stall_share_pct: float = 25.0
    """Share of stall cycles a reason needs to name a latency-bound kernel's cause."""
    waves_insufficient: float = 0.5
    """Waves per SM below which the grid cannot fill the GPU."""
    barrier_share_pct: float = 50.0
    """Share of stall cycles at barriers (``barrier`` and ``membar``), when no other reason has more, at which a
    busy kernel's finer class is barrier-stalls (a latency-bound kernel needs only :attr:`stall_share_pct`)."""


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Evidence:
    metric: str
    """The ncu metric (or derived quantity) that was tested."""
    value: float
    op: str
    threshold: float
    meaning: str

    def text(self) -> str:
        return f"{self.meaning}: {self.metric} = {self.value:.3g} {self.op} {self.threshold:g}"


@dataclass(frozen=True)
class Bottleneck:
    primary: str
    """``memory-bound``, ``compute-bound``, ``latency-bound``, ``occupancy-limited`` or ``unknown``."""
    detail: str | None
    """A finer class from :data:`DETAILS`, when the collected metrics show one."""
    evidence: tuple[Evidence, ...]

    @property
    def label(self) -> str:
        """The most specific class known (the finer one when present)."""
        return self.detail or self.primary

    @property
    def summary(self) -> str:
        if self.detail:
            return f"{self.primary} ({self.detail}: {DETAILS[self.detail][1]})"
        return self.primary


# Pipe utilisation metrics (ComputeWorkloadAnalysis), by finer class.
PIPE_METRICS: dict[str, str] = {
    "fp32-pipe": P.M_FMA_PIPE_PCT,
    "fp64-pipe": "sm__inst_executed_pipe_fp64.avg.pct_of_peak_sustained_active",
    "xu-pipe": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "tensor-pipe": P.M_TENSOR_PIPE_PCT,
    "alu-pipe": "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
    "lsu-pipe": "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
}

#: Dominant stall reason -> finer latency class.
STALL_DETAIL: dict[str, str] = {
    "long_scoreboard": "memory-latency",
    "short_scoreboard": "shared-memory-latency",
    "mio_throttle": "shared-memory-latency",
    "barrier": "barrier-stalls",
    "wait": "dependency-latency",
    "lg_throttle": "memory-queue",
    "branch_resolving": "divergence",
    "membar": "barrier-stalls",
}


class _Probe:
    """Reads metrics and records every comparison that took part in a decision."""

    def __init__(self, metrics: Mapping[str, float]):
        self.metrics = metrics
        self.evidence: list[Evidence] = []

    def test(self, name: str, value: float | None, op: str, threshold: float, meaning: str) -> bool | None:
        if value is None:
            return None
        passed = value >= threshold if op == ">=" else value < threshold
        if passed:
            self.evidence.append(Evidence(name, float(value), op, threshold, meaning))
        return passed


def classify(metrics: Mapping[str, float], thresholds: Thresholds = DEFAULT_THRESHOLDS) -> Bottleneck:
    """Classify a kernel from its collected metrics (ncu names, base units)."""
    t = thresholds
    probe = _Probe(metrics)
    mem = metrics.get(P.M_MEMORY_PCT)
    sm = metrics.get(P.M_SM_PCT)
    if mem is None or sm is None:
        return Bottleneck(UNKNOWN, None, ())
    if max(mem, sm) >= t.high_throughput_pct:
        if mem >= sm:
            probe.test(P.M_MEMORY_PCT, mem, ">=", t.high_throughput_pct, "memory throughput is high")
            return Bottleneck(MEMORY_BOUND, _memory_detail(probe, t), tuple(probe.evidence))
        probe.test(P.M_SM_PCT, sm, ">=", t.high_throughput_pct, "SM throughput is high")
        return Bottleneck(COMPUTE_BOUND, _compute_detail(probe, t), tuple(probe.evidence))
    probe.evidence.append(
        Evidence("max(memory, SM) throughput", max(mem, sm), "<", t.high_throughput_pct, "neither memory nor compute is busy")
    )
    waves = metrics.get(P.M_WAVES)
    if probe.test(P.M_WAVES, waves, "<", t.waves_insufficient, "the grid fills less than half a wave"):
        return Bottleneck(LATENCY_BOUND, "insufficient-parallelism", tuple(probe.evidence))
    theoretical = metrics.get(P.M_THEORETICAL_OCC)
    if probe.test(P.M_THEORETICAL_OCC, theoretical, "<", t.low_theoretical_occupancy_pct, "few warps fit on an SM"):
        return Bottleneck(OCCUPANCY_LIMITED, _occupancy_detail(probe), tuple(probe.evidence))
    return Bottleneck(LATENCY_BOUND, _latency_detail(probe, t), tuple(probe.evidence))


def _bank_conflicts(probe: _Probe, view: P.KernelProfile, t: Thresholds) -> bool | None:
    """True/False when a bank-conflict metric was collected, None when none was."""
    by_wavefronts = probe.test(
        "shared_excessive_wavefronts_pct", view.shared_excessive_wavefronts_pct, ">=", t.shared_excessive_pct,
        "shared wavefronts are mostly excessive (bank conflicts)",
    )
    if by_wavefronts:
        return True
    by_requests = probe.test(
        "shared_bank_conflicts_per_request", view.shared_bank_conflicts_per_request, ">=", t.bank_conflicts_per_request,
        "shared accesses conflict",
    )
    if by_requests:
        return True
    return None if by_wavefronts is None and by_requests is None else False


def _barrier_bound(probe: _Probe, t: Thresholds) -> bool:
    """The stall counters show the warps waiting at barriers for most of their stalls."""
    shares = P.stall_shares(probe.metrics)
    shares.pop("selected", None)
    barrier = shares.get("barrier", 0.0) + shares.get("membar", 0.0)
    others = max((v for r, v in shares.items() if r not in ("barrier", "membar")), default=0.0)
    if not shares or barrier < others:
        return False
    return bool(probe.test("stall share: barrier + membar", barrier, ">=", t.barrier_share_pct,
                           "most stalls wait at barriers"))


def _memory_detail(probe: _Probe, t: Thresholds) -> str | None:
    view = P.KernelProfile(kernel="", metrics=probe.metrics)
    uncoalesced = probe.test(
        "excessive_sectors_pct", view.excessive_sectors_pct, ">=", t.excessive_sectors_pct, "global accesses are uncoalesced"
    )
    if uncoalesced:
        return "uncoalesced-access"
    conflicts = _bank_conflicts(probe, view, t)
    if conflicts:
        return "shared-bank-conflicts"
    if _barrier_bound(probe, t):
        return "barrier-stalls"
    if uncoalesced is None or conflicts is None:
        # Without the source counters, a busy DRAM cannot rule out the two causes above.
        return None
    if probe.test(P.M_DRAM_PCT, view.dram_throughput_pct, ">=", t.dram_pct, "DRAM is busy"):
        return "dram-bandwidth"
    if view.dram_throughput_pct is not None:
        return "cache-bandwidth"
    return None


def _compute_detail(probe: _Probe, t: Thresholds) -> str | None:
    metrics = probe.metrics
    view = P.KernelProfile(kernel="", metrics=metrics)
    if probe.test("branch_divergence_pct", view.branch_divergence_pct, ">=", t.divergence_pct, "branches diverge"):
        return "divergence"
    if _barrier_bound(probe, t):
        return "barrier-stalls"
    pipes = {name: metrics[m] for name, m in PIPE_METRICS.items() if m in metrics}
    if not pipes:
        return None
    busiest = max(pipes, key=lambda name: (pipes[name], name))
    if probe.test(PIPE_METRICS[busiest], pipes[busiest], ">=", t.pipe_pct, f"the {busiest} is the busiest"):
        return busiest
    return None


def _occupancy_detail(probe: _Probe) -> str | None:
    limits = {
        "low-occupancy-registers": probe.metrics.get(P.M_LIMIT_REGISTERS),
        "low-occupancy-shared": probe.metrics.get(P.M_LIMIT_SHARED),
        "low-occupancy-block-size": min(
            (v for v in (probe.metrics.get(P.M_LIMIT_WARPS), probe.metrics.get(P.M_LIMIT_BLOCKS)) if v is not None),
            default=None,
        ),
    }
    known = {k: v for k, v in limits.items() if v is not None}
    if not known:
        return None
    # Each limit is the number of blocks per SM that resource allows; the smallest limits.
    # Ties go to registers, then shared memory: the resources a rewrite can change.
    order = list(limits)
    limiter = min(known, key=lambda k: (known[k], order.index(k)))
    metric = {
        "low-occupancy-registers": P.M_LIMIT_REGISTERS,
        "low-occupancy-shared": P.M_LIMIT_SHARED,
        "low-occupancy-block-size": P.M_LIMIT_WARPS,
    }[limiter]
    probe.evidence.append(Evidence(metric, known[limiter], "<=", min(known.values()), "the smallest blocks-per-SM limit"))
    return limiter


def _latency_detail(probe: _Probe, t: Thresholds) -> str | None:
    shares = P.stall_shares(probe.metrics)
    shares.pop("selected", None)
    if not shares:
        return None
    reason = max(shares, key=lambda r: (shares[r], r))
    detail = STALL_DETAIL.get(reason)
    if detail is None:
        return None
    if not probe.test(f"stall share: {reason}", shares[reason], ">=", t.stall_share_pct, f"most stalls are {reason}"):
        return None
    if detail == "shared-memory-latency" and _bank_conflicts(probe, P.KernelProfile(kernel="", metrics=probe.metrics), t):
        return "shared-bank-conflicts"
    return detail
