"""verify() end to end through its real child process, with a fake pycuda (tests/fixtures/fake_pycuda).

This drives the parts a GPU run uses (job file, child, PycudaBackend, timer,
result file, launch mode under a sanitizer) on a CPU; the numbers are fake, the
plumbing and the verdict logic are real.
"""

import json
import os
import shutil

import pytest

from kernel_lsp.core.spec import parse_spec
from kernel_lsp.core.verdict import Reason
from kernel_lsp.services.harness import GpuUnavailable, VerifyOptions, verify
from kernel_lsp.services.harness.protocol import TimingOptions

FAKE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "fake_pycuda")
pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

SPEC = parse_spec({
    "kernel": "scale",
    "params": [
        {"name": "n", "scalar": "int32", "value": 4096},
        {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
        {"name": "y", "array": "float32", "size": "n", "role": "out"},
    ],
    "grid": ["(n+255)/256", 1, 1],
    "block": [256, 1, 1],
    "variants": [{"n": 77}],
})
SOURCE = """extern "C" __global__ void scale(int n, const float* x, float* y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""
OPTIONS = VerifyOptions(arch="sm_90", timeout_s=60, timing=TimingOptions(budget_s=0.2, min_trials=5, max_trials=20, warmup=1))


#: The same kernel with module variables, for the behaviours that keep state in them.
STATEFUL = "__device__ unsigned int calls;\n__device__ unsigned int last_n;\n" + SOURCE.replace("y[i] = 2.0f * x[i];", "{ y[i] = 2.0f * x[i]; calls += 1; last_n = n; }")


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    def use(**behaviour):
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.abspath(FAKE), os.environ.get("PYTHONPATH", "")]))
        # The harness's kernels are cached per machine; here, per test.
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        monkeypatch.setenv("FAKE_PYCUDA_KERNELS", json.dumps(behaviour))

    return use


def test_faster_candidate_is_accepted_with_its_evidence(fake_gpu):
    fake_gpu(candidate="fast")
    verdict = verify(SOURCE, SOURCE, SPEC, OPTIONS)
    assert verdict.accepted and verdict.reason is Reason.OK
    assert verdict.speedup == pytest.approx(3.0) and verdict.speedup_ci_low == pytest.approx(3.0)
    assert verdict.timings["original"].median_ms == pytest.approx(1.0) and verdict.timings["candidate"].trials >= 5
    assert verdict.gpu is not None and verdict.gpu.name == "Fake H200" and verdict.gpu.l2_bytes == 1 << 20
    assert verdict.seeds == (1, 2, 3) and verdict.max_abs_error == 0


def test_slower_candidate_is_not_faster(fake_gpu):
    fake_gpu(candidate="slow")
    verdict = verify(SOURCE, SOURCE, SPEC, OPTIONS)
    assert verdict.reason is Reason.NOT_FASTER and verdict.speedup == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "behaviour, reason, text",
    [
        ("nothing", Reason.MISMATCH, "never written"),
        ("modify", Reason.INPUT_MODIFIED, "'x'"),
        ("fault", Reason.LAUNCH_ERROR, "illegal memory access"),
        ("oob_write", Reason.OUT_OF_BOUNDS, "'y' (4096 elements) was written out of range: 4 bytes of the red zone after it changed (first at element y[4096]"),
        ("oob_read", Reason.NAN_OR_INF, "NaN red zones"),
        ("pointer_cache", Reason.HISTORY_DEPENDENT, "seed 2"),
    ],
)
def test_broken_candidates(fake_gpu, behaviour, reason, text):
    fake_gpu(candidate=behaviour)
    verdict = verify(SOURCE, SOURCE, SPEC, OPTIONS)
    assert verdict.reason is reason and text in verdict.errors[0]


@pytest.mark.parametrize("behaviour, where", [("hang", "seed 1"), ("hang_small", "variants[0]")])
def test_a_hung_kernel_is_a_timeout_within_seconds_not_the_overall_timeout(fake_gpu, behaviour, where):
    fake_gpu(candidate=behaviour)
    verdict = verify(SOURCE, SOURCE, SPEC, VerifyOptions(arch="sm_90", timeout_s=60))
    assert verdict.reason is Reason.TIMEOUT and where in verdict.errors[0] and "1 s" in verdict.errors[0]
    assert verdict.wall_s < 15


def test_a_child_stuck_in_a_launch_call_is_killed_by_the_watchdog(fake_gpu):
    fake_gpu(candidate="hang_hard")
    verdict = verify(SOURCE, SOURCE, SPEC, VerifyOptions(arch="sm_90", timeout_s=60))
    assert verdict.reason is Reason.TIMEOUT and "past its limit" in verdict.errors[0] and verdict.wall_s < 20


def test_module_state_that_changes_results_after_other_launches_is_history_dependent(fake_gpu):
    fake_gpu(candidate="stale_after_resize")
    verdict = verify(SOURCE, STATEFUL, SPEC, OPTIONS)
    assert verdict.reason is Reason.HISTORY_DEPENDENT and "replayed after" in verdict.errors[0]
    assert any("calls, last_n" in w for w in verdict.warnings)


def test_module_state_that_does_not_change_results_is_accepted(fake_gpu):
    fake_gpu(candidate="counter")
    verdict = verify(SOURCE, STATEFUL, SPEC, OPTIONS)
    assert verdict.reason is Reason.NOT_FASTER and "correctness" not in verdict.errors[0]
    assert any("writes module state the original does not (calls)" in w for w in verdict.warnings)


def test_the_compiled_original_is_reused_across_candidates(fake_gpu, monkeypatch):
    import importlib

    verify_module = importlib.import_module("kernel_lsp.services.harness.verify")

    fake_gpu(candidate="fast")
    built = []
    real = verify_module.compile_cubin

    def counting(source, workdir, stem, flags, **kw):
        if stem != "harness_helpers":
            built.append(stem)
        return real(source, workdir, stem, flags, **kw)

    monkeypatch.setattr(verify_module, "compile_cubin", counting)
    original = SOURCE + "// a search's original\n"
    assert verify(original, SOURCE, SPEC, OPTIONS).accepted
    assert verify(original, SOURCE, SPEC, OPTIONS).accepted
    assert built == ["original", "candidate", "candidate"]


def test_no_device_is_an_exception_not_a_verdict(fake_gpu, monkeypatch):
    fake_gpu()
    monkeypatch.setenv("FAKE_PYCUDA_NO_DEVICE", "1")
    with pytest.raises(GpuUnavailable, match="no CUDA GPU available"):
        verify(SOURCE, SOURCE, SPEC, OPTIONS)


def test_sanitizer_errors_reject_and_are_reported(fake_gpu, monkeypatch):
    fake_gpu(candidate="fast")
    monkeypatch.setenv("FAKE_SANITIZER_ERROR", "memcheck")
    options = VerifyOptions(arch="sm_90", timeout_s=60, sanitize=True, sanitizer=os.path.abspath(os.path.join(FAKE, "compute-sanitizer")), timing=OPTIONS.timing)
    verdict = verify(SOURCE, SOURCE, SPEC, options)
    assert verdict.reason is Reason.SANITIZER and "Invalid __global__ read" in verdict.sanitizer and "memcheck" in verdict.sanitizer


def test_clean_sanitizer_run_still_accepts(fake_gpu):
    fake_gpu(candidate="fast")
    options = VerifyOptions(arch="sm_90", timeout_s=60, sanitize=True, sanitizer=os.path.abspath(os.path.join(FAKE, "compute-sanitizer")), timing=OPTIONS.timing)
    verdict = verify(SOURCE, SOURCE, SPEC, options)
    assert verdict.accepted and verdict.sanitizer is None


#: The child's spec without variants: only the sizes the harness tries itself differ from the spec's.
MAIN_ONLY = parse_spec({**SPEC.to_json(), "variants": []})


def test_a_candidate_that_returns_at_once_when_launched_again_on_the_same_inputs_is_history_dependent(fake_gpu):
    fake_gpu(candidate="remember_last")
    verdict = verify(SOURCE, SOURCE, SPEC, OPTIONS)
    assert verdict.reason is Reason.HISTORY_DEPENDENT and "2 candidate launches in a row" in verdict.errors[0]
    assert "never written" in verdict.errors[0]


def test_a_candidate_that_skips_its_work_after_the_checks_is_caught_in_its_timed_launches(fake_gpu):
    fake_gpu(candidate="skip_late")
    verdict = verify(SOURCE, SOURCE, SPEC, OPTIONS)
    assert verdict.reason is Reason.TIMED_MISMATCH and "timed pair" in verdict.errors[0] and "never written" in verdict.errors[0]
    assert verdict.timed_checks and verdict.timed_checks >= 1


def test_a_candidate_fast_only_on_inputs_it_saw_before_collapses_on_redrawn_inputs(fake_gpu):
    fake_gpu(candidate="replay_last")
    verdict = verify(SOURCE, SOURCE, SPEC, OPTIONS)
    assert verdict.reason is Reason.SPEEDUP_COLLAPSE and "collapses when the inputs change" in verdict.errors[0]
    assert verdict.unchanged_speedup[0] == pytest.approx(30.0) and verdict.redrawn_speedup[0] == pytest.approx(3.0)
    # The title a user would see claims no more than the harder series showed.
    assert verdict.speedup == pytest.approx(3.0)


def test_the_accepted_verdict_carries_both_series_the_checked_launches_and_the_sizes_tried(fake_gpu):
    fake_gpu(candidate="fast")
    verdict = verify(SOURCE, SOURCE, MAIN_ONLY, OPTIONS)
    assert verdict.accepted
    assert verdict.unchanged_speedup[0] == pytest.approx(3.0) and verdict.redrawn_speedup[0] == pytest.approx(3.0)
    assert set(verdict.timings) == {"original", "candidate", "original_redrawn", "candidate_redrawn"}
    assert verdict.timed_checks >= 4
    assert verdict.sizes_tried == ("n = 4095", "n = 4093", "n = 2049", "n = 5") and verdict.fixed_sizes == {}


def test_a_size_assumption_the_spec_hides_is_size_dependent(fake_gpu):
    fake_gpu(candidate="no_tail")
    verdict = verify(SOURCE, SOURCE, MAIN_ONLY, OPTIONS)
    assert verdict.reason is Reason.SIZE_DEPENDENT and verdict.errors[0].startswith("n = 4095 (a size the spec does not name")
    assert "3 of 4096 elements never written" in verdict.errors[0]


def test_a_fixed_size_is_not_varied_and_the_verdict_says_so(fake_gpu):
    fake_gpu(candidate="no_tail")
    fixed = parse_spec({**MAIN_ONLY.to_json(), "fixed": ["n"]})
    verdict = verify(SOURCE, SOURCE, fixed, OPTIONS)
    assert verdict.accepted and verdict.sizes_tried == () and verdict.fixed_sizes == {"n": 4096}
    assert verdict.verified_at() == "verified at n = 4096 only" and "(verified at n = 4096 only)" in verdict.summary()


def test_a_device_comparison_that_fails_its_self_test_is_not_trusted(fake_gpu, monkeypatch):
    fake_gpu(candidate="off")
    monkeypatch.setenv("FAKE_PYCUDA_BROKEN_CLOSE", "1")
    verdict = verify(SOURCE, SOURCE, SPEC, OPTIONS)
    # The broken kernel would call every value within tolerance; the host compares instead and finds them wrong.
    assert verdict.reason is Reason.MISMATCH and "outside atol" in verdict.errors[0]
    assert any("float32 comparison disagrees with its numpy twin" in w for w in verdict.warnings)
