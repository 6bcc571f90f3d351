"""Verified trajectories as chat-format training data (``kernel-lsp traces export --format chat``).

One JSON line per verified model attempt, in the OpenAI chat format that standard
fine-tuning tools read (TRL's SFT trainer, axolotl, LLaMA-Factory, unsloth):
``messages`` (the system and user prompt, then every model answer as an
assistant tool call and what the harness answered as the tool's result, the
verdict last), ``tools`` (the JSON schemas of the calls made) and ``metadata``
(kernel, technique, verdict, speedup). The fine-tuning tool renders them with
the model's own chat template. A model answer of the jobs is a call of
``choose`` (planner) or ``edit`` (editor, repairer); one of the agent loop is a
call of the tool it named, or of ``submit`` for its final answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kernel_lsp.core.verdict import Verdict
from kernel_lsp.services.agent import _TOOL_ARGS, EXPLANATION_MAX_CHARS
from kernel_lsp.services.model_jobs import PLANNER_REASON_CHARS, edit_schema

_STRING = {"type": "string"}


def _params(properties: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": dict(properties), "required": list(properties)}


TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "choose": _params({"choice": _STRING, "reason": {"type": "string", "maxLength": PLANNER_REASON_CHARS}}),
    "edit": edit_schema(),
    "submit": _params({"technique": _STRING, "explanation": {"type": "string", "maxLength": EXPLANATION_MAX_CHARS},
                       "kernel_source": _STRING}),
    **{name: _params(args) for name, args in _TOOL_ARGS.items()},
}
TOOL_DESCRIPTIONS = {
    "choose": "Choose the next transformation from the rule engine's menu.",
    "edit": "Apply search/replace hunks to the kernel; the harness compiles and verifies the result.",
    "submit": "Submit the new kernel to the harness.",
    "compile": "Compile a candidate kernel: errors, registers, shared memory.",
    "benchmark": "Verify a candidate kernel on the GPU: correctness and speedup.",
    "profile": "Profile summary of the current kernel.",
    "view_file": "View 100 lines of a workspace file.",
    "kb_search": "Optimization techniques for this kernel.",
}


def _call(step_text: str, job: str | None) -> tuple[str, str]:
    """(tool name, JSON arguments) of one model answer."""
    if job == "planner":
        return "choose", step_text
    if job is not None:
        return "edit", step_text
    try:
        obj = json.loads(step_text[step_text.find("{"):], strict=False)
    except (ValueError, RecursionError):
        return "submit", step_text
    if isinstance(obj, dict) and isinstance(obj.get("tool"), str) and obj["tool"] in TOOL_SCHEMAS:
        return obj["tool"], json.dumps(obj.get("args") or {})
    if isinstance(obj, dict) and isinstance(obj.get("final"), dict):
        return "submit", json.dumps(obj["final"])
    return "submit", step_text


def _result_line(step: Mapping[str, Any]) -> str | None:
    kind = step.get("kind")
    if kind == "hunks":
        failed = "; ".join(f"hunk {f['index']}: {f['why']}" for f in step.get("failed", []))
        return f"hunks applied: {step.get('applied')}" + (f"; {failed}" if failed else "")
    if kind == "compile":
        return ("compiled" if step.get("ok") else "compile failed") + (f"\n{step.get('result')}" if step.get("result") else "")
    if kind == "tool":
        return str(step.get("result", ""))
    if kind in ("invalid", "splice_error"):
        return f"unusable: {step.get('why')}"
    if kind == "unchanged":
        return "the kernel is unchanged"
    if kind == "choice":
        return f"chosen: {step.get('choice')}"
    if kind == "model_error":
        return f"model error: {step.get('error')}"
    return None


def trajectory(item: Mapping[str, Any]) -> dict[str, Any] | None:
    """One stored attempt (``TraceStore.attempts()`` row) as a chat example; None without a prompt or verdict."""
    prompt = list(item.get("prompt") or ())
    verdict_json = item.get("verdict")
    if not prompt or not verdict_json:
        return None
    steps = list(item.get("steps") or ())
    job = next((s.get("job") for s in steps if s.get("kind") == "job"), None)
    messages: list[dict[str, Any]] = [dict(m) for m in prompt]
    used: list[str] = []
    pending: list[str] = []
    open_call: tuple[str, str] | None = None

    def flush() -> None:
        nonlocal pending
        if open_call is not None:
            messages.append({"role": "tool", "tool_call_id": open_call[0], "name": open_call[1],
                             "content": "\n".join(pending) or "ok"})
        pending = []

    for step in steps:
        if step.get("kind") == "model":
            flush()
            name, arguments = _call(str(step.get("text", "")), job)
            call_id = f"call_{len(messages)}"
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]})
            open_call = (call_id, name)
            if name not in used:
                used.append(name)
            continue
        line = _result_line(step)
        if line is not None:
            pending.append(line)
    if open_call is None:
        return None
    try:
        summary = Verdict.from_json(verdict_json).summary()
    except (KeyError, ValueError, TypeError):
        summary = json.dumps(verdict_json)[:500]
    pending.append(f"harness: {summary}")
    flush()
    tools = [{"type": "function", "function": {"name": n, "description": TOOL_DESCRIPTIONS.get(n, n),
                                               "parameters": TOOL_SCHEMAS.get(n, {"type": "object"})}} for n in used]
    return {
        "messages": messages,
        "tools": tools,
        "metadata": {
            "attempt_id": item.get("attempt_id"), "generator": item.get("generator"), "kernel": item.get("kernel"),
            "path": item.get("path"), "technique": item.get("technique"), "job": job,
            "accepted": bool(verdict_json.get("accepted")), "reason": verdict_json.get("reason"),
            "speedup": verdict_json.get("speedup"),
        },
    }


def trajectories(items: Iterable[Mapping[str, Any]], accepted_only: bool = True) -> Iterator[dict[str, Any]]:
    """The verified model attempts as chat examples (only the harness-accepted ones unless told otherwise)."""
    for item in items:
        verdict = item.get("verdict") or {}
        if accepted_only and not verdict.get("accepted"):
            continue
        example = trajectory(item)
        if example is not None:
            yield example
