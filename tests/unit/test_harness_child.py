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


@pytest.fixture
def fake_gpu(monkeypatch):
    def use(**behaviour):
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.abspath(FAKE), os.environ.get("PYTHONPATH", "")]))
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
    ],
)
def test_broken_candidates(fake_gpu, behaviour, reason, text):
    fake_gpu(candidate=behaviour)
    verdict = verify(SOURCE, SOURCE, SPEC, OPTIONS)
    assert verdict.reason is reason and text in verdict.errors[0]


def test_a_hung_kernel_is_a_timeout(fake_gpu):
    fake_gpu(candidate="hang")
    options = VerifyOptions(arch="sm_90", timeout_s=5)
    verdict = verify(SOURCE, SOURCE, SPEC, options)
    assert verdict.reason is Reason.TIMEOUT and verdict.wall_s < 30


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
