"""The profiler service with a stand-in for ncu that writes recorded reports (no GPU needed).

The stand-in prints a raw CSV recorded on an H200 (a run of metric groups) or copies a
recorded report to the path given with ``-o`` (a run with a section), and prints ncu's
pass count, so planning, argv, reading, caching, regressions and failure handling run
for real.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.core import profile as P
from kernel_lsp.core import profiling_tree as T
from kernel_lsp.services import profiler as prof
from kernel_lsp.services.proc import ProcResult

pytest.importorskip("ncu_report", reason="reads the recorded .ncu-rep files")

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ncu")
REPORTS = os.path.join(FIXTURES, "recorded", "reports")
LOGS = os.path.join(FIXTURES, "recorded", "logs")
DATASET = os.path.join(FIXTURES, "dataset")
SOURCE = "__global__ void transpose_smem_conflict(float *out, const float *in, int w) { out[0] = in[0]; }\n"


def _recorded_csv(name: str) -> str:
    """A raw-page CSV recorded on the H200 (``dataset/*.csv.gz`` full profiles, ``recorded/logs/*.out``)."""
    for folder in (DATASET, LOGS):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8") as f:
                return f.read()
    raise FileNotFoundError(name)


class FakeNcu:
    """Answers ncu calls from a queue: a report name (copied to ``-o``), ``csv:FILE`` (a recorded raw
    CSV printed on stdout, as a run with ``--csv --page raw`` does) or a ProcResult (a failure).

    When the launcher's ``--timings-file`` is in the argv, the fake writes ``timings`` there first,
    as the launcher does before its profiled launch.
    """

    def __init__(self, *answers, timings=None):
        self.answers = list(answers)
        self.timings = timings
        self.calls: list[list[str]] = []

    def __call__(self, argv, timeout_s, cwd=None, env=None, cancel=None, **_):
        argv = list(argv)
        self.calls.append(argv)
        if argv[1:] == ["--version"]:
            return ProcResult(tuple(argv), 0, "Version 2025.3.1.0 (build 36398880) (public-release)\n", "", 0.1)
        answer = self.answers.pop(0)
        if isinstance(answer, ProcResult):
            return answer
        if self.timings is not None and "--timings-file" in argv:
            with open(argv[argv.index("--timings-file") + 1], "w", encoding="utf-8") as f:
                json.dump(self.timings, f)
        log = '==PROF== Profiling "k" - 0: 0%....100% - 10 passes\n'
        if answer.startswith("csv:"):
            return ProcResult(tuple(argv), 0, "program output\n" + log + _recorded_csv(answer[4:]), "", 2.0)
        base = argv[argv.index("-o") + 1]
        shutil.copy(os.path.join(REPORTS, f"{answer}.ncu-rep"), base + ".ncu-rep")
        return ProcResult(tuple(argv), 0, log, "", 2.0)


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


def _metrics_asked(argv: list[str]) -> list[str]:
    return argv[argv.index("--metrics") + 1].split(",") if "--metrics" in argv else []


def test_first_profile_is_one_run_of_metric_groups_read_from_ncu_output(make):
    fake = FakeNcu("csv:bank_conflict_full.csv.gz")
    profiler, target = make(fake)
    result = profiler.profile(target)
    assert result.ok and result.message is None
    (argv,) = [c for c in fake.calls if c[1:] != ["--version"]]
    assert argv[:3] == ["ncu", "--clock-control", "none"]
    assert "--section" not in argv and "-o" not in argv and "--set" not in argv
    # no section: no rules to apply, and the raw page comes back on stdout (no report, no export process)
    assert argv[argv.index("--apply-rules") + 1] == "no"
    assert argv[argv.index("--page") + 1] == "raw" and "--csv" in argv
    fallback = profiler.tree.node("fallback")
    assert _metrics_asked(argv) == list(T.split_items(profiler.tree.first_pass + fallback.collect)[1])
    assert argv[argv.index("-k") + 1] == "regex:^transpose_smem_conflict(<|$)"
    assert argv[argv.index("--launch-count") + 1] == "1" and "--launch-skip" not in argv
    assert "--kill" not in argv  # the user's program is never cut short
    assert argv[-3:] == ["/bin/app", "--size", "4096"]
    p = result.profile
    assert p.tree_leaf == "fallback" and p.tree_path[0].branch == "missing" and p.passes == 10
    assert p.lines == {} and p.ncu_version == "2025.3.1.0"
    assert result.bottleneck.label == "shared-bank-conflicts"
    assert result.plan.runs == (profiler.tree.first_pass + fallback.collect,)


def test_repeat_profile_uses_previous_facts_cache_and_regression(make):
    fake = FakeNcu("csv:stream_full.csv.gz", "csv:bank_conflict_full.csv.gz")
    profiler, target = make(fake)
    first = profiler.profile(target)
    again = profiler.profile(target)
    assert again.cached and len([c for c in fake.calls if "--metrics" in c]) == 1  # same content and settings
    changed = prof.Target(target.source_path, target.source_text + "// edited\n", target.kernel, program=target.program)
    second = profiler.profile(changed)
    # the previous profile (a memory-bound STREAM triad) steers the tree to the memory leaf, in one run
    assert second.profile.tree_leaf == "memory_causes" and second.profile.state_from == "profile"
    assert [s.branch for s in second.profile.tree_path] == ["then", "then"]
    asked = _metrics_asked([c for c in fake.calls if "--metrics" in c][-1])
    assert P.M_GLOBAL_SECTORS_IDEAL in asked and P.stall_metric("barrier") not in asked
    assert second.regression is not None
    assert second.regression.previous_us == pytest.approx(first.profile.duration_us)
    assert second.regression.current_us == pytest.approx(second.profile.duration_us)
    assert second.profile.duration_us > first.profile.duration_us * 1.03


def test_line_counters_setting_adds_source_counters_and_reads_the_report(make):
    fake = FakeNcu("bank_conflict_source")
    profiler, target = make(fake, profile_line_counters=True)
    result = profiler.profile(target)
    assert result.ok
    argv = next(c for c in fake.calls if "-o" in c)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--section"] == ["SourceCounters"]
    assert "--import-source" in argv and "--apply-rules" not in argv and "--metrics" in argv
    assert result.profile.lines[16].shared_excessive_wavefronts == 16252928


def test_failures_keep_the_last_good_profile_marked_stale(make):
    denied = ProcResult(("ncu",), 1, "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", "", 1.0)
    hung = ProcResult(("ncu",), None, "", "", 120.0, timed_out=True)
    garbage = ProcResult(("ncu",), 0, "==PROF== done\nnot a csv\n", "", 1.0)
    fake = FakeNcu("csv:bank_conflict_full.csv.gz", denied, hung, garbage)
    profiler, target = make(fake)
    good = profiler.profile(target)
    edited = prof.Target(target.source_path, target.source_text + "//1\n", target.kernel, program=target.program)
    failed = profiler.profile(edited)
    assert "ERR_NVGPUCTRPERM" in failed.message and not failed.ok
    assert failed.profile.stale and failed.profile.metrics == good.profile.metrics
    timed_out = profiler.profile(prof.Target(edited.source_path, edited.source_text + "//2\n", edited.kernel, program=edited.program))
    assert "did not finish" in timed_out.message and timed_out.profile.stale
    unreadable = profiler.profile(prof.Target(edited.source_path, edited.source_text + "//3\n", edited.kernel, program=edited.program))
    assert "CSV" in unreadable.message and unreadable.profile.stale


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="harness mode compiles the kernel with nvcc")
def test_harness_mode_profiles_one_launch_after_the_timed_ones(tmp_path, monkeypatch):
    real_which = prof.proc.which
    monkeypatch.setattr(prof.proc, "which", lambda tool: real_which(tool) or "/usr/bin/" + os.path.basename(tool))
    source = tmp_path / "t.cu"
    source.write_text("__global__ void transpose_smem_conflict(float *out, const float *in, int w) { out[0] = in[0]; }\n")
    spec = {"kernel": "transpose_smem_conflict", "grid": [1, 1, 1], "block": [32, 1, 1],
            "params": [{"name": "out", "kind": "array", "dtype": "float32", "shape": [32], "role": "out"},
                       {"name": "in", "kind": "array", "dtype": "float32", "shape": [32], "role": "in"},
                       {"name": "w", "kind": "scalar", "dtype": "int32", "value": 32}]}
    timings = [101.0, 99.0, 100.0, 100.5]
    fake = FakeNcu("csv:bank_conflict_full.csv.gz", timings=timings)
    s = Settings(profile_store=str(tmp_path / "store"))
    profiler = prof.Profiler(s, prof.ProfileStore(s.profile_store), run=fake)
    result = profiler.profile(prof.Target(str(source), source.read_text(), "transpose_smem_conflict", spec_data=spec))
    assert result.ok, result.message
    argv = next(c for c in fake.calls if "--metrics" in c)
    launcher = argv[argv.index("-m") + 1:]
    assert launcher[0] == "kernel_lsp.services.harness.launch"
    assert launcher[launcher.index("--timed") + 1] == str(prof.FIRST_TIMED_LAUNCHES)
    # the warm-up and the timed launches run unprofiled; ncu profiles the next one and ends the launcher
    assert argv[argv.index("--launch-skip") + 1] == str(prof.FIRST_TIMED_LAUNCHES + 1)
    assert argv[argv.index("--launch-count") + 1] == "1" and argv[argv.index("--kill") + 1] == "yes"
    assert argv[argv.index("--kernel-name-base") + 1] == "mangled"
    assert result.profile.duration_samples_us == tuple(timings)


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
    from kernel_lsp.core.nvcc_output import parse_resource_usage

    facts = prof.static_facts(None, "", parse_resource_usage(log)[0])
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


def test_timed_launches_fit_the_budget_by_the_previous_duration():
    assert prof.timed_launches(None) == prof.FIRST_TIMED_LAUNCHES
    assert prof.timed_launches(100.0) == prof.TIMED_LAUNCHES  # 0.1 ms: ten fit easily
    assert prof.timed_launches(250_000.0) == 4  # 0.25 s: four make a second
    assert prof.timed_launches(5_000_000.0) == 2  # a 5 s kernel still gets a spread of two


def test_a_source_leaf_marks_the_profile_for_the_optimizer(make, tmp_path):
    tree = tmp_path / "tree.json"
    tree.write_text(json.dumps({"format": T.FORMAT, "version": 2, "name": "t", "first_pass": ["group:throughput"],
                                "root": "src", "nodes": {"src": {"collect": [], "state_from": "source"}}}))
    profiler, target = make(FakeNcu("csv:bank_conflict_full.csv.gz"), profile_tree=str(tree))
    result = profiler.profile(target)
    assert result.ok and result.profile.tree_leaf == "src" and result.profile.state_from == "source"
    assert result.profile.metrics  # the first pass is still collected and shown
