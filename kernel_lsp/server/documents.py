"""Per-document state: source, version, parse tree, cached index, last compile.

Ownership: a :class:`DocumentState` is mutated only on the event loop, under
its ``lock`` (an :class:`asyncio.Lock`, taken in message order, so edits apply in
the order the client sent them). Work that runs on other threads (the index
builder, the compiler) reads immutable snapshots: ``source_bytes`` is a
``bytes`` object that edits replace rather than change.

Everything derived from the text is cached per text revision (bumped on every
change, whatever version number the client sends) through :meth:`memo`, so a
second ``documentSymbol`` or a hover at the same revision costs a dict look-up.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pygls.uris import to_fs_path

from kernel_lsp.core.index import IncrementalIndexer, KernelIndex, build_index
from kernel_lsp.core.parse import ParsedDocument

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Source size above which parsing and indexing run on a worker thread, in bytes.
#: Below it, the thread hop costs more than the work.
OFFLOAD_BYTES = 256 * 1024
#: Source size above which a document gets the reduced mode: compiler diagnostics only, no kernel index
#: (a 6.7 MB file of 60,000 kernels takes 7.6 s and 730 MB to index), so no hovers, symbols or profiles.
REDUCED_BYTES = 5 * 1024 * 1024


@dataclass
class DocumentState:
    uri: str
    version: int | None
    parsed: ParsedDocument
    path: str | None
    """Filesystem path of the document (None for non-file URIs)."""
    language_id: str = "cuda"
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    compile: Any = None
    """The last published :class:`~kernel_lsp.services.toolchain.CompileResult`, or None."""
    compile_version: int | None = None
    """The document version ``compile`` was made from."""
    indexer: IncrementalIndexer = field(default_factory=IncrementalIndexer)
    """Reuses the analysis of functions an edit did not touch."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free slot for feature modules (profiling results, …), keyed by module name."""
    revision: int = 0
    """Bumped by every change of the text, whatever version the client sends: caches and jobs key on it."""
    _memo: dict[str, tuple[int, Any]] = field(default_factory=dict)
    _memo_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def source_bytes(self) -> bytes:
        return self.parsed.source_bytes

    @property
    def big(self) -> bool:
        return len(self.parsed.source_bytes) > OFFLOAD_BYTES

    @property
    def reduced(self) -> bool:
        return len(self.parsed.source_bytes) > REDUCED_BYTES

    def text(self) -> str:
        return self.memo("text", lambda: self.parsed.text)

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()`` once per text revision under ``key``."""
        revision = self.revision
        hit = self._memo.get(key)
        if hit is not None and hit[0] == revision:
            return hit[1]
        value = compute()
        with self._memo_lock:
            self._memo[key] = (revision, value)
        return value

    def cached(self, key: str) -> Any | None:
        """The memoised value for the current revision, or None."""
        hit = self._memo.get(key)
        return hit[1] if hit is not None and hit[0] == self.revision else None

    def index(self) -> KernelIndex:
        """The kernel index of the current revision (built at most once per revision)."""
        return self.memo("index", self._build_index)

    def _build_index(self) -> KernelIndex:
        if self.reduced:
            return build_index(b"")
        index = self.indexer.index(self.parsed)
        freeze_long_lived()
        return index

    async def off_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` inline for a small document, on a worker thread for a big one."""
        if not self.big:
            return fn()
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    async def index_async(self) -> KernelIndex:
        """The index, built on a worker thread when the document is big."""
        hit = self.cached("index")
        if hit is not None:
            return hit
        if not self.big:
            return self.index()
        return await asyncio.get_running_loop().run_in_executor(None, self.index)


def freeze_long_lived() -> None:
    """Move what exists now (parse trees, indexes, caches) out of the cyclic GC's sight.

    A 10,000-line file's analysis is ~40k GC-tracked objects; each full collection
    would rescan them all, and those pauses were the p99 of hover and
    documentSymbol (measured again after the index became lazy: without the
    freeze, the p99 of an edit followed by documentSymbol is ~3x higher). The
    objects hold no reference cycles, so reference counting still frees them
    when a newer revision replaces them. The young generations are collected
    first so that little cyclic garbage gets frozen; closing a document
    unfreezes (see :meth:`DocumentStore.close`) so any that did is collected
    eventually.
    """
    gc.collect(1)
    gc.freeze()


def uri_to_path(uri: str) -> str | None:
    try:
        return to_fs_path(uri)
    except Exception:  # pygls raises on malformed URIs; such documents just get no compile
        return None


class DocumentStore:
    """Open documents by URI."""

    def __init__(self) -> None:
        self._docs: dict[str, DocumentState] = {}

    def get(self, uri: str) -> DocumentState | None:
        return self._docs.get(uri)

    def all(self) -> tuple[DocumentState, ...]:
        return tuple(self._docs.values())

    async def open(self, uri: str, text: str, version: int | None, language_id: str = "cuda") -> DocumentState:
        existing = self._docs.get(uri)
        placeholder = existing or DocumentState(uri, version, ParsedDocument(b""), uri_to_path(uri), language_id)
        self._docs[uri] = placeholder
        async with placeholder.lock:
            if len(text) > OFFLOAD_BYTES:
                parsed = await asyncio.get_running_loop().run_in_executor(None, ParsedDocument, text)
            else:
                parsed = ParsedDocument(text)
            placeholder.parsed = parsed
            placeholder.indexer = IncrementalIndexer()
            placeholder.revision += 1
            placeholder.version = version
            placeholder.language_id = language_id
        return placeholder

    def close(self, uri: str) -> DocumentState | None:
        gc.unfreeze()
        return self._docs.pop(uri, None)
