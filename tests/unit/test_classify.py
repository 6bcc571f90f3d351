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
