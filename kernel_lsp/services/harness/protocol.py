"""The verification protocol, independent of how kernels are run.

A :class:`Backend` runs a kernel on host arrays (upload, launch, sync, download)
and times launches; the real one is :class:`~kernel_lsp.services.harness.backend_pycuda.PycudaBackend`
(in the child process), tests use numpy-emulated kernels. This module decides
what to run and what the results mean:

Correctness, for each seed (fresh inputs each time, all in one process):
  original once, candidate twice on the same inputs; ``out`` buffers start as
  poison; every ``in`` array must come back bit-identical; the two candidate
  runs must agree within tolerance (else ``nondeterministic``); the first must
  match the original (else ``mismatch``/``nan_or_inf``). Then each spec variant
  once (original and candidate, the first seed). Running the candidate on
  several inputs in one process is what exposes results cached across launches.

Timing: warm-up, then original and candidate trials interleaved (the order
alternating every pair), each trial after a restore of the arrays and an L2
flush, until ``max_trials`` or the time budget (at least ``min_trials``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kernel_lsp.core.compare import CompareResult, arrays_equal, compare, poison
from kernel_lsp.core.inputs import make_inputs, scalar_args
from kernel_lsp.core.spec import ArrayParam, Launch, Spec

ORIGINAL = "original"
CANDIDATE = "candidate"


class LaunchFailed(RuntimeError):
    """A launch or a copy failed on the device (bad cubin, fault, illegal address)."""


Args = list[np.ndarray | np.generic]


class Timer(Protocol):
    def time_ms(self, which: str) -> float:
        """Restore the arrays, flush L2, launch ``which`` once between CUDA events; milliseconds."""
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    def run(self, which: str, args: Args, launch: Launch) -> list[np.ndarray | None]:
        """Copy the arrays in ``args`` to fresh device buffers, launch once, sync, return every array (None for scalars).

        ``args`` itself must be left unchanged: the same host arrays feed the next run.
        """
        ...

    def timer(self, args: Mapping[str, Args], launches: Mapping[str, Launch], restore: Sequence[bool]) -> Timer:
        """Device buffers for both kernels, prepared for repeated timed launches.

        ``restore[i]``: argument i is rewritten from a pristine copy before every trial
        (``out`` and ``inout`` arrays; inputs were checked unchanged by correctness).
        """
        ...


@dataclass(frozen=True)
class TimingOptions:
    budget_s: float = 2.0
    """Wall time for the timed trials (both kernels together)."""
    min_trials: int = 10
    max_trials: int = 200
    """Per kernel."""
    warmup: int = 3
    """Untimed launches per kernel before timing."""


@dataclass
class Outcome:
    """What the child reports (plain data; JSON-able)."""

    reason: str | None = None
    """None when correct; else a :class:`~kernel_lsp.core.verdict.Reason` value."""
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    samples_ms: dict[str, list[float]] = field(default_factory=dict)

    def fail(self, reason: str, message: str) -> Outcome:
        self.reason = reason
        self.errors.append(message)
        return self


#: Poison arrays kept for reuse across seeds and the timing run, up to this many bytes in all.
_POISON_CACHE_BYTES = 1 << 30
_poison_cache: dict[tuple[str, int], np.ndarray] = {}


def _shared_poison(array_type: str, size: int) -> np.ndarray:
    """A read-only poison array, made once per (type, size): filling 64M elements costs ~0.4 s of CPU per seed.

    Read-only so that a backend that wrongly wrote into its ``args`` fails loudly instead of
    corrupting the poison of later runs.
    """
    key = (array_type, size)
    cached = _poison_cache.get(key)
    if cached is None:
        cached = poison(array_type, size)
        cached.flags.writeable = False
        if sum(a.nbytes for a in _poison_cache.values()) + cached.nbytes > _POISON_CACHE_BYTES:
            _poison_cache.clear()
        _poison_cache[key] = cached
    return cached


def build_args(spec: Spec, arrays: Mapping[str, np.ndarray], variant: int | None) -> Args:
    """Kernel arguments in parameter order; ``out`` arrays replaced by (shared, read-only) poison."""
    scalars = scalar_args(spec, variant)
    args: Args = []
    for p in spec.params:
        if isinstance(p, ArrayParam):
            args.append(_shared_poison(p.type, arrays[p.name].size) if p.role == "out" else arrays[p.name])
        else:
            args.append(scalars[p.name])
    return args


def _check_inputs(spec: Spec, sent: Args, returned: list[np.ndarray | None]) -> list[str]:
    modified = []
    for p, before, after in zip(spec.params, sent, returned):
        if isinstance(p, ArrayParam) and p.role == "in" and after is not None and not arrays_equal(before, after):
            changed = int(np.count_nonzero(np.ascontiguousarray(before).view(np.uint8) != np.ascontiguousarray(after).view(np.uint8)))
            modified.append(f"'{p.name}' is an input (role in) but {changed} of its bytes changed")
    return modified


def _compare_outputs(spec: Spec, reference: list, candidate: list) -> list[CompareResult]:
    results = []
    for p, r, c in zip(spec.params, reference, candidate):
        if isinstance(p, ArrayParam) and p.role in ("out", "inout"):
            results.append(compare(p.name, p.type, r, c, spec.tolerance_for(p.type), poisoned=p.role == "out"))
    return results


def _merge_errors(outcome: Outcome, results: list[CompareResult]) -> None:
    for r in results:
        if r.max_abs_error is not None:
            outcome.max_abs_error = max(outcome.max_abs_error or 0.0, r.max_abs_error)
        if r.max_rel_error is not None:
            outcome.max_rel_error = max(outcome.max_rel_error or 0.0, r.max_rel_error)


#: Inputs shared by :func:`check_correctness` and :func:`measure`, keyed by seed (main size only).
InputCache = dict[int, Mapping[str, np.ndarray]]


def check_correctness(
    backend: Backend, spec: Spec, seeds: list[int], files: Mapping[str, np.ndarray] | None = None, keep_inputs: InputCache | None = None,
) -> Outcome:
    """``keep_inputs``: receives the first seed's main-size inputs, for :func:`measure` to reuse
    (drawing 64M-element arrays again costs about as much as a seed's comparisons)."""
    outcome = Outcome()
    runs: list[tuple[int | None, int, bool]] = [(None, s, True) for s in seeds]
    if seeds:
        runs += [(v, seeds[0], False) for v in range(len(spec.variants))]
    for variant, seed, twice in runs:
        where = f"seed {seed}" + ("" if variant is None else f", variants[{variant}] {dict(spec.variants[variant])}")
        resolved = spec.resolve(variant)
        arrays = make_inputs(spec, seed, variant, files)
        if keep_inputs is not None and variant is None and seed == seeds[0]:
            keep_inputs[seed] = arrays
        args = build_args(spec, arrays, variant)
        try:
            stage = "original"
            reference = backend.run(ORIGINAL, args, resolved.original)
            stage = "candidate"
            first = backend.run(CANDIDATE, args, resolved.candidate)
            second = backend.run(CANDIDATE, args, resolved.candidate) if twice else None
        except LaunchFailed as exc:
            return outcome.fail("launch_error", f"{where}: the {stage} kernel failed: {exc}")
        for problem in _check_inputs(spec, args, reference):
            outcome.warnings.append(f"{where}: the original kernel modifies its input: {problem} (is the spec's role right?)")
        for run in (first, second):
            if run is not None and (modified := _check_inputs(spec, args, run)):
                return outcome.fail("input_modified", f"{where}: {modified[0]}")
        results = _compare_outputs(spec, reference, first)
        _merge_errors(outcome, results)
        bad = next((r for r in results if not r.ok), None)
        if second is not None:
            repeat = next((r for r in _compare_outputs(spec, first, second) if not r.ok), None)
            if repeat is not None:
                return outcome.fail("nondeterministic", f"{where}: two runs of the candidate on the same input disagree: {repeat.message}")
        if bad is not None:
            return outcome.fail(bad.reason or "mismatch", f"{where}: {bad.message}")
    return outcome


def measure(
    backend: Backend,
    spec: Spec,
    seed: int,
    options: TimingOptions,
    files: Mapping[str, np.ndarray] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    inputs: InputCache | None = None,
) -> dict[str, list[float]]:
    """Interleaved timed trials of both kernels at the main size; milliseconds per launch.

    ``inputs``: main-size inputs already drawn (by :func:`check_correctness`), used for ``seed`` when present.
    """
    resolved = spec.resolve(None)
    arrays = (inputs or {}).get(seed)
    args = build_args(spec, arrays if arrays is not None else make_inputs(spec, seed, None, files), None)
    restore = [isinstance(p, ArrayParam) and p.role != "in" for p in spec.params]
    timer = backend.timer({ORIGINAL: args, CANDIDATE: args}, {ORIGINAL: resolved.original, CANDIDATE: resolved.candidate}, restore)
    samples: dict[str, list[float]] = {ORIGINAL: [], CANDIDATE: []}
    try:
        for _ in range(options.warmup):
            timer.time_ms(ORIGINAL)
            timer.time_ms(CANDIDATE)
        start = clock()
        for trial in range(options.max_trials):
            order = (ORIGINAL, CANDIDATE) if trial % 2 == 0 else (CANDIDATE, ORIGINAL)
            for which in order:
                samples[which].append(timer.time_ms(which))
            if trial + 1 >= options.min_trials and clock() - start >= options.budget_s:
                break
    finally:
        timer.close()
    return samples
