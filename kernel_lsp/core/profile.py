"""What one Nsight Compute profile says about one kernel.

A :class:`KernelProfile` holds the flat ``metrics`` mapping (ncu metric name ->
value in base units: ns, bytes, %, counts) that the reader extracts, plus ncu's
guided-analysis rule results and the per-source-line counters. Every derived
value (``duration_us``, ``dram_throughput_pct``, ...) is a property computed
from ``metrics``, so a profile restricted to fewer sections (see
:func:`restrict_metrics`) stays consistent with itself; a value whose metrics
were not collected is None.

Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kernel_lsp.core.signature import SIGNATURE_KEYS

# --- ncu metric names (Nsight Compute 2023-2025, sm_70+) -------------------------------
M_DURATION_NS = "gpu__time_duration.sum"
M_MEMORY_PCT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
M_SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
M_DRAM_PCT = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
#: Older ncu versions and other chips name DRAM throughput this way.
M_DRAM_PCT_ALT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
M_L1_PCT = "l1tex__throughput.avg.pct_of_peak_sustained_active"
M_L2_PCT = "lts__throughput.avg.pct_of_peak_sustained_elapsed"
M_ACHIEVED_OCC = "sm__warps_active.avg.pct_of_peak_sustained_active"
M_THEORETICAL_OCC = "sm__maximum_warps_per_active_cycle_pct"
M_L1_HIT = "l1tex__t_sector_hit_rate.pct"
M_L2_HIT = "lts__t_sector_hit_rate.pct"
M_REGISTERS = "launch__registers_per_thread"
M_SMEM_STATIC = "launch__shared_mem_per_block_static"
M_SMEM_DYNAMIC = "launch__shared_mem_per_block_dynamic"
M_BLOCK_SIZE = "launch__block_size"
M_GRID_SIZE = "launch__grid_size"
M_WAVES = "launch__waves_per_multiprocessor"
M_IPC = "sm__inst_executed.avg.per_cycle_active"
M_SECTORS_LD = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
M_REQUESTS_LD = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
M_SECTORS_ST = "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
M_REQUESTS_ST = "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"
M_EXCESSIVE_SECTORS = "derived__memory_l2_theoretical_sectors_global_excessive"
M_GLOBAL_SECTORS_THEORETICAL = "memory_l2_theoretical_sectors_global"
M_GLOBAL_SECTORS_IDEAL = "memory_l2_theoretical_sectors_global_ideal"
M_GLOBAL_SECTORS_L2 = "lts__t_sectors_srcunit_tex_op_read.sum"
M_BANK_CONFLICTS_LD = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
M_BANK_CONFLICTS_ST = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
M_SHARED_REQ_LD = "smsp__sass_inst_executed_op_shared_ld.sum"
M_SHARED_REQ_ST = "smsp__sass_inst_executed_op_shared_st.sum"
M_BRANCH_UNIFORM_PCT = "smsp__sass_average_branch_targets_threads_uniform.pct"
M_DIVERGENT_TARGETS = "smsp__sass_branch_targets_threads_divergent.sum"
M_SHARED_WAVEFRONTS = "memory_l1_wavefronts_shared"
M_SHARED_WAVEFRONTS_IDEAL = "memory_l1_wavefronts_shared_ideal"
M_SHARED_EXCESSIVE = "derived__memory_l1_wavefronts_shared_excessive"
M_FMA_PIPE_PCT = "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"
M_TENSOR_PIPE_PCT = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
M_LIMIT_REGISTERS = "launch__occupancy_limit_registers"
M_LIMIT_SHARED = "launch__occupancy_limit_shared_mem"
M_LIMIT_WARPS = "launch__occupancy_limit_warps"
M_LIMIT_BLOCKS = "launch__occupancy_limit_blocks"
M_SM_COUNT = "device__attribute_multiprocessor_count"

#: Warp-state metric for each stall reason: average cycles a warp spent stalled on
#: that reason per issued instruction (WarpStateStats section). Shares are taken
#: over the sum of all reasons, ``selected`` included (it is the issuing cycle).
STALL_REASONS: tuple[str, ...] = (
    "barrier",
    "branch_resolving",
    "dispatch_stall",
    "drain",
    "imc_miss",
    "lg_throttle",
    "long_scoreboard",
    "math_pipe_throttle",
    "membar",
    "mio_throttle",
    "misc",
    "no_instruction",
    "not_selected",
    "selected",
    "short_scoreboard",
    "sleeping",
    "tex_throttle",
    "wait",
)


#: :attr:`KernelProfile.collector` values.
COLLECTOR_NCU = "ncu"
COLLECTOR_CUPTI = "cupti"


def stall_metric(reason: str) -> str:
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


@dataclass(frozen=True)
class RuleAdvice:
    """One result of ncu's guided analysis (``--page details`` rule output)."""

    rule: str
    """Rule identifier, e.g. ``UncoalescedGlobalAccess`` (or its section when unnamed)."""
    title: str
    """Short heading: the rule's name as ncu shows it."""
    message: str
    kind: str
    """``OPT`` (an optimization), ``WRN``, ``INF`` or ``ERR``."""
    estimated_speedup_pct: float | None
    """ncu's estimate of the speedup if the issue were fixed, %."""
    speedup_scope: str | None = None
    """``global`` (the whole kernel's time) or ``local`` (only the part this rule looks at)."""


@dataclass(frozen=True)
class LineCounters:
    """Source-level counters summed over the SASS of one CUDA source line."""

    file: str
    line: int
    """1-based line, as ncu reports it."""
    stall_samples: Mapping[str, float] = field(default_factory=dict)
    """Warp-state samples at this line by stall reason (all samples)."""
    samples_total: float | None = None
    """Warp-state samples at this line, all reasons."""
    samples_not_issued: float | None = None
    instructions_executed: float | None = None
    excessive_global_sectors: float | None = None
    """L2 sectors moved for global accesses beyond what a coalesced access needs."""
    shared_excessive_wavefronts: float | None = None
    """Shared-memory wavefronts beyond the ideal: bank conflicts."""
    divergent_branches: float | None = None

    @property
    def top_stall(self) -> tuple[str, float] | None:
        if not self.stall_samples:
            return None
        reason = max(self.stall_samples, key=lambda r: self.stall_samples[r])
        return reason, self.stall_samples[reason]


@dataclass(frozen=True)
class PathStep:
    """One decision taken while walking the profiling tree."""

    node: str
    feature: str
    value: float | None
    """The feature's value; None when it was unknown (the node's ``missing`` branch was taken)."""
    op: str
    threshold: float
    branch: str
    """``then``, ``else`` or ``missing``."""


@dataclass(frozen=True)
class KernelProfile:
    kernel: str
    """Kernel name as ncu reports it (demangled function name, no parameters)."""
    mangled: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Every numeric metric collected, in base units (ns, bytes, %, counts)."""
    rules: tuple[RuleAdvice, ...] = ()
    lines: Mapping[int, LineCounters] = field(default_factory=dict)
    """Per source line of ``source_file`` (1-based)."""
    source_file: str | None = None
    sections: tuple[str, ...] = ()
    """ncu sections collected (identifiers, e.g. ``SpeedOfLight``)."""
    tree_path: tuple[PathStep, ...] = ()
    tree_leaf: str | None = None
    state_from: str = "profile"
    """The tree leaf's ``state_from``: ``source`` when the optimizer should rank this kernel by the static
    analysis' state rather than this profile's signature (:mod:`kernel_lsp.core.profiling_tree`)."""
    passes: int | None = None
    """Replay passes ncu needed (from its log)."""
    collection_wall_s: float | None = None
    """Wall time of every ncu run that produced this profile, seconds."""
    ncu_version: str | None = None
    duration_samples_us: tuple[float, ...] = ()
    """Durations of every profiled launch of the kernel (several when the run repeated it), µs."""
    stale: bool = False
    """True when a newer profiling attempt failed and this is the last good profile."""
    stale_reason: str | None = None
    collector: str | None = None
    """What collected the counters: :data:`COLLECTOR_NCU` (Nsight Compute) or :data:`COLLECTOR_CUPTI` (the GPU
    worker's CUPTI); None for a profile stored before this was recorded."""

    def metric(self, name: str) -> float | None:
        return self.metrics.get(name)

    @property
    def duration_us(self) -> float | None:
        ns = self.metrics.get(M_DURATION_NS)
        return None if ns is None else ns / 1000.0

    @property
    def memory_throughput_pct(self) -> float | None:
        return self.metrics.get(M_MEMORY_PCT)

    @property
    def compute_throughput_pct(self) -> float | None:
        return self.metrics.get(M_SM_PCT)

    @property
    def dram_throughput_pct(self) -> float | None:
        value = self.metrics.get(M_DRAM_PCT)
        return self.metrics.get(M_DRAM_PCT_ALT) if value is None else value

    @property
    def achieved_occupancy_pct(self) -> float | None:
        return self.metrics.get(M_ACHIEVED_OCC)

    @property
    def theoretical_occupancy_pct(self) -> float | None:
        return self.metrics.get(M_THEORETICAL_OCC)

    @property
    def l1_hit_rate_pct(self) -> float | None:
        return self.metrics.get(M_L1_HIT)

    @property
    def l2_hit_rate_pct(self) -> float | None:
        return self.metrics.get(M_L2_HIT)

    @property
    def registers_per_thread(self) -> float | None:
        return self.metrics.get(M_REGISTERS)

    @property
    def shared_bytes_per_block(self) -> float | None:
        static = self.metrics.get(M_SMEM_STATIC)
        dynamic = self.metrics.get(M_SMEM_DYNAMIC)
        if static is None and dynamic is None:
            return None
        return (static or 0.0) + (dynamic or 0.0)

    @property
    def stalls_pct(self) -> dict[str, float]:
        """Warp-stall breakdown: reason -> share of all stall cycles, %; empty when not collected."""
        return stall_shares(self.metrics)

    @property
    def global_sectors_per_request(self) -> float | None:
        return _ratio(self.metrics.get(M_SECTORS_LD), self.metrics.get(M_REQUESTS_LD))

    @property
    def excessive_sectors_pct(self) -> float | None:
        """Global-access L2 sectors beyond what coalesced accesses need, % of all (SourceCounters).

        The section's derived metric when present; otherwise theoretical minus ideal
        sectors, the two instruction-level metrics it is derived from (what a
        ``--metrics`` collection gets: derived metrics exist only inside sections).
        """
        excessive = self.metrics.get(M_EXCESSIVE_SECTORS)
        ideal = self.metrics.get(M_GLOBAL_SECTORS_IDEAL)
        if excessive is None and ideal is not None and M_GLOBAL_SECTORS_THEORETICAL in self.metrics:
            excessive = max(0.0, self.metrics[M_GLOBAL_SECTORS_THEORETICAL] - ideal)
        if excessive is None:
            return None
        total = self.metrics.get(M_GLOBAL_SECTORS_THEORETICAL)
        if total is None:
            total = sum(v for v in (self.metrics.get(M_SECTORS_LD), self.metrics.get(M_SECTORS_ST)) if v is not None)
        if total <= 0:
            return 0.0 if excessive == 0 else None
        return min(100.0, 100.0 * excessive / total)

    @property
    def shared_bank_conflicts_per_request(self) -> float | None:
        conflicts = [self.metrics.get(M_BANK_CONFLICTS_LD), self.metrics.get(M_BANK_CONFLICTS_ST)]
        requests = [self.metrics.get(M_SHARED_REQ_LD), self.metrics.get(M_SHARED_REQ_ST)]
        if all(c is None for c in conflicts) or all(r is None for r in requests):
            return None
        total_requests = sum(r for r in requests if r is not None)
        if total_requests <= 0:
            return 0.0
        return sum(c for c in conflicts if c is not None) / total_requests

    @property
    def branch_divergence_pct(self) -> float | None:
        """Share of branch targets not taken by all active threads alike, %.

        ncu reports 0 % uniform for kernels whose branches it did not sample, so a
        zero count of divergent targets wins over the uniform percentage.
        """
        divergent = self.metrics.get(M_DIVERGENT_TARGETS)
        if divergent is not None and divergent == 0:
            return 0.0
        uniform = self.metrics.get(M_BRANCH_UNIFORM_PCT)
        return None if uniform is None else max(0.0, 100.0 - uniform)

    @property
    def shared_excessive_wavefronts_pct(self) -> float | None:
        """Shared-memory wavefronts beyond the ideal (bank conflicts), % of all shared wavefronts."""
        excessive = self.metrics.get(M_SHARED_EXCESSIVE)
        total = self.metrics.get(M_SHARED_WAVEFRONTS)
        ideal = self.metrics.get(M_SHARED_WAVEFRONTS_IDEAL)
        if excessive is None and total is not None and ideal is not None:
            excessive = max(0.0, total - ideal)
        if excessive is None or total is None:
            return None
        return 0.0 if total <= 0 else min(100.0, 100.0 * excessive / total)

    @property
    def top_rule(self) -> RuleAdvice | None:
        """The optimization rule with the largest estimated kernel-level speedup.

        OPT rules come first, then rules whose estimate is global (kernel time),
        since a local estimate only covers the part of the kernel the rule studies.
        """
        if not self.rules:
            return None
        return max(
            self.rules, key=lambda r: (r.kind == "OPT", r.speedup_scope != "local", r.estimated_speedup_pct or 0.0)
        )

    def hottest_lines(self, count: int = 3) -> tuple[LineCounters, ...]:
        """Lines with the most warp-state samples, most first."""
        sampled = [c for c in self.lines.values() if c.samples_total]
        sampled.sort(key=lambda c: (-(c.samples_total or 0.0), c.line))
        return tuple(sampled[:count])

    def signature(self) -> dict[str, float]:
        """The numeric signature (keys of :data:`kernel_lsp.core.signature.SIGNATURE_KEYS`); unknown keys left out."""
        m = self.metrics
        block = m.get(M_BLOCK_SIZE)
        grid = m.get(M_GRID_SIZE)
        values: dict[str, float | None] = {
            "dram_throughput_pct": self.dram_throughput_pct,
            "memory_throughput_pct": self.memory_throughput_pct,
            "sm_throughput_pct": self.compute_throughput_pct,
            "achieved_occupancy_pct": self.achieved_occupancy_pct,
            "theoretical_occupancy_pct": self.theoretical_occupancy_pct,
            "l1_hit_rate_pct": self.l1_hit_rate_pct,
            "l2_hit_rate_pct": self.l2_hit_rate_pct,
            "global_sectors_per_request": self.global_sectors_per_request,
            "excessive_sectors_pct": self.excessive_sectors_pct,
            "shared_bank_conflicts_per_request": self.shared_bank_conflicts_per_request,
            "branch_divergence_pct": self.branch_divergence_pct,
            "registers_per_thread": self.registers_per_thread,
            "shared_bytes_per_block": self.shared_bytes_per_block,
            "waves_per_sm": m.get(M_WAVES),
            "grid_blocks": grid,
            "block_threads": block,
            "duration_us": self.duration_us,
            "ipc": m.get(M_IPC),
            "fp32_pipe_pct": m.get(M_FMA_PIPE_PCT),
            "tensor_pipe_pct": m.get(M_TENSOR_PIPE_PCT),
        }
        for reason, pct in self.stalls_pct.items():
            key = f"stall_{reason}_pct"
            if key in SIGNATURE_KEYS:
                values[key] = pct
        return {k: float(v) for k, v in values.items() if v is not None and k in SIGNATURE_KEYS}

    def marked_stale(self, reason: str) -> KernelProfile:
        return replace(self, stale=True, stale_reason=reason)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def stall_shares(metrics: Mapping[str, float]) -> dict[str, float]:
    """Reason -> % of all warp-state cycles, from the WarpStateStats ratios; {} when absent."""
    raw = {r: metrics[stall_metric(r)] for r in STALL_REASONS if stall_metric(r) in metrics}
    total = sum(v for v in raw.values() if v > 0)
    if total <= 0:
        return {}
    return {r: 100.0 * v / total for r, v in raw.items() if v > 0}


def restrict_metrics(metrics: Mapping[str, float], keep: Iterable[str]) -> dict[str, float]:
    """The part of ``metrics`` whose names are in ``keep``: what a cheaper collection would have seen."""
    wanted = set(keep)
    return {name: value for name, value in metrics.items() if name in wanted}


@dataclass(frozen=True)
class Regression:
    """A kernel that got slower than its previous profile by more than the noise."""

    previous_us: float
    current_us: float
    noise_pct: float
    """The relative spread allowed, %: the larger of both profiles' measured spreads and a floor."""

    @property
    def slowdown_pct(self) -> float:
        return 100.0 * (self.current_us / self.previous_us - 1.0)


#: Smallest relative change (%) ever reported as a regression: one ncu launch has
#: no spread to measure, and GPU timings rarely repeat better than this.
MIN_NOISE_PCT = 3.0


def _median(values: Iterable[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def spread_pct(samples: Iterable[float]) -> float | None:
    """(max - min) / median of the samples, %; None for fewer than two."""
    values = list(samples)
    med = _median(values)
    if len(values) < 2 or not med:
        return None
    return 100.0 * (max(values) - min(values)) / med


def _typical_us(profile: KernelProfile) -> float | None:
    return _median(profile.duration_samples_us) if profile.duration_samples_us else profile.duration_us


def regression(previous: KernelProfile, current: KernelProfile, min_noise_pct: float = MIN_NOISE_PCT) -> Regression | None:
    """A :class:`Regression` when ``current`` is slower than ``previous`` beyond the measured noise."""
    before, after = _typical_us(previous), _typical_us(current)
    if before is None or after is None or before <= 0:
        return None
    noise = max(
        min_noise_pct,
        spread_pct(previous.duration_samples_us) or 0.0,
        spread_pct(current.duration_samples_us) or 0.0,
    )
    if after > before * (1.0 + noise / 100.0):
        return Regression(before, after, noise)
    return None


# ------------------------------------------------------------------ JSON


def profile_to_json(profile: KernelProfile) -> dict[str, Any]:
    """A JSON-ready object; :func:`profile_from_json` gives the profile back."""
    return {
        "kernel": profile.kernel,
        "mangled": profile.mangled,
        "metrics": dict(profile.metrics),
        "rules": [asdict(r) for r in profile.rules],
        "lines": [
            {**asdict(c), "stall_samples": dict(c.stall_samples)} for _, c in sorted(profile.lines.items())
        ],
        "source_file": profile.source_file,
        "sections": list(profile.sections),
        "tree_path": [asdict(step) for step in profile.tree_path],
        "tree_leaf": profile.tree_leaf,
        "state_from": profile.state_from,
        "passes": profile.passes,
        "collection_wall_s": profile.collection_wall_s,
        "ncu_version": profile.ncu_version,
        "duration_samples_us": list(profile.duration_samples_us),
        "stale": profile.stale,
        "stale_reason": profile.stale_reason,
        "collector": profile.collector,
    }


def profile_from_json(data: Mapping[str, Any]) -> KernelProfile:
    """Inverse of :func:`profile_to_json`; raises KeyError/TypeError/ValueError on malformed data."""
    lines = {}
    for item in data.get("lines", []):
        counters = LineCounters(**{**item, "stall_samples": dict(item.get("stall_samples", {}))})
        lines[counters.line] = counters
    return KernelProfile(
        kernel=str(data["kernel"]),
        mangled=data.get("mangled"),
        metrics={str(k): float(v) for k, v in data.get("metrics", {}).items()},
        rules=tuple(RuleAdvice(**r) for r in data.get("rules", [])),
        lines=lines,
        source_file=data.get("source_file"),
        sections=tuple(data.get("sections", [])),
        tree_path=tuple(PathStep(**step) for step in data.get("tree_path", [])),
        tree_leaf=data.get("tree_leaf"),
        state_from=str(data.get("state_from", "profile")),
        passes=data.get("passes"),
        collection_wall_s=data.get("collection_wall_s"),
        ncu_version=data.get("ncu_version"),
        duration_samples_us=tuple(float(v) for v in data.get("duration_samples_us", [])),
        stale=bool(data.get("stale", False)),
        stale_reason=data.get("stale_reason"),
        collector=data.get("collector"),
    )
