"""The model's reasoning loop, in the style of opt-r1: think, call tools, answer.

:class:`ModelGenerator` is a :class:`~kernel_lsp.core.candidates.CandidateGenerator`.
For each technique the knowledge base picked (several samples each, temperature
and seed varied) it runs one *attempt*: a conversation in which the model answers
every turn with one JSON object, either a tool call

    {"tool": "compile", "args": {"kernel_source": "..."}}

or a final answer

    {"final": {"technique": "...", "explanation": "...", "kernel_source": "..."}}

The output is constrained by a JSON schema (a llama.cpp grammar), so even a 0.5B
model produces JSON of that shape. ``kernel_source`` is the whole new ``__global__``
function (helpers and ``#define``\\ s it needs may precede it): small models manage
one function far better than a whole file or a diff. We splice it into the file
deterministically, in place of the old definition, after checking that the
kernel's name and parameter types are unchanged (qualifiers ``const`` and
``__restrict__`` may be added). A final answer that does not compile is sent back
with the compiler's errors for repair, a bounded number of times. The generator
never judges speed or correctness: the harness does.

Tools are injected callables (the optimizer wires them to the compiler, the
harness, the profiler and the knowledge base); ``view_file`` is implemented here,
sandboxed to the workspace root. Every attempt is recorded as an
:class:`~kernel_lsp.services.traces.AttemptRecord`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import reprlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel_lsp.core.candidates import Candidate, OptimizeRequest, TechniqueHint
from kernel_lsp.core.index import Function, KernelIndex, build_index
from kernel_lsp.services.llm import ChatModel
from kernel_lsp.services.models import ModelError
from kernel_lsp.services.traces import AttemptRecord

log = logging.getLogger(__name__)

#: Most lines one view_file call returns (opt-r1's file viewer used the same limit).
VIEW_FILE_MAX_LINES = 100
#: Files larger than this are not shown by view_file, in bytes.
VIEW_FILE_MAX_BYTES = 4 * 1024 * 1024

#: Longest explanation a final answer may carry, in characters.
EXPLANATION_MAX_CHARS = 240

#: Added to an attempt's temperature after each answer that left the kernel unchanged.
UNCHANGED_TEMPERATURE_STEP = 0.4

TOOL_NAMES = ("compile", "benchmark", "profile", "view_file", "kb_search")

GENERAL_TECHNIQUE = TechniqueHint(
    name="general",
    description="Make the kernel faster while computing exactly the same results.",
    predicted_speedup=1.0,
    confidence=0.0,
)


# --- tools and budgets ----------------------------------------------------------


@dataclass(frozen=True)
class CompileFeedback:
    ok: bool
    """True when the file compiled (warnings allowed)."""
    text: str
    """Diagnostics and ptxas numbers (registers, shared memory, spills), as the model should read them."""


@dataclass(frozen=True)
class AgentTools:
    """The tools the model may call; a tool left as None is not offered."""

    compile: Callable[[str], CompileFeedback] | None = None
    """Whole candidate file -> diagnostics. Also used to check every final answer."""
    benchmark: Callable[[str], str] | None = None
    """Whole candidate file -> the harness's verdict summary (correctness, speedup)."""
    profile: Callable[[], str] | None = None
    """-> profile summary of the original kernel (default: the request's profile_summary)."""
    kb_search: Callable[[str], str] | None = None
    """Query -> techniques for the kernel's state (default: the request's techniques)."""
    workspace_root: str | None = None
    """view_file is offered only with a root, and reads only inside it."""


@dataclass(frozen=True)
class AgentBudgets:
    max_techniques: int = 3
    """Techniques tried, in the knowledge base's order."""
    samples_per_technique: int = 2
    temperatures: tuple[float, ...] = (0.2, 0.7)
    """Sample k uses temperatures[k % len]."""
    seed: int = 0
    """Base seed; each sample and turn derives its own from it."""
    max_steps: int = 6
    """Model turns per attempt (tool calls, invalid replies and repairs all count)."""
    max_repairs: int = 2
    """Final answers that fail to compile and are sent back with the errors."""
    max_benchmarks: int = 2
    """benchmark calls per attempt (each is a GPU run)."""
    max_tokens_per_turn: int = 1024
    max_total_tokens: int = 60_000
    """Prompt plus completion tokens over the whole generate() call."""
    max_seconds: float = 600.0
    """Wall time of the whole generate() call."""
    turn_timeout_s: float = 180.0
    tool_result_chars: int = 2000
    """Longer tool results are cut to this many characters before the model sees them."""
    keep_exchanges: int = 3
    """Past (reply, feedback) pairs kept in the prompt beside the opening messages."""


# --- locating and splicing kernels (pure, through the kernel index) ---------------

_QUALIFIERS = re.compile(r"\b(?:const|__restrict__|__restrict|restrict)\b|\s+")


def find_kernel(source: str, name: str) -> Function | None:
    """The ``__global__`` definition (with a body) named ``name``, as the kernel index finds it.

    Its ``span`` covers the whole definition: ``template <...>`` and a braceless
    ``extern "C"`` included; comments and strings never confuse it (tree-sitter).
    """
    return _definition(build_index(source), name)


def _definition(index: KernelIndex, name: str) -> Function | None:
    return next((f for f in index.kernels if f.name == name and f.body_span is not None), None)


def _text_of(data: bytes, start: int, end: int) -> str:
    return data[start:end].decode("utf-8", "replace")


def param_types(function: Function) -> tuple[str, ...]:
    """Parameter types with ``const`` and ``__restrict__`` removed and spaces squeezed (names are free)."""
    return tuple(_QUALIFIERS.sub("", p.type_text) for p in function.params)


def extract_code(text: str) -> str:
    """The code in a model's kernel_source: fences removed, double-escaped newlines undone."""
    fenced = re.findall(r"```[\w+-]*\n(.*?)```", text, flags=re.DOTALL)
    if fenced:
        text = "\n".join(fenced)
    elif text.lstrip().startswith("```"):
        text = text.lstrip().split("\n", 1)[1] if "\n" in text.lstrip() else ""
    if "\n" not in text and "\\n" in text:
        text = text.replace("\\n", "\n").replace('\\"', '"').replace("\\t", "\t")
    return text.strip("\n")


@dataclass(frozen=True)
class SpliceResult:
    source: str | None
    """The whole new file, or None when the answer is unusable."""
    error: str | None
    """Why the answer is unusable, phrased for the model."""
    notes: tuple[str, ...] = ()
    """What was dropped from the answer (duplicated helpers, host code)."""


def splice_kernel(file_source: str, kernel: str, answer: str) -> SpliceResult:
    """Replace ``kernel``'s definition in ``file_source`` with the one in ``answer``."""
    file_data = file_source.encode("utf-8")
    file_index = build_index(file_data)
    original = _definition(file_index, kernel)
    if original is None:
        return SpliceResult(None, f"the file has no __global__ function named {kernel}")
    code = extract_code(answer)
    code_data = code.encode("utf-8")
    code_index = build_index(code_data)
    new = _definition(code_index, kernel)
    if new is None:
        names = [f.name for f in code_index.kernels if f.body_span is not None]
        seen = f" (it defines {', '.join(names)})" if names else ""
        return SpliceResult(None, f"kernel_source has no __global__ function named {kernel}{seen}; keep the name {kernel}")
    if param_types(original) != param_types(new):
        was = ", ".join(f"{p.type_text} {p.name}".strip() for p in original.params)
        now = ", ".join(f"{p.type_text} {p.name}".strip() for p in new.params)
        return SpliceResult(None, f"the parameter list changed: it must stay ({was}) but is ({now})")
    preamble, notes = _clean_preamble(file_source, file_index, code_data[: new.span.start_byte], code_index, new)
    if code_data[new.span.end_byte :].strip():
        notes.append("dropped text after the kernel (host code is not replaced)")
    replacement = (preamble + "\n\n" if preamble else "") + _text_of(code_data, new.span.start_byte, new.span.end_byte)
    spliced = (_text_of(file_data, 0, original.span.start_byte) + replacement
               + _text_of(file_data, original.span.end_byte, len(file_data)))
    return SpliceResult(spliced, None, tuple(notes))


def _clean_preamble(file_source: str, file_index: KernelIndex, preamble: bytes, code_index: KernelIndex,
                    new: Function) -> tuple[str, list[str]]:
    """Keep what the new kernel needs before it, minus what the file already has.

    Device functions the file defines and other kernels are cut (the index finds
    them); ``#include``/``#define`` lines the file has are dropped.
    """
    notes: list[str] = []
    defined = {f.name for f in file_index.functions if f.body_span is not None}
    cut: list[tuple[int, int]] = []
    for func in code_index.functions:
        if func.span.end_byte > new.span.start_byte or func.body_span is None:
            continue
        if func.name in defined or func.is_kernel:
            cut.append((func.span.start_byte, func.span.end_byte))
            notes.append(f"dropped a second definition of {func.name}")
    kept = preamble
    for start, end in reversed(cut):
        kept = kept[:start] + kept[end:]
    existing = {line.strip() for line in file_source.splitlines()}
    lines = []
    for line in kept.decode("utf-8", "replace").splitlines():
        stripped = line.strip()
        if stripped.startswith(("#include", "#define")) and stripped in existing:
            continue
        lines.append(line)
    # Cutting definitions leaves runs of blank lines behind; keep at most one.
    return re.sub(r"\n[ \t]*\n(?:[ \t]*\n)+", "\n\n", "\n".join(lines)).strip("\n"), notes


# --- view_file sandbox -----------------------------------------------------------


def view_file(root: str | None, path: str, start_line: int = 1, max_lines: int = VIEW_FILE_MAX_LINES) -> str:
    """Up to ``max_lines`` numbered lines of a file inside ``root``; errors come back as text."""
    if not root:
        return "error: no workspace is open, so view_file is not available"
    if not isinstance(path, str) or not path or "\x00" in path:
        return "error: give a file path relative to the workspace"
    try:
        return _view_file(root, path, start_line, max_lines)
    except (OSError, ValueError) as exc:
        # An unreadable file (permissions, a FIFO, a vanished file, a name the OS cannot encode) is
        # an answer for the model, never an exception that would end the search.
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return f"error: cannot read {path} ({why})"


def _view_file(root: str, path: str, start_line: int, max_lines: int) -> str:
    root_real = os.path.realpath(root)
    target = os.path.realpath(path if os.path.isabs(path) else os.path.join(root_real, path))
    # realpath resolves every symlink and "..", so a link pointing out of the
    # workspace lands outside root_real and is refused here.
    if os.path.commonpath([root_real, target]) != root_real:
        return f"error: {path} is outside the workspace"
    if not os.path.isfile(target):
        return f"error: {path} is not a file in the workspace"
    if os.path.getsize(target) > VIEW_FILE_MAX_BYTES:
        return f"error: {path} is too large to view"
    with open(target, encoding="utf-8", errors="replace") as handle:
        lines = handle.read().splitlines()
    first = max(1, min(int(start_line), len(lines) + 1))
    shown = lines[first - 1 : first - 1 + max_lines]
    if not shown:
        return f"error: {path} has only {len(lines)} lines"
    rel = os.path.relpath(target, root_real)
    body = "\n".join(f"{first + i:5d}  {text}" for i, text in enumerate(shown))
    return f"{rel}, lines {first}-{first + len(shown) - 1} of {len(lines)}:\n{body}"


# --- the reply format --------------------------------------------------------------

_STRING = {"type": "string"}
_TOOL_ARGS: dict[str, dict[str, Any]] = {
    "compile": {"kernel_source": _STRING},
    "benchmark": {"kernel_source": _STRING},
    "profile": {},
    "view_file": {"path": _STRING, "start_line": {"type": "integer"}},
    "kb_search": {"query": _STRING},
}
_TOOL_USAGE = {
    "compile": '{"tool": "compile", "args": {"kernel_source": "<new kernel>"}}: compiler errors, registers, shared memory',
    "benchmark": '{"tool": "benchmark", "args": {"kernel_source": "<new kernel>"}}: correctness and speedup on the GPU',
    "profile": '{"tool": "profile", "args": {}}: profile summary of the current kernel',
    "view_file": '{"tool": "view_file", "args": {"path": "<file>", "start_line": 1}}: 100 lines of a workspace file',
    "kb_search": '{"tool": "kb_search", "args": {"query": "<words>"}}: optimization techniques for this kernel',
}


def _object(properties: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(properties),
        "additionalProperties": False,
    }


def reply_schema(tools: Sequence[str]) -> dict[str, Any]:
    """JSON schema of one reply: a call of one of ``tools`` or a final answer."""
    # The explanation comes before the code, as a short plan; its length is capped
    # because small models otherwise spend the token budget on prose.
    explanation = {"type": "string", "maxLength": EXPLANATION_MAX_CHARS}
    final = _object({"technique": _STRING, "explanation": explanation, "kernel_source": _STRING})
    variants = [_object({"tool": {"const": name}, "args": _object(_TOOL_ARGS[name])}) for name in tools]
    return {"oneOf": [*variants, _object({"final": final})]}


@dataclass(frozen=True)
class ToolCall:
    tool: str
    args: Mapping[str, Any]


@dataclass(frozen=True)
class FinalAnswer:
    kernel_source: str
    technique: str
    explanation: str


@dataclass(frozen=True)
class InvalidReply:
    why: str


def parse_reply(text: str, tools: Sequence[str]) -> ToolCall | FinalAnswer | InvalidReply:
    """Read one reply; never raises. Tolerates fences and text around the JSON object."""
    start = text.find("{")
    if start < 0:
        return InvalidReply("the reply has no JSON object")
    try:
        # strict=False admits raw newlines inside strings: llama-cpp-python's JSON
        # grammar (0.3.x) allows them in code, and small models write code that way.
        obj, _ = json.JSONDecoder(strict=False).raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        return InvalidReply(f"the reply is not valid JSON ({exc.msg} at character {exc.pos})")
    except ValueError as exc:  # an integer longer than Python's digit limit (4,300 digits)
        return InvalidReply(f"the reply is not usable JSON ({exc})")
    except RecursionError:
        return InvalidReply("the reply is not usable JSON (nested too deeply)")
    if not isinstance(obj, dict):
        return InvalidReply("the reply must be a JSON object")
    if "final" in obj:
        final = obj["final"]
        if not isinstance(final, dict) or not isinstance(final.get("kernel_source"), str):
            return InvalidReply('"final" must be an object with a string "kernel_source"')
        if not final["kernel_source"].strip():
            return InvalidReply('"kernel_source" is empty')
        return FinalAnswer(final["kernel_source"], str(final.get("technique") or ""), str(final.get("explanation") or ""))
    if "tool" in obj:
        name = obj["tool"]
        if name not in tools:
            shown = reprlib.repr(name) if isinstance(name, str) else type(name).__name__
            return InvalidReply(f"unknown tool {shown}; the tools are {', '.join(tools)}")
        args = obj.get("args", {})
        if not isinstance(args, dict):
            return InvalidReply('"args" must be an object')
        for key, kind in _TOOL_ARGS[name].items():
            expected = int if kind.get("type") == "integer" else str
            if key not in args or not isinstance(args[key], expected) or isinstance(args[key], bool):
                return InvalidReply(f"tool {name} needs args.{key} ({kind['type']})")
        return ToolCall(name, {key: args[key] for key in _TOOL_ARGS[name]})
    return InvalidReply('expected {"tool": ..., "args": ...} or {"final": ...}')


# --- prompts -----------------------------------------------------------------------------


def system_prompt(kernel: str, tools: Sequence[str]) -> str:
    usage = "\n".join(f"- {_TOOL_USAGE[t]}" for t in tools)
    return (
        "You optimize one CUDA kernel. Answer every turn with exactly one JSON object and nothing else.\n"
        f"Tools you may call first:\n{usage}\n"
        'When done: {"final": {"technique": "<name>", "explanation": "<one sentence>", '
        '"kernel_source": "<the complete new __global__ function>"}}\n'
        f"Rules: keep the kernel name {kernel} and its parameters exactly; the kernel is launched with the "
        "same grid and block as before; results must stay the same; write the complete function, "
        "with any #define or __device__ helper it needs before it; no host code, no main()."
    )


def user_prompt(request: OptimizeRequest, hint: TechniqueHint, kernel_text: str) -> str:
    """The task: the technique and its worked example first, the user's kernel last.

    Small models follow what they read last; with the example after the kernel,
    Qwen2.5-Coder-0.5B tended to copy the kernel back unchanged.
    """
    parts = [f"Technique: {hint.name}: {hint.description}"]
    if hint.example_before and hint.example_after:
        parts.append(
            "A verified example of this technique on another kernel.\n"
            f"Before:\n```cuda\n{hint.example_before.strip()}\n```\nAfter:\n```cuda\n{hint.example_after.strip()}\n```"
        )
    if request.profile_summary:
        parts.append(f"Profile of {request.kernel}: {request.profile_summary}")
    if request.state:
        parts.append(f"Performance state: {request.state}")
    if request.spec:
        parts.append(f"Launch spec: {json.dumps(request.spec, sort_keys=True, default=str)[:800]}")
    parts.append(f"File {request.path}, kernel {request.kernel}:\n```cuda\n{kernel_text}\n```")
    parts.append(
        f"Rewrite {request.kernel} with {hint.name}, the way the After example changed its kernel. "
        "The new kernel must differ from the current one."
    )
    return "\n\n".join(parts)


# --- the generator ---------------------------------------------------------------------


@dataclass
class _Spend:
    """What the whole generate() call has used so far."""

    deadline: float
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class _Attempt:
    hint: TechniqueHint
    sample: int
    temperature: float
    seed: int
    attempt_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    steps: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    benchmarks: int = 0
    unchanged: int = 0
    """Final answers that repeated the kernel; each raises the next turn's temperature."""

    def turn_temperature(self) -> float:
        # A model that copied the kernel tends to copy it again at the same
        # temperature; sampling hotter is the cheapest way out of that rut.
        return min(1.0, self.temperature + UNCHANGED_TEMPERATURE_STEP * self.unchanged)


class ModelGenerator:
    """Candidates from a local model that reasons with tools (see the module docstring)."""

    def __init__(
        self,
        model: ChatModel,
        tools: AgentTools = AgentTools(),
        budgets: AgentBudgets = AgentBudgets(),
        *,
        trace_sink: Callable[[AttemptRecord], None] | None = None,
        cancel: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.model = model
        self.name = f"model:{model.name}"
        self.tools = tools
        self.budgets = budgets
        self.trace_sink = trace_sink
        self.cancel = cancel
        self.clock = clock
        self.attempts: list[AttemptRecord] = []
        """Every attempt of the last generate() call, in order."""
        self.stop_reason: str | None = None
        """Why the last generate() stopped early (a budget or a cancel), or None."""
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def available_tools(self, request: OptimizeRequest) -> tuple[str, ...]:
        offered = {
            "compile": self.tools.compile is not None,
            "benchmark": self.tools.benchmark is not None,
            "profile": self.tools.profile is not None or bool(request.profile_summary),
            "view_file": bool(self.tools.workspace_root),
            "kb_search": self.tools.kb_search is not None or bool(request.techniques),
        }
        return tuple(name for name in TOOL_NAMES if offered[name])

    def generate(self, request: OptimizeRequest) -> Iterator[Candidate]:
        self.attempts = []
        self.stop_reason = None
        spend = _Spend(deadline=self.clock() + self.budgets.max_seconds)
        try:
            yield from self._generate(request, spend)
        finally:
            self.prompt_tokens, self.completion_tokens = spend.prompt_tokens, spend.completion_tokens

    def _generate(self, request: OptimizeRequest, spend: _Spend) -> Iterator[Candidate]:
        found = find_kernel(request.source, request.kernel)
        hints = request.techniques[: self.budgets.max_techniques] or (GENERAL_TECHNIQUE,)
        if found is None:
            self.stop_reason = f"no __global__ function named {request.kernel} in {request.path}"
            return
        kernel_text = _text_of(request.source.encode("utf-8"), found.span.start_byte, found.span.end_byte)
        seen: set[str] = {request.source}
        for index, hint in enumerate(hints):
            for sample in range(self.budgets.samples_per_technique):
                temperatures = self.budgets.temperatures or (0.2,)
                attempt = _Attempt(
                    hint,
                    sample,
                    temperatures[sample % len(temperatures)],
                    self.budgets.seed + 1000 * index + 100 * sample,
                )
                start = self.clock()
                prompt, result = self._run_attempt(request, attempt, kernel_text, spend)
                candidate, reason = result
                if candidate is not None and candidate.source in seen:
                    candidate, reason = None, "same file as an earlier candidate"
                self._record(request, attempt, prompt, candidate, reason, self.clock() - start)
                if candidate is not None:
                    seen.add(candidate.source)
                    yield candidate
                if self.stop_reason is not None:
                    return

    def _budget_stop(self, spend: _Spend) -> str | None:
        if self.cancel is not None and self.cancel.is_set():
            return "cancelled"
        if spend.tokens >= self.budgets.max_total_tokens:
            return f"token budget spent ({spend.tokens} of {self.budgets.max_total_tokens})"
        if self.clock() >= spend.deadline:
            return f"time budget spent ({self.budgets.max_seconds:.0f} s)"
        return None

    def _run_attempt(
        self, request: OptimizeRequest, attempt: _Attempt, kernel_text: str, spend: _Spend
    ) -> tuple[list[dict[str, str]], tuple[Candidate | None, str | None]]:
        tools = self.available_tools(request)
        schema = reply_schema(tools)
        messages = [
            {"role": "system", "content": system_prompt(request.kernel, tools)},
            {"role": "user", "content": user_prompt(request, attempt.hint, kernel_text)},
        ]
        prompt = [dict(m) for m in messages]
        repairs = 0
        for turn in range(self.budgets.max_steps):
            stop = self._budget_stop(spend)
            if stop is not None:
                self.stop_reason = stop
                return prompt, (None, f"stopped: {stop}")
            history = messages[2:]
            keep = 2 * self.budgets.keep_exchanges
            window = messages[:2] + (history[-keep:] if keep else [])
            tokens_left = self.budgets.max_total_tokens - spend.tokens
            try:
                completion = self.model.chat(
                    window,
                    schema=schema,
                    max_tokens=max(1, min(self.budgets.max_tokens_per_turn, tokens_left)),
                    temperature=attempt.turn_temperature(),
                    seed=attempt.seed + turn,
                    timeout_s=max(1.0, min(self.budgets.turn_timeout_s, spend.deadline - self.clock())),
                    cancel=self.cancel,
                )
            except ModelError as exc:
                attempt.steps.append({"kind": "model_error", "turn": turn, "error": str(exc)})
                return prompt, (None, f"model error: {exc}")
            spend.prompt_tokens += completion.prompt_tokens
            spend.completion_tokens += completion.completion_tokens
            attempt.prompt_tokens += completion.prompt_tokens
            attempt.completion_tokens += completion.completion_tokens
            attempt.steps.append(
                {
                    "kind": "model",
                    "turn": turn,
                    "text": completion.text,
                    "finish_reason": completion.finish_reason,
                    "prompt_tokens": completion.prompt_tokens,
                    "completion_tokens": completion.completion_tokens,
                    "wall_s": round(completion.wall_s, 3),
                }
            )
            messages.append({"role": "assistant", "content": completion.text})
            action = parse_reply(completion.text, tools)
            if isinstance(action, InvalidReply):
                why = action.why
                if completion.finish_reason == "length":
                    why = f"the reply was cut off at {completion.completion_tokens} tokens; write a shorter answer"
                attempt.steps.append({"kind": "invalid", "why": why})
                feedback = f"Invalid reply: {why}. Answer with one JSON object as described."
            elif isinstance(action, ToolCall):
                result = self._call_tool(request, attempt, action)
                attempt.steps.append({"kind": "tool", "tool": action.tool, "args": dict(action.args), "result": result})
                feedback = f"Result of {action.tool}:\n{result}"
            else:
                ending, feedback, is_repair = self._check_final(request, attempt, action, repairs)
                if ending is not None:
                    return prompt, ending
                repairs += is_repair
            messages.append({"role": "user", "content": feedback})
        return prompt, (None, f"no usable final answer within {self.budgets.max_steps} turns")

    def _check_final(
        self, request: OptimizeRequest, attempt: _Attempt, final: FinalAnswer, repairs: int
    ) -> tuple[tuple[Candidate | None, str | None] | None, str, bool]:
        """(candidate or rejection, "", False) when the attempt ends here, else (None, feedback, is_repair)."""
        spliced = splice_kernel(request.source, request.kernel, final.kernel_source)
        if spliced.source is None:
            attempt.steps.append({"kind": "splice_error", "why": spliced.error})
            return None, f"Your kernel cannot be used: {spliced.error}. Send a corrected final answer.", False
        if spliced.notes:
            attempt.steps.append({"kind": "splice_notes", "notes": list(spliced.notes)})
        if spliced.source == request.source:
            attempt.steps.append({"kind": "unchanged"})
            attempt.unchanged += 1
            return None, f"Your kernel is unchanged. Apply {attempt.hint.name} and send the new kernel.", False
        if self.tools.compile is not None:
            feedback = self._safe(lambda: self.tools.compile(spliced.source))
            if isinstance(feedback, str):
                attempt.steps.append({"kind": "compile", "ok": False, "result": feedback})
                return (None, f"compile tool failed: {feedback}"), "", False
            attempt.steps.append({"kind": "compile", "ok": feedback.ok, "result": self._cut(feedback.text)})
            if not feedback.ok:
                if repairs >= self.budgets.max_repairs:
                    first = next((line for line in feedback.text.splitlines() if "error" in line), feedback.text[:200])
                    return (None, f"does not compile after {repairs} repair(s): {first.strip()}"), "", False
                message = (
                    f"The compiler rejected your kernel:\n{self._cut(feedback.text)}\n"
                    "Fix the errors and send the corrected final answer."
                )
                return None, message, True
        technique = attempt.hint.name if attempt.hint is not GENERAL_TECHNIQUE else (final.technique or "general")
        candidate = Candidate(
            kernel=request.kernel,
            source=spliced.source,
            technique=technique,
            generator=self.name,
            description=final.explanation.strip() or f"{technique} (written by {self.model.name})",
            trace=({"kind": "attempt", "attempt_id": attempt.attempt_id}, *attempt.steps),
        )
        return (candidate, None), "", False

    def _call_tool(self, request: OptimizeRequest, attempt: _Attempt, call: ToolCall) -> str:
        args = call.args
        match call.tool:
            case "compile" | "benchmark":
                spliced = splice_kernel(request.source, request.kernel, args["kernel_source"])
                if spliced.source is None:
                    return f"error: {spliced.error}"
                if call.tool == "compile":
                    feedback = self._safe(lambda: self.tools.compile(spliced.source))
                    text = feedback if isinstance(feedback, str) else ("ok\n" if feedback.ok else "") + feedback.text
                    return self._cut(text)
                if attempt.benchmarks >= self.budgets.max_benchmarks:
                    return f"error: benchmark may be called at most {self.budgets.max_benchmarks} times"
                attempt.benchmarks += 1
                return self._cut(self._safe(lambda: self.tools.benchmark(spliced.source)))
            case "profile":
                if self.tools.profile is not None:
                    return self._cut(self._safe(self.tools.profile))
                return self._cut(request.profile_summary or "no profile")
            case "view_file":
                return view_file(self.tools.workspace_root, args["path"], args["start_line"])
            case "kb_search":
                if self.tools.kb_search is not None:
                    return self._cut(self._safe(lambda: self.tools.kb_search(args["query"])))
                return self._cut("\n".join(f"- {t.name}: {t.description}" for t in request.techniques))
        return f"error: unknown tool {call.tool}"

    def _safe(self, call: Callable[[], Any]) -> Any:
        """Run a tool; its failure becomes text for the model, never an exception in the loop."""
        try:
            return call()
        except Exception as exc:
            log.exception("agent tool failed")
            return f"error: the tool failed: {type(exc).__name__}: {exc}"

    def _cut(self, text: str) -> str:
        limit = self.budgets.tool_result_chars
        return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"

    def _record(
        self,
        request: OptimizeRequest,
        attempt: _Attempt,
        prompt: Sequence[Mapping[str, str]],
        candidate: Candidate | None,
        reason: str | None,
        wall_s: float,
    ) -> None:
        record = AttemptRecord(
            attempt_id=attempt.attempt_id,
            created_unix_s=time.time(),
            generator=self.name,
            kernel=request.kernel,
            path=request.path,
            technique=attempt.hint.name,
            sample=attempt.sample,
            temperature=attempt.temperature,
            seed=attempt.seed,
            prompt=tuple(prompt),
            steps=tuple(attempt.steps),
            outcome="candidate" if candidate is not None else "rejected",
            reason=reason,
            candidate_source=candidate.source if candidate is not None else None,
            prompt_tokens=attempt.prompt_tokens,
            completion_tokens=attempt.completion_tokens,
            wall_s=wall_s,
        )
        self.attempts.append(record)
        if self.trace_sink is not None:
            try:
                self.trace_sink(record)
            except Exception:
                log.exception("could not store the trace of attempt %s", attempt.attempt_id)


def attempt_id_of(candidate: Candidate) -> str | None:
    """The trace attempt a model candidate came from (to attach the harness's verdict)."""
    for step in candidate.trace:
        if step.get("kind") == "attempt":
            return str(step.get("attempt_id"))
    return None
