"""One manager for every background job (compile now; profile and optimize later).

A job is identified by a :class:`JobKey` — ``(uri, kind)`` or ``(uri, kind, kernel)``.
The rules, the same for every kind of work:

* **Debounced.** A job waits ``delay_s`` seconds before its work starts; a newer
  submission with the same key during that wait replaces it, so a burst of
  saves or edits costs one run.
* **Newest wins.** Submitting a key that already has a job (waiting or running)
  sets the older job's :class:`threading.Event`; work passes that event on as
  ``cancel=`` to :func:`kernel_lsp.services.proc.run`, which kills the child's
  whole process group.
* **Stale results are dropped.** The job records the document version it was
  started for; its result reaches ``publish`` only when ``current_version()``
  still returns that version (checked on the thread where ``publish`` runs) and
  the job was not cancelled.
* **Progress** (optional): a ``progress`` factory gives a :class:`Progress`
  whose ``begin``/``end`` are called in ``try/finally`` around the work; the
  work may call :meth:`JobContext.report`. The server passes a factory only when
  the client supports ``window/workDoneProgress``.

The manager knows nothing of LSP: ``post`` decides on which thread results are
delivered (the server passes ``loop.call_soon_threadsafe``; tests and the CLI
may deliver inline).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class JobKey:
    uri: str
    kind: str
    """What the job does: ``compile``, ``profile``, ``optimize``, …"""
    kernel: str | None = None
    """For per-kernel jobs; None for whole-document jobs."""


class Progress(Protocol):
    """What a progress sink must offer (the server maps it to ``$/progress``)."""

    def begin(self, title: str, message: str | None = None) -> None: ...

    def report(self, message: str | None = None, percentage: int | None = None) -> None: ...

    def end(self, message: str | None = None) -> None: ...


@dataclass
class JobContext:
    """Handed to the work function: its cancel event and a progress reporter."""

    key: JobKey
    version: int | None
    cancel: threading.Event = field(default_factory=threading.Event)
    _progress: Progress | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def report(self, message: str | None = None, percentage: int | None = None) -> None:
        """Report progress; a no-op when the client gets no progress."""
        if self._progress is not None:
            self._progress.report(message, percentage)


@dataclass(frozen=True)
class JobOutcome(Generic[T]):
    """How a job ended, for logs and tests."""

    key: JobKey
    version: int | None
    state: str
    """``published``, ``stale`` (document changed), ``cancelled``, ``failed``."""
    result: T | None = None
    error: str | None = None


class JobManager:
    """Runs keyed, debounced, cancellable background jobs on a small thread pool."""

    def __init__(
        self,
        *,
        post: Callable[[Callable[[], None]], None] | None = None,
        max_workers: int = 4,
        on_error: Callable[[JobKey, BaseException], None] | None = None,
    ):
        """``post(fn)`` must run ``fn`` later on the thread that owns document state
        (default: call it at once on the worker). ``on_error`` hears about work
        that raised (default: log it)."""
        self._post = post or (lambda fn: fn())
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kernel-lsp-job")
        self._on_error = on_error
        self._lock = threading.Lock()
        self._active: dict[JobKey, JobContext] = {}
        self._closed = False

    def submit(
        self,
        key: JobKey,
        work: Callable[[JobContext], T],
        *,
        publish: Callable[[T], None],
        version: int | None = None,
        current_version: Callable[[], int | None] | None = None,
        delay_s: float = 0.0,
        title: str | None = None,
        progress: Callable[[], Progress] | None = None,
        on_done: Callable[[JobOutcome[T]], None] | None = None,
    ) -> Future[JobOutcome[T]]:
        """Start ``work(ctx)`` after ``delay_s`` unless a newer job with ``key`` arrives.

        ``publish(result)`` runs through ``post`` when the job finished, was not
        cancelled, and ``current_version()`` (when given) still equals ``version``.
        ``on_done`` (through ``post`` too) hears every outcome. The returned
        future resolves to the :class:`JobOutcome` once the worker is done
        (publication happens after that, on the posting thread).
        """
        ctx = JobContext(key=key, version=version)
        with self._lock:
            if self._closed:
                raise RuntimeError("job manager is shut down")
            older = self._active.get(key)
            if older is not None:
                older.cancel.set()
            self._active[key] = ctx
        return self._pool.submit(
            self._run, ctx, work, publish, current_version, delay_s, title, progress, on_done
        )

    def cancel(self, key: JobKey) -> bool:
        """Cancel the job with ``key``; True when there was one."""
        with self._lock:
            ctx = self._active.pop(key, None)
        if ctx is not None:
            ctx.cancel.set()
        return ctx is not None

    def cancel_uri(self, uri: str) -> int:
        """Cancel every job of one document (e.g. on ``didClose``); returns how many."""
        with self._lock:
            keys = [k for k in self._active if k.uri == uri]
            contexts = [self._active.pop(k) for k in keys]
        for ctx in contexts:
            ctx.cancel.set()
        return len(contexts)

    def active(self) -> tuple[JobKey, ...]:
        with self._lock:
            return tuple(self._active)

    def shutdown(self) -> None:
        """Cancel everything and stop accepting jobs (workers finish on their own)."""
        with self._lock:
            self._closed = True
            contexts = list(self._active.values())
            self._active.clear()
        for ctx in contexts:
            ctx.cancel.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(
        self,
        ctx: JobContext,
        work: Callable[[JobContext], Any],
        publish: Callable[[Any], None],
        current_version: Callable[[], int | None] | None,
        delay_s: float,
        title: str | None,
        progress: Callable[[], Progress] | None,
        on_done: Callable[[JobOutcome[Any]], None] | None,
    ) -> JobOutcome[Any]:
        # Debounce: waiting on the cancel event ends early when a newer job replaces this one.
        if delay_s > 0 and ctx.cancel.wait(delay_s):
            return self._finish(ctx, JobOutcome(ctx.key, ctx.version, "cancelled"), None, None, on_done)
        if ctx.cancelled:
            return self._finish(ctx, JobOutcome(ctx.key, ctx.version, "cancelled"), None, None, on_done)
        sink = progress() if progress is not None else None
        ctx._progress = sink
        try:
            if sink is not None:
                sink.begin(title or ctx.key.kind)
            result = work(ctx)
            outcome = JobOutcome(ctx.key, ctx.version, "cancelled" if ctx.cancelled else "published", result)
        except Exception as exc:  # a failing job must never take the server down
            log.exception("job %s failed", ctx.key)
            if self._on_error is not None:
                self._on_error(ctx.key, exc)
            outcome = JobOutcome(ctx.key, ctx.version, "failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            if sink is not None:
                sink.end("cancelled" if ctx.cancelled else None)
        return self._finish(ctx, outcome, publish, current_version, on_done)

    def _finish(
        self,
        ctx: JobContext,
        outcome: JobOutcome[Any],
        publish: Callable[[Any], None] | None,
        current_version: Callable[[], int | None] | None,
        on_done: Callable[[JobOutcome[Any]], None] | None,
    ) -> JobOutcome[Any]:
        with self._lock:
            if self._active.get(ctx.key) is ctx:
                del self._active[ctx.key]

        def deliver() -> None:
            final = outcome
            if final.state == "published" and ctx.cancelled:
                final = JobOutcome(ctx.key, ctx.version, "cancelled", final.result)
            if final.state == "published" and current_version is not None and current_version() != ctx.version:
                final = JobOutcome(ctx.key, ctx.version, "stale", final.result)
            if final.state == "published" and publish is not None:
                publish(final.result)
            if on_done is not None:
                on_done(final)
            log.debug("job %s version %s: %s", ctx.key, ctx.version, final.state)

        try:
            self._post(deliver)
        except RuntimeError:
            # The event loop is closed (server shutting down): nothing to deliver to.
            log.debug("job %s finished after shutdown", ctx.key)
        return outcome
