"""The report's data: roofline point and ceilings from ncu metrics (the SpeedOfLight formulas),
stall bars largest first, history of one kernel in log order."""

from __future__ import annotations

import pytest

from kernel_lsp.core.kb_logic import Attempt
from kernel_lsp.core.profile import KernelProfile, stall_metric
from kernel_lsp.core.report_model import build_report, history, roofline, stall_bars

# One H200 launch's roofline metrics, rounded from tests/fixtures/ncu/dataset/zoo_full.csv.gz (z_reduce).
METRICS = {
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum.per_cycle_elapsed": 100.0,
    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum.per_cycle_elapsed": 20.0,
    "derived__smsp__sass_thread_inst_executed_op_ffma_pred_on_x2": 40.0,
    "smsp__cycles_elapsed.avg.per_second": 1.5e9,
    "sm__cycles_elapsed.avg.per_second": 1.5e9,
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained": 16896.0,
    "dram__bytes.sum.per_second": 1.0e12,
    "dram__bytes.sum.peak_sustained": 1920.0,
    "dram__cycles_elapsed.avg.per_second": 2.5e9,
}


def test_roofline_follows_the_speed_of_light_formulas() -> None:
    roof = roofline(METRICS)
    assert roof is not None
    assert roof.achieved_flop_per_s == pytest.approx((100 + 20 + 40) * 1.5e9)
    assert roof.peak_flop_per_s == pytest.approx(2 * 16896 * 1.5e9)
    assert roof.peak_dram_bytes_per_s == pytest.approx(1920 * 2.5e9)
    assert roof.intensity_flop_per_byte == pytest.approx(160 * 1.5e9 / 1e12)
    assert roof.ridge_flop_per_byte == pytest.approx(2 * 16896 * 1.5e9 / (1920 * 2.5e9))
    assert roof.bound == "memory"
    assert roof.dram_pct == pytest.approx(100 * 1e12 / (1920 * 2.5e9))


def test_no_fp32_work_is_not_placed_and_missing_metrics_give_no_roofline() -> None:
    idle = roofline({**METRICS, "derived__smsp__sass_thread_inst_executed_op_ffma_pred_on_x2": 0.0,
                     "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum.per_cycle_elapsed": 0.0,
                     "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum.per_cycle_elapsed": 0.0})
    assert idle is not None and idle.bound is None
    cached = roofline({**METRICS, "dram__bytes.sum.per_second": 0.0})
    assert cached is not None and cached.intensity_flop_per_byte is None and cached.bound == "compute"
    missing = dict(METRICS)
    del missing["dram__bytes.sum.peak_sustained"]
    assert roofline(missing) is None


def test_stalls_largest_first_without_the_invisible_ones() -> None:
    profile = KernelProfile("k", metrics={
        stall_metric("long_scoreboard"): 6.0, stall_metric("barrier"): 3.0,
        stall_metric("selected"): 1.0, stall_metric("drain"): 0.001,
    })
    bars = stall_bars(profile)
    assert [reason for reason, _ in bars] == ["long_scoreboard", "barrier", "selected"]
    assert bars[0][1] == pytest.approx(60.0, rel=0.01)


def _attempt(kernel: str, file: str, technique: str, speedup: float | None, accepted: bool) -> Attempt:
    return Attempt("h", file, kernel, "s", technique, technique, "accepted" if accepted else "slower", accepted, speedup)


def test_history_of_one_kernel_in_log_order_and_the_best_speedup() -> None:
    attempts = [_attempt("a", "/x.cu", "t1", 1.2, True), _attempt("b", "/x.cu", "t2", 3.0, True),
                _attempt("a", "/y.cu", "t3", 9.0, True), _attempt("a", "/x.cu", "t4", 1.6, True),
                _attempt("a", "/x.cu", "t5", 0.9, False)]
    assert [h.technique for h in history(attempts, "a", "/x.cu")] == ["t1", "t4", "t5"]
    report = build_report("a", "/x.cu", None, attempts)
    assert report.best_speedup == pytest.approx(1.6)
    assert report.roofline is None and report.profile_note == "no profile yet"
