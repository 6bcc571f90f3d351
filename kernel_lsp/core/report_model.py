"""What the visual report of one kernel shows, computed from a profile and the attempt log.

Three parts (``services/report.py`` draws them):

* **Roofline** (FP32, DRAM): the kernel's achieved FLOP/s against its arithmetic
  intensity (FLOP per DRAM byte), under the device's two ceilings, with the same
  metrics and formulas as Nsight Compute's SpeedOfLight roofline chart:

      achieved FLOP/s  = (fadd + fmul + 2 ffma thread instructions per cycle, summed over SMSPs)
                         x SMSP cycles per second
      peak FLOP/s      = 2 x peak sustained ffma per cycle x SM cycles per second
      DRAM bytes/s     = dram__bytes.sum.per_second
      peak DRAM bytes/s = dram__bytes.sum.peak_sustained x DRAM cycles per second

  A profile without these metrics (the profiling tree collects only what it
  needs; ``kernel-lsp profile --full`` collects them) has no roofline.
* **Stall reasons**: the warp-state shares of :attr:`KernelProfile.stalls_pct`, largest first.
* **Optimization history**: every verified attempt recorded for the kernel, in order.

Pure: values in, frozen dataclasses out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kernel_lsp.core.classify import classify
from kernel_lsp.core.kb_logic import Attempt
from kernel_lsp.core.profile import KernelProfile

_FADD = "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum.per_cycle_elapsed"
_FMUL = "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum.per_cycle_elapsed"
_FFMA_X2 = "derived__smsp__sass_thread_inst_executed_op_ffma_pred_on_x2"
_FFMA = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed"
_FFMA_PEAK = "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained"
_SMSP_CLOCK = "smsp__cycles_elapsed.avg.per_second"
_SM_CLOCK = "sm__cycles_elapsed.avg.per_second"
_DRAM_RATE = "dram__bytes.sum.per_second"
_DRAM_PEAK = "dram__bytes.sum.peak_sustained"
_DRAM_CLOCK = "dram__cycles_elapsed.avg.per_second"

#: Stall reasons below this share are left out of the chart (they would be invisible bars), %.
MIN_STALL_PCT = 0.5


@dataclass(frozen=True)
class Roofline:
    achieved_flop_per_s: float
    dram_bytes_per_s: float
    peak_flop_per_s: float
    peak_dram_bytes_per_s: float

    @property
    def intensity_flop_per_byte(self) -> float | None:
        """FLOP per DRAM byte; None when the kernel moved no DRAM bytes (its data stayed in cache)."""
        return self.achieved_flop_per_s / self.dram_bytes_per_s if self.dram_bytes_per_s > 0 else None

    @property
    def ridge_flop_per_byte(self) -> float:
        """Intensity where the bandwidth roof meets the compute roof."""
        return self.peak_flop_per_s / self.peak_dram_bytes_per_s

    @property
    def compute_pct(self) -> float:
        return 100.0 * self.achieved_flop_per_s / self.peak_flop_per_s

    @property
    def dram_pct(self) -> float:
        return 100.0 * self.dram_bytes_per_s / self.peak_dram_bytes_per_s

    @property
    def bound(self) -> str | None:
        """``memory`` or ``compute``: the roof above the kernel's intensity; None without FP32 work
        (an FP32 roofline does not place a kernel that does none)."""
        if self.achieved_flop_per_s <= 0:
            return None
        intensity = self.intensity_flop_per_byte
        if intensity is None or intensity >= self.ridge_flop_per_byte:
            return "compute"
        return "memory"


@dataclass(frozen=True)
class HistoryEntry:
    technique: str
    generator: str
    verdict: str
    accepted: bool
    speedup: float | None
    """Baseline time / candidate time of a correct candidate; None when it failed."""
    created_at: str | None


@dataclass(frozen=True)
class KernelReport:
    kernel: str
    source_path: str
    duration_us: float | None
    bottleneck: str | None
    """Classified bottleneck with its detail, in words; None without a profile."""
    roofline: Roofline | None
    stalls_pct: tuple[tuple[str, float], ...]
    """(reason, share of stall cycles %), largest first."""
    history: tuple[HistoryEntry, ...]
    profile_note: str | None
    """Where the profile came from, or why there is none."""
    stale: bool = False

    @property
    def best_speedup(self) -> float | None:
        accepted = [h.speedup for h in self.history if h.accepted and h.speedup is not None]
        return max(accepted) if accepted else None


def roofline(metrics: Mapping[str, float]) -> Roofline | None:
    """The roofline point and ceilings from ncu metrics (module docstring), or None when not collected."""
    smsp_clock = metrics.get(_SMSP_CLOCK) or metrics.get(_SM_CLOCK)
    sm_clock = metrics.get(_SM_CLOCK) or smsp_clock
    ffma_x2 = metrics.get(_FFMA_X2)
    if ffma_x2 is None and metrics.get(_FFMA) is not None:
        ffma_x2 = 2.0 * metrics[_FFMA]
    needed = (smsp_clock, sm_clock, ffma_x2, metrics.get(_FADD), metrics.get(_FMUL), metrics.get(_FFMA_PEAK),
              metrics.get(_DRAM_RATE), metrics.get(_DRAM_PEAK), metrics.get(_DRAM_CLOCK))
    if any(value is None for value in needed):
        return None
    peak_flop = 2.0 * metrics[_FFMA_PEAK] * sm_clock  # type: ignore[operator]
    peak_dram = metrics[_DRAM_PEAK] * metrics[_DRAM_CLOCK]
    if peak_flop <= 0 or peak_dram <= 0:
        return None
    achieved = (metrics[_FADD] + metrics[_FMUL] + ffma_x2) * smsp_clock  # type: ignore[operator]
    return Roofline(max(achieved, 0.0), max(metrics[_DRAM_RATE], 0.0), peak_flop, peak_dram)


def stall_bars(profile: KernelProfile, min_pct: float = MIN_STALL_PCT) -> tuple[tuple[str, float], ...]:
    shares = sorted(profile.stalls_pct.items(), key=lambda item: (-item[1], item[0]))
    return tuple((reason, pct) for reason, pct in shares if pct >= min_pct)


def history(attempts: Iterable[Attempt], kernel: str, source_path: str | None = None) -> tuple[HistoryEntry, ...]:
    """The kernel's verified attempts in log order (``source_path``: only those recorded for that file)."""
    return tuple(
        HistoryEntry(a.technique, a.generator, a.verdict, a.accepted, a.speedup, a.created_at)
        for a in attempts
        if a.kernel == kernel and (source_path is None or a.file == source_path)
    )


def build_report(kernel: str, source_path: str, profile: KernelProfile | None, attempts: Iterable[Attempt],
                 profile_note: str | None = None) -> KernelReport:
    """Everything the report page of ``kernel`` shows."""
    entries = history(attempts, kernel, source_path)
    if profile is None:
        return KernelReport(kernel, source_path, None, None, None, (), entries, profile_note or "no profile yet")
    found = classify(profile.metrics)
    bottleneck = None if found.primary == "unknown" else found.summary
    return KernelReport(kernel, source_path, profile.duration_us, bottleneck, roofline(profile.metrics),
                        stall_bars(profile), entries, profile_note, profile.stale)
