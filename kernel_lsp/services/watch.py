"""Watch a folder for CUDA files changed outside the editor (watchdog).

:class:`SourceWatcher` calls ``on_change(path)`` from watchdog's thread for every
created, modified or moved-to ``.cu``/``.cuh``/``.cuda`` file under the root
(build folders and hidden folders skipped). Debouncing is the job manager's
work: the server submits a keyed, delayed profile job per change, and a burst of
events for one file collapses into one run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

SOURCE_SUFFIXES = (".cu", ".cuh", ".cuda")
_SKIP_PARTS = frozenset({"build", "node_modules", "__pycache__", ".git", ".kernel-lsp", ".venv"})


def is_watched(path: str) -> bool:
    if not path.endswith(SOURCE_SUFFIXES):
        return False
    parts = os.path.normpath(path).split(os.sep)
    return not any(p in _SKIP_PARTS or (p.startswith(".") and p not in (".", "..")) for p in parts[:-1])


class SourceWatcher:
    """A running watchdog observer; ``stop()`` ends it. ``start`` returns None when watchdog is missing."""

    def __init__(self, observer) -> None:
        self._observer = observer

    @classmethod
    def start(cls, root: str, on_change: Callable[[str], None]) -> SourceWatcher | None:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            log.warning("watchdog is not installed: files changed outside the editor are not re-profiled")
            return None

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:
                if event.is_directory or event.event_type not in ("created", "modified", "moved", "closed"):
                    return
                path = getattr(event, "dest_path", "") or event.src_path
                if isinstance(path, bytes):
                    path = os.fsdecode(path)
                if is_watched(path):
                    try:
                        on_change(os.path.abspath(path))
                    except Exception:  # a failing callback must not kill the observer thread
                        log.exception("watch callback failed for %s", path)

        observer = Observer()
        observer.daemon = True
        observer.schedule(Handler(), root, recursive=True)
        observer.start()
        return cls(observer)

    def stop(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=2.0)
