"""The real profiling path on a GPU: ncu through the harness launch and on a program (skipped without one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.services import profiler as prof

pytestmark = pytest.mark.gpu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROGRAMS = os.path.join(ROOT, "tests", "fixtures", "ncu", "programs")
# Looked up on PATH as named: the profiler runs "ncu" (Settings.ncu_path) and _build runs "nvcc".
GPU_TOOLS = ("ncu", "nvcc")


def _profiler(tmp_path, **settings) -> prof.Profiler:
    s = Settings(profile_store=str(tmp_path / "store"), profile_timeout_s=300.0, **settings)
    return prof.Profiler(s, prof.ProfileStore(s.profile_store))


def _build(tmp_path, name: str) -> str:
    exe = str(tmp_path / name)
    subprocess.run(["nvcc", "-arch=sm_90", "-lineinfo", "-O3", "-o", exe, os.path.join(PROGRAMS, f"{name}.cu")], check=True)
    return exe


def test_example_through_the_harness_launch(tmp_path):
    folder = os.path.join(ROOT, "examples", "streaming")
    source = os.path.join(folder, "original.cu")
    with open(source, encoding="utf-8") as f:
        text = f.read()
    target = prof.Target(source, text, "scale_add", spec_path=os.path.join(folder, "spec.json"))
    profiler = _profiler(tmp_path)
    first = profiler.profile(target)
    assert first.ok, first.message
    p = first.profile
    assert p.duration_us and p.duration_us > 0
    # the launcher's event-timed launches give the spread; ncu profiles one launch after them
    assert len(p.duration_samples_us) == prof.FIRST_TIMED_LAUNCHES and all(t > 0 for t in p.duration_samples_us)
    assert first.bottleneck.primary != "unknown" and p.tree_leaf == "fallback"
    assert p.lines == {}  # the tree collects metric groups only
    again = profiler.profile(target, use_cache=False)
    assert again.ok and again.profile.tree_path[0].branch in ("then", "else")  # measured facts now steer the tree
    assert len(again.profile.duration_samples_us) == prof.timed_launches(p.duration_us)
    full = profiler.profile(target, full=True, use_cache=False)
    assert full.ok and full.bottleneck.label == first.bottleneck.label == again.bottleneck.label
    assert full.profile.lines, "SourceCounters of the full profile map to lines"
    assert all(1 <= line <= text.count("\n") + 1 for line in full.profile.lines)
    assert full.profile.collection_wall_s > again.profile.collection_wall_s


def test_program_mode_finds_uncoalesced_access(tmp_path):
    exe = _build(tmp_path, "strided")
    with open(os.path.join(PROGRAMS, "strided.cu"), encoding="utf-8") as f:
        text = f.read()
    target = prof.Target(os.path.join(PROGRAMS, "strided.cu"), text, "strided_gather")
    result = _profiler(tmp_path, profile_program=exe).profile(target)
    assert result.ok, result.message
    assert result.bottleneck.label == "uncoalesced-access"
    # per-line counters when the user asks for them on every profile
    lined = _profiler(tmp_path / "lines", profile_program=exe, profile_line_counters=True).profile(target)
    assert lined.ok, lined.message
    assert lined.bottleneck.label == "uncoalesced-access"
    worst = max(lined.profile.lines.values(), key=lambda c: c.excessive_global_sectors or 0)
    assert worst.line == 11


def test_crashing_program_is_a_message(tmp_path):
    exe = _build(tmp_path, "crash")
    with open(os.path.join(PROGRAMS, "crash.cu"), encoding="utf-8") as f:
        text = f.read()
    result = _profiler(tmp_path, profile_program=exe).profile(prof.Target(os.path.join(PROGRAMS, "crash.cu"), text, "crash_null_write"))
    assert not result.ok and "failed under ncu" in result.message


def test_cli_profile_json(tmp_path):
    folder = os.path.join(ROOT, "examples", "streaming")
    out = subprocess.run(
        [sys.executable, "-m", "kernel_lsp", "profile", os.path.join(folder, "original.cu"), "--spec",
         os.path.join(folder, "spec.json"), "--json", "--cache-dir", str(tmp_path / "c")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["ok"] and data["bottleneck"]["primary"] and data["signature"]["duration_us"] > 0
