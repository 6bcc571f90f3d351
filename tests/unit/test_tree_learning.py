"""Tree learning by optimization feedback (kernel_lsp/core/tree_learning.py): the replayed search and the learner."""

from __future__ import annotations

import json

import pytest

from kernel_lsp.core import kb_logic
from kernel_lsp.core import profiling_tree as T
from kernel_lsp.core import tree_learning as L
from kernel_lsp.core.kb_logic import Entry, KeySpec, State
from kernel_lsp.services.profiler import load_costs

MEM = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
LD_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
LD_REQUESTS = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"

#: Two states told apart only by the coalescing group's sectors per request.
POLICY = L.Policy(
    states=(
        State("uncoalesced", "", {"global_sectors_per_request": KeySpec(16.0, 1.5, 4.0, "min"),
                                  "memory_throughput_pct": KeySpec(70.0, 2.0, 20.0, "min")}),
        State("busy-memory", "", {"memory_throughput_pct": KeySpec(70.0, 2.0, 20.0, "min"),
                                  "global_sectors_per_request": KeySpec(4.0, 1.5, 4.0, "max")}),
    ),
    priors=(
        Entry("uncoalesced", "shared-memory-tiling", 3.0, 0.9, 0, 0),
        Entry("busy-memory", "block-size-tuning", 1.2, 0.6, 0, 0),
    ),
    budget=1,
    hints=1,
)


def _case(name: str, sectors_per_request: float, tiling: float | None) -> L.Case:
    metrics = {MEM: 80.0, SM: 20.0, "gpu__time_duration.sum": 1e6, LD_SECTORS: sectors_per_request * 1000.0,
               LD_REQUESTS: 1000.0}
    tried = (
        L.Tried("rule:block-size[block=128]", "block-size-tuning", 1.01, accepted=False),
        L.Tried("rule:shared-tile", "shared-memory-tiling", tiling, accepted=tiling is not None),
    )
    return L.Case(T.Sample(name, metrics, {}), tried)


@pytest.fixture(scope="module")
def costs():
    c = load_costs()
    assert c is not None
    return c


def _tree(collect: tuple[str, ...]) -> T.Tree:
    return T.parse_tree({"format": "kernel-lsp-profiling-tree", "version": 2, "name": "t",
                         "first_pass": ["group:throughput"], "root": "leaf", "nodes": {"leaf": {"collect": list(collect)}}})


def test_order_puts_the_drawn_technique_first_and_keeps_sequences_after_their_step():
    tried = [
        L.Tried("rule:register-accumulate", "register-accumulation", 2.0, accepted=True),
        L.Tried("rule:register-accumulate+warp-per-row", "warp-per-row", 8.0, accepted=True,
                after="rule:register-accumulate"),
        L.Tried("rule:block-size[block=128]", "block-size-tuning", 0.9),
        L.Tried("rule:block-size[block=256]", "block-size-tuning", 0.8),
    ]
    assert [t.generator for t in L.order(tried, ["block-size-tuning"])] == [
        "rule:block-size[block=128]", "rule:block-size[block=256]", "rule:register-accumulate",
        "rule:register-accumulate+warp-per-row"]
    assert [t.generator for t in L.order(tried, [])] == [t.generator for t in tried]


def test_what_the_tree_collects_decides_the_state_and_so_the_speedup(costs):
    replay = L.Replay([_case("a", 32.0, 4.0)], costs, POLICY)
    blind = replay.run(_tree(()))
    seeing = replay.run(_tree(("group:coalescing",)))
    assert blind.cases[0].state == "busy-memory" and blind.cases[0].speedup == 1.0
    assert blind.cases[0].tried == ("rule:block-size[block=128]",)
    assert seeing.cases[0].state == "uncoalesced" and seeing.cases[0].speedup == pytest.approx(4.0)
    assert seeing.cost_ratio > blind.cost_ratio > 0
    full = replay.run_full()
    assert full.cases[0].speedup == pytest.approx(4.0) and full.cost_ratio == pytest.approx(1.0)
    assert replay.run(None).cases[0].state == kb_logic.FALLBACK_STATE


def test_a_sequence_waits_for_its_step_and_an_unverified_candidate_counts_as_not_accepted(costs):
    policy = L.Policy(POLICY.states, POLICY.priors, budget=3, hints=1)
    tried = (
        L.Tried("rule:register-accumulate", "register-accumulation", None),
        L.Tried("rule:register-accumulate+warp-per-row", "warp-per-row", 9.0, accepted=True,
                after="rule:register-accumulate"),
        L.Tried("rule:grid-stride", "grid-stride-loop", None, verified=False),
        L.Tried("rule:launch-bounds", "launch-bounds", 1.3, accepted=True),
    )
    case = L.Case(T.Sample("k", {MEM: 10.0, SM: 10.0}, {}), tried)
    result = L.Replay([case], costs, policy).run(None).cases[0]
    assert result.tried == ("rule:register-accumulate", "rule:grid-stride", "rule:launch-bounds")
    assert result.unknown == 1 and result.speedup == pytest.approx(1.3)


def test_the_replayed_knowledge_base_learns_from_earlier_kernels(costs):
    # No prior for tiling in 'busy-memory': the first kernel's success there ranks it first for the second.
    policy = L.Policy(POLICY.states, (Entry("busy-memory", "block-size-tuning", 1.05, 0.3, 50, 0),), budget=2, hints=1)
    first = L.Case(T.Sample("first", {MEM: 80.0, SM: 20.0, LD_SECTORS: 4000.0, LD_REQUESTS: 1000.0}, {}),
                   (L.Tried("rule:block-size[block=128]", "block-size-tuning", 0.9),
                    L.Tried("rule:shared-tile", "shared-memory-tiling", 3.0, accepted=True)))
    second = L.Case(T.Sample("second", dict(first.sample.metrics), {}),
                    (L.Tried("rule:block-size[block=128]", "block-size-tuning", 0.9),
                     L.Tried("rule:shared-tile", "shared-memory-tiling", 3.0, accepted=True)))
    tree = _tree(("group:coalescing",))
    results = L.Replay([first, second], costs, L.Policy(policy.states, policy.priors, budget=1, hints=1)).run(tree).cases
    assert results[0].tried == ("rule:block-size[block=128]",)
    learned = L.Replay([first, second], costs, policy).run(tree).cases
    assert learned[0].tried == ("rule:block-size[block=128]", "rule:shared-tile")
    assert learned[1].tried[0] == "rule:shared-tile"


def test_learning_keeps_only_edits_that_raise_the_optimizers_results(costs):
    cases = [_case("a", 32.0, 4.0), _case("b", 24.0, 2.0), _case("c", 2.0, None), _case("d", 28.0, 3.0)]
    replay = L.Replay(cases, costs, POLICY)
    start = _tree(())
    learned, steps = L.learn(start, replay, max_rounds=5)
    assert steps and steps[0].kept and steps[0].score_after > steps[0].score_before + 0.01
    assert not steps[-1].kept or len(steps) == 5
    before, after = replay.run(start), replay.run(learned)
    assert after.geomean_speedup > before.geomean_speedup
    assert after.value > before.value
    changed = [n for n in learned.nodes.values() if "learned in round 1" in n.doc]
    assert changed, "the learned nodes say where they came from"
    json.dumps(T.tree_to_json(learned))


def test_an_edit_that_only_adds_cost_is_not_kept(costs):
    # Every kernel is coalesced: seeing sectors changes no choice, so collecting them only costs.
    cases = [_case("a", 2.0, None), _case("b", 3.0, None)]
    replay = L.Replay(cases, costs, POLICY)
    start = _tree(())
    learned, steps = L.learn(start, replay, max_rounds=3)
    assert all(not s.kept for s in steps) or replay.run(learned).cost_ratio < replay.run(start).cost_ratio
    assert replay.run(learned).geomean_speedup == pytest.approx(1.0)


def test_the_catalogue_states_and_priors_parse():
    from kernel_lsp.services.kb import catalogue_text

    states, priors = kb_logic.catalogue_states(catalogue_text()[1])
    assert len(states) >= 5 and {p.state for p in priors} <= {s.name for s in states}
    assert kb_logic.FALLBACK_STATE in {s.name for s in states}
    assert all(s.signature for s in states if s.name != kb_logic.FALLBACK_STATE)


def test_learning_on_the_recorded_corpus_profiles_and_verdicts():
    """The H200 recordings (every group of each corpus kernel, the harness's verdicts of the corpus benchmark):
    each kept edit raised the training score by more than the noise, and the learned tree costs a fraction of
    the full profile."""
    from pathlib import Path

    from kernel_lsp.services.kb import catalogue_text
    from kernel_lsp.services.profiler import default_tree_path, load_cupti_costs
    from kernel_lsp.services.tree_dataset import load_corpus_cases, split_cases

    root = Path(__file__).resolve().parents[2]
    cases, left_out = load_corpus_cases(str(root / "benchmarks" / "corpus"),
                                        str(root / "tests" / "fixtures" / "tree_learning" / "corpus_profiles_h200.json"),
                                        str(root / "benchmarks" / "results" / "corpus_suite.json"))
    assert len(cases) >= 50 and not left_out
    costs = load_cupti_costs()
    states, priors = kb_logic.catalogue_states(catalogue_text()[1])
    train, held = split_cases(cases)
    replay = L.Replay(train, costs, L.Policy(states, priors, budget=3))
    start = T.parse_tree(Path(default_tree_path()).read_text())
    learned, steps = L.learn(start, replay, max_rounds=3)
    for step in steps:
        assert step.kept == (step.score_after > step.score_before + 0.01)
    assert replay.run(learned).value >= replay.run(start).value
    assert replay.run_full().cost_ratio == pytest.approx(1.0)
    assert replay.run(learned).cost_ratio < 0.25
    assert L.Replay(held, costs, L.Policy(states, priors, budget=3)).run(learned).geomean_speedup >= 1.0
