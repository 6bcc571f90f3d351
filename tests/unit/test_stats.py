"""Quantiles and the bootstrap interval on a ratio of medians."""

import numpy as np
import pytest

from kernel_lsp.core.stats import distribution, quantile, ratio_of_medians_ci


def test_quantiles_interpolate_linearly():
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    assert quantile([10], 0.9) == 10
    assert quantile([0, 10], 0.1) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile([1], 1.5)


def test_distribution_fields_are_in_order():
    d = distribution(list(range(1, 101)))
    assert d.trials == 100 and d.p10_ms < d.median_ms < d.p90_ms and d.median_ms == 50.5


def test_ci_contains_the_true_ratio_and_is_seeded():
    rng = np.random.default_rng(5)
    original = rng.normal(2.0, 0.05, 100)
    candidate = rng.normal(1.0, 0.025, 100)
    a = ratio_of_medians_ci(original, candidate, seed=3)
    b = ratio_of_medians_ci(original, candidate, seed=3)
    assert a == b
    assert a.low < 2.0 < a.high and a.low < a.ratio < a.high
    assert a.high - a.low < 0.1


def test_ci_lower_bound_below_one_for_equal_kernels():
    rng = np.random.default_rng(6)
    same = rng.normal(1.0, 0.02, 60)
    ci = ratio_of_medians_ci(same, rng.normal(1.0, 0.02, 60), seed=0)
    assert ci.low < 1.0 < ci.high


def test_more_noise_gives_a_wider_interval():
    rng = np.random.default_rng(7)
    quiet = ratio_of_medians_ci(rng.normal(2, 0.01, 50), rng.normal(1, 0.01, 50))
    noisy = ratio_of_medians_ci(rng.normal(2, 0.3, 50), rng.normal(1, 0.3, 50))
    assert (noisy.high - noisy.low) > 5 * (quiet.high - quiet.low)


def test_bad_input():
    with pytest.raises(ValueError):
        ratio_of_medians_ci([], [1.0])
    with pytest.raises(ValueError):
        ratio_of_medians_ci([1.0], [0.0])
