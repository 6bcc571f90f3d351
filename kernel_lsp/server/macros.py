"""Macros in the editor: where the preprocessor's budget left code unexpanded, the file says so.

Every index is built with the document's macro view, so kernels that macros define or fill are
seen (see :mod:`kernel_lsp.server.documents` and :mod:`kernel_lsp.core.index`). A hostile or
runaway macro (``#define A40 A39 A39`` …) spends the preprocessor's budget instead of the
server's memory or time; what it left unexpanded is then read as written, and the user is told
by an Information diagnostic on the line where expansion stopped (``macro-budget``):

* the macro view over its budget (a directive such as ``#if A40``): no macro of the file is
  expanded, so symbols, hovers and lenses read every line as written;
* one unit's expansion over its budget: that unit is read as written.

A diagnostic, not ``window/logMessage``: it sits on the line that caused it, in the file's problem
list where the user looks, stays while the cause does and goes when it is fixed; a log line is
read by nobody, once.

After a settings change the macro view may differ (``-D``, ``-I`` flags), and after an edit of an
open header (opened, edited, closed), the view of every document that includes it: their indexes are built again.
"""

from __future__ import annotations

from lsprotocol import types

from kernel_lsp.core.parse import comment_ranges
from kernel_lsp.core.source import directive_line_numbers
from kernel_lsp.server.base import KernelLspServer, ServerState
from kernel_lsp.server.convert import line_range, to_range
from kernel_lsp.server.documents import DocumentState

SOURCE = "kernel-lsp (macros)"
CODE = "macro-budget"


def macro_diagnostics(state: ServerState, doc: DocumentState) -> list[types.Diagnostic]:
    """The budget notes of the document's current index (none while it is not built: publishing runs on
    the event loop and builds nothing)."""
    text = doc.last_indexed
    if text is None or text.source_bytes is not doc.source_bytes:
        return []
    out: list[types.Diagnostic] = []
    view = text.view
    if view is not None and view.over_budget is not None:
        line = 0
        at = view.over_budget_at
        if at is not None and at[0] == view.path:
            # The view's input is the file's directive lines: its line is the at[1]-th of them.
            numbers = directive_line_numbers(text.source_bytes, comment_ranges(text.source_bytes, text.tree))
            line = numbers[at[1]] if 0 <= at[1] < len(numbers) else 0
        out.append(_diagnostic(line_range(doc.parsed, line), f"{_why(view.over_budget)}: no macro of this file is "
                               "expanded (symbols, hovers and lenses read it as written)"))
    for note in text.index.notes:
        out.append(_diagnostic(to_range(doc.parsed, note.span), note.message))
    return out


def _why(message: str) -> str:
    """``file:line: why: the file is read unexpanded`` -> ``why``."""
    parts = message.split(": ")
    return parts[1] if len(parts) >= 3 else message


def _diagnostic(rng: types.Range, message: str) -> types.Diagnostic:
    return types.Diagnostic(range=rng, message=message, severity=types.DiagnosticSeverity.Information,
                            source=SOURCE, code=CODE)


def _on_settings(state: ServerState) -> None:
    for doc in state.documents.all():
        doc.refresh()


def _header_changed(state: ServerState, changed: DocumentState) -> None:
    # An open buffer wins over the disk: a header opened, edited or closed changes the macros of what
    # includes it.
    if changed.path is None:
        return
    for doc in state.documents.all():
        text = doc.last_indexed
        if doc is not changed and text is not None and text.view is not None and changed.path in text.view.includes:
            doc.refresh()


def register(server: KernelLspServer) -> None:
    state = server.state
    state.diagnostic_sources.append(macro_diagnostics)
    state.on_settings.append(_on_settings)
    state.on_open.append(_header_changed)
    state.on_change.append(_header_changed)
    state.on_close.append(_header_changed)
