"""A small ctypes binding of CUPTI's range profiler and profiler host (CUDA 13).

Why ctypes: NVIDIA's ``cupti-python`` 13.4.0 wraps the profiler-host and PM-sampling
C APIs but not the range profiler (``cupti_range_profiler.h``), which is the API that
replays one kernel launch per pass and collects ncu's metrics for it. The structs
below mirror the C headers field by field (``tests/fixtures/cupti/struct_layout.c``
prints the C offsets; ``tests/unit/test_cupti_range.py`` checks them against these),
and every call passes ``structSize`` as the header's ``*_STRUCT_SIZE`` macro does:
the offset of the last field plus its size.

The libraries must be the ones of one CUPTI release: a machine's PyTorch may ship an
older ``libcupti.so.13`` that the loader finds first, and then every host call fails
with ``CUPTI_ERROR_INVALID_PARAMETER``. :func:`load` therefore opens the wheel's
``libnvperf_host.so``, ``libnvperf_target.so`` and ``libcupti.so.13`` by path with
``RTLD_GLOBAL`` (``nvidia-cuda-cupti`` installs them under ``nvidia/cu13/lib``).

Only GPU-worker processes import this module with a device; the pure helpers
(:func:`struct_size`, :func:`result_name`, :func:`find_library_dir`) run anywhere.

One profile (:meth:`RangeProfiler.profile`): a config image for the metrics (host),
a counter-data image sized for the ranges, ``SetConfig`` with the replay mode, then
``Start`` → the caller's launch → ``Stop`` until every pass was submitted (kernel
replay needs one round: CUPTI saves and restores the kernel's memory and replays it
itself; user replay needs one round per pass), ``DecodeData``, and an evaluation of
each range's values on the host.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Sequence
from ctypes import POINTER, c_char_p, c_double, c_int, c_size_t, c_uint8, c_uint16, c_uint32, c_void_p
from dataclasses import dataclass

# -- enums (cupti_profiler_target.h, cupti_profiler_host.h, cupti_range_profiler.h) ---------------

AUTO_RANGE = 1
USER_RANGE = 2
KERNEL_REPLAY = 2
USER_REPLAY = 3
PROFILER_TYPE_RANGE = 0
PROFILER_TYPE_PM_SAMPLING = 1
CACHE_CONTROL_NONE = 0
CACHE_CONTROL_ALL = 1

SUCCESS = 0
#: cupti_result.h names of the codes the profiler returns (the rest print as numbers).
RESULT_NAMES: dict[int, str] = {
    0: "CUPTI_SUCCESS",
    1: "CUPTI_ERROR_INVALID_PARAMETER",
    2: "CUPTI_ERROR_INVALID_DEVICE",
    3: "CUPTI_ERROR_INVALID_CONTEXT",
    7: "CUPTI_ERROR_INVALID_OPERATION",
    8: "CUPTI_ERROR_OUT_OF_MEMORY",
    9: "CUPTI_ERROR_HARDWARE",
    10: "CUPTI_ERROR_PARAMETER_SIZE_NOT_SUFFICIENT",
    11: "CUPTI_ERROR_API_NOT_IMPLEMENTED",
    12: "CUPTI_ERROR_MAX_LIMIT_REACHED",
    13: "CUPTI_ERROR_NOT_READY",
    14: "CUPTI_ERROR_NOT_COMPATIBLE",
    15: "CUPTI_ERROR_NOT_INITIALIZED",
    17: "CUPTI_ERROR_INVALID_METRIC_NAME",
    19: "CUPTI_ERROR_INVALID_HANDLE",
    23: "CUPTI_ERROR_DISABLED",
    26: "CUPTI_ERROR_HARDWARE_BUSY",
    27: "CUPTI_ERROR_NOT_SUPPORTED",
    33: "CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED",
    35: "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
    36: "CUPTI_ERROR_OLD_PROFILER_API_INITIALIZED",
    38: "CUPTI_ERROR_LEGACY_PROFILER_NOT_SUPPORTED",
    39: "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
    43: "CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED",
    46: "CUPTI_ERROR_INVALID_CHIP_NAME",
    999: "CUPTI_ERROR_UNKNOWN",
}


def result_name(code: int) -> str:
    return RESULT_NAMES.get(code, f"CUPTI error {code}")


class CuptiError(RuntimeError):
    """A CUPTI call returned an error: which call, the code, and CUPTI's own text when it has one."""

    def __init__(self, call: str, code: int, text: str | None = None):
        self.call = call
        self.code = code
        self.text = text
        super().__init__(f"{call}: {result_name(code)}" + (f" ({text})" if text else ""))


class CuptiMissing(RuntimeError):
    """The CUPTI libraries could not be found or opened."""


# -- structs ---------------------------------------------------------------------------------------


class _Params(ctypes.Structure):
    """Every CUPTI profiler params struct begins ``size_t structSize; void* pPriv;``."""

    def __init__(self, **fields):
        super().__init__(**fields)
        self.structSize = struct_size(type(self))


def struct_size(cls: type[ctypes.Structure]) -> int:
    """``CUPTI_PROFILER_STRUCT_SIZE(type, lastfield)``: the last field's offset plus its size (no tail padding).

    ``lastfield`` is the struct's last field except where the header's macro names another
    (``_size_field_``: FlushData's macro stops before its output pointer).
    """
    name = getattr(cls, "_size_field_", None) or cls._fields_[-1][0]
    field = getattr(cls, name)
    return field.offset + field.size


def _params(name: str, *fields: tuple[str, object], size_field: str | None = None) -> type[_Params]:
    body = {"_fields_": [("structSize", c_size_t), ("pPriv", c_void_p), *fields]}
    if size_field:
        body["_size_field_"] = size_field
    return type(name, (_Params,), body)


ProfilerInitialize = _params("ProfilerInitialize")
ProfilerDeInitialize = _params("ProfilerDeInitialize")
DeviceGetChipName = _params("DeviceGetChipName", ("deviceIndex", c_size_t), ("pChipName", c_char_p))
DeviceSupported = _params(
    "DeviceSupported",
    ("cuDevice", c_int),
    ("isSupported", c_int),
    ("architecture", c_int),
    ("sli", c_int),
    ("vGpu", c_int),
    ("confidentialCompute", c_int),
    ("cmp", c_int),
    ("wsl", c_int),
    ("api", c_int),
    ("sku", c_int),
)

HostInitialize = _params(
    "HostInitialize",
    ("profilerType", c_int),
    ("pChipName", c_char_p),
    ("pCounterAvailabilityImage", c_void_p),
    ("pHostObject", c_void_p),
    ("pSinglePassMetricSetName", c_char_p),
)
HostDeinitialize = _params("HostDeinitialize", ("pHostObject", c_void_p))
HostGetSupportedChips = _params("HostGetSupportedChips", ("numChips", c_size_t), ("ppChipNames", POINTER(c_char_p)))
HostConfigAddMetrics = _params(
    "HostConfigAddMetrics", ("pHostObject", c_void_p), ("ppMetricNames", POINTER(c_char_p)), ("numMetrics", c_size_t)
)
HostGetConfigImageSize = _params("HostGetConfigImageSize", ("pHostObject", c_void_p), ("configImageSize", c_size_t))
HostGetConfigImage = _params(
    "HostGetConfigImage", ("pHostObject", c_void_p), ("configImageSize", c_size_t), ("pConfigImage", c_void_p)
)
HostGetNumOfPasses = _params(
    "HostGetNumOfPasses", ("configImageSize", c_size_t), ("pConfigImage", c_void_p), ("numOfPasses", c_size_t)
)
HostEvaluateToGpuValues = _params(
    "HostEvaluateToGpuValues",
    ("pHostObject", c_void_p),
    ("pCounterDataImage", c_void_p),
    ("counterDataImageSize", c_size_t),
    ("rangeIndex", c_size_t),
    ("ppMetricNames", POINTER(c_char_p)),
    ("numMetrics", c_size_t),
    ("pMetricValues", POINTER(c_double)),
)
HostGetBaseMetrics = _params(
    "HostGetBaseMetrics", ("pHostObject", c_void_p), ("metricType", c_int), ("ppMetricNames", POINTER(c_char_p)),
    ("numMetrics", c_size_t),
)
METRIC_TYPES = {"counter": 0, "ratio": 1, "throughput": 2}
HostGetSinglePassSets = _params(
    "HostGetSinglePassSets", ("pChipName", c_char_p), ("numOfSinglePassSets", c_size_t), ("ppSinglePassSets", POINTER(c_char_p))
)

RangeEnable = _params("RangeEnable", ("ctx", c_void_p), ("pRangeProfilerObject", c_void_p), ("cacheControlMode", c_int))
RangeDisable = _params("RangeDisable", ("pRangeProfilerObject", c_void_p))
RangeSetConfig = _params(
    "RangeSetConfig",
    ("pRangeProfilerObject", c_void_p),
    ("configSize", c_size_t),
    ("pConfig", c_void_p),
    ("counterDataImageSize", c_size_t),
    ("pCounterDataImage", c_void_p),
    ("range", c_int),
    ("replayMode", c_int),
    ("maxRangesPerPass", c_size_t),
    ("numNestingLevels", c_uint16),
    ("minNestingLevel", c_uint16),
    ("passIndex", c_size_t),
    ("targetNestingLevel", c_uint16),
)
RangeStart = _params("RangeStart", ("pRangeProfilerObject", c_void_p))
RangeStop = _params(
    "RangeStop",
    ("pRangeProfilerObject", c_void_p),
    ("passIndex", c_size_t),
    ("targetNestingLevel", c_size_t),
    ("isAllPassSubmitted", c_uint8),
)
RangePushRange = _params("RangePushRange", ("pRangeProfilerObject", c_void_p), ("pRangeName", c_char_p))
RangePopRange = _params("RangePopRange", ("pRangeProfilerObject", c_void_p))
RangeDecodeData = _params("RangeDecodeData", ("pRangeProfilerObject", c_void_p), ("numOfRangeDropped", c_size_t))
RangeGetCounterDataSize = _params(
    "RangeGetCounterDataSize",
    ("pRangeProfilerObject", c_void_p),
    ("pMetricNames", POINTER(c_char_p)),
    ("numMetrics", c_size_t),
    ("maxNumOfRanges", c_size_t),
    ("maxNumRangeTreeNodes", c_uint32),
    ("counterDataSize", c_size_t),
)
RangeCounterDataImageInitialize = _params(
    "RangeCounterDataImageInitialize",
    ("pRangeProfilerObject", c_void_p),
    ("counterDataSize", c_size_t),
    ("pCounterData", c_void_p),
)
RangeGetCounterDataInfo = _params(
    "RangeGetCounterDataInfo", ("pCounterDataImage", c_void_p), ("counterDataImageSize", c_size_t), ("numTotalRanges", c_size_t)
)

# SASS metrics (cupti_sass_metrics.h): instruction-level counters (smsp__sass_*), collected by patching the
# kernel's SASS, per instruction.


class SassMetricDetails(ctypes.Structure):
    _fields_ = [("metricId", ctypes.c_uint64), ("pMetricName", c_char_p), ("pMetricDescription", c_char_p)]


class SassConfig(ctypes.Structure):
    _fields_ = [("metricId", ctypes.c_uint64), ("outputGranularity", c_uint8)]


class SassInstanceValue(ctypes.Structure):
    _fields_ = [("metricId", ctypes.c_uint64), ("value", ctypes.c_uint64)]


SassGetNumOfMetrics = _params("SassGetNumOfMetrics", ("pChipName", c_char_p), ("numOfMetrics", c_size_t))
SassGetMetrics = _params(
    "SassGetMetrics", ("pChipName", c_char_p), ("numOfMetrics", c_size_t), ("pMetricsList", POINTER(SassMetricDetails))
)
SassGetProperties = _params("SassGetProperties", ("pChipName", c_char_p), ("pMetricName", c_char_p), ("metric", SassMetricDetails))
SassSetConfig = _params(
    "SassSetConfig", ("numOfMetricConfig", c_size_t), ("pConfigs", POINTER(SassConfig)), ("deviceIndex", c_uint32)
)
SassUnsetConfig = _params("SassUnsetConfig", ("deviceIndex", c_uint32))
SassEnable = _params("SassEnable", ("ctx", c_void_p), ("enableLazyPatching", c_uint8))
SassDisable = _params("SassDisable", ("ctx", c_void_p), ("numOfDroppedRecords", c_size_t))
SassGetDataProperties = _params(
    "SassGetDataProperties", ("ctx", c_void_p), ("numOfPatchedInstructionRecords", c_size_t), ("numOfInstances", c_size_t)
)
SassData = _params(
    "SassData",
    ("cubinCrc", c_uint32),
    ("functionIndex", c_uint32),
    ("functionName", c_char_p),
    ("pcOffset", c_uint32),
    ("pInstanceValues", POINTER(SassInstanceValue)),
)
SassFlushData = _params(
    "SassFlushData",
    ("ctx", c_void_p),
    ("numOfPatchedInstructionRecords", c_size_t),
    ("numOfInstances", c_size_t),
    ("pMetricsData", POINTER(SassData)),
    size_field="numOfInstances",
)
SASS_GRANULARITY_GPU = 0

#: ctypes struct -> C struct name, for the layout check against the headers.
C_NAMES: dict[type[ctypes.Structure], str] = {
    ProfilerInitialize: "CUpti_Profiler_Initialize_Params",
    ProfilerDeInitialize: "CUpti_Profiler_DeInitialize_Params",
    DeviceGetChipName: "CUpti_Device_GetChipName_Params",
    DeviceSupported: "CUpti_Profiler_DeviceSupported_Params",
    HostInitialize: "CUpti_Profiler_Host_Initialize_Params",
    HostDeinitialize: "CUpti_Profiler_Host_Deinitialize_Params",
    HostGetSupportedChips: "CUpti_Profiler_Host_GetSupportedChips_Params",
    HostConfigAddMetrics: "CUpti_Profiler_Host_ConfigAddMetrics_Params",
    HostGetConfigImageSize: "CUpti_Profiler_Host_GetConfigImageSize_Params",
    HostGetConfigImage: "CUpti_Profiler_Host_GetConfigImage_Params",
    HostGetNumOfPasses: "CUpti_Profiler_Host_GetNumOfPasses_Params",
    HostEvaluateToGpuValues: "CUpti_Profiler_Host_EvaluateToGpuValues_Params",
    HostGetSinglePassSets: "CUpti_Profiler_Host_GetSinglePassSets_Params",
    HostGetBaseMetrics: "CUpti_Profiler_Host_GetBaseMetrics_Params",
    RangeEnable: "CUpti_RangeProfiler_Enable_Params",
    RangeDisable: "CUpti_RangeProfiler_Disable_Params",
    RangeSetConfig: "CUpti_RangeProfiler_SetConfig_Params",
    RangeStart: "CUpti_RangeProfiler_Start_Params",
    RangeStop: "CUpti_RangeProfiler_Stop_Params",
    RangePushRange: "CUpti_RangeProfiler_PushRange_Params",
    RangePopRange: "CUpti_RangeProfiler_PopRange_Params",
    RangeDecodeData: "CUpti_RangeProfiler_DecodeData_Params",
    RangeGetCounterDataSize: "CUpti_RangeProfiler_GetCounterDataSize_Params",
    RangeCounterDataImageInitialize: "CUpti_RangeProfiler_CounterDataImage_Initialize_Params",
    RangeGetCounterDataInfo: "CUpti_RangeProfiler_GetCounterDataInfo_Params",
    SassGetNumOfMetrics: "CUpti_SassMetrics_GetNumOfMetrics_Params",
    SassGetMetrics: "CUpti_SassMetrics_GetMetrics_Params",
    SassGetProperties: "CUpti_SassMetrics_GetProperties_Params",
    SassSetConfig: "CUpti_SassMetricsSetConfig_Params",
    SassUnsetConfig: "CUpti_SassMetricsUnsetConfig_Params",
    SassEnable: "CUpti_SassMetricsEnable_Params",
    SassDisable: "CUpti_SassMetricsDisable_Params",
    SassGetDataProperties: "CUpti_SassMetricsGetDataProperties_Params",
    SassFlushData: "CUpti_SassMetricsFlushData_Params",
}

#: Plain structs (no structSize) checked for layout too.
PLAIN_C_NAMES: dict[type[ctypes.Structure], str] = {
    SassMetricDetails: "CUpti_SassMetrics_MetricDetails",
    SassConfig: "CUpti_SassMetrics_Config",
    SassInstanceValue: "CUpti_SassMetrics_InstanceValue",
    SassData: "CUpti_SassMetrics_Data",
}

#: C function -> its params struct.
FUNCTIONS: dict[str, type[ctypes.Structure]] = {
    "cuptiProfilerInitialize": ProfilerInitialize,
    "cuptiProfilerDeInitialize": ProfilerDeInitialize,
    "cuptiDeviceGetChipName": DeviceGetChipName,
    "cuptiProfilerDeviceSupported": DeviceSupported,
    "cuptiProfilerHostInitialize": HostInitialize,
    "cuptiProfilerHostDeinitialize": HostDeinitialize,
    "cuptiProfilerHostGetSupportedChips": HostGetSupportedChips,
    "cuptiProfilerHostConfigAddMetrics": HostConfigAddMetrics,
    "cuptiProfilerHostGetConfigImageSize": HostGetConfigImageSize,
    "cuptiProfilerHostGetConfigImage": HostGetConfigImage,
    "cuptiProfilerHostGetNumOfPasses": HostGetNumOfPasses,
    "cuptiProfilerHostEvaluateToGpuValues": HostEvaluateToGpuValues,
    "cuptiProfilerHostGetSinglePassSets": HostGetSinglePassSets,
    "cuptiProfilerHostGetBaseMetrics": HostGetBaseMetrics,
    "cuptiRangeProfilerEnable": RangeEnable,
    "cuptiRangeProfilerDisable": RangeDisable,
    "cuptiRangeProfilerSetConfig": RangeSetConfig,
    "cuptiRangeProfilerStart": RangeStart,
    "cuptiRangeProfilerStop": RangeStop,
    "cuptiRangeProfilerPushRange": RangePushRange,
    "cuptiRangeProfilerPopRange": RangePopRange,
    "cuptiRangeProfilerDecodeData": RangeDecodeData,
    "cuptiRangeProfilerGetCounterDataSize": RangeGetCounterDataSize,
    "cuptiRangeProfilerCounterDataImageInitialize": RangeCounterDataImageInitialize,
    "cuptiRangeProfilerGetCounterDataInfo": RangeGetCounterDataInfo,
    "cuptiSassMetricsGetNumOfMetrics": SassGetNumOfMetrics,
    "cuptiSassMetricsGetMetrics": SassGetMetrics,
    "cuptiSassMetricsGetProperties": SassGetProperties,
    "cuptiSassMetricsSetConfig": SassSetConfig,
    "cuptiSassMetricsUnsetConfig": SassUnsetConfig,
    "cuptiSassMetricsEnable": SassEnable,
    "cuptiSassMetricsDisable": SassDisable,
    "cuptiSassMetricsGetDataProperties": SassGetDataProperties,
    "cuptiSassMetricsFlushData": SassFlushData,
}

#: Load order: libcupti resolves the nvperf libraries by name, so they must be in the process first.
LIBRARIES = ("libnvperf_host.so", "libnvperf_target.so", "libcupti.so.13")


def find_library_dir(search: Sequence[str] | None = None) -> str | None:
    """The folder holding the wheel's CUPTI libraries: ``$KERNEL_LSP_CUPTI_LIB``, else ``nvidia/cu13/lib`` on ``sys.path``."""
    override = os.environ.get("KERNEL_LSP_CUPTI_LIB")
    if override:
        return override if os.path.isfile(os.path.join(override, LIBRARIES[-1])) else None
    if search is None:
        import sys

        search = sys.path
    for root in search:
        for sub in (("nvidia", "cu13", "lib"), ("nvidia", "cuda_cupti", "lib")):
            folder = os.path.join(root or ".", *sub)
            if os.path.isfile(os.path.join(folder, LIBRARIES[-1])):
                return folder
    return None


def _c_strings(names: Sequence[str]):
    array = (c_char_p * len(names))(*(n.encode() for n in names))
    return array


class Cupti:
    """The loaded library: each function called with its params struct; a non-zero result raises :class:`CuptiError`."""

    def __init__(self, lib: ctypes.CDLL, lib_dir: str):
        self.lib = lib
        self.lib_dir = lib_dir
        self._strings = getattr(lib, "cuptiGetResultString", None)
        if self._strings is not None:
            self._strings.argtypes = [c_int, POINTER(c_char_p)]
            self._strings.restype = c_int
        self.missing: list[str] = []
        for name, struct in FUNCTIONS.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                self.missing.append(name)
                continue
            fn.argtypes = [POINTER(struct)]
            fn.restype = c_int

    def text(self, code: int) -> str | None:
        if self._strings is None:
            return None
        out = c_char_p()
        if self._strings(code, ctypes.byref(out)) != SUCCESS or not out.value:
            return None
        return out.value.decode(errors="replace")

    def call(self, name: str, params: ctypes.Structure) -> ctypes.Structure:
        if name in self.missing:
            raise CuptiError(name, 11, "not exported by this libcupti")
        code = getattr(self.lib, name)(ctypes.byref(params))
        if code != SUCCESS:
            raise CuptiError(name, code, self.text(code))
        return params

    # -- device -------------------------------------------------------------------------------

    def profiler_initialize(self) -> None:
        self.call("cuptiProfilerInitialize", ProfilerInitialize())

    def profiler_deinitialize(self) -> None:
        self.call("cuptiProfilerDeInitialize", ProfilerDeInitialize())

    def chip_name(self, device_index: int = 0) -> str:
        p = self.call("cuptiDeviceGetChipName", DeviceGetChipName(deviceIndex=device_index))
        return p.pChipName.decode()

    def device_supported(self, device: int = 0) -> dict[str, int]:
        """The support levels (0 unknown, 1 unsupported, 2 disabled, 3 supported, 4 limited) for range profiling."""
        p = self.call("cuptiProfilerDeviceSupported", DeviceSupported(cuDevice=device, api=0))
        return {name: int(getattr(p, name)) for name, _ in DeviceSupported._fields_[2:] if name not in ("cuDevice", "api")}

    def supported_chips(self) -> list[str]:
        p = self.call("cuptiProfilerHostGetSupportedChips", HostGetSupportedChips())
        return [p.ppChipNames[i].decode() for i in range(p.numChips)]


def load(lib_dir: str | None = None) -> Cupti:
    """Open the CUPTI libraries of one release (see the module doc). Raises :class:`CuptiMissing`."""
    folder = lib_dir or find_library_dir()
    if folder is None:
        raise CuptiMissing("the CUPTI libraries (nvidia-cuda-cupti wheel: nvidia/cu13/lib/libcupti.so.13) were not found")
    handles = []
    for name in LIBRARIES:
        try:
            handles.append(ctypes.CDLL(os.path.join(folder, name), mode=ctypes.RTLD_GLOBAL))
        except OSError as exc:
            raise CuptiMissing(f"cannot open {name} from {folder}: {exc}") from None
    return Cupti(handles[-1], folder)


class Host:
    """A profiler-host object for one chip: config images, pass counts, metric evaluation."""

    def __init__(self, cupti: Cupti, chip: str, profiler_type: int = PROFILER_TYPE_RANGE):
        self.cupti = cupti
        self.chip = chip
        p = cupti.call(
            "cuptiProfilerHostInitialize", HostInitialize(profilerType=profiler_type, pChipName=chip.encode())
        )
        self.handle = p.pHostObject

    def close(self) -> None:
        if self.handle:
            self.cupti.call("cuptiProfilerHostDeinitialize", HostDeinitialize(pHostObject=self.handle))
            self.handle = None

    def config_image(self, metrics: Sequence[str]) -> ctypes.Array:
        """The config image scheduling ``metrics``. Raises CuptiError (INVALID_METRIC_NAME for a name the chip lacks).

        A host object accumulates metrics, so each image is made on a fresh object by the caller
        (:meth:`RangeProfiler.profile` does).
        """
        names = _c_strings(metrics)
        self.cupti.call(
            "cuptiProfilerHostConfigAddMetrics",
            HostConfigAddMetrics(pHostObject=self.handle, ppMetricNames=names, numMetrics=len(metrics)),
        )
        size = self.cupti.call("cuptiProfilerHostGetConfigImageSize", HostGetConfigImageSize(pHostObject=self.handle)).configImageSize
        image = (c_uint8 * size)()
        self.cupti.call(
            "cuptiProfilerHostGetConfigImage",
            HostGetConfigImage(pHostObject=self.handle, configImageSize=size, pConfigImage=ctypes.addressof(image)),
        )
        return image

    def passes(self, image: ctypes.Array) -> int:
        p = self.cupti.call(
            "cuptiProfilerHostGetNumOfPasses",
            HostGetNumOfPasses(configImageSize=len(image), pConfigImage=ctypes.addressof(image)),
        )
        return int(p.numOfPasses)

    def evaluate(self, counter_data: ctypes.Array, metrics: Sequence[str], range_index: int) -> list[float]:
        names = _c_strings(metrics)
        values = (c_double * len(metrics))()
        self.cupti.call(
            "cuptiProfilerHostEvaluateToGpuValues",
            HostEvaluateToGpuValues(
                pHostObject=self.handle, pCounterDataImage=ctypes.addressof(counter_data),
                counterDataImageSize=len(counter_data), rangeIndex=range_index, ppMetricNames=names,
                numMetrics=len(metrics), pMetricValues=values,
            ),
        )
        return list(values)

    def base_metrics(self, metric_type: str) -> list[str]:
        """The chip's base metric names of one type (``counter``, ``ratio``, ``throughput``)."""
        p = self.cupti.call(
            "cuptiProfilerHostGetBaseMetrics", HostGetBaseMetrics(pHostObject=self.handle, metricType=METRIC_TYPES[metric_type])
        )
        return [p.ppMetricNames[i].decode() for i in range(p.numMetrics)]

    def single_pass_sets(self) -> list[str]:
        p = self.cupti.call("cuptiProfilerHostGetSinglePassSets", HostGetSinglePassSets(pChipName=self.chip.encode()))
        count = p.numOfSinglePassSets
        if count == 0:
            return []
        out = (c_char_p * count)()
        p = self.cupti.call(
            "cuptiProfilerHostGetSinglePassSets",
            HostGetSinglePassSets(pChipName=self.chip.encode(), numOfSinglePassSets=count, ppSinglePassSets=out),
        )
        return [out[i].decode() for i in range(p.numOfSinglePassSets)]


@dataclass(frozen=True)
class RangeResult:
    """What one range-profiler collection gave."""

    values: tuple[dict[str, float], ...]
    """Metric values, one mapping per range (one range per kernel launch under auto range)."""
    passes: int
    """Passes the config image needs (CUPTI's count)."""
    rounds: int
    """Start/launch/Stop rounds made (1 under kernel replay; one per pass under user replay)."""
    dropped_ranges: int
    config_s: float
    """Host time to build the config image and counter-data image, s."""
    collect_s: float
    """SetConfig, the replayed launch(es) and Stop, s."""
    decode_s: float
    """DecodeData and the host evaluation, s."""


class RangeProfiler:
    """Range profiling enabled on one CUDA context (``cuptiRangeProfilerEnable``), for one profile.

    Seen on the H200 (tests/fixtures/cupti/recorded): a second ``SetConfig`` on the same enabled
    object crashed the process under kernel replay and made ``Start`` fail with
    CUPTI_ERROR_UNKNOWN under user replay, while enable → one profile → disable worked every
    time and costs about 0.01 s. So each object makes one profile (:func:`profile_once`), and
    the config and counter-data images it handed to CUPTI live until it is disabled.
    """

    def __init__(self, cupti: Cupti, context: int, chip: str, *, cache_control: int = CACHE_CONTROL_NONE):
        self.cupti = cupti
        self.chip = chip
        self._images: tuple = ()
        self._used = False
        p = cupti.call("cuptiRangeProfilerEnable", RangeEnable(ctx=context, cacheControlMode=cache_control))
        self.handle = p.pRangeProfilerObject

    def close(self) -> None:
        if self.handle:
            try:
                self.cupti.call("cuptiRangeProfilerDisable", RangeDisable(pRangeProfilerObject=self.handle))
            finally:
                self.handle = None
                self._images = ()

    def counter_data(self, metrics: Sequence[str], max_ranges: int) -> ctypes.Array:
        names = _c_strings(metrics)
        p = self.cupti.call(
            "cuptiRangeProfilerGetCounterDataSize",
            RangeGetCounterDataSize(
                pRangeProfilerObject=self.handle, pMetricNames=names, numMetrics=len(metrics),
                maxNumOfRanges=max_ranges, maxNumRangeTreeNodes=max_ranges,
            ),
        )
        image = (c_uint8 * p.counterDataSize)()
        self.cupti.call(
            "cuptiRangeProfilerCounterDataImageInitialize",
            RangeCounterDataImageInitialize(
                pRangeProfilerObject=self.handle, counterDataSize=len(image), pCounterData=ctypes.addressof(image)
            ),
        )
        return image

    def profile(
        self,
        metrics: Sequence[str],
        launch: Callable[[], None],
        *,
        replay: int = KERNEL_REPLAY,
        range_mode: int = AUTO_RANGE,
        max_ranges: int = 1,
        max_rounds: int = 64,
        clock: Callable[[], float] = time.perf_counter,
        host_factory: Callable[[], Host] | None = None,
    ) -> RangeResult:
        """Collect ``metrics`` for what ``launch`` enqueues (it must synchronize before returning).

        ``host_factory``: makes the profiler-host object (default: :class:`Host` on this chip); a
        host object accumulates the metrics it is given, so every profile makes a fresh one.
        """
        if self._used:
            raise CuptiError("cuptiRangeProfilerSetConfig", 7, "one profile per enabled range profiler (see the class doc)")
        self._used = True
        t0 = clock()
        host = host_factory() if host_factory is not None else Host(self.cupti, self.chip)
        try:
            config = host.config_image(metrics)
            passes = host.passes(config)
            data = self.counter_data(metrics, max_ranges)
            # CUPTI keeps these pointers until Disable.
            self._images = (config, data)
            t1 = clock()
            self.cupti.call(
                "cuptiRangeProfilerSetConfig",
                RangeSetConfig(
                    pRangeProfilerObject=self.handle, configSize=len(config), pConfig=ctypes.addressof(config),
                    counterDataImageSize=len(data), pCounterDataImage=ctypes.addressof(data), range=range_mode,
                    replayMode=replay, maxRangesPerPass=max_ranges, numNestingLevels=1, minNestingLevel=1,
                    passIndex=0, targetNestingLevel=1,
                ),
            )
            rounds = 0
            while True:
                rounds += 1
                self.cupti.call("cuptiRangeProfilerStart", RangeStart(pRangeProfilerObject=self.handle))
                if range_mode == USER_RANGE:
                    self.cupti.call("cuptiRangeProfilerPushRange", RangePushRange(pRangeProfilerObject=self.handle, pRangeName=b"kernel"))
                launch()
                if range_mode == USER_RANGE:
                    self.cupti.call("cuptiRangeProfilerPopRange", RangePopRange(pRangeProfilerObject=self.handle))
                stop = self.cupti.call("cuptiRangeProfilerStop", RangeStop(pRangeProfilerObject=self.handle))
                if stop.isAllPassSubmitted or rounds >= max_rounds:
                    break
            t2 = clock()
            dropped = self.cupti.call("cuptiRangeProfilerDecodeData", RangeDecodeData(pRangeProfilerObject=self.handle)).numOfRangeDropped
            ranges = self.cupti.call(
                "cuptiRangeProfilerGetCounterDataInfo",
                RangeGetCounterDataInfo(pCounterDataImage=ctypes.addressof(data), counterDataImageSize=len(data)),
            ).numTotalRanges
            values = tuple(dict(zip(metrics, host.evaluate(data, metrics, i))) for i in range(ranges))
            t3 = clock()
        finally:
            host.close()
        if not stop.isAllPassSubmitted:
            raise CuptiError("cuptiRangeProfilerStop", 13, f"passes still pending after {rounds} rounds")
        return RangeResult(values, passes, rounds, int(dropped), t1 - t0, t2 - t1, t3 - t2)


def profile_once(cupti: Cupti, context: int, chip: str, metrics: Sequence[str], launch: Callable[[], None], *,
                 cache_control: int = CACHE_CONTROL_NONE, **options) -> RangeResult:
    """Enable the range profiler, make one profile (:meth:`RangeProfiler.profile` options), disable it."""
    profiler = RangeProfiler(cupti, context, chip, cache_control=cache_control)
    try:
        return profiler.profile(metrics, launch, **options)
    finally:
        profiler.close()


#: What the profiler host answers for a metric name the chip does not have: INVALID_METRIC_NAME by the
#: header, INVALID_PARAMETER as seen on the H200 (cuptiProfilerHostConfigAddMetrics, CUPTI 13.4).
UNKNOWN_METRIC_CODES = (17, 1)


@dataclass(frozen=True)
class SassResult:
    """Instruction-level counters of one launch, summed over the kernel's instructions."""

    totals: dict[str, float]
    """SASS metric name -> sum over every patched instruction (what ncu's ``NAME.sum`` reports)."""
    records: int
    """Patched instructions that reported."""
    by_pc: tuple[tuple[int, dict[str, float]], ...]
    """(pc offset, metric -> value) per instruction, in the order CUPTI gave them."""
    wall_s: float


class SassMetrics:
    """CUPTI's SASS metrics API for one device and context.

    On the H200 (tests/fixtures/cupti/recorded/probe2) a collection worked, but the next
    ``cuptiSassMetricsSetConfig`` after an unset failed with CUPTI_ERROR_OUT_OF_MEMORY. So a
    configuration stays set (:meth:`configure`) for every collection that needs no other
    metric, and is unset only by :meth:`close` or by a collection that needs more.
    """

    def __init__(self, cupti: Cupti, chip: str, context: int, device_index: int = 0):
        self.cupti = cupti
        self.chip = chip
        self.context = context
        self.device_index = device_index
        self._ids: dict[int, str] = {}
        """Metric id -> name of the configuration that is set (empty: none)."""

    def available(self) -> dict[str, str]:
        """Every SASS metric of the chip: name -> description."""
        n = self.cupti.call("cuptiSassMetricsGetNumOfMetrics", SassGetNumOfMetrics(pChipName=self.chip.encode())).numOfMetrics
        details = (SassMetricDetails * n)()
        self.cupti.call(
            "cuptiSassMetricsGetMetrics", SassGetMetrics(pChipName=self.chip.encode(), numOfMetrics=n, pMetricsList=details)
        )
        return {d.pMetricName.decode(): (d.pMetricDescription or b"").decode() for d in details}

    def metric_id(self, name: str) -> int:
        p = self.cupti.call("cuptiSassMetricsGetProperties", SassGetProperties(pChipName=self.chip.encode(), pMetricName=name.encode()))
        return int(p.metric.metricId)

    @property
    def configured(self) -> tuple[str, ...]:
        return tuple(self._ids.values())

    def configure(self, metrics: Sequence[str]) -> None:
        """Set the configuration to ``metrics`` (unsetting the one before, if any)."""
        ids = {self.metric_id(m): m for m in dict.fromkeys(metrics)}
        self.close()
        configs = (SassConfig * len(ids))(*(SassConfig(metricId=i, outputGranularity=SASS_GRANULARITY_GPU) for i in ids))
        self.cupti.call(
            "cuptiSassMetricsSetConfig",
            SassSetConfig(numOfMetricConfig=len(ids), pConfigs=configs, deviceIndex=self.device_index),
        )
        self._ids = ids

    def close(self) -> None:
        if self._ids:
            self._ids = {}
            self.cupti.call("cuptiSassMetricsUnsetConfig", SassUnsetConfig(deviceIndex=self.device_index))

    def collect(self, metrics: Sequence[str], launch: Callable[[], None], clock: Callable[[], float] = time.perf_counter) -> SassResult:
        """Patch, run ``launch`` (it must synchronize), read every instruction's counters, unpatch.

        Totals cover every configured metric; the configuration is changed only when it lacks one of ``metrics``.
        """
        t0 = clock()
        if not set(metrics) <= set(self.configured):
            self.configure([*self.configured, *metrics])
        ids = self._ids
        self.cupti.call("cuptiSassMetricsEnable", SassEnable(ctx=self.context, enableLazyPatching=1))
        try:
            launch()
            props = self.cupti.call("cuptiSassMetricsGetDataProperties", SassGetDataProperties(ctx=self.context))
            count, instances = int(props.numOfPatchedInstructionRecords), int(props.numOfInstances)
            by_pc: list[tuple[int, dict[str, float]]] = []
            totals = {m: 0.0 for m in ids.values()}
            if count:
                records = (SassData * count)()
                keep = []
                for r in records:
                    r.structSize = ctypes.sizeof(SassData)
                    values = (SassInstanceValue * (instances * len(ids)))()
                    keep.append(values)
                    r.pInstanceValues = values
                self.cupti.call(
                    "cuptiSassMetricsFlushData",
                    SassFlushData(ctx=self.context, numOfPatchedInstructionRecords=count, numOfInstances=instances,
                                  pMetricsData=records),
                )
                for r, values in zip(records, keep):
                    row: dict[str, float] = {}
                    for v in values:
                        name = ids.get(int(v.metricId))
                        if name is not None:
                            row[name] = row.get(name, 0.0) + float(v.value)
                    for name, value in row.items():
                        totals[name] += value
                    by_pc.append((int(r.pcOffset), row))
        finally:
            self.cupti.call("cuptiSassMetricsDisable", SassDisable(ctx=self.context))
        return SassResult(totals, len(by_pc), tuple(by_pc), clock() - t0)
