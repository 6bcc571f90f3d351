"""Learning the profiling tree from what the optimizer then achieves (AutoProfiler's REWRITE and SPLIT).

A tree is scored by the optimization results it leads to, not by how well it reproduces the full
profile's class. For every kernel of a training split the score replays the optimizer's search:

1. the tree's collection for the kernel is cut from the kernel's recorded full profile (every
   metric group, collected once on the GPU: a metric's value does not depend on what else a
   profile collects, so one recording serves every tree, as in :func:`profiling_tree.emulate`);
2. the optimizer's own steps on that profile: its signature is matched to a knowledge-base state
   (:func:`kb_logic.match_state`, a derived state inheriting its parent's entries) -- or, when the
   kernel's walk ends at a leaf with ``state_from: source``, the static analysis' state is taken
   (:mod:`kernel_lsp.core.static_state`, as without a profile; the optimizer does the same); the
   state's techniques are drawn (:func:`kb_logic.select`, seeded as ``optimize --seed``), and the
   rules' candidates are put in that order as :meth:`RuleGenerator.ordered` does (a rule whose
   technique is drawn first, in the draw's order; the others in the rules' order; a sequence right
   after its first step, tried only when that step was accepted);
3. the first ``budget`` candidates are "tried": their verified speedups are looked up in the
   kernel's recorded verifications (the harness's verdicts from the corpus benchmark on the GPU).
   Each attempt updates the replayed knowledge base, so later kernels of the split draw from what
   earlier ones taught it, as a user's knowledge base does;
4. the kernel's result is its best accepted speedup (1.0 when none was accepted).

A replay's score is ``ln(geomean speedup) - cost_weight * cost_ratio`` (the mean estimated seconds
of its collection over ``--set full``'s, from the section cost table). A candidate the recording
never verified counts as not accepted and is reported (``unknown``), so a tree cannot gain from
candidates nobody measured. With three candidates per kernel one seeded draw and one order of the
kernels decide a lot (over seeds and orders the geomean of one tree on the corpus' training split
varies by about 5 %, more than most edits gain), so a tree's score is the mean over ``replicas``
replays, each with its own draw seed and kernel order; two trees are compared replica by replica.

Refinement proposes :func:`learning_edits` -- the REWRITE and SPLIT edits of
:func:`profiling_tree.deterministic_edits` plus those that route kernels to a source leaf, on static
facts (known before any profile) or first-pass ones -- and keeps an edit only when its mean gain
exceeds ``min_gain`` and ``noise_z`` standard errors of the paired per-replica gains (the measured
noise), and, given confirmation replicas (other seeds and orders), again there: the best of many
edits is flattered by the replicas that chose it. It stops after ``patience`` rounds without gain.

The profile has a second reader: the editor's hover shows the bottleneck class the tree's collection
gives (:func:`kernel_lsp.core.classify.classify`), and the score above never sees it -- a split that
sends most kernels to a source leaf collecting nothing more can raise the optimizer's results while its
profiles no longer name the full profile's bottleneck. So, given an :class:`Agreement` (the recorded full
profiles the tree's tests hold it to, :func:`profiling_tree.score`), an edit whose tree agrees with the
full profile's class on fewer of those samples than the floor is not a candidate at all. The floor is the
starting tree's agreement less ``margin`` (0.05: about one kernel's first and repeat profiles of the 27
recorded), but never below ``min_agreement`` (0.9, what the shipped tree is tested against) unless the
starting tree is already below it, and then never below the starting tree's. The alternative, a source
leaf that keeps collecting its node's groups, would pay that cost on every profile for a class the
ranking ignores, and a split above a test has no one leaf's groups to keep; the floor instead lets the
learner put source leaves only where the class survives without more collection.
Pure: no IO.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from kernel_lsp.core import kb_logic
from kernel_lsp.core import profile as P
from kernel_lsp.core import profiling_tree as T
from kernel_lsp.core.kb_logic import Entry, State


@dataclass(frozen=True)
class Tried:
    """One candidate the recording verified (or listed), in the rules' order."""

    generator: str
    """``rule:NAME[variant]`` or ``rule:A+B`` for a sequence."""
    technique: str
    speedup: float | None
    """The measured speedup of a correct candidate (accepted or not faster); None when it was wrong or failed."""
    accepted: bool = False
    """The harness accepted it (correct and faster by its interval)."""
    after: str | None = None
    """For a sequence, the generator of the step it extends (tried only once that step was accepted)."""
    verified: bool = True
    """False: listed by the rules but never verified in the recording (counts as not accepted)."""

    @property
    def rule(self) -> str:
        return self.generator.split(":", 1)[-1].split("[", 1)[0].split("+", 1)[0]


@dataclass(frozen=True)
class Case:
    """One kernel: its recorded full profile and the verdicts of its candidates."""

    sample: T.Sample
    tried: tuple[Tried, ...]
    static_state: str | None = None
    """The state the optimizer takes from the source when there is no profile."""


@dataclass(frozen=True)
class Policy:
    """The optimizer's knowledge base as a fresh install has it, and the search's budget."""

    states: tuple[State, ...]
    priors: tuple[Entry, ...]
    budget: int = 3
    """Verified candidates per kernel."""
    hints: int = 6
    """Techniques drawn per search (the optimizer's HINTS_PER_SEARCH)."""
    seed: int = 0
    replicas: int = 1
    """Replays a score averages: replica ``r`` draws with seed ``seed + r`` and, for ``r > 0``, meets the
    kernels in an order shuffled by that seed (a user's knowledge base sees them in any order)."""


@dataclass(frozen=True)
class CaseResult:
    name: str
    state: str
    speedup: float
    """Best accepted speedup among the candidates tried (1.0: none)."""
    tried: tuple[str, ...]
    unknown: int
    """Candidates tried that the recording never verified."""
    seconds: float
    """Estimated profiling seconds of the tree's collection (0 without a profile)."""
    from_source: bool = False
    """The state came from the source (no profile, or a ``state_from: source`` leaf)."""


@dataclass(frozen=True)
class Feedback:
    geomean_speedup: float
    """exp of the mean over replicas of ln(geomean speedup)."""
    cost_ratio: float
    value: float
    """``ln(geomean_speedup) - cost_weight * cost_ratio``: what learning maximises (mean over replicas)."""
    cases: tuple[CaseResult, ...] = field(default_factory=tuple)
    """The first replica's kernels (seed ``Policy.seed``, the cases' own order)."""
    replica_values: tuple[float, ...] = ()
    """``value`` of each replica, in replica order (paired across trees: same seeds, same orders)."""

    @property
    def seconds_per_kernel(self) -> float:
        return sum(c.seconds for c in self.cases) / len(self.cases) if self.cases else 0.0


def order(tried: Sequence[Tried], drawn: Sequence[str]) -> list[Tried]:
    """The candidates in the order the rule generator yields them after drawing ``drawn`` techniques."""
    groups: dict[str, list[Tried]] = {}
    for t in tried:
        groups.setdefault(t.rule, []).append(t)
    rank = {name: i for i, name in enumerate(drawn)}
    position = {rule: i for i, rule in enumerate(groups)}
    ranked = sorted(groups, key=lambda rule: (rank.get(groups[rule][0].technique, len(rank)), position[rule]))
    return [t for rule in ranked for t in groups[rule]]


class Replay:
    """The optimizer's search replayed over recorded kernels; memoised per (kernel, collected metrics)."""

    def __init__(self, cases: Sequence[Case], costs: T.CostModel, policy: Policy):
        self.cases = list(cases)
        self.costs = costs
        self.policy = policy
        self._data = T._Dataset([c.sample for c in self.cases], costs)
        self._states: dict[tuple[str, frozenset[str]], kb_logic.StateMatch] = {}
        orders = [list(self.cases)]
        for r in range(1, max(1, policy.replicas)):
            shuffled = list(self.cases)
            random.Random(policy.seed + r).shuffle(shuffled)
            orders.append(shuffled)
        self.orders = orders
        """The kernels in each replica's order (the first: as given)."""

    def _state(self, case: Case, collected: Mapping[str, float] | None) -> kb_logic.StateMatch:
        """The optimizer's state: from the profile's signature, or (``collected`` None) from the source."""
        if collected is None:
            return kb_logic.StateMatch(state=case.static_state or kb_logic.FALLBACK_STATE, distance=None, is_new=False)
        key = (case.sample.name, frozenset(collected))
        if key not in self._states:
            signature = P.KernelProfile(kernel="", metrics=collected).signature()
            self._states[key] = kb_logic.match_state(signature, self.policy.states)
        return self._states[key]

    def _tree_profile(self, tree: T.Tree | None, case: Case) -> tuple[Mapping[str, float] | None, float]:
        """What ranks the kernel (the collected metrics; None: the source) and the profile's seconds."""
        if tree is None:
            return None, 0.0
        plan = self._data.plan(tree, case.sample, True)
        collected = self._data.collected(case.sample, plan)
        return (None if plan.state_from == "source" else collected), self._data.seconds(plan)

    def outcome_key(self, tree: T.Tree | None) -> tuple:
        """Equal for two trees exactly when every kernel gets the same ranking input and profiling seconds,
        so they replay to the same feedback (the learner scores each distinct outcome once)."""
        out = []
        for case in self.cases:
            collected, seconds = self._tree_profile(tree, case)
            out.append((None if collected is None else frozenset(collected), round(seconds, 9)))
        return tuple(out)

    def run(self, tree: T.Tree | None, cost_weight: float = 0.25) -> Feedback:
        """Replay every case with what ``tree`` collects (None: no profile, the static state); a leaf with
        ``state_from: source`` profiles (and costs) as it says but ranks by the static state, as the optimizer does."""
        return self._run(lambda case: self._tree_profile(tree, case), cost_weight)

    def run_full(self, cost_weight: float = 0.25) -> Feedback:
        """Replay with the full profile given to the optimizer (every recorded metric, ``--set full``'s seconds)."""
        full_s = self.costs.full_seconds()
        return self._run(lambda case: (case.sample.metrics, full_s), cost_weight)

    def _run(self, profile, cost_weight: float) -> Feedback:
        full_s = self.costs.full_seconds() or 1.0
        ranking = {case.sample.name: profile(case) for case in self.cases}
        replicas = [self._replica(kernels, ranking, self.policy.seed + r) for r, kernels in enumerate(self.orders)]
        cost_ratio = sum(seconds for _, seconds in ranking.values()) / len(ranking) / full_s if ranking else 0.0
        logs = [math.log(_geomean(results)) for results in replicas]
        values = tuple(v - cost_weight * cost_ratio for v in logs)
        mean_log = sum(logs) / len(logs)
        return Feedback(math.exp(mean_log), cost_ratio, mean_log - cost_weight * cost_ratio, tuple(replicas[0]), values)

    def _replica(self, kernels: Sequence[Case], ranking: Mapping[str, tuple[Mapping[str, float] | None, float]],
                 seed: int) -> list[CaseResult]:
        entries: dict[tuple[str, str], Entry] = {(e.state, e.technique): e for e in self.policy.priors}
        results: list[CaseResult] = []
        for case in kernels:
            collected, seconds = ranking[case.sample.name]
            match = self._state(case, collected)
            if match.is_new and match.parent is not None and not any(s == match.state for s, _ in entries):
                for e in kb_logic.inherit_entries([e for (s, _), e in entries.items() if s == match.parent], match.state):
                    entries[(e.state, e.technique)] = e
            mine = [e for (s, _), e in sorted(entries.items()) if s == match.state]
            drawn = [c.technique for c in kb_logic.select(mine, self.policy.hints, seed=seed)]
            accepted: set[str] = set()
            names: list[str] = []
            best, unknown = 1.0, 0
            for t in order(case.tried, drawn):
                if len(names) >= self.policy.budget:
                    break
                if t.after is not None and t.after not in accepted:
                    continue
                names.append(t.generator)
                unknown += not t.verified
                ok = t.verified and t.accepted and t.speedup is not None
                if ok:
                    accepted.add(t.generator)
                    best = max(best, t.speedup)
                key = (match.state, t.technique)
                # As the optimizer records it: a correct candidate's measured speedup, accepted or not.
                entries[key] = kb_logic.update_entry(entries.get(key) or kb_logic.default_entry(*key),
                                                     t.speedup if t.verified else None, ok)
            results.append(CaseResult(case.sample.name, match.state, best, tuple(names), unknown, seconds,
                                      collected is None))
        return results


def _geomean(results: Sequence[CaseResult]) -> float:
    return math.exp(sum(math.log(r.speedup) for r in results) / len(results)) if results else 1.0


@dataclass(frozen=True)
class Step:
    """One learning round: the best edit proposed, the scores before and after, whether it was kept."""

    round: int
    kind: str
    edit: str
    score_before: float
    score_after: float
    geomean_after: float
    cost_ratio_after: float
    kept: bool
    gain_se: float = 0.0
    """Standard error of the score gain over the paired replicas (0 with one replica): the measured noise."""
    confirm_gain: float | None = None
    """The gain re-measured on the confirmation replicas (other seeds and orders); None: not confirmed."""
    confirm_se: float | None = None
    agreement_before: float | None = None
    """The tree's agreement with the full profiles' classes before the round (None: no :class:`Agreement`)."""
    agreement_after: float | None = None
    """The edited tree's agreement."""
    refused_edit: str | None = None
    """The edit that would have ranked above this one but fell below the agreement floor (None: none did)."""
    refused_gain: float | None = None
    """Its mean score gain."""
    refused_agreement: float | None = None
    """Its tree's agreement."""


class Agreement:
    """The floor on what the profile tells the user: the share of recorded full profiles (first and repeat
    profile of each, :func:`profiling_tree.score`) whose class from the tree's collection equals the full
    profile's. ``floor`` is fixed from ``start`` (the tree learning starts from), so a resumed run keeps it."""

    def __init__(self, samples: Sequence[T.Sample], costs: T.CostModel, start: T.Tree, *,
                 min_agreement: float = 0.9, margin: float = 0.05):
        self._data = T._Dataset(samples, costs)
        self.samples = len(self._data.samples)
        self.start = self.of(start)
        self.floor = max(self.start - margin, min(min_agreement, self.start))

    def of(self, tree: T.Tree) -> float:
        return self._data.score(tree, 0.0).agreement

    def holds(self, tree: T.Tree) -> bool:
        return self.of(tree) >= self.floor - 1e-12


def learning_edits(tree: T.Tree, samples: Sequence[T.Sample], costs: T.CostModel, cost_weight: float = 0.25) -> list[T.Edit]:
    """:func:`profiling_tree.deterministic_edits` plus the edits that route kernels to the source's state.

    The profile's state can mislead the optimizer's ranking where the static analysis' state guides it
    better, so a leaf may rank by the source (``state_from: source``, collecting nothing more than the first
    pass): REWRITE a profile leaf to a source leaf and back, and SPLIT any node (a leaf, or a test with the
    subtree below it) on a fact into itself and a source leaf, either way round, so that one edit can route
    kernels from several leaves at once. A SPLIT may test a static fact (known before any profile) or a
    first-pass fact, at the midpoints of the values of the kernels that reach the node; a kernel whose fact
    is unknown (a first profile) keeps the node's own way. Collecting more for a source leaf cannot change
    the ranking, so those edits are left out.
    """
    edits = [e for e in T.deterministic_edits(tree, samples, costs, cost_weight)
             if not (e.kind == "REWRITE" and " add " in e.description and _is_source(tree.nodes.get(e.node)))]
    for leaf in tree.leaves():
        if leaf.state_from == "source":
            edits.append(T.Edit("REWRITE", leaf.id, f"{leaf.id}: state from the profile",
                                {leaf.id: replace(leaf, collect=(), state_from="profile")}))
        else:
            edits.append(T.Edit("REWRITE", leaf.id, f"{leaf.id}: state from the source",
                                {leaf.id: replace(leaf, collect=(), state_from="source")}))
    reach = T._reaching(tree, samples, costs)
    seen = {f for pairs in reach.values() for _, facts in pairs for f in facts}
    features = [f for f in T.SPLIT_FEATURES if f in seen] + sorted(f for f in seen if f.startswith(("static.", "ptxas.")))
    for node in tree.nodes.values():
        arrived = reach.get(node.id, [])
        if _is_source(node) or len({sample.name for sample, _ in arrived}) < 2:
            continue
        for feature in features:
            for t in T._midpoints([facts[feature] for _, facts in arrived if feature in facts], limit=4):
                edits.append(_source_split(tree, node, feature, t, source_high=True))
                edits.append(_source_split(tree, node, feature, t, source_high=False))
    return edits


def _is_source(node: T.Node | None) -> bool:
    return isinstance(node, T.Leaf) and node.state_from == "source"


def _source_split(tree: T.Tree, node: T.Node, feature: str, threshold: float, source_high: bool) -> T.Edit:
    """Node -> test(feature >= threshold): one side goes on as the node did (moved to a fresh id, its
    subtree unchanged), the other ranks by the source. The test takes the node's id, so whatever led to
    the node leads to the test; an unknown fact takes the node's own way."""
    kept_id = _fresh_id(tree, f"{node.id}_{'lo' if source_high else 'hi'}")
    source_id = _fresh_id(tree, f"{node.id}_source")
    kept = replace(node, id=kept_id)
    source = T.Leaf(source_id, (), node.metrics if isinstance(node, T.Leaf) else (), "", "source")
    then_id, else_id = (source_id, kept_id) if source_high else (kept_id, source_id)
    test = T.Test(node.id, feature, ">=", threshold, then_id, else_id, kept_id, f"split of {node.id}")
    side = ">=" if source_high else "<"
    goes_on = ", ".join(node.collect) or "nothing" if isinstance(node, T.Leaf) else f"the {node.feature} test"
    return T.Edit("SPLIT", node.id, f"{node.id}: split on {feature} >= {threshold:g} (source state when {side}; "
                  f"else {goes_on})", {node.id: test, kept_id: kept, source_id: source})


def _fresh_id(tree: T.Tree, base: str) -> str:
    return base if base not in tree.nodes else T._fresh_id(tree, base)


def learn(
    tree: T.Tree,
    replay: Replay,
    *,
    cost_weight: float = 0.25,
    min_gain: float = 0.01,
    noise_z: float = 2.0,
    max_rounds: int = 20,
    patience: int = 1,
    proposer: T.Proposer | None = None,
    confirm: Replay | None = None,
    agreement: Agreement | None = None,
) -> tuple[T.Tree, list[Step]]:
    """Greedy refinement by optimization feedback (AutoProfiler's accept-on-improvement loop).

    Each round scores every proposed edit (:func:`learning_edits` unless ``proposer``) on the replay and
    takes the one of highest conservative gain (mean gain minus ``noise_z`` standard errors of the gain over
    the paired replicas); it is kept when its mean gain exceeds ``min_gain`` (in the score's log units: 0.01
    is a 1 % higher geomean at equal cost) *and* ``noise_z`` standard errors, i.e. when it beats the
    measured noise of the seeded draw and the kernels' order. The best of many edits looks better on the
    replicas that chose it than it is, so with ``confirm`` (the same kernels under other seeds and orders)
    the chosen edit must pass the same test there too. Learning stops after ``patience`` rounds in a row
    without gain or after ``max_rounds``. Trees whose kernels all get the same ranking input and cost
    replay alike, so each distinct outcome is replayed once. With ``agreement``, an edit whose tree falls
    below its floor is passed over (the round takes the best edit that holds it, and records the best
    one refused when that one would have ranked higher)."""
    samples = [c.sample for c in replay.cases]
    propose = proposer or (lambda t, s, c: learning_edits(t, s, c, cost_weight))
    memos: dict[int, dict[tuple, Feedback]] = {}

    def score(candidate: T.Tree, on: Replay = replay) -> Feedback:
        memo = memos.setdefault(id(on), {})
        key = on.outcome_key(candidate)
        if key not in memo:
            memo[key] = on.run(candidate, cost_weight)
        return memo[key]

    current = score(tree)
    steps: list[Step] = []
    idle = 0
    # Outcomes measured and not kept since the tree last changed: the next round tries the next best instead
    # (not another edit that replays to the same outcome).
    rejected: set[tuple] = set()
    for round_no in range(1, max_rounds + 1):
        best: tuple[float, float, float, Feedback, T.Edit, T.Tree] | None = None
        # The best edit below the agreement floor: (conservative gain, gain, its description, its agreement).
        refused: tuple[float, float, str, float] | None = None
        for edit in propose(tree, samples, replay.costs):
            candidate = edit.apply(tree)
            if replay.outcome_key(candidate) in rejected:
                continue
            feedback = score(candidate)
            gain, se = _paired_gain(current, feedback)
            conservative = gain - noise_z * se
            if best is None or conservative > best[0] + 1e-12:
                # Only an edit that would rank first needs its agreement measured.
                if agreement is not None and not agreement.holds(candidate):
                    if refused is None or conservative > refused[0]:
                        refused = (conservative, gain, edit.description, agreement.of(candidate))
                    continue
                best = (conservative, gain, se, feedback, edit, candidate)
        if best is None:
            break
        conservative, gain, se, feedback, edit, candidate = best
        kept = gain > min_gain and conservative > 0
        confirm_gain = confirm_se = None
        if kept and confirm is not None:
            confirm_gain, confirm_se = _paired_gain(score(tree, confirm), score(candidate, confirm))
            kept = confirm_gain > min_gain and confirm_gain - noise_z * confirm_se > 0
        outranked = refused is not None and refused[0] > conservative
        steps.append(Step(round_no, edit.kind, edit.description, current.value, feedback.value,
                          feedback.geomean_speedup, feedback.cost_ratio, kept, se, confirm_gain, confirm_se,
                          None if agreement is None else agreement.of(tree),
                          None if agreement is None else agreement.of(candidate),
                          refused[2] if outranked else None, refused[1] if outranked else None,
                          refused[3] if outranked else None))
        if kept:
            tree, current, idle = _with_provenance(tree, edit, steps[-1]), feedback, 0
            rejected.clear()
        else:
            rejected.add(replay.outcome_key(candidate))
            idle += 1
            if idle >= patience:
                break
    return tree, steps


def _paired_gain(before: Feedback, after: Feedback) -> tuple[float, float]:
    """Mean score gain and its standard error over the replicas, paired (same seed and order in both)."""
    gains = [a - b for a, b in zip(after.replica_values, before.replica_values)]
    if len(gains) < 2:
        return after.value - before.value, 0.0
    mean = sum(gains) / len(gains)
    variance = sum((g - mean) ** 2 for g in gains) / (len(gains) - 1)
    return mean, math.sqrt(variance / len(gains))


def _with_provenance(tree: T.Tree, edit: T.Edit, step: Step) -> T.Tree:
    """``edit`` applied, each node it wrote saying which round made it and what the score did (``tree show``)."""
    note = (f"learned in round {step.round} ({step.kind}: {step.edit}); score {step.score_before:.4f} -> "
            f"{step.score_after:.4f} (se {step.gain_se:.4f}), geomean {step.geomean_after:.3f}x at "
            f"{step.cost_ratio_after:.1%} of full")
    if step.confirm_gain is not None:
        note += f"; confirmed gain {step.confirm_gain:.4f} (se {step.confirm_se:.4f}) on other seeds and orders"
    if step.agreement_after is not None:
        note += f"; agrees with the full profile's class on {step.agreement_after:.0%} of the recorded profiles"
    nodes = dict(tree.nodes)
    # A new node that carries on an old one (the side of a SPLIT that keeps the leaf) keeps its why too.
    carried = {n.doc for n in tree.nodes.values() if n.doc and "learned in round" not in n.doc}
    nodes.update({node_id: replace(node, doc=f"{node.doc} ({note})" if node_id not in tree.nodes and node.doc in carried
                                   else note)
                  for node_id, node in edit.new_nodes.items()})
    return replace(tree, nodes=nodes)
