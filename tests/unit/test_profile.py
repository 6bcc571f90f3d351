"""KernelProfile: derived values, signature keys, regressions, JSON round trip."""

from __future__ import annotations

import gzip
import os
from dataclasses import replace

import pytest

from kernel_lsp.core import profile as P
from kernel_lsp.core.profile_render import kernel_markdown
from kernel_lsp.core.signature import SIGNATURE_KEYS
from kernel_lsp.services.ncu_reader import parse_raw_csv

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ncu")


def full(name: str) -> P.KernelProfile:
    with gzip.open(os.path.join(FIX, "dataset", f"{name}_full.csv.gz"), "rt") as f:
        record = parse_raw_csv(f.read())[0]
    return P.KernelProfile(record.name, metrics=record.metrics)


def test_signature_uses_only_shared_keys_and_real_values():
    p = full("stream")
    sig = p.signature()
    assert set(sig) <= set(SIGNATURE_KEYS)
    assert sig["duration_us"] == pytest.approx(p.metrics[P.M_DURATION_NS] / 1000)
    assert sig["dram_throughput_pct"] > 60 and sig["global_sectors_per_request"] == 4.0
    assert sig["branch_divergence_pct"] == 0.0  # no divergent targets, whatever the uniform % says
    assert sum(v for k, v in sig.items() if k.startswith("stall_")) <= 100.0


def test_stall_shares_sum_to_100_and_skip_absent_reasons():
    shares = P.stall_shares({P.stall_metric("long_scoreboard"): 3.0, P.stall_metric("wait"): 1.0})
    assert shares == {"long_scoreboard": 75.0, "wait": 25.0}
    assert P.stall_shares({}) == {}


def test_unknown_values_are_none_not_zero():
    p = P.KernelProfile("k", metrics={P.M_DURATION_NS: 1000.0})
    assert p.memory_throughput_pct is None and p.excessive_sectors_pct is None and p.shared_bytes_per_block is None
    assert p.signature() == {"duration_us": 1.0}


def test_regression_needs_more_than_the_noise():
    before = P.KernelProfile("k", duration_samples_us=(100.0, 101.0, 99.0))
    same = P.KernelProfile("k", duration_samples_us=(102.0, 101.5, 102.5))
    slower = P.KernelProfile("k", duration_samples_us=(120.0, 121.0, 119.0))
    noisy = P.KernelProfile("k", duration_samples_us=(100.0, 130.0, 120.0))
    assert P.regression(before, same) is None
    r = P.regression(before, slower)
    assert r is not None and r.previous_us == 100.0 and r.current_us == 120.0 and r.slowdown_pct == pytest.approx(20.0)
    # the new profile's own spread (30 %) is larger than its slowdown (20 %): not reported
    assert P.regression(before, noisy) is None
    single = P.KernelProfile("k", metrics={P.M_DURATION_NS: 104_000.0})
    assert P.regression(P.KernelProfile("k", metrics={P.M_DURATION_NS: 100_000.0}), single) is not None


def test_json_round_trip_keeps_everything():
    p = full("bank_conflict")
    p = P.KernelProfile(
        p.kernel, metrics=p.metrics, rules=(P.RuleAdvice("R", "Rule", "do x", "OPT", 12.5, "global"),),
        lines={16: P.LineCounters("a.cu", 16, {"short_scoreboard": 5.0}, samples_total=9.0, shared_excessive_wavefronts=3.0)},
        source_file="a.cu", sections=("SpeedOfLight",), tree_path=(P.PathStep("busy", "derived.x", None, ">=", 60.0, "missing"),),
        tree_leaf="fallback", state_from="source", passes=12, collection_wall_s=2.5, duration_samples_us=(1.0, 2.0), stale=True, stale_reason="ncu gone",
    )
    assert P.profile_from_json(P.profile_to_json(p)) == p
    older = {k: v for k, v in P.profile_to_json(p).items() if k != "state_from"}
    assert P.profile_from_json(older).state_from == "profile"  # profiles saved before leaves said where to rank from


def test_hottest_lines_and_marked_stale():
    lines = {i: P.LineCounters("a.cu", i, samples_total=float(s)) for i, s in ((3, 10), (4, 50), (5, 0), (6, 30))}
    p = P.KernelProfile("k", lines=lines)
    assert [c.line for c in p.hottest_lines(2)] == [4, 6]
    stale = p.marked_stale("no GPU")
    assert stale.stale and stale.stale_reason == "no GPU" and not p.stale


def test_the_hover_names_what_collected_the_profile():
    base = P.KernelProfile("k", metrics={"gpu__time_duration.sum": 1000.0})
    heads = {collector: kernel_markdown(replace(base, collector=collector), None).split("\n")[0]
             for collector in (P.COLLECTOR_NCU, P.COLLECTOR_CUPTI, None)}
    assert heads == {P.COLLECTOR_NCU: "**Profile** (Nsight Compute)", P.COLLECTOR_CUPTI: "**Profile** (CUPTI)",
                     None: "**Profile**"}
    cupti = replace(base, collector=P.COLLECTOR_CUPTI)
    assert P.profile_from_json(P.profile_to_json(cupti)) == cupti
    # A profile stored before the collector was recorded reads as unknown.
    assert P.profile_from_json({k: v for k, v in P.profile_to_json(cupti).items() if k != "collector"}).collector is None
