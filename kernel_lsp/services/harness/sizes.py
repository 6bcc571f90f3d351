"""Sizes the spec does not name: which scalars the harness varies, to which values, and where each fits.

A candidate can be right at the spec's sizes and wrong elsewhere (float4 loads with no scalar tail
are right only when n is a multiple of 4; a 32x32 tile with no edge checks only when both sizes are
multiples of 32). The harness therefore tries other values of every integer scalar that sizes an
array or the grid, one scalar at a time (so each dimension of a 2-D or 3-D problem separately):
one and three below the spec's value, an odd value near half of it and a small one.

Every probe runs in the buffers allocated for the spec's own size: only the scalar arguments and
the launch (re-evaluated from the spec's grid and block expressions) change. A probe is tried only
where every array it needs fits in its allocation and both launches are valid; the rest of each
allocation is left to the red-zone and poison checks (:mod:`.protocol`). Pure: no device, no IO.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kernel_lsp.core import expr
from kernel_lsp.core.spec import FLOAT_TYPES, Launch, Spec

#: Most probes per verification: the values one and three below the spec's of up to 8 scalars.
MAX_PROBES = 16
#: The "small" value tried: below a warp and a float4 multiple, above the trivial 1.
SMALL = 5
#: Initializers whose values depend on scalar arguments (indices, CSR structure): drawn for the spec's
#: size, their values may point past a smaller probed size, so the arrays they index keep real values there.
_INDEX_INITS = frozenset(("randint", "perm", "csr_rowptr", "csr_colidx"))
_MAX_THREADS_PER_BLOCK = 1024


@dataclass(frozen=True)
class Probe:
    """One size the spec does not name: one scalar at another value, everything else as in the spec."""

    name: str
    value: int
    spec_value: int
    values: Mapping[str, int | float]
    """Every scalar argument at this probe."""
    sizes: Mapping[str, int]
    """Element counts the arrays have at this probe (each at most its allocation at the spec's size)."""
    original: Launch
    candidate: Launch
    nan_tails: tuple[str, ...]
    """Float input arrays whose elements past their probed size are set to the NaN red-zone pattern for
    this probe, so a read past the probed size shows in the output as it would past an allocation."""

    @property
    def label(self) -> str:
        return f"{self.name} = {self.value}"


@dataclass(frozen=True)
class ProbePlan:
    probes: tuple[Probe, ...]
    sizing: tuple[str, ...]
    """Integer scalars that size an array or the grid, in parameter order (``fixed`` ones excluded)."""
    fixed: tuple[str, ...]
    untried: Mapping[str, tuple[int, ...]]
    """Per scalar, the values that did not fit the spec's buffers or gave no valid launch."""
    dropped: tuple[str, ...]
    """Probes past :data:`MAX_PROBES`, by label."""


def _names(text: str) -> frozenset[str]:
    return expr.names(expr.parse(text))


def sizing_scalars(spec: Spec) -> tuple[str, ...]:
    """The integer scalars that appear in an array's size or in a grid expression (of the original's
    launch or the candidate's) and in no block expression.

    A scalar in a block expression chooses how the work is divided, not how much there is: at another
    value an original may legitimately compute something else (a tree reduction that needs a power of
    two), which is no fault of a candidate.
    """
    sized: set[str] = set()
    for a in spec.arrays:
        sized |= _names(a.size)
    blocked: set[str] = set()
    for config in (spec.launch, spec.candidate_launch):
        for text in config.grid:
            sized |= _names(text)
        for text in config.block:
            blocked |= _names(text)
    return tuple(p.name for p in spec.scalars if p.type not in FLOAT_TYPES and p.name in sized - blocked)


def probe_values(spec_value: int) -> tuple[int, ...]:
    """Other values of a scalar whose spec value is ``spec_value``: -1, -3, odd near half, small; each
    at least 1 and below the spec's value (so the arrays it sizes usually fit), without repeats."""
    half_odd = (spec_value // 2) | 1
    found: list[int] = []
    for value in (spec_value - 1, spec_value - 3, half_odd, SMALL):
        if 1 <= value < spec_value and value not in found:
            found.append(value)
    return tuple(found)


def _launch_ok(launch: Launch, main: Launch) -> bool:
    if min(launch.grid) < 1 or min(launch.block) < 1 or math.prod(launch.block) > _MAX_THREADS_PER_BLOCK:
        return False
    return 0 <= launch.dynamic_smem_bytes <= max(main.dynamic_smem_bytes, 48 * 1024)


def _probe(spec: Spec, name: str, value: int, allocated: Mapping[str, int], main_launches: tuple[Launch, Launch]) -> Probe | None:
    values = {**spec.values(), name: value}
    env = {p.name: int(values[p.name]) for p in spec.scalars if p.type not in FLOAT_TYPES}
    try:
        sizes = {a.name: expr.evaluate(a.size, env) for a in spec.arrays}
        launches = []
        for config in (spec.launch, spec.candidate_launch):
            launches.append(Launch(tuple(expr.evaluate(e, env) for e in config.grid), tuple(expr.evaluate(e, env) for e in config.block),  # type: ignore[arg-type]
                                   expr.evaluate(config.dynamic_smem, env)))
    except expr.ExprError:
        return None
    if any(not 0 <= sizes[a] <= allocated[a] for a in sizes):
        return None
    if not all(_launch_ok(launch, main) for launch, main in zip(launches, main_launches)):
        return None
    indexed = any(a.role != "out" and a.type not in FLOAT_TYPES and a.init.kind in _INDEX_INITS
                  and any(name in _names(arg) for arg in a.init.args) for a in spec.arrays)
    tails = () if indexed else tuple(a.name for a in spec.arrays
                                     if a.role != "out" and a.type in FLOAT_TYPES and sizes[a.name] < allocated[a.name])
    return Probe(name, value, int(spec.values()[name]), values, sizes, launches[0], launches[1], tails)


def plan_probes(spec: Spec) -> ProbePlan:
    """The probes of ``spec``: for each value rank (-1 first), every sizing scalar at that rank."""
    resolved = spec.resolve(None)
    fixed = tuple(n for n in spec.fixed)
    sizing = tuple(n for n in sizing_scalars(spec) if n not in fixed)
    main_values = spec.values()
    candidates = {n: probe_values(int(main_values[n])) for n in sizing}
    probes: list[Probe] = []
    untried: dict[str, list[int]] = {}
    for rank in range(max((len(v) for v in candidates.values()), default=0)):
        for name in sizing:
            if rank >= len(candidates[name]):
                continue
            value = candidates[name][rank]
            probe = _probe(spec, name, value, resolved.sizes, (resolved.original, resolved.candidate))
            if probe is None:
                untried.setdefault(name, []).append(value)
            else:
                probes.append(probe)
    return ProbePlan(tuple(probes[:MAX_PROBES]), sizing, fixed, {k: tuple(v) for k, v in untried.items()},
                     tuple(p.label for p in probes[MAX_PROBES:]))
