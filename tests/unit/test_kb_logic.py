"""The pure knowledge-base rules: matching, selection, update, examples."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from kernel_lsp.core import kb_logic
from kernel_lsp.core.kb_logic import Entry, Example, KeySpec, State

BW = State("bw", "bandwidth", {"dram_throughput_pct": KeySpec(80, 3, 15, "min"), "sm_throughput_pct": KeySpec(40, 1, 25, "max")})
COMPUTE = State("compute", "compute", {"sm_throughput_pct": KeySpec(80, 3, 15, "min"), "dram_throughput_pct": KeySpec(40, 1, 25, "max")})
BALANCED = State("balanced", "both", {"sm_throughput_pct": KeySpec(60, 1, 20), "dram_throughput_pct": KeySpec(60, 1, 20)})
STATES = [BW, COMPUTE, BALANCED]


# ---------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("signature", "expected"),
    [
        ({"dram_throughput_pct": 95, "sm_throughput_pct": 20}, "bw"),
        ({"dram_throughput_pct": 15, "sm_throughput_pct": 92}, "compute"),
        ({"dram_throughput_pct": 58, "sm_throughput_pct": 63}, "balanced"),
    ],
)
def test_nearest_state_wins(signature, expected):
    match = kb_logic.match_state(signature, STATES)
    assert match.state == expected
    assert not match.is_new
    assert match.distance is not None and match.distance <= kb_logic.MATCH_THRESHOLD


def test_distance_formula_two_sided_and_bounds():
    # balanced: sqrt((1*(70-60)/20)^2 + 1*((40-60)/20)^2) / 2) = sqrt((0.25 + 1) / 2)
    assert kb_logic.state_distance({"sm_throughput_pct": 70, "dram_throughput_pct": 40}, BALANCED)[0] == pytest.approx(math.sqrt(1.25 / 2))
    # A min bound costs nothing above the centre and counts below it.
    assert kb_logic.state_distance({"dram_throughput_pct": 99, "sm_throughput_pct": 10}, BW)[0] == 0.0
    assert kb_logic.state_distance({"dram_throughput_pct": 65, "sm_throughput_pct": 10}, BW)[0] == pytest.approx(math.sqrt(3 * 1.0 / 4))


def test_missing_keys_count_and_coverage_gate():
    # Only the weight-1 key of BW is known: coverage 1/4 < MIN_COVERAGE, so BW is not comparable.
    only_sm = {"sm_throughput_pct": 10}
    distance, coverage = kb_logic.state_distance(only_sm, BW)
    assert coverage == pytest.approx(0.25)
    assert distance == pytest.approx(math.sqrt(3 / 4))  # the missing dram key counts one scale
    assert kb_logic.match_state(only_sm, [BW]).state == kb_logic.FALLBACK_STATE
    assert kb_logic.match_state({}, STATES).distance is None


def test_far_signature_derives_new_state_deterministically():
    signature = {"dram_throughput_pct": 5, "sm_throughput_pct": 5}
    first = kb_logic.match_state(signature, STATES)
    second = kb_logic.match_state(dict(reversed(list(signature.items()))), STATES)
    assert first.is_new and first == second
    nearest = min(STATES, key=lambda s: (kb_logic.state_distance(signature, s)[0], s.name))
    assert first.parent == nearest.name
    assert first.state.startswith(nearest.name + "~")
    derived = first.derived
    assert derived is not None and derived.parent == nearest.name
    # Same keys, weights, scales and bounds as the parent, centred on the signature.
    assert set(derived.signature) == set(nearest.signature)
    for key, spec in derived.signature.items():
        assert spec.value == signature[key]
        assert (spec.weight, spec.scale, spec.bound) == (nearest.signature[key].weight, nearest.signature[key].scale, nearest.signature[key].bound)
    # Once stored, the same signature matches the derived state itself at distance 0.
    again = kb_logic.match_state(signature, STATES + [derived])
    assert (again.state, again.distance, again.is_new) == (derived.name, 0.0, False)


def test_inherited_entries_are_discounted():
    parent = [Entry("bw", "kernel-fusion", 1.5, 0.6, 4, 3), Entry("bw", "x", 1.1, 0.1, 0, 0)]
    child = kb_logic.inherit_entries(parent, "bw~1")
    assert [e.state for e in child] == ["bw~1", "bw~1"]
    assert child[0].confidence == pytest.approx(0.48)
    assert child[0].predicted_speedup == 1.5 and child[0].attempts == 4
    assert child[1].confidence == kb_logic.CONFIDENCE_MIN  # clamped, never below 0.1


# ---------------------------------------------------------------- update rule


def test_update_accurate_prediction_raises_confidence_and_averages():
    entry = Entry("s", "t", 1.5, 0.5, 1, 1)
    updated = kb_logic.update_entry(entry, 1.6, accepted=True)  # 1.6 / 1.5 = 1.07, inside [0.8, 1.2]
    assert updated.predicted_speedup == pytest.approx((1.5 * 1 + 1.6) / 2)
    assert updated.confidence == pytest.approx(0.6)
    assert (updated.attempts, updated.successes) == (2, 2)


def test_update_wrong_prediction_lowers_confidence():
    entry = Entry("s", "t", 2.0, 0.5, 3, 2)
    updated = kb_logic.update_entry(entry, 1.1, accepted=True)  # 0.55 of the prediction
    assert updated.confidence == pytest.approx(0.4)
    assert updated.predicted_speedup == pytest.approx(2.0 + (1.1 - 2.0) / 4)


def test_failures_use_failure_value_and_clamp():
    entry = Entry("s", "t", 1.3, 0.15, 0, 0)
    failed = kb_logic.update_entry(entry, None, accepted=False)
    assert failed.predicted_speedup == kb_logic.FAILURE_SPEEDUP  # first real observation replaces a 0-count prior
    assert failed.confidence == kb_logic.CONFIDENCE_MIN
    assert (failed.attempts, failed.successes) == (1, 0)
    slower = kb_logic.update_entry(Entry("s", "t", 1.0, 1.0, 1, 1), 0.9, accepted=False)
    assert slower.predicted_speedup == pytest.approx(0.95)  # a correct but slower candidate counts as measured
    assert slower.confidence == 1.0  # clamped at the top


def test_failures_lose_selection_weight():
    entry = Entry("s", "t", 1.5, 0.6, 2, 1)
    weights = [kb_logic.selection_weight(entry)]
    for _ in range(3):
        entry = kb_logic.update_entry(entry, None, accepted=False)
        weights.append(kb_logic.selection_weight(entry))
    assert weights == sorted(weights, reverse=True) and weights[-1] < weights[0] / 3


def test_replay_matches_incremental_updates():
    priors = [Entry("s", "a", 1.4, 0.5, 2, 1)]
    log = [("s", "a", 1.3, True), ("s", "b", 1.2, True), ("s", "a", None, False), ("s", "a", 1.45, True)]
    entry_a = priors[0]
    for _, technique, speedup, accepted in log:
        if technique == "a":
            entry_a = kb_logic.update_entry(entry_a, speedup, accepted)
    replayed = kb_logic.replay(priors, log)
    assert replayed[("s", "a")] == entry_a
    assert replayed[("s", "b")] == kb_logic.update_entry(kb_logic.default_entry("s", "b"), 1.2, True)


# ---------------------------------------------------------------- selection


def test_selection_weight_formula():
    entry = Entry("s", "t", 1.8, 0.5, 2, 1)
    expected = 0.8 * 0.5 * (1 + 1) / (2 + 2) + kb_logic.EXPLORATION / math.sqrt(3)
    assert kb_logic.selection_weight(entry) == pytest.approx(expected)


def test_selection_is_seedable_and_without_replacement():
    entries = [Entry("s", f"t{i}", 1.0 + i / 10, 0.5, 2, 1) for i in range(8)]
    a = kb_logic.select(entries, 3, seed=7)
    b = kb_logic.select(entries, 3, seed=7)
    assert a == b and len({c.technique for c in a}) == 3
    assert kb_logic.select(entries, 0, seed=1) == [] and kb_logic.select([], 3, seed=1) == []


def test_selection_distribution_follows_weight():
    entries = [
        Entry("s", "strong", 2.0, 0.8, 10, 8),
        Entry("s", "medium", 1.4, 0.6, 10, 6),
        Entry("s", "weak", 1.05, 0.3, 10, 3),
    ]
    weights = {e.technique: kb_logic.selection_weight(e) for e in entries}
    draws = Counter(kb_logic.select(entries, 1, seed=seed)[0].technique for seed in range(4000))
    assert draws["strong"] > draws["medium"] > draws["weak"] > 0
    total = sum(weights.values())
    for name, weight in weights.items():
        assert draws[name] / 4000 == pytest.approx(weight / total, abs=0.03)


def test_exploration_bonus_is_measurable():
    # Same prediction and confidence; one entry never tried, one tried 50 times at the same success rate.
    tried = Entry("s", "tried", 1.3, 0.5, 50, 25)
    fresh = Entry("s", "fresh", 1.3, 0.5, 0, 0)
    draws = Counter(kb_logic.select([tried, fresh], 1, seed=seed)[0].technique for seed in range(4000))
    assert draws["fresh"] > draws["tried"] * 1.4
    without = Counter(kb_logic.select([tried, fresh], 1, seed=seed, exploration=0.0)[0].technique for seed in range(4000))
    assert abs(without["fresh"] - without["tried"]) < 250  # no bonus: both about even
    assert draws["fresh"] - without["fresh"] > 400


def test_pool_limits_to_top_weights():
    entries = [Entry("s", f"t{i:02d}", 1.0 + i / 10, 0.5, 2, 1) for i in range(12)]
    picked = {c.technique for seed in range(300) for c in kb_logic.select(entries, 2, seed=seed)}
    # pool = 3k = 6 highest weights: t06..t11
    assert picked == {f"t{i:02d}" for i in range(6, 12)}


# ---------------------------------------------------------------- examples


def test_feature_distance():
    a = {"loops": 2, "uses_shared": True, "dtype": "float"}
    assert kb_logic.feature_distance(a, a) == 0.0
    assert kb_logic.feature_distance(a, {}) == 1.0
    near = kb_logic.feature_distance(a, {"loops": 3, "uses_shared": True, "dtype": "float"})
    far = kb_logic.feature_distance(a, {"loops": 9, "uses_shared": False, "dtype": "half"})
    assert 0 < near < far < 1


def test_kernel_excerpt_matches_braces_outside_comments():
    source = (
        "#include <cstdio>\n__device__ int helper() { return 1; }\n"
        "template <int N>\n__global__ void k(float* x) {\n  // a } in a comment\n  const char* s = \"}\";\n"
        "  if (x) { x[0] = N; }\n}\nint main() { return 0; }\n"
    )
    excerpt = kb_logic.kernel_excerpt(source, "k")
    assert excerpt.startswith("template <int N>\n__global__ void k")
    assert excerpt.endswith("x[0] = N; }\n}")
    assert kb_logic.kernel_excerpt(source, "missing") == source


def test_fit_examples_keeps_whole_examples_within_budget():
    big = Example("t", "a" * 600, "b" * 600, "user")
    small = Example("t", "c" * 100, "d" * 100, "user")
    assert kb_logic.fit_examples([big, small], 2, 1000) == [small]
    both = kb_logic.fit_examples([small, small], 2, 1000)
    assert len(both) == 2 and sum(e.chars for e in both) <= 1000
    lines = Example("t", "line\n" * 400, "line\n" * 400, "catalogue")
    cut = kb_logic.fit_examples([lines], 1, 1000)
    assert cut[0].truncated and cut[0].chars <= 1000 and cut[0].before.endswith("(truncated)")
