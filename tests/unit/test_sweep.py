"""``kernel-lsp sweep``: discovery and drafts, the local engine and a real local Ray cluster (CPU only:
the dry run, and a scripted verifier on a logical GPU), kept outcomes and verdicts, report, patches, --apply."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kernel_lsp import cli
from kernel_lsp.services import sweep
from kernel_lsp.services.kb import KnowledgeBase
from kernel_lsp.services.sweep import SweepOptions, discover, run_sweep

from sweep_verifiers import LoggingVerifier

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
WITH_SPECS = {"transpose": "transpose", "reduction": "chunk_sum"}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """Two kernels with sidecar specs, one file whose kernel has none."""
    folder = tmp_path / "src"
    (folder / "kernels").mkdir(parents=True)
    for example, kernel in WITH_SPECS.items():
        target = folder / "kernels" / f"{example}.cu"
        shutil.copy(EXAMPLES / example / "original.cu", target)
        shutil.copy(EXAMPLES / example / "spec.json", f"{target}.{kernel}.spec.json")
    shutil.copy(EXAMPLES / "gemv" / "original.cu", folder / "nospec.cu")
    return folder


def options(src: Path, tmp_path: Path, **changes) -> SweepOptions:
    fields = dict(out_dir=str(tmp_path / "out"), workspace_root=str(src), kb_path=str(tmp_path / "kb.sqlite3"),
                  budget_candidates=4)
    fields.update(changes)
    return SweepOptions(**fields)


def by_kernel(report: sweep.SweepReport) -> dict[str, sweep.KernelOutcome]:
    return {o.kernel: o for o in report.outcomes}


def test_discovery_finds_spec_kernels_and_drafts_the_others(src, tmp_path):
    found = discover([str(src)], options(src, tmp_path))
    assert sorted(j.kernel for j in found.jobs) == sorted(WITH_SPECS.values())
    assert {j.rel for j in found.jobs} == {f"kernels/{e}.cu" for e in WITH_SPECS}
    assert all(j.spec_origin == "sidecar" for j in found.jobs)
    [draft] = found.drafts
    assert (draft.path, draft.kernel) == ("nospec.cu", "gemv")
    assert draft.todo and Path(draft.draft_path).is_file()
    assert json.loads(Path(draft.draft_path).read_text())["kernel"] == "gemv"
    assert str(tmp_path / "out") in draft.draft_path  # never beside the user's file
    assert not (src / "nospec.cu.gemv.spec.json").exists()
    # A compile database names the files instead of a folder.
    (src / "compile_commands.json").write_text(json.dumps([
        {"directory": str(src / "kernels"), "file": "transpose.cu", "arguments": ["nvcc", "-c", "transpose.cu"]}]))
    only = discover([str(src / "compile_commands.json")], options(src, tmp_path))
    assert [j.kernel for j in only.jobs] == ["transpose"] and only.drafts == ()


def test_the_projects_own_specs_are_found_beside_their_kernel_files(tmp_path):
    """``examples/*/spec.json`` beside ``original.cu`` (its rewrites and cheats beside it are left out) and
    ``benchmarks/corpus/*/spec.json`` beside ``kernel.cu``: every one a kernel to sweep, nothing drafted."""
    opts = options(ROOT, tmp_path)
    found = discover([str(EXAMPLES)], opts)
    examples = sorted(p.parent.name for p in EXAMPLES.glob("*/spec.json"))
    assert sorted(j.rel for j in found.jobs) == [f"examples/{name}/original.cu" for name in examples]
    for job in found.jobs:
        assert job.spec_origin == "spec.json"
        assert job.kernel == json.loads((EXAMPLES / Path(job.rel).parent.name / "spec.json").read_text())["kernel"]
    assert found.drafts == () and found.problems == ()
    assert len(found.left_out) == len(examples) and all("left out as its candidates" in n for n in found.left_out)
    assert not (tmp_path / "out" / "drafts").exists()

    corpus = ROOT / "benchmarks" / "corpus"
    entries = sorted(p.parent.name for p in corpus.glob("*/spec.json"))
    found = discover([str(corpus)], opts)
    assert sorted(j.rel for j in found.jobs) == [f"benchmarks/corpus/{name}/kernel.cu" for name in entries]
    assert found.drafts == () and found.problems == () and found.left_out == ()


def test_a_folder_spec_yields_to_a_sidecar_and_says_when_it_cannot_tell_its_file(src, tmp_path):
    folder = src / "two"
    folder.mkdir()
    for name in ("a.cu", "b.cu"):
        shutil.copy(EXAMPLES / "transpose" / "original.cu", folder / name)
    shutil.copy(EXAMPLES / "transpose" / "spec.json", folder / "spec.json")
    found = discover([str(folder)], options(src, tmp_path))
    assert found.jobs == () and found.drafts == ()
    [problem] = found.problems
    assert "two: spec.json names transpose, which a.cu, b.cu define" in problem and "FILE.cu.KERNEL.spec.json" in problem
    # A sidecar names its file: it wins for that file; the other is still not drafted over the folder's spec.
    shutil.copy(folder / "spec.json", folder / "b.cu.transpose.spec.json")
    found = discover([str(folder)], options(src, tmp_path))
    assert [(j.rel, j.spec_origin) for j in found.jobs] == [("two/b.cu", "sidecar")] and found.drafts == ()
    # JSON without a kernel name is another tool's spec.json, not a launch spec: ignored.
    (folder / "spec.json").write_text('{"name": "a build tool\'s file"}')
    found = discover([str(folder)], options(src, tmp_path))
    assert [d.path for d in found.drafts] == ["two/a.cu"] and found.problems == ()


def test_drafts_are_short_relative_paths_in_the_sweep_folder_one_line_each(src, tmp_path, monkeypatch, capsys):
    # The files lie outside the workspace root: their drafts still go below the sweep's folder, relative to
    # the folder the swept files share (an absolute path used to become drafts/tmp/.../nospec.cu...).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = discover([str(src)], options(src, tmp_path, workspace_root=str(elsewhere)))
    [draft] = found.drafts
    assert draft.draft_path == str(tmp_path / "out" / "drafts" / "nospec.cu.gemv.spec.json")
    assert draft.path == str(src / "nospec.cu") and draft.placeholders > 0
    monkeypatch.chdir(elsewhere)
    assert cli.main(["sweep", str(src / "nospec.cu"), "--dry-run", "--no-kb", "--out", str(tmp_path / "o2")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "nospec.cu" in line]
    assert lines == [f"kernel-lsp sweep: no launch spec for {src / 'nospec.cu'}:gemv; draft "
                     f"{tmp_path / 'o2' / 'drafts' / 'nospec.cu.gemv.spec.json'} ({draft.placeholders} values to fill in)"]
    assert (tmp_path / "o2" / "drafts" / "nospec.cu.gemv.spec.json").is_file()


def test_a_dry_run_says_listed_never_optimized(src, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(src)
    out = tmp_path / "dry"
    assert cli.main(["sweep", ".", "--dry-run", "--no-kb", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "optimized" not in printed.out and "faster" not in printed.out
    summary = printed.out.strip().splitlines()[-1]
    assert summary.startswith("dry run: ") and "candidates listed for 2 kernels, nothing verified" in summary
    assert "candidates listed" in printed.err and "accepted" not in printed.err
    page = (out / "sweep.html").read_text()
    assert "(dry run)" in page and "candidates listed" in page and "optimized" not in page
    assert json.loads((out / "sweep.json").read_text())["dry_run"] is True


def test_keys_change_with_the_kernel_the_spec_and_the_settings(src, tmp_path):
    base = {j.kernel: j.key for j in discover([str(src)], options(src, tmp_path)).jobs}
    assert base == {j.kernel: j.key for j in discover([str(src)], options(src, tmp_path)).jobs}
    other_settings = {j.kernel: j.key for j in discover([str(src)], options(src, tmp_path, seed=7)).jobs}
    assert set(other_settings.values()).isdisjoint(base.values())
    path = src / "kernels" / "transpose.cu"
    path.write_text(path.read_text() + "\n// edited\n")
    edited = {j.kernel: j.key for j in discover([str(src)], options(src, tmp_path)).jobs}
    assert edited["transpose"] != base["transpose"] and edited["chunk_sum"] == base["chunk_sum"]


def test_local_sweep_reports_patches_and_resumes_without_verifying_again(src, tmp_path):
    opts = options(src, tmp_path)
    verifier = LoggingVerifier(str(tmp_path / "verified.log"))
    found = discover([str(src)], opts)
    report = run_sweep(found, opts, verifier=verifier, stream=open(os.devnull, "w"))
    outcomes = by_kernel(report)
    assert report.ran == 2 and outcomes["transpose"].status == "accepted"
    assert outcomes["transpose"].speedup == 2.4 and outcomes["transpose"].technique == "transpose-via-shared-memory"
    verified = verifier.calls()
    assert len(verified) == sum(o.verified for o in report.outcomes) > 0
    assert len(set(verified)) == len(verified)
    # Every verdict reached the knowledge base, through the session.
    with KnowledgeBase.open(opts.kb_path) as kb:
        assert len(kb.attempts()) == len(verified)

    out = Path(opts.out_dir)
    data = json.loads((out / "sweep.json").read_text())
    assert {o["kernel"]: o["status"] for o in data["outcomes"]} == {k: o.status for k, o in outcomes.items()}
    assert data["drafts"][0]["kernel"] == "gemv"
    page = (out / "sweep.html").read_text()
    assert "<svg" in page and "kernels/transpose.cu:transpose" in page and "2.40x" in page
    patches = sorted(p.name for p in (out / "patches").iterdir())
    assert patches == sorted(sweep.patch_name(o) for o in report.accepted)
    patch = (out / "patches" / sweep.patch_name(outcomes["transpose"])).read_text()
    assert patch.startswith("--- a/kernels/transpose.cu\n+++ b/kernels/transpose.cu\n") and "+" in patch

    again = run_sweep(discover([str(src)], opts), opts, verifier=verifier, stream=open(os.devnull, "w"))
    assert again.ran == 0 and verifier.calls() == verified
    assert again.outcomes == report.outcomes

    path = src / "kernels" / "reduction.cu"
    path.write_text(path.read_text() + "\n// edited\n")
    third = run_sweep(discover([str(src)], opts), opts, verifier=verifier, stream=open(os.devnull, "w"))
    assert third.ran == 1 and by_kernel(third)["transpose"] == outcomes["transpose"]
    assert len(verifier.calls()) == len(verified) + by_kernel(third)["chunk_sum"].verified


def test_progress_is_a_bar_on_a_terminal_and_lines_otherwise():
    outcome = sweep.KernelOutcome(key="k", path="/a.cu", rel="a.cu", kernel="k1", status="accepted", original_sha256="x")

    class Terminal(list):
        def write(self, text):
            self.append(text)

        def flush(self):
            pass

        def isatty(self):
            return True

    screen = Terminal()
    bar = sweep.Progress(2, 0, screen, clock=iter([0.0, 3.0, 5.0]).__next__)
    bar.update(outcome)
    assert screen[-1].startswith("\r") and "1/2 kernels, 1 accepted, 3 s" in screen[-1] and "#" * 12 in screen[-1]
    bar.update(outcome)
    assert screen[-1] == "\n" and "2/2" in screen[-2]


def _git(folder: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True, env=env).stdout


def test_apply_needs_a_clean_tree_and_skips_files_changed_since_verified(src, tmp_path):
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "kernels")
    opts = options(src, tmp_path, out_dir=str(src / "kernel-lsp-sweep"))
    verifier = LoggingVerifier(str(tmp_path / "verified.log"))
    report = run_sweep(discover([str(src)], opts), opts, verifier=verifier, stream=open(os.devnull, "w"))
    accepted = by_kernel(report)
    assert {"transpose", "chunk_sum"} <= set(k for k, o in accepted.items() if o.status == "accepted")
    printed = {o["kernel"]: o for o in sweep.report_json(report)["outcomes"]}
    assert printed["transpose"]["patch_file"].endswith(".patch") and "patch" not in printed["transpose"]
    transpose = src / "kernels" / "transpose.cu"
    reduction = src / "kernels" / "reduction.cu"
    original_transpose = transpose.read_text()

    (src / "nospec.cu").write_text("// uncommitted\n")
    refused = sweep.apply_patches(report, opts.out_dir, str(src))
    assert refused.applied == () and "uncommitted changes" in refused.refused and "nospec.cu" in refused.refused
    assert transpose.read_text() == original_transpose
    _git(src, "checkout", "nospec.cu")

    # The reduction changes (and is committed) after its rewrite was verified: its patch must not be applied.
    reduction.write_text(reduction.read_text() + "// later work\n")
    _git(src, "commit", "-qam", "later work")
    result = sweep.apply_patches(report, opts.out_dir, str(src))
    assert result.refused is None and result.applied == ("kernels/transpose.cu:transpose",)
    assert len(result.skipped) == 1 and "kernels/reduction.cu:chunk_sum" in result.skipped[0]
    assert "changed since" in result.skipped[0]
    assert reduction.read_text().endswith("// later work\n")
    applied = transpose.read_text()
    assert applied != original_transpose and "__shared__" in applied and "kl_tile" in applied
    diff = _git(src, "diff", "--", "kernels/transpose.cu")
    patch = (Path(opts.out_dir) / "patches" / sweep.patch_name(accepted["transpose"])).read_text()
    changed = lambda text: [line for line in text.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed(diff) == changed(patch)


def test_unified_patch_marks_a_last_line_without_newline(tmp_path):
    before, after = "a\nb", "a\nc"
    patch = sweep.unified_patch("f.cu", before, after)
    (tmp_path / "f.cu").write_text(before)
    (tmp_path / "p.patch").write_text(patch)
    applied = subprocess.run(["git", "apply", "p.patch"], cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert (tmp_path / "f.cu").read_text() == after


# --------------------------------------------------------------------------- a real local Ray cluster


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray cluster of this machine: 2 CPUs and one logical GPU (``num_gpus=1`` tasks are placed on it;
    no CUDA is touched: the verifier is scripted). Its workers import the tests' verifiers from PYTHONPATH."""
    ray = pytest.importorskip("ray")
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(Path(__file__).parent), *([saved] if saved else [])])
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="WARNING", configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def test_ray_dry_run_through_the_cli_matches_the_local_one(ray_cluster, src, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(src)
    local_out, ray_out = tmp_path / "local", tmp_path / "ray"
    assert cli.main(["sweep", ".", "--dry-run", "--no-kb", "--out", str(local_out), "--json"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert cli.main(["sweep", ".", "--dry-run", "--no-kb", "--engine", "ray", "--out", str(ray_out), "--json"]) == 0
    captured = capsys.readouterr()
    remote = json.loads(captured.out)
    assert "sweep [" in captured.err and "no launch spec for nospec.cu:gemv; draft " in captured.err
    assert remote["engine"] == "ray" and remote["ran"] == 2
    summary = lambda d: sorted((o["kernel"], o["status"], o["candidates"]) for o in d["outcomes"])
    assert summary(remote) == summary(local)
    assert all(status == "listed" and n > 0 for _, status, n in summary(remote))
    # --json prints what sweep.json holds: patches named by file, never inlined.
    assert all("patch_file" in o and "patch" not in o for o in remote["outcomes"])


def test_ray_retries_a_lost_worker_and_nothing_is_verified_twice(ray_cluster, src, tmp_path):
    opts = options(src, tmp_path)
    marker = tmp_path / "crashed"
    verifier = LoggingVerifier(str(tmp_path / "verified.log"), crash_marker=str(marker))
    report = run_sweep(discover([str(src)], opts), opts, engine="ray", verifier=verifier, stream=open(os.devnull, "w"))
    assert marker.exists()  # a worker died in the middle of a kernel
    outcomes = by_kernel(report)
    assert outcomes["transpose"].status == "accepted" and outcomes["transpose"].speedup == 2.4
    assert all(o.status in ("accepted", "none-faster") for o in report.outcomes)
    calls = verifier.calls()
    assert Counter(calls).most_common(1)[0][1] == 1  # no candidate verified twice
    assert len(calls) == sum(o.verified for o in report.outcomes)
    # The retried task found its first attempt's verdict kept, and did not record it in the knowledge base again.
    assert sum(o.reused_verdicts for o in report.outcomes) == 1
    with KnowledgeBase.open(opts.kb_path) as kb:
        assert len(kb.attempts()) == len(calls)

    local_opts = options(src, tmp_path, out_dir=str(tmp_path / "local"), kb_path=str(tmp_path / "local.sqlite3"))
    local = run_sweep(discover([str(src)], local_opts), local_opts, verifier=LoggingVerifier(str(tmp_path / "l.log")),
                      stream=open(os.devnull, "w"))
    strip = lambda o: (o.kernel, o.status, o.technique, o.speedup, o.candidates, o.verified, o.patch)
    assert sorted(map(strip, report.outcomes)) == sorted(map(strip, local.outcomes))


def test_ray_engine_without_ray_installed_says_how_to_get_it(src, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    monkeypatch.chdir(src)
    assert cli.main(["sweep", ".", "--dry-run", "--no-kb", "--engine", "ray", "--out", str(tmp_path / "out")]) == 2
    assert "pip install 'kernel-lsp[ray]'" in capsys.readouterr().err
    assert cli.main(["sweep", ".", "--address", "auto", "--out", str(tmp_path / "out")]) == 2
    assert "--address needs --engine ray" in capsys.readouterr().err
