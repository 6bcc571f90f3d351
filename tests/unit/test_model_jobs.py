"""The model's three jobs (planner, editor, repairer), driven by a scripted model (no llama.cpp)."""

from __future__ import annotations

import json

import pytest

from kernel_lsp.core.candidates import Candidate, OptimizeRequest, TechniqueHint
from kernel_lsp.core.chat_template import ToolFormat
from kernel_lsp.core.rules import RuleGenerator
from kernel_lsp.core.spec import parse_spec
from kernel_lsp.core.verdict import Reason, Verdict
from kernel_lsp.services.agent import AgentTools, CompileFeedback
from kernel_lsp.services.model_jobs import (
    JobBudgets,
    ModelJobs,
    build_menu,
    edit_schema,
    parse_edit,
    planner_schema,
    rank_votes,
    searchable_lines,
)
from kernel_lsp.services.optimizer import Budget, optimize
from scripted_model import ScriptedModel

SOURCE = """#include <cuda_runtime.h>

__global__ void scale(float *out, const float *in, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * in[i];
}

void launch(float *out, const float *in, float a, int n) {
    scale<<<(n + 255) / 256, 256>>>(out, in, a, n);
}
"""

SPEC = {
    "kernel": "scale",
    "params": [
        {"name": "out", "array": "float32", "size": "n", "init": "zeros", "role": "out"},
        {"name": "in", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
        {"name": "a", "scalar": "float32", "value": 2.0},
        {"name": "n", "scalar": "int32", "value": 1 << 20},
    ],
    "grid": ["(n+255)/256", 1, 1],
    "block": [256, 1, 1],
}

HINT = TechniqueHint(
    name="restrict-const", description="Mark pointers __restrict__ so loads may use the read-only path.",
    predicted_speedup=1.1, confidence=0.5,
    example_before="__global__ void k(float *x, const float *y) { x[threadIdx.x] = y[threadIdx.x]; }",
    example_after="__global__ void k(float *__restrict__ x, const float *__restrict__ y) { x[threadIdx.x] = y[threadIdx.x]; }",
)


def request(**changes) -> OptimizeRequest:
    base = dict(source=SOURCE, path="scale.cu", kernel="scale", spec=SPEC, profile_summary="dram 80% of peak",
                state="memory_bound", techniques=(HINT,))
    base.update(changes)
    return OptimizeRequest(**base)


def choice(ident: str) -> str:
    return json.dumps({"choice": ident, "reason": "fewer loads"})


def edit(*hunks: tuple[str, str]) -> str:
    return json.dumps({"plan": "change it", "hunks": [{"search": s, "replace": r} for s, r in hunks]})


def menu_ids() -> list[str]:
    return [e.id for e in build_menu(list(RuleGenerator().generate(request())))]


def compiles_unless(marker: str):
    def compile_tool(source: str) -> CompileFeedback:
        if marker in source:
            return CompileFeedback(False, f"scale.cu(5): error: identifier \"{marker}\" is undefined")
        return CompileFeedback(True, "ptxas info: Used 8 registers")
    return compile_tool


def budgets(**changes) -> JobBudgets:
    base = dict(planner_samples=3, planner_picks=1, editor_techniques=1, editor_samples=1, repair_rounds=2)
    base.update(changes)
    return JobBudgets(**base)


def test_the_menu_is_the_rules_rewrites_and_the_schema_admits_only_it():
    ids = menu_ids()
    assert len(ids) >= 2 and len(set(ids)) == len(ids)
    assert planner_schema(ids)["properties"]["choice"]["enum"] == ids
    assert edit_schema()["properties"]["hunks"]["maxItems"] >= 1
    lines = ["    int i = 0;", "    out[i] = 1;"]
    assert edit_schema(lines)["properties"]["hunks"]["items"]["properties"]["search"]["enum"] == lines


def test_searchable_lines_are_the_kernels_lines_that_occur_once():
    kernel = "void k() {\n    x = 1;\n    x = 1;\n    y = x;\n\n}\n"
    assert searchable_lines(kernel) == ["void k() {", "    y = x;", "}"]
    assert searchable_lines("a\nab\n") == ["ab"]  # "a" also occurs inside "ab"


def test_votes_rank_agreed_entries_by_count_then_the_menus_order():
    menu = ["a", "b", "c", "d"]
    assert rank_votes(["b", "a", "a", "c", "b", "a"], menu) == ("a", "b")
    assert rank_votes(["d", "c", "d"], menu) == ("d",)
    assert rank_votes(["d", "c", "d", "c"], menu) == ("c", "d")
    # Samples that all disagree leave the menu's order; a single sample's choice stands.
    assert rank_votes(["c", "b", "d"], menu) == ()
    assert rank_votes(["d"], menu) == ("d",)
    assert rank_votes([], menu) == ()


def test_planner_votes_decide_which_rule_candidate_comes_first():
    ids = menu_ids()
    default_first = ids[0]
    chosen = ids[-1]
    model = ScriptedModel([choice(chosen), choice(ids[1]), choice(chosen)])
    jobs = ModelJobs(model, budgets=budgets(editor_samples=0))
    out = list(jobs.generate(request()))
    assert out[0].generator == "rule:" + chosen
    assert jobs.order[0] == chosen and jobs.order[1] == default_first
    # Every menu entry is still offered once, after the picks, in the rules' order.
    assert sorted(jobs.order) == sorted(ids)
    assert [i for i in jobs.order[1:]] == [i for i in ids if i != chosen]
    assert jobs.plan.votes == {chosen: 2, ids[1]: 1}
    stats = jobs.stats["planner"]
    assert stats.calls == 3 and stats.candidates == 1 and stats.tokens > 0  # only the agreed entry is a pick
    assert all(call.schema == planner_schema(ids) for call in model.calls)
    assert "Menu of transformations" in model.calls[0].messages[1]["content"] and "restrict-const" in model.calls[0].messages[1]["content"]


def test_planner_without_usable_answers_keeps_the_rules_order():
    ids = menu_ids()
    model = ScriptedModel(['{"choice": "not-on-the-menu", "reason": ""}', "no json", "{}"])
    jobs = ModelJobs(model, budgets=budgets(editor_samples=0))
    list(jobs.generate(request()))
    assert jobs.order == ids
    assert jobs.stats["planner"].invalid == 3


def test_editor_hunks_make_a_compiled_candidate_with_its_trace():
    ids = menu_ids()
    model = ScriptedModel([choice(ids[0])] * 3 + [edit(("if (i < n) out[i] = a * in[i];",
                                                         "if (i < n) out[i] = a * __ldg(&in[i]);"))])
    sink = []
    jobs = ModelJobs(model, tools=AgentTools(compile=compiles_unless("nothing")), budgets=budgets(),
                     trace_sink=sink.append)
    out = list(jobs.generate(request()))
    edited = [c for c in out if c.generator.endswith("/editor")]
    assert len(edited) == 1
    assert "__ldg(&in[i])" in edited[0].source and "void launch" in edited[0].source
    assert out.index(edited[0]) == 1  # after the planner's one pick, before the rest of the menu
    stats = jobs.stats["editor"]
    assert (stats.candidates, stats.compile_checked, stats.compiled, stats.hunks_failed) == (1, 1, 1, 0)
    # The editor's prompt starts with the planner's context (the kernel, its facts, the profile, the ranked
    # techniques: one prefix for llama.cpp to evaluate), then the task with the verified example; the answer
    # is constrained to the hunk schema.
    planner, editor = model.calls[0].messages, model.calls[3].messages
    assert editor[0] == planner[0]
    context = planner[1]["content"].split("\n\nMenu of transformations")[0]
    assert editor[1]["content"].startswith(context) and "Facts from the analysis" in context
    assert "restrict-const (predicted 1.10x)" in context and "dram 80% of peak" in context
    task = editor[1]["content"][len(context):]
    assert task.index("Task: apply restrict-const") < task.index("Before:") < task.index("After:")
    kernel_lines = searchable_lines(SOURCE.split("\n\nvoid launch")[0].split("\n", 2)[2])
    assert model.calls[3].schema == edit_schema(kernel_lines)
    assert "    if (i < n) out[i] = a * in[i];" in kernel_lines
    editor_records = [r for r in sink if r.generator.endswith("/editor")]
    assert editor_records[-1].outcome == "candidate" and editor_records[-1].candidate_source == edited[0].source
    assert edited[0].trace[0]["attempt_id"] == editor_records[-1].attempt_id


def test_hunks_that_do_not_apply_are_reported_back_once():
    model = ScriptedModel([
        edit(("out[i] = a * in[j];", "out[i] = in[i] * a;")),
        edit(("out[i] = a * in[j];", "out[i] = in[i] * a;")),
    ])
    jobs = ModelJobs(model, rules=RuleGenerator(rules=()), tools=AgentTools(compile=compiles_unless("nothing")),
                     budgets=budgets(planner_samples=0))
    out = list(jobs.generate(request()))
    assert out == []
    assert len(model.calls) == 2  # the first answer, then one retry; no third
    retry = model.calls[1].messages
    assert "hunk 1: not found" in retry[-1]["content"]
    assert jobs.stats["editor"].hunks_failed == 2 and jobs.stats["editor"].candidates == 0


def test_the_report_goes_back_as_a_tool_result_when_the_template_renders_tool_calls():
    class ToolModel(ScriptedModel):
        @property
        def tool_format(self) -> ToolFormat:
            return ToolFormat(True, "<tool_call>", "</tool_call>", "gguf")

    model = ToolModel([edit(("in[j]", "in[i]")), edit(("a * in[i]", "in[i] * a"))])
    jobs = ModelJobs(model, rules=RuleGenerator(rules=()), tools=AgentTools(compile=compiles_unless("nothing")),
                     budgets=budgets(planner_samples=0))
    out = list(jobs.generate(request()))
    assert len(out) == 1 and "in[i] * a" in out[0].source
    retry = model.calls[1].messages
    assert retry[-2]["role"] == "assistant" and retry[-2]["tool_calls"][0]["function"]["name"] == "edit"
    assert retry[-1]["role"] == "tool" and retry[-1]["tool_call_id"] == retry[-2]["tool_calls"][0]["id"]


def test_a_compile_error_goes_to_the_repairer_at_most_two_rounds():
    broken = "if (i < n) out[i] = a * undefined_thing;"
    model = ScriptedModel([
        edit(("if (i < n) out[i] = a * in[i];", broken)),
        edit((broken, "if (i < n) out[i] = a * undefined_thing2;")),
        edit(("undefined_thing2", "in[i]")),
    ])
    jobs = ModelJobs(model, rules=RuleGenerator(rules=()), tools=AgentTools(compile=compiles_unless("undefined_thing")),
                     budgets=budgets(planner_samples=0))
    out = list(jobs.generate(request()))
    assert len(out) == 1 and out[0].generator.endswith("/repairer")
    assert "undefined_thing" not in out[0].source
    # The repairer saw the compiler's message and the failing kernel, not the original one.
    first_repair = model.calls[1].messages[1]["content"]
    assert 'identifier "undefined_thing" is undefined' in first_repair and broken in first_repair
    assert "original kernel" not in first_repair
    assert (jobs.stats["repairer"].calls, jobs.stats["repairer"].compiled, jobs.stats["repairer"].candidates) == (2, 1, 1)
    assert jobs.stats["editor"].compiled == 0


def test_repairs_stop_after_the_round_budget():
    model = ScriptedModel([
        edit(("a * in[i]", "a * bad1")), edit(("bad1", "bad2")), edit(("bad2", "bad3")), edit(("bad3", "in[i]")),
    ])
    jobs = ModelJobs(model, rules=RuleGenerator(rules=()), tools=AgentTools(compile=compiles_unless("bad")),
                     budgets=budgets(planner_samples=0, repair_rounds=2))
    assert list(jobs.generate(request())) == []
    assert len(model.calls) == 3 and model.remaining == 1


def test_a_verification_mismatch_is_repaired_with_the_harness_report():
    ids = menu_ids()
    wrong = "if (i < n) out[i] = a * in[i] + 1.0f;"
    mismatch = Verdict(False, Reason.MISMATCH, errors=("out[0]: expected 0.5, got 1.5 (first differing index 0)",))
    model = ScriptedModel([
        choice(ids[0]), choice(ids[0]), choice(ids[0]),
        edit(("if (i < n) out[i] = a * in[i];", wrong)),
        edit((wrong, "if (i < n) out[i] = in[i] * a;")),
    ])
    jobs = ModelJobs(model, tools=AgentTools(compile=compiles_unless("nothing")), budgets=budgets())

    def verifier(original, candidate, spec, cancel):
        if "+ 1.0f" in candidate:
            return mismatch
        return Verdict(False, Reason.NOT_FASTER)

    result = optimize(SOURCE, "scale.cu", "scale", parse_spec(SPEC), generators=[jobs], verifier=verifier,
                      budget=Budget(max_candidates=20))
    generators = [r.candidate.generator for r in result.results]
    editor_at = next(i for i, g in enumerate(generators) if g.endswith("/editor"))
    assert generators[editor_at + 1].endswith("/repairer")  # right after the harness reported the mismatch
    repaired = result.results[editor_at + 1].candidate
    assert "in[i] * a" in repaired.source
    repair_prompt = model.calls[4].messages[1]["content"]
    assert "first differing index 0" in repair_prompt and "original kernel" in repair_prompt


def test_rule_candidates_that_fail_verification_are_repaired_too():
    ids = menu_ids()
    target = ids[0]
    rule_candidate = next(c for c in RuleGenerator().generate(request()) if c.generator == "rule:" + target)
    model = ScriptedModel([choice(target)] * 3 + [edit(("int i", "int i"))] + [
        lambda messages: edit(("int i = ", "const int i = "))])
    jobs = ModelJobs(model, tools=AgentTools(compile=compiles_unless("nothing")), budgets=budgets(editor_samples=0))
    seen: list[Candidate] = []
    for candidate in jobs.generate(request()):
        seen.append(candidate)
        if candidate.source == rule_candidate.source:
            jobs.feedback(candidate, Verdict(False, Reason.OUT_OF_BOUNDS, errors=("red zone after out changed",)))
    repaired = [c for c in seen if c.generator.endswith("/repairer")]
    assert len(repaired) == 1
    assert seen.index(repaired[0]) == seen.index(rule_candidate) + 1
    assert repaired[0].launch_override == rule_candidate.launch_override
    assert jobs.stats["repairer"].hunks_failed >= 1  # "int i" -> "int i" changes nothing: reported, then fixed


def test_feedback_on_a_correct_or_foreign_candidate_queues_nothing():
    jobs = ModelJobs(ScriptedModel([]), rules=RuleGenerator(rules=()), budgets=budgets(planner_samples=0, editor_samples=0))
    list(jobs.generate(request()))
    foreign = Candidate("scale", SOURCE + "//", "x", "rule:x", "x")
    jobs.feedback(foreign, Verdict(False, Reason.MISMATCH))
    assert not jobs._repairs


def test_the_token_budget_stops_every_job():
    ids = menu_ids()
    model = ScriptedModel([choice(ids[-1])] * 10)
    jobs = ModelJobs(model, budgets=budgets(max_total_tokens=1))
    out = list(jobs.generate(request()))
    assert len(model.calls) == 1
    assert "token budget" in (jobs.stop_reason or "")
    assert [c.generator for c in out] == ["rule:" + i for i in [ids[-1], *[i for i in ids if i != ids[-1]]]][: len(out)]


def test_parse_edit_refuses_what_is_not_an_edit():
    assert parse_edit('{"plan": "x", "hunks": []}') == "the answer has no hunk with a string search and replace"
    assert isinstance(parse_edit("no json"), str)
    hunks, plan = parse_edit(edit(("a", "b")))
    assert plan == "change it" and hunks[0].search == "a"


def test_the_session_puts_the_jobs_in_the_rules_place_and_compiles_their_edits_with_nvcc(tmp_path):
    import shutil

    import pytest

    from kernel_lsp.config import Settings
    from kernel_lsp.services.session import Session

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    ids = menu_ids()
    path = tmp_path / "scale.cu"
    path.write_text(SOURCE)
    model = ScriptedModel([choice(ids[2])] * 3 + [
        edit(("if (i < n) out[i] = a * in[i];", "if (i < n) out[i] = in[i] * a;")),
        edit(("if (i < n) out[i] = a * in[i];", "if (i < n) out[i] = a * in[i] +;")),
    ])
    session = Session(Settings(kb_path=str(tmp_path / "kb.sqlite")), workspace_root=str(tmp_path), use_kb=False,
                      traces_path=str(tmp_path / "traces.sqlite3"))
    result = session.optimize(SOURCE, str(path), "scale", parse_spec(SPEC), model=model, verify=False,
                              budget=Budget(max_candidates=20))
    generators = [r.candidate.generator for r in result.results]
    assert generators[0] == "rule:" + ids[2]
    assert generators[1] == "model:scripted/editor"
    assert sorted(g for g in generators if g.startswith("rule:")) == sorted("rule:" + i for i in ids)
    # The second edit does not compile: the repairer is asked with nvcc's message (and, with no scripted reply
    # left, offers nothing).
    assert generators.count("model:scripted/editor") == 1 and len(model.calls) == 6
    assert "error" in model.calls[5].messages[1]["content"] and "a * in[i] +;" in model.calls[5].messages[1]["content"]


def test_the_editor_refines_the_fastest_accepted_candidate():
    """Once the harness accepted a candidate, the editor is asked to make that version faster still: its
    hunks apply to the accepted kernel, the result extends it (tried after it, with its launch), and the
    prompt says how much faster the accepted version was."""
    ids = menu_ids()
    model = ScriptedModel([
        choice(ids[0]), choice(ids[0]), choice(ids[0]),
        edit(("if (i < n) out[i] = a * in[i];", "if (i < n) out[i] = in[i] * a;")),
        edit(("    if (i < n) out[i] = a * in[i];", "    if (i < n) out[i] = a * __ldg(&in[i]);")),
    ])
    jobs = ModelJobs(model, tools=AgentTools(compile=compiles_unless("nothing")), budgets=budgets(refine_samples=1))
    first = "rule:" + ids[0]

    def verifier(original, candidate, spec, cancel):
        if "__restrict__" in candidate:
            return Verdict(True, Reason.OK, speedup=1.3, speedup_ci_low=1.25, speedup_ci_high=1.35)
        return Verdict(False, Reason.NOT_FASTER, speedup=1.0)

    result = optimize(SOURCE, "scale.cu", "scale", parse_spec(SPEC), generators=[jobs], verifier=verifier,
                      budget=Budget(max_candidates=20))
    accepted = [r.candidate for r in result.results if r.verdict is not None and r.verdict.accepted]
    assert accepted[0].generator == first and "__restrict__" in accepted[0].source
    refined = result.results[-1].candidate
    assert refined.generator.endswith("/editor") and refined.after == first
    assert "__ldg(&in[i])" in refined.source and "__restrict__" in refined.source
    prompt = model.calls[-1].messages[1]["content"]
    assert "runs 1.25x faster" in prompt and "__restrict__" in prompt.split("Task:")[0]


def test_a_refinement_extends_its_base_and_keeps_its_launch():
    base_source = SOURCE.replace("float *out, const float *in", "float *__restrict__ out, const float *__restrict__ in")
    base = Candidate("scale", base_source, "restrict-const", "rule:restrict-const", "restrict",
                     {"grid": ["(n+127)/128", 1, 1], "block": [128, 1, 1]})
    model = ScriptedModel([edit(("    if (i < n) out[i] = a * in[i];", "    if (i < n) out[i] = in[i] * a;"))])
    jobs = ModelJobs(model, rules=RuleGenerator(rules=()), tools=AgentTools(compile=compiles_unless("nothing")),
                     budgets=budgets(planner_samples=0, editor_samples=0, refine_samples=1), verified=(base, 1.4))
    out = list(jobs.generate(request()))
    assert len(out) == 1 and out[0].after == "rule:restrict-const" and out[0].launch_override == base.launch_override
    assert "in[i] * a" in out[0].source and "__restrict__ out" in out[0].source
    assert "runs 1.40x faster" in model.calls[0].messages[1]["content"]


def test_an_edit_that_changes_only_comments_or_layout_is_not_a_candidate():
    model = ScriptedModel([edit(("    if (i < n) out[i] = a * in[i];", "    if (i < n) out[i] = a * in[i]; // store it")),
                           edit(("    if (i < n) out[i] = a * in[i];", "\n    if (i < n)   out[i] = a * in[i];"))])
    jobs = ModelJobs(model, rules=RuleGenerator(rules=()), tools=AgentTools(compile=compiles_unless("nothing")),
                     budgets=budgets(planner_samples=0, editor_samples=2))
    assert list(jobs.generate(request())) == []
    assert jobs.stats["editor"].invalid == 2 and jobs.stats["editor"].compile_checked == 0


@pytest.mark.parametrize(("reason", "repaired"), [
    (Reason.SIZE_DEPENDENT, True),  # a missing tail or edge check: its report names the size
    (Reason.TIMED_MISMATCH, False),  # what was timed was not what was checked: a cheat, not a bug
    (Reason.SPEEDUP_COLLAPSE, False),
])
def test_which_harness_reasons_go_to_the_repairer(reason, repaired):
    ids = menu_ids()
    target = ids[0]
    rule_candidate = next(c for c in RuleGenerator().generate(request()) if c.generator == "rule:" + target)
    model = ScriptedModel([choice(target)] * 3 + [edit(("int i", "int i"))] + [
        lambda messages: edit(("int i = ", "const int i = "))])
    jobs = ModelJobs(model, tools=AgentTools(compile=compiles_unless("nothing")), budgets=budgets(editor_samples=0))
    seen: list[Candidate] = []
    for candidate in jobs.generate(request()):
        seen.append(candidate)
        if candidate.source == rule_candidate.source:
            jobs.feedback(candidate, Verdict(False, reason, errors=("n = 4095: out[4092..4094] never written",)))
    assert any(c.generator.endswith("/repairer") for c in seen) == repaired
