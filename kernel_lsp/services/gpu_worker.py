"""The GPU worker: one long-lived child process per server that launches kernels from their specs.

Why a process that stays: an ``ncu`` run costs about 1.7 s before it collects anything,
plus the Python launcher's start-up, while a replay pass costs about 0.02 s. The worker
keeps a CUDA context, loads each new cubin, makes the spec's inputs on the GPU, times
launches with CUDA events and collects counters in-process through CUPTI's range profiler
(kernel replay) and its SASS-metrics API (:mod:`kernel_lsp.services.cupti_range`).

Why a process at all: a kernel that faults poisons its CUDA context and a hang must be
killable. A fault ends the worker (its reply says what happened); a request that does not
answer within its timeout has the worker killed. Either way the next request starts a fresh
worker, and the profile that failed reports the fault.

Metric names stay ncu's. :func:`route` says which collector gives each name: the launch
itself (``launch__*``, ``device__*`` and theoretical occupancy, from the function's attributes
and :mod:`kernel_lsp.core.occupancy`, as ncu reports them without a counter), else the range
profiler (hardware counters and, as its host accepted on the H200, ``smsp__sass_*`` names;
ncu's source-level ``memory_*`` counts through a stand-in name), else the SASS-metrics API.
The worker learns which names the range profiler's host refuses and routes them to the next
collector. A name none of them gives is ``missing``: the profiler then uses ncu for that profile.

The parent side is :class:`GpuWorker` (thread-safe, one request at a time); the child's
loop is :func:`_worker_main`. Messages are dicts over a ``multiprocessing`` pipe. Besides
``profile`` requests the worker takes ``prepare``: a spec's inputs made on the GPU ahead of its
first profile (the server asks when a file with specs is opened), kept with those of the last
few specs (:data:`INPUT_SPECS_KEPT`), so a first save costs what any save costs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import multiprocessing
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel_lsp.core import profile as P
from kernel_lsp.core.occupancy import theoretical_occupancy

log = logging.getLogger(__name__)

#: Seconds a fresh worker may take to make its context (and load CUPTI) before it counts as dead.
START_TIMEOUT_S = 60.0
#: What the child reports once the kernel's own launches ran cleanly and counter collection begins.
COUNTERS_PHASE = "collecting counters"
#: CUPTI crashes (worker deaths while collecting) after which this worker collects no more counters.
MAX_CUPTI_CRASHES = 2
#: After a worker could not start (no GPU, no pycuda), seconds before the next attempt: each costs a process.
RETRY_START_S = 300.0
#: Specs whose inputs the worker keeps on the GPU, at most, and their device bytes together (the last
#: spec's are kept whatever their size): a file of several kernels saved again finds every kernel's inputs.
INPUT_SPECS_KEPT = 8
INPUT_BYTES_KEPT = 4 << 30
_POLL_S = 0.05

# --------------------------------------------------------------------------- routing (pure)

#: Metrics every ncu run reports without a counter; the worker computes them from the launch.
LAUNCH_METRICS: tuple[str, ...] = (
    P.M_REGISTERS, P.M_SMEM_STATIC, P.M_SMEM_DYNAMIC, P.M_BLOCK_SIZE, P.M_GRID_SIZE, P.M_WAVES,
    P.M_THEORETICAL_OCC, P.M_LIMIT_REGISTERS, P.M_LIMIT_SHARED, P.M_LIMIT_WARPS, P.M_LIMIT_BLOCKS, P.M_SM_COUNT,
)

#: ncu names computed from SASS-metric totals, each with alternatives tried in order (the first whose
#: inputs the chip lists): ("sum", a, b, ...) adds totals, ("pct", numerator, denominator) is 100 n / d.
#: ncu derives its source-level ``memory_*`` counts from the same per-instruction counters.
SASS_FORMULAS: dict[str, tuple[tuple[str, ...], ...]] = {
    P.M_GLOBAL_SECTORS_THEORETICAL: (
        ("sum", "smsp__sass_sectors_mem_global"),
        ("sum", "smsp__sass_sectors_mem_global_op_ld", "smsp__sass_sectors_mem_global_op_st"),
    ),
    P.M_GLOBAL_SECTORS_IDEAL: (
        ("sum", "smsp__sass_sectors_mem_global_ideal"),
        ("sum", "smsp__sass_sectors_mem_global_op_ld_ideal", "smsp__sass_sectors_mem_global_op_st_ideal"),
    ),
    # The H200's SASS-metrics API lists these as smsp__sass_l1tex_pipe_lsu_wavefronts_mem_shared[_ideal].
    P.M_SHARED_WAVEFRONTS: (("sum", "smsp__sass_l1tex_pipe_lsu_wavefronts_mem_shared"),),
    P.M_SHARED_WAVEFRONTS_IDEAL: (("sum", "smsp__sass_l1tex_pipe_lsu_wavefronts_mem_shared_ideal"),),
    P.M_BRANCH_UNIFORM_PCT: (("pct", "smsp__sass_branch_targets_threads_uniform", "smsp__sass_branch_targets"),),
}

#: ncu's source-level (ncu-only) names and the range-profiler metric tried for each first; the H200's
#: profiler host refused the ncu names themselves (tests/fixtures/cupti/recorded). When the host
#: refuses the stand-in too, the SASS-metrics API is tried (:data:`SASS_FORMULAS`).
RANGE_STANDINS: dict[str, str] = {
    # accepted by the H200's host, with the SASS API's value (tests/fixtures/cupti/recorded/probe2)
    P.M_GLOBAL_SECTORS_THEORETICAL: "smsp__sass_sectors_mem_global.sum",
    P.M_SHARED_WAVEFRONTS: "smsp__sass_l1tex_pipe_lsu_wavefronts_mem_shared.sum",
}
# The ideal counts have no range-profiler name (the host refused smsp__sass_sectors_mem_global_ideal.sum):
# they come from the SASS-metrics API.

#: Prefixes of what ncu computes itself (no counter of that name exists for CUPTI).
NCU_ONLY_PREFIXES = ("derived__", "memory_", "launch__", "device__")


def sass_formulas(name: str) -> tuple[tuple[str, ...], ...]:
    """How ncu's ``name`` may come from SASS metrics (alternatives in order); () when it is not instruction-level."""
    if name in SASS_FORMULAS:
        return SASS_FORMULAS[name]
    if name.startswith("smsp__sass_") and name.endswith(".sum"):
        return (("sum", name.removesuffix(".sum")),)
    return ()


def sass_formula(name: str, have: Collection[str]) -> tuple[str, ...] | None:
    """The first of :func:`sass_formulas` whose inputs are all in ``have``, or None."""
    return next((f for f in sass_formulas(name) if all(n in have for n in f[1:])), None)


@dataclass(frozen=True)
class Routing:
    """Which collector gives each wanted metric (ncu names)."""

    range: tuple[str, ...]
    """Names to ask the range profiler for (stand-ins included)."""
    aliases: Mapping[str, str]
    """Range-profiler stand-in -> the ncu name its value is reported under."""
    sass: tuple[str, ...]
    """ncu names computed from SASS metrics (see :data:`SASS_FORMULAS`)."""
    sass_metrics: tuple[str, ...]
    """The SASS-metric names to collect for them."""
    launch: tuple[str, ...]
    missing: tuple[str, ...] = ()
    """Names no collector here gives (ncu-only metrics without a stand-in, or refused everywhere)."""


def route(metrics: Sequence[str], *, range_refused: Sequence[str] = (), sass_available: Sequence[str] | None = None) -> Routing:
    """Split ``metrics`` among the collectors: launch attributes, else the range profiler, else SASS metrics.

    ``range_refused``: names the range profiler's host refused on this machine;
    ``sass_available``: the chip's SASS metrics (None: not known, so SASS metrics are not offered).
    """
    rng: list[str] = []
    aliases: dict[str, str] = {}
    sass: list[str] = []
    sass_names: list[str] = []
    launch: list[str] = []
    missing: list[str] = []
    refused = set(range_refused)
    have = set(sass_available or ())
    for name in dict.fromkeys(metrics):
        if name in LAUNCH_METRICS:
            launch.append(name)
            continue
        asked = RANGE_STANDINS.get(name, name)
        if asked not in refused and not asked.startswith(NCU_ONLY_PREFIXES):
            rng.append(asked)
            if asked != name:
                aliases[asked] = name
            continue
        formula = sass_formula(name, have)
        if formula is not None:
            sass.append(name)
            sass_names.extend(n for n in formula[1:] if n not in sass_names)
            continue
        missing.append(name)
    return Routing(tuple(rng), aliases, tuple(sass), tuple(sass_names), tuple(launch), tuple(missing))


def sass_values(totals: Mapping[str, float], names: Sequence[str]) -> dict[str, float]:
    """ncu values for ``names`` from SASS-metric totals (a percentage of a zero denominator is left out)."""
    out: dict[str, float] = {}
    for name in names:
        formula = sass_formula(name, totals)
        if formula is None:
            continue
        if formula[0] == "sum":
            out[name] = float(sum(totals[n] for n in formula[1:]))
        elif totals[formula[2]]:
            out[name] = 100.0 * float(totals[formula[1]]) / float(totals[formula[2]])
    return out


def launch_values(*, arch: str, grid: Sequence[int], block: Sequence[int], registers: int | None,
                  static_smem_bytes: int, dynamic_smem_bytes: int, sm_count: int | None) -> dict[str, float]:
    """The ``launch__*`` metrics ncu reports for a launch, from the function's attributes (ncu's definitions).

    Waves per SM: blocks of the grid over the blocks all SMs hold at once.
    """
    threads = int(math.prod(block))
    blocks = int(math.prod(grid))
    out: dict[str, float] = {
        P.M_BLOCK_SIZE: float(threads), P.M_GRID_SIZE: float(blocks),
        P.M_SMEM_STATIC: float(static_smem_bytes), P.M_SMEM_DYNAMIC: float(dynamic_smem_bytes),
    }
    if registers is not None:
        out[P.M_REGISTERS] = float(registers)
    if sm_count:
        out[P.M_SM_COUNT] = float(sm_count)
    occ = theoretical_occupancy(arch, threads, registers, static_smem_bytes + dynamic_smem_bytes)
    if occ is not None:
        out[P.M_THEORETICAL_OCC] = occ.occupancy_pct
        out[P.M_LIMIT_WARPS] = float(occ.blocks_limit_threads)
        out[P.M_LIMIT_BLOCKS] = float(occ.blocks_limit_blocks_per_sm)
        out[P.M_LIMIT_SHARED] = float(occ.blocks_limit_shared_memory)
        if occ.blocks_limit_registers is not None:
            out[P.M_LIMIT_REGISTERS] = float(occ.blocks_limit_registers)
        if sm_count and occ.active_blocks_per_sm:
            out[P.M_WAVES] = blocks / (occ.active_blocks_per_sm * sm_count)
    return out


# --------------------------------------------------------------------------- parent side


@dataclass(frozen=True)
class Request:
    """One profile: launch ``entry`` of ``cubin`` from its spec, time it, collect ``collections``."""

    cubin_path: str
    entry: str
    spec: Mapping[str, Any]
    """The launch spec's JSON object."""
    base_dir: str
    """Folder of ``file(NAME.npy)`` inputs."""
    arch: str
    timed: int
    """Launches timed with CUDA events (after one warm-up launch)."""
    collections: tuple[tuple[str, ...], ...] = ()
    """Metric lists (ncu names), each collected for one launch in its own range-profiler session."""
    seed: int = 0


@dataclass(frozen=True)
class Reply:
    timings_us: tuple[float, ...]
    """Event-timed durations of the timed launches, µs."""
    metrics: Mapping[str, float]
    """Every collected metric, ncu names, base units."""
    passes: int
    """Replay passes of every range-profiler collection together."""
    missing: tuple[str, ...]
    """Wanted names this worker could not give."""
    wall_s: float
    """Seconds the worker spent on the request (inputs, launches, collection)."""
    steps_s: Mapping[str, float] = field(default_factory=dict)


class WorkerError(RuntimeError):
    """The request failed; ``fault`` when the kernel faulted or hung (the worker was stopped and will restart)."""

    def __init__(self, message: str, *, fault: bool = False, cupti: bool = False, died: bool = False):
        super().__init__(message)
        self.fault = fault
        self.died = died
        """The worker process ended without answering."""
        self.cupti = cupti
        """True when CUPTI refused (the launch itself worked): the caller may fall back to ncu."""


@dataclass(frozen=True)
class WorkerInfo:
    device: str | None
    cupti_ok: bool
    cupti_error: str | None
    chip: str | None
    startup_s: float
    sass_available: tuple[str, ...] | None = None


class GpuWorker:
    """The parent's handle on the worker process (started on first use, restarted after a fault)."""

    def __init__(self, *, start_timeout_s: float = START_TIMEOUT_S, lib_dir: str | None = None, main=None):
        """``main``: the child's entry (default :func:`_worker_main`; tests give a scripted one)."""
        self.start_timeout_s = start_timeout_s
        self.lib_dir = lib_dir
        self._main = main or _worker_main
        self.info: WorkerInfo | None = None
        self.starts = 0
        """Worker processes started so far (1 + restarts)."""
        self.start_wall_s: float | None = None
        """Seconds the last start took, spawn to ready (Python, pycuda, context, CUPTI), measured here."""
        self._lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Any = None
        self._start_failed: tuple[float, str] | None = None
        """(monotonic time, message) of the last start that failed."""
        self.range_refused: frozenset[str] = frozenset()
        """Metric names the range profiler refused on this machine (learnt from the worker's replies)."""
        self.sass_refused: frozenset[str] = frozenset()
        """SASS metrics listed by the chip that the worker could not collect (learnt likewise)."""
        self.cupti_crashes = 0
        """Workers that died while collecting counters after the kernel had run cleanly."""

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def ensure(self) -> WorkerInfo:
        """Start the worker if it is not running; its :class:`WorkerInfo`. Raises WorkerError."""
        with self._lock:
            return self._ensure()

    def _ensure(self) -> WorkerInfo:
        if self.alive and self.info is not None:
            return self.info
        self._stop()
        if self._start_failed is not None and time.monotonic() - self._start_failed[0] < RETRY_START_S:
            raise WorkerError(self._start_failed[1])
        spawned = time.monotonic()
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(target=self._main, args=(child, self.lib_dir), name="kernel-lsp-gpu", daemon=True)
        process.start()
        child.close()
        self._process, self._conn = process, parent
        self.starts += 1
        try:
            reply = self._receive(self.start_timeout_s, "starting")
        except WorkerError as exc:
            self._start_failed = (time.monotonic(), str(exc))
            raise
        if "error" in reply:
            self._stop()
            message = f"the GPU worker could not start: {reply['error']}"
            self._start_failed = (time.monotonic(), message)
            raise WorkerError(message)
        self._start_failed = None
        self.start_wall_s = time.monotonic() - spawned
        self.info = WorkerInfo(
            device=reply.get("device"), cupti_ok=bool(reply.get("cupti_ok")), cupti_error=reply.get("cupti_error"),
            chip=reply.get("chip"), startup_s=float(reply.get("startup_s", 0.0)),
            sass_available=tuple(reply["sass_available"]) if reply.get("sass_available") is not None else None,
        )
        return self.info

    def _stop(self) -> None:
        process, self._process = self._process, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if process is not None and process.is_alive():
            process.kill()
            process.join(5.0)

    def close(self) -> None:
        with self._lock:
            if self.alive and self._conn is not None:
                try:
                    self._conn.send({"op": "quit"})
                    self._process.join(2.0)
                except (OSError, EOFError):
                    pass
            self._stop()

    def _receive(self, timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._conn.poll(_POLL_S):
                    return self._conn.recv()
            except (EOFError, OSError):
                pass
            else:
                died = self._process is not None and not self._process.is_alive() and not self._conn.poll()
                if not died:
                    if time.monotonic() < deadline:
                        continue
                    self._stop()
                    raise WorkerError(
                        f"the kernel did not finish within {timeout_s:.0f} s while {what} (profileTimeoutS): it may hang; "
                        "the GPU worker was stopped and restarts on the next profile", fault=True)
            code = None
            if self._process is not None:
                self._process.join(2.0)  # the pipe closes a moment before the process is reaped
                code = self._process.exitcode
            self._stop()
            raise WorkerError(f"the GPU worker died while {what} (exit code {code}); it restarts on the next profile",
                              fault=True, died=True)

    def prepare(self, spec: Mapping[str, Any], base_dir: str | None, *, seed: int = 0, timeout_s: float) -> float:
        """Make the inputs of ``spec`` on the GPU now (a later :meth:`profile` of it finds them); the worker's
        seconds. Raises WorkerError (a bad spec, no worker)."""
        with self._lock:
            self._ensure()
            self._conn.send({"op": "prepare", "request": {"spec": dict(spec), "base_dir": base_dir, "seed": seed}})
            reply = self._receive(timeout_s, "preparing inputs")
            if "error" in reply:
                raise WorkerError(reply["error"])
            return float(reply.get("wall_s", 0.0))

    def profile(self, request: Request, *, timeout_s: float) -> Reply:
        """Run one request. Raises WorkerError (``fault``: the kernel faulted or hung; ``cupti``: counters refused)."""
        with self._lock:
            info = self._ensure()
            if request.collections and not info.cupti_ok:
                raise WorkerError(f"CUPTI is not usable in the GPU worker: {info.cupti_error}", cupti=True)
            if request.collections and self.cupti_crashes >= MAX_CUPTI_CRASHES:
                raise WorkerError(f"CUPTI crashed the GPU worker {self.cupti_crashes} times: counters are left to ncu",
                                  cupti=True)
            self._conn.send({"op": "profile", "request": _request_dict(request)})
            deadline = time.monotonic() + timeout_s
            phase = "profiling"
            while True:
                try:
                    reply = self._receive(max(0.0, deadline - time.monotonic()), phase)
                except WorkerError as exc:
                    if exc.died and phase == COUNTERS_PHASE:
                        # The kernel had run cleanly: the crash is CUPTI's. Twice, and CUPTI is off for this worker.
                        self.cupti_crashes += 1
                        raise WorkerError(f"{exc} (the kernel ran cleanly before: CUPTI crashed)", cupti=True) from None
                    raise
                if "progress" not in reply:
                    break
                phase = reply["progress"]
            if "error" in reply:
                if reply.get("fault"):
                    # The context is poisoned: the worker exits after answering; start afresh next time.
                    self._stop()
                raise WorkerError(reply["error"], fault=bool(reply.get("fault")), cupti=bool(reply.get("cupti")))
            self.range_refused = self.range_refused | frozenset(reply.get("range_refused", ()))
            self.sass_refused = self.sass_refused | frozenset(reply.get("sass_refused", ()))
            for note in reply.get("notes", ()):
                log.info("GPU worker: %s", note)
            return Reply(
                timings_us=tuple(float(t) for t in reply["timings_us"]),
                metrics={k: float(v) for k, v in reply["metrics"].items()},
                passes=int(reply.get("passes", 0)),
                missing=tuple(reply.get("missing", ())),
                wall_s=float(reply.get("wall_s", 0.0)),
                steps_s={k: float(v) for k, v in reply.get("steps_s", {}).items()},
            )


def _free(cuda: Any, buffers: Sequence[Any]) -> None:
    for buf in buffers:
        try:
            buf.free()
        except cuda.Error:
            pass


def _request_dict(r: Request) -> dict[str, Any]:
    return {"cubin_path": r.cubin_path, "entry": r.entry, "spec": dict(r.spec), "base_dir": r.base_dir, "arch": r.arch,
            "timed": r.timed, "collections": [list(c) for c in r.collections], "seed": r.seed}


# --------------------------------------------------------------------------- child side


def _worker_main(conn: Any, lib_dir: str | None) -> None:
    """Make the context, try CUPTI, then answer requests until ``quit`` or EOF."""
    started = time.perf_counter()
    try:
        gpu = _Gpu(lib_dir)
    except Exception as exc:  # no GPU, no pycuda: the parent reports it
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    conn.send({"device": gpu.device_name, "cupti_ok": gpu.cupti_error is None, "cupti_error": gpu.cupti_error,
               "chip": gpu.chip, "cache_control": gpu.cache_control, "startup_s": time.perf_counter() - started,
               "sass_available": sorted(gpu.sass_available) if gpu.sass_available is not None else None})
    try:
        _serve(conn, gpu)
    finally:
        gpu.close()


def _serve(conn: Any, gpu: _Gpu) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message.get("op") == "quit":
            return
        if message.get("op") == "prepare":
            conn.send(gpu.prepare(message["request"]))
            continue
        if message.get("op") != "profile":
            conn.send({"error": f"unknown request {message.get('op')!r}"})
            continue
        reply = gpu.profile(message["request"], progress=conn.send)
        conn.send(reply)
        if reply.get("fault"):
            return


class _Gpu:
    """The child's CUDA context, loaded modules and CUPTI state."""

    def __init__(self, lib_dir: str | None):
        import pycuda.driver as cuda

        self.cuda = cuda
        cuda.init()
        if cuda.Device.count() == 0:
            raise RuntimeError("no CUDA GPU available (the driver reports 0 devices)")
        self.device = cuda.Device(0)
        self.device_name = self.device.name()
        self.context = self.device.make_context()
        self.sm_count = int(self.device.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT))
        self.modules: dict[str, Any] = {}
        self._sass_session = None
        self._cached_inputs: OrderedDict[tuple, tuple] = OrderedDict()
        """Spec key -> (device args, [(work, pristine, bytes)] restored per request, every buffer, device bytes)
        of the last specs, most recent last."""
        self.cupti = None
        self.chip: str | None = None
        self.cupti_error: str | None = None
        self.sass_available: set[str] | None = None
        self.cache_control = 0
        self.sass_refused: set[str] = set()
        """SASS metrics the chip lists that could not be collected here."""
        self.range_refused: set[str] = set()
        """Names the range profiler's host refused (:data:`cupti_range.UNKNOWN_METRIC_CODES`), found one by one."""
        self.context_handle = _current_context()
        try:
            from kernel_lsp.services import cupti_range

            self.cr = cupti_range
            self.cupti = cupti_range.load(lib_dir)
            self.cupti.profiler_initialize()
            self.chip = self.cupti.chip_name(0)
            # Enabling proves the range profiler works here (permissions, device support) before any request.
            # ncu flushes the caches before every replay pass (--cache-control all, its default), so the
            # values compare with its profiles only when CUPTI does the same; older drivers may refuse it.
            self.cache_control = cupti_range.CACHE_CONTROL_ALL
            try:
                cupti_range.RangeProfiler(self.cupti, self.context_handle, self.chip, cache_control=self.cache_control).close()
            except cupti_range.CuptiError:
                self.cache_control = cupti_range.CACHE_CONTROL_NONE
                cupti_range.RangeProfiler(self.cupti, self.context_handle, self.chip).close()
        except Exception as exc:
            self.cupti_error = f"{type(exc).__name__}: {exc}"
            self.cupti = None
            return
        try:
            self.sass_available = set(self.cr.SassMetrics(self.cupti, self.chip, self.context_handle).available())
        except Exception as exc:
            log.info("SASS metrics unavailable: %s", exc)
            self.sass_available = set()

    def _sass(self):
        """The worker's SASS-metrics session, configured once with every formula input the chip lists."""
        if self._sass_session is None:
            have = (self.sass_available or set()) - self.sass_refused
            inputs = [n for name in SASS_FORMULAS if (f := sass_formula(name, have)) for n in f[1:]]
            session = self.cr.SassMetrics(self.cupti, self.chip, self.context_handle)
            if inputs:
                session.configure(inputs)
            self._sass_session = session
        return self._sass_session

    def close(self) -> None:
        """Free the inputs and pop the context (pycuda aborts a process that exits with one current)."""
        try:
            if self._sass_session is not None:
                self._sass_session.close()
            self._free_inputs()
            self.context.pop()
        except (self.cuda.Error, RuntimeError):
            pass  # a faulted context (or a CUPTI error) cannot be cleaned up; the process ends anyway

    def _function(self, cubin_path: str, entry: str):
        with open(cubin_path, "rb") as f:
            image = f.read()
        key = hashlib.sha256(image).hexdigest()
        module = self.modules.get(key)
        if module is None:
            module = self.cuda.module_from_buffer(image)
            if len(self.modules) >= 16:
                self.modules.pop(next(iter(self.modules)))
            self.modules[key] = module
        return module.get_function(entry)

    def prepare(self, r: Mapping[str, Any]) -> dict[str, Any]:
        """A ``prepare`` request: the spec's inputs made and kept, nothing launched."""
        from kernel_lsp.core.spec import SpecError, parse_spec

        t0 = time.perf_counter()
        try:
            self._inputs(parse_spec(r["spec"], r["base_dir"]), r)
        except (OSError, ValueError, SpecError) as exc:
            return {"error": f"launch spec: {exc}"}
        except self.cuda.Error as exc:
            return {"error": f"inputs of the launch spec: {type(exc).__name__}: {exc}"}
        return {"prepared": True, "wall_s": time.perf_counter() - t0}

    def profile(self, r: Mapping[str, Any], progress=lambda message: None) -> dict[str, Any]:
        """One request; ``progress`` gets ``{"progress": phase}`` messages on the way (the parent's reading of a crash)."""
        from kernel_lsp.core.spec import SpecError, parse_spec

        cuda = self.cuda
        t0 = time.perf_counter()
        steps: dict[str, float] = {}
        try:
            try:
                spec = parse_spec(r["spec"], r["base_dir"])
                launch = spec.resolve(None).original
                args = self._inputs(spec, r)
            except (OSError, ValueError, SpecError) as exc:
                return {"error": f"launch spec: {exc}"}
            try:
                function = self._function(r["cubin_path"], r["entry"])
            except (OSError, cuda.Error) as exc:
                return {"error": f"cannot load kernel '{r['entry']}' from {r['cubin_path']}: {exc}"}
            if launch.dynamic_smem_bytes > 48 * 1024:
                function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.dynamic_smem_bytes)
            steps["inputs_s"] = time.perf_counter() - t0

            def run() -> None:
                function(*args, block=launch.block, grid=launch.grid, shared=launch.dynamic_smem_bytes)
                cuda.Context.synchronize()

            t = time.perf_counter()
            timings = self._timed(function, args, launch, int(r.get("timed", 0)))
            steps["timing_s"] = time.perf_counter() - t
            if r.get("collections"):
                progress({"progress": COUNTERS_PHASE})
            metrics = launch_values(
                arch=r["arch"], grid=launch.grid, block=launch.block, registers=int(function.num_regs),
                static_smem_bytes=int(function.shared_size_bytes), dynamic_smem_bytes=int(launch.dynamic_smem_bytes),
                sm_count=self.sm_count,
            )
            passes = 0
            missing: list[str] = []
            notes: list[str] = []
            for i, wanted in enumerate(r.get("collections", [])):
                try:
                    # A refused stand-in makes the next routing try the next collector: repeat until none is refused.
                    while self._find_refused(route(wanted, range_refused=sorted(self.range_refused)).range):
                        pass
                except self.cr.CuptiError as exc:
                    return self._cupti_failure(exc)
                routing = route(wanted, range_refused=sorted(self.range_refused),
                                sass_available=sorted((self.sass_available or set()) - self.sass_refused))
                missing.extend(m for m in routing.missing if m not in missing)
                if routing.range:
                    t = time.perf_counter()
                    try:
                        res = self.cr.profile_once(self.cupti, self.context_handle, self.chip, list(routing.range), run,
                                                   cache_control=self.cache_control)
                    except self.cr.CuptiError as exc:
                        return self._cupti_failure(exc)
                    passes += res.passes
                    if res.values:
                        metrics.update({routing.aliases.get(k, k): v for k, v in res.values[0].items()})
                    steps[f"range_{i}_s"] = time.perf_counter() - t
                if routing.sass_metrics:
                    t = time.perf_counter()
                    try:
                        sass = self._sass().collect(routing.sass_metrics, run)
                    except self.cr.CuptiError as exc:
                        failure = self._cupti_failure(exc)
                        if failure.get("fault"):
                            return failure
                        # Listed but not collectable here: never offered again; this profile goes without them.
                        self.sass_refused.update(routing.sass_metrics)
                        notes.append(failure["error"])
                        missing.extend(m for m in routing.sass if m not in missing)
                    else:
                        metrics.update(sass_values(sass.totals, routing.sass))
                    steps[f"sass_{i}_s"] = time.perf_counter() - t
            return {"timings_us": timings, "metrics": metrics, "passes": passes, "missing": missing, "notes": notes,
                    "range_refused": sorted(self.range_refused), "sass_refused": sorted(self.sass_refused),
                    "wall_s": time.perf_counter() - t0, "steps_s": steps}
        except cuda.Error as exc:
            # A launch error (illegal address, trap, ...) leaves the context unusable: the worker ends after this reply.
            return {"error": f"the kernel failed on the GPU: {type(exc).__name__}: {exc}", "fault": True}

    def _inputs(self, spec, r: Mapping[str, Any]) -> list:
        """The kernel's arguments on the GPU, made once per spec (and seed, and input files) and reused.

        Making a large spec's inputs costs most of a warm profile (drawing and copying hundreds of MB),
        and every save of the same kernel has the same spec. Arrays the kernel may write (``out``,
        ``inout``) are restored from a pristine device copy before each request, so every request
        starts from the same inputs, as a fresh process would.
        """
        import numpy as np

        from kernel_lsp.core.inputs import file_names, make_inputs
        from kernel_lsp.core.spec import ArrayParam
        from kernel_lsp.services.harness.child import load_files
        from kernel_lsp.services.harness.protocol import build_args

        cuda = self.cuda
        seed = int(r.get("seed", 0))
        stamps = tuple(os.stat(os.path.join(spec.base_dir or ".", n)).st_mtime_ns for n in file_names(spec))
        key = (json.dumps(r["spec"], sort_keys=True), r["base_dir"], seed, stamps)
        cache = self._cached_inputs
        cached = cache.get(key)
        if cached is not None:
            cache.move_to_end(key)
            for work, pristine, nbytes in cached[1]:
                cuda.memcpy_dtod(work, pristine, nbytes)
            return cached[0]
        host_args = build_args(spec, make_inputs(spec, seed, None, load_files(spec)), None)
        args, restores, buffers = [], [], []
        device_bytes = 0
        try:
            for p, a in zip(spec.params, host_args):
                if not isinstance(a, np.ndarray):
                    args.append(a)
                    continue
                work = cuda.mem_alloc(max(a.nbytes, 1))
                buffers.append(work)
                device_bytes += a.nbytes
                if a.nbytes:
                    cuda.memcpy_htod(work, a)
                if a.nbytes and isinstance(p, ArrayParam) and p.role != "in":
                    pristine = cuda.mem_alloc(a.nbytes)
                    buffers.append(pristine)
                    device_bytes += a.nbytes
                    cuda.memcpy_dtod(pristine, work, a.nbytes)
                    restores.append((work, pristine, a.nbytes))
                args.append(work)
        except Exception:
            _free(cuda, buffers)
            raise
        cache[key] = (args, restores, buffers, device_bytes)
        self._trim_inputs()
        return args

    def _trim_inputs(self) -> None:
        """Free the oldest specs' inputs beyond :data:`INPUT_SPECS_KEPT` or :data:`INPUT_BYTES_KEPT` (never the newest)."""
        cache = self._cached_inputs
        while len(cache) > 1 and (len(cache) > INPUT_SPECS_KEPT
                                  or sum(entry[3] for entry in cache.values()) > INPUT_BYTES_KEPT):
            _, entry = cache.popitem(last=False)
            _free(self.cuda, entry[2])

    def _free_inputs(self) -> None:
        cache, self._cached_inputs = self._cached_inputs, OrderedDict()
        for entry in cache.values():
            _free(self.cuda, entry[2])

    def _find_refused(self, names: Sequence[str]) -> bool:
        """Add to :attr:`range_refused` the names the host refuses (a config image per name only when the set
        fails); True when it found any."""
        if not names:
            return False
        try:
            self._config_image(names)
            return False
        except self.cr.CuptiError as exc:
            if exc.code not in self.cr.UNKNOWN_METRIC_CODES:
                raise
        found = False
        for name in names:
            try:
                self._config_image([name])
            except self.cr.CuptiError as exc:
                if exc.code not in self.cr.UNKNOWN_METRIC_CODES:
                    raise
                self.range_refused.add(name)
                found = True
        return found

    def _config_image(self, names: Sequence[str]) -> None:
        host = self.cr.Host(self.cupti, self.chip)
        try:
            host.config_image(list(names))
        finally:
            host.close()

    def _cupti_failure(self, exc: Exception) -> dict[str, Any]:
        # A CUPTI error inside a collection may also come from a faulting kernel: check the context.
        try:
            self.cuda.Context.synchronize()
        except self.cuda.Error as fault:
            return {"error": f"the kernel failed on the GPU: {type(fault).__name__}: {fault}", "fault": True}
        return {"error": f"CUPTI: {exc}", "cupti": True}

    def _timed(self, function, args, launch, count: int) -> list[float]:
        cuda = self.cuda
        function(*args, block=launch.block, grid=launch.grid, shared=launch.dynamic_smem_bytes)
        cuda.Context.synchronize()
        out = []
        start, end = cuda.Event(), cuda.Event()
        for _ in range(count):
            start.record()
            function(*args, block=launch.block, grid=launch.grid, shared=launch.dynamic_smem_bytes)
            end.record()
            end.synchronize()
            out.append(1000.0 * start.time_till(end))
        return out


def _current_context() -> int:
    """The current CUcontext as an address (CUPTI wants the driver's handle; pycuda does not expose it portably)."""
    import ctypes

    libcuda = ctypes.CDLL("libcuda.so.1")
    handle = ctypes.c_void_p()
    code = libcuda.cuCtxGetCurrent(ctypes.byref(handle))
    if code != 0 or not handle.value:
        raise RuntimeError(f"cuCtxGetCurrent failed (CUresult {code})")
    return int(handle.value)
