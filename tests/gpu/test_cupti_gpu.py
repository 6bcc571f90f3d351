"""Profiling in the GPU worker through CUPTI, on a real GPU (skipped without one).

Needs the CUPTI wheels (``nvidia-cuda-cupti``, ``cupti-python``) on the path, as
``tests/fixtures/cupti/run_final.sh`` installs them; ncu only for the comparison test.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.core import profile as P
from kernel_lsp.core.profiling_tree import parse_tree
from kernel_lsp.services import gpu_worker
from kernel_lsp.services import profiler as prof

pytestmark = pytest.mark.gpu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GPU_TOOLS = ("nvcc",)
STREAMING = os.path.join(ROOT, "examples", "streaming")

FAULT = 'extern "C" __global__ void poke(float* out, long long where) { *((float*)where + threadIdx.x) = out[0]; }\n'
HANG = ('extern "C" __global__ void spin(float* out, int n) {\n'
        '    volatile int k = 0;\n    while (n > 0) { k++; }\n    out[0] = k;\n}\n')


@pytest.fixture(scope="module")
def worker():
    w = gpu_worker.GpuWorker()
    yield w
    w.close()


#: A tree that collects the first pass and nothing more: every metric of it has a CUPTI collector.
FIRST_PASS_TREE = {"format": "kernel-lsp-profiling-tree", "version": 2, "name": "first-pass",
                   "first_pass": ["group:throughput"], "root": "done", "nodes": {"done": {"collect": []}}}


def _profiler(tmp_path, worker, tree=None, **settings) -> prof.Profiler:
    s = Settings(profile_store=str(tmp_path / "store"), profile_timeout_s=settings.pop("profile_timeout_s", 120.0),
                 **settings)
    return prof.Profiler(s, prof.ProfileStore(s.profile_store), worker=worker,
                         tree=parse_tree(tree) if tree is not None else None)


def _streaming() -> prof.Target:
    source = os.path.join(STREAMING, "original.cu")
    with open(source, encoding="utf-8") as f:
        return prof.Target(source, f.read(), "scale_add", spec_path=os.path.join(STREAMING, "spec.json"))


def _own(tmp_path, name: str, text: str, kernel: str, params: list[dict]) -> prof.Target:
    source = tmp_path / f"{name}.cu"
    source.write_text(text)
    spec = {"kernel": kernel, "params": params, "grid": [1, 1, 1], "block": [32, 1, 1]}
    return prof.Target(str(source), text, kernel, spec_data=spec)


def test_the_worker_starts_with_cupti(worker):
    info = worker.ensure()
    assert info.cupti_ok, info.cupti_error
    assert info.chip == "GH100" and info.startup_s < 30


def test_a_profile_in_the_worker_needs_no_ncu(tmp_path, worker):
    profiler = _profiler(tmp_path, worker, FIRST_PASS_TREE, ncu_path="/nonexistent/ncu")
    first = profiler.profile(_streaming())
    assert first.ok, first.message
    assert profiler.fallback_reason is None
    p = first.profile
    assert p.passes and p.passes > 0
    assert len(p.duration_samples_us) == prof.FIRST_TIMED_LAUNCHES and all(t > 0 for t in p.duration_samples_us)
    # the range profiler's duration and the events time the same kernel
    median = sorted(p.duration_samples_us)[1]
    assert 0.5 < p.duration_us / median < 2.0, (p.duration_us, p.duration_samples_us)
    assert 0 <= p.memory_throughput_pct <= 100 and 0 <= p.compute_throughput_pct <= 100
    assert p.metrics[P.M_GRID_SIZE] == (67108864 + 16383) // 16384 and p.metrics[P.M_REGISTERS] > 0
    assert first.bottleneck.primary != "unknown"
    again = profiler.profile(_streaming(), use_cache=False)
    assert again.ok and again.profile.collection_wall_s < 1.5, again.profile.collection_wall_s


def test_the_default_tree_in_the_worker(tmp_path, worker):
    # The first profile asks for ncu's source-level counts: CUPTI gives them or ncu makes that profile,
    # saying why. The next save (streaming is latency-bound: the stall leaf) is the worker's.
    profiler = _profiler(tmp_path, worker)
    first = profiler.profile(_streaming())
    assert first.ok, first.message
    reason = profiler.fallback_reason
    assert reason is None or "memory_" in reason, reason
    again = profiler.profile(_streaming(), use_cache=False)
    assert again.ok, again.message
    assert again.profile.tree_path[0].branch in ("then", "else")
    assert profiler.fallback_reason is None, profiler.fallback_reason
    assert again.bottleneck.label == first.bottleneck.label
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "cupti_default_tree.json"), "w", encoding="utf-8") as f:
            json.dump({"first_fallback": reason, "first_label": first.bottleneck.label, "again_leaf": again.profile.tree_leaf,
                       "again_label": again.bottleneck.label, "again_wall_s": again.profile.collection_wall_s,
                       "again_passes": again.profile.passes, "range_refused": sorted(worker.range_refused),
                       "sass_available": len(worker.info.sass_available or ())}, f, indent=1)


def test_a_faulting_kernel_is_a_message_and_the_worker_restarts(tmp_path, worker):
    profiler = _profiler(tmp_path, worker, FIRST_PASS_TREE)
    starts = worker.starts
    target = _own(tmp_path, "fault", FAULT, "poke",
                  [{"name": "out", "array": "float32", "size": "32", "init": "zeros", "role": "in"},
                   {"name": "where", "scalar": "int64", "value": 16}])
    failed = profiler.profile(target)
    assert not failed.ok and failed.message and "failed on the GPU" in failed.message, failed.message
    ok = profiler.profile(_streaming(), use_cache=False)
    assert ok.ok, ok.message
    assert worker.starts == starts + 1


def test_a_hanging_kernel_is_stopped_at_the_timeout(tmp_path, worker):
    profiler = _profiler(tmp_path, worker, FIRST_PASS_TREE, profile_timeout_s=8.0)
    target = _own(tmp_path, "hang", HANG, "spin",
                  [{"name": "out", "array": "float32", "size": "1", "init": "zeros", "role": "out"},
                   {"name": "n", "scalar": "int32", "value": 1}])
    failed = profiler.profile(target)
    assert not failed.ok and "did not finish within 8 s" in failed.message, failed.message
    assert profiler.profile(_streaming(), use_cache=False).ok


@pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu is not on PATH")
def test_cupti_values_agree_with_ncu(tmp_path, worker):
    # The same tree profile through ncu (no worker) and through CUPTI: the same kernel, the same metrics.
    by_ncu = _profiler(tmp_path / "ncu", None, FIRST_PASS_TREE).profile(_streaming())
    by_cupti = _profiler(tmp_path / "cupti", worker, FIRST_PASS_TREE).profile(_streaming())
    assert by_ncu.ok and by_cupti.ok, (by_ncu.message, by_cupti.message)
    a, b = by_ncu.profile.metrics, by_cupti.profile.metrics
    report = {m: (a.get(m), b.get(m)) for m in (P.M_DURATION_NS, P.M_MEMORY_PCT, P.M_SM_PCT, P.M_ACHIEVED_OCC, P.M_WAVES,
                                                  P.M_THEORETICAL_OCC, P.M_REGISTERS)}
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "cupti_vs_ncu.json"), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    assert b[P.M_DURATION_NS] == pytest.approx(a[P.M_DURATION_NS], rel=0.3), report
    for pct in (P.M_MEMORY_PCT, P.M_SM_PCT):
        assert abs(b[pct] - a[pct]) < 15, report
    # launch statistics: ncu reports them with every run, the worker computes them
    assert P.M_WAVES in a and P.M_REGISTERS in a, sorted(a)
    assert b[P.M_WAVES] == pytest.approx(a[P.M_WAVES], rel=0.01, abs=0.006), report
    assert b[P.M_REGISTERS] == a[P.M_REGISTERS]
    if P.M_THEORETICAL_OCC in a:
        assert b[P.M_THEORETICAL_OCC] == pytest.approx(a[P.M_THEORETICAL_OCC], abs=0.5), report
    assert by_cupti.bottleneck.primary == by_ncu.bottleneck.primary
