"""The verification protocol driven by numpy-emulated kernels and a numpy device (no GPU needed).

:class:`NumpyBackend` is a second implementation of the Backend contract: every array is one
byte buffer ``[red zone | data | red zone]`` at a fake address; a fake kernel is a Python function
``kernel(args, launch, backend)`` that mutates the data views in ``args`` as a CUDA kernel would
mutate device memory, and may return its duration in milliseconds. ``backend.state[which]`` plays
the kernel module's ``__device__`` variables.
"""

import itertools

import numpy as np
import pytest

from kernel_lsp.core.compare import GUARD_BYTES, POISON_BITS, guard_expected, poison, tolerance_summary
from kernel_lsp.core.inputs import NUMPY_DTYPES, counter_values
from kernel_lsp.core.spec import parse_spec
from kernel_lsp.services.harness.protocol import (
    CANDIDATE, LAUNCH_RUNS, ORIGINAL, LaunchFailed, LaunchTimeout, Limits, TimingOptions, Verification, candidate_limit_s,
)

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
_addresses = itertools.count(0x10000, 0x100000)


class Arr:
    def __init__(self, array_type, size, guard_fill):
        self.type, self.size = array_type, size
        self.dtype = NUMPY_DTYPES[array_type]
        self.nbytes = size * self.dtype.itemsize
        self.guard = GUARD_BYTES if guard_fill else 0
        self.raw = np.zeros(2 * self.guard + self.nbytes, dtype=np.uint8)
        self.address = next(_addresses)

    @property
    def data(self):
        return self.raw[self.guard : self.guard + self.nbytes].view(self.dtype)

    def beyond(self, count):
        """The data and ``count`` elements after it (what a kernel reading or writing past the end touches)."""
        return self.raw[self.guard : self.guard + self.nbytes + count * self.dtype.itemsize].view(self.dtype)


class FakeTimer:
    """Timed launches as the real timer makes them: outputs restored, the kernel run in the verification's buffers."""

    def __init__(self, backend, args, restores, launches):
        self.backend, self.args, self.restores, self.launches = backend, args, restores, launches
        self.closed = False

    def time_ms(self, which):
        backend = self.backend
        backend.order.append(which)
        for action, target, source in self.restores[which]:
            if action == "poison":
                backend.poison(target, source)
            else:
                backend.copy(target, source)
        backend.timed[which] = backend.timed.get(which, 0) + 1
        ms = backend.run(which, self.args[which], self.launches[which])
        scale = backend.timed_scale(which) if backend.timed_scale else 1.0
        return backend.times_ms[which] * scale * (1 + 0.01 * backend.rng.standard_normal()) if ms is None else ms

    def close(self):
        self.closed = True


class NumpyBackend:
    def __init__(self, original, candidate, times_ms=None):
        self.kernels = {ORIGINAL: original, CANDIDATE: candidate}
        self.launches = []
        self.order = []
        self.times_ms = times_ms or {ORIGINAL: 2.0, CANDIDATE: 1.0}
        self.rng = np.random.default_rng(0)
        self.timers = []
        self.state = {ORIGINAL: {}, CANDIDATE: {}}
        self.timed = {}
        #: which -> factor on its time in the next timed launch (a kernel whose speed depends on its history).
        self.timed_scale = None
        self.summaries = 0

    def alloc(self, array_type, size, guard_fill):
        arr = Arr(array_type, size, guard_fill)
        if guard_fill:
            self.fill_guards(arr, guard_fill)
        return arr

    def address(self, h):
        return h.address

    def free(self, h):
        h.raw = None

    def upload(self, h, host):
        h.data[:] = host

    def generate(self, h, plan, array_type):
        h.data[:] = counter_values(plan, array_type)

    def download(self, h):
        return h.data.copy()

    def guards(self, h):
        return h.raw[: h.guard].copy(), h.raw[h.guard + h.nbytes :].copy()

    def fill_guards(self, h, guard_fill):
        h.raw[: h.guard] = guard_expected(h.type, "in" if guard_fill[0] == 2 or guard_fill[1] == 0xA5 else "out", h.guard)
        h.raw[h.guard + h.nbytes :] = h.raw[: h.guard]

    def poison(self, h, array_type):
        h.data[:] = poison(array_type, h.size)

    def copy(self, dst, src):
        dst.data[:] = src.data

    def differ(self, a, b):
        diff = np.flatnonzero(a.data.view(np.uint8) != b.data.view(np.uint8))
        return (len(set(diff // 4)), int(diff[0]) // 4 * 4) if diff.size else (0, 0)

    def fill_tail(self, h, first, guard_fill):
        width, value = guard_fill
        units = np.full(-(-(h.nbytes - first * h.dtype.itemsize) // width), value, dtype={1: np.uint8, 2: np.uint16}[width])
        h.raw[h.guard + first * h.dtype.itemsize : h.guard + h.nbytes] = units.view(np.uint8)[: h.nbytes - first * h.dtype.itemsize]

    def tolerance_summary(self, a, b, array_type, tolerance, poisoned):
        self.summaries += 1
        return tolerance_summary(a.data, b.data, array_type, tolerance, poisoned)

    def run(self, which, args, launch):
        """One kernel run; its duration when the kernel says (else None)."""
        views = [a.data if isinstance(a, Arr) else a for a in args]
        self._arrs = [a for a in args if isinstance(a, Arr)]
        ms = self.kernels[which](views, launch, self)
        return ms if isinstance(ms, float) else None

    def launch(self, which, args, launch, limit_s):
        self.launches.append((which, launch, [a.address for a in args if isinstance(a, Arr)], limit_s))
        ms = self.run(which, args, launch)
        if ms is not None and ms > limit_s * 1000:
            raise LaunchTimeout(limit_s)
        return 1.0 if ms is None else ms

    def arr(self, view):
        """The device array behind a kernel argument (for kernels that reach past its ends)."""
        return next(a for a in self._arrs if np.shares_memory(a.raw, view))

    def globals(self, which):
        return {k: bytes(v) for k, v in self.state[which].items()}

    def set_globals(self, which, values):
        # A module's variables are a fixed set; here, names added since the snapshot did not exist then.
        self.state[which] = {k: bytearray(v) for k, v in values.items()}

    def timer(self, args, restores, launches, limits_s):
        self.restores = restores
        self.limits_s = limits_s
        timer = FakeTimer(self, args, restores, launches)
        self.timers.append(timer)
        return timer


def axpy(args, launch, backend=None):
    n, a, x, z = args
    z[:n] = a * x[:n]


def outcome_of(candidate, spec=SPEC, seeds=(1, 2, 3), original=axpy):
    return Verification(NumpyBackend(original, candidate), spec).check(list(seeds))


def test_identical_kernel_passes_every_check_in_the_planned_order():
    backend = NumpyBackend(axpy, axpy)
    outcome = Verification(backend, SPEC).check([1, 2, 3])
    assert outcome.reason is None and outcome.max_abs_error == 0 and outcome.warnings == []
    # 3 seeds x (original + candidate twice), one run at other addresses, 2 variants, then the runs of launch counts
    candidate_runs = [a for w, _, a, _ in backend.launches if w == CANDIDATE]
    assert len(candidate_runs) == 3 * 2 + 1 + 2 + sum(run for run, _ in LAUNCH_RUNS)
    # The runs of launch counts go into the candidate's first output buffer, back to back.
    assert all(run == candidate_runs[0] for run in candidate_runs[9:])
    assert [w for w, _, _, _ in backend.launches[-14:]] == [ORIGINAL] + [CANDIDATE] * 13
    # Same buffers, new contents: every seed's first candidate run reads x at the same address.
    assert candidate_runs[0][0] == candidate_runs[2][0] == candidate_runs[4][0]
    # The run at other addresses shares no pointer with the main buffers.
    assert not set(candidate_runs[6]) & set(candidate_runs[0] + candidate_runs[1])
    assert {launch.grid for _, launch, _, _ in backend.launches} == {(16, 1, 1), (4, 1, 1), (1, 1, 1)}
    assert set(outcome.original_ms) == {"seed 1", "seed 2", "seed 3", "seed 1 at other addresses", "seed 1, variants[0] {'n': 1000}",
                                        "seed 1, variants[1] {'n': 3}", "seed 1, launch counts"}


def test_seeds_write_new_contents_into_the_same_inputs():
    seen = []

    def recording(args, launch, backend):
        seen.append(args[2].copy())
        axpy(args, launch)

    outcome_of(recording, seeds=(1, 2))
    assert not np.array_equal(seen[0], seen[2]) and np.array_equal(seen[0], seen[1])


def test_reordered_arithmetic_within_tolerance_passes():
    def candidate(args, launch, backend):
        n, a, x, z = args
        z[:n] = (x[:n].astype(np.float64) * float(a)).astype(np.float32)

    assert outcome_of(candidate).reason is None


def test_a_kernel_that_writes_nothing_fails():
    outcome = outcome_of(lambda args, launch, backend: None)
    assert outcome.reason == "mismatch" and "never written" in outcome.errors[0]


def test_skipped_tail_fails_at_a_size_that_is_not_a_multiple():
    def candidate(args, launch, backend):
        n, a, x, z = args
        m = n - n % 8
        z[:m] = a * x[:m]

    outcome = outcome_of(candidate)
    # 4096 and 1000 are multiples of 8: only variants[1] (n = 3) exposes the skipped tail.
    assert outcome.reason == "mismatch" and "variants[1]" in outcome.errors[0] and "never written" in outcome.errors[0]


def test_zeros_for_tiny_outputs_fail():
    outcome = outcome_of(lambda args, launch, backend: args[3].fill(0), spec=TINY, seeds=(1,))
    assert outcome.reason == "mismatch" and "relative error norm" in outcome.errors[0]


def test_modified_input_fails():
    def candidate(args, launch, backend):
        axpy(args, launch)
        args[2][7] = 0

    outcome = outcome_of(candidate)
    assert outcome.reason == "input_modified" and "'x'" in outcome.errors[0] and "element 7" in outcome.errors[0]


def test_a_write_past_the_end_names_the_array_and_the_offset():
    def candidate(args, launch, backend):
        n, a, x, z = args
        wide = backend.arr(z).beyond(3)
        wide[: n + 3] = 0
        axpy(args, launch)

    outcome = outcome_of(candidate)
    assert outcome.reason == "out_of_bounds"
    assert "'z' (4096 elements)" in outcome.errors[0] and "z[4096]" in outcome.errors[0] and "12 bytes" in outcome.errors[0]


def test_a_write_before_the_start_is_out_of_bounds():
    def candidate(args, launch, backend):
        axpy(args, launch)
        arr = backend.arr(args[3])
        arr.raw[arr.guard - 4 : arr.guard] = 0

    outcome = outcome_of(candidate)
    assert outcome.reason == "out_of_bounds" and "z[-1]" in outcome.errors[0] and "before it" in outcome.errors[0]


def test_a_read_past_the_end_poisons_the_output_with_nan():
    def candidate(args, launch, backend):
        n, a, x, z = args
        wide = backend.arr(x).beyond(1)
        z[:n] = a * wide[:n] + np.float32(0) * wide[1 : n + 1]

    outcome = outcome_of(candidate)
    assert outcome.reason == "nan_or_inf" and "index 4095" in outcome.errors[0] and "red zones" in outcome.errors[0]


def test_an_original_that_writes_out_of_range_is_only_a_warning_about_the_spec():
    def original(args, launch, backend):
        axpy(args, launch)
        backend.arr(args[3]).beyond(1)[args[0]] = 1

    outcome = outcome_of(axpy, seeds=(1,), original=original)
    assert outcome.reason is None and any("original kernel writes out of range" in w for w in outcome.warnings)


def test_a_cache_keyed_by_pointer_and_shape_is_history_dependent():
    def candidate(args, launch, backend):
        n, a, x, z = args
        key = f"{backend.arr(x).address}:{n}"
        cache = backend.state[CANDIDATE]
        if key not in cache:
            cache[key] = bytearray((a * x[:n]).tobytes())
        z[:n] = np.frombuffer(bytes(cache[key]), dtype=np.float32)

    outcome = outcome_of(candidate)
    assert outcome.reason == "history_dependent" and outcome.errors[0].startswith("seed 2") and "fresh addresses" in outcome.errors[0]


def test_a_cache_keyed_by_shape_only_is_history_dependent():
    def candidate(args, launch, backend):
        n, a, x, z = args
        cache = backend.state[CANDIDATE]
        if str(n) not in cache:
            cache[str(n)] = bytearray((a * x[:n]).tobytes())
        z[:n] = np.frombuffer(bytes(cache[str(n)]), dtype=np.float32)

    assert outcome_of(candidate).reason == "history_dependent"


def test_a_result_that_depends_on_an_earlier_launch_at_another_size_fails_the_replay():
    def candidate(args, launch, backend):
        n, a, x, z = args
        state = backend.state[CANDIDATE]
        last = int.from_bytes(state.get("last_n", bytes(4)), "little")
        z[:n] = a * x[:n] + (1 if last not in (0, n) and n == 4096 else 0)
        state["last_n"] = bytearray(int(n).to_bytes(4, "little"))

    outcome = outcome_of(candidate)
    assert outcome.reason == "history_dependent" and "replayed after" in outcome.errors[0] and "last_n" in outcome.errors[0]
    assert any("writes module state" in w for w in outcome.warnings)


def test_module_state_that_does_not_change_results_passes_with_a_warning():
    def candidate(args, launch, backend):
        axpy(args, launch)
        calls = backend.state[CANDIDATE]
        calls["calls"] = bytearray((int.from_bytes(calls.get("calls", bytes(4)), "little") + 1).to_bytes(4, "little"))

    outcome = outcome_of(candidate)
    assert outcome.reason is None and any("(calls)" in w for w in outcome.warnings)


def test_state_the_original_keeps_too_is_not_a_finding():
    def counting(args, launch, backend, which=CANDIDATE):
        axpy(args, launch)
        backend.state[which]["calls"] = bytearray(np.random.default_rng().bytes(4))

    backend = NumpyBackend(lambda *a: counting(*a, which=ORIGINAL), counting)
    outcome = Verification(backend, SPEC).check([1])
    assert outcome.reason is None and not any("module state" in w for w in outcome.warnings)


def test_run_to_run_differences_are_nondeterministic():
    counter = itertools.count()

    def candidate(args, launch, backend):
        axpy(args, launch)
        args[3][next(counter) % 7] += 0.5

    outcome = outcome_of(candidate)
    assert outcome.reason == "nondeterministic" and "two runs" in outcome.errors[0]


def test_nan_output_is_nan_or_inf():
    def candidate(args, launch, backend):
        axpy(args, launch)
        args[3][5] = np.inf

    assert outcome_of(candidate).reason == "nan_or_inf"


def test_a_launch_failure_is_launch_error():
    def candidate(args, launch, backend):
        raise LaunchFailed("an illegal memory access was encountered")

    outcome = outcome_of(candidate)
    assert outcome.reason == "launch_error" and "illegal memory access" in outcome.errors[0]


def test_limit_arithmetic():
    limits = Limits()
    assert candidate_limit_s(0.05, limits) == 1.0  # fast kernels: the floor
    assert candidate_limit_s(40.0, limits) == pytest.approx(2.0)  # 50 x 40 ms
    assert candidate_limit_s(None, limits) == limits.original_s
    assert candidate_limit_s(10.0, Limits(floor_s=0.1, factor=5)) == pytest.approx(0.1)


def test_a_hang_is_a_timeout_at_fifty_times_the_original():
    def original(args, launch, backend):
        axpy(args, launch)
        return 40.0

    def candidate(args, launch, backend):
        axpy(args, launch)
        return float("inf") if args[0] == 3 else 40.0

    backend = NumpyBackend(original, candidate)
    outcome = Verification(backend, SPEC).check([1, 2])
    assert outcome.reason == "timeout" and "variants[1]" in outcome.errors[0] and outcome.abandoned
    # The original ran first on every input, so each candidate launch got 50 x its time (2 s), not the overall timeout.
    assert [limit for w, _, _, limit in backend.launches if w == CANDIDATE] == pytest.approx([2.0] * 7)
    assert outcome.original_ms["seed 1, variants[1] {'n': 3}"] == 40.0


def test_timing_interleaves_restores_outputs_and_stops_at_the_budget():
    backend = NumpyBackend(axpy, axpy)
    verification = Verification(backend, SPEC, clock=iter(itertools.count()).__next__)
    assert verification.check([1]).reason is None
    outcome = verification.measure(1, TimingOptions(budget_s=30, min_trials=5, max_trials=100, warmup=2))
    samples = outcome.samples_ms
    # Two series with half the budget each. The fake clock advances 1 s per look and is looked at from the
    # 5th pair (min_trials) on: a series' 15 s are spent at its 15th look, after 4 + 15 pairs.
    assert outcome.reason is None
    assert len(samples[ORIGINAL]) == len(samples[CANDIDATE]) == len(samples["original_redrawn"]) == len(samples["candidate_redrawn"]) == 19
    timed = backend.order[4:]
    assert timed[:4] == [ORIGINAL, CANDIDATE, CANDIDATE, ORIGINAL]
    assert np.median(samples[ORIGINAL]) == pytest.approx(2.0, rel=0.02)
    assert backend.timers[0].closed
    # Only the out array is restored between trials, to poison, in each kernel's own buffer.
    assert [(action, kind) for action, _, kind in backend.restores[CANDIDATE]] == [("poison", "float32")]
    assert backend.restores[ORIGINAL][0][1] is not backend.restores[CANDIDATE][0][1]
    assert backend.limits_s[CANDIDATE] == 1.0
    # Each series' first and last pair are checked, and a seeded sample of the others.
    assert 4 <= outcome.timed_checks < 2 * 19


def test_timing_runs_at_least_min_trials():
    backend = NumpyBackend(axpy, axpy)
    verification = Verification(backend, SPEC, clock=lambda: 0.0)
    verification.check([1])
    samples = verification.measure(1, TimingOptions(budget_s=0, min_trials=7, max_trials=100, warmup=0)).samples_ms
    assert len(samples[CANDIDATE]) == len(samples["candidate_redrawn"]) == 7


def test_the_second_series_redraws_the_inputs_between_pairs_in_the_same_buffers():
    seen = []

    def recording(args, launch, backend):
        seen.append((backend.arr(args[2]).address, args[2].copy()))
        axpy(args, launch)

    backend = NumpyBackend(axpy, recording)
    verification = Verification(backend, SPEC, clock=lambda: 0.0)
    assert verification.check([1]).reason is None
    before = len(seen)
    outcome = verification.measure(1, TimingOptions(budget_s=0, min_trials=6, max_trials=6, warmup=1))
    assert outcome.reason is None
    timed = seen[before + 1:]
    unchanged, redrawn = timed[:6], timed[6:]
    assert len(redrawn) == 6 and len({address for address, _ in timed}) == 1
    assert all(np.array_equal(values, unchanged[0][1]) for _, values in unchanged)
    # Every pair of the second series reads inputs of its own, from the same distribution.
    assert all(not np.array_equal(a, b) for (_, a), (_, b) in itertools.combinations([unchanged[0], *redrawn], 2))
    assert all(-1 <= v.min() and v.max() <= 1 for _, v in redrawn)


def test_inputs_that_cannot_be_redrawn_are_timed_once_with_a_warning():
    spec = parse_spec({**SPEC.to_json(), "params": [*SPEC.to_json()["params"][:2], {"name": "x", "array": "float32", "size": "n", "init": "list(1,2,3)", "role": "in"}, SPEC.to_json()["params"][3]]})
    backend = NumpyBackend(axpy, axpy)
    verification = Verification(backend, spec, clock=lambda: 0.0)
    verification.check([1])
    outcome = verification.measure(1, TimingOptions(budget_s=0, min_trials=5, max_trials=5, warmup=0))
    assert set(outcome.samples_ms) == {ORIGINAL, CANDIDATE}
    assert any("unchanged inputs only" in w for w in outcome.warnings)


def test_inout_arrays_start_from_the_pristine_input_in_every_run():
    spec = parse_spec({
        "kernel": "inc", "params": [
            {"name": "n", "scalar": "int32", "value": 256},
            {"name": "v", "array": "int32", "size": "n", "init": "randint(0,9)", "role": "inout"},
        ], "grid": [1, 1, 1], "block": [256, 1, 1],
    })
    starts = []

    def inc(args, launch, backend):
        starts.append(args[1].copy())
        args[1][:] += 1

    outcome = Verification(NumpyBackend(inc, inc), spec).check([1, 2])
    assert outcome.reason is None
    assert all(np.array_equal(s, starts[0]) for s in starts[:3]) and starts[0].max() <= 9
    assert POISON_BITS["int32"] not in {int(v) for v in starts[0].view(np.uint32)}
