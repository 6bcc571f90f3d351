"""The ctypes binding of CUPTI's range profiler and SASS metrics, without a GPU.

The struct layouts are checked against the C headers (tests/fixtures/cupti/layout.json, printed
by a C program compiled against the nvidia-cuda-cupti 13.4.92 headers); the call sequences
against a scripted library that plays CUPTI's part and checks every ``structSize``.
"""

from __future__ import annotations

import ctypes
import json
import os

import pytest

from kernel_lsp.services import cupti_range as C

LAYOUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "cupti", "layout.json")


def _layout() -> dict:
    with open(LAYOUT, encoding="utf-8") as f:
        return json.load(f)["structs"]


@pytest.mark.parametrize("struct,cname", list(C.C_NAMES.items()) + list(C.PLAIN_C_NAMES.items()),
                         ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_struct_layout_matches_the_c_header(struct, cname):
    want = _layout()[cname]
    assert {name: getattr(struct, name).offset for name, _ in struct._fields_} == want["fields"]
    size = C.struct_size(struct) if struct in C.C_NAMES else ctypes.sizeof(struct)
    assert size == want["struct_size"]


def test_every_function_has_its_params_struct():
    assert set(C.FUNCTIONS.values()) <= set(C.C_NAMES)
    assert all(name.startswith("cupti") for name in C.FUNCTIONS)


def test_flush_data_size_stops_where_the_header_macro_does():
    # The header's macro ends at numOfInstances, before the output pointer.
    assert C.struct_size(C.SassFlushData) == C.SassFlushData.numOfInstances.offset + ctypes.sizeof(ctypes.c_size_t)
    assert C.SassFlushData().structSize == C.struct_size(C.SassFlushData)


def test_result_names():
    assert C.result_name(35) == "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"
    assert C.result_name(12345) == "CUPTI error 12345"
    err = C.CuptiError("cuptiRangeProfilerEnable", 35, "insufficient privileges")
    assert "cuptiRangeProfilerEnable: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES (insufficient privileges)" == str(err)


def test_find_library_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNEL_LSP_CUPTI_LIB", raising=False)
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    assert C.find_library_dir([str(tmp_path)]) is None
    (lib / "libcupti.so.13").write_bytes(b"")
    assert C.find_library_dir(["/nonexistent", str(tmp_path)]) == str(lib)
    monkeypatch.setenv("KERNEL_LSP_CUPTI_LIB", str(tmp_path))
    assert C.find_library_dir([str(tmp_path)]) is None  # the override names a folder without the library


def test_load_without_the_libraries_says_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNEL_LSP_CUPTI_LIB", str(tmp_path))
    with pytest.raises(C.CuptiMissing, match="nvidia-cuda-cupti"):
        C.load()


class ScriptedCupti:
    """Plays libcupti for the range profiler: checks each call's structSize, records the calls."""

    def __init__(self, passes: int = 4, values: dict[str, float] | None = None, refuse: dict[str, int] | None = None,
                 unknown_metrics: tuple[str, ...] = ()):
        """``unknown_metrics``: names the host refuses (CUPTI_ERROR_INVALID_METRIC_NAME), as for a name the chip lacks."""
        self.unknown_metrics = unknown_metrics
        self.passes = passes
        self.values = values or {}
        self.refuse = refuse or {}
        self.calls: list[str] = []
        self.rounds = 0
        self.replay = None
        self.metrics: list[str] = []
        layout = _layout()
        for name, struct in C.FUNCTIONS.items():
            setattr(self, name, self._fn(name, struct, layout[C.C_NAMES[struct]]["struct_size"]))

    def _fn(self, name, struct, size):
        def call(ref):
            params = ref._obj
            assert isinstance(params, struct) and params.structSize == size, name
            self.calls.append(name)
            if name in self.refuse:
                return self.refuse[name]
            return getattr(self, "_" + name, lambda p: None)(params) or 0
        return call

    def _cuptiProfilerHostInitialize(self, p):
        assert p.profilerType == C.PROFILER_TYPE_RANGE and p.pChipName == b"GH100"
        p.pHostObject = 0x1000

    def _cuptiProfilerHostConfigAddMetrics(self, p):
        self.metrics = [p.ppMetricNames[i].decode() for i in range(p.numMetrics)]
        if set(self.metrics) & set(self.unknown_metrics):
            return 1  # what the H200's host answered for unknown names (not INVALID_METRIC_NAME)

    def _cuptiProfilerHostGetConfigImageSize(self, p):
        p.configImageSize = 64

    def _cuptiProfilerHostGetNumOfPasses(self, p):
        assert p.configImageSize == 64
        p.numOfPasses = self.passes

    def _cuptiRangeProfilerEnable(self, p):
        self.cache_control = p.cacheControlMode
        p.pRangeProfilerObject = 0x2000

    def _cuptiRangeProfilerGetCounterDataSize(self, p):
        assert p.maxNumOfRanges >= 1 and p.maxNumRangeTreeNodes >= p.maxNumOfRanges
        p.counterDataSize = 128

    def _cuptiRangeProfilerSetConfig(self, p):
        assert p.pRangeProfilerObject == 0x2000 and p.configSize == 64 and p.counterDataImageSize == 128
        assert p.numNestingLevels == 1 and p.minNestingLevel == 1
        self.replay = p.replayMode

    def _cuptiRangeProfilerStop(self, p):
        self.rounds += 1
        p.isAllPassSubmitted = 1 if self.replay == C.KERNEL_REPLAY or self.rounds >= self.passes else 0

    def _cuptiRangeProfilerGetCounterDataInfo(self, p):
        p.numTotalRanges = 1

    def _cuptiProfilerHostEvaluateToGpuValues(self, p):
        assert p.rangeIndex == 0
        for i in range(p.numMetrics):
            p.pMetricValues[i] = self.values.get(p.ppMetricNames[i].decode(), 0.0)


    # SASS metrics: two patched instructions; metric ids are their index in ``sass_names`` plus 1.
    sass_names = ("smsp__sass_sectors_mem_global", "smsp__sass_sectors_mem_global_ideal", "smsp__sass_inst_executed")
    sass_values = {"smsp__sass_sectors_mem_global": (96, 32), "smsp__sass_sectors_mem_global_ideal": (8, 8)}

    def _cuptiSassMetricsGetNumOfMetrics(self, p):
        p.numOfMetrics = len(self.sass_names)

    def _cuptiSassMetricsGetMetrics(self, p):
        assert p.numOfMetrics == len(self.sass_names)
        self._keep = [n.encode() for n in self.sass_names]  # CUPTI owns its strings; here the fake keeps them
        for i, name in enumerate(self._keep):
            p.pMetricsList[i].metricId = i + 1
            p.pMetricsList[i].pMetricName = name

    def _cuptiSassMetricsGetProperties(self, p):
        p.metric.metricId = self.sass_names.index(p.pMetricName.decode()) + 1

    def _cuptiSassMetricsSetConfig(self, p):
        self.sass_ids = [p.pConfigs[i].metricId for i in range(p.numOfMetricConfig)]

    def _cuptiSassMetricsGetDataProperties(self, p):
        p.numOfPatchedInstructionRecords = 2
        p.numOfInstances = 1

    def _cuptiSassMetricsFlushData(self, p):
        for r in range(p.numOfPatchedInstructionRecords):
            record = p.pMetricsData[r]
            assert record.structSize == ctypes.sizeof(C.SassData)
            record.pcOffset = 16 * r
            for k, metric_id in enumerate(self.sass_ids):
                name = self.sass_names[metric_id - 1]
                record.pInstanceValues[k].metricId = metric_id
                record.pInstanceValues[k].value = self.sass_values.get(name, (1, 1))[r]


def test_sass_metrics_sum_over_the_patched_instructions():
    lib = ScriptedCupti()
    sm = C.SassMetrics(C.Cupti(lib, "/fake"), "GH100", 0xC0)
    assert set(sm.available()) == set(ScriptedCupti.sass_names)
    launches = []
    res = sm.collect(["smsp__sass_sectors_mem_global", "smsp__sass_sectors_mem_global_ideal"], lambda: launches.append(1))
    assert launches == [1] and res.records == 2
    assert res.totals == {"smsp__sass_sectors_mem_global": 128.0, "smsp__sass_sectors_mem_global_ideal": 16.0}
    assert res.by_pc[1] == (16, {"smsp__sass_sectors_mem_global": 32.0, "smsp__sass_sectors_mem_global_ideal": 8.0})
    sass_calls = [c for c in lib.calls if c.startswith("cuptiSassMetrics")]
    assert sass_calls[-2:] == ["cuptiSassMetricsFlushData", "cuptiSassMetricsDisable"]
    # the configuration stays set (a second SetConfig failed with OUT_OF_MEMORY on the H200) until it lacks a metric
    sm.collect(["smsp__sass_sectors_mem_global"], lambda: None)
    assert lib.calls.count("cuptiSassMetricsSetConfig") == 1
    sm.collect(["smsp__sass_inst_executed"], lambda: None)
    assert lib.calls.count("cuptiSassMetricsSetConfig") == 2 and lib.calls.count("cuptiSassMetricsUnsetConfig") == 1
    assert set(sm.configured) == {"smsp__sass_sectors_mem_global", "smsp__sass_sectors_mem_global_ideal",
                                  "smsp__sass_inst_executed"}
    sm.close()
    assert lib.calls[-1] == "cuptiSassMetricsUnsetConfig" and sm.configured == ()


def _profiler(lib) -> C.RangeProfiler:
    return C.RangeProfiler(C.Cupti(lib, "/fake"), 0xC0, "GH100")


def test_kernel_replay_is_one_round_and_gives_the_values():
    lib = ScriptedCupti(passes=4, values={"gpu__time_duration.sum": 5120.0, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 12.5})
    launches = []
    res = _profiler(lib).profile(["gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"],
                                 lambda: launches.append(1))
    assert launches == [1] and res.rounds == 1 and res.passes == 4
    assert res.values == ({"gpu__time_duration.sum": 5120.0, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 12.5},)
    assert lib.metrics == ["gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"]
    order = [c for c in lib.calls if c.startswith("cuptiRange")]
    assert order == ["cuptiRangeProfilerEnable", "cuptiRangeProfilerGetCounterDataSize",
                     "cuptiRangeProfilerCounterDataImageInitialize", "cuptiRangeProfilerSetConfig",
                     "cuptiRangeProfilerStart", "cuptiRangeProfilerStop", "cuptiRangeProfilerDecodeData",
                     "cuptiRangeProfilerGetCounterDataInfo"]
    assert lib.calls[-1] == "cuptiProfilerHostDeinitialize"


def test_user_replay_launches_once_per_pass_inside_a_user_range():
    lib = ScriptedCupti(passes=3)
    launches = []
    res = _profiler(lib).profile(["dram__bytes.sum"], lambda: launches.append(1), replay=C.USER_REPLAY, range_mode=C.USER_RANGE)
    assert len(launches) == 3 == res.rounds
    assert lib.calls.count("cuptiRangeProfilerPushRange") == 3 == lib.calls.count("cuptiRangeProfilerPopRange")


def test_a_refused_metric_raises_with_the_code_and_frees_the_host_object():
    lib = ScriptedCupti(unknown_metrics=("memory_l2_theoretical_sectors_global",))
    with pytest.raises(C.CuptiError) as failed:
        _profiler(lib).profile(["memory_l2_theoretical_sectors_global"], lambda: None)
    assert failed.value.code in C.UNKNOWN_METRIC_CODES and failed.value.call == "cuptiProfilerHostConfigAddMetrics"
    assert "CUPTI_ERROR_INVALID_PARAMETER" in str(failed.value)
    assert lib.calls[-1] == "cuptiProfilerHostDeinitialize" and "cuptiRangeProfilerStart" not in lib.calls


def test_one_profile_per_enabled_profiler():
    profiler = _profiler(ScriptedCupti())
    profiler.profile(["dram__bytes.sum"], lambda: None)
    with pytest.raises(C.CuptiError, match="one profile per enabled range profiler"):
        profiler.profile(["dram__bytes.sum"], lambda: None)


def test_profile_once_disables_after_the_profile_even_when_it_fails():
    lib = ScriptedCupti(refuse={"cuptiRangeProfilerStart": 999})
    with pytest.raises(C.CuptiError):
        C.profile_once(C.Cupti(lib, "/fake"), 0xC0, "GH100", ["dram__bytes.sum"], lambda: None)
    assert lib.calls[-1] == "cuptiRangeProfilerDisable"


def test_passes_that_never_finish_are_an_error_not_a_loop():
    lib = ScriptedCupti(passes=1000)
    with pytest.raises(C.CuptiError, match="pending after 5 rounds"):
        _profiler(lib).profile(["dram__bytes.sum"], lambda: None, replay=C.USER_REPLAY, max_rounds=5)


def test_a_missing_export_is_an_error_at_call_time():
    lib = ScriptedCupti()
    delattr(lib, "cuptiSassMetricsFlushData")
    cupti = C.Cupti(lib, "/fake")
    assert cupti.missing == ["cuptiSassMetricsFlushData"]
    with pytest.raises(C.CuptiError, match="not exported"):
        cupti.call("cuptiSassMetricsFlushData", C.SassFlushData())
