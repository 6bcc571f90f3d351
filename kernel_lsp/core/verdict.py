"""The harness's answer about one candidate: accepted or not, why, and the evidence.

A :class:`Verdict` is what every code action waits for; ``to_json``/``from_json``
round-trip it exactly (``kernel-lsp verify --json`` prints ``to_json``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


def _triple(value: Any) -> tuple[float, float, float] | None:
    return None if value is None else (float(value[0]), float(value[1]), float(value[2]))


class Reason(str, enum.Enum):
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    SIGNATURE_CHANGED = "signature_changed"
    LAUNCH_ERROR = "launch_error"
    TIMEOUT = "timeout"
    MISMATCH = "mismatch"
    NAN_OR_INF = "nan_or_inf"
    INPUT_MODIFIED = "input_modified"
    NONDETERMINISTIC = "nondeterministic"
    OUT_OF_BOUNDS = "out_of_bounds"
    """A red zone around an array changed: the candidate stores out of range."""
    HISTORY_DEPENDENT = "history_dependent"
    """The candidate matched once and then failed in the same buffers, at other addresses or after
    other launches (more of its own launches in a row included): its results depend on state kept
    across launches."""
    TIMED_MISMATCH = "timed_mismatch"
    """A timed launch left outputs the correctness checks reject: what was timed is not what was checked."""
    SPEEDUP_COLLAPSE = "speedup_collapse"
    """The speedup on inputs redrawn between trials falls far below the speedup on unchanged inputs: the
    candidate is fast only when it is launched again on what it saw before."""
    SIZE_DEPENDENT = "size_dependent"
    """Correct at the spec's sizes, wrong at a size the spec does not name (a value of a scalar that sizes
    an array or the grid, tried within the spec's buffers): an assumption the spec's own size hides."""
    SANITIZER = "sanitizer"
    STATIC_CHECK = "static_check"
    NOT_FASTER = "not_faster"


@dataclass(frozen=True)
class KernelTiming:
    median_ms: float
    p10_ms: float
    p90_ms: float
    trials: int


@dataclass(frozen=True)
class GpuInfo:
    name: str
    driver: str | None
    compute_capability: str | None
    """``"9.0"``."""
    sm_clock_mhz: int | None
    """SM clock seen right after timing (None when it could not be read)."""
    mem_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    l2_bytes: int | None


@dataclass(frozen=True)
class Finding:
    """A static-check rule that fired on the candidate."""

    rule: str
    message: str
    line: int
    """1-based line in the candidate file."""
    severity: str
    """``error`` (rejects) or ``warning`` (recorded only)."""
    rationale: str


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: Reason
    errors: tuple[str, ...] = ()
    """What went wrong, most important first (empty when accepted)."""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    timings: Mapping[str, KernelTiming] = field(default_factory=dict)
    """``"original"`` and ``"candidate"`` on unchanged inputs, ``"original_redrawn"`` and ``"candidate_redrawn"``
    on inputs redrawn between trials (milliseconds); empty when timing did not run."""
    speedup: float | None = None
    """median(original) / median(candidate) of the more conservative series: of the unchanged-input and the
    redrawn-input series, the one whose interval's lower bound is lower."""
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    unchanged_speedup: tuple[float, float, float] | None = None
    """(ratio, interval low, interval high) on unchanged inputs."""
    redrawn_speedup: tuple[float, float, float] | None = None
    """(ratio, interval low, interval high) on inputs redrawn between trials; None when no input could be redrawn."""
    ci_level: float | None = None
    min_speedup: float | None = None
    seeds: tuple[int, ...] = ()
    gpu: GpuInfo | None = None
    wall_s: float = 0.0
    """Wall time of the whole verification (compile, checks, runs, timing)."""
    warnings: tuple[str, ...] = ()
    static_findings: tuple[Finding, ...] = ()
    sanitizer: str | None = None
    """compute-sanitizer output when ``--sanitize`` ran and found errors."""
    timed_checks: int | None = None
    """Timed launches whose outputs were compared with the original's (None when timing did not run)."""
    sizes_tried: tuple[str, ...] = ()
    """Sizes the spec does not name at which the candidate was compared with the original (``"cols = 8191"``)."""
    fixed_sizes: Mapping[str, int] = field(default_factory=dict)
    """The spec's ``fixed`` scalars and their values: the only values of them the candidate was verified at."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["reason"] = self.reason.value
        data["timings"] = {k: asdict(v) for k, v in self.timings.items()}
        data["seeds"] = list(self.seeds)
        data["errors"] = list(self.errors)
        data["warnings"] = list(self.warnings)
        data["static_findings"] = [asdict(f) for f in self.static_findings]
        data["unchanged_speedup"] = list(self.unchanged_speedup) if self.unchanged_speedup else None
        data["redrawn_speedup"] = list(self.redrawn_speedup) if self.redrawn_speedup else None
        data["sizes_tried"] = list(self.sizes_tried)
        data["fixed_sizes"] = dict(self.fixed_sizes)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        gpu = data.get("gpu")
        return cls(
            accepted=bool(data["accepted"]),
            reason=Reason(data["reason"]),
            errors=tuple(data.get("errors", ())),
            max_abs_error=data.get("max_abs_error"),
            max_rel_error=data.get("max_rel_error"),
            timings={k: KernelTiming(**v) for k, v in data.get("timings", {}).items()},
            speedup=data.get("speedup"),
            speedup_ci_low=data.get("speedup_ci_low"),
            speedup_ci_high=data.get("speedup_ci_high"),
            ci_level=data.get("ci_level"),
            min_speedup=data.get("min_speedup"),
            seeds=tuple(data.get("seeds", ())),
            gpu=GpuInfo(**gpu) if gpu else None,
            wall_s=float(data.get("wall_s", 0.0)),
            warnings=tuple(data.get("warnings", ())),
            static_findings=tuple(Finding(**f) for f in data.get("static_findings", ())),
            sanitizer=data.get("sanitizer"),
            unchanged_speedup=_triple(data.get("unchanged_speedup")),
            redrawn_speedup=_triple(data.get("redrawn_speedup")),
            timed_checks=data.get("timed_checks"),
            sizes_tried=tuple(data.get("sizes_tried", ())),
            fixed_sizes={str(k): int(v) for k, v in data.get("fixed_sizes", {}).items()},
        )

    def verified_at(self) -> str:
        """``verified``, or ``verified at width = 8192 only`` when the spec fixed sizes the harness did not vary."""
        if not self.fixed_sizes:
            return "verified"
        return "verified at " + ", ".join(f"{name} = {value}" for name, value in self.fixed_sizes.items()) + " only"

    def summary(self) -> str:
        """One line for people: the verdict, the reason, the speedup when measured."""
        head = "ACCEPTED" if self.accepted else f"REJECTED ({self.reason.value})"
        if self.speedup is not None and self.speedup_ci_low is not None:
            head += f": speedup {self.speedup:.3f}x [{self.speedup_ci_low:.3f}, {self.speedup_ci_high:.3f}]"
        if self.accepted and self.fixed_sizes:
            head += f" ({self.verified_at()})"
        if self.errors:
            head += f": {self.errors[0]}"
        return head
