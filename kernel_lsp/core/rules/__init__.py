"""Deterministic rewrite rules: the embedded candidate generator.

Every rule is a transformation over the kernel model (:mod:`kernel_lsp.core.transforms`): the facts of
the access analysis it needs, a legality check on them, the rewrite, and a refusal that names the
missing fact.

Public API::

    RULES                                   # every rule, in default order
    evaluate(source, kernel, spec) -> list[RuleOutcome]   # each rule's preconditions and rewrites
    RuleGenerator(rules=RULES)              # a CandidateGenerator (kernel_lsp.core.candidates)

Pure: rules read the source, the kernel index and the launch spec; they never
compile or run anything. Each rule's ``technique`` is a name from
``kernel_lsp/data/techniques.json`` so the knowledge base learns from rule outcomes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernel_lsp.core.candidates import Candidate, OptimizeRequest
from kernel_lsp.core.index import KernelIndex, build_index
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.source import Preprocessed, preprocess
from kernel_lsp.core.spec import Spec, SpecError, parse_spec, relaunched
from kernel_lsp.core.transforms.block_reduce import AtomicToBlockReduce, TreeToRegisters, TreeToShuffle
from kernel_lsp.core.transforms.coarsen_reduce import TreeCoarsen
from kernel_lsp.core.transforms.columns_per_warp import ColumnsPerWarp
from kernel_lsp.core.transforms.elementwise import BlockSizeSweep, GridStride, VectorizeElementwise
from kernel_lsp.core.transforms.fixed_trip import FixedTripUnroll
from kernel_lsp.core.transforms.index_swap import IndexSwap
from kernel_lsp.core.transforms.load_batch import LoadBatch
from kernel_lsp.core.transforms.more_parallelism import FullerBlocks, SectorPerRow, SmallerBlocks, SplitLoop
from kernel_lsp.core.transforms.privatize import SharedPrivatize
from kernel_lsp.core.transforms.qualifiers import LaunchBounds, PragmaUnroll, ReadOnlyLoads, RestrictConst
from kernel_lsp.core.transforms.register_accumulate import RegisterAccumulate
from kernel_lsp.core.transforms.row_cache import RowCache
from kernel_lsp.core.transforms.split_reduction import SplitReduction
from kernel_lsp.core.transforms.split_scan import RowScan, SplitScan
from kernel_lsp.core.transforms.shared_tile import SharedTileLoad, SharedTileStore, SharedTileTranspose
from kernel_lsp.core.transforms.stencil_reuse import StencilRowReuse
from kernel_lsp.core.transforms.stencil_window import StencilWindow
from kernel_lsp.core.transforms.store_forward import StoreForward
from kernel_lsp.core.transforms.tile_contraction import TileContraction
from kernel_lsp.core.transforms.tiled_coarsen import TiledCoarsen
from kernel_lsp.core.transforms.warp_aggregate import WarpAggregate
from kernel_lsp.core.transforms.warp_columns import WarpColumns
from kernel_lsp.core.transforms.warp_per_row import BlockPerRow, WarpPerRow

#: Default order: the transformations that restructure the kernel (large wins where they apply) first,
#: then launch changes and local edits.
RULES: tuple[Rule, ...] = (
    TileContraction(),
    TiledCoarsen(),
    RegisterAccumulate(),
    StoreForward(),
    WarpPerRow(),
    RowScan(),
    SectorPerRow(),
    SplitLoop(),
    SplitScan(),
    SplitReduction(),
    BlockPerRow(),
    StencilRowReuse(),
    StencilWindow(),
    ColumnsPerWarp(),
    WarpColumns(),
    TreeToShuffle(),
    TreeToRegisters(),
    TreeCoarsen(),
    AtomicToBlockReduce(),
    SharedPrivatize(),
    WarpAggregate(),
    SharedTileTranspose(),
    SharedTileStore(),
    SharedTileLoad(),
    VectorizeElementwise(),
    FixedTripUnroll(),
    RowCache(),
    LoadBatch(),
    IndexSwap(),
    GridStride(),
    SmallerBlocks(),
    FullerBlocks(),
    BlockSizeSweep(),
    RestrictConst(),
    ReadOnlyLoads(),
    LaunchBounds(),
    PragmaUnroll(),
)

#: Transformations driven by the access analysis, which may follow one another in a sequence.
COMPOSABLE = frozenset({"register-accumulate", "warp-per-row", "split-loop", "sector-per-row", "block-per-row",
                        "tile-contraction", "fixed-trip-unroll", "tree-to-shuffle", "tree-to-registers",
                        "atomic-to-block-reduce", "shared-privatize", "shared-tile-store", "shared-tile-load",
                        "columns-per-warp", "warp-aggregate",
                        "stencil-shared-window", "tiled-register-block", "split-reduction", "row-cache",
                        "store-forward"})
#: Launch changes tried after any step of a sequence (never before one: the code steps are listed first on
#: their own): an under-filled grid spread over more SMs multiplies what the step before gained per thread.
LAUNCH_STEPS = frozenset({"smaller-blocks"})
#: Later steps tried after a step that makes them possible, besides the composable ones: a value kept in a
#: register for the next iteration (store-forward), or an element kept in a register across the loop
#: (register-accumulate), takes the store off the path of the loop's loads, so a load batch can make them
#: ahead. Such a step alone may gain nothing: its follower is tried once it verified correct, faster or not
#: (``Candidate.after_correct``), as is any later step whose rule refused the original kernel. After other
#: steps a batch would only crowd out their own sequences within the candidate budget.
FOLLOWED_BY: Mapping[str, frozenset[str]] = {"store-forward": frozenset({"load-batch"}),
                                             "register-accumulate": frozenset({"load-batch"})}
#: Rules whose rewrite needs a launch of its own (a spec ``candidate`` field) and may still be the first
#: step of a sequence: the later steps see that launch as the kernel's (the output's rows on y, then
#: the tiles of its dot product).
RELAUNCHING_FIRST_STEPS = frozenset({"index-swap"})
#: The longest sequence of transformations tried (KernelBlaster: depth beyond 4 steps gave little).
MAX_STEPS = 3

__all__ = ["RULES", "Rewrite", "Rule", "RuleContext", "RuleGenerator", "RuleOutcome", "evaluate", "rule_by_name"]


@dataclass(frozen=True)
class RuleOutcome:
    rule: str
    technique: str
    applicable: bool
    why: str
    """The precondition's reason: what was proven, or what was not."""
    rewrites: tuple[Rewrite, ...] = ()


def rule_by_name(name: str) -> Rule | None:
    return next((r for r in RULES if r.name == name), None)


def _spec_of(spec: Spec | Mapping[str, Any] | None) -> Spec | None:
    if spec is None or isinstance(spec, Spec):
        return spec
    try:
        return parse_spec(spec)
    except SpecError:
        return None


def evaluate(
    source: str,
    kernel: str,
    spec: Spec | Mapping[str, Any] | None,
    rules: Sequence[Rule] = RULES,
    index: KernelIndex | None = None,
    preprocessed: Preprocessed | None = None,
) -> list[RuleOutcome]:
    """Every rule's verdict on ``kernel`` in ``source``: refused with a reason, or its rewrites.

    ``preprocessed``: the file's view with its local headers expanded (the session's); without it the
    file is preprocessed on its own."""
    pre = preprocessed if preprocessed is not None else preprocess(source)
    # The index reads the kernels that macros write or fill from their expansion (``const float* RESTRICT x``), as
    # the analysis does.
    index = index if index is not None else build_index(source, pre)
    fn = next((f for f in index.kernels if f.name == kernel), None)
    if fn is None:
        return [RuleOutcome(r.name, r.technique, False, f"no __global__ function named {kernel}") for r in rules]
    ctx = RuleContext(source, index, fn, _spec_of(spec), pre)
    out = []
    for rule in rules:
        try:
            ok, why = rule.preconditions(ctx)
            rewrites = rule.apply(ctx) if ok else ()
        except Exception as exc:  # noqa: BLE001 - one rule's defect must not end the search or the server's request
            out.append(RuleOutcome(rule.name, rule.technique, False,
                                   f"the rule failed on this kernel (a defect in kernel-lsp: {type(exc).__name__}: {exc})"))
            continue
        if ok and not rewrites:
            ok, why = False, f"{why}; but it formed no candidate that differs from the original"
        out.append(RuleOutcome(rule.name, rule.technique, ok, why, rewrites))
    return out


def _relative_launch(rw: Rewrite | Candidate) -> bool:
    """The rewrite changes the launch relative to the host's (more blocks, another block, fewer blocks)."""
    return rw.grid_scale is not None or rw.block is not None or rw.grid_divide is not None


class RuleGenerator:
    """Candidates from the applicable rules, in the knowledge base's technique order.

    Rules whose technique the request's hints name come first, in the hints'
    order; the others follow in :data:`RULES` order. ``outcomes`` keeps the
    last request's per-rule reasons (for ``--dry-run`` listings).
    """

    name = "rules"

    def __init__(self, rules: Sequence[Rule] = RULES, preprocessed: Preprocessed | None = None,
                 reprocess: Callable[[str], Preprocessed] | None = None, max_steps: int = MAX_STEPS):
        """``preprocessed``: the request file's preprocessed view, when the caller has it (headers expanded);
        ``reprocess(text)``: the same view of a rewritten text of that file (for the later steps of a
        sequence); ``max_steps``: the longest sequence of transformations tried."""
        self.rules = tuple(rules)
        self.preprocessed = preprocessed
        self.reprocess = reprocess
        self.max_steps = max_steps
        self.outcomes: list[RuleOutcome] = []
        self._refused: set[str] = set()
        """Rules that refused the request's kernel: a sequence's step by one of them was made possible by the
        steps before it, and follows them once they verified correct, faster or not."""

    def ordered(self, request: OptimizeRequest) -> list[Rule]:
        rank = {hint.name: i for i, hint in enumerate(request.techniques)}
        default = {rule.name: i for i, rule in enumerate(self.rules)}
        return sorted(self.rules, key=lambda r: (rank.get(r.technique, len(rank)), default[r.name]))

    def generate(self, request: OptimizeRequest) -> Iterator[Candidate]:
        pre = self.preprocessed
        if pre is not None and posixpath.normpath(pre.path) != posixpath.normpath(request.path) and not pre.path.endswith(
                "/" + posixpath.normpath(request.path)):
            pre = None
        self.outcomes = evaluate(request.source, request.kernel, request.spec, self.ordered(request), preprocessed=pre)
        self._refused = {o.rule for o in self.outcomes if not o.applicable}
        seen: set[tuple[str, str]] = set()
        # A step that is not composable is followed by the launch steps only after every single step, so the
        # pairs never crowd a transformation out of the candidate budget.
        relaunch_later: list[tuple[Candidate, str]] = []
        for outcome in self.outcomes:
            for rw in outcome.rewrites:
                key = (rw.source, repr(sorted((rw.launch_override or {}).items())))
                if key in seen:
                    continue
                seen.add(key)
                name = f"rule:{outcome.rule}" + (f"[{rw.variant}]" if rw.variant else "")
                candidate = Candidate(request.kernel, rw.source, outcome.technique, name, rw.description, rw.launch_override,
                                      grid_scale=rw.grid_scale, block=rw.block, grid_divide=rw.grid_divide)
                yield candidate
                if outcome.rule in COMPOSABLE and not rw.launch_override:
                    yield from self._sequences(request, candidate, (outcome.rule,), seen)
                elif outcome.rule in COMPOSABLE and _relative_launch(rw) or (
                        outcome.rule in RELAUNCHING_FIRST_STEPS and rw.launch_override and not _relative_launch(rw)):
                    yield from self._sequences(request, candidate, (outcome.rule,), seen, rw.launch_override)
                elif not rw.launch_override and outcome.rule not in LAUNCH_STEPS:
                    relaunch_later.append((candidate, outcome.rule))
        for candidate, rule in relaunch_later:
            yield from self._sequences(request, candidate, (rule,), seen, only=LAUNCH_STEPS)

    def _sequences(self, request: OptimizeRequest, base: Candidate, done: tuple[str, ...],
                   seen: set[tuple[str, str]], launch: Mapping[str, Any] | None = None,
                   only: frozenset[str] | None = None) -> Iterator[Candidate]:
        """Sequences that extend ``base``, depth first, right after it: a transformation that prepares the
        kernel (an element kept in a register) can let a later one apply (a warp per row then sees no
        loop-invariant store). Each is tried only once ``base`` was accepted (``Candidate.after``), so every
        intermediate step is verified. ``launch``: the launch ``base`` needs instead of the spec's (its
        ``candidate`` field); the later steps see it as the launch, so a step that scales the launch
        relative to the host's cannot follow, and one with a launch of its own replaces it. A ``base`` that
        changes the launch relative to the host's (a warp per row: 32 times the blocks) is followed only by
        steps that keep the launch, and they keep its change of the host's launch. The later steps are the
        composable transformations, the launch steps (:data:`LAUNCH_STEPS`) and what the last step makes
        worth trying (:data:`FOLLOWED_BY`); ``only``: these rules instead, as the last step."""
        if len(done) >= self.max_steps:
            return
        view = self.reprocess(base.source) if self.reprocess is not None else None
        follow = only if only is not None else COMPOSABLE | LAUNCH_STEPS | FOLLOWED_BY.get(done[-1], frozenset())
        later = [r for r in self.rules if r.name in follow and r.name not in done]
        spec = request.spec if launch is None or request.spec is None else relaunched(request.spec, launch)
        relative = _relative_launch(base)
        for outcome in evaluate(base.source, request.kernel, spec, later, preprocessed=view):
            for rw in outcome.rewrites:
                if launch is not None and (_relative_launch(rw) or relative and rw.launch_override):
                    continue
                # A later step's own launch was computed from ``spec``, which has ``launch`` already.
                override = rw.launch_override or launch
                key = (rw.source, repr(sorted((override or {}).items())))
                if key in seen:
                    continue
                seen.add(key)
                sequence = (*done, outcome.rule)
                name = f"{base.generator}+{outcome.rule}" + (f"[{rw.variant}]" if rw.variant else "")
                scaled = base if relative else rw
                candidate = Candidate(request.kernel, rw.source, outcome.technique, name,
                                      f"{base.description}; then {rw.description}", override,
                                      grid_scale=scaled.grid_scale, block=scaled.block, grid_divide=scaled.grid_divide,
                                      after=base.generator,
                                      after_correct=outcome.rule in FOLLOWED_BY.get(done[-1], frozenset())
                                      or outcome.rule in self._refused)
                yield candidate
                if override is None:
                    yield from self._sequences(request, candidate, sequence, seen)
                elif not _relative_launch(rw):
                    yield from self._sequences(request, candidate, sequence, seen, override)
