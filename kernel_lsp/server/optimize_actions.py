"""The optimizer's code actions: "Optimize <kernel>" and "Apply <technique>: 2.31x faster (verified, ...)".

"Optimize" runs :func:`kernel_lsp.services.optimizer.optimize` as a background job
(``JobKey(uri, "optimize", kernel)``: progress, cancellable, a newer request
cancels the older one). Its result is kept per document and kernel together
with the document version it started from. An "Apply" action is offered only
for candidates the harness accepted, and its WorkspaceEdit names that version:
when the document has changed since, the action is shown disabled as stale and
carries no edit. On a machine known to lack a GPU (or pycuda) "Optimize" itself
is shown disabled with its reason ("needs a GPU to verify"), and the command
says so before it asks for a launch spec.

Registered from :mod:`kernel_lsp.server.code_actions` (its provider list).
"""

from __future__ import annotations

import logging
import os
import re
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from lsprotocol import types

from kernel_lsp.core.candidates import Candidate
from kernel_lsp.core.parse import ParsedDocument, newline_of
from kernel_lsp.core.transforms.launch_edit import applied_source
from kernel_lsp.core.verdict import Reason, Verdict
from kernel_lsp.server import code_actions
from kernel_lsp.server.base import KernelLspServer, ServerState, guarded
from kernel_lsp.server.convert import byte_to_utf16, line_bytes
from kernel_lsp.server.documents import DocumentState
from kernel_lsp.server.profiling import result_for
from kernel_lsp.services.jobs import JobKey
from kernel_lsp.services.llm import model_from_settings
from kernel_lsp.services.optimizer import Budget, CandidateResult, OptimizeResult

log = logging.getLogger(__name__)

OPTIMIZE_COMMAND = "kernelLsp.optimize"
CANCEL_COMMAND = "kernelLsp.cancelOptimize"
#: Test-only command (registered when ``KERNEL_LSP_TEST_HOOKS=1``) that stores a fake verified result.
INJECT_COMMAND = "kernelLsp.test.injectOptimizeResult"
TEST_HOOKS_ENV = "KERNEL_LSP_TEST_HOOKS"
_LINES = re.compile(r"[^\n]*\n|[^\n]+$")
#: A line feed not preceded by a carriage return.
_LONE_LF = re.compile(r"(?<!\r)\n")
#: Apply actions shown per kernel (best first).
MAX_APPLY_ACTIONS = 3


@dataclass
class _OptimizerState:
    results: dict[tuple[str, str], OptimizeResult] = field(default_factory=dict)
    """(uri, kernel) -> the latest finished search."""
    model: Any = None
    """The loaded local model, kept between searches (loading takes seconds); see :func:`_model`."""
    model_key: tuple[Any, ...] | None = None


_STATES: "weakref.WeakKeyDictionary[ServerState, _OptimizerState]" = weakref.WeakKeyDictionary()


def ostate(state: ServerState) -> _OptimizerState:
    return _STATES.setdefault(state, _OptimizerState())


# --------------------------------------------------------------------------- edits and titles


def apply_title(result: CandidateResult) -> str:
    v = result.verdict
    assert v is not None and v.speedup is not None
    err = f", max rel err {v.max_rel_error:.0e}" if v.max_rel_error is not None else ""
    title = f"Apply {result.candidate.technique}: {v.speedup:.2f}x faster ({v.verified_at()}{err})"
    if result.candidate.launch_override and result.candidate.grid_scale is None and result.candidate.block is None \
            and result.candidate.grid_divide is None:
        launch = result.candidate.launch_override
        title += f" [needs launch grid {list(launch.get('grid', []))}, block {list(launch.get('block', []))}]"
    return title


def minimal_edit(doc: ParsedDocument, new_text: str) -> types.TextEdit:
    """One TextEdit replacing only the lines that differ (whole lines, UTF-16 positions)."""
    old_text = doc.source_bytes.decode("utf-8", "replace")
    if newline_of(old_text) == "\r\n":
        # A rule writes its new lines with "\n": in a CRLF buffer they take the buffer's own ending.
        new_text = _LONE_LF.sub("\r\n", new_text)
    # LSP lines end at "\n" (a "\r\n" pair ends with it too); str.splitlines would also split at \f, \v, U+2028.
    old, new = _LINES.findall(old_text), _LINES.findall(new_text)
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    stop = len(old) - tail
    if stop == len(old) and old and not old_text.endswith("\n"):
        # The last line has no newline: end the range at its end, not on a line that does not exist.
        last = len(old) - 1
        end = types.Position(line=last, character=byte_to_utf16(line_bytes(doc, last), 1 << 30))
    else:
        end = types.Position(line=stop, character=0)
    return types.TextEdit(range=types.Range(start=types.Position(line=head, character=0), end=end),
                          new_text="".join(new[head : len(new) - tail]))


def apply_action(doc: DocumentState, result: OptimizeResult, candidate: CandidateResult) -> types.CodeAction:
    """The edit against the verified version, or a disabled stale action when the document changed."""
    title = apply_title(candidate)
    current = doc.source_bytes.decode("utf-8", "replace")
    if doc.version != result.document_version or current != result.original_source:
        return types.CodeAction(
            title=f"{title}: stale", kind=types.CodeActionKind.RefactorRewrite,
            disabled=types.CodeActionDisabled(
                reason=f"the document changed since version {result.document_version} was verified; run Optimize {result.kernel} again"),
        )
    host = applied_source(candidate.candidate, result.original_source)
    if host.lines:
        title += f" (launch{'es' if len(host.lines) > 1 else ''} at line {', '.join(map(str, host.lines))} edited too)"
    elif host.instruction:
        title += f" [{host.instruction}]"
    edit = types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(
        text_document=types.OptionalVersionedTextDocumentIdentifier(uri=doc.uri, version=result.document_version),
        edits=[minimal_edit(doc.parsed, host.source)],
    )])
    return types.CodeAction(title=title, kind=types.CodeActionKind.RefactorRewrite, edit=edit)


def kernel_actions(state: ServerState, doc: DocumentState, kernel: str) -> list[types.CodeAction | types.Command]:
    # A bare Command (allowed in a codeAction answer): lsprotocol-based clients parse any action that
    # carries a "command" as a Command anyway (lsprotocol _hooks._code_action_hook), losing its fields.
    problem = state.machine.verify_problem if state.machine is not None else None
    actions: list[types.CodeAction | types.Command] = [
        types.CodeAction(title=f"Optimize {kernel} ({problem})", kind=types.CodeActionKind.RefactorRewrite,
                         disabled=types.CodeActionDisabled(reason=problem)) if problem else
        types.Command(title=f"Optimize {kernel}", command=OPTIMIZE_COMMAND, arguments=[doc.uri, kernel]),
    ]
    result = ostate(state).results.get((doc.uri, kernel))
    if result is None:
        return actions
    accepted = result.accepted
    for candidate in accepted[:MAX_APPLY_ACTIONS]:
        actions.append(apply_action(doc, result, candidate))
    if not accepted:
        if result.gpu_error:
            reason = f"nothing could be verified: {result.gpu_error}"
        else:
            reason = f"none of {len(result.results)} candidates was verified faster" + (f" ({result.stopped})" if result.stopped else "")
        actions.append(types.CodeAction(title=f"Apply an optimization of {kernel}", kind=types.CodeActionKind.RefactorRewrite,
                                        disabled=types.CodeActionDisabled(reason=reason)))
    return actions


def provider(ctx: Any) -> list[types.CodeAction | types.Command]:
    fn = ctx.function
    if fn is None or not fn.is_kernel:
        return []
    return kernel_actions(ctx.state, ctx.doc, fn.name)


# --------------------------------------------------------------------------- the job


def _last_profile(state: ServerState, path: str | None, kernel: str) -> Any:
    if path is None:
        return None
    try:
        found = result_for(state, path, kernel)
    except Exception:  # a failing profile store must not stop the search: optimize without a profile
        log.debug("no profile for %s", kernel, exc_info=True)
        return None
    return found.profile if found is not None else None


def _spec_for(state: ServerState, doc: DocumentState, kernel: str) -> tuple[Any, str | None]:
    """(Spec, None) or (None, why not)."""
    if doc.path is None:
        return None, "the document is not a file"
    # The document's own index (built before, off the loop for a big one) judges whether the spec fits.
    found = state.session().resolve_spec(doc.path, doc.text(), kernel, index=doc.index())
    return found.spec, found.problem


def _model(state: ServerState, load: Any) -> Any:
    """The model for the current settings: reused while they are unchanged, the old one closed otherwise."""
    s = state.settings
    key = (s.model, s.model_n_gpu_layers, s.model_n_ctx, s.model_threads, s.model_lora, s.model_endpoint)
    os_ = ostate(state)
    if os_.model_key != key:
        if os_.model is not None:
            os_.model.close()
        os_.model, os_.model_key = load(s), key
    return os_.model


def run_search(state: ServerState, doc: DocumentState, kernel: str, spec: Any, source: str, version: int | None, ctx: Any) -> OptimizeResult:
    """The job's work (a worker thread): the session wires flags, verifier, KB and traces from the settings."""
    s = state.settings
    budget = Budget(max_candidates=s.optimize_budget_candidates, max_seconds=s.optimize_budget_s)
    messages: list[str] = []
    model = None
    if s.model:
        try:
            model = _model(state, model_from_settings)
        except Exception as exc:  # a missing model degrades to rules only, visibly
            messages.append(f"model unavailable ({exc}); rules only")
    path = doc.path or doc.uri
    result = state.session().optimize(source, path, kernel, spec, model=model, budget=budget,
                                      profile=_last_profile(state, doc.path, kernel), cancel=ctx.cancel,
                                      progress=lambda message, pct: ctx.report(message, pct), document_version=version)
    if messages:
        result = replace(result, messages=result.messages + tuple(messages))
    return result


def finished_message(result: OptimizeResult) -> tuple[str, types.MessageType]:
    best = result.best
    if best is not None and best.verdict is not None and best.verdict.speedup is not None:
        return (f"Optimize {result.kernel}: {best.candidate.technique} is {best.verdict.speedup:.2f}x faster (verified); "
                f"use the code action to apply it", types.MessageType.Info)
    if result.gpu_error:
        return (f"Optimize {result.kernel}: {len(result.results)} candidates, none verified: {result.gpu_error}",
                types.MessageType.Warning)
    return (f"Optimize {result.kernel}: no verified speedup among {len(result.results)} candidates"
            + (f" ({result.stopped})" if result.stopped else ""), types.MessageType.Info)


def start(state: ServerState, doc: DocumentState, kernel: str) -> str:
    machine_problem = state.machine.verify_problem if state.machine is not None else None
    if machine_problem is not None:
        state.show(f"Optimize {kernel}: {machine_problem} ({state.machine.gpu_problem or 'see the start-up message'})",
                   types.MessageType.Warning)
        return "no-gpu"
    spec, problem = _spec_for(state, doc, kernel)
    if spec is None:
        state.show(f"Optimize {kernel}: {problem}", types.MessageType.Warning)
        return "no-spec"
    version, source = doc.version, doc.text()

    def publish(result: OptimizeResult) -> None:
        ostate(state).results[(doc.uri, kernel)] = result
        for notice in result.messages:
            # The search's notices (a corrupt knowledge base moved aside, an empty one with a backup to
            # restore, a store that could not be opened) reach the user as messages, not only in the result.
            state.show(f"kernel-lsp: {notice}", types.MessageType.Warning, once_key=f"notice:{notice}")
        message, kind = finished_message(result)
        state.show(message, kind)

    state.jobs.submit(
        JobKey(doc.uri, "optimize", kernel),
        lambda ctx: run_search(state, doc, kernel, spec, source, version, ctx),
        publish=publish,
        version=version,
        current_version=lambda: doc.version,
        title=f"Optimize {kernel}",
        progress=state.progress_factory(),
    )
    return "started"


# --------------------------------------------------------------------------- test hook


def injected_result(doc: DocumentState, data: dict) -> OptimizeResult:
    """A fake finished search with one accepted candidate (tests only): the code action path without a GPU."""
    kernel = data["kernel"]
    scale = data.get("grid_scale")
    candidate = Candidate(kernel, data["source"], data.get("technique", "test-technique"), "test:injected", "injected",
                          data.get("launch_override"), grid_scale=tuple(scale) if scale else None)
    verdict = Verdict(accepted=True, reason=Reason.OK, speedup=float(data.get("speedup", 2.0)),
                      speedup_ci_low=float(data.get("speedup", 2.0)) * 0.95, speedup_ci_high=float(data.get("speedup", 2.0)) * 1.05,
                      max_rel_error=float(data.get("max_rel_error", 3e-7)))
    result = CandidateResult(candidate, "injected", verdict)
    return OptimizeResult(kernel, doc.path or doc.uri, data["original"], data["version"], None, (), (result,))


def register(server: KernelLspServer) -> None:
    state = server.state
    code_actions.providers(state).append(provider)

    @server.command(OPTIMIZE_COMMAND)
    @guarded(state, what=OPTIMIZE_COMMAND)
    async def optimize_command(uri: str, kernel: str) -> str:
        doc = state.documents.get(uri)
        if doc is None:
            state.show(f"kernel-lsp: {uri} is not open", types.MessageType.Warning)
            return "not-open"
        await doc.index_async()
        return start(state, doc, kernel)

    @server.command(CANCEL_COMMAND)
    @guarded(state, what=CANCEL_COMMAND)
    async def cancel_command(uri: str, kernel: str) -> bool:
        return state.jobs.cancel(JobKey(uri, "optimize", kernel))

    if os.environ.get(TEST_HOOKS_ENV) == "1":
        @server.command(INJECT_COMMAND)
        async def inject(data: dict) -> bool:
            doc = state.documents.get(data["uri"])
            if doc is None:
                return False
            ostate(state).results[(doc.uri, data["kernel"])] = injected_result(doc, data)
            return True
