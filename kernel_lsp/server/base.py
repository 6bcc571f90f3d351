"""The server object, its shared state, the hook lists and the error guard.

Feature modules (``hover``, ``symbols``, …, and later ``profiling`` and
``code_actions``) receive a :class:`KernelLspServer` in ``register(server)`` and
reach everything through ``server.state`` (a :class:`ServerState`).

Hook lists live on the state (one set per server, so several servers in one
process do not share them); a module appends to them in ``register``:

* ``state.diagnostic_sources`` — ``fn(state, doc) -> list[Diagnostic]``; every
  publication for a document concatenates all sources, so a module adds its
  own diagnostics without replacing the compiler's.
* ``state.on_open``, ``on_change``, ``on_save``, ``on_close`` — ``fn(state, doc)``
  called on the event loop after the document state is updated (start jobs
  here; do not block).
* ``state.on_indexed`` — ``fn(state, doc, indexed)`` for every index built, on the
  thread that built it, before requests read it: per-index look-up tables.
* ``state.on_settings`` — ``fn(state)`` after the settings changed.
* ``state.on_initialized`` — ``fn(state)`` once, after ``initialized`` fetched the settings.
* ``state.on_machine`` — ``fn(state)`` once the machine (GPU, pycuda, ncu, nvcc) is known.
* ``state.hover_sections`` — ``fn(ctx: hover.HoverContext) -> str | None``: extra
  Markdown sections appended to a kernel or launch hover.
* ``state.lens_parts`` — ``fn(state, doc, function) -> str | None``: extra text
  appended to a kernel's code lens (e.g. a measured time).
* ``state.line_hovers`` — ``fn(state, doc, index, line) -> str | None``: a hover on a
  line that is not a kernel name or launch (e.g. a profiled line's counters).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import json
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO, TypeVar

from lsprotocol import types
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method

from kernel_lsp import __version__
from kernel_lsp.config import Settings
from kernel_lsp.core.source import Preprocessed
from kernel_lsp.server.documents import DocumentState, DocumentStore, IndexedText
from kernel_lsp.server.foreground import Foreground
from kernel_lsp.services.compile_db import CompileDb
from kernel_lsp.services.jobs import JobManager
from kernel_lsp.services.session import Session
from kernel_lsp.services.source_view import FileAnalysis, timed_budget

log = logging.getLogger(__name__)

#: Environment variable: when "1", handler errors are re-raised (tests see bugs).
RAISE_ENV = "KERNEL_LSP_RAISE"

DiagnosticSource = Callable[["ServerState", DocumentState], list[types.Diagnostic]]
DocumentHook = Callable[["ServerState", DocumentState], None]


F = TypeVar("F", bound=Callable[..., Any])


class ServerState:
    """Everything the feature modules share; lives as long as the server."""

    def __init__(self, server: KernelLspServer) -> None:
        self.server = server
        self.settings: Settings = Settings()
        """The resolved settings (defaults < user file < workspace < initializationOptions)."""
        self.foreground = Foreground()
        """Busy while the loop handles messages; background work gives way (:mod:`kernel_lsp.server.foreground`)."""
        self.documents = DocumentStore(prepare=self._prepare_index, give_way=self.foreground.give_way,
                                       macro_views=self._macro_view_for, may_expand=self.foreground.off_loop,
                                       expansion_budget=lambda: timed_budget(give_way=self.foreground.give_way),
                                       on_completed=self._index_completed)
        self.compile_db = CompileDb()
        self.jobs = JobManager(post=self.post, on_error=self._job_failed)
        """Background work: see :mod:`kernel_lsp.services.jobs`."""
        self.workspace_root: str | None = None
        self.background_tasks: set[asyncio.Task[Any]] = set()
        """Strong references to fire-and-forget tasks (asyncio keeps only weak ones)."""
        self.settings_loaded = asyncio.Event()
        """Set once ``initialized`` has fetched the workspace settings (compiles wait for it)."""
        self.init_options: dict[str, Any] = {}
        self.workspace_settings: dict[str, Any] | None = None
        self.supports_progress = False
        """The client accepts server-initiated ``window/workDoneProgress``."""
        self.supports_code_lens_refresh = False
        self.supports_inlay_hint_refresh = False
        self.supports_configuration = False
        self.supports_show_document = False
        """The client answers ``window/showDocument``."""
        self.supports_watched_files_registration = False
        """The client accepts a dynamic ``workspace/didChangeWatchedFiles`` registration."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.diagnostic_sources: list[DiagnosticSource] = []
        self.on_open: list[DocumentHook] = []
        self.on_change: list[DocumentHook] = []
        self.on_save: list[DocumentHook] = []
        self.on_close: list[DocumentHook] = []
        self.on_indexed: list[Callable[[ServerState, DocumentState, IndexedText], None]] = []
        """``fn(state, doc, indexed)`` for every index built, on the thread that built it (a worker thread
        for a big document) and before any request reads it: what requests look up in every index
        (tables, the macro view) is built there, off the event loop. Reads only; thread-safe."""
        self.on_settings: list[Callable[[ServerState], None]] = []
        self.on_initialized: list[Callable[[ServerState], None]] = []
        self.on_machine: list[Callable[[ServerState], None]] = []
        """``fn(state)`` on the event loop once :attr:`machine` is known (start what it can run)."""
        self.on_unread_message: Callable[[str, str, int | None, int], None] | None = None
        """``fn(method, uri, version, size_bytes)`` for a document notification too large to read
        (:data:`kernel_lsp.server.stdio.MAX_BODY_BYTES`), on the event loop."""
        self.machine: Any = None
        """The :class:`~kernel_lsp.services.machine.Machine` detected at start; None until known."""
        self.hover_sections: list[Callable[[Any], str | None]] = []
        self.line_hovers: list[Callable[[ServerState, DocumentState, Any, int], str | None]] = []
        """``fn(state, doc, index, line) -> str | None``: Markdown for a hover on a line that is
        not a kernel name or launch (0-based line); the first non-empty answer is shown."""
        self.lens_parts: list[Callable[[ServerState, DocumentState, Any], str | None]] = []
        self._shown_once: set[str] = set()
        self._progress_ids = itertools.count(1)

    def session(self) -> Session:
        """The services wired for the current settings and workspace: build flags, specs, verifier options,
        knowledge base and traces (:mod:`kernel_lsp.services.session`), the same for every feature."""
        buffers = {doc.path: doc.text() for doc in self.documents.all() if doc.path}
        return Session(self.settings, workspace_root=self.workspace_root, compile_db=self.compile_db, buffers=buffers,
                       give_way=self.foreground.give_way)

    def macro_view(self, doc: DocumentState, text: IndexedText) -> Preprocessed | None:
        """The macro view ``text``'s index was built with (:meth:`Session.macro_view`); None while unknown."""
        return text.view

    def _macro_view_for(self, doc: DocumentState, directives: tuple[str, ...], compute: bool) -> Preprocessed | None:
        """A document's macro view for its ``directives`` (:attr:`DocumentState.macro_views`): from the
        session's cache, or, where the preprocessor may run (``compute``), made."""
        return self.session().macro_view(doc.path, directives=directives, cached_only=not compute)

    def _index_completed(self, doc: DocumentState) -> None:
        # The units macros define or fill are known now: symbols, lenses and syntax errors may differ from
        # what was answered from the pending index. Before the first compile its publication says it all.
        if self.documents.get(doc.uri) is doc and doc.compiled.is_set():
            self.publish_diagnostics(doc)
            self.refresh_views()

    def file_analysis(self, doc: DocumentState) -> FileAnalysis | None:
        """The document's full preprocessed view and access analysis (:meth:`Session.analysis`), once per
        revision and settings; None for a document that is not a file."""
        if doc.path is None:
            return None
        path = doc.path
        return self._per_view(doc, "analysis", lambda: self.session().analysis(path, doc.text()))

    def _others_key(self, doc: DocumentState) -> int:
        """What a view of ``doc`` depends on besides its text: the settings, the root, the other open buffers."""
        others = tuple((d.uri, d.revision) for d in self.documents.all() if d is not doc)
        return hash((self.settings, self.workspace_root, others))

    def _per_view(self, doc: DocumentState, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per revision of ``doc`` and view key: a view also changes with the settings and
        with an open header's text (its buffer wins over the disk). Only the latest key is kept."""
        key = self._others_key(doc)
        kept: dict[int, Any] = doc.memo(name, dict)
        hit = kept.get(key)
        if hit is None:
            hit = compute()
            kept.clear()
            kept[key] = hit
        return hit

    def _prepare_index(self, doc: DocumentState, indexed: IndexedText) -> None:
        self.run_hooks(self.on_indexed, doc, indexed)

    def run_hooks(self, hooks: list[Callable[..., None]], *args: Any) -> None:
        """Call each hook; one that raises is logged (re-raised under tests) and the rest still run."""
        for hook in hooks:
            try:
                hook(self, *args)
            except Exception:
                if os.environ.get(RAISE_ENV) == "1":
                    raise
                log.exception("hook %s failed", getattr(hook, "__name__", hook))

    # --- threads -------------------------------------------------------
    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the event loop (safe from any thread)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            raise RuntimeError("no event loop")
        loop.call_soon_threadsafe(_guarded_call, fn)

    def _job_failed(self, key: Any, exc: BaseException) -> None:
        self.post(lambda: self.show(f"kernel-lsp: {key.kind} failed: {exc}", types.MessageType.Error))

    # --- messages to the user ------------------------------------------
    def was_shown(self, once_key: str) -> bool:
        return once_key in self._shown_once

    def mark_shown(self, once_key: str) -> None:
        """Count ``once_key``'s message as shown (another message said the same)."""
        self._shown_once.add(once_key)

    def show(self, message: str, kind: types.MessageType = types.MessageType.Warning, *, once_key: str | None = None) -> None:
        """``window/showMessage`` (at most once per ``once_key``), also logged."""
        if once_key is not None:
            if once_key in self._shown_once:
                return
            self._shown_once.add(once_key)
        level = {types.MessageType.Error: logging.ERROR, types.MessageType.Warning: logging.WARNING}.get(kind, logging.INFO)
        log.log(level, "%s", message)
        self.server.window_show_message(types.ShowMessageParams(type=kind, message=message))

    # --- diagnostics ---------------------------------------------------
    def publish_diagnostics(self, doc: DocumentState) -> None:
        """Send the union of every diagnostic source for ``doc`` (event loop only), at most
        :data:`MAX_PUBLISHED_DIAGNOSTICS` of them and a count of the rest: a publication's cost on the loop
        (and the client's redraw) stays bounded whatever the sources found (20,000 took 2 s)."""
        diagnostics: list[types.Diagnostic] = []
        for source in self.diagnostic_sources:
            try:
                diagnostics.extend(source(self, doc))
            except Exception:
                if os.environ.get(RAISE_ENV) == "1":
                    raise
                log.exception("diagnostic source %s failed", getattr(source, "__name__", source))
            if len(diagnostics) > MAX_PUBLISHED_DIAGNOSTICS:
                left = len(diagnostics) - MAX_PUBLISHED_DIAGNOSTICS
                del diagnostics[MAX_PUBLISHED_DIAGNOSTICS:]
                diagnostics.append(types.Diagnostic(
                    range=types.Range(start=types.Position(line=0, character=0), end=types.Position(line=0, character=0)),
                    message=f"kernel-lsp: {left} or more further diagnostics are not shown (at most "
                            f"{MAX_PUBLISHED_DIAGNOSTICS} per file)",
                    severity=types.DiagnosticSeverity.Information, source="kernel-lsp", code="more-diagnostics"))
                break
        self.server.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=doc.uri, diagnostics=diagnostics, version=doc.version)
        )

    def refresh_views(self) -> None:
        """Ask the client to re-request code lenses and inlay hints (results changed)."""
        if self.supports_code_lens_refresh:
            self.server.workspace_code_lens_refresh(None)
        if self.supports_inlay_hint_refresh:
            self.server.workspace_inlay_hint_refresh(None)

    # --- progress ------------------------------------------------------
    def progress_factory(self) -> Callable[[], LspProgress] | None:
        """For :meth:`JobManager.submit`: None when the client has no progress support."""
        if not self.supports_progress:
            return None
        return lambda: LspProgress(self, f"kernel-lsp-{next(self._progress_ids)}")


class LspProgress:
    """A :class:`kernel_lsp.services.jobs.Progress` that sends ``$/progress``.

    Called from worker threads; every step is chained on the event loop so that
    ``begin`` is sent only after the client acknowledged the token, and
    ``report``/``end`` after ``begin``.
    """

    def __init__(self, state: ServerState, token: str) -> None:
        self._state = state
        self._token = token
        self._last: asyncio.Future[Any] | None = None

    def _chain(self, step: Callable[[], Awaitable[Any] | None]) -> None:
        def schedule() -> None:
            previous = self._last

            async def run() -> None:
                if previous is not None:
                    await asyncio.gather(previous, return_exceptions=True)
                result = step()
                if result is not None:
                    await result

            self._last = asyncio.ensure_future(run())

        try:
            self._state.post(schedule)
        except RuntimeError:
            log.debug("progress %s dropped: loop closed", self._token)

    def begin(self, title: str, message: str | None = None) -> None:
        server = self._state.server

        async def create_and_begin() -> None:
            try:
                await server.work_done_progress.create_async(self._token)
            except Exception as exc:  # the client refused the token: no progress, work goes on
                log.info("work done progress refused: %s", exc)
            server.work_done_progress.begin(
                self._token, types.WorkDoneProgressBegin(title=title, message=message, cancellable=False)
            )

        self._chain(create_and_begin)

    def report(self, message: str | None = None, percentage: int | None = None) -> None:
        progress = self._state.server.work_done_progress
        self._chain(lambda: progress.report(self._token, types.WorkDoneProgressReport(message=message, percentage=percentage)))

    def end(self, message: str | None = None) -> None:
        progress = self._state.server.work_done_progress
        self._chain(lambda: progress.end(self._token, types.WorkDoneProgressEnd(message=message)))


def _guarded_call(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:
        if os.environ.get(RAISE_ENV) == "1":
            raise
        log.exception("callback on the event loop failed")


class RawJson:
    """A handler result that is already JSON text (sent as is, not converted again).

    Big answers that are cached per document version (the symbol outline of a
    10,000-line file is ~300 KB) would otherwise be converted by cattrs and
    encoded again on every request.
    """

    __slots__ = ("text",)

    def __init__(self, value: Any) -> None:
        self.text = json.dumps(value, separators=(",", ":"))


class _SnapshotDict(dict):
    """A dict whose ``items()`` is a list: safe to walk while entries are removed."""

    def items(self):  # type: ignore[override]
        return list(super().items())


class KernelLspProtocol(LanguageServerProtocol):
    """pygls's protocol plus :class:`RawJson` results and a bounded futures table.

    Relies on pygls 2's ``_send_response``/``_result_types``/``writer``/``_execute_handler``/
    ``_request_futures`` (pinned to pygls < 3 in pyproject.toml); any other result takes
    pygls's own path.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Entries leave the table when their handler finishes (below); a future cancelled while pygls
        # walks the table (shutdown cancels every running one) finishes inside that walk, so the walk
        # must go over a copy.
        self._request_futures = _SnapshotDict(self._request_futures)

    def _execute_handler(self, msg_id: Any, handler: Any, callback: Any, args: Any = None, kwargs: Any = None) -> None:
        # pygls 2.1.1 stores the future of every async (and threaded) handler in
        # ``_request_futures`` under its message id, so that ``$/cancelRequest`` can find it; a
        # request's entry is removed when its response is sent, but a notification's (a fresh
        # uuid per didChange) never is: about 2.7 KB per notification, 54 MB over 20,000 edits.
        # Removing the entry when the handler finishes keeps the table to what is still running.
        def done(future: Any) -> None:
            if self._request_futures.get(msg_id) is future:
                del self._request_futures[msg_id]
            callback(future)

        super()._execute_handler(msg_id, handler, done, args, kwargs)

    def structure_message(self, data: dict[str, Any]) -> Any:
        # A reply to one of our requests (showDocument, configuration, progress) that does not have the
        # result's shape raised here and was dropped by pygls: the request's future never completed and
        # the handler awaiting it (an executeCommand) never answered. It becomes an error response to
        # that request, so the awaiting code gets an exception it handles.
        try:
            return super().structure_message(data)
        except Exception as exc:
            if not (isinstance(data, dict) and "id" in data and "method" not in data and "error" not in data):
                raise
            log.warning("the client's reply to request %r is malformed (%s): %.200r", data.get("id"),
                        type(exc.__cause__ or exc).__name__, data.get("result"))
            return types.ResponseErrorMessage(id=data["id"], error=types.ResponseError(
                code=types.ErrorCodes.InvalidParams, message="malformed reply: the result does not have the expected shape"))

    def _handle_cancel_notification(self, msg_id: Any) -> None:
        # A cancel for a request already answered is normal (the client sent it before it read the
        # answer); pygls logs each as a warning. A running request's future is cancelled by pygls:
        # an async handler gets CancelledError at its next await and the client a RequestCancelled.
        if msg_id not in self._request_futures:
            log.debug("$/cancelRequest for %r: already answered", msg_id)
            return
        super()._handle_cancel_notification(msg_id)

    def _send_response(self, msg_id: Any, result: Any = None, error: Any = None) -> None:
        if error is not None or not isinstance(result, RawJson) or self.writer is None:
            super()._send_response(msg_id, result, error)
            return
        self._result_types.pop(msg_id, None)
        body = '{"jsonrpc":"2.0","id":%s,"result":%s}' % (json.dumps(msg_id), result.text)
        data = body.encode("utf-8")
        if self._include_headers:
            data = b"Content-Length: %d\r\nContent-Type: %s; charset=%s\r\n\r\n" % (
                len(data), self.CONTENT_TYPE.encode(), self.CHARSET.encode()) + data
        try:
            written = self.writer.write(data)
            if inspect.isawaitable(written):
                asyncio.ensure_future(written)
        except BrokenPipeError:
            log.error("cannot send the response: the client closed the connection")


    # --- document sync without pygls's workspace copy ------------------
    # pygls keeps its own copy of every open document and applies each change to it before our
    # handler runs: ~5 ms a keystroke on a 10,000-line file, for a copy nothing here reads
    # (documents live in DocumentStore). These replace its built-in handlers and only pass the
    # notification on.

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams) -> Any:
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_OPEN)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams) -> Any:
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams) -> Any:
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CLOSE)) is not None:
            yield handler, (params,), None


#: The interpreter's thread switch interval while serving, seconds (see :meth:`KernelLspServer.start_io`).
SWITCH_INTERVAL_S = 0.001
#: Diagnostics sent in one publication for one document (nvcc's are cut at 500 before this).
MAX_PUBLISHED_DIAGNOSTICS = 1000


class KernelLspServer(LanguageServer):
    state: ServerState

    def __init__(self) -> None:
        super().__init__(
            "kernel-lsp",
            __version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            protocol_cls=KernelLspProtocol,
        )
        self.state = ServerState(self)

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """pygls's stdio server with the message loop of :mod:`kernel_lsp.server.stdio` (large reads,
        runs of ``didChange`` applied as one; pygls's own loop costs three thread hops per message)."""
        from kernel_lsp.server.stdio import serve

        self._stop_event = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        # A worker thread re-indexing a big document holds the GIL until it is asked to let go, which
        # Python does after the switch interval (5 ms): a request on the event loop would wait that
        # long at every hand-over (reading it, answering, writing). 1 ms keeps a hover's wait short
        # for a little more switching.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        try:
            asyncio.run(serve(stdin or sys.stdin.buffer, self.protocol, self._stop_event, self.report_server_error,
                              self.state.foreground, self.state.on_unread_message))
        except BrokenPipeError:
            log.error("connection to the client lost: shutting down")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.shutdown()


def guarded(state: ServerState, empty: Any = None, what: str = "request") -> Callable[[F], F]:
    """Decorator for handlers: log a traceback, tell the user, answer ``empty``.

    With ``KERNEL_LSP_RAISE=1`` (tests) the exception propagates instead, so a
    bug fails the test rather than hiding behind an empty answer.
    """

    def wrap(fn: F) -> F:
        def handle(exc: Exception) -> Any:
            if os.environ.get(RAISE_ENV) == "1":
                raise exc
            log.exception("%s %s failed", what, fn.__name__)
            state.show(f"kernel-lsp: {what} failed ({type(exc).__name__}: {exc}); see the server log.",
                            types.MessageType.Error, once_key=f"{fn.__name__}:{type(exc).__name__}")
            return empty() if callable(empty) else empty

        if asyncio.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except Exception as exc:
                    return handle(exc)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                return handle(exc)

        return wrapper  # type: ignore[return-value]

    return wrap
