"""The verification protocol driven by numpy-emulated kernels (no GPU needed).

Each fake kernel is a Python function ``kernel(args, launch)`` that mutates the
host arrays in ``args`` in place, as a CUDA kernel would mutate device buffers.
"""

import itertools

import numpy as np
import pytest

from kernel_lsp.core.spec import parse_spec
from kernel_lsp.core.compare import poison
from kernel_lsp.core.inputs import make_inputs
from kernel_lsp.services.harness.protocol import CANDIDATE, ORIGINAL, LaunchFailed, TimingOptions, build_args, check_correctness, measure

SPEC = parse_spec({
    "kernel": "axpy",
    "params": [
        {"name": "n", "scalar": "int32", "value": 4096},
        {"name": "a", "scalar": "float32", "value": 2.0},
        {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
        {"name": "z", "array": "float32", "size": "n", "role": "out"},
    ],
    "grid": ["ceil_div(n,256)", 1, 1],
    "block": [256, 1, 1],
    "variants": [{"n": 1000}, {"n": 3}],
})

TINY = parse_spec({**SPEC.to_json(), "params": [*SPEC.to_json()["params"][:2], {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1e-8,1e-8)", "role": "in"}, SPEC.to_json()["params"][3]]})


def axpy(args, launch):
    n, a, x, z = args
    z[:n] = a * x[:n]


class FakeTimer:
    def __init__(self, backend):
        self.backend = backend
        self.closed = False

    def time_ms(self, which):
        self.backend.order.append(which)
        return self.backend.times_ms[which] * (1 + 0.01 * self.backend.rng.standard_normal())

    def close(self):
        self.closed = True


class FakeBackend:
    def __init__(self, original, candidate, times_ms=None):
        self.kernels = {ORIGINAL: original, CANDIDATE: candidate}
        self.launches = []
        self.order = []
        self.times_ms = times_ms or {ORIGINAL: 2.0, CANDIDATE: 1.0}
        self.rng = np.random.default_rng(0)
        self.timers = []

    def run(self, which, args, launch):
        self.launches.append((which, launch))
        arrays = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        self.kernels[which](arrays, launch)
        return [a if isinstance(a, np.ndarray) else None for a in arrays]

    def timer(self, args, launches, restore):
        self.restore = list(restore)
        timer = FakeTimer(self)
        self.timers.append(timer)
        return timer


def outcome_of(candidate, spec=SPEC, seeds=(1, 2, 3)):
    return check_correctness(FakeBackend(axpy, candidate), spec, list(seeds))


def test_identical_kernel_passes_every_seed_and_variant():
    backend = FakeBackend(axpy, axpy)
    outcome = check_correctness(backend, SPEC, [1, 2, 3])
    assert outcome.reason is None and outcome.max_abs_error == 0
    # 3 seeds x (original + candidate twice) + 2 variants x (original + candidate)
    assert [w for w, _ in backend.launches].count(CANDIDATE) == 3 * 2 + 2
    assert {launch.grid for _, launch in backend.launches} == {(16, 1, 1), (4, 1, 1), (1, 1, 1)}


def test_reordered_arithmetic_within_tolerance_passes():
    def candidate(args, launch):
        n, a, x, z = args
        z[:n] = (x[:n].astype(np.float64) * float(a)).astype(np.float32)

    assert outcome_of(candidate).reason is None


def test_a_kernel_that_writes_nothing_fails():
    outcome = outcome_of(lambda args, launch: None)
    assert outcome.reason == "mismatch" and "never written" in outcome.errors[0]


def test_skipped_tail_fails_at_a_size_that_is_not_a_multiple():
    def candidate(args, launch):
        n, a, x, z = args
        m = n - n % 8
        z[:m] = a * x[:m]

    outcome = outcome_of(candidate)
    # 4096 and 1000 are multiples of 8: only variants[1] (n = 3) exposes the skipped tail.
    assert outcome.reason == "mismatch" and "variants[1]" in outcome.errors[0] and "never written" in outcome.errors[0]


def test_zeros_for_tiny_outputs_fail():
    outcome = check_correctness(FakeBackend(axpy, lambda args, launch: args[3].fill(0)), TINY, [1])
    assert outcome.reason == "mismatch" and "relative error norm" in outcome.errors[0]


def test_modified_input_fails():
    def candidate(args, launch):
        axpy(args, launch)
        args[2][0] = 0

    outcome = outcome_of(candidate)
    assert outcome.reason == "input_modified" and "'x'" in outcome.errors[0]


def test_results_cached_across_launches_fail():
    cache = {}

    def candidate(args, launch):
        if "z" not in cache:
            axpy(args, launch)
            cache["z"] = args[3].copy()
        args[3][:] = cache["z"][: args[3].size] if cache["z"].size >= args[3].size else 0

    outcome = outcome_of(candidate)
    assert outcome.reason == "mismatch" and outcome.errors[0].startswith("seed 2")


def test_run_to_run_differences_are_nondeterministic():
    counter = itertools.count()

    def candidate(args, launch):
        axpy(args, launch)
        args[3][next(counter) % 7] += 0.5

    outcome = outcome_of(candidate)
    assert outcome.reason == "nondeterministic" and "two runs" in outcome.errors[0]


def test_nan_output_is_nan_or_inf():
    def candidate(args, launch):
        axpy(args, launch)
        args[3][5] = np.inf

    assert outcome_of(candidate).reason == "nan_or_inf"


def test_a_launch_failure_is_launch_error():
    def candidate(args, launch):
        raise LaunchFailed("an illegal memory access was encountered")

    outcome = outcome_of(candidate)
    assert outcome.reason == "launch_error" and "illegal memory access" in outcome.errors[0]


def test_an_original_that_modifies_its_input_is_a_warning_about_the_spec():
    def original(args, launch):
        axpy(args, launch)
        args[2][0] = 1

    outcome = check_correctness(FakeBackend(original, axpy), SPEC, [1])
    assert outcome.reason is None and any("spec's role" in w for w in outcome.warnings)


def test_the_candidate_launch_is_used_for_the_candidate():
    spec = parse_spec({**SPEC.to_json(), "candidate": {"grid": ["min(ceil_div(n,1024), 2)", 1, 1]}})
    backend = FakeBackend(axpy, axpy)
    check_correctness(backend, spec, [1])
    assert {launch.grid for w, launch in backend.launches if w == CANDIDATE} <= {(2, 1, 1), (1, 1, 1)}
    assert (16, 1, 1) in {launch.grid for w, launch in backend.launches if w == ORIGINAL}


def test_timing_interleaves_and_stops_at_the_budget():
    backend = FakeBackend(axpy, axpy)
    ticks = itertools.count()
    samples = measure(backend, SPEC, 1, TimingOptions(budget_s=30, min_trials=5, max_trials=100, warmup=2), clock=lambda: next(ticks))
    # The fake clock advances 1 s per look and is looked at from the 5th pair (min_trials) on:
    # the 30 s budget is spent at the 30th look, after 4 + 30 pairs.
    assert len(samples[ORIGINAL]) == len(samples[CANDIDATE]) == 34
    timed = backend.order[4:]
    assert timed[:4] == [ORIGINAL, CANDIDATE, CANDIDATE, ORIGINAL]
    assert np.median(samples[ORIGINAL]) == pytest.approx(2.0, rel=0.02)
    assert backend.timers[0].closed
    assert backend.restore == [False, False, False, True]  # only the out array is rewritten between trials


def test_timing_runs_at_least_min_trials():
    backend = FakeBackend(axpy, axpy)
    samples = measure(backend, SPEC, 1, TimingOptions(budget_s=0, min_trials=7, max_trials=100, warmup=0), clock=lambda: 0.0)
    assert len(samples[CANDIDATE]) == 7


def test_timing_reuses_the_inputs_drawn_for_correctness():
    backend = FakeBackend(axpy, axpy)
    kept = {}
    assert check_correctness(backend, SPEC, [5, 6], keep_inputs=kept).reason is None
    assert list(kept) == [5] and np.array_equal(kept[5]["x"], make_inputs(SPEC, 5)["x"])
    received = {}
    backend.timer = lambda args, launches, restore: received.update(args) or FakeTimer(backend)
    measure(backend, SPEC, 5, TimingOptions(budget_s=0, min_trials=1, max_trials=1, warmup=0), clock=lambda: 0.0, inputs=kept)
    assert received[ORIGINAL][2] is kept[5]["x"]


def test_poison_is_shared_and_read_only():
    first = build_args(SPEC, make_inputs(SPEC, 1), None)[3]
    second = build_args(SPEC, make_inputs(SPEC, 2), None)[3]
    assert first is second and not first.flags.writeable
    assert np.array_equal(first.view(np.uint32), poison("float32", 4096).view(np.uint32))
