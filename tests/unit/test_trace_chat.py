"""``kernel-lsp traces export --format chat``: verified trajectories as chat messages with tool calls."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kernel_lsp.commands import traces as traces_command
from kernel_lsp.core.rules import RuleGenerator
from kernel_lsp.core.spec import parse_spec
from kernel_lsp.core.verdict import Reason, Verdict
from kernel_lsp.services.agent import AgentTools
from kernel_lsp.services.model_jobs import JobBudgets, ModelJobs, edit_schema
from kernel_lsp.services.optimizer import Budget, optimize
from kernel_lsp.services.trace_chat import trajectory
from kernel_lsp.services.traces import TraceStore
from scripted_model import ScriptedModel
from test_model_jobs import SOURCE, SPEC, compiles_unless, edit


def _search(tmp_path: Path) -> Path:
    """One search whose editor candidate needs one repair and is accepted; its traces in a store (no
    refinement of the accepted repair: the export of that one conversation is what is tested)."""
    model = ScriptedModel([
        edit(("out[i] = a * in[j];", "x")),  # does not apply: reported back once
        edit(("if (i < n) out[i] = a * in[i];", "if (i < n) out[i] = a * __ldg(&in[i]) + oops;")),
        edit(("+ oops", "")),
    ])
    db = tmp_path / "traces.sqlite3"
    store = TraceStore(db)
    jobs = ModelJobs(model, rules=RuleGenerator(rules=()), tools=AgentTools(compile=compiles_unless("oops")),
                     budgets=JobBudgets(planner_samples=0, editor_techniques=1, editor_samples=1, refine_samples=0),
                     trace_sink=store.record_attempt)

    def verifier(original, candidate, spec, cancel):
        return Verdict(True, Reason.OK, speedup=1.4, speedup_ci_low=1.3, speedup_ci_high=1.5)

    result = optimize(SOURCE, "scale.cu", "scale", parse_spec(SPEC), generators=[jobs], verifier=verifier,
                      traces=store, budget=Budget(max_candidates=4))
    assert [r.candidate.generator for r in result.results] == ["model:scripted/repairer"]
    store.close()
    return db


def test_an_accepted_repair_exports_as_tool_calls_results_and_the_verdict(tmp_path: Path, capsys):
    db = _search(tmp_path)
    out = tmp_path / "chat.jsonl"
    args = argparse.Namespace(out=str(out), db=str(db), format="chat", all_verdicts=False)
    assert traces_command._export(args) == 0
    assert "1 verified trajectory(ies)" in capsys.readouterr().out
    [line] = out.read_text().splitlines()
    example = json.loads(line)
    messages = example["messages"]
    assert [m["role"] for m in messages[:2]] == ["system", "user"]
    assert "The compiler rejected it" in messages[1]["content"]  # the repairer's task names the error
    call = messages[2]["tool_calls"][0]
    assert messages[2]["role"] == "assistant" and call["function"]["name"] == "edit"
    assert json.loads(call["function"]["arguments"])["hunks"][0]["search"] == "+ oops"
    result = messages[3]
    assert result["role"] == "tool" and result["tool_call_id"] == call["id"]
    assert "compiled" in result["content"] and "harness: ACCEPTED: speedup 1.400x" in result["content"]
    assert example["tools"] == [{"type": "function", "function": {
        "name": "edit", "description": example["tools"][0]["function"]["description"], "parameters": edit_schema()}}]
    assert example["metadata"]["job"] == "repairer" and example["metadata"]["accepted"] is True
    assert example["metadata"]["speedup"] == 1.4


def test_unverified_attempts_are_not_trajectories_and_the_plain_export_keeps_everything(tmp_path: Path):
    db = _search(tmp_path)
    store = TraceStore(db)
    items = list(store.attempts())
    store.close()
    # The editor's attempt did not compile: no verdict, so no trajectory; the repair has one.
    assert [trajectory(i) is not None for i in items] == [False, True]
    everything = tmp_path / "all.jsonl"
    args = argparse.Namespace(out=str(everything), db=str(db), format="jsonl", all_verdicts=False)
    assert traces_command._export(args) == 0
    assert len(everything.read_text().splitlines()) == 2
    # The editor's conversation kept the report of the hunk that did not apply.
    editor = items[0]
    assert any(s.get("kind") == "hunks" and s["failed"] for s in editor["steps"])


def test_an_agent_attempt_maps_its_tool_replies_to_calls():
    item = {
        "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        "steps": [
            {"kind": "model", "text": '{"tool": "compile", "args": {"kernel_source": "k"}}'},
            {"kind": "tool", "tool": "compile", "result": "ok"},
            {"kind": "model", "text": '{"final": {"technique": "t", "explanation": "e", "kernel_source": "k2"}}'},
            {"kind": "compile", "ok": True, "result": "ptxas"},
        ],
        "verdict": {"accepted": False, "reason": "not_faster", "speedup": 0.9},
        "generator": "model:m", "kernel": "scale", "path": "a.cu", "technique": "t", "attempt_id": "x",
    }
    example = trajectory(item)
    names = [m["tool_calls"][0]["function"]["name"] for m in example["messages"] if m.get("tool_calls")]
    assert names == ["compile", "submit"]
    assert json.loads(example["messages"][4]["tool_calls"][0]["function"]["arguments"])["kernel_source"] == "k2"
    assert example["messages"][-1]["content"].endswith("harness: REJECTED (not_faster)")
    assert [t["function"]["name"] for t in example["tools"]] == ["compile", "submit"]
