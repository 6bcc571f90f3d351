"""Compiler diagnostics: nvcc on open and save (debounced), published as ``publishDiagnostics``.

The compile runs as a ``compile`` job (see :mod:`kernel_lsp.services.jobs`) on
the document's text at that moment; its result is attached to the document and
published only if the document is still at that version. Messages about the
document get its own ranges; a message about an included file is shown on the
``#include`` line that brings that file in (the document's first line when no
directive of the document names it), with the file named and its position as
related information, so it is not lost. Syntax errors
found by tree-sitter are added at hint severity (tree-sitter-cuda misreads some
macro-heavy code, so they must not look like compiler errors), except on a line
where nvcc reports an error itself: the compiler's message says it better.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from lsprotocol import types

from kernel_lsp.core.demangle import base_name
from kernel_lsp.core.nvcc_output import CompilerMessage, include_line
from kernel_lsp.server.base import KernelLspServer, ServerState
from kernel_lsp.server.convert import line_range, to_range
from kernel_lsp.server.documents import DocumentState
from kernel_lsp.server.machine import NVCC_MISSING_KEY
from kernel_lsp.services import toolchain
from kernel_lsp.services.jobs import JobKey

log = logging.getLogger(__name__)

SOURCE = "nvcc"

_SEVERITY = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "info": types.DiagnosticSeverity.Information,
}


def _same_file(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    return os.path.realpath(a) == os.path.realpath(b)


def _related(message: CompilerMessage) -> list[types.DiagnosticRelatedInformation] | None:
    """The message's own place in another file, for editors that link to it."""
    if message.path is None or message.line is None or not os.path.isabs(message.path):
        return None
    start = types.Position(line=max(message.line - 1, 0), character=0)
    location = types.Location(uri=Path(message.path).as_uri(), range=types.Range(start=start, end=start))
    return [types.DiagnosticRelatedInformation(location=location, message=message.message.splitlines()[0])]


def _message_range(doc: DocumentState, message: CompilerMessage) -> tuple[types.Range, str]:
    """Where a message goes in ``doc`` and its text (prefixed with its origin when it is not about ``doc``)."""
    if _same_file(message.path, doc.path) and message.line is not None:
        column = message.column - 1 if message.column is not None else None
        return line_range(doc.parsed, message.line - 1, column), message.message
    if message.path is None and message.mangled_name is not None:
        # ptxas names the entry function ("uses too much shared data"): point at the kernel.
        index = doc.cached("index")
        fn = index.function(base_name(message.mangled_name)) if index is not None else None
        if fn is not None:
            return to_range(doc.parsed, fn.name_span), f"{message.tool}: {message.message}"
    if message.path is not None:
        where = f"{message.path}:{message.line}" if message.line is not None else message.path
        included_at = include_line(doc.text(), message.path)
        return line_range(doc.parsed, included_at or 0), f"{where}: {message.message}"
    return line_range(doc.parsed, 0), f"{message.tool}: {message.message}"


def compiler_diagnostics(state: ServerState, doc: DocumentState) -> list[types.Diagnostic]:
    result = doc.compile
    if result is None:
        return []
    out: list[types.Diagnostic] = []
    for message in result.messages:
        rng, text = _message_range(doc, message)
        out.append(types.Diagnostic(
            range=rng,
            message=text,
            severity=_SEVERITY.get(message.severity, types.DiagnosticSeverity.Warning),
            source=SOURCE if message.tool in ("nvcc", "host") else message.tool,
            code=message.code,
            related_information=None if _same_file(message.path, doc.path) else _related(message),
        ))
    return out


def syntax_diagnostics(state: ServerState, doc: DocumentState) -> list[types.Diagnostic]:
    # Only from an index that already exists or is cheap: publishing runs on the event loop.
    index = doc.cached("index")
    if index is None and not doc.big and not doc.lock.locked():
        index = doc.index()
    if index is None:
        return []
    compile = doc.compile
    nvcc_lines = {
        message.line - 1
        for message in (compile.messages if compile is not None else ())
        if message.severity == "error" and message.line is not None and _same_file(message.path, doc.path)
    }
    return [
        types.Diagnostic(
            range=to_range(doc.parsed, error.span),
            message=error.message,
            severity=types.DiagnosticSeverity.Hint,
            source="kernel-lsp (tree-sitter)",
        )
        for error in index.syntax_errors[:50]
        if not nvcc_lines.intersection(range(error.span.start.line, error.span.end.line + 1))
    ]


def schedule_compile(state: ServerState, doc: DocumentState, *, delay_s: float | None = None) -> None:
    """Queue a compile of ``doc`` at its current version (a newer request replaces an older one); none for a
    document past the compile budget (its open said so)."""
    if doc.path is None:
        return
    if doc.budget.compile is not None:
        doc.compiled.set()  # nothing to wait for
        return
    settings = state.settings
    session = state.session()
    source = doc.source_bytes
    revision = doc.revision
    path = doc.path
    uri = doc.uri

    def work(ctx):
        return session.compile(source, path, cancel=ctx.cancel)

    def current_revision() -> int | None:
        current = state.documents.get(uri)
        return current.revision if current is not None else None

    def publish(result: toolchain.CompileResult) -> None:
        current = state.documents.get(uri)
        if current is None:
            return
        current.compile = result
        current.compile_version = current.version
        if not result.errors and not result.tool_missing and not result.timed_out and not result.cancelled:
            current.last_good_compile = result
        current.compiled.set()
        if result.tool_missing:
            state.show(f"kernel-lsp: {result.tool_missing}", types.MessageType.Warning, once_key=NVCC_MISSING_KEY)
        for problem in result.problems:
            state.show(f"kernel-lsp: {problem}", types.MessageType.Warning,
                       once_key=None if result.timed_out else f"compile:{problem}")
        state.publish_diagnostics(current)
        state.refresh_views()

    state.jobs.submit(
        JobKey(uri, "compile"),
        work,
        publish=publish,
        version=revision,
        current_version=current_revision,
        delay_s=settings.compile_debounce_ms / 1000.0 if delay_s is None else delay_s,
        title="nvcc",
        progress=state.progress_factory(),
    )


#: Longest a compile on open waits for the workspace settings, in seconds (a client that never
#: sends ``initialized`` still gets diagnostics).
SETTINGS_WAIT_S = 5.0


async def _compile_when_settings_loaded(state: ServerState, doc: DocumentState) -> None:
    try:
        await asyncio.wait_for(state.settings_loaded.wait(), SETTINGS_WAIT_S)
    except asyncio.TimeoutError:
        log.warning("no workspace settings after %.0f s; compiling with what is known", SETTINGS_WAIT_S)
    if state.documents.get(doc.uri) is doc:
        schedule_compile(state, doc, delay_s=0.0)


def _on_open(state: ServerState, doc: DocumentState) -> None:
    # Compiling before the workspace settings arrived would show errors the user's flags prevent.
    if state.settings_loaded.is_set():
        schedule_compile(state, doc, delay_s=0.0)
    else:
        task = asyncio.ensure_future(_compile_when_settings_loaded(state, doc))
        state.background_tasks.add(task)
        task.add_done_callback(state.background_tasks.discard)


def _on_save(state: ServerState, doc: DocumentState) -> None:
    schedule_compile(state, doc)


def _on_change(state: ServerState, doc: DocumentState) -> None:
    if state.settings.compile_on_change:
        schedule_compile(state, doc)


def _on_settings(state: ServerState) -> None:
    for doc in state.documents.all():
        schedule_compile(state, doc)


def register(server: KernelLspServer) -> None:
    state = server.state
    state.diagnostic_sources[:0] = [compiler_diagnostics, syntax_diagnostics]
    state.on_open.append(_on_open)
    state.on_save.append(_on_save)
    state.on_change.append(_on_change)
    state.on_settings.append(_on_settings)
