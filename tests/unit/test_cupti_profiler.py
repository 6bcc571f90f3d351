"""The profiler's CUPTI path (GPU worker) and its ncu fallback, without a GPU.

A stand-in worker answers each request with the values of a full profile recorded with ncu
on the H200 (tests/fixtures/ncu/dataset), cut down to the metrics the request asks for, so
the tree's walk and the classification run on real numbers. The cubin is compiled for real
(nvcc); no ncu call may happen unless the test expects the fallback.
"""

from __future__ import annotations

import os
import shutil

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.core import profile as P
from kernel_lsp.core.classify import classify
from kernel_lsp.core.profile_render import kernel_markdown
from kernel_lsp.services import gpu_worker as W
from kernel_lsp.services import profiler as prof
from kernel_lsp.services.tree_dataset import load_dataset

from test_profile_service import FakeNcu

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="compiles the kernel with nvcc")

DATASET = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ncu", "dataset")
SOURCE = "__global__ void transpose_smem_conflict(float *out, const float *in, int w) { out[threadIdx.x] = in[threadIdx.x]; }\n"
SPEC = {"kernel": "transpose_smem_conflict", "grid": [1, 1, 1], "block": [32, 1, 1],
        "params": [{"name": "out", "kind": "array", "dtype": "float32", "shape": [32], "role": "out"},
                   {"name": "in", "kind": "array", "dtype": "float32", "shape": [32], "role": "in"},
                   {"name": "w", "kind": "scalar", "dtype": "int32", "value": 32}]}


def _full(name: str) -> dict[str, float]:
    return dict(next(s for s in load_dataset(DATASET) if s.name.startswith(name)).metrics)


SASS_ALL = sorted({n for fs in W.SASS_FORMULAS.values() for n in fs[0][1:]} | {
    "smsp__sass_inst_executed_op_shared_ld", "smsp__sass_inst_executed_op_shared_st",
    "smsp__sass_branch_targets_threads_divergent"})


class FakeWorker:
    """Answers like the GPU worker from a recorded full profile; ``fail`` makes the next request fail."""

    def __init__(self, full: dict[str, float], *, cupti_ok=True, sass_available=SASS_ALL, missing=()):
        self.missing = tuple(missing)
        self.full = full
        self.info = W.WorkerInfo("NVIDIA H200", cupti_ok, None if cupti_ok else "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
                                 "GH100", 0.5, tuple(sass_available))
        self.requests: list[W.Request] = []
        self.range_refused: frozenset[str] = frozenset()
        self.sass_refused: frozenset[str] = frozenset()
        self.fail: W.WorkerError | None = None

    def ensure(self):
        return self.info

    def profile(self, request, *, timeout_s):
        self.requests.append(request)
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        wanted = [m for c in request.collections for m in c] + list(W.LAUNCH_METRICS)
        metrics = {m: self.full[m] for m in wanted if m in self.full}
        return W.Reply(timings_us=(31.0, 30.0, 30.5)[: request.timed], metrics=metrics, passes=7, missing=self.missing,
                       wall_s=0.05)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    real_which = prof.proc.which
    monkeypatch.setattr(prof.proc, "which", lambda tool: real_which(tool) or "/usr/bin/" + os.path.basename(tool))
    source = tmp_path / "t.cu"
    source.write_text(SOURCE)

    def build(worker, fake_ncu=None, **settings):
        s = Settings(profile_store=str(tmp_path / "store"), **settings)
        profiler = prof.Profiler(s, prof.ProfileStore(s.profile_store), run=fake_ncu or FakeNcu(), worker=worker)
        return profiler, prof.Target(str(source), SOURCE, "transpose_smem_conflict", spec_data=SPEC)

    return build


def test_a_spec_kernel_is_profiled_in_the_worker_and_classed_as_ncus_full_profile(setup):
    full = _full("bank_conflict_full:transpose_smem_conflict")
    worker = FakeWorker(full)
    ncu = FakeNcu()  # no answers: any ncu run would fail the test
    profiler, target = setup(worker, ncu)
    first = profiler.profile(target)
    assert first.ok, first.message
    assert [c for c in ncu.calls if c[1:] != ["--version"]] == []
    (request,) = worker.requests
    assert request.entry == "_Z23transpose_smem_conflictPfPKfi" and request.cubin_path.endswith(".cubin")  # mangled: C++ kernel
    assert request.timed == prof.FIRST_TIMED_LAUNCHES and request.spec == SPEC and request.arch == profiler.settings.arch
    assert request.collections[0][0] == P.M_DURATION_NS and P.M_SHARED_WAVEFRONTS in request.collections[0]
    p = first.profile
    assert p.tree_leaf == "fallback" and p.passes == 7 and p.duration_samples_us == (31.0, 30.0, 30.5)
    assert first.bottleneck.label == classify(full).label == "shared-bank-conflicts"
    again = profiler.profile(target, use_cache=False)
    assert again.ok and again.profile.tree_leaf != "fallback" and len(worker.requests) == 2
    assert again.bottleneck.label == "shared-bank-conflicts"
    assert profiler.fallback_reason is None


def test_a_fault_in_the_worker_is_a_message_and_the_last_profile_stays_stale(setup):
    worker = FakeWorker(_full("stream_full"))
    profiler, target = setup(worker)
    assert profiler.profile(target).ok
    worker.fail = W.WorkerError("the kernel failed on the GPU: LaunchError: an illegal memory access was encountered",
                                fault=True)
    failed = profiler.profile(target, use_cache=False)
    assert not failed.ok and "illegal memory access" in failed.message
    assert failed.profile is not None and failed.profile.stale
    assert profiler.profile(target, use_cache=False).ok  # the (restarted) worker serves the next save


def test_cupti_refused_falls_back_to_ncu_and_says_why(setup):
    worker = FakeWorker(_full("bank_conflict_full:transpose_smem_conflict"))
    worker.fail = W.WorkerError("CUPTI: cuptiRangeProfilerSetConfig: CUPTI_ERROR_INVALID_PARAMETER", cupti=True)
    ncu = FakeNcu("csv:bank_conflict_full.csv.gz")
    profiler, target = setup(worker, ncu)
    result = profiler.profile(target)
    assert result.ok, result.message
    assert any("--metrics" in c for c in ncu.calls)
    assert "CUPTI_ERROR_INVALID_PARAMETER" in profiler.fallback_reason
    assert result.bottleneck.label == "shared-bank-conflicts"


def test_a_worker_without_cupti_or_without_a_metric_leaves_it_to_ncu(setup):
    without_cupti = FakeWorker({}, cupti_ok=False)
    known_refused = FakeWorker({}, sass_available=())
    known_refused.range_refused = frozenset(W.RANGE_STANDINS.values())
    found_missing = FakeWorker(_full("bank_conflict_full:transpose_smem_conflict"), missing=[P.M_GLOBAL_SECTORS_IDEAL])
    # The first profile (no previous facts) asks for the source-level counts: the known refusal applies.
    for worker, why, asked in ((known_refused, "CUPTI cannot give", 0), (without_cupti, "INSUFFICIENT_PRIVILEGES", 0),
                               (found_missing, "CUPTI could not give " + P.M_GLOBAL_SECTORS_IDEAL, 1)):
        ncu = FakeNcu("csv:bank_conflict_full.csv.gz")
        profiler, target = setup(worker, ncu)
        assert profiler.profile(target, use_cache=False).ok
        assert len(worker.requests) == asked and why in profiler.fallback_reason
        assert any("--metrics" in c for c in ncu.calls)


def test_full_profiles_and_line_counters_stay_with_ncu(setup):
    worker = FakeWorker(_full("bank_conflict_full:transpose_smem_conflict"))
    ncu = FakeNcu("csv:bank_conflict_full.csv.gz")
    profiler, target = setup(worker, ncu, profile_line_counters=True)
    assert not profiler._worker_may_run(target, full=False)
    assert not profiler._worker_may_run(target, full=True)
    program = prof.Target(target.source_path, SOURCE, "transpose_smem_conflict", program="/bin/app")
    assert not setup(worker)[0]._worker_may_run(program, full=False)
    assert setup(worker)[0]._worker_may_run(target, full=False)


BARRIER_SOURCE = """\
__global__ void z_barrier_heavy(float *out, int iters) {
  __shared__ float buf[256];
  int t = threadIdx.x;
  buf[t] = t;
  __syncthreads();
  float x = 0;
  for (int k = 0; k < iters; ++k) { x += buf[(t + k) & 255]; __syncthreads(); buf[t] = x; __syncthreads(); }
  out[blockIdx.x * blockDim.x + t] = x;
}
"""
BARRIER_SPEC = {"kernel": "z_barrier_heavy", "grid": [4, 1, 1], "block": [256, 1, 1],
                "params": [{"name": "out", "kind": "array", "dtype": "float32", "shape": [1024], "role": "out"},
                           {"name": "iters", "kind": "scalar", "dtype": "int32", "value": 16}]}


def test_a_barrier_bound_kernel_gets_its_full_profiles_class_on_every_save(tmp_path, monkeypatch):
    real_which = prof.proc.which
    monkeypatch.setattr(prof.proc, "which", lambda tool: real_which(tool) or "/usr/bin/" + os.path.basename(tool))
    source = tmp_path / "b.cu"
    source.write_text(BARRIER_SOURCE)
    full = _full("zoo_full:z_barrier_heavy")
    worker = FakeWorker(full)
    s = Settings(profile_store=str(tmp_path / "store"))
    profiler = prof.Profiler(s, prof.ProfileStore(s.profile_store), run=FakeNcu(), worker=worker)
    target = prof.Target(str(source), BARRIER_SOURCE, "z_barrier_heavy", spec_data=BARRIER_SPEC)
    first = profiler.profile(target)
    again = profiler.profile(target, use_cache=False)
    assert first.ok and again.ok, (first.message, again.message)
    assert classify(full).label == "barrier-stalls"
    assert first.bottleneck.label == again.bottleneck.label == "barrier-stalls"
    # The repeat profile's leaf is the busy kernels' (pipes), with the stall counters added for the barriers.
    assert again.profile.tree_leaf == "compute_pipes"
    assert P.stall_metric("barrier") in worker.requests[-1].collections[0]
    assert "group:stalls" in again.profile.sections
    # Collected by CUPTI, and the hover says so.
    assert again.profile.collector == P.COLLECTOR_CUPTI
    assert kernel_markdown(again.profile, again.bottleneck).startswith("**Profile** (CUPTI)")


def test_a_specs_inputs_are_prepared_in_the_worker_as_its_profile_will_ask(setup):
    worker = FakeWorker(_full("bank_conflict_full:transpose_smem_conflict"))
    prepared = []
    worker.prepare = lambda spec, base_dir, *, seed=0, timeout_s: prepared.append((spec, base_dir, seed)) or 0.1
    profiler, target = setup(worker)
    assert profiler.prepare_inputs(target) is None
    profiler.profile(target)
    (request,) = worker.requests
    assert prepared == [(request.spec, request.base_dir, request.seed)]
    assert prof.Profiler(profiler.settings, profiler.store).prepare_inputs(target) is not None  # no worker
