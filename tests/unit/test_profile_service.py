"""The profiler service with a stand-in for ncu that writes recorded reports (no GPU needed).

The stand-in copies a report recorded on an H200 to the path given with ``-o`` and prints
ncu's pass count, so planning, argv, reading (``ncu_report``), caching, regressions and
failure handling run for real.
"""

from __future__ import annotations

import os
import shutil

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.services import profiler as prof
from kernel_lsp.services.proc import ProcResult

pytest.importorskip("ncu_report", reason="reads the recorded .ncu-rep files")

REPORTS = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ncu", "recorded", "reports")
SOURCE = "__global__ void transpose_smem_conflict(float *out, const float *in, int w) { out[0] = in[0]; }\n"


class FakeNcu:
    """Answers ncu calls from a queue of (report name | failure output)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def __call__(self, argv, timeout_s, cwd=None, env=None, cancel=None, **_):
        argv = list(argv)
        self.calls.append(argv)
        answer = self.answers.pop(0)
        if isinstance(answer, ProcResult):
            return answer
        base = argv[argv.index("-o") + 1]
        shutil.copy(os.path.join(REPORTS, f"{answer}.ncu-rep"), base + ".ncu-rep")
        return ProcResult(tuple(argv), 0, '==PROF== Profiling "k" - 0: 0%....100% - 10 passes\n', "", 2.0)


@pytest.fixture
def make(tmp_path, monkeypatch):
    monkeypatch.setattr(prof.proc, "which", lambda tool: "/usr/bin/" + os.path.basename(tool))
    source = tmp_path / "k.cu"
    source.write_text(SOURCE)

    def build(fake, **settings):
        s = Settings(profile_store=str(tmp_path / "store"), **settings)
        profiler = prof.Profiler(s, prof.ProfileStore(s.profile_store), run=fake)
        target = prof.Target(str(source), source.read_text(), "transpose_smem_conflict", program="/bin/app",
                             program_args=("--size", "4096"))
        return profiler, target

    return build


def test_first_profile_is_one_run_with_the_fallback_leaf(make):
    fake = FakeNcu("bank_conflict_source")
    profiler, target = make(fake)
    result = profiler.profile(target)
    assert result.ok and result.message is None
    (argv,) = fake.calls
    assert argv[:3] == ["ncu", "--clock-control", "none"]
    sections = [argv[i + 1] for i, a in enumerate(argv) if a == "--section"]
    assert sections[:3] == ["SpeedOfLight", "LaunchStats", "Occupancy"] and "SourceCounters" in sections
    assert "--import-source" in argv and argv[argv.index("-k") + 1] == "regex:^transpose_smem_conflict(<|$)"
    assert argv[argv.index("--launch-count") + 1] == str(prof.TIMING_LAUNCHES)
    assert argv[-3:] == ["/bin/app", "--size", "4096"]
    p = result.profile
    assert p.tree_leaf == "fallback" and p.tree_path[0].branch == "missing" and p.passes == 10
    assert p.lines[16].shared_excessive_wavefronts == 16252928
    assert result.bottleneck is not None and result.plan.runs == (tuple(sections),)


def test_repeat_profile_uses_previous_facts_cache_and_regression(make):
    fake = FakeNcu("stream_cheap", "bank_conflict_source")
    profiler, target = make(fake)
    first = profiler.profile(target)
    again = profiler.profile(target)
    assert again.cached and len(fake.calls) == 1  # same content and settings: no ncu run
    changed = prof.Target(target.source_path, target.source_text + "// edited\n", target.kernel, program=target.program)
    second = profiler.profile(changed)
    # the previous profile (a memory-bound STREAM triad) steers the tree to the memory leaf, in one run
    assert second.profile.tree_leaf == "memory_tables"
    assert [s.branch for s in second.profile.tree_path] == ["then", "then"]
    assert second.regression is not None
    assert second.regression.previous_us == pytest.approx(first.profile.duration_us)
    assert second.regression.current_us == pytest.approx(126.336)


def test_failures_keep_the_last_good_profile_marked_stale(make):
    denied = ProcResult(("ncu",), 1, "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", "", 1.0)
    hung = ProcResult(("ncu",), None, "", "", 120.0, timed_out=True)
    fake = FakeNcu("bank_conflict_source", denied, hung)
    profiler, target = make(fake)
    good = profiler.profile(target)
    edited = prof.Target(target.source_path, target.source_text + "//1\n", target.kernel, program=target.program)
    failed = profiler.profile(edited)
    assert "ERR_NVGPUCTRPERM" in failed.message and not failed.ok
    assert failed.profile.stale and failed.profile.metrics == good.profile.metrics
    timed_out = profiler.profile(prof.Target(edited.source_path, edited.source_text + "//2\n", edited.kernel, program=edited.program))
    assert "did not finish" in timed_out.message and timed_out.profile.stale


def test_missing_ncu_and_missing_spec_are_messages(tmp_path, monkeypatch):
    s = Settings(ncu_path="/nonexistent/ncu", profile_store=str(tmp_path / "s"))
    profiler = prof.Profiler(s, prof.ProfileStore(s.profile_store), run=FakeNcu())
    target = prof.Target(str(tmp_path / "k.cu"), SOURCE, "transpose_smem_conflict", program="/bin/app")
    result = profiler.profile(target)
    assert result.profile is None and "was not found" in result.message
    monkeypatch.setattr(prof.proc, "which", lambda tool: "/usr/bin/ncu")
    no_spec = prof.Profiler(Settings(profile_store=str(tmp_path / "s")), prof.ProfileStore(str(tmp_path / "s")), run=FakeNcu())
    result = no_spec.profile(prof.Target(str(tmp_path / "k.cu"), SOURCE, "transpose_smem_conflict"))
    assert "no launch spec" in result.message and "Create launch spec for transpose_smem_conflict" in result.message


def test_sidecar_and_inline_specs_are_found(tmp_path):
    source = tmp_path / "k.cu"
    inline = '// kernel-lsp: spec {"params": [], "grid": [1,1,1], "block": [32,1,1]}\n' + SOURCE
    path, data, problem = prof.find_spec(str(source), inline, "transpose_smem_conflict")
    assert path is None and data["block"] == [32, 1, 1] and problem is None
    sidecar = prof.sidecar_path(str(source), "transpose_smem_conflict")
    assert sidecar.endswith("k.cu.transpose_smem_conflict.spec.json")
    open(sidecar, "w").write("{}")
    assert prof.find_spec(str(source), inline, "transpose_smem_conflict")[0] == sidecar


def test_ptxas_facts_from_the_compile_log():
    log = (
        "ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z1kPf\n"
        "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 168 registers, used 1 barriers, 4096 bytes smem, 360 bytes cmem[0]\n"
    )
    facts = prof.static_facts(None, "", log, "_Z1kPf")
    assert facts == {"ptxas.registers": 168.0, "ptxas.smem_bytes": 4096.0, "ptxas.spill_bytes": 8.0}


def test_source_watcher_reports_cuda_files_only(tmp_path):
    import threading

    from kernel_lsp.services.watch import SourceWatcher, is_watched

    assert is_watched("/w/src/k.cu") and is_watched("/w/k.cuh") and not is_watched("/w/build/k.cu")
    assert not is_watched("/w/.git/k.cu") and not is_watched("/w/notes.txt")
    seen: list[str] = []
    changed = threading.Event()

    def on_change(path: str) -> None:
        seen.append(path)
        changed.set()

    watcher = SourceWatcher.start(str(tmp_path), on_change)
    assert watcher is not None
    try:
        (tmp_path / "notes.txt").write_text("x")
        (tmp_path / "k.cu").write_text(SOURCE)
        assert changed.wait(10.0)
    finally:
        watcher.stop()
    assert seen and all(p.endswith("k.cu") for p in seen)
