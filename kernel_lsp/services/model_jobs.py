"""Three small jobs for a small local model: planner, editor, repairer.

A 0.5B-1.5B model asked to write a faster kernel from scratch copies the kernel
back or breaks it; these jobs ask it only what a small model does well, each with
its output constrained by a JSON schema (a llama.cpp grammar, or the server's
``response_format``), and each measured on its own (:class:`JobStats`):

* **planner** -- choose the next transformation and its parameters from the rule
  engine's menu (every rewrite the rules' preconditions allowed: rule, variant
  such as ``block=512`` or a tile size), given the analysis facts (the static
  features, what each rule proved), the profile summary and the knowledge base's
  ranked techniques. The answer is an ``enum`` of the menu, so it cannot name
  anything else. Best-of-N samples vote; the entries they agree on are tried
  first, in vote order, the rest in the menu's own order.
* **editor** -- propose a rewrite as search/replace hunks against the kernel
  (:mod:`kernel_lsp.core.hunks`), guided by the closest verified before/after
  example the knowledge base has for the technique. Each hunk's search is an
  ``enum`` of the kernel's own lines (a 0.5B model otherwise copies lines from
  the example); hunks that do not apply anyway (a line changed to itself, two
  hunks on one line) are reported back once. Once the harness has accepted a
  candidate, the editor is also asked to make the fastest accepted version faster
  still (KernelBlaster's refinement of the best so far): its hunks apply to that
  version, and the result extends it (``Candidate.after``, its launch kept).
* **repairer** -- when a candidate (the editor's, or a transformation's) fails to
  compile or fails verification, it gets the compiler's message or the mismatch
  report and proposes hunks that fix it; at most ``repair_rounds`` rounds.

The harness decides: the jobs only order and propose candidates. When the chat
template renders tool calls (:mod:`kernel_lsp.core.chat_template`), the
harness's answers go back as tool results of an ``edit`` call; otherwise as
user messages. Every conversation is an
:class:`~kernel_lsp.services.traces.AttemptRecord` in the trace store.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kernel_lsp.core.candidates import Candidate, OptimizeRequest, TechniqueHint
from kernel_lsp.core.chat_template import tool_exchange
from kernel_lsp.core.features import static_features
from kernel_lsp.core.hunks import Hunk, HunkResult, apply_hunks, searchable_lines
from kernel_lsp.core.index import build_index
from kernel_lsp.core.rules import RuleGenerator
from kernel_lsp.core.verdict import Reason, Verdict
from kernel_lsp.services.agent import GENERAL_TECHNIQUE, AgentTools, CompileFeedback, find_kernel, splice_kernel
from kernel_lsp.services.llm import ChatModel
from kernel_lsp.services.models import ModelError
from kernel_lsp.services.traces import AttemptRecord

log = logging.getLogger(__name__)

JOBS = ("planner", "editor", "repairer")

#: Verdicts a repair may fix: the candidate is wrong in a way its text can show. Not: accepted, correct but
#: not faster, a timeout, a static check, a timed launch that was not what was checked or a speedup that
#: collapses on redrawn inputs (a cheat is not repaired into a subtler one). A size-dependent candidate is:
#: the size it fails at is in its report (a missing tail or edge check).
REPAIRABLE = frozenset({
    Reason.COMPILE_ERROR, Reason.SIGNATURE_CHANGED, Reason.LAUNCH_ERROR, Reason.MISMATCH, Reason.NAN_OR_INF,
    Reason.INPUT_MODIFIED, Reason.NONDETERMINISTIC, Reason.OUT_OF_BOUNDS, Reason.HISTORY_DEPENDENT,
    Reason.SANITIZER, Reason.SIZE_DEPENDENT,
})

#: Longest "reason" a planner answer carries, and "plan" an edit carries, in characters (small models
#: otherwise spend the token budget on prose).
PLANNER_REASON_CHARS = 60
EDIT_PLAN_CHARS = 160
#: Most hunks in one edit, and characters in one hunk's replacement: a small model that falls into a
#: repetition loop is cut there by the grammar, with its answer still whole JSON.
MAX_HUNKS = 4
REPLACE_MAX_CHARS = 360


@dataclass(frozen=True)
class JobBudgets:
    planner_samples: int = 3
    """Best-of-N for the planner: samples that vote."""
    planner_picks: int = 3
    """Menu entries tried in vote order before the editor's candidates; the rest follow them."""
    editor_techniques: int = 2
    """Techniques the editor tries (those with a verified example first)."""
    editor_samples: int = 2
    """Best-of-N for the editor, per technique: each sample is its own candidate."""
    repair_rounds: int = 2
    repair_samples: int = 1
    """Samples per repair round; the first that compiles is the repair."""
    temperatures: tuple[float, ...] = (0.2, 0.7, 1.0)
    """Sample k uses temperatures[k % len]."""
    seed: int = 0
    planner_max_tokens: int = 64
    editor_max_tokens: int = 640
    max_total_tokens: int = 60_000
    """Prompt plus completion tokens over the whole generate() call, all jobs together."""
    max_seconds: float = 600.0
    """Wall time of the whole generate() call (model and compiler)."""
    turn_timeout_s: float = 180.0
    error_chars: int = 1500
    """Longer compiler messages and mismatch reports are cut to this many characters."""
    kernel_chars: int = 6000
    """Longest kernel text shown to the model; a longer kernel is edited by the rules only."""
    refine_samples: int = 2
    """Best-of-N for the editor on the fastest verified candidate, once there is one (KernelBlaster's
    refinement of the best so far): each sample is a candidate that extends it."""


@dataclass
class JobStats:
    """What one job did in one generate() call."""

    calls: int = 0
    """Model requests."""
    candidates: int = 0
    """Candidates the job produced (yielded to the harness or, for the planner, menu entries it ranked)."""
    compile_checked: int = 0
    compiled: int = 0
    hunks_failed: int = 0
    """Hunks that did not apply (editor and repairer)."""
    invalid: int = 0
    """Answers that were unusable (cut off, no change, a changed signature)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens}


@dataclass(frozen=True)
class MenuEntry:
    id: str
    """What the model names: the rule and its variant (``block-size-sweep[block=512]``)."""
    candidate: Candidate
    followers: tuple[Candidate, ...] = ()
    """Sequences that extend this entry (tried only once it was accepted: ``Candidate.after``)."""


@dataclass(frozen=True)
class PlannerResult:
    ranked: tuple[str, ...]
    """Menu ids the samples agreed on (:func:`rank_votes`), most votes first (ties: in menu order)."""
    votes: Mapping[str, int]
    reasons: tuple[str, ...]


def _object(properties: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": dict(properties), "required": list(properties),
            "additionalProperties": False}


def planner_schema(ids: Sequence[str]) -> dict[str, Any]:
    return _object({"choice": {"type": "string", "enum": list(ids)},
                    "reason": {"type": "string", "maxLength": PLANNER_REASON_CHARS}})


def edit_schema(lines: Sequence[str] | None = None) -> dict[str, Any]:
    """The editor's and repairer's answer; with ``lines``, each hunk's search is one of them (an ``enum``: the
    grammar lets the model write only a line the kernel has, the way small models fail most often)."""
    search: dict[str, Any] = {"type": "string", "enum": list(lines)} if lines else {"type": "string"}
    hunk = _object({"search": search, "replace": {"type": "string", "maxLength": REPLACE_MAX_CHARS}})
    return _object({"plan": {"type": "string", "maxLength": EDIT_PLAN_CHARS},
                    "hunks": {"type": "array", "items": hunk, "minItems": 1, "maxItems": MAX_HUNKS}})


def parse_edit(text: str) -> tuple[list[Hunk], str] | str:
    """The hunks and plan of an edit answer, or why it is unusable (never raises)."""
    try:
        obj, _ = json.JSONDecoder(strict=False).raw_decode(text[text.find("{"):] if "{" in text else text)
    except (ValueError, RecursionError) as exc:
        return f"the answer is not valid JSON ({exc})"
    if not isinstance(obj, dict) or not isinstance(obj.get("hunks"), list):
        return 'the answer must be {"plan": ..., "hunks": [{"search": ..., "replace": ...}]}'
    hunks = [Hunk(h["search"], h["replace"]) for h in obj["hunks"]
             if isinstance(h, dict) and isinstance(h.get("search"), str) and isinstance(h.get("replace"), str)]
    if not hunks:
        return "the answer has no hunk with a string search and replace"
    return hunks, str(obj.get("plan") or "")


def parse_choice(text: str, ids: Sequence[str]) -> tuple[str, str] | None:
    try:
        obj, _ = json.JSONDecoder(strict=False).raw_decode(text[text.find("{"):] if "{" in text else text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or obj.get("choice") not in ids:
        return None
    return str(obj["choice"]), str(obj.get("reason") or "")


def rank_votes(choices: Sequence[str], order: Sequence[str]) -> tuple[str, ...]:
    """The entries the samples agree on, most votes first; among equals, the menu's own order (the knowledge
    base's, then the rules'). With several samples an entry needs two votes: one sample's choice is as
    likely noise as judgement (on the corpus a 0.5B model's three samples mostly named three block sizes),
    and the menu's own order is the better guess then."""
    counts = Counter(choices)
    needed = 1 if len(choices) == 1 else 2
    position = {ident: i for i, ident in enumerate(order)}
    agreed = [c for c in counts if counts[c] >= needed]
    return tuple(sorted(agreed, key=lambda c: (-counts[c], position.get(c, len(position)))))


def build_menu(candidates: Sequence[Candidate]) -> list[MenuEntry]:
    """The rules' candidates as a menu: top-level rewrites, each with the sequences that extend it."""
    entries: list[MenuEntry] = []
    by_generator: dict[str, int] = {}
    followers: dict[int, list[Candidate]] = {}
    for candidate in candidates:
        if candidate.after is not None and candidate.after in by_generator:
            root = by_generator[candidate.after]
            followers.setdefault(root, []).append(candidate)
            by_generator[candidate.generator] = root
            continue
        base = candidate.generator.split(":", 1)[-1]
        ident = base
        n = 2
        while any(e.id == ident for e in entries):
            ident, n = f"{base}#{n}", n + 1
        by_generator[candidate.generator] = len(entries)
        entries.append(MenuEntry(ident, candidate))
    return [MenuEntry(e.id, e.candidate, tuple(followers.get(i, ()))) for i, e in enumerate(entries)]


# --- prompts ------------------------------------------------------------------------------

SYSTEM = (
    "You help make one CUDA kernel faster while it computes exactly the same results: you choose "
    "transformations from a menu, write edits as search/replace hunks, and fix rewrites that fail. Keep the "
    "kernel's name and parameters; the launch (grid and block) stays the same. Answer with exactly one JSON "
    "object of the shape the task asks for."
)
"""One system prompt for every job: with the kernel and its facts next, the jobs' prompts share a prefix
that llama.cpp evaluates once (on a CPU, reading the prompt costs more than writing the answer)."""

HUNK_RULES = (
    'Answer {"plan": "<one sentence>", "hunks": [{"search": "<one line of the kernel, whole>", '
    '"replace": "<what that line becomes: one or more lines>"}]}. Each search is a whole line copied from the '
    "kernel; to change several lines, send one hunk per line."
)


def _features_text(source: str, kernel: str) -> str:
    index = build_index(source)
    fn = next((f for f in index.kernels if f.name == kernel), None)
    if fn is None:
        return ""
    try:
        features = asdict(static_features(fn, source, dict(index.constants)))
    except Exception:  # the facts are a prompt aid only
        log.exception("static features of %s failed", kernel)
        return ""
    shown = [f"{k}={v}" for k, v in features.items() if v not in (0, False, None)]
    return ", ".join(shown)


def _first_sentence(text: str, limit: int = 100) -> str:
    head = text.split(". ", 1)[0].strip()
    return head if len(head) <= limit else head[: limit - 3] + "..."


def context_prompt(request: OptimizeRequest, kernel_text: str) -> str:
    """What every job reads first: the kernel, the analysis facts, the profile, the ranked techniques."""
    parts = [f"Kernel {request.kernel}:\n```cuda\n{kernel_text}\n```"]
    facts = _features_text(request.source, request.kernel)
    if facts:
        parts.append(f"Facts from the analysis: {facts}")
    if request.profile_summary:
        parts.append(f"Profile: {request.profile_summary[:1000]}")
    if request.techniques:
        ranked = "\n".join(f"{i}. {t.name} (predicted {t.predicted_speedup:.2f}x): {_first_sentence(t.description)}"
                           for i, t in enumerate(request.techniques, start=1))
        parts.append(f"Techniques the knowledge base ranks first for this kernel:\n{ranked}")
    return "\n\n".join(parts)


def planner_prompt(context: str, menu: Sequence[MenuEntry], proven: Mapping[str, str]) -> str:
    lines = []
    for entry in menu:
        rule = entry.candidate.generator.split(":", 1)[-1].split("[", 1)[0]
        why = _first_sentence(proven.get(rule, ""), 90)
        lines.append(f"- {entry.id}: {_first_sentence(entry.candidate.description, 90)}" + (f" ({why})" if why else ""))
    return (f"{context}\n\nMenu of transformations the rule engine can apply:\n" + "\n".join(lines)
            + '\n\nTask: choose the menu entry most likely to make the kernel faster. Answer {"choice": "<menu entry>", '
            '"reason": "<a few words>"}.')


def editor_prompt(context: str, kernel: str, hint: TechniqueHint) -> str:
    """The task after the shared context: the technique, its closest verified example, the answer's shape."""
    parts = [context, f"Task: apply {hint.name} to {kernel}: {hint.description}"]
    if hint.example_before and hint.example_after:
        parts.append("A verified example of this technique on another kernel.\n"
                     f"Before:\n```cuda\n{hint.example_before.strip()}\n```\n"
                     f"After:\n```cuda\n{hint.example_after.strip()}\n```")
    parts.append(f"Change {kernel} the way the example changed its kernel. {HUNK_RULES}")
    return "\n\n".join(parts)


def refine_prompt(context: str, kernel: str, speedup: float) -> str:
    """The editor's task on the fastest verified version of the kernel: make it faster still."""
    return (f"{context}\n\nThis version of {kernel} was verified: it computes what the original does and runs "
            f"{speedup:.2f}x faster. Task: make it faster still with one small change that keeps every result the "
            f"same. {HUNK_RULES}")


def repairer_prompt(kernel: str, failing_text: str, failure: str, original_text: str | None) -> str:
    parts = []
    if original_text is not None:
        parts.append(f"The original kernel (correct, slower):\n```cuda\n{original_text}\n```")
    parts.append(f"A rewrite of {kernel}, which fails:\n```cuda\n{failing_text}\n```")
    parts.append(failure)
    parts.append("Task: fix the rewrite; keep the optimization it makes and change only what the error names. "
                 + HUNK_RULES.replace("of the kernel", "of the failing rewrite").replace("from the kernel", "from the failing rewrite"))
    return "\n\n".join(parts)


def failure_text(verdict: Verdict, limit: int) -> str:
    """The harness's report as the repairer reads it: the reason and its first errors (the mismatch report
    names the first differing index, expected and got)."""
    lines = [f"The harness rejected it: {verdict.reason.value}."]
    lines.extend(verdict.errors[:4])
    if verdict.max_abs_error is not None:
        lines.append(f"largest absolute error {verdict.max_abs_error:g}")
    return _cut("\n".join(lines), limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def code_of(kernel_text: str) -> str:
    """The kernel's text without comments and with each run of whitespace one space: two texts that differ
    only in comments and layout compile to the same kernel."""
    return " ".join(_COMMENT.sub(" ", kernel_text).split())


def compile_errors(text: str, limit: int) -> str:
    """The compiler's message with its error lines first (ptxas numbers and warnings after them)."""
    lines = text.splitlines()
    errors = [line for line in lines if "error" in line.lower()]
    rest = [line for line in lines if line not in errors]
    return _cut("\n".join([*errors, *rest]).strip(), limit)


# --- the generator --------------------------------------------------------------------------


@dataclass
class _Spend:
    deadline: float
    tokens: int = 0


@dataclass
class _Conversation:
    job: str
    technique: str
    sample: int
    temperature: float
    seed: int
    messages: list[dict[str, Any]]
    attempt_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    steps: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass
class _Repair:
    candidate: Candidate
    failure: str
    round: int
    """Repairs already made on the way to this candidate."""


class ModelJobs:
    """A :class:`~kernel_lsp.core.candidates.CandidateGenerator`: the rules' candidates in the planner's order,
    the editor's candidates after the planner's picks, and repairs of failed candidates as soon as the
    harness reports the failure (:meth:`feedback`). Without a model answer, the rules' own order serves."""

    def __init__(self, model: ChatModel, rules: RuleGenerator | None = None, tools: AgentTools = AgentTools(),
                 budgets: JobBudgets = JobBudgets(), *, trace_sink: Callable[[AttemptRecord], None] | None = None,
                 cancel: Any = None, clock: Callable[[], float] = time.monotonic,
                 verified: tuple[Candidate, float] | None = None):
        """``verified``: a candidate already verified faster (and its speedup) that the editor refines
        when the search has accepted none faster (a benchmark replaying an earlier verification)."""
        self.model = model
        self.verified = verified
        self.rules = rules if rules is not None else RuleGenerator()
        self.name = f"model:{model.name}"
        self.tools = tools
        self.budgets = budgets
        self.trace_sink = trace_sink
        self.cancel = cancel
        self.clock = clock
        self.stats: dict[str, JobStats] = {job: JobStats() for job in JOBS}
        self.plan: PlannerResult | None = None
        self.menu: list[MenuEntry] = []
        self.order: list[str] = []
        """The menu ids in the order they were yielded (planner picks first)."""
        self.produced: list[tuple[str, Candidate]] = []
        """(job, candidate) for every candidate the editor and the repairer produced."""
        self.attempts: list[AttemptRecord] = []
        self.stop_reason: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._repairs: deque[_Repair] = deque()
        self._rounds: dict[str, int] = {}
        """Candidate source -> repairs made to reach it."""
        self._ours: set[str] = set()
        """Sources this generator yielded (feedback on others' candidates is ignored)."""
        self._best: tuple[Candidate, float] | None = None
        """The fastest candidate the harness accepted in this search, by the low end of its interval."""

    # -- the CandidateGenerator interface ------------------------------------------------------

    def generate(self, request: OptimizeRequest) -> Iterator[Candidate]:
        self.stats = {job: JobStats() for job in JOBS}
        self.plan, self.order, self.produced, self.attempts = None, [], [], []
        self.stop_reason = None
        self._repairs.clear()
        self._rounds.clear()
        self._ours.clear()
        self._best = None
        spend = _Spend(self.clock() + self.budgets.max_seconds)
        try:
            yield from self._generate(request, spend)
        finally:
            self.prompt_tokens = sum(s.prompt_tokens for s in self.stats.values())
            self.completion_tokens = sum(s.completion_tokens for s in self.stats.values())

    def feedback(self, candidate: Candidate, verdict: Verdict | None) -> None:
        """The harness's verdict on a candidate this generator yielded: a repairable failure is queued for
        the repairer (at most ``repair_rounds`` repairs along one line of candidates); an accepted one may
        become the candidate the editor refines."""
        if verdict is not None and verdict.accepted and candidate.source in self._ours:
            low = verdict.speedup_ci_low or verdict.speedup or 0.0
            if self._best is None or low > self._best[1]:
                self._best = (candidate, low)
        if verdict is None or verdict.reason not in REPAIRABLE or candidate.source not in self._ours:
            return
        done = self._rounds.get(candidate.source, 0)
        if done >= self.budgets.repair_rounds:
            return
        self._repairs.append(_Repair(candidate, failure_text(verdict, self.budgets.error_chars), done))

    # -- the search ------------------------------------------------------------------------------

    def _generate(self, request: OptimizeRequest, spend: _Spend) -> Iterator[Candidate]:
        found = find_kernel(request.source, request.kernel)
        if found is None:
            self.stop_reason = f"no __global__ function named {request.kernel} in {request.path}"
            return
        kernel_text = request.source.encode("utf-8")[found.span.start_byte:found.span.end_byte].decode("utf-8", "replace")
        self.menu = build_menu(list(self.rules.generate(request)))
        proven = {o.rule: o.why for o in self.rules.outcomes if o.applicable}
        by_id = {e.id: e for e in self.menu}
        ranked = self._plan(request, kernel_text, proven, spend) if len(kernel_text) <= self.budgets.kernel_chars else ()
        picks = [i for i in ranked if i in by_id][: self.budgets.planner_picks]
        rest = [e.id for e in self.menu if e.id not in picks]
        for ident in picks:
            yield from self._entry(by_id[ident])
            yield from self._drain(request, spend)
        if len(kernel_text) <= self.budgets.kernel_chars:
            yield from self._edit(request, kernel_text, spend)
        for ident in rest:
            yield from self._entry(by_id[ident])
            yield from self._drain(request, spend)
        yield from self._refine(request, spend)

    def _refine(self, request: OptimizeRequest, spend: _Spend) -> Iterator[Candidate]:
        """The editor on the fastest verified candidate (the search's own, else the one given): hunks
        against its kernel, each result a candidate that extends it (``Candidate.after``)."""
        best = self._best or self.verified
        if best is None or self.budgets.refine_samples <= 0:
            return
        base, speedup = best
        found = find_kernel(base.source, request.kernel)
        if found is None:
            return
        base_text = base.source.encode("utf-8")[found.span.start_byte:found.span.end_byte].decode("utf-8", "replace")
        if len(base_text) > self.budgets.kernel_chars:
            return
        prompt = refine_prompt(context_prompt(replace(request, source=base.source), base_text), request.kernel, speedup)
        seen = {base.source, request.source}
        for sample in range(self.budgets.refine_samples):
            if self._stop(spend) is not None:
                return
            conversation = self._conversation("editor", base.technique, sample, SYSTEM, prompt, 90)
            conversation.steps.append({"kind": "refine", "base": base.generator, "base_speedup": speedup})
            yield from self._editor_sample(request, conversation, base_text, seen, base.technique, spend, base)

    def _entry(self, entry: MenuEntry) -> Iterator[Candidate]:
        self.order.append(entry.id)
        for candidate in (entry.candidate, *entry.followers):
            self._ours.add(candidate.source)
            yield candidate

    def _drain(self, request: OptimizeRequest, spend: _Spend) -> Iterator[Candidate]:
        """Repairs of the candidates the harness rejected since the last one (each may be rejected again)."""
        while self._repairs and self._stop(spend) is None:
            item = self._repairs.popleft()
            repaired = self._repair(request, item.candidate, item.failure, item.round, spend, with_original=True)
            if repaired is not None:
                yield from self._yield(request, "repairer", repaired)

    def _yield(self, request: OptimizeRequest, job: str, candidate: Candidate) -> Iterator[Candidate]:
        self._ours.add(candidate.source)
        self.produced.append((job, candidate))
        self.stats[job].candidates += 1
        yield candidate

    def _stop(self, spend: _Spend) -> str | None:
        if self.cancel is not None and self.cancel.is_set():
            reason = "cancelled"
        elif spend.tokens >= self.budgets.max_total_tokens:
            reason = f"token budget spent ({spend.tokens} of {self.budgets.max_total_tokens})"
        elif self.clock() >= spend.deadline:
            reason = f"time budget spent ({self.budgets.max_seconds:.0f} s)"
        else:
            return None
        self.stop_reason = reason
        return reason

    def _ask(self, conversation: _Conversation, schema: Mapping[str, Any], max_tokens: int, spend: _Spend,
             turn: int) -> str | None:
        """One constrained model answer, or None (budget, cancel, model error: recorded in the steps)."""
        stats = self.stats[conversation.job]
        stop = self._stop(spend)
        if stop is not None:
            conversation.steps.append({"kind": "stopped", "why": stop})
            return None
        start = self.clock()
        try:
            completion = self.model.chat(
                conversation.messages, schema=schema,
                max_tokens=max(1, min(max_tokens, self.budgets.max_total_tokens - spend.tokens)),
                temperature=conversation.temperature, seed=conversation.seed + turn,
                timeout_s=max(1.0, min(self.budgets.turn_timeout_s, spend.deadline - self.clock())),
                cancel=self.cancel)
        except ModelError as exc:
            stats.wall_s += self.clock() - start
            conversation.steps.append({"kind": "model_error", "turn": turn, "error": str(exc)})
            return None
        stats.wall_s += self.clock() - start
        stats.calls += 1
        stats.prompt_tokens += completion.prompt_tokens
        stats.completion_tokens += completion.completion_tokens
        conversation.prompt_tokens += completion.prompt_tokens
        conversation.completion_tokens += completion.completion_tokens
        spend.tokens += completion.prompt_tokens + completion.completion_tokens
        conversation.steps.append({"kind": "model", "turn": turn, "text": completion.text,
                                   "finish_reason": completion.finish_reason,
                                   "prompt_tokens": completion.prompt_tokens,
                                   "completion_tokens": completion.completion_tokens,
                                   "wall_s": round(completion.wall_s, 3)})
        if completion.finish_reason == "length":
            stats.invalid += 1
            conversation.steps.append({"kind": "invalid", "why": f"cut off at {completion.completion_tokens} tokens"})
            return None
        return completion.text

    def _conversation(self, job: str, technique: str, sample: int, system: str, user: str,
                      salt: int) -> _Conversation:
        temperatures = self.budgets.temperatures or (0.2,)
        return _Conversation(job, technique, sample, temperatures[sample % len(temperatures)],
                             self.budgets.seed + 1000 * salt + 100 * sample,
                             [{"role": "system", "content": system}, {"role": "user", "content": user}])

    # -- planner -----------------------------------------------------------------------------

    def _plan(self, request: OptimizeRequest, kernel_text: str, proven: Mapping[str, str],
              spend: _Spend) -> tuple[str, ...]:
        ids = [e.id for e in self.menu]
        if len(ids) < 2:
            return tuple(ids)
        schema = planner_schema(ids)
        user = planner_prompt(context_prompt(request, kernel_text), self.menu, proven)
        choices: list[str] = []
        reasons: list[str] = []
        for sample in range(self.budgets.planner_samples):
            conversation = self._conversation("planner", "plan", sample, SYSTEM, user, 0)
            text = self._ask(conversation, schema, self.budgets.planner_max_tokens, spend, 0)
            parsed = parse_choice(text, ids) if text is not None else None
            if parsed is None:
                if text is not None:
                    self.stats["planner"].invalid += 1
                self._record(request, conversation, "rejected", "no usable choice", None)
                if self.stop_reason is not None:
                    break
                continue
            choices.append(parsed[0])
            reasons.append(parsed[1])
            conversation.steps.append({"kind": "choice", "choice": parsed[0]})
            self._record(request, conversation, "choice", parsed[0], None)
        ranked = rank_votes(choices, ids)
        self.plan = PlannerResult(ranked, dict(Counter(choices)), tuple(reasons))
        self.stats["planner"].candidates = len(ranked)
        return ranked

    # -- editor ------------------------------------------------------------------------------

    def _hints(self, request: OptimizeRequest) -> list[TechniqueHint]:
        hints = sorted(request.techniques, key=lambda h: not (h.example_before and h.example_after))
        return hints[: self.budgets.editor_techniques] or [GENERAL_TECHNIQUE]

    def _edit(self, request: OptimizeRequest, kernel_text: str, spend: _Spend) -> Iterator[Candidate]:
        seen = {request.source}
        context = context_prompt(request, kernel_text)
        for t, hint in enumerate(self._hints(request), start=1):
            for sample in range(self.budgets.editor_samples):
                if self._stop(spend) is not None:
                    return
                conversation = self._conversation("editor", hint.name, sample, SYSTEM,
                                                  editor_prompt(context, request.kernel, hint), t)
                yield from self._editor_sample(request, conversation, kernel_text, seen, hint.name, spend)

    def _editor_sample(self, request: OptimizeRequest, conversation: _Conversation, kernel_text: str, seen: set[str],
                       technique: str, spend: _Spend, base: Candidate | None = None) -> Iterator[Candidate]:
        """One editor sample: its hunks on ``kernel_text`` (the original's kernel, or ``base``'s, which the result
        then extends), the file compiled and repaired, yielded unless ``seen`` has it, then pending repairs."""
        file_source = base.source if base is not None else request.source
        on = replace(request, source=file_source)
        source = self._edit_once(on, conversation, kernel_text, file_source, spend)
        if source is None or source in seen:
            self._record(request, conversation, "rejected",
                         "no usable edit" if source is None else "same file as an earlier candidate", None)
            return
        seen.add(source)
        candidate = self._checked(request, conversation, source, technique, "editor", base, spend, 0)
        if candidate is not None:
            seen.add(candidate.source)
            # A candidate that needed repairs before it compiled is the repairer's.
            yield from self._yield(request, candidate.generator.rsplit("/", 1)[-1], candidate)
            yield from self._drain(request, spend)

    def _edit_once(self, request: OptimizeRequest, conversation: _Conversation, kernel_text: str, file_source: str,
                   spend: _Spend) -> str | None:
        """The file with the model's hunks applied to the kernel (one retry when hunks do not apply)."""
        stats = self.stats[conversation.job]
        for turn in range(2):
            text = self._ask(conversation, edit_schema(searchable_lines(kernel_text)), self.budgets.editor_max_tokens,
                             spend, turn)
            if text is None:
                return None
            parsed = parse_edit(text)
            if isinstance(parsed, str):
                stats.invalid += 1
                conversation.steps.append({"kind": "invalid", "why": parsed})
                return None
            result: HunkResult = apply_hunks(kernel_text, parsed[0])
            stats.hunks_failed += len(result.failures)
            conversation.steps.append({"kind": "hunks", "applied": list(result.applied),
                                       "failed": [asdict(f) for f in result.failures]})
            if result.failures and turn == 0:
                # The hunks that did not apply are reported back once; the model sends the whole edit again.
                report = (f"{len(result.applied)} of {len(parsed[0])} hunks applied.\n{result.report()}\n"
                          "Send the whole edit again with every search copied exactly from the kernel.")
                self._exchange(conversation, text, report, "The edit did not apply:")
                continue
            if not result.applied:
                return None
            spliced = splice_kernel(file_source, request.kernel, result.text)
            if spliced.source is None:
                stats.invalid += 1
                conversation.steps.append({"kind": "splice_error", "why": spliced.error})
                return None
            if code_of(result.text) == code_of(kernel_text):
                # Only whitespace or comments changed: the same kernel, not worth a GPU run.
                stats.invalid += 1
                conversation.steps.append({"kind": "unchanged"})
                return None
            conversation.steps.append({"kind": "tool", "tool": "edit", "result": "applied"})
            conversation.messages.append({"role": "assistant", "content": text})
            return spliced.source
        return None

    def _exchange(self, conversation: _Conversation, answer: str, result: str, label: str) -> None:
        conversation.messages.extend(tool_exchange(self.model.tool_format, f"call_{len(conversation.messages)}",
                                                   "edit", answer, result, label))

    def _compile(self, job: str, source: str) -> CompileFeedback | None:
        if self.tools.compile is None:
            return None
        start = self.clock()
        try:
            feedback = self.tools.compile(source)
        except Exception as exc:
            log.exception("compile tool failed")
            feedback = CompileFeedback(False, f"the compile tool failed: {type(exc).__name__}: {exc}")
        self.stats[job].wall_s += self.clock() - start
        self.stats[job].compile_checked += 1
        if feedback.ok:
            self.stats[job].compiled += 1
        return feedback

    def _checked(self, request: OptimizeRequest, conversation: _Conversation, source: str, technique: str, job: str,
                 base: Candidate | None, spend: _Spend, rounds: int) -> Candidate | None:
        """A candidate once it compiles (repaired up to the budget when it does not); None otherwise.
        ``base``: the candidate it was written on, whose launch it keeps and which it extends (a step after it)."""
        feedback = self._compile(job, source)
        if feedback is not None:
            conversation.steps.append({"kind": "compile", "ok": feedback.ok,
                                       "result": _cut(feedback.text, self.budgets.error_chars)})
        self._record(request, conversation, "candidate" if feedback is None or feedback.ok else "rejected",
                     None if feedback is None or feedback.ok else "does not compile", source)
        candidate = Candidate(
            kernel=request.kernel, source=source, technique=technique, generator=f"{self.name}/{job}",
            description=f"{technique} ({job}, {self.model.name})",
            launch_override=base.launch_override if base is not None else None,
            trace=({"kind": "attempt", "attempt_id": conversation.attempt_id}, *conversation.steps),
            grid_scale=base.grid_scale if base is not None else None,
            block=base.block if base is not None else None,
            grid_divide=base.grid_divide if base is not None else None,
            after=base.generator if base is not None else None,
        )
        self._rounds[source] = rounds
        if feedback is None or feedback.ok:
            return candidate
        failure = "The compiler rejected it:\n" + compile_errors(feedback.text, self.budgets.error_chars)
        if rounds >= self.budgets.repair_rounds:
            return None
        return self._repair(request, candidate, failure, rounds, spend, with_original=False)

    # -- repairer ----------------------------------------------------------------------------

    def _repair(self, request: OptimizeRequest, failed: Candidate, failure: str, rounds: int, spend: _Spend,
                with_original: bool) -> Candidate | None:
        """Up to ``repair_rounds - rounds`` rounds of hunks against ``failed``'s kernel; the first that compiles
        (and, for a verification failure, is yielded for the harness to judge again)."""
        original = find_kernel(request.source, request.kernel)
        original_text = None
        if with_original and original is not None:
            original_text = request.source.encode("utf-8")[original.span.start_byte:original.span.end_byte].decode(
                "utf-8", "replace")
        current, reason = failed, failure
        for round_ in range(rounds, self.budgets.repair_rounds):
            found = find_kernel(current.source, request.kernel)
            if found is None:
                return None
            failing = current.source.encode("utf-8")[found.span.start_byte:found.span.end_byte].decode("utf-8", "replace")
            next_source: str | None = None
            next_reason: str | None = None
            for sample in range(self.budgets.repair_samples):
                if self._stop(spend) is not None:
                    return None
                conversation = self._conversation(
                    "repairer", current.technique, sample, SYSTEM,
                    repairer_prompt(request.kernel, failing, reason, original_text), 50 + round_)
                source = self._edit_once(request, conversation, failing, current.source, spend)
                if source is None:
                    self._record(request, conversation, "rejected", "no usable repair", None)
                    continue
                feedback = self._compile("repairer", source)
                if feedback is not None:
                    conversation.steps.append({"kind": "compile", "ok": feedback.ok,
                                               "result": _cut(feedback.text, self.budgets.error_chars)})
                ok = feedback is None or feedback.ok
                self._record(request, conversation, "candidate" if ok else "rejected",
                             None if ok else "the repair does not compile", source)
                if ok:
                    self._rounds[source] = round_ + 1
                    return Candidate(
                        kernel=request.kernel, source=source, technique=current.technique,
                        generator=f"{self.name}/repairer", description=f"{current.description}; repaired",
                        launch_override=current.launch_override,
                        trace=({"kind": "attempt", "attempt_id": conversation.attempt_id}, *conversation.steps),
                        grid_scale=current.grid_scale, block=current.block, grid_divide=current.grid_divide,
                        after=current.after)
                next_source = source
                next_reason = "The compiler rejected it:\n" + compile_errors(feedback.text, self.budgets.error_chars)
            if next_source is None or next_reason is None:
                return None
            current = Candidate(request.kernel, next_source, current.technique, current.generator, current.description,
                                current.launch_override, grid_scale=current.grid_scale, block=current.block,
                                grid_divide=current.grid_divide, after=current.after)
            reason = next_reason
        return None

    # -- traces ------------------------------------------------------------------------------

    def _record(self, request: OptimizeRequest, conversation: _Conversation, outcome: str, reason: str | None,
                source: str | None) -> None:
        record = AttemptRecord(
            attempt_id=conversation.attempt_id, created_unix_s=time.time(), generator=f"{self.name}/{conversation.job}",
            kernel=request.kernel, path=request.path, technique=conversation.technique, sample=conversation.sample,
            temperature=conversation.temperature, seed=conversation.seed,
            prompt=tuple(dict(m) for m in conversation.messages[:2]),
            steps=({"kind": "job", "job": conversation.job}, *conversation.steps), outcome=outcome, reason=reason,
            candidate_source=source, prompt_tokens=conversation.prompt_tokens,
            completion_tokens=conversation.completion_tokens, wall_s=time.monotonic() - conversation.started)
        self.attempts.append(record)
        if self.trace_sink is not None:
            try:
                self.trace_sink(record)
            except Exception:
                log.exception("could not store the trace of attempt %s", conversation.attempt_id)
