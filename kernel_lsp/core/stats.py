"""Statistics for timing: quantiles and a bootstrap interval on a ratio of medians.

Pure and deterministic: the bootstrap draws from ``numpy.random.default_rng(seed)``,
so the same samples and seed give the same interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def quantile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) with linear interpolation between order statistics."""
    if not samples:
        raise ValueError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    return float(np.quantile(np.asarray(samples, dtype=np.float64), q))


@dataclass(frozen=True)
class Distribution:
    median_ms: float
    p10_ms: float
    p90_ms: float
    trials: int


def distribution(samples_ms: Sequence[float]) -> Distribution:
    """Median, 10th and 90th percentiles of timings in milliseconds."""
    return Distribution(quantile(samples_ms, 0.5), quantile(samples_ms, 0.1), quantile(samples_ms, 0.9), len(samples_ms))


@dataclass(frozen=True)
class RatioCI:
    ratio: float
    """median(numerator) / median(denominator) of the samples themselves."""
    low: float
    high: float
    level: float
    resamples: int


def ratio_of_medians_ci(numerator: Sequence[float], denominator: Sequence[float], *, seed: int = 0, resamples: int = 2000, level: float = 0.95) -> RatioCI:
    """Percentile-bootstrap interval for median(numerator) / median(denominator).

    The two samples are resampled independently (they are separate kernels'
    timings; interleaving the trials already cancels slow drift). For a speedup,
    pass the original's times as ``numerator`` and the rewrite's as ``denominator``.
    """
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)
    if num.size == 0 or den.size == 0:
        raise ValueError("ratio of medians needs samples on both sides")
    if (den <= 0).any() or (num <= 0).any():
        raise ValueError("timings must be positive")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    num_medians = np.median(num[rng.integers(0, num.size, (resamples, num.size))], axis=1)
    den_medians = np.median(den[rng.integers(0, den.size, (resamples, den.size))], axis=1)
    ratios = num_medians / den_medians
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return RatioCI(float(np.median(num) / np.median(den)), float(low), float(high), level, resamples)


#: How far apart the two series' intervals must be before a speedup counts as collapsed (a ratio).
COLLAPSE_MARGIN = 1.25


def collapsed(unchanged: RatioCI, redrawn: RatioCI, margin: float = COLLAPSE_MARGIN) -> bool:
    """Whether the speedup on inputs redrawn between trials collapsed against the one on unchanged inputs.

    The rule: the redrawn series' interval lies wholly below the unchanged series' interval, with a
    gap of ``margin`` as a ratio: ``redrawn.high * margin < unchanged.low``.

    Why the margin is safe for a genuine kernel: its time does not depend on the values it reads, or
    (atomics contention in a histogram, row lengths of a CSR matrix, early exits) depends on them only
    through their distribution, and every redraw comes from the same distribution as the unchanged
    input, so both series sample the same time distribution. What separates them is the timing
    noise (inside the intervals already), clock drift between the two series (both kernels of a pair
    share it, so the ratio moves only by the difference in their sensitivity to the clock: a few per
    cent), and how far one input's time lies from the distribution's median (for inputs large enough
    to time, far under 10 %: contention and row lengths average over thousands of elements). A gap
    beyond the intervals of 25 % is none of these. A candidate that skips or replays work when it is
    launched again on what it saw before gains the whole kernel's work (12x in issue 24), so it
    shows a gap far beyond the margin.
    """
    return redrawn.high * margin < unchanged.low
