"""Bottleneck classification on the recorded full profiles, and with metrics missing."""

from __future__ import annotations

import os

import pytest

from kernel_lsp.core import classify as C
from kernel_lsp.core import profile as P
from kernel_lsp.services.tree_dataset import load_dataset

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ncu")


@pytest.fixture(scope="module")
def kernels() -> dict[str, dict[str, float]]:
    samples = load_dataset(os.path.join(FIX, "dataset"))
    return {s.name.split(":")[1]: s.metrics for s in samples}


# Kernel -> (coarse class, finer class) expected from what each program was written to do.
EXPECTED = {
    "stream_triad": ("memory-bound", "dram-bandwidth"),
    "strided_gather": ("memory-bound", "uncoalesced-access"),
    "z_stride8": ("memory-bound", "uncoalesced-access"),
    "z_transpose_naive": ("memory-bound", "uncoalesced-access"),
    "transpose_smem_conflict": ("latency-bound", "shared-bank-conflicts"),
    "fma_chains": ("compute-bound", "fp32-pipe"),
    "z_dmath": ("compute-bound", "fp64-pipe"),
    "z_sfu": ("compute-bound", "xu-pipe"),
    "z_divergent": ("compute-bound", "divergence"),
    "tiny_chase": ("latency-bound", "insufficient-parallelism"),
    "z_small_grid": ("latency-bound", "insufficient-parallelism"),
    "z_smem_heavy": ("occupancy-limited", "low-occupancy-shared"),
    "z_copy": ("latency-bound", "memory-latency"),
    # Its SM throughput reads 89 % (the barriers' own issue), but half of its stalls wait at __syncthreads.
    "z_barrier_heavy": ("compute-bound", "barrier-stalls"),
}


@pytest.mark.parametrize("kernel", sorted(EXPECTED))
def test_recorded_kernels_get_the_class_they_were_written_for(kernels, kernel):
    result = C.classify(kernels[kernel])
    assert (result.primary, result.detail) == EXPECTED[kernel]
    assert result.evidence, "every decision names its evidence"
    assert result.detail in C.DETAILS


def test_evidence_names_metric_value_and_threshold(kernels):
    result = C.classify(kernels["strided_gather"])
    texts = [e.text() for e in result.evidence]
    assert any(P.M_MEMORY_PCT in t and ">= 60" in t for t in texts)
    uncoalesced = next(e for e in result.evidence if e.metric == "excessive_sectors_pct")
    assert uncoalesced.value > 25 and uncoalesced.threshold == 25


def test_register_heavy_kernel_is_compute_bound_despite_low_occupancy(kernels):
    # 168 registers give 12.5 % theoretical occupancy, but its FMA pipe is still busy: SOL wins
    m = kernels["register_heavy"]
    assert m[P.M_THEORETICAL_OCC] == 12.5
    assert C.classify(m).primary == "compute-bound"


def test_occupancy_limiter_is_named_from_the_block_limits():
    metrics = {P.M_MEMORY_PCT: 10.0, P.M_SM_PCT: 12.0, P.M_WAVES: 3.0, P.M_THEORETICAL_OCC: 25.0,
               P.M_LIMIT_REGISTERS: 1.0, P.M_LIMIT_SHARED: 4.0, P.M_LIMIT_WARPS: 2.0, P.M_LIMIT_BLOCKS: 32.0}
    result = C.classify(metrics)
    assert (result.primary, result.detail) == ("occupancy-limited", "low-occupancy-registers")
    assert result.evidence[-1].metric == P.M_LIMIT_REGISTERS


def test_missing_metrics_never_decide(kernels):
    full = kernels["strided_gather"]
    sol_only = {k: v for k, v in full.items() if k in (P.M_MEMORY_PCT, P.M_SM_PCT, P.M_DRAM_PCT)}
    result = C.classify(sol_only)
    assert result.primary == "memory-bound" and result.detail is None  # no source counters: cause unknown
    assert C.classify({}).primary == "unknown"
    no_stalls = {P.M_MEMORY_PCT: 20.0, P.M_SM_PCT: 20.0, P.M_WAVES: 4.0, P.M_THEORETICAL_OCC: 100.0}
    assert C.classify(no_stalls).label == "latency-bound"


def test_thresholds_are_parameters(kernels):
    m = kernels["transpose_smem_conflict"]  # memory throughput 59.5 %, just below 60
    assert C.classify(m).primary == "latency-bound"
    lower = C.Thresholds(high_throughput_pct=55.0)
    assert (C.classify(m, lower).primary, C.classify(m, lower).detail) == ("memory-bound", "shared-bank-conflicts")


def _stalls(**shares: float) -> dict[str, float]:
    return {P.stall_metric(reason): value for reason, value in shares.items()}


# A shared-memory reduction as a tree profile may read it: busy, its LSU pipe (or L1) the busiest, most
# stalls at barriers. The full profile of the same kernel read it latency-bound, barrier-stalls.
BUSY_LSU = {P.M_MEMORY_PCT: 48.0, P.M_SM_PCT: 71.0, C.PIPE_METRICS["lsu-pipe"]: 72.0, C.PIPE_METRICS["alu-pipe"]: 30.0}
BUSY_L1 = {P.M_MEMORY_PCT: 77.0, P.M_SM_PCT: 40.0, P.M_DRAM_PCT: 18.0, P.M_EXCESSIVE_SECTORS: 0.0,
           P.M_GLOBAL_SECTORS_THEORETICAL: 1000.0, P.M_GLOBAL_SECTORS_IDEAL: 1000.0,
           P.M_SHARED_WAVEFRONTS: 100.0, P.M_SHARED_WAVEFRONTS_IDEAL: 100.0}


@pytest.mark.parametrize("busy, without", [(BUSY_LSU, "lsu-pipe"), (BUSY_L1, "cache-bandwidth")])
def test_a_busy_kernel_waiting_at_barriers_is_barrier_bound_by_its_stall_counters(busy, without):
    assert C.classify(busy).label == without
    barrier_bound = C.classify({**busy, **_stalls(barrier=3.0, long_scoreboard=1.0, short_scoreboard=1.0)})
    assert barrier_bound.label == "barrier-stalls"
    assert any(e.metric == "stall share: barrier + membar" and e.value == pytest.approx(60.0)
               for e in barrier_bound.evidence)
    # Barriers that are not most of the stalls, or not the first reason, decide nothing.
    assert C.classify({**busy, **_stalls(barrier=2.0, long_scoreboard=1.0, wait=1.5)}).label == without
    assert C.classify({**busy, **_stalls(barrier=4.0, long_scoreboard=5.0)}).label == without


def test_an_access_problem_comes_before_barriers():
    conflicts = {**BUSY_L1, P.M_SHARED_WAVEFRONTS: 400.0, **_stalls(barrier=3.0, long_scoreboard=1.0)}
    assert C.classify(conflicts).label == "shared-bank-conflicts"
