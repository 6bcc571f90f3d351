"""What the CUPTI probe recorded on the H200 (tests/fixtures/cupti/recorded), held against the code built on it."""

from __future__ import annotations

import json
import os

import pytest

from kernel_lsp.core import metric_groups
from kernel_lsp.core import profile as P
from kernel_lsp.core.classify import classify
from kernel_lsp.services import cupti_range as C
from kernel_lsp.services import gpu_worker as W
from kernel_lsp.services import ncu_reader

RECORDED = os.path.join(os.path.dirname(__file__), "..", "fixtures", "cupti", "recorded")


@pytest.fixture(scope="module")
def probe() -> dict:
    with open(os.path.join(RECORDED, "probe.json"), encoding="utf-8") as f:
        return json.load(f)


def _step(probe: dict, child: str, step: str) -> dict:
    return next(s for s in probe["steps"] if s["child"] == child and s["step"] == step)


@pytest.fixture(scope="module")
def ncu() -> dict[str, dict[str, float]]:
    with open(os.path.join(RECORDED, "ncu_compare.csv"), encoding="utf-8") as f:
        text = f.read()
    return {r.name: dict(r.metrics) for r in ncu_reader.parse_raw_csv(text[text.index('"ID"'):])}


def test_every_group_the_worker_sends_to_the_range_profiler_was_accepted(probe):
    for group, metrics in metric_groups.GROUPS.items():
        routing = W.route(metrics)
        if not all(m in metrics for m in routing.range):
            continue  # a group with stand-ins: those were not in this probe
        step = _step(probe, "host", f"config:{group}")
        assert step["ok"], (group, step.get("error"))
        assert step["result"]["passes"] >= 1


def test_what_the_host_refused_never_goes_to_the_range_profiler(probe):
    refused = [s["step"].split(":", 1)[1] for s in probe["steps"]
               if s["child"] == "host" and s["step"].startswith("config_extra:") and not s["ok"]]
    refused += [s["step"].split(":", 2)[2] for s in probe["steps"]
                if s["child"] == "host" and s["step"].startswith("config_metric:") and not s["ok"]]
    assert P.M_GLOBAL_SECTORS_IDEAL in refused and P.M_THEORETICAL_OCC in refused
    # ncu's own names (the rest are probe-only candidates nothing asks for)
    ours = [n for n in refused if n.startswith(W.NCU_ONLY_PREFIXES) or n in W.LAUNCH_METRICS]
    assert len(ours) >= 8
    routing = W.route(ours)
    assert not set(routing.range) & set(refused)
    # ...and the host's answer for them is one of the codes the worker treats as "no such metric"
    codes = {s["error_code"] for s in probe["steps"] if s["child"] == "host" and s["step"].startswith("config_extra:")
             and not s["ok"]}
    assert codes <= set(C.UNKNOWN_METRIC_CODES)


def test_launch_statistics_are_the_workers_since_no_counter_gives_them(probe):
    refused = {s["step"].split(":", 1)[1] for s in probe["steps"]
               if s["child"] == "host" and s["step"].startswith("config_extra:") and not s["ok"]}
    for name in (P.M_WAVES, P.M_REGISTERS, P.M_SM_COUNT, P.M_THEORETICAL_OCC):
        assert name in refused and name in W.LAUNCH_METRICS


def test_recorded_pass_counts_are_cheap_next_to_a_process(probe):
    summary = _step(probe, "host", "config_summary")["result"]
    assert summary["throughput"] == 9 and summary["all_hardware"] == 14
    one = _step(probe, "sass", "range_after_sass:saxpy:throughput")["result"]
    assert one["passes"] == 9 and one["rounds"] == 1  # kernel replay: CUPTI replays, one launch from us
    assert one["config_s"] + one["collect_s"] + one["decode_s"] < 0.6


def test_cupti_values_agree_with_ncus_for_the_same_launch(probe, ncu):
    cupti = _step(probe, "sass", "range_after_sass:saxpy:throughput")["result"]["values"]
    by_ncu = ncu["saxpy"]
    assert cupti[P.M_DURATION_NS] == pytest.approx(by_ncu[P.M_DURATION_NS], rel=0.15)
    for name in (P.M_MEMORY_PCT, P.M_SM_PCT, P.M_ACHIEVED_OCC):
        assert abs(cupti[name] - by_ncu[name]) < 5, name


def test_the_recorded_cupti_values_classify_like_ncus(probe, ncu):
    cupti = dict(_step(probe, "sass", "range_after_sass:saxpy:throughput")["result"]["values"])
    launch = W.launch_values(arch="sm_90", grid=(probe["n_floats"] // 256, 1, 1), block=(256, 1, 1), registers=16,
                             static_smem_bytes=0, dynamic_smem_bytes=0, sm_count=132)
    a, b = classify({**cupti, **launch}), classify(ncu["saxpy"])
    assert a.primary == b.primary == "memory-bound"


def test_a_second_profile_per_enable_is_what_broke_so_the_binding_refuses_it(probe):
    kernel_replay = probe["children"]["kernel_replay"]
    assert kernel_replay["returncode"] == -11  # SIGSEGV on the second SetConfig
    later = [s for s in probe["steps"] if s["child"] == "kernel_replay"]
    assert later[-1]["step"] == "profile:saxpy:duration" and later[-1]["ok"]
    second = _step(probe, "user_replay", "user_replay:user_range:saxpy:memory_units")
    assert not second["ok"] and second["error_call"] == "cuptiRangeProfilerStart"


def test_a_fault_loses_the_context_as_the_worker_assumes(probe):
    fault = _step(probe, "fault", "null_write_under_profiler")
    after = _step(probe, "fault", "plain_launch_after_fault")
    assert not fault["ok"] and "illegal memory access" in fault["error"]
    assert not after["ok"] and "illegal memory access" in after["error"]


@pytest.mark.parametrize("kernel", ["saxpy", "strided_copy"])
def test_the_workers_launch_statistics_match_ncus_for_the_probe_kernels(probe, ncu, kernel):
    m = ncu[kernel]
    got = W.launch_values(arch="sm_90", grid=(probe["n_floats"] // 256, 1, 1), block=(256, 1, 1),
                          registers=int(m[P.M_REGISTERS]), static_smem_bytes=0, dynamic_smem_bytes=0, sm_count=132)
    assert got[P.M_GRID_SIZE] == m[P.M_GRID_SIZE] and got[P.M_BLOCK_SIZE] == m[P.M_BLOCK_SIZE]
    assert got[P.M_WAVES] == pytest.approx(m[P.M_WAVES], rel=0.01, abs=0.006)
    assert got[P.M_THEORETICAL_OCC] == pytest.approx(m[P.M_THEORETICAL_OCC], abs=0.5)


@pytest.fixture(scope="module")
def probe2() -> dict:
    with open(os.path.join(RECORDED, "probe2", "probe.json"), encoding="utf-8") as f:
        return json.load(f)


def test_one_enable_per_profile_works_every_time(probe2):
    profiles = [s for s in probe2["steps"] if s["child"] == "kernel_replay" and s["ok"]
                and isinstance(s.get("result"), dict) and "passes" in s["result"]]
    assert len(profiles) >= 25
    assert probe2["children"]["kernel_replay"]["returncode"] == 0
    warm = [s["result"]["config_s"] + s["result"]["collect_s"] + s["result"]["decode_s"] for s in profiles
            if s["step"].startswith("warm_repeat")]
    assert len(warm) == 3 and max(warm) < 0.5


def test_the_sass_formulas_name_what_the_h200_lists(probe2):
    listed = set(_step(probe2, "sass", "sass_available")["result"])
    for name in (P.M_GLOBAL_SECTORS_THEORETICAL, P.M_GLOBAL_SECTORS_IDEAL, P.M_SHARED_WAVEFRONTS, P.M_SHARED_WAVEFRONTS_IDEAL):
        assert W.sass_formula(name, listed) is not None, name


def test_the_range_stand_in_and_the_sass_api_count_the_same_sectors(probe2):
    by_range = _step(probe2, "kernel_replay", "profile:saxpy:standin:smsp__sass_sectors_mem_global.sum")["result"]["values"]
    by_sass = _step(probe2, "sass", "sass_collect:saxpy:formula_inputs")["result"]["totals"]
    assert by_range["smsp__sass_sectors_mem_global.sum"] == by_sass["smsp__sass_sectors_mem_global"] > 0
    # saxpy is coalesced: theoretical == ideal
    assert by_sass["smsp__sass_sectors_mem_global"] == by_sass["smsp__sass_sectors_mem_global_ideal"]


def test_a_second_sass_configuration_is_what_failed(probe2):
    second = _step(probe2, "sass", "sass_collect:strided_copy:formula_inputs")
    assert not second["ok"] and second["error_call"] == "cuptiSassMetricsSetConfig" and second["error_code"] == 8
