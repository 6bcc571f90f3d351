"""Learning the profiling tree from what the optimizer then achieves (AutoProfiler's REWRITE and SPLIT).

A tree is scored by the optimization results it leads to, not by how well it reproduces the full
profile's class. For every kernel of a training split the score replays the optimizer's search:

1. the tree's collection for the kernel is cut from the kernel's recorded full profile (every
   metric group, collected once on the GPU: a metric's value does not depend on what else a
   profile collects, so one recording serves every tree, as in :func:`profiling_tree.emulate`);
2. the optimizer's own steps on that profile: its signature is matched to a knowledge-base state
   (:func:`kb_logic.match_state`, a derived state inheriting its parent's entries), the state's
   techniques are drawn (:func:`kb_logic.select`, seeded as ``optimize --seed``), and the rules'
   candidates are put in that order as :meth:`RuleGenerator.ordered` does (a rule whose technique
   is drawn first, in the draw's order; the others in the rules' order; a sequence right after its
   first step, tried only when that step was accepted);
3. the first ``budget`` candidates are "tried": their verified speedups are looked up in the
   kernel's recorded verifications (the harness's verdicts from the corpus benchmark on the GPU).
   Each attempt updates the replayed knowledge base, so later kernels of the split draw from what
   earlier ones taught it, as a user's knowledge base does;
4. the kernel's result is its best accepted speedup (1.0 when none was accepted).

A tree's score is ``ln(geomean speedup) - cost_weight * cost_ratio`` (the mean estimated seconds
of its collection over ``--set full``'s, from the section cost table). A candidate the recording
never verified counts as not accepted and is reported (``unknown``), so a tree cannot gain from
candidates nobody measured.

Refinement proposes the same REWRITE and SPLIT edits as :func:`profiling_tree.deterministic_edits`
and keeps an edit only when the score improves by more than ``min_gain`` (the measured noise);
it stops after ``patience`` rounds without gain. Pure: no IO.
"""

from __future__ import annotations

import math
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


@dataclass(frozen=True)
class Feedback:
    geomean_speedup: float
    cost_ratio: float
    value: float
    """``ln(geomean_speedup) - cost_weight * cost_ratio``: what learning maximises."""
    cases: tuple[CaseResult, ...] = field(default_factory=tuple)

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

    def _state(self, case: Case, collected: Mapping[str, float] | None) -> kb_logic.StateMatch:
        if collected is None:
            return kb_logic.StateMatch(state=case.static_state or kb_logic.FALLBACK_STATE, distance=None, is_new=False)
        key = (case.sample.name, frozenset(collected))
        if key not in self._states:
            signature = P.KernelProfile(kernel="", metrics=collected).signature()
            self._states[key] = kb_logic.match_state(signature, self.policy.states)
        return self._states[key]

    def run(self, tree: T.Tree | None, cost_weight: float = 0.25) -> Feedback:
        """Replay every case in order with what ``tree`` collects (None: no profile, the static state)."""
        def profile(case: Case) -> tuple[Mapping[str, float] | None, float]:
            if tree is None:
                return None, 0.0
            plan = self._data.plan(tree, case.sample, True)
            return self._data.collected(case.sample, plan), self._data.seconds(plan)
        return self._run(profile, cost_weight)

    def run_full(self, cost_weight: float = 0.25) -> Feedback:
        """Replay with the full profile given to the optimizer (every recorded metric, ``--set full``'s seconds)."""
        full_s = self.costs.full_seconds()
        return self._run(lambda case: (case.sample.metrics, full_s), cost_weight)

    def _run(self, profile, cost_weight: float) -> Feedback:
        entries: dict[tuple[str, str], Entry] = {(e.state, e.technique): e for e in self.policy.priors}
        full_s = self.costs.full_seconds() or 1.0
        results: list[CaseResult] = []
        for case in self.cases:
            collected, seconds = profile(case)
            match = self._state(case, collected)
            if match.is_new and match.parent is not None and not any(s == match.state for s, _ in entries):
                for e in kb_logic.inherit_entries([e for (s, _), e in entries.items() if s == match.parent], match.state):
                    entries[(e.state, e.technique)] = e
            mine = [e for (s, _), e in sorted(entries.items()) if s == match.state]
            drawn = [c.technique for c in kb_logic.select(mine, self.policy.hints, seed=self.policy.seed)]
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
            results.append(CaseResult(case.sample.name, match.state, best, tuple(names), unknown, seconds))
        geomean = math.exp(sum(math.log(r.speedup) for r in results) / len(results)) if results else 1.0
        cost_ratio = sum(r.seconds for r in results) / len(results) / full_s if results else 0.0
        return Feedback(geomean, cost_ratio, math.log(geomean) - cost_weight * cost_ratio, tuple(results))


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


def learn(
    tree: T.Tree,
    replay: Replay,
    *,
    cost_weight: float = 0.25,
    min_gain: float = 0.01,
    max_rounds: int = 20,
    patience: int = 1,
    proposer: T.Proposer | None = None,
) -> tuple[T.Tree, list[Step]]:
    """Greedy refinement by optimization feedback: each round applies the best-scoring proposed edit if it
    gains more than ``min_gain`` (in the score's log units: 0.01 is a 1 % higher geomean at equal cost);
    learning stops after ``patience`` rounds in a row without gain or after ``max_rounds``."""
    samples = [c.sample for c in replay.cases]
    propose = proposer or (lambda t, s, c: T.deterministic_edits(t, s, c, cost_weight))
    current = replay.run(tree, cost_weight).value
    steps: list[Step] = []
    idle = 0
    # Edits measured and not kept since the tree last changed: the next round tries the next best instead.
    rejected: set[str] = set()
    for round_no in range(1, max_rounds + 1):
        best: tuple[Feedback, T.Edit, T.Tree] | None = None
        for edit in propose(tree, samples, replay.costs):
            if edit.description in rejected:
                continue
            candidate = edit.apply(tree)
            feedback = replay.run(candidate, cost_weight)
            if best is None or feedback.value > best[0].value + 1e-12:
                best = (feedback, edit, candidate)
        if best is None:
            break
        feedback, edit, candidate = best
        kept = feedback.value > current + min_gain
        steps.append(Step(round_no, edit.kind, edit.description, current, feedback.value, feedback.geomean_speedup,
                          feedback.cost_ratio, kept))
        if kept:
            tree, current, idle = _with_provenance(tree, edit, steps[-1]), feedback.value, 0
            rejected.clear()
        else:
            rejected.add(edit.description)
            idle += 1
            if idle >= patience:
                break
    return tree, steps


def _with_provenance(tree: T.Tree, edit: T.Edit, step: Step) -> T.Tree:
    """``edit`` applied, each node it wrote saying which round made it and what the score did (``tree show``)."""
    note = (f"learned in round {step.round} ({step.kind}: {step.edit}); score {step.score_before:.4f} -> "
            f"{step.score_after:.4f}, geomean {step.geomean_after:.3f}x at {step.cost_ratio_after:.1%} of full")
    nodes = dict(tree.nodes)
    nodes.update({node_id: replace(node, doc=note) for node_id, node in edit.new_nodes.items()})
    return replace(tree, nodes=nodes)
