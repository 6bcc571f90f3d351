"""The GPU worker's parent side and its pure parts, without a GPU (scripted children: cupti_fakes)."""

from __future__ import annotations

import os

import pytest

from kernel_lsp.core import metric_groups
from kernel_lsp.core import profile as P
from kernel_lsp.services import gpu_worker as W

import cupti_fakes

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _request(entry: str, collections=(("gpu__time_duration.sum",),)) -> W.Request:
    return W.Request(cubin_path="k.cubin", entry=entry, spec={}, base_dir=".", arch="sm_90", timed=3,
                     collections=tuple(collections))


@pytest.fixture
def worker():
    w = W.GpuWorker(main=cupti_fakes.scripted_main, start_timeout_s=30)
    yield w
    w.close()


def test_a_warm_worker_answers_from_the_same_process(worker):
    first = worker.profile(_request("ok", [metric_groups.GROUPS["throughput"]]), timeout_s=30)
    second = worker.profile(_request("ok"), timeout_s=30)
    assert first.timings_us == (5.0, 5.1, 4.9)
    assert first.metrics[P.M_SM_PCT] == 1.0 and first.passes == 3
    assert first.steps_s["pid"] == second.steps_s["pid"] and worker.starts == 1
    assert 0 < worker.start_wall_s < 30


def test_a_fault_is_reported_and_the_next_profile_restarts_the_worker(worker):
    before = worker.profile(_request("ok"), timeout_s=30).steps_s["pid"]
    with pytest.raises(W.WorkerError) as failed:
        worker.profile(_request("fault"), timeout_s=30)
    assert failed.value.fault and "illegal memory access" in str(failed.value)
    after = worker.profile(_request("ok"), timeout_s=30).steps_s["pid"]
    assert after != before and worker.starts == 2


def test_a_hang_is_killed_at_the_timeout(worker):
    with pytest.raises(W.WorkerError) as failed:
        worker.profile(_request("hang"), timeout_s=1.0)
    assert failed.value.fault and "did not finish within 1 s" in str(failed.value)
    assert not worker.alive
    assert worker.profile(_request("ok"), timeout_s=30).timings_us and worker.starts == 2


def test_a_worker_that_dies_is_a_fault(worker):
    with pytest.raises(W.WorkerError) as failed:
        worker.profile(_request("die"), timeout_s=30)
    assert failed.value.fault and "exit code 3" in str(failed.value)


def test_a_crash_while_collecting_counters_is_cuptis_and_twice_turns_counters_off(worker):
    for _ in range(2):
        with pytest.raises(W.WorkerError) as failed:
            worker.profile(_request("cupti-crash"), timeout_s=30)
        assert failed.value.cupti and not failed.value.fault and "CUPTI crashed" in str(failed.value)
    with pytest.raises(W.WorkerError, match="crashed the GPU worker 2 times") as off:
        worker.profile(_request("ok"), timeout_s=30)
    assert off.value.cupti
    assert worker.profile(_request("ok", collections=()), timeout_s=30).timings_us  # timing still works


def test_cupti_refusal_is_not_a_fault(worker):
    with pytest.raises(W.WorkerError) as failed:
        worker.profile(_request("refused"), timeout_s=30)
    assert failed.value.cupti and not failed.value.fault
    assert worker.alive and worker.starts == 1


def test_a_worker_without_cupti_refuses_counters_but_says_why():
    w = W.GpuWorker(main=cupti_fakes.scripted_main, lib_dir="no-cupti", start_timeout_s=30)
    try:
        info = w.ensure()
        assert not info.cupti_ok and "INSUFFICIENT_PRIVILEGES" in info.cupti_error
        with pytest.raises(W.WorkerError) as failed:
            w.profile(_request("ok"), timeout_s=30)
        assert failed.value.cupti and "INSUFFICIENT_PRIVILEGES" in str(failed.value)
        assert w.profile(_request("ok", collections=()), timeout_s=30).timings_us  # timing alone still works
    finally:
        w.close()


def test_a_worker_that_cannot_start_is_not_retried_on_every_profile():
    w = W.GpuWorker(main=cupti_fakes.scripted_main, lib_dir="no-gpu", start_timeout_s=30)
    for _ in range(3):
        with pytest.raises(W.WorkerError, match="could not start: ModuleNotFoundError"):
            w.ensure()
    assert w.starts == 1


# -- routing -----------------------------------------------------------------------------


def _h200_sass_metrics() -> list[str]:
    """The SASS metrics the H200 listed (second probe, tests/fixtures/cupti/recorded/probe2)."""
    import json

    with open(os.path.join(ROOT, "tests", "fixtures", "cupti", "recorded", "probe2", "probe.json"), encoding="utf-8") as f:
        steps = json.load(f)["steps"]
    return sorted(next(s for s in steps if s["step"] == "sass_available")["result"])


def test_every_group_metric_has_a_collector_on_the_h200():
    every = [m for ms in metric_groups.GROUPS.values() for m in ms]
    routing = W.route(every, sass_available=_h200_sass_metrics())
    assert routing.missing == ()
    assert P.M_SM_PCT in routing.range and P.M_SHARED_REQ_LD in routing.range  # the H200's host took smsp__sass_*
    standin = W.RANGE_STANDINS[P.M_GLOBAL_SECTORS_THEORETICAL]
    assert standin in routing.range and routing.aliases[standin] == P.M_GLOBAL_SECTORS_THEORETICAL
    assert set(routing.sass) == {P.M_GLOBAL_SECTORS_IDEAL, P.M_SHARED_WAVEFRONTS_IDEAL}
    assert W.route([P.M_GLOBAL_SECTORS_IDEAL]).missing == (P.M_GLOBAL_SECTORS_IDEAL,)  # without the SASS list
    assert not any(m.startswith(W.NCU_ONLY_PREFIXES) for m in routing.range)


def test_a_refused_name_goes_to_the_sass_api_or_is_missing():
    standin = W.RANGE_STANDINS[P.M_GLOBAL_SECTORS_THEORETICAL]
    via_sass = W.route([P.M_GLOBAL_SECTORS_THEORETICAL, P.M_SHARED_REQ_LD], range_refused=[standin, P.M_SHARED_REQ_LD],
                       sass_available=["smsp__sass_sectors_mem_global", "smsp__sass_inst_executed_op_shared_ld"])
    assert via_sass.range == () and via_sass.sass == (P.M_GLOBAL_SECTORS_THEORETICAL, P.M_SHARED_REQ_LD)
    assert via_sass.sass_metrics == ("smsp__sass_sectors_mem_global", "smsp__sass_inst_executed_op_shared_ld")
    nowhere = W.route([P.M_GLOBAL_SECTORS_THEORETICAL], range_refused=[standin], sass_available=[])
    assert nowhere.missing == (P.M_GLOBAL_SECTORS_THEORETICAL,)


def test_routing_marks_what_no_collector_gives():
    routing = W.route([P.M_EXCESSIVE_SECTORS, P.M_WAVES, P.M_DRAM_PCT, P.M_THEORETICAL_OCC])
    assert routing.missing == (P.M_EXCESSIVE_SECTORS,)
    assert routing.launch == (P.M_WAVES, P.M_THEORETICAL_OCC) and routing.range == (P.M_DRAM_PCT,)


def test_a_sass_alternative_is_used_when_the_first_is_not_listed():
    parts = ["smsp__sass_sectors_mem_global_op_ld", "smsp__sass_sectors_mem_global_op_st"]
    routing = W.route([P.M_GLOBAL_SECTORS_THEORETICAL], range_refused=[W.RANGE_STANDINS[P.M_GLOBAL_SECTORS_THEORETICAL]],
                      sass_available=parts)
    assert routing.sass_metrics == tuple(parts)
    assert W.sass_values({parts[0]: 96.0, parts[1]: 32.0}, [P.M_GLOBAL_SECTORS_THEORETICAL]) == {
        P.M_GLOBAL_SECTORS_THEORETICAL: 128.0}


def test_sass_values_follow_ncus_definitions():
    totals = {"smsp__sass_branch_targets_threads_uniform": 30.0, "smsp__sass_branch_targets": 40.0,
              "smsp__sass_inst_executed_op_shared_ld": 7.0}
    got = W.sass_values(totals, [P.M_BRANCH_UNIFORM_PCT, P.M_SHARED_REQ_LD, P.M_SHARED_REQ_ST])
    assert got == {P.M_BRANCH_UNIFORM_PCT: 75.0, P.M_SHARED_REQ_LD: 7.0}
    assert W.sass_values({"smsp__sass_branch_targets_threads_uniform": 0.0, "smsp__sass_branch_targets": 0.0},
                         [P.M_BRANCH_UNIFORM_PCT]) == {}


def _recorded_profiles():
    """Launch statistics of the H200 full profiles recorded from ncu (tests/fixtures/ncu/dataset)."""
    from kernel_lsp.services.tree_dataset import load_dataset

    samples = load_dataset(os.path.join(ROOT, "tests", "fixtures", "ncu", "dataset"))
    keys = (P.M_REGISTERS, P.M_BLOCK_SIZE, P.M_GRID_SIZE, P.M_WAVES, P.M_SM_COUNT)
    return [(s.name, dict(s.metrics)) for s in samples if all(k in s.metrics for k in keys)]


@pytest.mark.parametrize("name,metrics", _recorded_profiles() or [pytest.param("none", {}, marks=pytest.mark.skip("no dataset"))])
def test_launch_values_match_ncus_launch_statistics(name, metrics):
    block = int(metrics[P.M_BLOCK_SIZE])
    got = W.launch_values(
        arch="sm_90", grid=(int(metrics[P.M_GRID_SIZE]), 1, 1), block=(block, 1, 1),
        registers=int(metrics[P.M_REGISTERS]), static_smem_bytes=int(metrics.get(P.M_SMEM_STATIC, 0)),
        dynamic_smem_bytes=int(metrics.get(P.M_SMEM_DYNAMIC, 0)), sm_count=int(metrics[P.M_SM_COUNT]),
    )
    assert got[P.M_WAVES] == pytest.approx(metrics[P.M_WAVES], rel=0.01, abs=0.006)  # ncu prints two decimals
    for key in (P.M_LIMIT_REGISTERS, P.M_LIMIT_WARPS, P.M_LIMIT_BLOCKS):
        assert got[key] == metrics[key], key
    # ncu's shared-memory limit is under the carveout the driver chose (the smallest that keeps the occupancy);
    # ours is under the largest, so it is never smaller and the limiting resource stays the same.
    limits = (P.M_LIMIT_REGISTERS, P.M_LIMIT_WARPS, P.M_LIMIT_BLOCKS, P.M_LIMIT_SHARED)
    assert got[P.M_LIMIT_SHARED] >= metrics[P.M_LIMIT_SHARED]
    assert min(got[k] for k in limits) == min(metrics[k] for k in limits)
    if P.M_THEORETICAL_OCC in metrics:
        assert got[P.M_THEORETICAL_OCC] == pytest.approx(metrics[P.M_THEORETICAL_OCC], abs=0.5)
