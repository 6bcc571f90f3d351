"""Profiling tree: parsing, walking, planning within a budget, and refinement that only accepts improvements."""

from __future__ import annotations

import json

import pytest

from kernel_lsp.core import classify as C
from kernel_lsp.core import metric_groups
from kernel_lsp.core import profile as P
from kernel_lsp.core import profiling_tree as T
from kernel_lsp.services.profiler import default_tree_path, hand_tree_path

# A toy cost model: which metrics each section yields and how many passes it costs.
SOL = (P.M_MEMORY_PCT, P.M_SM_PCT, P.M_DRAM_PCT, P.M_DURATION_NS)
LAUNCH = (P.M_WAVES, P.M_REGISTERS, P.M_BLOCK_SIZE, P.M_GRID_SIZE)
OCC = (P.M_THEORETICAL_OCC, P.M_ACHIEVED_OCC, P.M_LIMIT_REGISTERS, P.M_LIMIT_SHARED, P.M_LIMIT_WARPS, P.M_LIMIT_BLOCKS)
TABLES = (P.M_EXCESSIVE_SECTORS, P.M_SECTORS_LD, P.M_SECTORS_ST, P.M_REQUESTS_LD, P.M_BANK_CONFLICTS_LD,
          P.M_BANK_CONFLICTS_ST, P.M_SHARED_REQ_LD, P.M_SHARED_REQ_ST)
WARP = tuple(P.stall_metric(r) for r in P.STALL_REASONS)
COMPUTE = (P.M_FMA_PIPE_PCT, C.PIPE_METRICS["fp64-pipe"], C.PIPE_METRICS["xu-pipe"])
COSTS = T.CostModel(
    sections={
        "SpeedOfLight": T.SectionCost(2, SOL),
        "LaunchStats": T.SectionCost(1, LAUNCH),
        "Occupancy": T.SectionCost(1, OCC),
        "MemoryWorkloadAnalysis_Tables": T.SectionCost(6, TABLES),
        "WarpStateStats": T.SectionCost(2, WARP),
        "ComputeWorkloadAnalysis": T.SectionCost(3, COMPUTE),
    },
    run_s=1.0,
    pass_s=0.1,
    full_sections=("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis_Tables", "WarpStateStats",
                   "ComputeWorkloadAnalysis"),
    full_passes=40,
)


def stalls(**shares: float) -> dict[str, float]:
    return {P.stall_metric(r): v for r, v in shares.items()}


def sample(name: str, mem: float, sm: float, **extra: float) -> T.Sample:
    metrics = {P.M_MEMORY_PCT: mem, P.M_SM_PCT: sm, P.M_DRAM_PCT: mem, P.M_DURATION_NS: 1e5, P.M_WAVES: 4.0,
               P.M_THEORETICAL_OCC: 100.0, P.M_ACHIEVED_OCC: 80.0, P.M_SECTORS_LD: 4e6, P.M_REQUESTS_LD: 1e6,
               P.M_EXCESSIVE_SECTORS: 0.0, P.M_SECTORS_ST: 4e6, P.M_BANK_CONFLICTS_LD: 0.0, P.M_SHARED_REQ_LD: 0.0,
               P.M_FMA_PIPE_PCT: 20.0}
    metrics.update(stalls(long_scoreboard=2.0, wait=1.0, selected=1.0))
    metrics.update(extra)
    return T.Sample(name, metrics)


DATASET = [
    sample("stream", 90, 20),
    sample("stream2", 85, 15),
    sample("strided", 95, 10, **{P.M_SECTORS_LD: 32e6, P.M_EXCESSIVE_SECTORS: 28e6}),
    sample("strided2", 88, 12, **{P.M_SECTORS_LD: 30e6, P.M_EXCESSIVE_SECTORS: 25e6}),
    sample("fma", 10, 92, **{P.M_FMA_PIPE_PCT: 90.0}),
    sample("latency", 20, 15, **stalls(long_scoreboard=10.0, wait=1.0, selected=1.0)),
    sample("barrier", 25, 20, **stalls(barrier=8.0, wait=1.0, selected=1.0)),
]

# Starts from the first pass only: nothing more is collected anywhere.
BARE = {
    "format": T.FORMAT, "version": 1, "name": "bare", "first_pass": ["SpeedOfLight", "LaunchStats", "Occupancy"],
    "root": "all", "nodes": {"all": {"collect": []}},
}


def test_shipped_tree_parses_and_collects_metric_groups_only():
    with open(default_tree_path(), encoding="utf-8") as f:
        tree = T.parse_tree(f.read())
    assert tree.version == T.VERSION == 2 and tree.first_pass == ("group:throughput",)
    for leaf in tree.leaves():
        sections, metrics = T.split_items(leaf.collect)
        # sections would bring rules, a report and its export: the shipped tree never needs them
        assert sections == (), leaf.id
    assert json.loads(json.dumps(T.tree_to_json(tree))) == T.tree_to_json(T.parse_tree(T.tree_to_json(tree)))


def test_shipped_default_is_the_learned_tree_and_the_hand_written_one_stays():
    from pathlib import Path

    with open(default_tree_path(), encoding="utf-8") as f:
        shipped = json.load(f)
    recorded = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "learned_tree.json"
    assert shipped == json.loads(recorded.read_text())  # what `kernel-lsp tree learn` wrote, unchanged
    tree = T.parse_tree(shipped)
    assert tree.name == "learned" and any(leaf.state_from == "source" for leaf in tree.leaves())
    with open(hand_tree_path(), encoding="utf-8") as f:
        hand = T.parse_tree(f.read())
    assert hand.name == "hand-written" and all(leaf.state_from == "profile" for leaf in hand.leaves())


def test_a_leaf_says_where_the_optimizer_takes_the_state_from():
    data = {**BARE, "version": 2, "first_pass": ["group:throughput"], "root": "t", "nodes": {
        "t": {"feature": "static.loops", "op": ">=", "threshold": 1, "then": "src", "else": "prof"},
        "src": {"collect": [], "state_from": "source"}, "prof": {"collect": ["group:stalls"]}}}
    tree = T.parse_tree(data)
    assert tree.node("src").state_from == "source" and tree.node("prof").state_from == "profile"
    out = T.tree_to_json(tree)
    assert out["nodes"]["src"]["state_from"] == "source" and "state_from" not in out["nodes"]["prof"]
    assert T.parse_tree(out) == tree
    # the plan carries it to the profile, before or after the first pass
    looping = T.plan_for(tree, {"static.loops": 2.0}, None)
    straight = T.plan_for(tree, {"static.loops": 0.0}, {"derived.max_throughput_pct": 10.0})
    assert (looping.leaf, looping.state_from) == ("src", "source")
    assert (straight.leaf, straight.state_from) == ("prof", "profile")
    with pytest.raises(T.TreeError, match="state_from"):
        T.parse_tree({**data, "nodes": {**data["nodes"], "src": {"collect": [], "state_from": "model"}}})


def test_version_1_trees_still_parse_and_unknown_groups_are_refused():
    assert T.parse_tree(BARE).first_pass == ("SpeedOfLight", "LaunchStats", "Occupancy")
    with pytest.raises(T.TreeError, match="unknown metric group 'group:nope'"):
        T.parse_tree({**BARE, "version": 2, "nodes": {"all": {"collect": ["group:nope"]}}})
    with pytest.raises(T.TreeError, match="first_pass: unknown metric group"):
        T.parse_tree({**BARE, "first_pass": ["group:typo"]})


def test_split_items_expands_groups_in_order_without_repeats():
    sections, metrics = T.split_items(["group:throughput", "SourceCounters", "group:throughput", "group:divergence"])
    assert sections == ("SourceCounters",)
    assert metrics == metric_groups.GROUPS["throughput"] + metric_groups.GROUPS["divergence"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 3}, "version"),
        ({"root": "nowhere"}, "root"),
        ({"nodes": {"a": {"feature": "sig.x", "op": ">", "threshold": 1, "then": "b", "else": "b"}, "b": {"collect": []}}}, "op"),
        ({"nodes": {"a": {"feature": "x", "op": "<", "threshold": 1, "then": "b", "else": "b"}, "b": {"collect": []}}}, "feature"),
        ({"nodes": {"a": {"feature": "sig.x", "op": "<", "threshold": 1, "then": "a", "else": "b"}, "b": {"collect": []}}}, "loops"),
        ({"nodes": {"a": {"collect": []}, "orphan": {"collect": []}}}, "unreachable"),
    ],
)
def test_bad_trees_are_refused_with_the_field(change, message):
    data = {**BARE, "root": "a", "nodes": {"a": {"collect": []}}}
    data.update(change)
    with pytest.raises(T.TreeError, match=message):
        T.parse_tree(data)


def test_walk_records_path_and_missing_branch():
    with open(hand_tree_path(), encoding="utf-8") as f:
        tree = T.parse_tree(f.read())
    facts = T.facts_from_metrics({P.M_MEMORY_PCT: 91.0, P.M_SM_PCT: 30.0})
    result = T.walk(tree, facts)
    assert result.leaf is not None and result.leaf.id == "memory_causes"
    assert [(s.node, s.branch) for s in result.path] == [("busy", "then"), ("memory_side", "then")]
    assert result.path[0].value == 91.0
    missing = T.walk(tree, {})
    assert missing.path[0].branch == "missing" and missing.leaf.id == "fallback"
    pending = T.walk(tree, {}, stop_on_pending=T.MEASURED_PREFIXES)
    assert pending.leaf is None and pending.waiting_on.id == "busy"


def test_plan_respects_pass_budget_in_priority_order():
    tree = T.parse_tree({**BARE, "budget": {"max_passes": 7},
                         "nodes": {"all": {"collect": ["MemoryWorkloadAnalysis_Tables", "WarpStateStats", "ComputeWorkloadAnalysis"]}}})
    plan = T.plan_from_walk(tree, T.walk(tree, {}), first_pass_ran=True, costs=COSTS)
    assert plan.sections == ("MemoryWorkloadAnalysis_Tables", "WarpStateStats")
    assert plan.dropped == ("ComputeWorkloadAnalysis",)
    assert plan.runs == (tree.first_pass, plan.sections)


def test_static_only_walk_gives_one_merged_run():
    tree = T.parse_tree({**BARE, "root": "t", "nodes": {
        "t": {"feature": "static.syncs", "op": ">=", "threshold": 1, "then": "w", "else": "none"},
        "w": {"collect": ["WarpStateStats"]}, "none": {"collect": []}}})
    s = T.Sample("k", DATASET[6].metrics, {"static.syncs": 2.0})
    plan, collected, seconds = T.emulate(tree, s, COSTS)
    assert plan.first_pass == () and plan.runs == (("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats"),)
    assert T.emulate(tree, s, COSTS, warm=False)[0] == plan
    assert P.stall_metric("barrier") in collected and P.M_EXCESSIVE_SECTORS not in collected
    assert seconds == pytest.approx(COSTS.seconds(1, plan.sections))


def test_emulation_sees_only_collected_metrics():
    tree = T.parse_tree(BARE)
    plan, collected, _ = T.emulate(tree, DATASET[2], COSTS)
    assert set(collected) <= set(SOL + LAUNCH + OCC)
    # without the memory tables the strided kernel is only "memory-bound"
    assert C.classify(collected).label == "memory-bound"
    assert C.classify(DATASET[2].metrics).label == "uncoalesced-access"


def test_refine_accepts_only_improving_edits_and_reaches_agreement():
    tree = T.parse_tree(BARE)
    before = T.score(tree, DATASET, COSTS)
    refined, log = T.refine(tree, DATASET, COSTS, max_rounds=10)
    after = T.score(refined, DATASET, COSTS)
    assert before.agreement < 0.5
    assert after.value > before.value and after.agreement == 1.0
    accepted = [e for e in log if e.accepted]
    assert accepted and all(e.score_after > e.score_before for e in accepted)
    # scores of accepted edits rise monotonically, and the loop stops on the first rejection
    assert all(a.score_after <= b.score_before + 1e-12 for a, b in zip(accepted, accepted[1:]))
    assert all(e.accepted for e in log[:-1])
    # a split was needed: memory kernels want the tables, latency kernels the warp states
    assert any(e.kind == "SPLIT" for e in accepted)
    # cheaper than a first pass followed by every other section for every kernel
    everything = T.parse_tree({**BARE, "root": "t", "nodes": {
        "t": {"feature": "derived.max_throughput_pct", "op": ">=", "threshold": -1, "then": "all", "else": "all"},
        "all": {"collect": list(COSTS.full_sections[3:])}}})
    assert after.cost_ratio < T.score(everything, DATASET, COSTS).cost_ratio


def test_refine_rejects_an_edit_that_does_not_improve():
    tree = T.parse_tree({**BARE, "nodes": {"all": {"collect": ["MemoryWorkloadAnalysis_Tables", "WarpStateStats",
                                                                  "ComputeWorkloadAnalysis"]}}})

    def worse(t, samples, costs):
        return [T.Edit("REWRITE", "all", "drop everything", {"all": T.Leaf("all", ())})]

    refined, log = T.refine(tree, DATASET, COSTS, proposer=worse)
    assert refined == tree
    assert len(log) == 1 and not log[0].accepted and log[0].score_after < log[0].score_before


def test_cost_model_passes_and_seconds():
    assert COSTS.passes([]) == 0
    assert COSTS.passes(["SpeedOfLight"]) == 2
    # one-pass sections ride along; other sections add half their passes (shared passes)
    assert COSTS.passes(["SpeedOfLight", "LaunchStats", "Occupancy"]) == 2
    assert COSTS.passes(["SpeedOfLight", "MemoryWorkloadAnalysis_Tables", "WarpStateStats"]) == 8
    assert COSTS.seconds(2, ["SpeedOfLight"]) == pytest.approx(2 * 1.0 + 1 * 0.1)
    assert COSTS.full_seconds() == pytest.approx(1.0 + 39 * 0.1)


def test_cost_model_charges_sections_and_sass_patching_once_per_run():
    costs = T.CostModel(
        sections={"SourceCounters": T.SectionCost(5, (), extra_s=0.5),
                  "group:throughput": T.SectionCost(10, ()),
                  "group:coalescing_sass": T.SectionCost(1, (), extra_s=0.5),
                  "group:shared_sass": T.SectionCost(1, (), extra_s=0.5)},
        run_s=1.5, pass_s=0.02, section_run_s=0.6,
    )
    groups_only = costs.seconds(1, ["group:throughput"])
    assert groups_only == pytest.approx(1.5 + 9 * 0.02)
    # two instruction-level groups: one SASS patching
    sass = costs.seconds(1, ["group:throughput", "group:coalescing_sass", "group:shared_sass"])
    assert sass == pytest.approx(1.5 + 9 * 0.02 + 0.5)  # one-pass groups ride along
    # a section: its rules, report and export on top
    with_section = costs.seconds(1, ["group:throughput", "SourceCounters"])
    assert with_section == pytest.approx(1.5 + (10 + 2 - 1) * 0.02 + 0.5 + 0.6)
    # a group's metrics come from the group table, whatever the cost file lists
    assert costs.metrics_of(["group:divergence"]) >= set(metric_groups.GROUPS["divergence"])


# --- on the recorded dataset (27 kernels, full profiles from an H200) ---------------------

def _recorded():
    from kernel_lsp.services.profiler import load_costs
    from kernel_lsp.services.tree_dataset import load_recorded_samples

    # the same samples `kernel-lsp tree learn` holds a learned tree's agreement to
    return load_recorded_samples(), load_costs()


def test_shipped_tree_on_recorded_profiles():
    samples, costs = _recorded()
    assert len(samples) == 27 and sum(1 for s in samples if s.static_facts) == 24  # zoo.cu + the programs
    with open(default_tree_path(), encoding="utf-8") as f:
        tree = T.parse_tree(f.read())
    result = T.score(tree, samples, costs)
    assert result.agreement >= 0.9
    assert result.cost_ratio < 0.45  # estimated seconds against --set full's
    # a repeat profile of the STREAM triad: one run, the first pass plus what tells memory causes apart
    stream = next(s for s in samples if "stream_triad" in s.name)
    plan, collected, _ = T.emulate(tree, stream, costs, warm=True)
    assert plan.leaf == "memory_causes" and plan.state_from == "profile"
    assert plan.runs == (("group:throughput", "group:coalescing_sass", "group:shared_sass", "group:memory_units"),)
    assert P.M_EXCESSIVE_SECTORS not in collected and P.M_GLOBAL_SECTORS_IDEAL in collected
    assert C.classify(collected).label == "dram-bandwidth"
    strided = next(s for s in samples if "strided_gather" in s.name)
    _, collected, _ = T.emulate(tree, strided, costs, warm=True)
    assert C.classify(collected).label == C.classify(strided.metrics).label == "uncoalesced-access"


def test_refine_on_recorded_profiles_accepts_only_improvements():
    samples, costs = _recorded()
    with open(default_tree_path(), encoding="utf-8") as f:
        tree = T.parse_tree(f.read())
    before = T.score(tree, samples, costs)
    refined, log = T.refine(tree, samples, costs, max_rounds=2)
    after = T.score(refined, samples, costs)
    assert after.value >= before.value
    for entry in log:
        assert entry.accepted == (entry.score_after > entry.score_before + 1e-3)
    assert after.agreement >= before.agreement - 0.05


def test_unmeasured_policy_first_pass_runs_twice_on_a_first_profile():
    data = {**BARE, "unmeasured": "first_pass", "root": "t", "nodes": {
        "t": {"feature": "derived.max_throughput_pct", "op": ">=", "threshold": 60, "then": "tables", "else": "warp"},
        "tables": {"collect": ["MemoryWorkloadAnalysis_Tables"]}, "warp": {"collect": ["WarpStateStats"]}}}
    tree = T.parse_tree(data)
    strided = DATASET[2]
    cold, collected, cold_s = T.emulate(tree, strided, COSTS, warm=False)
    assert cold.runs == (tree.first_pass, ("MemoryWorkloadAnalysis_Tables",)) and cold.leaf == "tables"
    warm, _, warm_s = T.emulate(tree, strided, COSTS, warm=True)
    assert warm.runs == (tree.first_pass + ("MemoryWorkloadAnalysis_Tables",),) and warm_s < cold_s
    assert C.classify(collected).label == "uncoalesced-access"
    # the default policy takes the missing branch instead: one run, the else leaf
    missing = T.parse_tree({**data, "unmeasured": "missing"})
    assert T.emulate(missing, strided, COSTS, warm=False)[0].runs == (tree.first_pass + ("WarpStateStats",),)
    with pytest.raises(T.TreeError, match="unmeasured"):
        T.parse_tree({**data, "unmeasured": "sometimes"})


def test_a_kernel_with_barriers_has_the_stall_counters_in_every_tree_profile():
    samples, costs = _recorded()
    with open(default_tree_path(), encoding="utf-8") as f:
        tree = T.parse_tree(f.read())
    heavy = next(s for s in samples if ":z_barrier_heavy:" in s.name)
    assert heavy.static_facts["static.syncs"] >= 1
    truth = C.classify(heavy.metrics).label
    assert truth == "barrier-stalls"
    for warm in (True, False):
        plan, collected, _ = T.emulate(tree, heavy, costs, warm=warm)
        assert "group:stalls" in plan.sections or "group:stalls" in plan.first_pass
        assert C.classify(collected).label == truth
    # The same busy leaf without barriers in the source collects no stall counters.
    bare = T.Sample(heavy.name, heavy.metrics, {**heavy.static_facts, "static.syncs": 0.0})
    plan, collected, _ = T.emulate(tree, bare, costs, warm=True)
    assert "group:stalls" not in plan.sections and C.classify(collected).label != truth
