"""The search driver: profile -> knowledge-base state -> techniques -> candidates -> harness -> KB.

:func:`optimize` runs one search for one kernel:

1. the kernel's performance signature (its last profile) -> ``KnowledgeBase.match_state``,
   or, without a profile or when the profile's tree leaf says ``state_from: source``, the
   state the static features suggest (:mod:`kernel_lsp.core.static_state`) -> ``hints`` (techniques drawn by the KB
   with the request's ``seed``, so the same KB gives the same list, each with
   its closest verified example);
2. candidates from the generators (rewrite rules, and the local model when one
   is configured) within the budgets: candidates, seconds, model tokens; a
   generator with a ``feedback(candidate, verdict)`` method hears each verdict
   before it is asked for the next candidate (the model's repairer does);
3. each candidate through the verifier (the harness's ``verify``; tests inject
   a fake) with the candidate's own launch override;
4. every verdict recorded in the knowledge base (so it learns from rules and
   model alike) and in the trace store (model attempts get their verdict);
5. the best verified candidate: accepted, highest lower bound of the speedup
   interval.

No GPU (``GpuUnavailable``) stops verification at the first candidate: the
result lists the candidates as unverified with the reason, and nothing is
accepted. Cancellation (a ``threading.Event``) stops between candidates and
kills a running verification.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kernel_lsp.core.candidates import Candidate, CandidateGenerator, OptimizeRequest, TechniqueHint
from kernel_lsp.core.features import StaticFeatures, static_features
from kernel_lsp.core.index import build_index
from kernel_lsp.core.kb_logic import Attempt
from kernel_lsp.core.profile_render import kernel_markdown
from kernel_lsp.core.rules import RuleGenerator
from kernel_lsp.core.spec import Spec, SpecError, with_candidate_launch
from kernel_lsp.core.static_state import static_state
from kernel_lsp.core.verdict import Reason, Verdict
from kernel_lsp.services.agent import AgentBudgets, AgentTools, CompileFeedback, ModelGenerator, attempt_id_of
from kernel_lsp.services.harness import GpuUnavailable, VerifyCancelled, verify
from kernel_lsp.services.harness.compile import compile_cubin
from kernel_lsp.services.model_jobs import JobBudgets, ModelJobs
from kernel_lsp.services.profiler import GPU_LOCK
from kernel_lsp.services.toolchain import BuildFlags
from kernel_lsp.services.traces import AttemptRecord

log = logging.getLogger(__name__)

#: Techniques asked of the knowledge base per search.
HINTS_PER_SEARCH = 6
#: Seed of the knowledge base's weighted draw when the caller gives none: same KB, same techniques.
DEFAULT_SEED = 0

Verifier = Callable[[str, str, Spec, "threading.Event | None"], Verdict]
"""(original source, candidate source, spec with the candidate's launch, cancel) -> Verdict.
Raises ``GpuUnavailable`` when nothing can be measured, ``VerifyCancelled`` on cancel."""
ProgressFn = Callable[[str, "int | None"], None]

_VERDICT_KIND = {
    Reason.OK: "accepted",
    Reason.NOT_FASTER: "slower",
    Reason.COMPILE_ERROR: "compile-error",
    Reason.SIGNATURE_CHANGED: "signature-changed",
    Reason.LAUNCH_ERROR: "crashed",
    Reason.TIMEOUT: "timeout",
    Reason.STATIC_CHECK: "static-check",
}


@dataclass(frozen=True)
class Budget:
    max_candidates: int = 8
    """Candidates verified (each one is a GPU run)."""
    max_seconds: float = 600.0
    """Wall time of the whole search, generation and verification, after which no candidate starts; one
    already being verified finishes (its own limit is the harness's timeout), so a search may end past it."""
    max_tokens: int = 60_000
    """Model prompt plus completion tokens."""


@dataclass(frozen=True)
class CandidateResult:
    candidate: Candidate
    candidate_hash: str
    verdict: Verdict | None
    """None when it was not verified (no GPU, a bad launch override, cancelled)."""
    note: str | None = None
    """Why there is no verdict, or a remark about it."""
    wall_s: float = 0.0

    @property
    def accepted(self) -> bool:
        return self.verdict is not None and self.verdict.accepted

    @property
    def speedup_low(self) -> float | None:
        return self.verdict.speedup_ci_low if self.verdict is not None else None

    def status(self) -> str:
        if self.verdict is None:
            return "unverified"
        return _VERDICT_KIND.get(self.verdict.reason, "incorrect")

    def to_json(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "generator": c.generator, "technique": c.technique, "description": c.description,
            "launch_override": dict(c.launch_override) if c.launch_override else None,
            "candidate_hash": self.candidate_hash, "status": self.status(), "note": self.note,
            "verdict": self.verdict.to_json() if self.verdict is not None else None, "wall_s": self.wall_s,
        }


@dataclass(frozen=True)
class OptimizeResult:
    kernel: str
    path: str
    original_source: str
    document_version: int | None
    """The document version the search started from (code actions edit only that version)."""
    state: str | None
    techniques: tuple[str, ...]
    results: tuple[CandidateResult, ...]
    stopped: str | None = None
    """Why the search stopped before its generators ran dry (budget, cancel, no GPU)."""
    gpu_error: str | None = None
    """Set when no GPU could verify anything: nothing is accepted."""
    wall_s: float = 0.0
    tokens: int = 0
    messages: tuple[str, ...] = ()

    @property
    def accepted(self) -> tuple[CandidateResult, ...]:
        ranked = [r for r in self.results if r.accepted]
        return tuple(sorted(ranked, key=lambda r: -(r.speedup_low or 0.0)))

    @property
    def best(self) -> CandidateResult | None:
        accepted = self.accepted
        return accepted[0] if accepted else None

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {
            "kernel": self.kernel, "path": self.path, "document_version": self.document_version,
            "state": self.state, "techniques": list(self.techniques),
            "candidates": [r.to_json() for r in self.results],
            "best": best.candidate_hash if best else None,
            "best_speedup": best.verdict.speedup if best and best.verdict else None,
            "stopped": self.stopped, "gpu_error": self.gpu_error, "wall_s": self.wall_s, "tokens": self.tokens,
            "messages": list(self.messages),
        }


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def candidate_hash(candidate: Candidate) -> str:
    launch = repr(sorted((candidate.launch_override or {}).items()))
    return source_hash(candidate.source + "\0" + launch)


def harness_verifier(options: Any = None) -> Verifier:
    """The real verifier: :func:`kernel_lsp.services.harness.verify` with ``options`` (VerifyOptions),
    serialized with the profiler's GPU lock."""
    def run(original: str, candidate: str, spec: Spec, cancel: threading.Event | None) -> Verdict:
        # One GPU job at a time in this process (profiles and other searches): timings must not overlap.
        while not GPU_LOCK.acquire(timeout=0.2):
            if cancel is not None and cancel.is_set():
                raise VerifyCancelled("cancelled while waiting for the GPU")
        try:
            return verify(original, candidate, spec, options, cancel=cancel)
        finally:
            GPU_LOCK.release()

    return run


def _kernel_text(source: str, kernel: str) -> str:
    index = build_index(source)
    fn = next((f for f in index.kernels if f.name == kernel), None)
    if fn is None:
        return source
    return source.encode("utf-8")[fn.span.start_byte : fn.span.end_byte].decode("utf-8", "replace")


def _features(source: str, kernel: str) -> StaticFeatures | None:
    index = build_index(source)
    fn = next((f for f in index.kernels if f.name == kernel), None)
    if fn is None:
        return None
    try:
        return static_features(fn, source, dict(index.constants))
    except Exception:  # features only guide the search; a failure must not stop it
        log.exception("static features of %s failed", kernel)
        return None


def _attempt(result: CandidateResult, *, kernel_hash: str, path: str, kernel: str, state: str,
             features: Mapping[str, Any], original: str, profile_metrics: Mapping[str, float]) -> Attempt:
    verdict = result.verdict
    assert verdict is not None
    correct = verdict.reason in (Reason.OK, Reason.NOT_FASTER)
    c = result.candidate
    model = c.generator.split(":", 1)[1] if c.generator.startswith("model:") else None
    return Attempt(
        kernel_hash=kernel_hash, file=path, kernel=kernel, state=state, technique=c.technique,
        candidate_hash=result.candidate_hash, verdict=result.status(), accepted=verdict.accepted,
        speedup=verdict.speedup if correct else None, reason=verdict.reason.value,
        metrics_before=dict(profile_metrics), features=dict(features), model=model, generator=c.generator,
        original_source=original if verdict.accepted else None,
        candidate_source=c.source if verdict.accepted else None,
    )


class _Spend:
    def __init__(self, budget: Budget, clock: Callable[[], float]):
        self.budget = budget
        self.clock = clock
        self.start = clock()
        self.candidates = 0

    def stop_reason(self, cancel: threading.Event | None, tokens: int) -> str | None:
        if cancel is not None and cancel.is_set():
            return "cancelled"
        if self.candidates >= self.budget.max_candidates:
            return f"candidate budget spent ({self.budget.max_candidates})"
        if self.clock() - self.start >= self.budget.max_seconds:
            return f"time budget spent ({self.budget.max_seconds:.0f} s)"
        if tokens >= self.budget.max_tokens:
            return f"token budget spent ({tokens} of {self.budget.max_tokens})"
        return None


def _tokens(generators: Iterable[CandidateGenerator]) -> int:
    return sum(int(getattr(g, "prompt_tokens", 0) or 0) + int(getattr(g, "completion_tokens", 0) or 0) for g in generators)


def _interleave(generators: Sequence[CandidateGenerator], request: OptimizeRequest) -> tuple[list[Candidate], Iterator[Candidate]]:
    """Each generator's candidates in turn: the rules' whole list (pure and instant, so the
    progress can count them), then the others' lazily (a model is asked only when rules run dry)."""
    eager = [c for g in generators if isinstance(g, RuleGenerator) for c in g.generate(request)]
    lazy = (c for g in generators if not isinstance(g, RuleGenerator) for c in g.generate(request))
    return eager, itertools.chain(eager, lazy)


def _distinct(candidates: Iterable[Candidate]) -> int:
    return len({candidate_hash(c) for c in candidates})


def optimize(
    source: str,
    path: str,
    kernel: str,
    spec: Spec,
    *,
    generators: Sequence[CandidateGenerator] | None = None,
    verifier: Verifier | None = None,
    kb: Any = None,
    profile: Any = None,
    budget: Budget = Budget(),
    cancel: threading.Event | None = None,
    progress: ProgressFn | None = None,
    traces: Any = None,
    document_version: int | None = None,
    verify: bool = True,
    seed: int = DEFAULT_SEED,
    clock: Callable[[], float] = time.monotonic,
    already_recorded: Callable[[CandidateResult], bool] | None = None,
) -> OptimizeResult:
    """Search for a faster verified rewrite of ``kernel`` (see the module docstring).

    ``kb`` is an open :class:`~kernel_lsp.services.kb.KnowledgeBase` (or None: rule
    order only, nothing recorded); ``profile`` a :class:`~kernel_lsp.core.profile.KernelProfile`
    (or None); ``traces`` a :class:`~kernel_lsp.services.traces.TraceStore` (or None).
    ``verify=False`` lists candidates without running the harness (all unverified).
    ``seed`` seeds the knowledge base's draw of techniques. ``already_recorded``: verdicts the caller
    replayed from a record of an earlier run of this search (the sweep's verdict cache, when Ray retries a
    task), which the knowledge base and trace store hold already.
    """
    generators = list(generators) if generators is not None else [RuleGenerator()]
    verifier = verifier or harness_verifier()
    say = progress or (lambda message, pct: None)
    spend = _Spend(budget, clock)
    messages: list[str] = []

    # The profiling tree may say that, for kernels like this one, the source ranks better than the profile:
    # then the state comes from the static analysis (or the fallback state), as without a profile.
    from_source = profile is None or getattr(profile, "state_from", "profile") == "source"
    signature: Mapping[str, float] = {} if from_source else profile.signature()
    metrics = dict(getattr(profile, "metrics", {}) or {}) if profile is not None else {}
    state: str | None = None
    hints: tuple[TechniqueHint, ...] = ()
    static = _features(source, kernel)
    features = asdict(static) if static is not None else {}
    guess = static_state(static) if from_source and static is not None else None
    if kb is not None:
        try:
            if guess is not None:
                state = guess.state
                why = "no profile yet" if profile is None else f"the profiling tree's leaf {profile.tree_leaf} ranks by the source"
                messages.append(f"{why}: state {state} from the source ({guess.why})")
            else:
                state = kb.match_state(signature).state
            hints = tuple(kb.hints(state, HINTS_PER_SEARCH, kernel_features=features, rng_seed=seed))
        except Exception as exc:  # the KB guides the order; without it the rules' own order serves
            log.exception("knowledge base lookup failed")
            messages.append(f"knowledge base unavailable ({exc}); using the rules' default order")
    say(f"state {state or 'unknown'}; techniques: {', '.join(h.name for h in hints) or 'rule order'}", 0)

    summary = None
    if profile is not None:
        try:
            summary = kernel_markdown(profile, None)
        except Exception:  # the summary is a prompt aid only
            log.exception("profile summary failed")
    request = OptimizeRequest(source=source, path=path, kernel=kernel, spec=spec.to_json(), profile_summary=summary,
                              state=state, techniques=hints)
    kernel_hash = source_hash(_kernel_text(source, kernel))
    results: list[CandidateResult] = []
    stopped: str | None = None
    gpu_error: str | None = None
    seen: set[str] = set()
    accepted: set[str] = set()
    correct: set[str] = set()  # passed every correctness check, faster or not
    listed_steps: set[str] = set()

    listed, candidates = _interleave(generators, request)
    # "n/total" when every candidate is known up front (rules only); a model's count is open.
    only_rules = all(isinstance(g, RuleGenerator) for g in generators)
    total = min(_distinct(listed), budget.max_candidates)
    while True:
        stopped = spend.stop_reason(cancel, _tokens(generators))
        if stopped is not None:
            break
        try:
            candidate = next(candidates)
        except StopIteration:
            break
        digest = candidate_hash(candidate)
        if digest in seen:
            continue
        # A step of a sequence is tried once the step before it was accepted (or, for a step that the one before
        # only made possible, verified correct); listed without verification (a dry run, a benchmark's
        # generation), once that step was listed.
        if candidate.after is not None and candidate.after not in (
                (accepted | correct if candidate.after_correct else accepted) if verify else listed_steps):
            continue
        seen.add(digest)
        listed_steps.add(candidate.generator)
        spend.candidates += 1
        pct = int(100 * spend.candidates / max(total if only_rules else budget.max_candidates, 1))
        count = f"{spend.candidates}/{total}" if only_rules else f"{spend.candidates} (at most {budget.max_candidates})"
        say(f"{count}: {candidate.technique} ({candidate.generator})", min(pct, 99))
        result = _verify_one(candidate, digest, source, spec, verifier, cancel, verify and gpu_error is None, gpu_error)
        if result.note and result.note.startswith("no GPU"):
            gpu_error = result.note
        if result.note == "cancelled":
            stopped = "cancelled"
            results.append(result)
            break
        results.append(result)
        if result.verdict is not None and result.verdict.accepted:
            accepted.add(candidate.generator)
        if result.verdict is not None and result.verdict.reason is Reason.NOT_FASTER:
            correct.add(candidate.generator)
        _feedback(generators, candidate, result.verdict)
        if already_recorded is not None and already_recorded(result):
            continue
        _record(result, kb, traces, state, kernel_hash=kernel_hash, path=path, kernel=kernel, features=features,
                original=source, metrics=metrics)
    wall = clock() - spend.start
    out = OptimizeResult(kernel, path, source, document_version, state, tuple(h.name for h in hints), tuple(results),
                         stopped, gpu_error, wall, _tokens(generators), tuple(messages))
    say(outcome_line(out, verify), 100)
    return out


def outcome_line(result: OptimizeResult, verified: bool) -> str:
    """One line on what the search did: listed (not verified), no GPU, best speedup, or none faster."""
    best = result.best
    if not verified:
        return f"{len(result.results)} candidates listed, none verified (verification was not asked for)"
    if result.gpu_error and best is None:
        return f"nothing verified: {result.gpu_error}"
    if best is not None and best.verdict is not None and best.verdict.speedup:
        return f"best: {best.candidate.technique} {best.verdict.speedup:.2f}x (verified)"
    checked = sum(1 for r in result.results if r.verdict is not None)
    return f"no verified speedup: {checked} of {len(result.results)} candidates verified, none accepted"


def _verify_one(candidate: Candidate, digest: str, source: str, spec: Spec, verifier: Verifier,
                cancel: threading.Event | None, run: bool, gpu_error: str | None) -> CandidateResult:
    if not run:
        return CandidateResult(candidate, digest, None, gpu_error or "not verified (--no-verify)")
    try:
        candidate_spec = with_candidate_launch(spec, candidate.launch_override)
    except SpecError as exc:
        return CandidateResult(candidate, digest, None, f"the candidate's launch does not fit the spec: {exc}")
    start = time.monotonic()
    try:
        verdict = verifier(source, candidate.source, candidate_spec, cancel)
    except GpuUnavailable as exc:
        return CandidateResult(candidate, digest, None, f"no GPU: {exc}")
    except VerifyCancelled:
        return CandidateResult(candidate, digest, None, "cancelled")
    except SpecError as exc:
        return CandidateResult(candidate, digest, None, f"spec error: {exc}")
    return CandidateResult(candidate, digest, verdict, None, time.monotonic() - start)


def _feedback(generators: Sequence[CandidateGenerator], candidate: Candidate, verdict: Verdict | None) -> None:
    """Tell the generators that listen (the model's repairer) how a candidate fared, before the next is asked."""
    for generator in generators:
        listen = getattr(generator, "feedback", None)
        if listen is None:
            continue
        try:
            listen(candidate, verdict)
        except Exception:  # feedback guides later candidates only; it must not stop the search
            log.exception("feedback to %s failed", getattr(generator, "name", generator))


def _record(result: CandidateResult, kb: Any, traces: Any, state: str | None, **kw: Any) -> None:
    """Knowledge base and trace store; a failure to record never fails the search."""
    if result.verdict is None:
        return
    if kb is not None and state is not None:
        try:
            kb.record_attempt(_attempt(result, state=state, kernel_hash=kw["kernel_hash"], path=kw["path"],
                                       kernel=kw["kernel"], features=kw["features"], original=kw["original"],
                                       profile_metrics=kw["metrics"]))
        except Exception:
            log.exception("could not record the attempt in the knowledge base")
    if traces is None:
        return
    try:
        c = result.candidate
        attempt_id = attempt_id_of(c)
        if attempt_id is None:
            # Rule candidates have no model attempt: store one so traces hold every verdict.
            attempt_id = uuid.uuid4().hex
            traces.record_attempt(AttemptRecord(
                attempt_id=attempt_id, created_unix_s=time.time(), generator=c.generator, kernel=kw["kernel"],
                path=kw["path"], technique=c.technique, sample=0, temperature=None, seed=None, prompt=(), steps=(),
                outcome="candidate", reason=c.description, candidate_source=c.source, prompt_tokens=0,
                completion_tokens=0, wall_s=0.0))
        traces.record_verdict(attempt_id, result.verdict.to_json())
    except Exception:
        log.exception("could not record the trace")


# --------------------------------------------------------------------------- the model generator


def model_generator(model: Any, spec: Spec, source: str, *, verifier: Verifier | None, budget: Budget,
                    cancel: threading.Event | None = None, traces: Any = None, workspace_root: str | None = None,
                    flags: BuildFlags | None = None, techniques: int = 3, samples: int = 2,
                    seconds: float | None = None, mode: str = "agent", rules: RuleGenerator | None = None,
                    job_budgets: JobBudgets | None = None, verified: tuple[Candidate, float] | None = None) -> Any:
    """The model's generator wired to our tools: ``mode="jobs"`` the planner, editor and repairer
    (:class:`~kernel_lsp.services.model_jobs.ModelJobs`, which orders ``rules``' candidates and so replaces
    them), ``"agent"`` the free tool-calling loop (:class:`~kernel_lsp.services.agent.ModelGenerator`).
    ``verified``: a candidate verified earlier and its speedup, for the editor to refine (jobs mode).

    ``flags``: the file's build flags (the session's), so the model's compile tool sees what the verifier will."""
    build = flags or BuildFlags()

    def compile_tool(candidate: str) -> CompileFeedback:
        with tempfile.TemporaryDirectory(prefix="kernel-lsp-agent-") as workdir:
            result = compile_cubin(candidate, workdir, "candidate", build, cancel=cancel)
        return CompileFeedback(result.ok, result.log.strip() or ("compiled" if result.ok else "failed"))

    def benchmark_tool(candidate: str) -> str:
        if verifier is None:
            return "benchmark unavailable"
        try:
            return verifier(source, candidate, spec, cancel).summary()
        except GpuUnavailable as exc:
            return f"no GPU here: correctness and speed cannot be measured ({exc})"
        except (VerifyCancelled, SpecError) as exc:
            return f"benchmark failed: {exc}"

    sink = traces.record_attempt if traces is not None else None
    seconds = seconds if seconds is not None else budget.max_seconds
    if mode == "jobs":
        jobs = job_budgets or JobBudgets(max_total_tokens=budget.max_tokens, max_seconds=seconds)
        return ModelJobs(model, rules, AgentTools(compile=compile_tool), jobs, trace_sink=sink, cancel=cancel,
                         verified=verified)
    # kb_search is left to the agent's default: the request's techniques, which the driver got from the KB.
    tools = AgentTools(compile=compile_tool, benchmark=benchmark_tool, workspace_root=workspace_root)
    budgets = AgentBudgets(max_techniques=techniques, samples_per_technique=samples, max_total_tokens=budget.max_tokens,
                           max_seconds=seconds)
    return ModelGenerator(model, tools, budgets, trace_sink=sink, cancel=cancel)
