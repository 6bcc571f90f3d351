"""Profile one kernel, collecting what the profiling tree asks for: in the GPU worker through CUPTI, or with ncu.

With a :class:`~kernel_lsp.services.gpu_worker.GpuWorker` (the server keeps one), a
tree-chosen profile of a kernel with a launch spec runs in that long-lived process:
the compiled cubin is loaded there, the spec's inputs made, the kernel timed with CUDA
events and its counters collected through CUPTI (no process start-up, which is most of
an ncu run's cost). ncu stays for ``full=True`` (``kernel-lsp profile --full``), for
per-line counters (``profileLineCounters``: SourceCounters and ncu's rule advice), for
program mode, for trees that name whole sections, and as the fallback whenever the
worker cannot give a metric the tree asks for or CUPTI is refused (the reason is logged).
A kernel that faults or hangs in the worker is a failure message; the worker restarts.

Two ways to run the kernel under ``ncu`` (always ``--clock-control none``):

* **launch spec** (harness mode): the file is compiled to a cubin with
  ``-lineinfo`` and ``python -m kernel_lsp.services.harness.launch`` launches the
  kernel from its spec: a warm-up and a few launches timed with CUDA events
  (:func:`timed_launches`: the timing spread, at the cost of plain launches), then the one
  launch ncu profiles (``--launch-skip``, filtered on the mangled entry name);
  ncu ends the launcher once that launch is profiled (``--kill yes``);
* **program** (``Settings.profile_program``/``profile_args``): the user's own
  binary, filtered with ``-k`` and ``--launch-count 1``; it runs to its end.

The tree (:mod:`kernel_lsp.core.profiling_tree`) decides what to collect: when
the previous profile of the kernel is known, its measurements feed the tree and
one ncu run collects the first pass together with the chosen leaf; otherwise
the tree's ``unmeasured`` mode decides (one run of the fallback leaf, or a first
pass, a walk on its results, and a second run). A run of metric groups alone
applies no rules and is read from ncu's CSV output; a run with a section writes
a report that is read afterwards. ``full=True`` collects ``--set full``.

Every failure (ncu missing, no permission to read counters, the program
crashing or hanging, a report that cannot be read) becomes a message in the
result, with the last good profile of the kernel marked stale. Results are
cached by content hash and settings. One GPU job runs at a time (a lock).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from kernel_lsp.config import Settings
from kernel_lsp.core import profile as P
from kernel_lsp.core import profiling_tree as T
from kernel_lsp.core.classify import Bottleneck, classify
from kernel_lsp.core.index import Function, build_index
from kernel_lsp.core.spec import inline_spec_for
from kernel_lsp.core.profile import KernelProfile, Regression, profile_from_json, profile_to_json, regression
from kernel_lsp.services import gpu_worker, ncu_reader, proc
from kernel_lsp.core.nvcc_output import ResourceUsage
from kernel_lsp.services.harness.compile import find_entry
from kernel_lsp.services.toolchain import SCRATCH_SOURCE, BuildFlags, build_flags, compile_in
from kernel_lsp.services.harness.launch import launches_before

log = logging.getLogger(__name__)

#: One GPU job at a time, whoever asks (server, CLI in-process, benchmark).
GPU_LOCK = threading.Lock()

#: Launches timed with CUDA events before the profiled one (harness mode): their spread is the noise
#: the regression warning allows for.
TIMED_LAUNCHES = 10
#: Seconds of kernel time the timed launches may take together, once the kernel's duration is known.
TIMING_BUDGET_S = 1.0
#: Timed launches of a kernel's first profile (its duration is not known yet).
FIRST_TIMED_LAUNCHES = 3


def timed_launches(previous_duration_us: float | None) -> int:
    """How many event-timed launches precede the profiled one.

    As many as fit :data:`TIMING_BUDGET_S` by the previous profile's duration,
    between 2 and :data:`TIMED_LAUNCHES`, so that a kernel that runs for seconds
    does not run ten more times; a first profile makes :data:`FIRST_TIMED_LAUNCHES`.
    """
    if previous_duration_us is None or previous_duration_us <= 0:
        return FIRST_TIMED_LAUNCHES
    return max(2, min(TIMED_LAUNCHES, int(TIMING_BUDGET_S * 1e6 / previous_duration_us)))
_PASSES = re.compile(r"- (\d+) passes?")

ToolRunner = Callable[..., proc.ProcResult]


@dataclass(frozen=True)
class Target:
    """What to profile."""

    source_path: str
    source_text: str
    kernel: str
    spec_path: str | None = None
    """Launch spec v1 file (harness mode)."""
    spec_data: dict | None = None
    """An in-source spec's JSON object, used when there is no ``spec_path``."""
    program: str | None = None
    """The user's binary (program mode; used when no spec is given)."""
    program_args: tuple[str, ...] = ()
    cwd: str | None = None


@dataclass(frozen=True)
class ProfileResult:
    profile: KernelProfile | None
    """The new profile, or the last good one marked stale, or None."""
    bottleneck: Bottleneck | None
    plan: T.Plan | None
    message: str | None = None
    """Why profiling failed or was skipped, for the user; None on success."""
    cached: bool = False
    regression: Regression | None = None
    """Set when this profile is slower than the previous one beyond the noise."""

    @property
    def ok(self) -> bool:
        return self.message is None and self.profile is not None and not self.profile.stale


def sidecar_path(source_path: str, kernel: str) -> str:
    """Where a kernel's launch spec lives beside its file: ``<file>.<kernel>.spec.json``."""
    return f"{source_path}.{kernel}.spec.json"


def find_spec(source_path: str, source_text: str, kernel: str) -> tuple[str | None, dict | None, str | None]:
    """(sidecar path, in-source spec object, problem) for ``kernel``; the sidecar wins when both exist."""
    sidecar = sidecar_path(source_path, kernel)
    if os.path.isfile(sidecar):
        return sidecar, None, None
    found = inline_spec_for(source_text, kernel)
    if found is not None:
        return None, found.data, found.error  # type: ignore[return-value]
    return None, None, None


def load_tree(settings: Settings) -> T.Tree:
    """The tree named in settings, or the shipped default. Raises TreeError/OSError."""
    path = settings.profile_tree or default_tree_path()
    with open(path, encoding="utf-8") as f:
        return T.parse_tree(f.read())


def default_tree_path() -> str:
    """The shipped default: the tree learned from optimization feedback (``kernel-lsp tree learn``)."""
    return os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "profiling_tree.json")


def hand_tree_path() -> str:
    """The hand-written tree: where tree learning starts and what its evaluation compares against."""
    return os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "profiling_tree_hand.json")


def default_costs_path() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "ncu_sections.json")


def load_cupti_costs(path: str | None = None) -> T.CostModel | None:
    """The cost of tree profiles in the GPU worker (``data/cupti_costs.json``): the groups' passes and metrics
    of the ncu table, CUPTI's seconds per profile and per pass, and ``--set full``'s measured seconds."""
    ncu = load_costs()
    try:
        with open(path or os.path.join(os.path.dirname(default_costs_path()), "cupti_costs.json"), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    if ncu is None:
        return None
    return replace(ncu, run_s=float(data["run_s"]), pass_s=float(data["pass_s"]), section_run_s=0.0,
                   full_s=float(data["full_s"]),
                   sections={k: replace(v, extra_s=0.0) for k, v in ncu.sections.items()})


def load_costs(path: str | None = None) -> T.CostModel | None:
    """The recorded section costs (``data/ncu_sections.json``), or None when absent."""
    try:
        with open(path or default_costs_path(), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    return T.cost_model_from_json(data)


def static_facts(function: Function | None, source: str = "", resources: ResourceUsage | None = None,
                 constants: dict[str, str] | None = None) -> dict[str, float]:
    """``static.*`` facts from the kernel's source and ``ptxas.*`` facts from its compile's resource usage."""
    facts: dict[str, float] = {}
    if function is not None:
        facts.update(T.static_facts(function, source, constants))
    if resources is not None:
        if resources.registers_per_thread is not None:
            facts["ptxas.registers"] = float(resources.registers_per_thread)
            facts["ptxas.smem_bytes"] = float(resources.shared_bytes_static or 0)
        if resources.spill_store_bytes is not None and resources.spill_load_bytes is not None:
            facts["ptxas.spill_bytes"] = float(resources.spill_store_bytes + resources.spill_load_bytes)
    return facts


def explain_failure(result: proc.ProcResult, kernel: str, timeout_s: float) -> str | None:
    """A message for the user when an ncu run failed; None when it worked."""
    text = result.stdout + "\n" + result.stderr
    if result.cancelled:
        return "profiling was cancelled"
    if result.timed_out:
        return f"the program did not finish under ncu within {timeout_s:.0f} s (profileTimeoutS); it may hang"
    if "ERR_NVGPUCTRPERM" in text:
        return (
            "no permission to read GPU performance counters (ERR_NVGPUCTRPERM): run as an administrator, or allow "
            "profiling for all users (NVreg_RestrictProfilingToAdminUsers=0); see "
            "https://developer.nvidia.com/ERR_NVGPUCTRPERM"
        )
    if re.search(r"No kernels were profiled", text):
        return f"ncu profiled no kernel named '{kernel}': check that the program launches it"
    errors = [line for line in text.splitlines() if line.startswith("==ERROR==")]
    if result.returncode not in (0, None) or errors:
        detail = "; ".join(e.removeprefix("==ERROR==").strip() for e in errors[:3])
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        return f"the program failed under ncu (exit {result.returncode}): {detail or ' | '.join(tail)}"
    return None


def passes_of(stdout: str) -> int | None:
    found = [int(n) for n in _PASSES.findall(stdout)]
    return sum(found) if found else None


def ncu_argv(
    settings: Settings,
    *,
    sections: tuple[str, ...],
    metrics: tuple[str, ...] = (),
    full: bool = False,
    kernel_filter: tuple[str, ...],
    launch_skip: int = 0,
    kill: bool = False,
    report_base: str,
    target_argv: list[str],
) -> list[str]:
    """One ncu run profiling one launch.

    ``sections`` and ``metrics`` are what to collect (the tree's items, split by
    :func:`T.split_items`). With no section and not ``full``, the run applies no
    rules (rules belong to sections) and prints the raw page as CSV instead of
    writing ``report_base``.ncu-rep. ``kill``: end the target once its launch is
    profiled (only for the profiler's own launcher: a user's program is never cut short).
    """
    argv = [settings.ncu_path, "--clock-control", "none"]
    if full:
        argv += ["--set", "full", "--import-source", "yes"]
    else:
        for section in sections:
            argv += ["--section", section]
        if "SourceCounters" in sections:
            argv += ["--import-source", "yes"]
    if metrics:
        argv += ["--metrics", ",".join(metrics)]
    argv += list(kernel_filter)
    if launch_skip:
        argv += ["--launch-skip", str(launch_skip)]
    argv += ["--launch-count", "1"]
    if kill:
        argv += ["--kill", "yes"]
    if full or sections:
        argv += ["-f", "-o", report_base]
    else:
        argv += ["--apply-rules", "no", "--csv", "--page", "raw", "--print-units", "base"]
    return argv + target_argv


class ProfileStore:
    """Profiles on disk: by cache key, and the last good one per (file, kernel)."""

    def __init__(self, folder: str):
        self.folder = folder

    def _path(self, kind: str, key: str) -> str:
        return os.path.join(self.folder, kind, hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def get(self, kind: str, key: str) -> KernelProfile | None:
        try:
            with open(self._path(kind, key), encoding="utf-8") as f:
                return profile_from_json(json.load(f))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, kind: str, key: str, profile: KernelProfile) -> None:
        path = self._path(kind, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(profile_to_json(profile), f)
        os.replace(tmp, path)

    def last_good(self, source_path: str, kernel: str) -> KernelProfile | None:
        return self.get("last", f"{os.path.abspath(source_path)}::{kernel}")

    def set_last_good(self, source_path: str, kernel: str, profile: KernelProfile) -> None:
        self.put("last", f"{os.path.abspath(source_path)}::{kernel}", profile)


class Profiler:
    def __init__(
        self,
        settings: Settings,
        store: ProfileStore,
        *,
        tree: T.Tree | None = None,
        costs: T.CostModel | None = None,
        run: ToolRunner = proc.run,
        python: str = sys.executable,
        flags: Callable[[str], BuildFlags] | None = None,
        worker: gpu_worker.GpuWorker | None = None,
    ):
        """``flags``: the build flags of a source path (the session's, with the compile database); by default
        the settings' alone."""
        self.settings = settings
        self.flags = flags or (lambda path: build_flags(settings, path))
        self.store = store
        self.tree = tree if tree is not None else load_tree(settings)
        self.costs = costs if costs is not None else load_costs()
        self.run = run
        self.python = python
        self.worker = worker
        self.fallback_reason: str | None = None
        """Why the last tree profile used ncu although a worker was given (None: it did not, or no worker)."""

    # -- public -----------------------------------------------------------------

    def cache_key(self, target: Target, full: bool) -> str:
        spec_text = json.dumps(target.spec_data, sort_keys=True) if target.spec_data else ""
        if target.spec_path:
            try:
                with open(target.spec_path, encoding="utf-8") as f:
                    spec_text = f.read()
            except OSError:
                spec_text = "<unreadable>"
        s = self.settings
        flags = self.flags(target.source_path)
        parts = [
            target.source_text, target.kernel, spec_text, target.program or "", " ".join(target.program_args),
            s.arch, s.ncu_path, flags.nvcc, " ".join(flags.arch_flags + flags.flags),
            json.dumps(T.tree_to_json(self.tree), sort_keys=True), str(full), str(TIMED_LAUNCHES),
            str(s.profile_line_counters),
        ]
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()

    def profile(
        self,
        target: Target,
        *,
        full: bool = False,
        cancel: threading.Event | None = None,
        report: Callable[[str], None] | None = None,
        use_cache: bool = True,
    ) -> ProfileResult:
        """Profile ``target``; never raises for tool or program failures (see :class:`ProfileResult`)."""
        key = self.cache_key(target, full)
        if use_cache:
            cached = self.store.get("cache", key)
            if cached is not None:
                return ProfileResult(cached, classify(cached.metrics), None, cached=True)
        previous = self.store.last_good(target.source_path, target.kernel)
        try:
            profile, plan = self._collect(target, full, previous, cancel, report or (lambda _m: None))
        except _Failure as failure:
            stale = previous.marked_stale(str(failure)) if previous is not None else None
            return ProfileResult(stale, classify(stale.metrics) if stale else None, None, message=str(failure))
        self.store.put("cache", key, profile)
        self.store.set_last_good(target.source_path, target.kernel, profile)
        slower = regression(previous, profile) if previous is not None else None
        return ProfileResult(profile, classify(profile.metrics), plan, regression=slower)

    def prepare_inputs(self, target: Target) -> str | None:
        """Have the GPU worker make ``target``'s spec inputs now, so its first profile does not (the server
        asks when a file with specs is opened); None when done, else why not (no worker, no spec, a bad spec)."""
        if self.worker is None or (target.spec_path is None and target.spec_data is None):
            return "no GPU worker or no launch spec"
        try:
            if target.spec_path is not None:
                with open(target.spec_path, encoding="utf-8") as f:
                    spec = json.load(f)
            else:
                spec = dict(target.spec_data or {})
            # The base folder and seed a profile's request carries (see _prepare and _cupti): the same inputs.
            self.worker.prepare(spec, os.path.dirname(os.path.abspath(target.source_path)),
                                timeout_s=self.settings.profile_timeout_s)
        except (OSError, ValueError, gpu_worker.WorkerError) as exc:
            return str(exc)
        return None

    # -- the work ---------------------------------------------------------------

    def _collect(self, target, full, previous, cancel, report) -> tuple[KernelProfile, T.Plan | None]:
        self.fallback_reason = None
        in_worker = self._worker_may_run(target, full) and self._worker_ready()
        if not in_worker:
            self._require_ncu()
        workdir = tempfile.mkdtemp(prefix="kernel-lsp-profile-")
        try:
            report("building")
            launch = self._prepare(target, workdir, cancel,
                                   timed_launches(previous.duration_us if previous is not None else None))
            index = build_index(target.source_text)
            facts = static_facts(index.function(target.kernel), target.source_text, launch.resources,
                                 dict(index.constants))
            measured = T.facts_from_metrics(previous.metrics) if previous is not None else None
            started = time.monotonic()
            with GPU_LOCK:
                if full:
                    report("ncu --set full")
                    run = self._ncu(target, launch, workdir, "full", (), (), True, cancel)
                    profile, plan = run.profile, None
                    passes = run.passes
                else:
                    profile, plan, passes = self._tree_or_fallback(target, launch, workdir, facts, measured, cancel,
                                                                   report, in_worker and launch.cubin is not None)
            return (
                replace(
                    profile,
                    source_file=os.path.abspath(target.source_path),
                    tree_path=plan.path if plan else (),
                    tree_leaf=plan.leaf if plan else None,
                    state_from=plan.state_from if plan else "profile",
                    passes=passes,
                    collection_wall_s=time.monotonic() - started,
                ),
                plan,
            )
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _worker_may_run(self, target: Target, full: bool) -> bool:
        """Whether this profile can go to the GPU worker (decided again per run: see :meth:`_cupti`)."""
        spec_mode = target.spec_path is not None or target.spec_data is not None
        return self.worker is not None and spec_mode and not full and not self.settings.profile_line_counters

    def _worker_ready(self) -> bool:
        """Start the worker if needed; False (the reason in :attr:`fallback_reason`) when it cannot collect counters."""
        try:
            self._worker_info()
        except _Fallback as why:
            self.fallback_reason = str(why)
            log.info("profiling with ncu instead of CUPTI: %s", why)
            return False
        return True

    def _require_ncu(self) -> None:
        if proc.which(self.settings.ncu_path) is None:
            raise _Failure(
                f"Nsight Compute ('{self.settings.ncu_path}') was not found: install it with the CUDA toolkit or set ncuPath"
            )

    def _tree_or_fallback(self, target, launch, workdir, facts, measured, cancel, report, in_worker):
        """The tree's runs in the worker when it can give every metric they need, else with ncu."""
        if in_worker:
            try:
                return self._tree_runs(target, launch, workdir, facts, measured, cancel, report, self._cupti)
            except _Fallback as why:
                self.fallback_reason = str(why)
                log.info("profiling %s with ncu instead of CUPTI: %s", target.kernel, why)
                self._require_ncu()
        return self._tree_runs(target, launch, workdir, facts, measured, cancel, report, self._ncu)

    def _tree_runs(self, target, launch, workdir, facts, measured, cancel, report, collect):
        """One run when the tree decides before measuring (see :func:`T.plan_for`), else first pass + leaf.

        ``collect``: :meth:`_ncu` or :meth:`_cupti` (same arguments, same result).
        """
        tree = self.tree
        tool = "cupti" if collect == self._cupti else "ncu"
        planned = T.plan_for(tree, facts, measured, self.costs)
        if isinstance(planned, T.Plan):
            report(f"{tool}: {', '.join(planned.sections) or 'first pass'}")
            run = collect(target, launch, workdir, "plan", planned.sections, planned.metrics, False, cancel)
            return run.profile, planned, run.passes
        report(f"{tool} first pass: {', '.join(tree.first_pass)}")
        cheap = collect(target, launch, workdir, "first", tree.first_pass, (), False, cancel)
        facts = {**facts, **T.facts_from_metrics(cheap.profile.metrics)}
        plan = T.plan_from_walk(tree, T.walk(tree, facts), first_pass_ran=True, costs=self.costs, facts=facts)
        if not plan.sections and not plan.metrics:
            return cheap.profile, plan, cheap.passes
        report(f"{tool}: {', '.join(plan.sections + plan.metrics)}")
        second = collect(target, launch, workdir, "second", plan.sections, plan.metrics, False, cancel)
        merged = replace(
            second.profile,
            metrics={**cheap.profile.metrics, **second.profile.metrics},
            rules=cheap.profile.rules + second.profile.rules,
            sections=tuple(dict.fromkeys(cheap.profile.sections + second.profile.sections)),
            duration_samples_us=cheap.profile.duration_samples_us,
        )
        return merged, plan, (cheap.passes or 0) + (second.passes or 0)

    def _prepare(self, target: Target, workdir: str, cancel, timed: int = FIRST_TIMED_LAUNCHES) -> _Launch:
        spec_path = target.spec_path
        if spec_path is None and target.spec_data is not None:
            spec_path = os.path.join(workdir, "spec.json")
            with open(spec_path, "w", encoding="utf-8") as f:
                json.dump(target.spec_data, f)
        if spec_path:
            folder = os.path.dirname(os.path.abspath(target.source_path))
            # The editor's own scratch name and document path: the same compile as the save's diagnostics,
            # so a save's two compiles of one text run nvcc once (toolchain's in-flight sharing).
            compiled = compile_in(target.source_text, workdir, SCRATCH_SOURCE, self.flags(target.source_path),
                                  document_path=target.source_path, cancel=cancel)
            if not compiled.ok or compiled.cubin_path is None:
                raise _Failure(f"the file does not compile: {compiled.log.strip()[:400]}")
            entry, problem = find_entry(compiled.entries, target.kernel)
            if entry is None:
                raise _Failure(problem)
            timings = os.path.join(workdir, "timings.json")
            argv = [self.python, "-m", "kernel_lsp.services.harness.launch", "--cubin", compiled.cubin_path,
                    "--kernel", entry, "--spec", os.path.abspath(spec_path), "--base-dir", folder,
                    "--timed", str(timed), "--timings-file", timings]
            resources = next((u for u in compiled.resources.values() if u.mangled_name == entry), None)
            return _Launch(argv, ("--kernel-name-base", "mangled", "-k", entry), entry, resources,
                           os.path.join(workdir, SCRATCH_SOURCE), launches_before(timed), timings,
                           cubin=compiled.cubin_path, spec_path=os.path.abspath(spec_path), base_dir=folder, timed=timed)
        if self.settings.profile_program or target.program:
            program = target.program or self.settings.profile_program
            args = target.program_args or self.settings.profile_args
            name_filter = ("--kernel-name-base", "function", "-k", f"regex:^{re.escape(target.kernel)}(<|$)")
            return _Launch([str(program), *args], name_filter, None, None, None)
        raise _Failure(f"no launch spec for {target.kernel}: create one (code action \"Create launch spec for {target.kernel}\")")

    def _ncu(self, target, launch, workdir, tag, items, metrics, full, cancel) -> _RunOutput:
        """One ncu run collecting ``items`` (sections and ``group:NAME``) and ``metrics``, or ``--set full``."""
        base = os.path.join(workdir, tag)
        if self.settings.profile_line_counters and not full:
            items = tuple(dict.fromkeys((*items, "SourceCounters")))
        sections, group_metrics = T.split_items(items)
        wanted = tuple(dict.fromkeys((*group_metrics, *metrics)))
        if not full and not sections and P.M_DURATION_NS not in wanted:
            wanted = (P.M_DURATION_NS, *wanted)
        argv = ncu_argv(
            self.settings, sections=sections, metrics=wanted, full=full,
            kernel_filter=launch.kernel_filter, launch_skip=launch.skip, kill=launch.skip > 0,
            report_base=base, target_argv=launch.argv,
        )
        env = {"PYTHONPATH": _package_root() + os.pathsep + os.environ.get("PYTHONPATH", "")}
        if launch.timings_file and os.path.exists(launch.timings_file):
            os.remove(launch.timings_file)
        try:
            result = self.run(argv, timeout_s=self.settings.profile_timeout_s, cwd=target.cwd or workdir, env=env, cancel=cancel)
        except proc.ToolMissing as exc:
            raise _Failure(f"{exc}: install Nsight Compute or set ncuPath") from None
        problem = explain_failure(result, target.kernel, self.settings.profile_timeout_s)
        if problem:
            raise _Failure(problem)
        try:
            if full or sections:
                path = base + ".ncu-rep"
                if not os.path.exists(path):
                    raise _Failure(f"ncu wrote no report: {(result.stdout + result.stderr).strip()[-300:]}")
                profiles = ncu_reader.read_report(
                    path, ncu_path=self.settings.ncu_path, source_file=launch.source_copy,
                    with_lines="SourceCounters" in sections or full, run=self.run,
                )
            else:
                profiles = ncu_reader.read_output(
                    result.stdout, ncu_path=self.settings.ncu_path, source_file=launch.source_copy, run=self.run
                )
        except ncu_reader.NcuReadError as exc:
            raise _Failure(str(exc)) from None
        mine = [p for p in profiles if p.kernel == target.kernel or p.mangled == launch.entry] or profiles
        first = mine[0]
        samples = _read_timings(launch.timings_file) or tuple(p.duration_us for p in mine if p.duration_us is not None)
        requested = tuple(items) if not full else ("full",)
        return _RunOutput(replace(first, duration_samples_us=samples, sections=first.sections or requested), passes_of(result.stdout))

    def _cupti(self, target, launch, workdir, tag, items, metrics, full, cancel) -> _RunOutput:
        """One collection in the GPU worker: ``items`` (metric groups) and ``metrics``, for one launch.

        Raises :class:`_Fallback` when the worker cannot give it (a section, a metric without a
        CUPTI equivalent, CUPTI refused) and :class:`_Failure` when the kernel faulted or hung.
        A cancel takes effect after the collection (well under a second; stopping the worker
        would cost the next save its start-up).
        """
        sections, group_metrics = T.split_items(items)
        if sections:
            raise _Fallback(f"the tree asks for ncu sections ({', '.join(sections)})")
        wanted = tuple(dict.fromkeys((P.M_DURATION_NS, *group_metrics, *metrics)))
        info = self._worker_info()
        routing = gpu_worker.route(wanted, range_refused=sorted(self.worker.range_refused),
                                   sass_available=sorted(set(info.sass_available or ()) - self.worker.sass_refused))
        if routing.missing:
            raise _Fallback(f"CUPTI cannot give {', '.join(routing.missing)}")
        with open(launch.spec_path, encoding="utf-8") as f:
            spec = json.load(f)
        request = gpu_worker.Request(
            cubin_path=launch.cubin, entry=launch.entry, spec=spec, base_dir=launch.base_dir, arch=self.settings.arch,
            timed=launch.timed, collections=(wanted,),
        )
        try:
            reply = self.worker.profile(request, timeout_s=self.settings.profile_timeout_s)
        except gpu_worker.WorkerError as exc:
            if exc.fault:
                raise _Failure(str(exc)) from None
            raise _Fallback(str(exc)) from None
        if reply.missing:
            raise _Fallback(f"CUPTI could not give {', '.join(reply.missing)}")
        profile = KernelProfile(
            kernel=target.kernel, mangled=launch.entry, metrics=dict(reply.metrics), sections=tuple(items) or ("cupti",),
            duration_samples_us=reply.timings_us, collector=P.COLLECTOR_CUPTI,
        )
        return _RunOutput(profile, reply.passes)

    def _worker_info(self) -> gpu_worker.WorkerInfo:
        try:
            info = self.worker.ensure()
        except gpu_worker.WorkerError as exc:
            raise _Fallback(str(exc)) from None
        if not info.cupti_ok:
            raise _Fallback(f"CUPTI is not usable in the GPU worker: {info.cupti_error}")
        return info


def _read_timings(path: str | None) -> tuple[float, ...]:
    """The launcher's event-timed durations (µs), or () when it wrote none or garbage."""
    if not path:
        return ()
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except (OSError, ValueError):
        return ()
    if not isinstance(values, list):
        return ()
    return tuple(float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0)


@dataclass(frozen=True)
class _Launch:
    argv: list[str]
    kernel_filter: tuple[str, ...]
    entry: str | None
    resources: ResourceUsage | None
    """ptxas's record of the entry (harness mode), read from the build's one CompileResult."""
    source_copy: str | None
    """The copy of the source that was compiled (its path is what ncu's line info names)."""
    skip: int = 0
    """Launches of the kernel before the one to profile (the launcher's warm-up and timed launches)."""
    timings_file: str | None = None
    """Where the launcher writes its event-timed durations."""
    cubin: str | None = None
    """The compiled cubin (harness mode), for the GPU worker."""
    spec_path: str | None = None
    base_dir: str | None = None
    """Folder of the spec's ``file(NAME.npy)`` inputs."""
    timed: int = 0
    """Event-timed launches before the profiled one."""


@dataclass(frozen=True)
class _RunOutput:
    profile: KernelProfile
    passes: int | None


class _Failure(Exception):
    """A profiling failure with a message for the user."""


class _Fallback(Exception):
    """The GPU worker cannot make this profile; ncu makes it (the reason is logged)."""


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def summary_lines(result: ProfileResult) -> list[str]:
    """Plain-text lines describing a result (CLI and hover share the facts, not the format)."""
    lines: list[str] = []
    p = result.profile
    if result.message:
        lines.append(f"profiling failed: {result.message}")
    if p is None:
        return lines
    if p.stale:
        lines.append("(stale: last good profile)")
    if p.duration_us is not None:
        lines.append(f"duration: {p.duration_us:.1f} us")
    for label, value in (
        ("memory throughput", p.memory_throughput_pct),
        ("compute (SM) throughput", p.compute_throughput_pct),
        ("achieved occupancy", p.achieved_occupancy_pct),
    ):
        if value is not None:
            lines.append(f"{label}: {value:.1f} %")
    if result.bottleneck is not None:
        lines.append(f"bottleneck: {result.bottleneck.summary}")
    top = p.top_rule
    if top is not None:
        speedup = f" (est. {top.estimated_speedup_pct:.0f} % faster)" if top.estimated_speedup_pct else ""
        lines.append(f"ncu advice: {top.title}{speedup}: {top.message}")
    return lines


def as_json(result: ProfileResult) -> dict:
    return {
        "ok": result.ok,
        "message": result.message,
        "cached": result.cached,
        "profile": profile_to_json(result.profile) if result.profile else None,
        "bottleneck": None
        if result.bottleneck is None
        else {
            "primary": result.bottleneck.primary,
            "detail": result.bottleneck.detail,
            "evidence": [e.text() for e in result.bottleneck.evidence],
        },
        "plan": None
        if result.plan is None
        else {"first_pass": list(result.plan.first_pass), "sections": list(result.plan.sections), "leaf": result.plan.leaf},
        "signature": result.profile.signature() if result.profile else None,
        "regression": None
        if result.regression is None
        else {
            "previous_us": result.regression.previous_us,
            "current_us": result.regression.current_us,
            "noise_pct": result.regression.noise_pct,
        },
    }
