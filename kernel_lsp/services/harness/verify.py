"""``verify``: the gate every rewrite passes before it reaches a user's file.

Order (cheapest first, GPU last):
  1. compile both files to cubins (nvcc, in parallel)          -> ``compile_error``
  2. kernel name and parameter list vs the original and spec   -> ``signature_changed``
  3. static pre-check (:mod:`kernel_lsp.core.static_check`)     -> ``static_check``
  4. child process: correctness over seeds (same buffers, new contents), other
     addresses, variants, launch history and launch counts, red zones after every
     candidate launch; then interleaved timing on unchanged and on redrawn inputs,
     timed launches checked; then sizes the spec does not name (:mod:`.protocol`,
     :mod:`.child`, :mod:`.sizes`)                             -> ``launch_error``, ``timeout``,
                                                                  ``mismatch``, ``nan_or_inf``,
                                                                  ``input_modified``, ``nondeterministic``,
                                                                  ``out_of_bounds``, ``history_dependent``,
                                                                  ``timed_mismatch``, ``size_dependent``
  5. optional compute-sanitizer on the candidate at the smallest size -> ``sanitizer``
  6. bootstrap CI on median(original)/median(candidate) for each series; rejected
     when the redrawn series' speedup collapsed (:func:`kernel_lsp.core.stats.collapsed`),
     accepted iff both lower bounds >= ``min_speedup``          -> ``speedup_collapse``,
                                                                  ``ok`` / ``not_faster``

The original's cubin is compiled once per process for the same source and
flags (a search verifies many candidates against one original), the harness's
own kernels (:mod:`.device_kernels`) once per machine (a disk cache). A hung
candidate launch is abandoned by the child after ``max(1 s, 50 x the
original's time)``; a watchdog here kills the child when even that fails, so
the overall ``timeout_s`` is only the last resort.

A bad spec (or a spec that does not describe the original) raises
:class:`~kernel_lsp.core.spec.SpecError`; no usable GPU raises
:class:`GpuUnavailable`; every other failure is a :class:`Verdict`.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import kernel_lsp
from kernel_lsp.core import stats
from kernel_lsp.core.inputs import NUMPY_DTYPES
from kernel_lsp.core.spec import Spec, SpecError
from kernel_lsp.core.static_check import check, check_signature
from kernel_lsp.services.limits import spec_memory_problem
from kernel_lsp.core.verdict import GpuInfo, KernelTiming, Reason, Verdict
from kernel_lsp.services.harness import device_kernels
from kernel_lsp.services.harness.compile import CompileResult, compile_cubin, device_globals, find_entry
from kernel_lsp.services.harness.protocol import CANDIDATE, ORIGINAL, Limits, TimingOptions
from kernel_lsp.services.proc import ToolMissing, run, which
from kernel_lsp.services.toolchain import BuildFlags

#: Where the default seeds start; the seeds used are always reported in the verdict.
BASE_SEED = 1
_SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck")
_SANITIZER_ERROR_EXIT = 86
#: How long past a launch's deadline the watchdog waits for the child to abandon it itself.
WATCHDOG_GRACE_S = 2.0
#: Compiled originals kept per process (a search verifies many candidates against one original).
_CUBIN_CACHE_ENTRIES = 16


class GpuUnavailable(RuntimeError):
    """No CUDA GPU (or no pycuda) where the harness runs: nothing was measured."""


class VerifyCancelled(RuntimeError):
    """The caller's cancel event was set; the child was killed."""


@dataclass(frozen=True)
class VerifyOptions:
    seeds: int = 3
    """Random input seeds for correctness (each gives fresh inputs)."""
    base_seed: int = BASE_SEED
    min_speedup: float = 1.05
    """Accept only when the speedup interval's lower bound is at least this."""
    sanitize: bool = False
    """Run compute-sanitizer memcheck, racecheck and initcheck on the candidate at the smallest size."""
    arch: str | None = None
    """``sm_90``; None: detected with nvidia-smi (``sm_90`` when that fails). Replaces ``build``'s architecture:
    the verification runs on the GPU that is there, whatever the editor's occupancy estimate targets."""
    build: BuildFlags = field(default_factory=BuildFlags)
    """nvcc and its flags for both files: the session's :func:`~kernel_lsp.services.toolchain.build_flags` of the
    original's path, the same ones its diagnostics compile with (compile database, include paths, extraFlags)."""
    timeout_s: float = 120.0
    """Longest the child (correctness + timing) may run before it is killed: reason ``timeout``.
    The last resort: a hung candidate launch is stopped after ``limits`` allow."""
    limits: Limits = field(default_factory=Limits)
    """How long one candidate launch may run: max(floor, factor x the original's time on that input)."""
    timing: TimingOptions = field(default_factory=TimingOptions)
    skip_timing: bool = False
    """Correctness only (the verdict is then ``not_faster`` at best)."""
    ci_level: float = 0.95
    bootstrap_seed: int = 0
    python: str = sys.executable
    sanitizer: str = "compute-sanitizer"
    sanitizer_timeout_s: float = 300.0


@functools.lru_cache(maxsize=4)
def detect_arch(default: str = "sm_90") -> str:
    """``sm_XY`` of GPU 0 from nvidia-smi, or ``default`` when it cannot be asked (asked once per process)."""
    try:
        result = run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", "-i", "0"], timeout_s=15)
    except ToolMissing:
        return default
    match = re.match(r"\s*(\d+)\.(\d+)", result.stdout)
    return f"sm_{match.group(1)}{match.group(2)}" if result.ok and match else default


def cuda_tool(name: str) -> str:
    """``name`` itself when it is on PATH (or a path); else the CUDA toolkit's copy when one exists.

    GPU machines often have the toolkit in /usr/local/cuda/bin without it on PATH.
    """
    if which(name) is not None:
        return name
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        candidate = os.path.join(home, "bin", name) if home else None
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return name


def _child_env() -> dict[str, str]:
    # The child imports kernel_lsp from the same tree as the parent, installed or not.
    root = os.path.dirname(os.path.dirname(os.path.abspath(kernel_lsp.__file__)))
    return {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class _Rejected(Exception):
    """Internal: a stage decided the verdict; carries it out of the stage."""

    def __init__(self, reason: Reason, errors, **fields):
        super().__init__(reason.value)
        self.reason, self.errors, self.fields = reason, tuple(errors), fields


def verify(original_source: str, candidate_source: str, spec: Spec, options: VerifyOptions | None = None, cancel: threading.Event | None = None) -> Verdict:
    """Decide whether ``candidate_source`` may replace ``original_source`` (see the module docstring)."""
    options = options or VerifyOptions()
    start = time.monotonic()
    seeds = tuple(options.base_seed + i for i in range(max(options.seeds, 1)))

    def verdict(reason: Reason, errors=(), **fields) -> Verdict:
        return Verdict(accepted=reason is Reason.OK, reason=reason, errors=tuple(errors), seeds=seeds, min_speedup=options.min_speedup, wall_s=time.monotonic() - start, **fields)

    signature = check_signature(original_source, candidate_source, spec)
    if signature.spec_errors:
        raise SpecError(signature.spec_errors)
    # Before anything is allocated: a spec asking for more memory than there is is refused, not tried.
    memory = spec_memory_problem(spec)
    if memory:
        raise SpecError([memory])
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-verify-") as workdir:
        try:
            return _verify_in(workdir, original_source, candidate_source, spec, options, cancel, seeds, list(signature.warnings), signature.changed, verdict)
        except _Rejected as rejected:
            return verdict(rejected.reason, rejected.errors, **rejected.fields)


def _verify_in(workdir, original_source, candidate_source, spec, options, cancel, seeds, warnings, signature_changes, verdict) -> Verdict:
    original_build, candidate_build, helper_build, arch = _compile_both(workdir, original_source, candidate_source, options, cancel)
    if not original_build.ok:
        raise _Rejected(Reason.COMPILE_ERROR, [f"the original does not compile for {arch}:\n{_tail(original_build.log)}"])
    if not candidate_build.ok:
        raise _Rejected(Reason.COMPILE_ERROR, [f"the candidate does not compile for {arch}:\n{_tail(candidate_build.log)}"])
    if signature_changes:
        raise _Rejected(Reason.SIGNATURE_CHANGED, signature_changes, warnings=tuple(warnings))
    if not helper_build.ok:
        raise GpuUnavailable(f"the harness's own kernels do not compile for {arch}:\n{_tail(helper_build.log)}")

    report = check(original_source, candidate_source, spec)
    findings = report.errors + report.warnings
    warnings += [f"line {w.line}: {w.rule}: {w.message}" for w in report.warnings]
    context = dict(warnings=tuple(warnings), static_findings=findings)
    if report.errors:
        raise _Rejected(Reason.STATIC_CHECK, [f"line {e.line}: {e.rule}: {e.message}" for e in report.errors], **context)

    original_entry, problem = find_entry(original_build.entries, spec.kernel)
    if original_entry is None:
        raise SpecError([f"kernel: {problem} (original)"])
    candidate_entry, problem = find_entry(candidate_build.entries, spec.kernel)
    if candidate_entry is None:
        raise _Rejected(Reason.SIGNATURE_CHANGED, [f"candidate: {problem}"], **context)

    job = {
        "spec": spec.to_json(),
        "base_dir": spec.base_dir,
        "kernels": {ORIGINAL: [original_build.cubin_path, original_entry], CANDIDATE: [candidate_build.cubin_path, candidate_entry]},
        "helpers": helper_build.cubin_path,
        "state": {ORIGINAL: _state_symbols(original_build.cubin_path), CANDIDATE: _state_symbols(candidate_build.cubin_path)},
        # The original's own launches may use the whole budget; the candidate's are bounded by its times.
        "limits": {**vars(options.limits), "original_s": options.timeout_s},
        "seeds": list(seeds),
        "timing": vars(options.timing),
        "skip_timing": options.skip_timing,
    }
    outcome, gpu = _run_child(workdir, job, options, cancel, context)
    warnings += outcome["warnings"]
    common = dict(warnings=tuple(warnings), static_findings=findings, gpu=gpu, max_abs_error=outcome["max_abs_error"], max_rel_error=outcome["max_rel_error"],
                  timed_checks=outcome.get("timed_checks") or None, sizes_tried=tuple(outcome.get("sizes_tried", ())),
                  fixed_sizes={name: int(spec.values()[name]) for name in spec.fixed})
    if outcome["reason"] is not None:
        raise _Rejected(Reason(outcome["reason"]), outcome["errors"], **common)
    if options.sanitize:
        text = _sanitize(spec, workdir, candidate_build.cubin_path, candidate_entry, options, cancel)
        if text:
            raise _Rejected(Reason.SANITIZER, ["compute-sanitizer reported errors on the candidate"], sanitizer=text, **common)
    return _speed_verdict(outcome["samples_ms"], options, verdict, common)


def _compile_key(source: str, flags: BuildFlags) -> str:
    text = json.dumps([source, flags.nvcc, list(flags.arch_flags), list(flags.flags)])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_cubin_cache: OrderedDict[str, CompileResult] = OrderedDict()
_cache_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _process_cache_dir() -> str:
    path = tempfile.mkdtemp(prefix="kernel-lsp-cubins-")
    atexit.register(shutil.rmtree, path, True)
    return path


def _compile_original(workdir: str, source: str, flags: BuildFlags, cancel: threading.Event | None) -> CompileResult:
    """The original's cubin, compiled once per process for the same source, arch and flags.

    Kept in memory only: headers in ``include_dirs`` may change between processes, and a
    stale original would be a wrong reference.
    """
    key = _compile_key(source, flags)
    with _cache_lock:
        cached = _cubin_cache.get(key)
        if cached is not None and cached.cubin_path and os.path.exists(cached.cubin_path):
            _cubin_cache.move_to_end(key)
            return cached
    built = compile_cubin(source, workdir, ORIGINAL, flags, cancel=cancel)
    if built.ok and built.cubin_path:
        # Its own folder keeps the file name (original.cubin) that the GPU child reports.
        kept = os.path.join(_process_cache_dir(), key, f"{ORIGINAL}.cubin")
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        shutil.copyfile(built.cubin_path, kept)
        with _cache_lock:
            _cubin_cache[key] = dataclasses.replace(built, cubin_path=kept)
            while len(_cubin_cache) > _CUBIN_CACHE_ENTRIES:
                _, old = _cubin_cache.popitem(last=False)
                if old.cubin_path:
                    shutil.rmtree(os.path.dirname(old.cubin_path), ignore_errors=True)
    return built


def _cache_home() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kernel-lsp", "harness")


def helper_cubin(workdir: str, arch: str, options: VerifyOptions, cancel: threading.Event | None = None) -> CompileResult:
    """The harness's own kernels for ``arch``, from the disk cache when compiled before (keyed by their source)."""
    nvcc = cuda_tool(options.build.nvcc)
    digest = hashlib.sha256(json.dumps([device_kernels.SOURCE, arch, nvcc]).encode("utf-8")).hexdigest()[:16]
    for folder in (_cache_home(), _process_cache_dir()):
        path = os.path.join(folder, f"helpers-{digest}-{arch}.cubin")
        if os.path.exists(path):
            return CompileResult(messages=(), cubin_path=path, returncode=0)
    flags = BuildFlags(nvcc=nvcc, timeout_s=options.build.timeout_s).for_arch(arch)
    built = compile_cubin(device_kernels.SOURCE, workdir, "harness_helpers", flags, cancel=cancel)
    if not built.ok or not built.cubin_path:
        return built
    for folder in (_cache_home(), _process_cache_dir()):
        try:
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"helpers-{digest}-{arch}.cubin")
            # Copy, then rename: a concurrent verification never sees half a cubin.
            shutil.copyfile(built.cubin_path, path + f".{os.getpid()}.tmp")
            os.replace(path + f".{os.getpid()}.tmp", path)
            return dataclasses.replace(built, cubin_path=path)
        except OSError:
            continue
    return built


def _compile_both(workdir: str, original_source: str, candidate_source: str, options: VerifyOptions, cancel: threading.Event | None) -> tuple[CompileResult, CompileResult, CompileResult, str]:
    arch = options.arch or detect_arch()
    flags = dataclasses.replace(options.build.for_arch(arch), nvcc=cuda_tool(options.build.nvcc))
    with ThreadPoolExecutor(max_workers=3) as pool:
        original = pool.submit(_compile_original, workdir, original_source, flags, cancel)
        candidate = pool.submit(compile_cubin, candidate_source, workdir, CANDIDATE, flags, cancel=cancel)
        helpers = pool.submit(helper_cubin, workdir, arch, options, cancel)
        original_build, candidate_build, helper_build = original.result(), candidate.result(), helpers.result()
    if cancel is not None and cancel.is_set():
        raise VerifyCancelled("verification cancelled while compiling")
    return original_build, candidate_build, helper_build, arch


def _state_symbols(cubin_path: str) -> list[tuple[str, int]]:
    with open(cubin_path, "rb") as f:
        return list(device_globals(f.read()))


def _run_child(workdir: str, job: dict, options: VerifyOptions, cancel: threading.Event | None, context: dict) -> tuple[dict, GpuInfo | None]:
    """Run correctness and timing in a child process; its outcome dict and the GPU it saw."""
    job_path, result_path = os.path.join(workdir, "job.json"), os.path.join(workdir, "result.json")
    watch_path = job["watch_path"] = os.path.join(workdir, "watch")
    with open(watch_path, "wb") as f:
        f.write(struct.pack("<d", 0.0))
    with open(job_path, "w", encoding="utf-8") as f:
        json.dump(job, f)
    stop, kill = threading.Event(), threading.Event()
    fired: dict[str, float] = {}
    watcher = threading.Thread(target=_watch, args=(watch_path, stop, kill, cancel, fired), daemon=True)
    watcher.start()
    try:
        child = run([options.python, "-m", "kernel_lsp.services.harness.child", job_path, result_path], timeout_s=options.timeout_s, cancel=kill, env=_child_env())
    finally:
        stop.set()
        watcher.join()
    if child.cancelled and "deadline" not in fired:
        raise VerifyCancelled("verification cancelled")
    if child.timed_out:
        raise _Rejected(Reason.TIMEOUT, [f"the GPU child did not finish in {options.timeout_s:.0f} s (a hung kernel?); it was killed"], **context)
    if not os.path.exists(result_path):
        if "deadline" in fired:
            raise _Rejected(Reason.TIMEOUT, [f"a candidate launch ran {WATCHDOG_GRACE_S:.0f} s past its limit and the GPU child did not stop it; it was killed"], **context)
        raise _Rejected(Reason.LAUNCH_ERROR, [f"the GPU child died (exit {child.returncode}) without a result:\n{_tail(child.stderr)}"], **context)
    with open(result_path, encoding="utf-8") as f:
        result = json.load(f)
    if result["status"] == "no_gpu":
        raise GpuUnavailable(result["message"])
    if result["status"] != "done":
        raise _Rejected(Reason.LAUNCH_ERROR, [f"the GPU child failed: {result.get('message', '')}"], **context)
    return result["outcome"], _gpu_info(result.get("gpu"))


def _watch(path: str, stop: threading.Event, kill: threading.Event, cancel: threading.Event | None, fired: dict) -> None:
    """Set ``kill`` when the caller cancels, or when the launch deadline the child wrote into
    ``path`` passed more than :data:`WATCHDOG_GRACE_S` ago (the child failed to abandon it)."""
    while not stop.wait(0.05):
        if cancel is not None and cancel.is_set():
            kill.set()
            return
        try:
            with open(path, "rb") as f:
                deadline = struct.unpack("<d", f.read(8))[0]
        except (OSError, struct.error):
            continue
        if deadline > 0 and time.time() > deadline + WATCHDOG_GRACE_S:
            fired["deadline"] = deadline
            kill.set()
            return


def _speed_verdict(samples: dict, options: VerifyOptions, verdict, common: dict) -> Verdict:
    """Bootstrap intervals on median(original)/median(candidate) for unchanged and for redrawn inputs.

    Rejected when the redrawn series collapsed against the unchanged one (``speedup_collapse``); else accepted
    iff the lower bound of every series that ran is at least ``min_speedup``. The verdict's speedup is the
    series with the lower lower bound: the title a user trusts claims no more than the harder series showed.
    """
    if not samples or not samples.get(ORIGINAL) or not samples.get(CANDIDATE):
        return verdict(Reason.NOT_FASTER, ["timing was skipped; correctness passed"], **common)
    series = {"unchanged": (ORIGINAL, CANDIDATE), "redrawn": (f"{ORIGINAL}_redrawn", f"{CANDIDATE}_redrawn")}
    timings, cis = {}, {}
    for name, (original, candidate) in series.items():
        if not samples.get(original) or not samples.get(candidate):
            continue
        for series_name in (original, candidate):
            timings[series_name] = KernelTiming(**vars(stats.distribution(samples[series_name])))
        cis[name] = stats.ratio_of_medians_ci(samples[original], samples[candidate], seed=options.bootstrap_seed, level=options.ci_level)
    shown = min(cis.values(), key=lambda ci: ci.low)
    timing = dict(timings=timings, speedup=shown.ratio, speedup_ci_low=shown.low, speedup_ci_high=shown.high, ci_level=shown.level,
                  **{f"{name}_speedup": (ci.ratio, ci.low, ci.high) for name, ci in cis.items()})
    unchanged, redrawn = cis["unchanged"], cis.get("redrawn")
    if redrawn is not None and unchanged.low >= options.min_speedup and stats.collapsed(unchanged, redrawn):
        message = (f"the speedup collapses when the inputs change: {unchanged.ratio:.3f}x [{unchanged.low:.3f}, {unchanged.high:.3f}] on unchanged "
                   f"inputs, {redrawn.ratio:.3f}x [{redrawn.low:.3f}, {redrawn.high:.3f}] on inputs redrawn between trials (more than "
                   f"{stats.COLLAPSE_MARGIN:g}x apart): the candidate is fast only when launched again on what it saw before")
        return verdict(Reason.SPEEDUP_COLLAPSE, [message], **timing, **common)
    if shown.low >= options.min_speedup:
        return verdict(Reason.OK, **timing, **common)
    which = "" if len(cis) == 1 else (" on unchanged inputs" if shown is unchanged else " on redrawn inputs")
    message = f"speedup{which} {shown.ratio:.3f}x, {shown.level:.0%} interval [{shown.low:.3f}, {shown.high:.3f}]: the lower bound is below {options.min_speedup}"
    return verdict(Reason.NOT_FASTER, [message], **timing, **common)


def _gpu_info(data: dict | None) -> GpuInfo | None:
    if not data:
        return None
    fields = ("name", "driver", "compute_capability", "sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz", "l2_bytes")
    return GpuInfo(**{k: data.get(k) for k in fields})


def smallest_variant(spec: Spec) -> int | None:
    """The variant with the fewest array bytes (None: the main size is the smallest)."""
    def total(variant: int | None) -> int:
        sizes = spec.resolve(variant).sizes
        return sum(sizes[a.name] * NUMPY_DTYPES[a.type].itemsize for a in spec.arrays)

    return min([None, *range(len(spec.variants))], key=lambda v: (total(v), -1 if v is None else v))


def _sanitize(spec: Spec, workdir: str, cubin: str, entry: str, options: VerifyOptions, cancel: threading.Event | None) -> str | None:
    """compute-sanitizer's report when any tool finds an error in the candidate, else None."""
    spec_path = os.path.join(workdir, "sanitize_spec.json")
    with open(spec_path, "w", encoding="utf-8") as f:
        json.dump(spec.to_json(), f)
    variant = smallest_variant(spec)
    launch_argv = [options.python, "-m", "kernel_lsp.services.harness.launch", "--cubin", cubin, "--kernel", entry, "--spec", spec_path, "--candidate-launch", "--seed", str(options.base_seed)]
    if spec.base_dir:
        launch_argv += ["--base-dir", spec.base_dir]
    if variant is not None:
        launch_argv += ["--variant", str(variant)]
    reports = []
    for tool in _SANITIZER_TOOLS:
        argv = [cuda_tool(options.sanitizer), "--tool", tool, "--error-exitcode", str(_SANITIZER_ERROR_EXIT), *launch_argv]
        if tool == "initcheck":
            argv.append("--no-init-out")
        try:
            result = run(argv, timeout_s=options.sanitizer_timeout_s, cancel=cancel, env=_child_env())
        except ToolMissing as exc:
            raise GpuUnavailable(f"--sanitize needs compute-sanitizer: {exc}") from exc
        if result.cancelled:
            raise VerifyCancelled("verification cancelled during compute-sanitizer")
        output = (result.stdout + "\n" + result.stderr).strip()
        if result.timed_out:
            reports.append(f"== {tool}: did not finish in {options.sanitizer_timeout_s:.0f} s")
        elif result.returncode == 3:
            raise GpuUnavailable(_tail(output, 5))
        elif result.returncode != 0:
            reports.append(f"== {tool} (exit {result.returncode}):\n{_tail(output, 60)}")
    return "\n".join(reports) or None
