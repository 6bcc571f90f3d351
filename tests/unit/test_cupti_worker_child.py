"""The worker child's profile flow (inputs, timed launches, counters, faults) with a stand-in pycuda
and the scripted CUPTI library of test_cupti_range: no GPU, but the real spec, input and routing code."""

from __future__ import annotations

import json
import types
from collections import OrderedDict

import pytest

from kernel_lsp.core import metric_groups
from kernel_lsp.core import profile as P
from kernel_lsp.services import cupti_range as C
from kernel_lsp.services import gpu_worker as W

from test_cupti_range import ScriptedCupti

SPEC = {"kernel": "scale_add", "grid": ["(n+255)/256", "1", "1"], "block": [256, 1, 1],
        "params": [{"name": "n", "scalar": "int32", "value": 4096},
                   {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
                   {"name": "z", "array": "float32", "size": "n", "init": "zeros", "role": "out"}]}


class FakeCudaError(Exception):
    pass


class FakeFunction:
    num_regs = 16
    shared_size_bytes = 0

    def __init__(self, fault: bool = False):
        self.fault = fault
        self.launches: list[tuple] = []

    def __call__(self, *args, block, grid, shared):
        self.launches.append((len(args), block, grid, shared))
        if self.fault:
            raise FakeCudaError("cuLaunchKernel failed: an illegal memory access was encountered")

    def set_attribute(self, *_):
        pass


class FakeEvent:
    def record(self):
        pass

    def synchronize(self):
        pass

    def time_till(self, other):
        return 0.0125  # ms


def _fake_cuda(allocated: list):
    return types.SimpleNamespace(
        Error=FakeCudaError,
        mem_alloc=lambda n: allocated.append(n) or types.SimpleNamespace(free=lambda: None),
        memcpy_htod=lambda buf, a: None,
        memcpy_dtod=lambda dst, src, n: allocated.append(("restore", n)),
        Event=FakeEvent,
        Context=types.SimpleNamespace(synchronize=lambda: None),
        function_attribute=types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES=8),
    )


def _gpu(function: FakeFunction, lib: ScriptedCupti, allocated: list) -> W._Gpu:
    gpu = W._Gpu.__new__(W._Gpu)
    gpu.cuda = _fake_cuda(allocated)
    gpu.modules = {}
    gpu._cached_inputs = OrderedDict()
    gpu._sass_session = None
    gpu.cr = C
    gpu.cupti = C.Cupti(lib, "/fake")
    gpu.chip = "GH100"
    gpu.context_handle = 0xC0
    gpu.sm_count = 132
    gpu.sass_available = set(ScriptedCupti.sass_names)
    gpu.range_refused = set()
    gpu.sass_refused = set()
    gpu.cache_control = C.CACHE_CONTROL_ALL
    gpu._function = lambda cubin, entry: function
    return gpu


def _request(collections, timed=3) -> dict:
    return {"cubin_path": "k.cubin", "entry": "scale_add", "spec": SPEC, "base_dir": ".", "arch": "sm_90",
            "timed": timed, "collections": [list(c) for c in collections], "seed": 0}


def test_one_request_times_collects_range_sass_and_launch_metrics():
    function, allocated = FakeFunction(), []
    # The host refuses the stand-in of the theoretical sector count (as it refused ncu's own names): it comes
    # from the SASS-metrics API instead, like the ideal count (no range-profiler name).
    lib = ScriptedCupti(values={P.M_DURATION_NS: 12500.0, P.M_SM_PCT: 9.0, P.M_MEMORY_PCT: 71.0},
                        unknown_metrics=(W.RANGE_STANDINS[P.M_GLOBAL_SECTORS_THEORETICAL],))
    wanted = (P.M_DURATION_NS, *metric_groups.GROUPS["throughput"], P.M_GLOBAL_SECTORS_THEORETICAL,
              P.M_GLOBAL_SECTORS_IDEAL, P.M_WAVES)
    reply = _gpu(function, lib, allocated).profile(_request([wanted]))
    assert "error" not in reply, reply
    assert reply["timings_us"] == [12.5, 12.5, 12.5] and reply["passes"] == 4 and reply["missing"] == []
    m = reply["metrics"]
    assert m[P.M_DURATION_NS] == 12500.0 and m[P.M_MEMORY_PCT] == 71.0
    assert m[P.M_GLOBAL_SECTORS_THEORETICAL] == 128.0 and m[P.M_GLOBAL_SECTORS_IDEAL] == 16.0
    assert m[P.M_GRID_SIZE] == 16 and m[P.M_REGISTERS] == 16 and m[P.M_WAVES] == pytest.approx(16 / (8 * 132))
    # the range profiler was asked for hardware counters only
    assert P.M_WAVES not in lib.metrics and P.M_GLOBAL_SECTORS_IDEAL not in lib.metrics and P.M_SM_PCT in lib.metrics
    # a warm-up, the timed launches, one under the range profiler (kernel replay), one under SASS patching
    assert len(function.launches) == 1 + 3 + 1 + 1
    assert function.launches[0] == (3, (256, 1, 1), (16, 1, 1), 0)
    # x, z and a pristine copy of z (the kernel writes it), filled from z
    assert allocated == [4096 * 4, 4096 * 4, 4096 * 4, ("restore", 4096 * 4)]
    assert lib.cache_control == C.CACHE_CONTROL_ALL  # caches flushed before every pass, as ncu does


def test_an_accepted_stand_in_is_reported_under_ncus_name():
    standin = W.RANGE_STANDINS[P.M_SHARED_WAVEFRONTS]
    lib = ScriptedCupti(values={standin: 640.0, P.M_SM_PCT: 9.0})
    reply = _gpu(FakeFunction(), lib, []).profile(_request([(P.M_SM_PCT, P.M_SHARED_WAVEFRONTS)]))
    assert reply["metrics"][P.M_SHARED_WAVEFRONTS] == 640.0 and standin not in reply["metrics"]
    assert standin in lib.metrics and reply["missing"] == []


def test_a_name_the_chip_lacks_is_reported_missing_and_the_rest_collected():
    function, allocated = FakeFunction(), []
    lib = ScriptedCupti(values={P.M_SM_PCT: 9.0}, unknown_metrics=("sm__not_a_metric.sum",))
    gpu = _gpu(function, lib, allocated)
    reply = gpu.profile(_request([(P.M_SM_PCT, "sm__not_a_metric.sum")]))
    assert reply["missing"] == ["sm__not_a_metric.sum"] and reply["range_refused"] == ["sm__not_a_metric.sum"]
    assert reply["metrics"][P.M_SM_PCT] == 9.0
    again = gpu.profile(_request([(P.M_SM_PCT, "sm__not_a_metric.sum")]))
    assert again["missing"] == ["sm__not_a_metric.sum"]  # remembered: no second search


def test_a_launch_failure_is_a_fault():
    reply = _gpu(FakeFunction(fault=True), ScriptedCupti(), []).profile(_request([(P.M_SM_PCT,)]))
    assert reply["fault"] and "illegal memory access" in reply["error"]


def test_a_bad_spec_is_an_error_not_a_fault():
    request = _request([(P.M_SM_PCT,)])
    request["spec"] = {"kernel": "scale_add"}
    reply = _gpu(FakeFunction(), ScriptedCupti(), []).profile(request)
    assert reply["error"].startswith("launch spec:") and not reply.get("fault")


def test_a_cupti_refusal_with_a_healthy_context_is_not_a_fault():
    lib = ScriptedCupti(refuse={"cuptiRangeProfilerSetConfig": 1})
    reply = _gpu(FakeFunction(), lib, []).profile(_request([(P.M_SM_PCT,)]))
    assert reply["cupti"] and not reply.get("fault") and "CUPTI_ERROR_INVALID_PARAMETER" in reply["error"]


def test_the_same_spec_reuses_its_inputs_and_restores_what_the_kernel_writes():
    function, allocated = FakeFunction(), []
    gpu = _gpu(function, ScriptedCupti(), allocated)
    gpu.profile(_request([(P.M_SM_PCT,)]))
    made = len(allocated)
    gpu.profile(_request([(P.M_SM_PCT,)]))
    assert allocated[made:] == [("restore", 4096 * 4)]  # no new buffers: z restored from its pristine copy
    other = _request([(P.M_SM_PCT,)])
    other["seed"] = 1
    gpu.profile(other)
    assert len([a for a in allocated[made + 1:] if not isinstance(a, tuple)]) == 3  # a new seed: new inputs


def test_sass_metrics_that_fail_are_missing_once_and_not_offered_again():
    lib = ScriptedCupti(refuse={"cuptiSassMetricsEnable": 27})
    gpu = _gpu(FakeFunction(), lib, [])
    reply = gpu.profile(_request([(P.M_SM_PCT, P.M_GLOBAL_SECTORS_IDEAL)]))
    assert reply["missing"] == [P.M_GLOBAL_SECTORS_IDEAL] and "CUPTI_ERROR_NOT_SUPPORTED" in reply["notes"][0]
    assert reply["sass_refused"] == ["smsp__sass_sectors_mem_global_ideal"]
    calls = lib.calls.count("cuptiSassMetricsEnable")
    again = gpu.profile(_request([(P.M_SM_PCT, P.M_GLOBAL_SECTORS_IDEAL)]))
    assert again["missing"] == [P.M_GLOBAL_SECTORS_IDEAL] and lib.calls.count("cuptiSassMetricsEnable") == calls


def _spec(n: int) -> dict:
    return {**SPEC, "params": [{**SPEC["params"][0], "value": n}, *SPEC["params"][1:]]}


def test_prepared_inputs_are_found_by_the_first_profile_of_their_spec():
    function, allocated = FakeFunction(), []
    gpu = _gpu(function, ScriptedCupti(values={P.M_SM_PCT: 9.0}), allocated)
    prepared = gpu.prepare({"spec": SPEC, "base_dir": ".", "seed": 0})
    assert prepared["prepared"] and not function.launches
    made = list(allocated)
    assert made == [4096 * 4, 4096 * 4, 4096 * 4, ("restore", 4096 * 4)]
    reply = gpu.profile(_request([(P.M_SM_PCT,)]))
    assert "error" not in reply, reply
    # Nothing allocated again: the profile restored z from its pristine copy and launched.
    assert [a for a in allocated[len(made):] if not isinstance(a, tuple)] == []
    assert gpu.prepare({"spec": {"kernel": "k", "params": [{"name": "x"}]}, "base_dir": ".", "seed": 0})["error"]


def test_the_inputs_of_several_specs_are_kept_within_the_bounds(monkeypatch):
    allocated: list = []
    gpu = _gpu(FakeFunction(), ScriptedCupti(), allocated)
    monkeypatch.setattr(W, "INPUT_SPECS_KEPT", 2)
    for n in (256, 512, 1024):
        gpu.prepare({"spec": _spec(n), "base_dir": ".", "seed": 0})
    kept = [json.loads(key[0])["params"][0]["value"] for key in gpu._cached_inputs]
    assert kept == [512, 1024]
    # Over the byte bound only the newest stays.
    monkeypatch.setattr(W, "INPUT_BYTES_KEPT", 3 * 1024 * 4)
    gpu.prepare({"spec": _spec(2048), "base_dir": ".", "seed": 0})
    assert [json.loads(key[0])["params"][0]["value"] for key in gpu._cached_inputs] == [2048]
