"""Reading real Nsight Compute output (recorded on an H200, tests/fixtures/ncu/README.md)."""

from __future__ import annotations

import gzip
import os

import pytest

from kernel_lsp.core.profile import KernelProfile
from kernel_lsp.services import ncu_reader as R
from kernel_lsp.services.proc import ProcResult

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ncu")
LOGS = os.path.join(FIX, "recorded", "logs")
REPORTS = os.path.join(FIX, "recorded", "reports")


def read(name: str) -> str:
    path = os.path.join(LOGS, name)
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read()


def test_numbers_in_ncu_formats():
    assert R.parse_number("2,230") == 2230.0
    assert R.parse_number("1,978,448,413.20") == pytest.approx(1978448413.2)
    assert R.parse_number("n/a") is None and R.parse_number("") is None and R.parse_number("(256, 1, 1)") is None
    assert R.short_name("void ns::saxpy<float>(float *, int)") == "saxpy"
    assert R.short_name("stream_triad(float *, const float *, const float *, float, int)") == "stream_triad"


def test_raw_page_mixed_with_ncu_log_and_program_output():
    records = R.parse_raw_csv(read("stream_cheap_stdout.out"))
    assert len(records) == 1
    r = records[0]
    assert r.name == "stream_triad" and r.full_name.startswith("stream_triad(float *")
    assert r.metrics["launch__grid_size"] == 131072.0 and r.metrics["launch__block_size"] == 256.0
    p = KernelProfile(r.name, metrics=r.metrics)
    assert p.memory_throughput_pct is not None and p.memory_throughput_pct > 60  # a STREAM triad on an H200
    assert p.duration_us is not None and 50 < p.duration_us < 2000


def test_full_raw_page_fills_the_signature():
    with gzip.open(os.path.join(FIX, "dataset", "bank_conflict_full.csv.gz"), "rt") as f:
        r = R.parse_raw_csv(f.read())[0]
    sig = KernelProfile(r.name, metrics=r.metrics).signature()
    assert sig["registers_per_thread"] == 16 and sig["block_threads"] == 1024 and sig["grid_blocks"] == 16384
    assert sig["shared_bytes_per_block"] == 4096
    assert sig["shared_bank_conflicts_per_request"] > 10  # a 32-way conflict on the column read
    assert sig["excessive_sectors_pct"] == 0
    assert 0 < sig["stall_short_scoreboard_pct"] < 100
    assert len(sig) >= 25


def test_details_page_rule_results():
    details = R.parse_details_csv(read("bank_conflict_full_export_details.out.gz"))
    _sections, rules, metrics = details[0]
    by_rule = {r.rule: r for r in rules}
    conflict = by_rule["UncoalescedSharedAccess"]
    assert conflict.kind == "OPT" and conflict.estimated_speedup_pct == pytest.approx(88.52)
    assert conflict.speedup_scope == "global" and "excessive wavefronts" in conflict.message
    assert by_rule["SOLBottleneck"].estimated_speedup_pct is None
    assert metrics["GPU Speed Of Light Throughput/Duration"] == 125536.0
    top = KernelProfile("k", rules=rules).top_rule
    # a global estimate ranks above a larger local one (HighPipeUtilization, 95 % local)
    assert top.rule == "UncoalescedSharedAccess"


def test_source_page_sums_lines_and_names_stall_reasons():
    lines = R.parse_source_csv(read("bank_conflict_full_export_source.out"))
    (path, per_line), = lines.items()
    assert path.endswith("programs/bank_conflict.cu")
    # line 16 reads tile[threadIdx.x][threadIdx.y]: the bank conflicts and the most samples
    hot = max(per_line.values(), key=lambda c: c.samples_total or 0)
    assert hot.line == 16 and hot.shared_excessive_wavefronts == 16252928
    assert hot.top_stall[0] == "short_scoreboard"
    assert per_line[12].top_stall[0] == "long_scoreboard"  # the global load
    assert all(c.line in range(7, 18) for c in per_line.values())


def test_cuda_only_source_view_has_no_counters():
    assert R.parse_source_csv(read("bank_conflict_source_export_cuda.out")) == {}


def test_strided_source_page_shows_excessive_global_sectors():
    (_, per_line), = R.parse_source_csv(read("strided_full_export_source.out")).items()
    worst = max(per_line.values(), key=lambda c: c.excessive_global_sectors or 0)
    assert worst.excessive_global_sectors > 0
    assert worst.line == 11  # out[i] = in[j] * 2.0f


def test_no_kernel_and_crash_outputs_are_explained():
    from kernel_lsp.services.profiler import explain_failure

    nokernel = ProcResult(("ncu",), 0, read("nokernel_cheap.out"), read("nokernel_cheap.err"), 1.0)
    assert "profiled no kernel named 'stream_trial'" in explain_failure(nokernel, "stream_trial", 60)
    crash = ProcResult(("ncu",), 9, read("crash_cheap.out"), read("crash_cheap.err"), 1.0)
    message = explain_failure(crash, "crash_null_write", 60)
    assert "exit 9" in message and "LaunchFailed" in message
    bad = ProcResult(("ncu",), 1, read("badsection.out"), "", 0.4)
    assert "did not match any section" in explain_failure(bad, "k", 60)
    perm = ProcResult(("ncu",), 1, "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", "", 1.0)
    assert "no permission to read GPU performance counters" in explain_failure(perm, "k", 60)
    hung = ProcResult(("ncu",), None, "", "", 120.0, timed_out=True)
    assert "did not finish" in explain_failure(hung, "k", 120)


def test_csv_fallback_runs_ncu_exports(monkeypatch):
    """Without ncu_report, read_report runs the three exports and joins them."""
    outputs = {
        "raw": read("stream_cheap_export_raw.out"),
        "details": read("stream_cheap_export_details.out"),
        "source": "",
    }
    calls = []

    def fake_run(argv, timeout_s, **_):
        calls.append(argv)
        if argv[1] == "--version":
            return ProcResult(tuple(argv), 0, "Version 2025.3.1.0 (build 1)", "", 0.1)
        page = argv[argv.index("--page") + 1]
        return ProcResult(tuple(argv), 0, outputs[page], "", 0.1)

    monkeypatch.setattr(R.proc, "which", lambda tool: "/usr/bin/ncu")
    (profile,) = R.read_report("r.ncu-rep", prefer_module=False, run=fake_run)
    assert profile.kernel == "stream_triad" and profile.ncu_version == "2025.3.1.0"
    assert profile.memory_throughput_pct > 60 and any(r.kind == "OPT" for r in profile.rules)
    assert sorted(c[c.index("--page") + 1] for c in calls if "--page" in c) == ["details", "raw", "source"]


def test_export_from_another_version_gives_a_clear_message():
    def old_ncu(argv, timeout_s, **_):
        return ProcResult(tuple(argv), 1, "", "==ERROR== Report version 12 is newer than the supported version 11.", 0.1)

    with pytest.raises(R.NcuReadError, match="different Nsight Compute version"):
        R.read_report("new.ncu-rep", prefer_module=False, run=old_ncu)


ncu_report = pytest.importorskip("ncu_report", reason="the ncu-report module is not installed")


def test_ncu_report_module_reads_metrics_rules_and_lines():
    path = os.path.join(REPORTS, "bank_conflict_source.ncu-rep")
    (record,) = R.records_from_module(ncu_report, path)
    assert record.name == "transpose_smem_conflict" and "gpu__time_duration.sum" in record.metrics
    rule = next(r for r in record.rules if r.rule == "UncoalescedSharedAccess")
    assert rule.kind == "OPT" and rule.speedup_scope == "global" and rule.estimated_speedup_pct == pytest.approx(88.87, abs=0.01)
    (path_in_report, per_line), = R.lines_from_module(ncu_report, path).items()
    assert path_in_report.endswith("bank_conflict.cu")
    assert per_line[16].shared_excessive_wavefronts == 16252928 and per_line[16].top_stall[0] == "short_scoreboard"


def test_module_and_csv_agree_on_the_source_lines():
    module_lines = next(iter(R.lines_from_module(ncu_report, os.path.join(REPORTS, "bank_conflict_source.ncu-rep")).values()))
    csv_lines = next(iter(R.parse_source_csv(read("bank_conflict_full_export_source.out")).values()))
    assert set(module_lines) == set(csv_lines)
    hottest = lambda lines: max(lines.values(), key=lambda c: c.samples_total or 0).line  # noqa: E731
    assert hottest(module_lines) == hottest(csv_lines) == 16


def test_read_report_prefers_the_module(monkeypatch):
    monkeypatch.setattr(R, "import_ncu_report", lambda ncu_path="ncu": ncu_report)
    (profile,) = R.read_report(os.path.join(REPORTS, "stream_cheap.ncu-rep"), run=None)
    assert profile.kernel == "stream_triad" and profile.memory_throughput_pct > 60
    assert profile.lines == {}  # the cheap pass has no source counters


def test_unreadable_report_is_an_error_value(tmp_path):
    bad = tmp_path / "bad.ncu-rep"
    bad.write_bytes(b"not a report")
    with pytest.raises(R.NcuReadError):
        R.records_from_module(ncu_report, str(bad))
