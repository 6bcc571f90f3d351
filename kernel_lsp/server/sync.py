"""Text synchronisation: open, incremental change, save, close.

Incremental changes arrive in UTF-16 positions; each is converted with the
*current* line's bytes (LSP applies a notification's changes in order) and fed
to :meth:`ParsedDocument.apply_edit` with ``defer=True``: the text changes at
once (microseconds), the reparse and the re-index wait for the next request.
A client that sends one notification per keystroke thus costs one reparse and
one re-index per *request*, however many keystrokes came before it, and a
hover never waits behind re-indexing for keystrokes it does not see.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from lsprotocol import types

from kernel_lsp.core.parse import ParsedDocument, binary_reason
from kernel_lsp.server.base import KernelLspServer, ServerState, guarded
from kernel_lsp.server.convert import line_bytes, utf16_to_byte
from kernel_lsp.server.documents import DocumentState

log = logging.getLogger(__name__)


def apply_changes(parsed: ParsedDocument, changes: Sequence[types.TextDocumentContentChangeEvent]) -> None:
    for change in changes:
        if isinstance(change, types.TextDocumentContentChangePartial):
            start, end = change.range.start, change.range.end
            parsed.apply_edit(
                start.line,
                utf16_to_byte(line_bytes(parsed, start.line), start.character),
                end.line,
                utf16_to_byte(line_bytes(parsed, end.line), end.character),
                change.text,
                defer=True,
            )
        else:
            parsed.replace_all(change.text, defer=True)


def tell_limits(state: ServerState, doc: DocumentState) -> None:
    """One message per document about the work left out for it: binary data, or past a budget
    (:mod:`kernel_lsp.core.budgets`): the user sees why hovers or diagnostics are missing."""
    name = doc.path or doc.uri
    limits = doc.budget
    binary = binary_reason(doc.source_bytes) if doc.parsed.is_binary else None
    reasons = list(dict.fromkeys(r for r in (binary, limits.index, limits.analysis, limits.compile) if r))
    if limits.index is not None and limits.analysis != limits.index:
        reasons.remove(limits.analysis)  # "in reduced mode: no analysis" only repeats the reduced mode
    if reasons:
        state.show(f"kernel-lsp: {name} " + "; ".join(reasons), types.MessageType.Info,
                   once_key=f"limits:{doc.uri}:{';'.join(reasons)}")


def unread_document(state: ServerState, method: str, uri: str, version: int | None, size_bytes: int) -> None:
    """A ``didOpen`` or ``didChange`` too large to read (:mod:`kernel_lsp.server.stdio` did not decode it):
    the document is kept as one whose text is unknown, and the user is told once."""
    if method == "textDocument/didSave":
        return  # the text a save carried is not needed: the document's own is used
    doc = state.documents.unread(uri, version, size_bytes)
    tell_limits(state, doc)
    state.server.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


def register(server: KernelLspServer) -> None:
    state = server.state
    state.on_unread_message = lambda *args: unread_document(state, *args)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    @guarded(state, what="didOpen")
    async def did_open(params: types.DidOpenTextDocumentParams) -> None:
        item = params.text_document
        doc = await state.documents.open(item.uri, item.text, item.version, item.language_id)
        tell_limits(state, doc)
        state.run_hooks(state.on_open, doc)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    @guarded(state, what="didChange")
    def did_change(params: types.DidChangeTextDocumentParams) -> None:
        # Synchronous (no task, no lock): pygls runs it as it reads the message, so edits apply in
        # the order sent, and a request that is waiting for an index never holds them up.
        doc = state.documents.get(params.text_document.uri)
        if doc is None:
            log.warning("didChange for a document that is not open: %s", params.text_document.uri)
            return
        if doc.unread_bytes is not None:
            return  # edits to a text that was never read cannot be applied

        def edit() -> None:
            apply_changes(doc.parsed, params.content_changes)
            doc.version = params.text_document.version
            doc.revision += 1
            state.run_hooks(state.on_change, doc)

        if doc.opening:
            doc.queued.append(edit)
        else:
            edit()

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    @guarded(state, what="didSave")
    def did_save(params: types.DidSaveTextDocumentParams) -> None:
        doc = state.documents.get(params.text_document.uri)
        if doc is not None:
            state.run_hooks(state.on_save, doc)

    @server.feature(types.SHUTDOWN)
    @guarded(state, what="shutdown")
    def shutdown(params: None) -> None:
        # Stop background work (and its child processes) before the client sends exit.
        state.jobs.shutdown()

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    @guarded(state, what="didClose")
    def did_close(params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        state.jobs.cancel_uri(uri)
        doc = state.documents.close(uri)
        if doc is not None:
            state.run_hooks(state.on_close, doc)
        server.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))
