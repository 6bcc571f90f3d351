"""The profiling tree: which Nsight Compute metrics are worth collecting for a kernel.

Full profiles are slow and more metrics do not mean better advice (AutoProfiler,
"Less is more"), so a small decision tree picks, per kernel, what to collect.

Format (``kernel_lsp/data/profiling_tree.json``, ``"format": "kernel-lsp-profiling-tree"``,
``"version": 2``; version 1 files, which name sections only, are read too)::

    {"format": ..., "version": 2, "name": "default", "doc": "...",
     "first_pass": ["group:throughput"],
     "unmeasured": "missing",
     "budget": {"max_passes": 20},
     "root": "NODE_ID",
     "nodes": {
        "NODE_ID": {"feature": "sig.memory_throughput_pct", "op": ">=", "threshold": 60,
                    "then": "ID", "else": "ID", "missing": "ID", "doc": "..."},
        "LEAF_ID": {"collect": ["group:pipes", "SourceCounters"], "metrics": [], "doc": "..."}}}

A collection *item* is either an ncu section (``SourceCounters``: ``--section``)
or a metric group (``group:NAME``, :mod:`kernel_lsp.core.metric_groups`:
``--metrics``). Groups are the cheap unit: a run that names no section applies
no rules and writes no report, so it is read straight from ncu's output.

A test node compares one *fact* with a threshold (``>=`` or ``<``) and names the
node to go to when it holds (``then``), fails (``else``) and when the fact is
unknown (``missing``, default ``else``). Facts are flat ``name -> float``:

* ``sig.KEY``    a signature key (:mod:`kernel_lsp.core.signature`) computed from the
                 metrics collected so far (first pass, or the previous profile);
* ``derived.NAME`` a quantity of two measured values: ``max_throughput_pct`` (the larger of
                 memory and SM throughput), ``memory_minus_sm_pct``;
* ``metric.NAME`` a raw ncu metric collected so far;
* ``static.NAME`` a static feature of the kernel's source (``core/features.py``);
* ``ptxas.NAME``  a number from ptxas (``registers``, ``spill_bytes``, ``smem_bytes``).

A leaf names the items (in priority order) and extra metrics to collect
next; the budget caps the replay passes of that collection (lowest-priority
items dropped first). Walking the tree is pure and records its path. A leaf with
``"state_from": "source"`` tells the optimizer to rank its kernels' techniques from
the static analysis' state (:mod:`kernel_lsp.core.static_state`) instead of the
profile's signature: tree learning puts such leaves where, on its training kernels,
the profile led the optimizer's ranking astray.

Measured facts come from the previous profile of the kernel, so a repeat profile
is one ncu run: the first-pass sections plus the chosen leaf's (the first pass is
collected again, to classify and time the new code). A kernel's first profile has
no measured facts: with ``"unmeasured": "missing"`` the tests take their
``missing`` branches (still one run); with ``"first_pass"`` the first pass runs
alone and the tree is walked on its results (two runs: fewer passes, but every
ncu run costs ~1.7 s of start-up on the recorded H200, see ``data/ncu_sections.json``).

:func:`refine` improves a tree on a dataset of full profiles by REWRITE edits
(a threshold, a leaf's sections) and SPLIT edits (a leaf becomes a test with two
leaves), each accepted only when it raises the score: agreement between the
bottleneck class decided from the tree-chosen metrics and the class from the
full profile, minus a cost term for the profiling seconds (AutoProfiler's
accept-on-improvement loop, with deterministic proposals).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kernel_lsp.core import classify as C
from kernel_lsp.core import profile as P
from kernel_lsp.core.features import static_features
from kernel_lsp.core.index import Function
from kernel_lsp.core.metric_groups import GROUPS

FORMAT = "kernel-lsp-profiling-tree"
VERSION = 2
READS_VERSIONS = (1, 2)
GROUP_PREFIX = "group:"
OPS = (">=", "<")
#: Where the optimizer takes a kernel's knowledge-base state from when its profile ended at a leaf:
#: the profile's signature (``profile``, the default) or the source's static analysis (``source``).
STATE_FROM = ("profile", "source")
UNMEASURED = ("missing", "first_pass")
FACT_PREFIXES = ("sig.", "derived.", "metric.", "static.", "ptxas.")
#: Facts known only after an ncu run (the first pass or a previous profile).
MEASURED_PREFIXES = ("sig.", "derived.", "metric.")


class TreeError(ValueError):
    """A tree file that cannot be used; ``errors`` lists every problem."""

    def __init__(self, errors: Sequence[str]):
        self.errors = tuple(errors)
        super().__init__("invalid profiling tree: " + "; ".join(self.errors))


@dataclass(frozen=True)
class Test:
    id: str
    feature: str
    op: str
    threshold: float
    then: str
    else_: str
    missing: str | None = None
    """Where to go when the fact is unknown; None means ``else``."""
    doc: str = ""

    def holds(self, value: float) -> bool:
        return value >= self.threshold if self.op == ">=" else value < self.threshold


@dataclass(frozen=True)
class Leaf:
    id: str
    collect: tuple[str, ...]
    """Items (sections, ``group:NAME``) to collect next, most important first."""
    metrics: tuple[str, ...] = ()
    """Extra metrics to collect next (``--metrics``)."""
    doc: str = ""
    state_from: str = "profile"
    """``source``: the optimizer ranks this leaf's kernels from the static analysis' state, not from the
    profile's signature (learned where the profile misleads the ranking, :mod:`kernel_lsp.core.tree_learning`)."""


Node = Test | Leaf


@dataclass(frozen=True)
class Tree:
    name: str
    first_pass: tuple[str, ...]
    root: str
    nodes: Mapping[str, Node]
    max_passes: int | None = None
    """Budget for the leaf's collection, in replay passes; None: no cap."""
    max_seconds: float | None = None
    """Budget for the leaf's collection, in estimated seconds; None: no cap."""
    doc: str = ""
    version: int = VERSION
    unmeasured: str = "missing"
    """With no measured facts yet (no previous profile): ``missing`` walks the tests'
    ``missing`` branches and collects in one run; ``first_pass`` runs the first pass
    alone, then walks on its results (two runs)."""

    def node(self, node_id: str) -> Node:
        return self.nodes[node_id]

    def leaves(self) -> tuple[Leaf, ...]:
        return tuple(n for n in self.nodes.values() if isinstance(n, Leaf))

    def tests(self) -> tuple[Test, ...]:
        return tuple(n for n in self.nodes.values() if isinstance(n, Test))


# --------------------------------------------------------------------------- JSON


def parse_tree(data: Mapping[str, Any] | str) -> Tree:
    """Validate a tree object (or its JSON text); raises :class:`TreeError` listing every problem."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise TreeError([f"not JSON: {exc}"]) from None
    if not isinstance(data, Mapping):
        raise TreeError(["a tree must be a JSON object"])
    errors: list[str] = []
    if data.get("format") != FORMAT:
        errors.append(f"format: expected '{FORMAT}'")
    if data.get("version") not in READS_VERSIONS:
        errors.append(f"version: this kernel-lsp reads versions {', '.join(map(str, READS_VERSIONS))}, "
                      f"got {data.get('version')!r}")
    first_pass = data.get("first_pass")
    if not isinstance(first_pass, list) or not all(isinstance(s, str) for s in first_pass):
        errors.append("first_pass: expected a list of section names or group:NAME items")
        first_pass = []
    errors.extend(f"first_pass: {problem}" for problem in _item_errors(first_pass))
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, Mapping) or not raw_nodes:
        raise TreeError(errors + ["nodes: expected a non-empty object"])
    nodes: dict[str, Node] = {}
    for node_id, raw in raw_nodes.items():
        node = _parse_node(str(node_id), raw, errors)
        if node is not None:
            nodes[node.id] = node
    root = data.get("root")
    if root not in raw_nodes:
        errors.append(f"root: unknown node {root!r}")
    for node in nodes.values():
        if isinstance(node, Test):
            for branch in (node.then, node.else_, node.missing):
                if branch is not None and branch not in raw_nodes:
                    errors.append(f"nodes.{node.id}: unknown branch target {branch!r}")
    budget = data.get("budget", {})
    max_passes = budget.get("max_passes") if isinstance(budget, Mapping) else None
    max_seconds = budget.get("max_seconds") if isinstance(budget, Mapping) else None
    if max_passes is not None and (not isinstance(max_passes, int) or max_passes < 1):
        errors.append("budget.max_passes: expected a positive integer")
    if max_seconds is not None and (not isinstance(max_seconds, (int, float)) or max_seconds <= 0):
        errors.append("budget.max_seconds: expected a positive number")
    unmeasured = data.get("unmeasured", "missing")
    if unmeasured not in UNMEASURED:
        errors.append(f"unmeasured: expected one of {', '.join(UNMEASURED)}")
    if not errors:
        errors.extend(_cycle_errors(str(root), nodes))
    if errors:
        raise TreeError(errors)
    return Tree(
        name=str(data.get("name", "unnamed")),
        first_pass=tuple(first_pass),
        root=str(root),
        nodes=nodes,
        max_passes=max_passes,
        max_seconds=None if max_seconds is None else float(max_seconds),
        doc=str(data.get("doc", "")),
        unmeasured=str(unmeasured),
    )


def _parse_node(node_id: str, raw: Any, errors: list[str]) -> Node | None:
    where = f"nodes.{node_id}"
    if not isinstance(raw, Mapping):
        errors.append(f"{where}: expected an object")
        return None
    doc = str(raw.get("doc", ""))
    if "collect" in raw:
        collect, metrics = raw.get("collect"), raw.get("metrics", [])
        if not isinstance(collect, list) or not all(isinstance(s, str) for s in collect):
            errors.append(f"{where}.collect: expected a list of section names or group:NAME items")
            return None
        errors.extend(f"{where}.collect: {problem}" for problem in _item_errors(collect))
        if not isinstance(metrics, list) or not all(isinstance(s, str) for s in metrics):
            errors.append(f"{where}.metrics: expected a list of metric names")
            return None
        state_from = raw.get("state_from", "profile")
        if state_from not in STATE_FROM:
            errors.append(f"{where}.state_from: expected one of {', '.join(STATE_FROM)}")
            return None
        return Leaf(node_id, tuple(collect), tuple(metrics), doc, state_from)
    feature, op, threshold = raw.get("feature"), raw.get("op"), raw.get("threshold")
    ok = True
    if not isinstance(feature, str) or not feature.startswith(FACT_PREFIXES):
        errors.append(f"{where}.feature: expected a name starting with one of {', '.join(FACT_PREFIXES)}")
        ok = False
    if op not in OPS:
        errors.append(f"{where}.op: expected one of {', '.join(OPS)}")
        ok = False
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        errors.append(f"{where}.threshold: expected a finite number")
        ok = False
    for key in ("then", "else"):
        if not isinstance(raw.get(key), str):
            errors.append(f"{where}.{key}: expected a node id")
            ok = False
    if not ok:
        return None
    missing = raw.get("missing")
    return Test(node_id, feature, op, float(threshold), raw["then"], raw["else"], missing, doc)


def _item_errors(items: Iterable[str]) -> list[str]:
    return [
        f"unknown metric group {item!r} (known: {', '.join(sorted(GROUPS))})"
        for item in items
        if item.startswith(GROUP_PREFIX) and item.removeprefix(GROUP_PREFIX) not in GROUPS
    ]


def split_items(items: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(sections, metrics) of a collection: groups expand to their metrics, in order, without repeats."""
    sections: list[str] = []
    metrics: list[str] = []
    for item in items:
        if item.startswith(GROUP_PREFIX):
            metrics.extend(GROUPS.get(item.removeprefix(GROUP_PREFIX), ()))
        else:
            sections.append(item)
    return tuple(dict.fromkeys(sections)), tuple(dict.fromkeys(metrics))


def _cycle_errors(root: str, nodes: Mapping[str, Node]) -> list[str]:
    seen: set[str] = set()
    stack = [(root, frozenset())]
    while stack:
        node_id, ancestors = stack.pop()
        if node_id in ancestors:
            return [f"nodes.{node_id}: the tree loops back to this node"]
        seen.add(node_id)
        node = nodes[node_id]
        if isinstance(node, Test):
            for target in {node.then, node.else_, node.missing or node.else_}:
                stack.append((target, ancestors | {node_id}))
    unreachable = sorted(set(nodes) - seen)
    return [f"nodes.{n}: unreachable from the root" for n in unreachable]


def tree_to_json(tree: Tree) -> dict[str, Any]:
    nodes: dict[str, Any] = {}
    for node in tree.nodes.values():
        if isinstance(node, Leaf):
            entry: dict[str, Any] = {"collect": list(node.collect)}
            if node.metrics:
                entry["metrics"] = list(node.metrics)
            if node.state_from != "profile":
                entry["state_from"] = node.state_from
        else:
            entry = {"feature": node.feature, "op": node.op, "threshold": node.threshold, "then": node.then, "else": node.else_}
            if node.missing is not None:
                entry["missing"] = node.missing
        if node.doc:
            entry["doc"] = node.doc
        nodes[node.id] = entry
    budget: dict[str, Any] = {}
    if tree.max_passes is not None:
        budget["max_passes"] = tree.max_passes
    if tree.max_seconds is not None:
        budget["max_seconds"] = tree.max_seconds
    return {
        "format": FORMAT,
        "version": tree.version,
        "name": tree.name,
        "doc": tree.doc,
        "first_pass": list(tree.first_pass),
        "unmeasured": tree.unmeasured,
        "budget": budget,
        "root": tree.root,
        "nodes": nodes,
    }


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Walk:
    """Where a walk with the facts at hand ended."""

    path: tuple[P.PathStep, ...]
    leaf: Leaf | None
    """The leaf reached, or None when the walk stopped at ``waiting_on``."""
    waiting_on: Test | None = None
    """A test whose fact is not known yet but will be after the first pass."""


def walk(tree: Tree, facts: Mapping[str, float], *, stop_on_pending: Iterable[str] = ()) -> Walk:
    """Follow the tree from the root using ``facts``.

    A test whose fact is missing takes its ``missing`` branch, unless the fact's
    prefix is in ``stop_on_pending`` (facts a later pass will provide): then the
    walk stops there, so the caller can run the first pass and walk again.
    """
    pending = tuple(stop_on_pending)
    path: list[P.PathStep] = []
    node = tree.node(tree.root)
    while isinstance(node, Test):
        value = facts.get(node.feature)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            if pending and node.feature.startswith(pending):
                return Walk(tuple(path), None, node)
            branch, target = "missing", node.missing or node.else_
            value = None
        elif node.holds(value):
            branch, target = "then", node.then
        else:
            branch, target = "else", node.else_
        path.append(P.PathStep(node.id, node.feature, value, node.op, node.threshold, branch))
        node = tree.node(target)
    return Walk(tuple(path), node)


@dataclass(frozen=True)
class SectionCost:
    """What collecting one item (section or ``group:NAME``) costs, from recorded runs (``data/ncu_sections.json``)."""

    passes: int
    metrics: tuple[str, ...]
    """Metric names a report holds when this item is collected."""
    extra_s: float = 0.0
    """Seconds the item adds to a run beyond its passes (SASS patching of instruction-level metrics,
    paid once per run: a run's extra is the largest of its items')."""


@dataclass(frozen=True)
class CostModel:
    """Seconds of an ncu run.

    ``run_s`` per ncu process (start-up, the program, one metric), ``pass_s`` per
    further replay pass, the largest ``extra_s`` of its items, and ``section_run_s`` when
    the run collects any section: ncu then applies the sections' rules and the
    profiler writes a report and exports its pages, where a run of metric groups
    alone is read from ncu's own output.
    """

    sections: Mapping[str, SectionCost]
    run_s: float
    pass_s: float
    section_run_s: float = 0.0
    always_metrics: tuple[str, ...] = ()
    """Metrics present in every report whatever the sections (launch and device attributes)."""
    full_sections: tuple[str, ...] = ()
    """The sections of ``--set full``."""
    full_passes: int | None = None
    """Replay passes ncu needed for ``--set full`` (recorded); None: estimated from the sections."""
    full_s: float | None = None
    """Measured wall seconds of a ``--set full`` run; None: estimated."""

    def passes(self, sections: Iterable[str]) -> int:
        """Estimated replay passes of one run collecting ``sections``.

        ncu schedules the metrics of all sections together and shares passes
        between them (SpeedOfLight, LaunchStats and Occupancy: 10 passes, as many
        as SpeedOfLight alone; the full set: 38, against 80 for its sections one
        by one). Estimate: the largest section, plus half of every other
        multi-pass section, never more than the full set.
        """
        counts = sorted((self.sections[s].passes for s in set(sections) if s in self.sections), reverse=True)
        if not counts:
            return 0
        estimate = counts[0] + round(0.5 * sum(c for c in counts[1:] if c > 1))
        return min(estimate, self.full_passes) if self.full_passes else estimate

    def seconds(self, runs: int, sections: Iterable[str]) -> float:
        """Estimated wall seconds of ``runs`` ncu processes that together collect ``sections`` (items)."""
        items = set(sections)
        # Instruction-level metrics share one SASS patching per run, whichever items ask for them.
        extra = max((self.sections[s].extra_s for s in items if s in self.sections), default=0.0)
        if split_items(items)[0]:
            extra += runs * self.section_run_s
        return runs * self.run_s + max(0, self.passes(items) - 1) * self.pass_s + extra

    def full_seconds(self) -> float:
        if self.full_s is not None:
            return self.full_s
        passes = self.full_passes if self.full_passes is not None else self.passes(self.full_sections)
        return self.run_s + max(0, passes - 1) * self.pass_s

    def metrics_of(self, sections: Iterable[str]) -> set[str]:
        named_sections, group_metrics = split_items(sections)
        names = set(self.always_metrics) | set(group_metrics)
        for s in named_sections:
            if s in self.sections:
                names.update(self.sections[s].metrics)
        return names


@dataclass(frozen=True)
class Plan:
    """What to collect for one kernel, and why."""

    first_pass: tuple[str, ...]
    """Sections of the first run (empty when the tree decided from static facts alone)."""
    sections: tuple[str, ...]
    """Sections of the second run (the leaf's, within the budget); with no first pass, merged into one run."""
    metrics: tuple[str, ...]
    path: tuple[P.PathStep, ...]
    leaf: str
    dropped: tuple[str, ...] = ()
    """Leaf sections left out to stay within the budget."""
    state_from: str = "profile"
    """The leaf's :attr:`Leaf.state_from`: what the optimizer ranks this kernel by."""

    @property
    def runs(self) -> tuple[tuple[str, ...], ...]:
        """The ncu runs this plan makes, each a tuple of sections."""
        if not self.first_pass:
            return (self.sections,)
        return (self.first_pass, self.sections) if self.sections or self.metrics else (self.first_pass,)


def within_budget(tree: Tree, leaf: Leaf, costs: CostModel | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The leaf's sections that fit the tree's budget (in priority order), and those dropped."""
    kept: list[str] = []
    dropped: list[str] = []
    for section in leaf.collect:
        trial = kept + [section]
        over = False
        if costs is not None and tree.max_passes is not None and costs.passes(trial) > tree.max_passes:
            over = True
        if costs is not None and tree.max_seconds is not None and costs.seconds(1, trial) > tree.max_seconds:
            over = True
        (dropped if over and kept else kept).append(section)
    return tuple(kept), tuple(dropped)


#: The metric group of the warp-stall counters (:data:`kernel_lsp.core.metric_groups.GROUPS`).
STALLS_GROUP = "group:stalls"


#: The ncu section that holds the same stall counters.
_STALLS_SECTION = "WarpStateStats"


def with_barrier_counters(items: tuple[str, ...], facts: Mapping[str, float],
                          costs: CostModel | None = None) -> tuple[str, ...]:
    """``items`` plus the stall counters when the kernel has a barrier (``static.syncs``) and a leaf collects
    anything: a kernel whose warps mostly wait at ``__syncthreads`` (a shared-memory reduction's levels) is
    barrier-bound whatever its throughput, and the classifier reads that from the stall counters, as it
    does in ``--set full``. The leaves for busy kernels collect pipes or memory causes, and a tree profile
    can read such a kernel as busy where the full profile does not (lsu-pipe or cache-bandwidth against
    barrier-stalls): a few replay passes more make them agree. Nothing is added where ``items`` hold the
    counters already (the group, the ncu section, or by ``costs``' table any item that has them)."""
    if not items or facts.get("static.syncs", 0.0) <= 0 or STALLS_GROUP in items or _STALLS_SECTION in items:
        return items
    if costs is not None and {P.stall_metric(r) for r in P.STALL_REASONS} <= costs.metrics_of(items):
        return items
    return (*items, STALLS_GROUP)


def plan_from_walk(tree: Tree, result: Walk, *, first_pass_ran: bool, costs: CostModel | None = None,
                   facts: Mapping[str, float] | None = None) -> Plan:
    """The plan of the leaf ``result`` reached; ``facts`` (static ones at least): the barrier counters of
    :func:`with_barrier_counters` join a leaf's collection."""
    if result.leaf is None:
        raise ValueError("the walk has not reached a leaf")
    sections, dropped = within_budget(tree, result.leaf, costs)
    sections = with_barrier_counters(sections, facts or {}, costs)
    if first_pass_ran:
        sections = tuple(s for s in sections if s not in tree.first_pass)
        return Plan(tree.first_pass, sections, result.leaf.metrics, result.path, result.leaf.id, dropped,
                    result.leaf.state_from)
    merged = tuple(dict.fromkeys(tree.first_pass + sections))
    return Plan((), merged, result.leaf.metrics, result.path, result.leaf.id, dropped, result.leaf.state_from)


def cost_model_from_json(data: Mapping[str, Any]) -> CostModel:
    """Read ``data/ncu_sections.json`` (made by ``tests/fixtures/ncu/make_sections_table.py``)."""
    sections = {
        name: SectionCost(int(entry["passes"]), tuple(entry.get("metrics", [])), float(entry.get("extra_s", 0.0)))
        for name, entry in data["sections"].items()
    }
    return CostModel(
        sections=sections,
        run_s=float(data["run_s"]),
        pass_s=float(data["pass_s"]),
        section_run_s=float(data.get("section_run_s", 0.0)),
        always_metrics=tuple(data.get("always_metrics", [])),
        full_sections=tuple(data.get("full_sections", [])),
        full_passes=data.get("full_passes"),
        full_s=data.get("full_s"),
    )


# --------------------------------------------------------------------------- facts


def static_facts(function: Function, source: str | bytes, constants: Mapping[str, str] | None = None) -> dict[str, float]:
    """``static.*`` facts: the kernel's static features (:mod:`kernel_lsp.core.features`), no compile, no GPU."""
    features = static_features(function, source, dict(constants or {}))
    return {f"static.{name}": value for name, value in features.as_dict().items()}


def facts_from_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """``sig.*``, ``derived.*`` and ``metric.*`` facts from collected metrics."""
    facts = {f"metric.{k}": float(v) for k, v in metrics.items()}
    for key, value in P.KernelProfile(kernel="", metrics=metrics).signature().items():
        facts[f"sig.{key}"] = value
    mem, sm = metrics.get(P.M_MEMORY_PCT), metrics.get(P.M_SM_PCT)
    if mem is not None and sm is not None:
        facts["derived.max_throughput_pct"] = float(max(mem, sm))
        facts["derived.memory_minus_sm_pct"] = float(mem - sm)
    return facts


# --------------------------------------------------------------------------- refinement


@dataclass(frozen=True)
class Sample:
    """One kernel of the refinement dataset: a full profile plus its static facts."""

    name: str
    metrics: Mapping[str, float]
    """Every metric of the full profile (``--set full``)."""
    static_facts: Mapping[str, float] = field(default_factory=dict)
    """``static.*`` and ``ptxas.*`` facts."""


def plan_for(tree: Tree, static: Mapping[str, float], measured: Mapping[str, float] | None,
             costs: CostModel | None = None) -> Plan | Walk:
    """The plan the profiler follows before any run of this profile.

    ``measured``: facts from the previous profile of the kernel (None for a first
    profile). Returns a :class:`Plan` (one run: first-pass sections plus the leaf's),
    or, for a first profile under ``unmeasured: first_pass``, the :class:`Walk` that
    stopped where it needs the first pass.
    """
    facts = dict(static)
    if measured is not None:
        facts.update(measured)
    elif tree.unmeasured == "first_pass":
        stopped = walk(tree, facts, stop_on_pending=MEASURED_PREFIXES)
        if stopped.leaf is None:
            return stopped
        return plan_from_walk(tree, stopped, first_pass_ran=False, costs=costs, facts=facts)
    return plan_from_walk(tree, walk(tree, facts), first_pass_ran=False, costs=costs, facts=facts)


def emulate(tree: Tree, sample: Sample, costs: CostModel, *, warm: bool = True) -> tuple[Plan, dict[str, float], float]:
    """Walk ``tree`` for ``sample`` as the profiler would, seeing only what each run collects.

    ``warm``: a previous profile of the kernel is known (its first-pass facts feed
    the tree), as on every save after the first; ``warm=False``: a first profile.
    Returns the plan, the metrics its runs would have collected (cut from the full
    profile) and the estimated seconds.
    """
    return _Dataset([sample], costs).emulate(tree, sample, warm)


class _Dataset:
    """Samples plus memo tables, so that scoring thousands of candidate trees stays fast."""

    def __init__(self, samples: Sequence[Sample], costs: CostModel):
        self.samples = list(samples)
        self.costs = costs
        self.truth = {s.name: C.classify(s.metrics).label for s in self.samples}
        self._facts: dict[tuple[str, tuple[str, ...]], dict[str, float]] = {}
        self._labels: dict[tuple[str, frozenset[str], tuple[str, ...]], str] = {}

    def first_pass_facts(self, sample: Sample, first_pass: tuple[str, ...]) -> dict[str, float]:
        key = (sample.name, first_pass)
        if key not in self._facts:
            cheap = P.restrict_metrics(sample.metrics, self.costs.metrics_of(first_pass))
            facts = dict(sample.static_facts)
            facts.update(facts_from_metrics(cheap))
            self._facts[key] = facts
        return self._facts[key]

    def plan(self, tree: Tree, sample: Sample, warm: bool) -> Plan:
        measured = self.first_pass_facts(sample, tree.first_pass) if warm else None
        result = plan_for(tree, sample.static_facts, measured, self.costs)
        if isinstance(result, Plan):
            return result
        facts = self.first_pass_facts(sample, tree.first_pass)
        return plan_from_walk(tree, walk(tree, facts), first_pass_ran=True, costs=self.costs, facts=facts)

    def collected(self, sample: Sample, plan: Plan) -> dict[str, float]:
        keep = self.costs.metrics_of(plan.first_pass + plan.sections) | set(plan.metrics)
        return P.restrict_metrics(sample.metrics, keep)

    def label(self, sample: Sample, plan: Plan) -> str:
        key = (sample.name, frozenset(plan.first_pass + plan.sections), plan.metrics)
        if key not in self._labels:
            self._labels[key] = C.classify(self.collected(sample, plan)).label
        return self._labels[key]

    def seconds(self, plan: Plan) -> float:
        return sum(self.costs.seconds(1, run) for run in plan.runs)

    def emulate(self, tree: Tree, sample: Sample, warm: bool) -> tuple[Plan, dict[str, float], float]:
        plan = self.plan(tree, sample, warm)
        return plan, self.collected(sample, plan), self.seconds(plan)

    def score(self, tree: Tree, cost_weight: float) -> Score:
        if not self.samples:
            return Score(0.0, 0.0, 0.0)
        full_s = self.costs.full_seconds()
        agree = 0
        ratio = 0.0
        per: dict[str, tuple[str, str, float]] = {}
        for sample in self.samples:
            for warm in (True, False):
                plan = self.plan(tree, sample, warm)
                mine, truth, seconds = self.label(sample, plan), self.truth[sample.name], self.seconds(plan)
                agree += mine == truth
                ratio += seconds / full_s if full_s > 0 else 0.0
                per[sample.name if warm else f"{sample.name} (first profile)"] = (mine, truth, seconds)
        agreement = agree / (2 * len(self.samples))
        cost_ratio = ratio / (2 * len(self.samples))
        return Score(agreement, cost_ratio, agreement - cost_weight * cost_ratio, per)


@dataclass(frozen=True)
class Score:
    agreement: float
    """Share of samples (0-1) whose class from the tree-chosen metrics equals the full profile's,
    over both a first profile and a repeat profile (previous facts known) of every sample."""
    cost_ratio: float
    """Mean estimated seconds of the tree's collection / seconds of ``--set full``."""
    value: float
    """``agreement - cost_weight * cost_ratio``: what refinement maximises."""
    per_sample: Mapping[str, tuple[str, str, float]] = field(default_factory=dict)
    """Sample -> (tree's class, full profile's class, estimated seconds)."""


def score(tree: Tree, samples: Sequence[Sample], costs: CostModel, *, cost_weight: float = 0.25) -> Score:
    return _Dataset(samples, costs).score(tree, cost_weight)


@dataclass(frozen=True)
class Edit:
    kind: str
    """``REWRITE`` (a test's threshold or a leaf's sections) or ``SPLIT`` (a leaf becomes a test)."""
    node: str
    description: str
    new_nodes: Mapping[str, Node]
    """Nodes replacing or added to the tree (same id: replaced)."""

    def apply(self, tree: Tree) -> Tree:
        nodes = dict(tree.nodes)
        nodes.update(self.new_nodes)
        return replace(tree, nodes=nodes)


@dataclass(frozen=True)
class LogEntry:
    round: int
    edit: str
    kind: str
    score_before: float
    score_after: float
    accepted: bool


#: A proposer returns candidate edits for a tree; :func:`deterministic_edits` is the default.
Proposer = Callable[[Tree, Sequence[Sample], CostModel], list[Edit]]


def _reaching(tree: Tree, samples: Sequence[Sample], costs: CostModel) -> dict[str, list[tuple[Sample, dict[str, float]]]]:
    """Node id -> the samples whose walks pass through it, with the facts each walk saw there.

    Every sample walks twice: with its first-pass facts (a repeat profile) and with
    its static facts alone (a first profile, taking ``missing`` branches).
    """
    out: dict[str, list[tuple[Sample, dict[str, float]]]] = {}
    data = _Dataset(samples, costs)
    for sample in samples:
        for facts in (data.first_pass_facts(sample, tree.first_pass), dict(sample.static_facts)):
            result = walk(tree, facts)
            for step in result.path:
                out.setdefault(step.node, []).append((sample, facts))
            if result.leaf is not None:
                out.setdefault(result.leaf.id, []).append((sample, facts))
    return out


def _midpoints(values: Iterable[float], limit: int = 8) -> list[float]:
    distinct = sorted(set(values))
    mids = [round((a + b) / 2, 6) for a, b in zip(distinct, distinct[1:])]
    if len(mids) <= limit:
        return mids
    step = (len(mids) - 1) / (limit - 1)
    return sorted({mids[round(i * step)] for i in range(limit)})


def _fresh_id(tree: Tree, base: str) -> str:
    n = 1
    while f"{base}_{n}" in tree.nodes:
        n += 1
    return f"{base}_{n}"


#: Measured facts a SPLIT may test: what the first pass (SpeedOfLight, LaunchStats, Occupancy) yields.
SPLIT_FEATURES: tuple[str, ...] = (
    "derived.max_throughput_pct",
    "derived.memory_minus_sm_pct",
    "sig.memory_throughput_pct",
    "sig.sm_throughput_pct",
    "sig.dram_throughput_pct",
    "sig.achieved_occupancy_pct",
    "sig.theoretical_occupancy_pct",
    "sig.waves_per_sm",
    "sig.registers_per_thread",
    "sig.shared_bytes_per_block",
)


def deterministic_edits(tree: Tree, samples: Sequence[Sample], costs: CostModel, cost_weight: float = 0.25) -> list[Edit]:
    """Candidate edits, in a fixed order: threshold rewrites, leaf rewrites, then splits.

    A SPLIT turns a leaf reached by two or more samples into a test on a measured
    fact; each side gets the collection that scores best on the samples that
    reach it (chosen among the leaf's own sections, the leaf minus or plus one
    section, a single section, or nothing).
    """
    data = _Dataset(samples, costs)
    reach = _reaching(tree, samples, costs)
    edits: list[Edit] = []
    for test in tree.tests():
        values = [facts[test.feature] for _, facts in reach.get(test.id, []) if test.feature in facts]
        for t in _midpoints(values):
            if t != test.threshold:
                edits.append(
                    Edit("REWRITE", test.id, f"{test.id}: threshold {test.threshold:g} -> {t:g}", {test.id: replace(test, threshold=t)})
                )
    candidates = sorted(s for s in costs.sections if s not in tree.first_pass)
    for leaf in tree.leaves():
        for section in leaf.collect:
            rest = tuple(s for s in leaf.collect if s != section)
            edits.append(Edit("REWRITE", leaf.id, f"{leaf.id}: drop {section}", {leaf.id: replace(leaf, collect=rest)}))
        for section in candidates:
            if section not in leaf.collect:
                more = leaf.collect + (section,)
                edits.append(Edit("REWRITE", leaf.id, f"{leaf.id}: add {section}", {leaf.id: replace(leaf, collect=more)}))
    seen = {f for pairs in reach.values() for _, facts in pairs for f in facts}
    features = [f for f in SPLIT_FEATURES if f in seen] + sorted(f for f in seen if f.startswith(("static.", "ptxas.")))
    for leaf in tree.leaves():
        arrived = reach.get(leaf.id, [])
        if len(arrived) < 2:
            continue
        options = _collect_options(leaf, candidates)
        for feature in features:
            values = [facts[feature] for _, facts in arrived if feature in facts]
            for t in _midpoints(values, limit=3):
                high = [sample for sample, facts in arrived if feature in facts and facts[feature] >= t]
                low = [sample for sample, facts in arrived if not (feature in facts and facts[feature] >= t)]
                if not high or not low:
                    continue
                then_collect = _best_collect(tree, leaf, options, high, data, cost_weight)
                else_collect = _best_collect(tree, leaf, options, low, data, cost_weight)
                if then_collect == else_collect:
                    continue
                edits.append(_split(tree, leaf, feature, t, then_collect, else_collect))
    return edits


def _collect_options(leaf: Leaf, candidates: Sequence[str]) -> list[tuple[str, ...]]:
    options = [leaf.collect, ()]
    options += [tuple(s for s in leaf.collect if s != drop) for drop in leaf.collect]
    options += [leaf.collect + (add,) for add in candidates if add not in leaf.collect]
    options += [(one,) for one in candidates]
    return list(dict.fromkeys(options))


def _best_collect(
    tree: Tree, leaf: Leaf, options: Sequence[tuple[str, ...]], side: Sequence[Sample], data: _Dataset, cost_weight: float
) -> tuple[str, ...]:
    full_s = data.costs.full_seconds() or 1.0
    best: tuple[float, tuple[str, ...]] | None = None
    for collect in options:
        candidate = Leaf(leaf.id, collect, leaf.metrics)
        sections, _ = within_budget(tree, candidate, data.costs)
        plan = Plan((), tuple(dict.fromkeys(tree.first_pass + sections)), leaf.metrics, (), leaf.id)
        value = sum(
            (data.label(sample, plan) == data.truth[sample.name]) - cost_weight * data.seconds(plan) / full_s
            for sample in side
        )
        if best is None or value > best[0] + 1e-12:
            best = (value, collect)
    return best[1] if best else leaf.collect


def _split(tree: Tree, leaf: Leaf, feature: str, threshold: float, then_collect: tuple[str, ...], else_collect: tuple[str, ...]) -> Edit:
    """Leaf -> test(feature >= threshold) with a leaf on each side."""
    then_id = _fresh_id(tree, f"{leaf.id}_hi")
    else_id = _fresh_id(tree, f"{leaf.id}_lo")
    test = Test(leaf.id, feature, ">=", threshold, then_id, else_id, else_id, f"split of {leaf.id}")
    return Edit(
        "SPLIT",
        leaf.id,
        f"{leaf.id}: split on {feature} >= {threshold:g} (then {', '.join(then_collect) or 'nothing'}; "
        f"else {', '.join(else_collect) or 'nothing'})",
        {leaf.id: test, then_id: Leaf(then_id, then_collect, leaf.metrics), else_id: Leaf(else_id, else_collect, leaf.metrics)},
    )


def refine(
    tree: Tree,
    samples: Sequence[Sample],
    costs: CostModel,
    *,
    cost_weight: float = 0.25,
    min_gain: float = 1e-3,
    max_rounds: int = 20,
    proposer: Proposer | None = None,
) -> tuple[Tree, list[LogEntry]]:
    """Greedy best-improvement refinement; an edit is kept only when it raises the score by > ``min_gain``.

    ``proposer`` (default :func:`deterministic_edits`) may be replaced, e.g. by a
    model that suggests edits; its edits pass the same acceptance test.
    """
    if proposer is None:
        proposer = functools.partial(deterministic_edits, cost_weight=cost_weight)
    data = _Dataset(samples, costs)
    log: list[LogEntry] = []
    current = data.score(tree, cost_weight).value
    for round_no in range(1, max_rounds + 1):
        best: tuple[float, Edit, Tree] | None = None
        for edit in proposer(tree, samples, costs):
            candidate = edit.apply(tree)
            value = data.score(candidate, cost_weight).value
            if best is None or value > best[0] + 1e-12:
                best = (value, edit, candidate)
        if best is None:
            break
        value, edit, candidate = best
        accepted = value > current + min_gain
        log.append(LogEntry(round_no, edit.description, edit.kind, current, value, accepted))
        if not accepted:
            break
        tree, current = candidate, value
    return tree, log
