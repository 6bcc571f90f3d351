"""Verdict JSON round trip with every field set."""

import json

from kernel_lsp.core.verdict import Finding, GpuInfo, KernelTiming, Reason, Verdict


def test_round_trip_keeps_every_field():
    verdict = Verdict(
        accepted=False,
        reason=Reason.NOT_FASTER,
        errors=("speedup 1.01x",),
        max_abs_error=1e-7,
        max_rel_error=2e-6,
        timings={"original": KernelTiming(1.0, 0.9, 1.1, 50), "candidate": KernelTiming(0.99, 0.95, 1.02, 50)},
        speedup=1.01,
        speedup_ci_low=0.98,
        speedup_ci_high=1.04,
        ci_level=0.95,
        min_speedup=1.05,
        seeds=(1, 2, 3),
        gpu=GpuInfo("NVIDIA H200", "580.1", "9.0", 1980, 3201, 1980, 52428800),
        wall_s=6.5,
        warnings=("line 3: printf: printf in device function 'k'",),
        static_findings=(Finding("printf", "printf in device function 'k'", 3, "warning", "why"),),
        sanitizer=None,
    )
    data = json.loads(json.dumps(verdict.to_json()))
    assert data["reason"] == "not_faster" and data["timings"]["original"]["median_ms"] == 1.0
    assert Verdict.from_json(data) == verdict
    assert "REJECTED (not_faster)" in verdict.summary() and "[0.980, 1.040]" in verdict.summary()
