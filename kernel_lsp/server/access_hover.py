"""Memory-access patterns in the editor: hover on an access line, a summary on the kernel hover,
and a hint diagnostic on each uncoalesced global access, and each ``__constant__`` read at several
addresses across a warp, of a kernel that has a launch spec.

The analysis (preprocessing, then :mod:`kernel_lsp.core.analysis`) takes about a second on a
10,000-line file, so it never runs in a handler: an ``analysis`` job, debounced like the
compile, computes it on a worker thread after open and after edits, and stores the result
with the text revision it was made from. A hover shows it only when the revision still
matches (a stale pattern on an edited line would mislead).

The kernel's launch spec, when there is one, turns symbolic strides into numbers; without one
the hover gives the index as a formula.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from lsprotocol import types

from kernel_lsp.core.analysis import Binding, KernelFacts, bind, describe, per_block_outputs, thread_mapping
from kernel_lsp.core.index import KernelIndex
from kernel_lsp.core.spec import SpecError, parse_spec
from kernel_lsp.server.base import KernelLspServer, ServerState
from kernel_lsp.server.convert import line_range
from kernel_lsp.server.documents import DocumentState, freeze_long_lived
from kernel_lsp.services import profiler as prof
from kernel_lsp.services.harness.specfile import load_spec_file
from kernel_lsp.services.jobs import JobKey
from kernel_lsp.services.source_view import FileAnalysis

log = logging.getLogger(__name__)

_KEY = "access-analysis"
_TIMER = "access-analysis:timer"
_DUE = "access-analysis:due"
SOURCE = "kernel-lsp access"
#: Quiet time after an edit before the analysis runs again, seconds, plus
#: :data:`DEBOUNCE_S_PER_100KB` for every 100 KB of text: the analysis holds the GIL for about
#: 0.3 s per 100 KB, which must not land between the keystrokes of a burst.
ANALYSIS_DEBOUNCE_S = 0.3
DEBOUNCE_S_PER_100KB = 0.5


@dataclass(frozen=True)
class _Result:
    revision: int
    analysis: FileAnalysis


def _schedule(state: ServerState, doc: DocumentState) -> None:
    if doc.budget.analysis is not None:
        # Past the analysis budget (its open said so): no job, and no result kept from an older text.
        doc.extra.pop(_KEY, None)
        return
    uri, revision, path = doc.uri, doc.revision, doc.path
    text = doc.text()
    # The session's flags: the compile database's and extraFlags' -I and -D, as the compile sees them.
    session = state.session()

    def work(ctx):
        return session.analysis(path, text)

    def current_revision() -> int | None:
        current = state.documents.get(uri)
        return current.revision if current is not None else None

    def publish(result: FileAnalysis) -> None:
        current = state.documents.get(uri)
        if current is None:
            return
        had_hints = bool(current.extra.get(_KEY + ":hints"))
        current.extra[_KEY] = _Result(revision, result)
        # ~30,000 objects for a 10,000-line file, made after the index was frozen: every full collection
        # on the loop would scan them (~15 ms, about once per hundred hovers).
        freeze_long_lived()
        hints = access_diagnostics(state, current)
        current.extra[_KEY + ":hints"] = hints
        # Publishing costs every diagnostic source a run and the client a redraw: only when hints
        # appear or go away.
        if hints or had_hints:
            state.publish_diagnostics(current)

    state.jobs.submit(JobKey(uri, "analysis"), work, publish=publish, version=revision,
                      current_version=current_revision)


def _debounce(state: ServerState, doc: DocumentState, delay_s: float) -> None:
    """Start the analysis ``delay_s`` after the last edit. One timer per document lives on the event
    loop; an edit only moves the time it waits for, so a burst of 20,000 keystrokes makes no timer,
    job or copy of the text per keystroke: the job is submitted, and the text read, once edits stop."""
    loop = state.loop
    if loop is None or loop.is_closed():
        _schedule(state, doc)
        return
    due = loop.time() + delay_s
    doc.extra[_DUE] = due
    if doc.extra.get(_TIMER) is not None:
        return

    def fire() -> None:
        wait = doc.extra.get(_DUE, 0.0) - loop.time()
        if wait > 0:
            doc.extra[_TIMER] = loop.call_later(wait, fire)
            return
        doc.extra.pop(_TIMER, None)
        if state.documents.get(doc.uri) is doc:
            _schedule(state, doc)

    doc.extra[_TIMER] = loop.call_later(delay_s, fire)


def current(doc: DocumentState) -> FileAnalysis | None:
    """The analysis of the document's current text, when it has been computed."""
    found = doc.extra.get(_KEY)
    return found.analysis if isinstance(found, _Result) and found.revision == doc.revision else None


def binding_for(doc: DocumentState, kernel: str) -> Binding | None:
    """The kernel's launch from its spec (sidecar or in-source), once per text revision."""
    if doc.path is None:
        return None

    def compute() -> Binding | None:
        sidecar, inline, _problem = prof.find_spec(doc.path, doc.text(), kernel)
        try:
            spec = load_spec_file(sidecar) if sidecar else parse_spec(inline) if inline else None
            return Binding.from_spec(spec) if spec is not None else None
        except (OSError, SpecError, ValueError, ZeroDivisionError):
            return None

    return doc.memo(f"binding:{kernel}", compute)


def _facts_for_line(doc: DocumentState, index: KernelIndex, line: int) -> KernelFacts | None:
    analysis = current(doc)
    function = index.function_at(line, 0)
    if analysis is None or function is None:
        return None
    found = analysis.kernels.get(function.name)
    if found is not None:
        return found
    # A helper: the kernels that inline it carry its accesses.
    return next((f for f in analysis.kernels.values() if any(a.user_line == line for a in f.accesses)), None)


def line_hover(state: ServerState, doc: DocumentState, index: KernelIndex, line: int) -> str | None:
    facts = _facts_for_line(doc, index, line)
    if facts is None:
        return None
    on_line = [i for i, a in enumerate(facts.accesses) if a.user_line == line]
    if not on_line:
        return None
    binding = binding_for(doc, facts.kernel)
    if binding is None:
        rows = [f"- {facts.accesses[i].kind} `{facts.accesses[i].array}[{facts.accesses[i].index}]`" for i in on_line]
        return "**Memory accesses** (no launch spec: indices as formulas)\n\n" + "\n".join(rows)
    patterns = bind(facts, binding)
    rows = [f"- {describe(patterns[i])}" for i in on_line]
    return f"**Memory accesses** (`{facts.kernel}`, launch from its spec)\n\n" + "\n".join(rows)


def kernel_section(ctx) -> str | None:
    fn = ctx.function
    if fn is None or not fn.is_kernel:
        return None
    analysis = current(ctx.doc)
    facts = analysis.kernels.get(fn.name) if analysis is not None else None
    if facts is None:
        return None
    parts = [f"**Access analysis**: threads map as *{thread_mapping(facts)}*; "
             f"writes {', '.join(f'`{w}`' for w in facts.written) or 'nothing'}"]
    if facts.reductions:
        parts.append("reductions: " + ", ".join(f"{r.kind} on `{r.target}` ({r.op})" for r in facts.reductions))
    blocks = per_block_outputs(facts)
    if blocks:
        parts.append("per-block outputs: " + ", ".join(f"`{b}`" for b in blocks))
    binding = binding_for(ctx.doc, fn.name)
    if binding is not None:
        bad = [p for p in bind(facts, binding) if p.uncoalesced and p.access.space == "global"]
        if bad:
            parts.append(f"{len(bad)} uncoalesced global access{'es' if len(bad) > 1 else ''}, e.g. line "
                         f"{(bad[0].access.user_line or 0) + 1}: {describe(bad[0])}")
    if facts.unknowns:
        parts.append("not modelled: " + "; ".join(facts.unknowns))
    return "\n\n".join(parts)


def access_diagnostics(state: ServerState, doc: DocumentState) -> list[types.Diagnostic]:
    """A hint per uncoalesced global access and per ``__constant__`` read whose address differs across a
    warp, for kernels whose spec gives the launch; and where the
    preprocessor's budget ran out, that the analysis reads the file unexpanded."""
    analysis = current(doc)
    if analysis is None:
        return []
    out: list[types.Diagnostic] = []
    pre = analysis.preprocessed
    if pre.over_budget is not None:
        at = pre.over_budget_at
        line = at[1] if at is not None and at[0] == pre.path else 0
        out.append(types.Diagnostic(
            range=line_range(doc.parsed, line), source=SOURCE, severity=types.DiagnosticSeverity.Information,
            code="macro-budget", message=f"{pre.over_budget.split(': ', 1)[-1]}: the access analysis reads this "
                                         "file unexpanded (its accesses through macros are not seen)"))
    for name, facts in analysis.kernels.items():
        binding = binding_for(doc, name)
        if binding is None:
            continue
        seen: set[tuple[int, str]] = set()
        for p in bind(facts, binding):
            line = p.access.user_line
            slow = p.uncoalesced if p.access.space == "global" else (
                p.access.space == "constant" and p.pattern in ("serialized", "gather"))
            if not slow or line is None or (line, p.access.array) in seen:
                continue
            seen.add((line, p.access.array))
            out.append(types.Diagnostic(range=line_range(doc.parsed, line), message=describe(p), source=SOURCE,
                                        severity=types.DiagnosticSeverity.Hint, code=p.pattern))
    return out


def _on_open(state: ServerState, doc: DocumentState) -> None:
    _schedule(state, doc)


def _on_change(state: ServerState, doc: DocumentState) -> None:
    _debounce(state, doc, ANALYSIS_DEBOUNCE_S + DEBOUNCE_S_PER_100KB * len(doc.source_bytes) / 100_000)


def register(server: KernelLspServer) -> None:
    state = server.state
    state.on_open.append(_on_open)
    state.on_change.append(_on_change)
    state.line_hovers.append(line_hover)
    state.hover_sections.append(kernel_section)
    state.diagnostic_sources.append(access_diagnostics)
