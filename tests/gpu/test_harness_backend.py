"""The pycuda backend's device side on a real GPU: generator kernels against their numpy twins,
red zones, bitwise comparison, module variables, and a hung kernel ending in seconds.

Skipped cleanly without pycuda, nvcc or a CUDA device (tests/gpu/conftest.py).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from kernel_lsp.core.compare import GUARD_BYTES, check_guards, guard_expected, guard_fill, poison
from kernel_lsp.core.inputs import DevicePlan, counter_values, device_plan
from kernel_lsp.core.spec import parse_spec
from kernel_lsp.core.verdict import Reason
from kernel_lsp.services.toolchain import BuildFlags
from kernel_lsp.services.harness import VerifyOptions, verify
from kernel_lsp.services.harness.compile import compile_cubin, device_globals
from kernel_lsp.services.harness.verify import cuda_tool, detect_arch, helper_cubin

pytestmark = pytest.mark.gpu

PROBE = r"""
__device__ unsigned int launches;
extern "C" __global__ void probe(float* y, int n, int past)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n + past) y[i] = 1.0f;
    if (i == 0) launches += 1;
}
"""


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("backend"))
    arch = detect_arch()
    options = VerifyOptions(arch=arch)
    helpers = helper_cubin(workdir, arch, options)
    assert helpers.ok, helpers.log
    built = compile_cubin(PROBE, workdir, "candidate", BuildFlags(nvcc=cuda_tool("nvcc")).for_arch(arch))
    assert built.ok, built.log
    with open(built.cubin_path, "rb") as f:
        state = {"candidate": list(device_globals(f.read()))}
    from kernel_lsp.services.harness.backend_pycuda import PycudaBackend

    b = PycudaBackend({"candidate": (built.cubin_path, "probe")}, helpers.cubin_path, state)
    yield b
    b.close()


def _plan(init: str, array_type: str, n: int = 100003, seed: int = 5) -> DevicePlan:
    spec = parse_spec({"kernel": "k", "params": [
        {"name": "n", "scalar": "int32", "value": n},
        {"name": "x", "array": array_type, "size": "n", "init": init, "role": "in"},
    ], "grid": [1, 1, 1], "block": [32, 1, 1]})
    return device_plan(spec.arrays[0], n, {"n": n}, seed, 0)


@pytest.mark.parametrize("init, array_type", [
    ("uniform(-1,1)", "float32"), ("uniform(-3,5)", "float64"), ("uniform(0,1)", "float16"), ("uniform(-2,2)", "bfloat16"),
    ("randint(0,255)", "int32"), ("randint(-7,7)", "int8"), ("randint(0,99999)", "int64"), ("fill(3)", "uint32"),
    ("arange", "float32"), ("ones", "float64"),
])
def test_generator_kernels_match_their_numpy_twins_bit_for_bit(backend, init, array_type):
    plan = _plan(init, array_type)
    handle = backend.alloc(array_type, plan.size, guard_fill(array_type, "in"))
    try:
        backend.generate(handle, plan, array_type)
        got, want = backend.download(handle), counter_values(plan, array_type)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
        front, back = backend.guards(handle)
        assert check_guards("x", array_type, "in", plan.size, front, back) is None
    finally:
        backend.free(handle)


def test_normal_draws_match_within_float_rounding(backend):
    plan = _plan("normal(1,2)", "float32")
    handle = backend.alloc("float32", plan.size, None)
    try:
        backend.generate(handle, plan, "float32")
        np.testing.assert_allclose(backend.download(handle), counter_values(plan, "float32"), rtol=1e-5, atol=1e-5)
    finally:
        backend.free(handle)


@pytest.mark.parametrize("array_type", ["float32", "float64", "bfloat16", "int8"])
def test_poison_and_red_zones_hold_their_patterns(backend, array_type):
    handle = backend.alloc(array_type, 1001, guard_fill(array_type, "out"))
    try:
        backend.poison(handle, array_type)
        assert np.array_equal(backend.download(handle).view(np.uint8), poison(array_type, 1001).view(np.uint8))
        front, back = backend.guards(handle)
        assert front.size == back.size == GUARD_BYTES
        assert np.array_equal(back, guard_expected(array_type, "out", GUARD_BYTES))
    finally:
        backend.free(handle)


def test_differ_counts_words_and_finds_the_first(backend):
    a, b = backend.alloc("float32", 5000, None), backend.alloc("float32", 5000, None)
    try:
        values = np.arange(5000, dtype=np.float32)
        backend.upload(a, values)
        backend.upload(b, values)
        assert backend.differ(a, b) == (0, 0)
        values[[17, 4000]] = -1
        backend.upload(b, values)
        assert backend.differ(a, b) == (2, 17 * 4)
    finally:
        backend.free(a)
        backend.free(b)


def test_a_store_past_the_end_shows_in_the_red_zone_and_module_state_is_seen(backend):
    from kernel_lsp.core.spec import Launch

    y = backend.alloc("float32", 1000, guard_fill("float32", "out"))
    try:
        before = backend.globals("candidate")
        assert set(before) == {"launches"}
        launch = Launch(grid=(8, 1, 1), block=(256, 1, 1), dynamic_smem_bytes=0)
        ms = backend.launch("candidate", [y, np.int32(1000), np.int32(0)], launch, 5.0)
        assert ms >= 0
        front, back = backend.guards(y)
        assert check_guards("y", "float32", "out", 1000, front, back) is None
        after = backend.globals("candidate")
        assert after["launches"] != before["launches"]
        backend.set_globals("candidate", before)
        assert backend.globals("candidate") == before
        backend.launch("candidate", [y, np.int32(1000), np.int32(3)], launch, 5.0)
        front, back = backend.guards(y)
        message = check_guards("y", "float32", "out", 1000, front, back)
        assert message and "12 bytes" in message and "y[1000]" in message
    finally:
        backend.free(y)


@pytest.mark.parametrize("array_type", ["float32", "float16", "bfloat16", "float64"])
def test_the_tolerance_kernel_matches_its_numpy_twin(backend, array_type):
    from kernel_lsp.core.compare import tolerance_summary
    from kernel_lsp.core.inputs import NUMPY_DTYPES, float32_to_bf16
    from kernel_lsp.core.spec import Tolerance

    rng = np.random.default_rng(11)
    n = 300_007
    r64 = rng.uniform(-2, 2, n)
    c64 = r64 * (1 + rng.uniform(-1e-3, 1e-3, n))
    c64[rng.integers(0, n, 50)] += 1.0

    def typed(values):
        return float32_to_bf16(values.astype(np.float32)) if array_type == "bfloat16" else values.astype(NUMPY_DTYPES[array_type])

    r, c = typed(r64), typed(c64)
    special = typed(np.array([np.nan, np.inf, -np.inf, 1.0]))
    r[:4], c[:4] = special, special  # skipped: the same non-finite values on both sides
    c[10], c[11] = special[0], special[1]  # NaN and Inf where the reference is finite
    r[20:23], c[20:23] = poison(array_type, 3), poison(array_type, 3)
    c[30] = poison(array_type, 1)[0]
    a, b = backend.alloc(array_type, n, None), backend.alloc(array_type, n, None)
    try:
        backend.upload(a, r)
        backend.upload(b, c)
        for tolerance in (Tolerance(1e-2, 1e-3), Tolerance(1e-5, 1e-6)):
            got = backend.tolerance_summary(a, b, array_type, tolerance, True)
            want = tolerance_summary(r, c, array_type, tolerance, True)
            assert (got.bad, got.special, got.max_abs_error, got.max_rel_error) == (want.bad, want.special, want.max_abs_error, want.max_rel_error)
            assert got.err_sq == pytest.approx(want.err_sq, rel=1e-9) and got.ref_sq == pytest.approx(want.ref_sq, rel=1e-9)
            assert got.special == 3 and got.bad > 0
    finally:
        backend.free(a)
        backend.free(b)


def test_fill_tail_sets_the_elements_past_a_size_only(backend):
    from kernel_lsp.core.compare import INPUT_FLOAT_GUARD

    handle = backend.alloc("float32", 1000, guard_fill("float32", "in"))
    try:
        backend.upload(handle, np.arange(1000, dtype=np.float32))
        backend.fill_tail(handle, 997, INPUT_FLOAT_GUARD)
        values = backend.download(handle)
        assert np.array_equal(values[:997], np.arange(997, dtype=np.float32)) and np.isnan(values[997:]).all()
        front, back = backend.guards(handle)
        assert check_guards("x", "float32", "in", 1000, front, back) is None
    finally:
        backend.free(handle)


HANG_SPEC = parse_spec({"kernel": "scale", "params": [
    {"name": "n", "scalar": "int32", "value": 1 << 20},
    {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
    {"name": "y", "array": "float32", "size": "n", "role": "out"},
], "grid": ["(n+255)/256", 1, 1], "block": [256, 1, 1], "variants": [{"n": 1000}]})
SCALE = """extern "C" __global__ void scale(int n, const float* x, float* y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""
# Spins forever at the main size only (x is finite, so the loop condition never changes there). The
# loop stores to global memory on every turn: an empty one may be removed by the compiler (C++'s
# forward-progress rule), and on the H200 it was.
HANG = SCALE.replace("if (i < n) y[i] = 2.0f * x[i];",
                     "if (i < n) { volatile float v = x[i]; while (n > 4096 && v == v) { y[i] = v; } y[i] = 2.0f * v; }")


def test_a_hanging_candidate_is_a_timeout_within_seconds():
    verdict = verify(SCALE, HANG, HANG_SPEC, VerifyOptions(timeout_s=120))
    assert verdict.reason is Reason.TIMEOUT, verdict.summary()
    assert "seed 1" in verdict.errors[0] and verdict.wall_s < 10, verdict.summary()


def test_the_gpu_is_usable_after_a_hang_was_killed():
    verdict = verify(SCALE, SCALE, HANG_SPEC, VerifyOptions(skip_timing=True))
    assert verdict.reason is Reason.NOT_FASTER and "correctness passed" in verdict.errors[0], verdict.summary()


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-v"]))
