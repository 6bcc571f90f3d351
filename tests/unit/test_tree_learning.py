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
    from kernel_lsp.services.profiler import hand_tree_path, load_cupti_costs
    from kernel_lsp.services.tree_dataset import load_corpus_cases, split_cases

    root = Path(__file__).resolve().parents[2]
    cases, left_out = load_corpus_cases(str(root / "benchmarks" / "corpus"),
                                        str(root / "tests" / "fixtures" / "tree_learning" / "corpus_profiles_h200.json"),
                                        str(root / "benchmarks" / "results" / "corpus_suite.json"))
    # Held-out corpus entries have no recordings on purpose: nothing is learned or tuned on them.
    heldout = {path.parent.name for path in (root / "benchmarks" / "corpus").glob("*/spec.json")
               if json.loads(path.read_text()).get("notes", {}).get("heldout")}
    assert len(cases) >= 50 and all(why.split(":", 1)[0] in heldout for why in left_out), left_out
    costs = load_cupti_costs()
    states, priors = kb_logic.catalogue_states(catalogue_text()[1])
    train, held = split_cases(cases)
    replay = L.Replay(train, costs, L.Policy(states, priors, budget=3, replicas=4))
    start = T.parse_tree(Path(hand_tree_path()).read_text())
    learned, steps = L.learn(start, replay, max_rounds=2)
    for step in steps:
        gain = step.score_after - step.score_before
        assert step.kept == (gain > 0.01 and gain > 2.0 * step.gain_se)
    assert replay.run(learned).value >= replay.run(start).value
    assert replay.run_full().cost_ratio == pytest.approx(1.0)
    assert replay.run(learned).cost_ratio < 0.25
    assert L.Replay(held, costs, L.Policy(states, priors, budget=3)).run(learned).geomean_speedup >= 1.0


def _misled(name: str, loops: float, sectors_per_request: float, memory_pct: float = 80.0,
            static_state: str = "uncoalesced") -> L.Case:
    """A kernel that tiling speeds up 3x; the static analysis reads its source as ``static_state``."""
    case = _case(name, sectors_per_request, 3.0)
    metrics = {**case.sample.metrics, MEM: memory_pct}
    return L.Case(T.Sample(name, metrics, {"static.loops": loops}), case.tried, static_state)


def _two_leaf_tree(source_when_looping: bool) -> T.Tree:
    looping = {"collect": [], "state_from": "source"} if source_when_looping else {"collect": ["group:coalescing"]}
    return T.parse_tree({"format": "kernel-lsp-profiling-tree", "version": 2, "name": "t",
                         "first_pass": ["group:throughput"], "root": "t", "nodes": {
                             "t": {"feature": "static.loops", "op": ">=", "threshold": 1, "then": "a", "else": "b"},
                             "a": looping, "b": {"collect": ["group:coalescing"]}}})


def test_a_source_leaf_ranks_by_the_static_state_and_still_pays_the_first_pass(costs):
    # Coalesced in the profile (busy memory: block sizes first), tiled well all the same: the source knows.
    case = _misled("k", 1.0, 2.0)
    replay = L.Replay([case], costs, POLICY)
    by_profile, by_source = replay.run(_two_leaf_tree(False)), replay.run(_two_leaf_tree(True))
    assert (by_profile.cases[0].state, by_profile.cases[0].speedup) == ("busy-memory", 1.0)
    assert not by_profile.cases[0].from_source
    assert by_source.cases[0].from_source and by_source.cases[0].state == "uncoalesced"
    assert by_source.cases[0].speedup == pytest.approx(3.0)
    assert 0 < by_source.cases[0].seconds < by_profile.cases[0].seconds
    assert replay.outcome_key(_two_leaf_tree(True)) != replay.outcome_key(_two_leaf_tree(False))
    moved = T.parse_tree({**T.tree_to_json(_two_leaf_tree(True)), "nodes": {
        **T.tree_to_json(_two_leaf_tree(True))["nodes"],
        "t": {"feature": "static.loops", "op": ">=", "threshold": 0.5, "then": "a", "else": "b"}}})
    assert replay.outcome_key(moved) == replay.outcome_key(_two_leaf_tree(True))  # same routing, same outcome


def test_replicas_vary_the_seed_and_the_order_and_the_first_is_the_plain_replay(costs):
    cases = [_case(n, s, t) for n, s, t in (("a", 32.0, 4.0), ("b", 2.0, None), ("c", 28.0, 3.0), ("d", 3.0, None))]
    tree = _tree(("group:coalescing",))
    one = L.Replay(cases, costs, POLICY).run(tree)
    many = L.Replay(cases, costs, L.Policy(POLICY.states, POLICY.priors, POLICY.budget, POLICY.hints, replicas=5))
    assert [c.sample.name for c in many.orders[0]] == ["a", "b", "c", "d"]
    assert any([c.sample.name for c in order] != ["a", "b", "c", "d"] for order in many.orders[1:])
    feedback = many.run(tree)
    assert len(feedback.replica_values) == 5 and feedback.replica_values[0] == pytest.approx(one.value)
    assert feedback.value == pytest.approx(sum(feedback.replica_values) / 5)
    assert feedback.cases == one.cases


def test_paired_gain_measures_the_noise_over_replicas():
    before = L.Feedback(1.0, 0.0, 0.15, (), (0.0, 0.1, 0.2, 0.3))
    steady = L.Feedback(1.0, 0.0, 0.2, (), (0.05, 0.15, 0.25, 0.35))
    noisy = L.Feedback(1.0, 0.0, 0.2, (), (0.25, -0.05, 0.45, 0.15))
    assert L._paired_gain(before, steady) == pytest.approx((0.05, 0.0))
    gain, se = L._paired_gain(before, noisy)
    assert gain == pytest.approx(0.05) and se > gain / 2  # within two standard errors: not a gain


def test_learning_edits_route_to_the_source_on_static_and_measured_facts(costs):
    cases = [_misled("a", 1.0, 2.0, 75.0), _misled("b", 0.0, 30.0, 90.0), _misled("c", 2.0, 3.0, 85.0)]
    tree = _tree(("group:coalescing",))
    edits = L.learning_edits(tree, [c.sample for c in cases], costs)
    described = [e.description for e in edits]
    assert "leaf: state from the source" in described
    splits = [e for e in edits if e.kind == "SPLIT" and "source state" in e.description]
    assert any("static.loops" in e.description for e in splits)
    assert any("sig." in e.description or "derived." in e.description for e in splits)
    routed = next(e for e in splits if "static.loops" in e.description).apply(tree)
    assert sum(leaf.state_from == "source" for leaf in routed.leaves()) == 1
    source_tree = next(e for e in edits if e.description == "leaf: state from the source").apply(tree)
    again = [e.description for e in L.learning_edits(source_tree, [c.sample for c in cases], costs)]
    assert "leaf: state from the profile" in again and not any(" add " in d for d in again)


def test_learning_routes_the_kernels_whose_profile_misleads_to_the_source(costs):
    # Looping kernels look coalesced in the profile but tile well (the source says so); for the others the
    # profile is right and the source misleads. Only a split on the static fact serves both.
    cases = ([_misled(f"loop{i}", 1.0, 2.0 + i) for i in range(3)]
             + [_misled(f"flat{i}", 0.0, 30.0 + i, static_state="busy-memory") for i in range(3)])
    replay = L.Replay(cases, costs, L.Policy(POLICY.states, POLICY.priors, POLICY.budget, POLICY.hints, replicas=3))
    start = _tree(("group:coalescing",))
    learned, steps = L.learn(start, replay, max_rounds=4)
    assert steps[0].kept
    result = replay.run(learned)
    assert result.geomean_speedup == pytest.approx(3.0) and replay.run(start).geomean_speedup < 3.0
    assert {c.name for c in result.cases if c.from_source} == {"loop0", "loop1", "loop2"}
    assert any(leaf.state_from == "source" and "learned in round" in leaf.doc for leaf in learned.leaves())


def test_an_edit_the_confirmation_replicas_do_not_bear_out_is_not_kept(costs):
    policy = L.Policy(POLICY.states, POLICY.priors, POLICY.budget, POLICY.hints, replicas=3)
    chosen_on = L.Replay([_misled(f"loop{i}", 1.0, 2.0 + i) for i in range(3)], costs, policy)
    # The same kernels, but there the source misleads: routing them to it loses.
    confirm = L.Replay([_misled(f"loop{i}", 1.0, 2.0 + i, static_state="busy-memory") for i in range(3)], costs, policy)
    start = _tree(("group:coalescing",))
    _, unconfirmed = L.learn(start, chosen_on, max_rounds=1)
    assert unconfirmed[0].kept and unconfirmed[0].confirm_gain is None
    learned, steps = L.learn(start, chosen_on, max_rounds=1, confirm=confirm)
    assert steps[0].edit == unconfirmed[0].edit and not steps[0].kept
    assert steps[0].confirm_gain is not None and steps[0].confirm_gain <= 0.01
    assert learned == start


def test_tree_learn_records_the_steps_noise_and_all_four_arms(tmp_path, capsys):
    from pathlib import Path

    from kernel_lsp.cli import main

    root = Path(__file__).resolve().parents[2]
    records, out = tmp_path / "records.json", tmp_path / "tree.json"
    assert main(["tree", "learn", "--corpus", str(root / "benchmarks" / "corpus"),
                 "--profiles", str(root / "tests" / "fixtures" / "tree_learning" / "corpus_profiles_h200.json"),
                 "--outcomes", str(root / "benchmarks" / "results" / "corpus_suite.json"),
                 "--replicas", "2", "--confirm-replicas", "2", "--rounds", "1", "--records", str(records),
                 "--out", str(out)]) == 0
    data = json.loads(records.read_text())
    assert data["replicas"] == 2 and data["confirm_replicas"] == 2 and data["noise_z"] == 2.0
    assert len(data["steps"]) == 1
    assert {"gain_se", "confirm_gain", "confirm_se", "kept", "score_before", "score_after"} <= set(data["steps"][0])
    # the agreement with the recorded full profiles test_tree.py holds the shipped tree to, per step and per arm
    assert data["agreement"]["samples"] == 27 and data["agreement"]["start"] == 1.0
    assert data["agreement"]["floor"] == pytest.approx(0.95)
    assert data["steps"][0]["agreement_before"] == 1.0 and data["steps"][0]["agreement_after"] >= 0.95
    for split in ("train", "held_out"):
        arms = data["evaluation"][split]
        assert set(arms) == {"learned", "hand_written", "full", "no_profile"}
        assert all(len(arm["replica_scores"]) == 2 for arm in arms.values())
        assert all(k["state_from"] == "source" for k in arms["no_profile"]["kernels"])
        assert arms["full"]["cost_ratio"] == pytest.approx(1.0) and arms["no_profile"]["seconds_per_kernel"] == 0.0
        assert arms["hand_written"]["agreement"] == 1.0 and arms["learned"]["agreement"] >= 0.95
        assert arms["full"]["agreement"] == 1.0 and arms["no_profile"]["agreement"] is None
    assert "from 'hand-written'" in T.parse_tree(out.read_text()).doc  # learning starts from the hand-written tree
    assert "held_out  learned" in capsys.readouterr().err


def test_the_side_of_a_split_that_keeps_the_leaf_keeps_its_why():
    tree = T.parse_tree({"format": "kernel-lsp-profiling-tree", "version": 2, "name": "t",
                         "first_pass": ["group:throughput"], "root": "leaf",
                         "nodes": {"leaf": {"collect": ["group:stalls"], "doc": "Stalls name the wait."}}})
    edit = L._source_split(tree, tree.node("leaf"), "static.loops", 1.0, source_high=True)
    step = L.Step(3, edit.kind, edit.description, 0.1, 0.2, 1.2, 0.05, True, 0.01, 0.08, 0.02)
    learned = L._with_provenance(tree, edit, step)
    kept, source = learned.node("leaf_lo"), learned.node("leaf_source")
    assert kept.doc.startswith("Stalls name the wait. (learned in round 3") and kept.collect == ("group:stalls",)
    assert source.doc.startswith("learned in round 3") and "confirmed gain 0.0800" in source.doc
    assert source.state_from == "source" and source.collect == ()
    assert learned.node("leaf").doc.startswith("learned in round 3")


def test_a_split_above_a_test_routes_its_whole_subtree_and_unknown_facts_keep_their_way(costs):
    tree = _two_leaf_tree(False)
    edit = L._source_split(tree, tree.node("t"), "static.params", 4.0, source_high=False)
    split = edit.apply(tree)
    guard, moved = split.node("t"), split.node("t_hi")
    assert isinstance(guard, T.Test) and guard.feature == "static.params" and guard.else_ == "t_source"
    assert guard.missing == "t_hi" and isinstance(moved, T.Test) and moved.feature == "static.loops"
    assert T.parse_tree(T.tree_to_json(split)) == split  # a valid tree: no cycle, every node reachable
    assert T.walk(split, {"static.params": 2.0, "static.loops": 1.0}).leaf.id == "t_source"
    assert T.walk(split, {"static.params": 6.0, "static.loops": 1.0}).leaf.id == "a"
    assert T.walk(split, {"static.loops": 0.0}).leaf.id == "b"  # fact unknown: the subtree decides
    cases = [L.Case(T.Sample(f"k{i}", {MEM: 80.0 + i, SM: 20.0}, {"static.loops": float(i % 2)}), (), None)
             for i in range(3)]
    assert any(e.node == "t" and e.kind == "SPLIT" for e in L.learning_edits(tree, [c.sample for c in cases], costs))


def _recorded_strided(loops: float) -> T.Sample:
    """The recorded strided gather's full profile: only the SASS coalescing group names its class."""
    from kernel_lsp.services.tree_dataset import load_recorded_samples

    strided = next(s for s in load_recorded_samples() if "strided_gather" in s.name)
    return T.Sample("strided", strided.metrics, {"static.loops": loops})


def test_the_agreement_floor_is_the_start_less_a_margin_but_not_below_the_contract(costs):
    sample = _recorded_strided(1.0)
    informed, bare = _tree(("group:coalescing", "group:coalescing_sass")), _tree(())
    full_agreement = L.Agreement([sample], costs, informed)
    assert full_agreement.start == 1.0 and full_agreement.floor == pytest.approx(0.95)
    assert full_agreement.holds(informed) and not full_agreement.holds(bare) and full_agreement.of(bare) == 0.0
    # a wide margin stops at the contract; a start already below it is the floor itself
    assert L.Agreement([sample], costs, informed, margin=0.5).floor == pytest.approx(0.9)
    below = L.Agreement([sample], costs, bare)
    assert below.start == 0.0 and below.floor == 0.0 and below.holds(bare)


def test_an_edit_that_leaves_the_profile_naming_another_bottleneck_is_not_kept(costs):
    # As in the test above: routing the looping kernels to the source raises the optimizer's results...
    cases = ([_misled(f"loop{i}", 1.0, 2.0 + i) for i in range(3)]
             + [_misled(f"flat{i}", 0.0, 30.0 + i, static_state="busy-memory") for i in range(3)])
    replay = L.Replay(cases, costs, L.Policy(POLICY.states, POLICY.priors, POLICY.budget, POLICY.hints, replicas=3))
    start = _tree(("group:coalescing", "group:coalescing_sass"))
    unguarded, free_steps = L.learn(start, replay, max_rounds=4)
    assert free_steps[0].kept and "static.loops" in free_steps[0].edit and free_steps[0].agreement_after is None
    # ...but a looping kernel's source leaf collects nothing more, and its profile would no longer say uncoalesced.
    agreement = L.Agreement([_recorded_strided(1.0)], costs, start)
    assert agreement.of(unguarded) < agreement.floor
    learned, steps = L.learn(start, replay, max_rounds=4, agreement=agreement)
    assert agreement.of(learned) >= agreement.floor
    assert steps[0].agreement_before == 1.0 and steps[0].refused_edit == free_steps[0].edit
    assert steps[0].refused_agreement == 0.0 and steps[0].refused_gain == pytest.approx(free_steps[0].score_after
                                                                                         - free_steps[0].score_before)
    assert all(s.agreement_after >= agreement.floor for s in steps)
    # where the recorded kernel does not loop, the same split leaves its profile as it was and is kept
    elsewhere = L.Agreement([_recorded_strided(0.0)], costs, start)
    kept, kept_steps = L.learn(start, replay, max_rounds=4, agreement=elsewhere)
    assert kept_steps[0].kept and kept_steps[0].edit == free_steps[0].edit and kept_steps[0].agreement_after == 1.0
    assert kept_steps[0].refused_edit is None and "agrees with the full profile's class on 100%" in "".join(
        leaf.doc for leaf in kept.leaves())
