"""The verification protocol, independent of how kernels are run.

A :class:`Backend` owns device arrays (each with red zones before and after it),
fills, compares and launches; the real one is
:class:`~kernel_lsp.services.harness.backend_pycuda.PycudaBackend` (in the child
process), the CPU tests use numpy. This module decides what to run and what the
results mean. Arrays stay on the device: inputs are drawn there
(:func:`kernel_lsp.core.inputs.draw_arrays`), outputs are compared there bit for
bit and then within the tolerance (:class:`kernel_lsp.core.compare.ToleranceSummary`),
and only outputs the device cannot prove within it come back to the host, where
the rules of :mod:`kernel_lsp.core.compare` name what is wrong.

Correctness, in this order (each check says beside it what it catches):

1. **Seeds in the same buffers.** For every seed, fresh inputs are written into
   the *same* allocations; the original runs once, the candidate twice, each
   into its own poisoned output. A candidate that caches results keyed by
   pointers and shapes returns the previous seed's answer here.
2. **Red zones** around every array are checked after every candidate launch
   (:func:`kernel_lsp.core.compare.check_guards`): a store out of range is
   ``out_of_bounds``, naming the array and the offset. Input red zones of float
   arrays hold NaN, so a read out of range shows as NaN in the output.
3. **Inputs unchanged**: every ``in`` array is compared with its pristine copy.
4. **Different addresses**: the first seed once more in a second set of
   allocations (made while the first is alive, so every pointer differs).
5. **Variants**: each spec variant once, in its own allocations.
6. **Module state**: when a candidate launch changed a ``__device__`` or
   ``__managed__`` variable that the original does not change, the first seed is
   replayed after the launches of 4 and 5 and must match again.
7. **Launch counts** (:data:`LAUNCH_RUNS`): runs of 1, 2, 3, 5, 8 and 13 candidate
   launches back to back into one output, original launches in varying numbers
   between them, the output checked after each run's last launch. A candidate that
   skips its work after a warm-up, or when launched again on what it saw last, is
   ``history_dependent`` here.

A candidate that matched once and then failed in buffers an earlier launch used
is re-run on the same inputs at fresh addresses: when it matches there, the
failure depended on launch history (``history_dependent``), not on the inputs.

Hangs: the original is timed on every input first; a candidate launch running
longer than ``max(1 s, 50 x the original's time on that input)`` is abandoned
(``timeout``) and the child exits, killing the kernel with its context.

Timing (:meth:`Verification.measure`): warm-up, then two series of original and
candidate trials interleaved (the order alternating every pair), each trial
after a restore of the outputs (poison) and an L2 flush, until ``max_trials`` or
the series' half of the time budget (at least ``min_trials``). The first series
times unchanged inputs; the second redraws every randomly drawn input that the
device can draw with a fresh seed before each pair, outside the timed region.
What is timed is checked: after the first and the last pair of each series and
after a seeded random sample of the others (``check_fraction``), the candidate's
output is compared with the original's from the same pair, its red zones and
inputs checked (``timed_mismatch``). :func:`kernel_lsp.core.stats.collapsed`
compares the two series' speedups (``speedup_collapse``, decided by the caller).

Sizes the spec does not name (:meth:`Verification.probe`, :mod:`.sizes`): each
scalar that sizes an array or the grid at other values, in the spec's buffers
with the launch re-evaluated, the outputs poisoned and compared in full, float
inputs past the probed size set to NaN (``size_dependent``). A size at which
the original itself misbehaves (faults, hangs, writes outside the probed size or
its red zones, disagrees with itself) is a warning and skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kernel_lsp.core.compare import INPUT_FLOAT_GUARD, CompareResult, ToleranceSummary, check_guards, compare, guard_fill, poison, poison_mask
from kernel_lsp.core.inputs import KIND_NORMAL, KIND_RANDINT, KIND_UNIFORM, NUMPY_DTYPES, DevicePlan, device_plan, draw_arrays, scalar_args
from kernel_lsp.core.spec import FLOAT_TYPES, ArrayParam, Launch, Spec, Tolerance
from kernel_lsp.services.harness.sizes import Probe, plan_probes

ORIGINAL = "original"
CANDIDATE = "candidate"
#: The candidate's second run on the same inputs (its own output buffers).
REPEAT = "repeat"
#: Check 7: (candidate launches back to back, original launches before them), in order.
LAUNCH_RUNS = ((1, 1), (2, 0), (3, 2), (5, 1), (8, 0), (13, 1))
#: Seeds of the inputs redrawn between timed pairs start here (far from any correctness seed).
REDRAW_SEEDS_FROM = 1 << 40
#: Seconds of the original's launches at sizes the spec does not name, nearest sizes first.
PROBE_BUDGET_S = 2.0
#: The random stream, beside the timing seed, that picks which timed pairs are checked.
_CHECKED_PAIRS_STREAM = 1
#: Generator kinds whose draws change with the seed (a fill or an arange is the same every time).
_RANDOM_KINDS = frozenset((KIND_UNIFORM, KIND_NORMAL, KIND_RANDINT))


class LaunchFailed(RuntimeError):
    """A launch or a copy failed on the device (bad cubin, fault, illegal address)."""


class LaunchTimeout(LaunchFailed):
    """A launch ran past its limit; the device may still be running it."""

    def __init__(self, limit_s: float):
        super().__init__(f"the launch ran longer than its limit of {limit_s:.3g} s")
        self.limit_s = limit_s


@dataclass(frozen=True)
class Limits:
    """How long a candidate launch may run before it counts as hung."""

    floor_s: float = 1.0
    """Never less than this: launch overhead, clocks ramping up and a busy GPU can cost milliseconds."""
    factor: float = 50.0
    """Times the original's duration on the same input: no honest rewrite is 50x slower, a hang is infinitely so."""
    original_s: float = 120.0
    """The original's own launches (it is trusted; the child's overall timeout still applies)."""


def candidate_limit_s(original_ms: float | None, limits: Limits) -> float:
    """Seconds a candidate launch may run on an input the original ran in ``original_ms``."""
    if original_ms is None:
        return limits.original_s
    return max(limits.floor_s, limits.factor * original_ms / 1000.0)


class Backend(Protocol):
    """Device arrays are opaque handles made by :meth:`alloc`; scalars are numpy scalars."""

    def alloc(self, array_type: str, size: int, guard_fill: tuple[int, int] | None) -> Any:
        """An array of ``size`` elements; with ``guard_fill`` (width, value), red zones of
        :data:`kernel_lsp.core.compare.GUARD_BYTES` before and after it, filled with that pattern."""
        ...

    def address(self, handle: Any) -> int: ...

    def free(self, handle: Any) -> None: ...

    def upload(self, handle: Any, host: np.ndarray) -> None: ...

    def generate(self, handle: Any, plan: DevicePlan, array_type: str) -> None: ...

    def download(self, handle: Any) -> np.ndarray: ...

    def guards(self, handle: Any) -> tuple[np.ndarray, np.ndarray]:
        """The red zones' bytes (before, after), read back."""
        ...

    def fill_guards(self, handle: Any, guard_fill: tuple[int, int]) -> None: ...

    def poison(self, handle: Any, array_type: str) -> None:
        """Fill the array with :func:`kernel_lsp.core.compare.poison`'s pattern."""
        ...

    def copy(self, dst: Any, src: Any) -> None: ...

    def differ(self, a: Any, b: Any) -> tuple[int, int]:
        """(number of differing 4-byte words, byte offset of the first) between two arrays of one size."""
        ...

    def launch(self, which: str, args: Sequence[Any], launch: Launch, limit_s: float) -> float:
        """Launch once, wait at most ``limit_s`` (else :class:`LaunchTimeout`); milliseconds on the GPU."""
        ...

    def globals(self, which: str) -> dict[str, bytes]:
        """The current bytes of every ``__device__``/``__managed__`` variable of that kernel's module."""
        ...

    def set_globals(self, which: str, values: Mapping[str, bytes]) -> None:
        """Write back module variables (as :meth:`globals` read them)."""
        ...

    def fill_tail(self, handle: Any, first: int, guard_fill: tuple[int, int]) -> None:
        """Fill the elements from ``first`` to the end with the (width, value) pattern."""
        ...

    def tolerance_summary(self, reference: Any, candidate: Any, array_type: str, tolerance: Tolerance, poisoned: bool) -> ToleranceSummary | None:
        """The comparison of two float arrays on the device (:class:`~kernel_lsp.core.compare.ToleranceSummary`);
        None when it cannot be made there (the arrays are then copied back and compared on the host)."""
        ...

    def timer(self, args: Mapping[str, Sequence[Any]], restores: Mapping[str, Sequence[tuple[str, Any, Any]]], launches: Mapping[str, Launch], limits_s: Mapping[str, float]) -> Timer:
        """Repeated timed launches of both kernels; ``restores[which]``: ``("poison", handle, type)``
        or ``("copy", dst, src)`` done before every trial."""
        ...


class Timer(Protocol):
    def time_ms(self, which: str) -> float:
        """Restore the outputs, flush L2, launch ``which`` once between CUDA events; milliseconds."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class TimingOptions:
    budget_s: float = 2.0
    """Wall time for the timed trials (both kernels, both series together: half each when inputs can be redrawn),
    the checks of timed launches included."""
    min_trials: int = 10
    """Per kernel and series."""
    max_trials: int = 100
    """Per kernel and series."""
    warmup: int = 3
    """Untimed launches per kernel before timing."""
    check_fraction: float = 0.125
    """Share of the timed pairs, besides each series' first and last, after which the outputs are checked
    (drawn with the timing seed): a candidate that skips work on one launch in k is caught with probability
    1 - (1 - check_fraction / k)^trials."""


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
    original_ms: dict[str, float] = field(default_factory=dict)
    """The original's launch time per input ("seed 1", "variants[0]"), which set the candidate's limits."""
    abandoned: bool = False
    """A launch was still running when given up on: the context cannot be closed, only the process ended."""
    timed_checks: int = 0
    """Timed launches whose outputs were compared with the original's."""
    sizes_tried: list[str] = field(default_factory=list)
    """Sizes the spec does not name at which the candidate matched the original (``"cols = 8191"``)."""

    def fail(self, reason: str, message: str) -> Outcome:
        self.reason = reason
        self.errors.append(message)
        return self


class _Rejected(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class _Array:
    param: ArrayParam
    size: int
    work: Any = None
    """``in`` arrays: the one buffer every kernel reads."""
    pristine: Any = None
    """``in``/``inout``: the inputs as drawn, to check and restore from."""
    slots: dict[str, Any] = field(default_factory=dict)
    """``out``/``inout``: one guarded buffer per run (original, candidate, repeat)."""


@dataclass
class _Buffers:
    """One set of device arrays at one size (the main size or a variant)."""

    variant: int | None
    arrays: list[_Array]
    scalars: dict[str, np.generic]

    def handles(self) -> Iterator[Any]:
        for a in self.arrays:
            yield from (h for h in (a.work, a.pristine, *a.slots.values()) if h is not None)

    def addresses(self, backend: Backend) -> set[int]:
        return {backend.address(h) for a in self.arrays for h in (a.work, *a.slots.values()) if h is not None}


def _guard_fill(p: ArrayParam) -> tuple[int, int]:
    return guard_fill(p.type, p.role)


def build_args(spec: Spec, arrays: Mapping[str, np.ndarray], variant: int | None) -> list[np.ndarray | np.generic]:
    """Host arguments in parameter order for a one-off launch (``launch.py``): ``out`` arrays as poison."""
    scalars = scalar_args(spec, variant)
    return [(poison(p.type, arrays[p.name].size) if p.role == "out" else arrays[p.name]) if isinstance(p, ArrayParam) else scalars[p.name]
            for p in spec.params]


class Verification:
    """Correctness (:meth:`check`), timing with its checks (:meth:`measure`) and sizes the spec does not name
    (:meth:`probe`) of one candidate against the original, in this order."""

    def __init__(self, backend: Backend, spec: Spec, files: Mapping[str, np.ndarray] | None = None, limits: Limits | None = None, clock: Callable[[], float] = time.perf_counter):
        self.backend, self.spec, self.files = backend, spec, files
        self.limits = limits or Limits()
        self.clock = clock
        self.outcome = Outcome()
        self.main: _Buffers | None = None
        self.writes_state: tuple[str, ...] = ()
        self._initial_state: dict[str, bytes] = {}
        self._original_ms: dict[tuple[int | None, int], float] = {}
        self._drawn: dict[tuple[int, int | None], dict] = {}
        self._original_modifies_inputs = False
        self._probe_original_ms = 0.0

    # --- buffers -----------------------------------------------------------------------------

    def _buffers(self, variant: int | None) -> _Buffers:
        resolved = self.spec.resolve(variant)
        arrays = []
        for p in self.spec.arrays:
            size = resolved.sizes[p.name]
            a = _Array(p, size)
            if p.role == "in":
                a.work = self.backend.alloc(p.type, size, _guard_fill(p))
            if p.role != "out":
                a.pristine = self.backend.alloc(p.type, size, None)
            if p.role != "in":
                a.slots = {slot: self.backend.alloc(p.type, size, _guard_fill(p)) for slot in (ORIGINAL, CANDIDATE, REPEAT)}
            arrays.append(a)
        return _Buffers(variant, arrays, scalar_args(self.spec, variant))

    def _free(self, buffers: _Buffers) -> None:
        for h in buffers.handles():
            self.backend.free(h)

    def _draws(self, buffers: _Buffers, seed: int) -> dict:
        key = (seed, buffers.variant)
        drawn = self._drawn.get(key)
        if drawn is None:
            drawn = draw_arrays(self.spec, seed, buffers.variant, self.files)
            # The first seed's draws are used again (other addresses, replay, timing, probes): host-drawn arrays
            # such as a 40M-entry CSR structure cost a second each.
            if not self._drawn:
                self._drawn[key] = drawn
        return drawn

    def _fill_inputs(self, buffers: _Buffers, seed: int, names: Sequence[str] | None = None) -> None:
        """Write seed's inputs (of ``names``, default all) into the existing allocations (same pointers, new contents)."""
        drawn = self._draws(buffers, seed)
        for a in buffers.arrays:
            if a.pristine is None or (names is not None and a.param.name not in names):
                continue
            values = drawn[a.param.name]
            if isinstance(values, DevicePlan):
                self.backend.generate(a.pristine, values, a.param.type)
            else:
                self.backend.upload(a.pristine, values)
            if a.work is not None:
                self.backend.copy(a.work, a.pristine)

    def _args(self, buffers: _Buffers, slot: str, scalars: Mapping[str, np.generic] | None = None) -> list[Any]:
        by_name = {a.param.name: a for a in buffers.arrays}
        scalars = buffers.scalars if scalars is None else scalars
        args: list[Any] = []
        for p in self.spec.params:
            if isinstance(p, ArrayParam):
                a = by_name[p.name]
                args.append(a.work if p.role == "in" else a.slots[slot])
            else:
                args.append(scalars[p.name])
        return args

    def _prepare_outputs(self, buffers: _Buffers, slot: str) -> None:
        for a in buffers.arrays:
            if a.param.role == "out":
                # Poison, not zeros: an element the kernel never writes is then seen as unwritten.
                self.backend.poison(a.slots[slot], a.param.type)
            elif a.param.role == "inout":
                self.backend.copy(a.slots[slot], a.pristine)

    # --- one launch and its checks -------------------------------------------------------------

    def _launch(self, buffers: _Buffers, which: str, slot: str, where: str, seed: int) -> None:
        self._prepare_outputs(buffers, slot)
        resolved = self.spec.resolve(buffers.variant)
        key = (buffers.variant, seed)
        if which == ORIGINAL:
            ms = self.backend.launch(ORIGINAL, self._args(buffers, slot), resolved.original, self.limits.original_s)
            # The fastest of the original's runs on this input sets the limit: a first, cold launch is the slowest.
            self._original_ms[key] = min(ms, self._original_ms.get(key, ms))
            self.outcome.original_ms[where] = self._original_ms[key]
            self._after_original(buffers, slot, where)
            return
        limit_s = candidate_limit_s(self._original_ms.get(key), self.limits)
        try:
            self.backend.launch(CANDIDATE, self._args(buffers, slot), resolved.candidate, limit_s)
        except LaunchTimeout:
            self.outcome.abandoned = True
            raise self._timeout(where, limit_s, self._original_ms.get(key)) from None
        self._after_candidate(buffers, slot, where)

    def _timeout(self, where: str, limit_s: float, original_ms: float | None) -> _Rejected:
        return _Rejected("timeout", f"{where}: the candidate was still running after {limit_s:.3g} s "
                         f"(limit max({self.limits.floor_s:g} s, {self.limits.factor:g} x the original's "
                         f"{original_ms if original_ms is not None else float('nan'):.3g} ms on the same input)): a hang; it was killed")

    def _guard_problems(self, buffers: _Buffers, slot: str) -> list[str]:
        problems = []
        for a in buffers.arrays:
            handle = a.work if a.param.role == "in" else a.slots[slot]
            front, back = self.backend.guards(handle)
            problem = check_guards(a.param.name, a.param.type, a.param.role, a.size, front, back)
            if problem:
                problems.append(problem)
                self.backend.fill_guards(handle, _guard_fill(a.param))
        return problems

    def _modified_inputs(self, buffers: _Buffers) -> list[str]:
        modified = []
        for a in buffers.arrays:
            if a.work is None:
                continue
            words, first = self.backend.differ(a.work, a.pristine)
            if words:
                itemsize = NUMPY_DTYPES[a.param.type].itemsize
                modified.append(f"'{a.param.name}' is an input (role in) but {words} of its 4-byte words changed (first at element {first // itemsize})")
                self.backend.copy(a.work, a.pristine)
        return modified

    def _after_original(self, buffers: _Buffers, slot: str, where: str) -> None:
        for problem in self._guard_problems(buffers, slot):
            self._warn(f"{where}: the original kernel writes out of range: {problem} (is the spec's size right?)")
        for problem in self._modified_inputs(buffers):
            self._original_modifies_inputs = True
            self._warn(f"{where}: the original kernel modifies its input: {problem} (is the spec's role right?)")

    def _after_candidate(self, buffers: _Buffers, slot: str, where: str, reason: str | None = None) -> None:
        # Red zones first: a stray store can also land in an input's red zone or corrupt outputs.
        problems = self._guard_problems(buffers, slot)
        if problems:
            raise _Rejected(reason or "out_of_bounds", f"{where}: {problems[0]}")
        modified = self._modified_inputs(buffers)
        # Timed launches of both kernels share the inputs: an original that writes into them (a warning about the
        # spec's role) would be taken for the candidate there.
        if modified and not (reason == "timed_mismatch" and self._original_modifies_inputs):
            raise _Rejected(reason or "input_modified", f"{where}: {modified[0]}")

    def _warn(self, message: str) -> None:
        if message not in self.outcome.warnings:
            self.outcome.warnings.append(message)

    # --- comparisons ---------------------------------------------------------------------------

    def _compare(self, buffers: _Buffers, reference: str, other: str, merge: bool = True) -> CompareResult | None:
        """The first output that fails the rules of :mod:`kernel_lsp.core.compare`, or None.

        Outputs are compared on the device: bit for bit, then (floats that differ) within the tolerance;
        they are copied back only when the device cannot prove them within it, for the rules' message.
        """
        merge = merge and reference == ORIGINAL
        for a in buffers.arrays:
            if a.param.role == "in":
                continue
            words, _ = self.backend.differ(a.slots[reference], a.slots[other])
            if not words:
                # Bit-identical on the device: no copy back, no errors to record.
                if merge:
                    self._merge(CompareResult(True, None, "", 0.0, 0.0, 0.0, 0))
                continue
            tolerance = self.spec.tolerance_for(a.param.type)
            poisoned = a.param.role == "out"
            if a.param.type in FLOAT_TYPES:
                summary = self.backend.tolerance_summary(a.slots[reference], a.slots[other], a.param.type, tolerance, poisoned)
                if summary is not None and summary.proves_match(a.param.type, tolerance):
                    if merge:
                        self._merge(CompareResult(True, None, "", summary.max_abs_error, summary.max_rel_error, None, 0))
                    continue
            result = compare(a.param.name, a.param.type, self.backend.download(a.slots[reference]), self.backend.download(a.slots[other]),
                             tolerance, poisoned=poisoned)
            if merge:
                self._merge(result)
            if not result.ok:
                return result
        return None

    def _merge(self, result: CompareResult) -> None:
        if result.max_abs_error is not None:
            self.outcome.max_abs_error = max(self.outcome.max_abs_error or 0.0, result.max_abs_error)
        if result.max_rel_error is not None:
            self.outcome.max_rel_error = max(self.outcome.max_rel_error or 0.0, result.max_rel_error)

    def _mismatch(self, result: CompareResult, where: str) -> _Rejected:
        message = f"{where}: {result.message}"
        if result.reason == "nan_or_inf" and any(p.role == "in" and p.type in FLOAT_TYPES for p in self.spec.arrays):
            message += " (float inputs are surrounded by NaN red zones: does the candidate read out of range?)"
        return _Rejected(result.reason or "mismatch", message)

    def _run_pair(self, buffers: _Buffers, seed: int, where: str) -> CompareResult | None:
        """Original and candidate once each on ``seed``'s inputs in ``buffers``; the first failing output."""
        self._fill_inputs(buffers, seed)
        self._launch(buffers, ORIGINAL, ORIGINAL, where, seed)
        self._launch(buffers, CANDIDATE, CANDIDATE, where, seed)
        return self._compare(buffers, ORIGINAL, CANDIDATE)

    def _state_changes(self, which: str, before: dict[str, bytes]) -> set[str]:
        after = self.backend.globals(which)
        return {name for name, value in after.items() if before.get(name) != value}

    def _elsewhere_matches(self, seed: int, where: str) -> bool:
        """Whether the candidate matches on ``seed`` at fresh addresses with its module state as
        loaded (after failing in buffers and with state that earlier launches used)."""
        fresh = self._buffers(None)
        self.backend.set_globals(CANDIDATE, self._initial_state)
        try:
            return self._run_pair(fresh, seed, where + ", fresh buffers") is None
        finally:
            self._free(fresh)

    def _guarded(self, run: Callable[[], None], context: str = "") -> Outcome:
        """Run one stage; a rejection, a hang or a failed launch becomes the outcome."""
        try:
            run()
        except _Rejected as rejected:
            self.outcome.fail(rejected.reason, str(rejected))
        except LaunchTimeout as exc:
            # The original itself (or a harness kernel) did not finish: the device is still busy with it.
            self.outcome.abandoned = True
            self.outcome.fail("timeout", f"{context}{exc}: a hang; it was killed" if context else f"the original kernel did not finish: {exc}")
        except LaunchFailed as exc:
            self.outcome.fail("launch_error", f"{context}{exc}" if context else f"a kernel failed: {exc}")
        return self.outcome

    # --- the checks ----------------------------------------------------------------------------

    def check(self, seeds: Sequence[int]) -> Outcome:
        return self._guarded(lambda: self._check(list(seeds)))

    def _check(self, seeds: list[int]) -> None:
        self.main = main = self._buffers(None)
        first = seeds[0]
        original_state = candidate_state = set()
        for k, seed in enumerate(seeds):
            where = f"seed {seed}"
            if k == 0:
                # Module state is read around the first launches: what a launch changes there, it changes every time.
                before_original, before_candidate = self.backend.globals(ORIGINAL), self.backend.globals(CANDIDATE)
                self._initial_state = before_candidate
            self._fill_inputs(main, seed)
            self._launch(main, ORIGINAL, ORIGINAL, where, seed)
            if k == 0:
                original_state = self._state_changes(ORIGINAL, before_original)
            self._launch(main, CANDIDATE, CANDIDATE, where, seed)
            if k == 0:
                candidate_state = self._state_changes(CANDIDATE, before_candidate)
            self._launch(main, CANDIDATE, REPEAT, where, seed)
            again = self._compare(main, CANDIDATE, REPEAT)
            if again is not None:
                raise _Rejected("nondeterministic", f"{where}: two runs of the candidate on the same input disagree: {again.message}")
            bad = self._compare(main, ORIGINAL, CANDIDATE)
            if bad is not None:
                if k > 0 and self._elsewhere_matches(seed, where):
                    raise _Rejected("history_dependent", f"{where}: {bad.message}; the same inputs at fresh addresses, with the module's "
                                    f"variables as loaded, match: the candidate reuses state from earlier launches (a cache keyed by pointer or shape?)")
                raise self._mismatch(bad, where)
        self.writes_state = tuple(sorted(candidate_state - original_state))
        if self.writes_state:
            self._warn(f"the candidate writes module state the original does not ({', '.join(self.writes_state)}): "
                       "results were re-checked after unrelated launches")

        # Different addresses: a second allocation set while the first is alive, so no pointer repeats.
        other = self._buffers(None)
        try:
            if other.addresses(self.backend) & main.addresses(self.backend):
                raise LaunchFailed("the second set of buffers reuses addresses of the first")
            where = f"seed {first} at other addresses"
            bad = self._run_pair(other, first, where)
            if bad is not None:
                raise _Rejected("history_dependent", f"{where}: {bad.message}; the same inputs matched in the first buffers, "
                                "so the result depends on the addresses or on earlier launches")
        finally:
            self._free(other)

        for v in range(len(self.spec.variants)):
            buffers = self._buffers(v)
            try:
                where = f"seed {first}, variants[{v}] {dict(self.spec.variants[v])}"
                bad = self._run_pair(buffers, first, where)
                if bad is not None:
                    raise self._mismatch(bad, where)
            finally:
                self._free(buffers)

        if self.writes_state:
            # The launches above (other addresses, other sizes) are the unrelated history; the first seed must still match.
            where = f"seed {first} replayed after {2 + len(seeds) + len(self.spec.variants)} other launches"
            bad = self._run_pair(main, first, where)
            if bad is not None:
                raise _Rejected("history_dependent", f"{where}: {bad.message}; it matched on the first launch, so the module state "
                                f"the candidate keeps ({', '.join(self.writes_state)}) changes its results")
        self._launch_counts(main, first)

    def _launch_counts(self, main: _Buffers, seed: int) -> None:
        """Check 7: the candidate's output after runs of launches back to back, originals between the runs."""
        self._fill_inputs(main, seed)
        where = f"seed {seed}, launch counts"
        self._launch(main, ORIGINAL, ORIGINAL, where, seed)
        launched = 0
        for run, originals in LAUNCH_RUNS:
            for _ in range(originals):
                self._launch(main, ORIGINAL, ORIGINAL, where, seed)
            for _ in range(run):
                self._launch(main, CANDIDATE, CANDIDATE, where, seed)
            launched += run
            bad = self._compare(main, ORIGINAL, CANDIDATE)
            if bad is not None:
                raise _Rejected("history_dependent", f"seed {seed}, after {run} candidate launch{'es' if run > 1 else ''} in a row "
                                f"({launched} in this check, original launches between the runs): {bad.message}; the same "
                                "input matched on its first launches, so its results depend on how often or how it was launched before")

    # --- timing --------------------------------------------------------------------------------

    def measure(self, seed: int, options: TimingOptions) -> Outcome:
        """Interleaved timed trials of both kernels at the main size in :meth:`check`'s buffers, on unchanged and
        then on redrawn inputs, the timed launches checked; ``outcome.samples_ms`` (ms per launch):
        ``original``, ``candidate``, ``original_redrawn``, ``candidate_redrawn``."""
        return self._guarded(lambda: self._measure(seed, options), "while timing: ")

    def _measure(self, seed: int, options: TimingOptions) -> None:
        main = self.main if self.main is not None else self._buffers(None)
        self.main = main
        self._fill_inputs(main, seed)
        resolved = self.spec.resolve(None)
        args = {ORIGINAL: self._args(main, ORIGINAL), CANDIDATE: self._args(main, CANDIDATE)}
        restores: dict[str, list[tuple[str, Any, Any]]] = {}
        for which in (ORIGINAL, CANDIDATE):
            restores[which] = [("poison", a.slots[which], a.param.type) if a.param.role == "out" else ("copy", a.slots[which], a.pristine)
                               for a in main.arrays if a.param.role != "in"]
        key = (None, seed)
        limits_s = {ORIGINAL: self.limits.original_s, CANDIDATE: candidate_limit_s(self._original_ms.get(key), self.limits)}
        redrawable = self._redrawable(main)
        if not redrawable:
            self._warn("no input is drawn at random on the device (fills, files, host-drawn structures only): "
                       "the speedup was timed on unchanged inputs only")
        budget_s = options.budget_s / 2 if redrawable else options.budget_s
        # Which timed pairs are checked is drawn from the timing seed: the same every run, unknown to the candidate.
        rng = np.random.default_rng([seed, _CHECKED_PAIRS_STREAM])
        samples = self.outcome.samples_ms
        timer = self.backend.timer(args, restores, {ORIGINAL: resolved.original, CANDIDATE: resolved.candidate}, limits_s)
        try:
            for _ in range(options.warmup):
                timer.time_ms(ORIGINAL)
                timer.time_ms(CANDIDATE)
            for which, series in self._series(timer, main, options, budget_s, rng, "unchanged inputs", None).items():
                samples[which] = series
            if redrawable:
                def redraw(k: int) -> None:
                    self._redraw(main, REDRAW_SEEDS_FROM + (seed << 20) + k, redrawable)

                for which, series in self._series(timer, main, options, budget_s, rng, "inputs redrawn between pairs", redraw).items():
                    samples[f"{which}_redrawn"] = series
        finally:
            timer.close()

    def _series(self, timer: Timer, main: _Buffers, options: TimingOptions, budget_s: float, rng: np.random.Generator,
                name: str, redraw: Callable[[int], None] | None) -> dict[str, list[float]]:
        samples: dict[str, list[float]] = {ORIGINAL: [], CANDIDATE: []}
        start = self.clock()
        for trial in range(options.max_trials):
            if redraw is not None:
                redraw(trial)
            order = (ORIGINAL, CANDIDATE) if trial % 2 == 0 else (CANDIDATE, ORIGINAL)
            for which in order:
                samples[which].append(timer.time_ms(which))
            done = trial + 1 == options.max_trials or (trial + 1 >= options.min_trials and self.clock() - start >= budget_s)
            if trial == 0 or done or rng.random() < options.check_fraction:
                self._check_timed(main, f"timed pair {trial + 1} on {name}")
            if done:
                break
        return samples

    def _check_timed(self, main: _Buffers, where: str) -> None:
        """The candidate's output of the pair just timed against the original's of the same pair."""
        self.outcome.timed_checks += 1
        self._after_candidate(main, CANDIDATE, where, reason="timed_mismatch")
        bad = self._compare(main, ORIGINAL, CANDIDATE)
        if bad is not None:
            raise _Rejected("timed_mismatch", f"{where}: {bad.message}; the candidate passed every correctness check, so what was "
                            "timed is not what was checked (does it skip or replay work when launched again?)")

    def _redrawable(self, main: _Buffers) -> tuple[str, ...]:
        """Input arrays the device draws at random: those a fresh seed changes, at the cost of one generator launch."""
        env = {k: int(v) for k, v in self.spec.resolve(None).values.items() if isinstance(v, int)}
        sizes = {a.param.name: a.size for a in main.arrays}
        found = []
        for index, p in enumerate(self.spec.arrays):
            if p.role == "out":
                continue
            plan = device_plan(p, sizes[p.name], env, 0, index)
            if plan is not None and plan.kind in _RANDOM_KINDS and plan.size:
                found.append(p.name)
        return tuple(found)

    def _redraw(self, main: _Buffers, seed: int, names: Sequence[str]) -> None:
        """Fresh draws of ``names`` into the same buffers (host-drawn arrays such as a CSR structure keep theirs)."""
        env = {k: int(v) for k, v in self.spec.resolve(None).values.items() if isinstance(v, int)}
        by_name = {a.param.name: a for a in main.arrays}
        for index, p in enumerate(self.spec.arrays):
            if p.name not in names:
                continue
            a = by_name[p.name]
            plan = device_plan(p, a.size, env, seed, index)
            assert plan is not None
            self.backend.generate(a.pristine, plan, p.type)
            if a.work is not None:
                self.backend.copy(a.work, a.pristine)

    # --- sizes the spec does not name -------------------------------------------------------------

    def probe(self, seed: int, budget_s: float = PROBE_BUDGET_S) -> Outcome:
        """Candidate and original at sizes the spec does not name (:mod:`.sizes`); ``outcome.sizes_tried``.

        Sizes come nearest first (every scalar at -1, then at -3, ...); once the original's launches at them
        have taken ``budget_s``, the rest are left untried with a warning (a kernel whose original takes a
        second per launch would otherwise spend half a minute here). The original's time, not the wall
        time: which sizes are tried must not be the candidate's to choose by being slow."""
        plan = plan_probes(self.spec)
        for name, values in plan.untried.items():
            self._warn(f"{name}: {', '.join(map(str, values))} not tried (the arrays would outgrow the spec's buffers or the launch "
                       "would be invalid)")
        if plan.dropped:
            self._warn(f"sizes not tried (at most {len(plan.probes)} per verification): {', '.join(plan.dropped)}")
        return self._guarded(lambda: self._probe_all(plan.probes, seed, budget_s), "while trying other sizes: ")

    def _probe_all(self, probes: Sequence[Probe], seed: int, budget_s: float) -> None:
        main = self.main if self.main is not None else self._buffers(None)
        self.main = main
        self._fill_inputs(main, seed)
        # A probed size is no larger than the spec's: the original gets the candidate's allowance at the spec's size.
        original_limit_s = candidate_limit_s(self._original_ms.get((None, seed)), self.limits)
        self._probe_original_ms = 0.0
        for k, probe in enumerate(probes):
            if self._probe_original_ms > budget_s * 1000:
                self._warn(f"sizes not tried (the original's launches at other sizes took their {budget_s:g} s): "
                           f"{', '.join(p.label for p in probes[k:])}")
                return
            where = f"{probe.label} (a size the spec does not name; its {probe.name} = {probe.spec_value})"
            self._set_tails(main, probe)
            tried = self._probe_one(main, probe, where, original_limit_s)
            if tried is None:
                return
            if tried:
                self.outcome.sizes_tried.append(probe.label)
            self._fill_inputs(main, seed, probe.nan_tails)

    def _set_tails(self, main: _Buffers, probe: Probe) -> None:
        by_name = {a.param.name: a for a in main.arrays}
        for name in probe.nan_tails:
            a = by_name[name]
            self.backend.fill_tail(a.pristine, probe.sizes[name], INPUT_FLOAT_GUARD)
            if a.work is not None:
                self.backend.copy(a.work, a.pristine)

    def _probe_launch(self, main: _Buffers, which: str, slot: str, probe: Probe, limit_s: float) -> float:
        self._prepare_outputs(main, slot)
        scalars = {p.name: NUMPY_DTYPES[p.type].type(probe.values[p.name]) for p in self.spec.scalars}
        return self.backend.launch(which, self._args(main, slot, scalars), probe.original if which == ORIGINAL else probe.candidate, limit_s)

    def _original_at(self, main: _Buffers, slot: str, probe: Probe, where: str, limit_s: float) -> float | None:
        """The original's launch at a probe; None (with a warning) when it faulted or hung there."""
        try:
            ms = self._probe_launch(main, ORIGINAL, slot, probe, limit_s)
            self._probe_original_ms += ms
            return ms
        except LaunchTimeout:
            self.outcome.abandoned = True
            self._warn(f"{where}: the original did not finish within {limit_s:.3g} s; no further sizes were tried (not held against the candidate)")
        except LaunchFailed as exc:
            self._warn(f"{where}: the original fails ({exc}); no further sizes were tried (not held against the candidate)")
        return None

    def _probe_one(self, main: _Buffers, probe: Probe, where: str, original_limit_s: float) -> bool | None:
        """True: the candidate matched at the probe; False: skipped, the original misbehaves there; None: stop
        (the original faulted or hung, the context is gone). Raises :class:`_Rejected` for the candidate."""
        skipped = f"{where}: skipped, not held against the candidate:"
        original_ms = self._original_at(main, ORIGINAL, probe, where, original_limit_s)
        if original_ms is None:
            return None
        problems = self._guard_problems(main, ORIGINAL) + self._modified_inputs(main)
        if problems:
            self._warn(f"{skipped} the original writes out of range or into its input there: {problems[0]}")
            return False
        limit_s = candidate_limit_s(original_ms, self.limits)
        try:
            self._probe_launch(main, CANDIDATE, CANDIDATE, probe, limit_s)
        except LaunchTimeout:
            self.outcome.abandoned = True
            raise self._timeout(where, limit_s, original_ms) from None
        except LaunchFailed as exc:
            raise _Rejected("launch_error", f"{where}: the candidate failed: {exc}; the original runs at this size") from None
        self._after_candidate(main, CANDIDATE, where, reason="size_dependent")
        bad = self._compare(main, ORIGINAL, CANDIDATE, merge=False)
        if bad is None:
            return True
        # Before holding it against the candidate: the original must give one answer at this size and keep within it.
        if self._original_at(main, REPEAT, probe, where, original_limit_s) is None:
            return None
        again = self._compare(main, ORIGINAL, REPEAT, merge=False)
        if again is not None:
            self._warn(f"{skipped} two runs of the original disagree there: {again.message}")
            return False
        outside = self._written_past(main, ORIGINAL, probe)
        if outside:
            self._warn(f"{skipped} the original writes past the size its spec expressions give there: {outside[0]}")
            return False
        past = self._written_past(main, CANDIDATE, probe)
        detail = f"; it writes past the end the spec's size expression gives there: {past[0]}" if past else ""
        raise _Rejected("size_dependent", f"{where}: {bad.message}{detail}; the original gives one answer there, so the candidate "
                        "assumes something of the sizes that the spec's own size hides (a multiple of a vector width or a tile?)")

    def _written_past(self, main: _Buffers, slot: str, probe: Probe) -> list[str]:
        """Outputs whose elements past the probe's size were written (they start as poison or as the input)."""
        found = []
        for a in main.arrays:
            end = probe.sizes[a.param.name]
            if a.param.role == "in" or end >= a.size:
                continue
            tail = self.backend.download(a.slots[slot])[end:]
            if a.param.role == "out":
                written = ~poison_mask(tail, a.param.type)
            else:
                before = self.backend.download(a.pristine)[end:]
                written = (tail.view(np.uint8).reshape(tail.size, -1) != before.view(np.uint8).reshape(before.size, -1)).any(axis=1)
            if written.any():
                first = int(np.flatnonzero(written)[0])
                found.append(f"'{a.param.name}' has {int(written.sum())} elements written from index {end} on (first at {a.param.name}[{end + first}])")
        return found

    def close(self) -> None:
        if self.main is not None:
            self._free(self.main)
            self.main = None
