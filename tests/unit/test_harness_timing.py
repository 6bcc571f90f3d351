"""What is timed is what was checked: launch counts, checked timed launches, redrawn inputs, the collapse rule.

The cheats are numpy "kernels" on :class:`test_harness_protocol.NumpyBackend` that behave as the CUDA
ones of ``examples/`` do: module state in ``backend.state``, the time of a timed launch as the kernel's
return value (milliseconds).
"""

import numpy as np
import pytest

from kernel_lsp.core import stats
from kernel_lsp.core.verdict import Reason, Verdict
from kernel_lsp.services.harness.protocol import CANDIDATE, ORIGINAL, TimingOptions, Verification
from kernel_lsp.services.harness.verify import VerifyOptions, _speed_verdict
from test_harness_protocol import SPEC, NumpyBackend, axpy

TIMING = TimingOptions(budget_s=1e9, min_trials=10, max_trials=60, warmup=3)


def _counter(backend) -> int:
    state = backend.state[CANDIDATE]
    count = int.from_bytes(state.get("launches", bytes(4)), "little") + 1
    state["launches"] = bytearray(count.to_bytes(4, "little"))
    return count


def _last_launch_key(args, backend) -> bytes:
    """What a "remember the last launch" cheat keeps: both pointers, the size and a few sampled input values."""
    n, a, x, z = args
    return b"".join((backend.arr(x).address.to_bytes(8, "little"), backend.arr(z).address.to_bytes(8, "little"),
                     int(n).to_bytes(4, "little"), x[: min(4, n)].tobytes(), x[n // 2 : n // 2 + 1].tobytes()))


def _original(args, launch, backend):
    axpy(args, launch)
    return 2.0


def _verify(candidate, spec=SPEC, timing=TIMING):
    backend = NumpyBackend(_original, candidate)
    verification = Verification(backend, spec)
    outcome = verification.check([1, 2, 3])
    if outcome.reason is None:
        outcome = verification.measure(1, timing)
    return outcome, backend


def _verdict(outcome) -> Verdict:
    options = VerifyOptions()

    def verdict(reason, errors=(), **fields):
        return Verdict(accepted=reason is Reason.OK, reason=reason, errors=tuple(errors), **fields)

    return _speed_verdict(outcome.samples_ms, options, verdict, {})


def test_returning_at_once_when_launched_again_on_what_it_saw_last_is_history_dependent():
    def remember_last(args, launch, backend):
        key = _last_launch_key(args, backend)
        if backend.state[CANDIDATE].get("last") == key:
            return 0.01
        axpy(args, launch)
        backend.state[CANDIDATE]["last"] = bytearray(key)
        return 1.0

    outcome, _ = _verify(remember_last)
    # Every seed, the other addresses and the variants draw or place new inputs; the launch counts' first launch
    # follows the replay of seed 1 in the same buffer (the cheat keeps module state), and it returns at once.
    assert outcome.reason == "history_dependent" and outcome.errors[0].startswith("seed 1, after 1 candidate launch in a row")
    assert "never written" in outcome.errors[0]


def test_skipping_work_after_a_warm_up_fails_the_launch_counts():
    def skip_after_warm_up(args, launch, backend):
        if _counter(backend) > 20:
            return 0.01
        axpy(args, launch)
        return 1.0

    outcome, _ = _verify(skip_after_warm_up)
    # 10 launches before the launch counts (3 seeds twice, other addresses, 2 variants, the replay its counter
    # asks for), then runs of 1, 2, 3 and 5: the 21st launch, the last of the run of 5, writes nothing.
    assert outcome.reason == "history_dependent" and "after 5 candidate launches in a row (11 in this check" in outcome.errors[0]


def test_skipping_every_other_launch_after_the_checks_is_caught_in_the_timed_launches():
    def skip_late(args, launch, backend):
        count = _counter(backend)
        if count > 60 and count % 2 == 0:
            return 0.01
        axpy(args, launch)
        return 1.0

    outcome, backend = _verify(skip_late)
    assert outcome.reason == "timed_mismatch" and outcome.errors[0].startswith("timed pair")
    assert "never written" in outcome.errors[0] and "what was timed is not what was checked" in outcome.errors[0]
    assert outcome.timed_checks >= 1


def test_a_store_out_of_range_in_timed_launches_only_is_caught_there():
    def stray_store_late(args, launch, backend):
        axpy(args, launch)
        if _counter(backend) > 60:
            arr = backend.arr(args[3])
            arr.raw[arr.guard + arr.nbytes] = 0
        return 1.0

    outcome, _ = _verify(stray_store_late)
    assert outcome.reason == "timed_mismatch" and "written out of range" in outcome.errors[0]


def test_a_replay_of_the_last_output_collapses_when_the_inputs_are_redrawn():
    def replay_last(args, launch, backend):
        n, a, x, z = args
        state = backend.state[CANDIDATE]
        key = _last_launch_key(args, backend)
        if state.get("last") == key:
            z[:n] = np.frombuffer(bytes(state["kept"]), dtype=np.float32)
            return 0.05
        axpy(args, launch)
        state["last"], state["kept"] = bytearray(key), bytearray(z[:n].tobytes())
        return 1.0

    outcome, _ = _verify(replay_last)
    # Its outputs are right in every launch: only the two series' speeds tell it apart.
    assert outcome.reason is None
    assert np.median(outcome.samples_ms[CANDIDATE]) == pytest.approx(0.05, rel=0.05)
    assert np.median(outcome.samples_ms["candidate_redrawn"]) == pytest.approx(1.0, rel=0.05)
    verdict = _verdict(outcome)
    assert verdict.reason is Reason.SPEEDUP_COLLAPSE and not verdict.accepted
    assert verdict.unchanged_speedup[0] == pytest.approx(40, rel=0.1) and verdict.redrawn_speedup[0] == pytest.approx(2, rel=0.1)


def test_speed_that_depends_on_the_data_drawn_from_one_distribution_does_not_collapse():
    def data_dependent(args, launch, backend):
        n, a, x, z = args
        axpy(args, launch)
        # Like a histogram's contention or a CSR row's length: the time follows the values drawn.
        return 1.0 * (1 + 0.2 * float(np.abs(x[:n]).mean()))

    outcome, _ = _verify(data_dependent)
    verdict = _verdict(outcome)
    assert verdict.reason is Reason.OK and verdict.speedup == pytest.approx(2 / 1.1, rel=0.05)


def test_float_atomics_differing_in_the_last_bits_every_launch_stay_accepted_and_are_compared_on_the_device():
    def atomics(args, launch, backend):
        n, a, x, z = args
        axpy(args, launch)
        # Another summation order per launch: a relative change of one unit in the last place or so.
        z[:n] *= np.float32(1) + np.float32(2 ** -23) * backend.rng.integers(-1, 2, n).astype(np.float32)
        return 1.0

    outcome, backend = _verify(atomics)
    assert outcome.reason is None and 0 < outcome.max_rel_error < 1e-6
    assert backend.summaries >= outcome.timed_checks > 0
    assert _verdict(outcome).reason is Reason.OK


def test_module_state_reset_on_every_launch_stays_accepted():
    def last_block(args, launch, backend):
        # A last-block reduction: partial results and a counter in module state, the counter reset by the last block.
        state = backend.state[CANDIDATE]
        axpy(args, launch)
        state["partials"] = bytearray(np.asarray(args[3][:4]).tobytes())
        state["done"] = bytearray(bytes(4))
        return 1.0

    outcome, _ = _verify(last_block)
    assert outcome.reason is None and any("writes module state" in w for w in outcome.warnings)
    assert _verdict(outcome).reason is Reason.OK


def test_timed_checks_follow_the_seed():
    def counts(seed):
        backend = NumpyBackend(_original, lambda args, launch, b: (axpy(args, launch), 1.0)[1])
        verification = Verification(backend, SPEC)
        verification.check([seed])
        return verification.measure(seed, TIMING).timed_checks

    assert counts(1) == counts(1)
    # First and last pair of both series, and about an eighth of the other 2 x 58.
    assert 4 + 5 <= counts(1) <= 4 + 25


def test_collapse_rule():
    fast = stats.RatioCI(12.0, 11.8, 12.2, 0.95, 2000)
    assert stats.collapsed(fast, stats.RatioCI(1.0, 0.98, 1.02, 0.95, 2000))
    # Within the margin: a genuine kernel's series differ by noise and drift, far less than a quarter.
    assert not stats.collapsed(fast, stats.RatioCI(10.0, 9.8, 10.2, 0.95, 2000))
    # Overlapping intervals never collapse, however wide.
    assert not stats.collapsed(stats.RatioCI(3.0, 1.5, 6.0, 0.95, 2000), stats.RatioCI(1.2, 1.0, 1.4, 0.95, 2000))


def _samples(original_ms, candidate_ms, redrawn_candidate_ms, n=40, seed=0):
    rng = np.random.default_rng(seed)

    def noisy(ms):
        return list(ms * (1 + 0.01 * rng.standard_normal(n)))

    return {ORIGINAL: noisy(original_ms), CANDIDATE: noisy(candidate_ms),
            "original_redrawn": noisy(original_ms), "candidate_redrawn": noisy(redrawn_candidate_ms)}


def test_the_verdict_shows_the_harder_series_and_needs_both_fast_enough():
    outcome = type("O", (), {"samples_ms": _samples(2.0, 1.0, 1.1)})
    verdict = _verdict(outcome)
    assert verdict.reason is Reason.OK and verdict.speedup == pytest.approx(2 / 1.1, rel=0.02)
    assert verdict.speedup == verdict.redrawn_speedup[0] and verdict.unchanged_speedup[0] == pytest.approx(2.0, rel=0.02)
    outcome = type("O", (), {"samples_ms": _samples(1.2, 1.0, 1.18)})
    verdict = _verdict(outcome)
    assert verdict.reason is Reason.NOT_FASTER and "on redrawn inputs" in verdict.errors[0]


def test_the_new_evidence_survives_the_json_round_trip():
    import json

    verdict = Verdict(accepted=False, reason=Reason.SPEEDUP_COLLAPSE, errors=("collapses",), speedup=1.0, speedup_ci_low=0.98,
                      speedup_ci_high=1.02, unchanged_speedup=(12.0, 11.8, 12.2), redrawn_speedup=(1.0, 0.98, 1.02), timed_checks=17)
    data = json.loads(json.dumps(verdict.to_json()))
    assert data["reason"] == "speedup_collapse" and data["redrawn_speedup"] == [1.0, 0.98, 1.02]
    assert Verdict.from_json(data) == verdict
    # Verdicts written before these fields existed still read.
    old = {k: v for k, v in data.items() if k not in ("unchanged_speedup", "redrawn_speedup", "timed_checks", "sizes_tried", "fixed_sizes")}
    assert Verdict.from_json(old).redrawn_speedup is None and Verdict.from_json(old).fixed_sizes == {}
