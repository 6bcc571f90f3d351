"""Per-document state: source, version, parse tree, cached index, last compile.

Ownership: a :class:`DocumentState` is mutated only on the event loop, under
its ``lock`` (an :class:`asyncio.Lock`, taken in message order, so edits apply in
the order the client sent them). Work that runs on other threads (the index
builder, the compiler) reads immutable snapshots: ``source_bytes`` is a
``bytes`` object that edits replace rather than change.

Everything derived from the text is cached per text revision (bumped on every
change, whatever version number the client sends) through :meth:`memo`, so a
second ``documentSymbol`` or a hover at the same revision costs a dict look-up.

Edits are applied on the event loop without the lock (they only splice bytes;
see :mod:`kernel_lsp.server.sync`); the reparse and the re-index run when a
request needs them, once for however many edits came before. Every index built
is kept with the exact text it was built from (:class:`IndexedText`), so a
request may answer from an index a few keystrokes old where the edits since
cannot have changed the answer (:meth:`DocumentState.unchanged_before`).

Macros: every index is built with the text's macro view (:attr:`DocumentState.macro_views`), so
units that macros define or fill are read from their expansion (:mod:`kernel_lsp.core.index`'s
macro pass). The preprocessor never runs on the event loop: an index built there whose view or
expansions are not known yet is *pending* (those units as written, their syntax errors held back),
and is completed at once on a worker thread; requests that await the index wait for that, and the
server is told when it is done (:attr:`DocumentState.on_completed`) to publish and refresh again.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import itertools
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pygls.uris import to_fs_path
from tree_sitter import Tree

from kernel_lsp.core.budgets import REDUCED_BYTES, WorkBudget, budget
from kernel_lsp.core.index import IncrementalIndexer, KernelIndex, build_index
from kernel_lsp.core.parse import ParsedDocument, comment_ranges, common_prefix
from kernel_lsp.core.source import Budget, Preprocessed, directive_lines, same_directives

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Source size above which parsing and indexing run on a worker thread, in bytes. Below it, the thread
#: hop costs more than the work; above it, the work could hold the event loop: one 66 KB line of
#: error-heavy declarations took tree-sitter 73 ms to parse.
OFFLOAD_BYTES = 32 * 1024


class IndexedText:
    """An index with the exact text it was built from: positions convert against that text.

    Offers what :mod:`kernel_lsp.server.convert` reads of a document (``source_bytes``,
    ``line_count``, ``line_start``) so an answer from an older index converts its own positions.
    """

    __slots__ = ("source_bytes", "index", "tree", "view", "epoch", "_line_starts", "_derived", "_directives",
                 "__weakref__")

    def __init__(self, source: bytes, index: KernelIndex, tree: Tree | None = None,
                 directives: tuple[str, ...] | None = None, view: Preprocessed | None = None, epoch: int = 0) -> None:
        self.source_bytes = source
        self.index = index
        self.tree = tree
        """The tree ``index`` was built from (for what the index does not record: the token at the cursor)."""
        self.view = view
        """The macro view the index was built with (its macro table: launch sizes read it); None: none known."""
        self.epoch = epoch
        """The document's :attr:`DocumentState.epoch` when it was built."""
        self._line_starts: list[int] | None = None
        self._derived: dict[str, Any] = {}
        self._directives = directives

    @property
    def pending(self) -> bool:
        """The index waits for its macro view or expansions (see the module docstring)."""
        return self.index.pending

    def directives(self) -> tuple[str, ...]:
        """The text's directive lines (:func:`~kernel_lsp.core.source.directive_lines`), found once."""
        if self._directives is None:
            self._directives = directive_lines(self.source_bytes, comment_ranges(self.source_bytes, self.tree))
        return self._directives

    def directives_if_known(self) -> tuple[str, ...] | None:
        return self._directives

    def line_starts(self) -> list[int]:
        if self._line_starts is None:
            lengths = [len(line) + 1 for line in self.source_bytes.split(b"\n")]
            self._line_starts = [0, *itertools.accumulate(lengths[:-1])]
        return self._line_starts

    def line_count(self) -> int:
        return len(self.line_starts())

    def line_start(self, line: int) -> int:
        return self.line_starts()[line]

    def byte_offset(self, line: int, column_byte: int) -> int:
        """Byte offset of (line, byte column), clamped as :meth:`ParsedDocument.byte_offset` does."""
        starts = self.line_starts()
        if line < 0:
            return 0
        if line >= len(starts):
            return len(self.source_bytes)
        end = starts[line + 1] - 1 if line + 1 < len(starts) else len(self.source_bytes)
        return min(starts[line] + max(column_byte, 0), end)

    def point_of(self, byte_offset: int) -> tuple[int, int]:
        starts = self.line_starts()
        line = bisect.bisect_right(starts, byte_offset) - 1
        return line, byte_offset - starts[line]

    def derived(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()`` once for this index (look-up tables built from it)."""
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]


def _no_pause() -> None:
    pass


def _always() -> bool:
    return True


MacroViews = Callable[["DocumentState", tuple[str, ...], bool], "Preprocessed | None"]
"""``fn(doc, directive lines, may_compute) -> view``: the document's macro view for those directives;
None when ``may_compute`` is False and it is not known yet (or when there is none)."""


class _Snapshot:
    """One (text, tree) pair in the shape :meth:`IncrementalIndexer.index` reads."""

    __slots__ = ("_pair", "is_binary")

    def __init__(self, pair: tuple[bytes, Tree], is_binary: bool) -> None:
        self._pair = pair
        self.is_binary = is_binary

    def snapshot(self) -> tuple[bytes, Tree]:
        return self._pair


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
    last_good_compile: Any = None
    """The last compile without errors: its ptxas report stands in, marked stale, while compiles fail."""
    compiled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a compile of this document was published (views asked before then wait for it)."""
    indexer: IncrementalIndexer = field(default_factory=IncrementalIndexer)
    """Reuses the analysis of functions an edit did not touch."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free slot for feature modules (profiling results, …), keyed by module name."""
    revision: int = 0
    """Bumped by every change of the text, whatever version the client sends: caches and jobs key on it."""
    _memo: dict[str, tuple[int, Any]] = field(default_factory=dict)
    _memo_lock: threading.Lock = field(default_factory=threading.Lock)
    _index_lock: threading.Lock = field(default_factory=threading.Lock)
    """Serialises index builds (the indexer's cache is not shared between threads)."""
    last_indexed: IndexedText | None = None
    """The newest index built and its text (may be older than the document)."""
    opening: bool = False
    """``didOpen`` is still parsing the text (off the loop, for a big one): edits wait in ``queued``."""
    queued: list[Callable[[], None]] = field(default_factory=list)
    """Edits that arrived while opening, applied in order once the text is in place."""
    prepare: Callable[[DocumentState, IndexedText], None] | None = None
    """Called with every index built, on the thread that built it (a worker thread for a big document),
    before any request reads it: requests' look-up tables are built there, not on the event loop."""
    give_way: Callable[[], None] = _no_pause
    """A yield point for long work on this document off the event loop (the outline's encoding; its
    reparses and index builds have it too): pauses while the loop handles messages
    (:mod:`kernel_lsp.server.foreground`)."""
    macro_views: MacroViews | None = None
    """Where index builds get the text's macro view; None: no macros are expanded."""
    may_expand: Callable[[], bool] = _always
    """Whether the preprocessor may run on the calling thread (the server: not on the event loop)."""
    expansion_budget: Callable[[], Budget | None] = lambda: None
    """The budget of one index build's unit expansions (made when the build starts: it holds a deadline)."""
    on_completed: Callable[[DocumentState], None] | None = None
    """Called on the event loop when a pending index of the current revision was completed."""
    epoch: int = 0
    """Bumped when what the macro view depends on besides the text changed (settings): indexes rebuild."""
    _completion: tuple[tuple[int, int], asyncio.Future[Any]] | None = None
    """The running completion of a pending index: ((revision, epoch), its future)."""
    units: int | None = None
    """Top-level declarations of the last parse (what indexing works through); None before one."""
    unread_bytes: int | None = None
    """The size of a text the server did not read (its message was over
    :data:`~kernel_lsp.core.budgets.MAX_COMPILE_BYTES`): the text is unknown, edits to it are ignored, and
    nothing runs for it; None for a document read as usual."""

    @property
    def source_bytes(self) -> bytes:
        return self.parsed.source_bytes

    @property
    def big(self) -> bool:
        return len(self.parsed.source_bytes) > OFFLOAD_BYTES

    @property
    def budget(self) -> WorkBudget:
        """What is done for this document and what is left out (:mod:`kernel_lsp.core.budgets`)."""
        size = self.unread_bytes if self.unread_bytes is not None else len(self.parsed.source_bytes)
        return budget(size, self.units)

    @property
    def reduced(self) -> bool:
        return self.budget.reduced

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
        """The kernel index of the current revision (built at most once per revision). A pending one is
        completed at once: here off the event loop, on a worker thread from it (:meth:`complete_soon`)."""
        index = self.memo("index", self._build_index)
        if index.pending:
            if not self.may_expand():
                self.complete_soon()
            elif self._complete((self.revision, self.epoch)):
                # Off the event loop: completed here and now.
                index = self.memo("index", self._build_index)
        return index

    def indexed(self) -> IndexedText:
        """The current revision's index with its text."""
        self.index()
        last = self.last_indexed
        assert last is not None
        return last

    def refresh(self) -> None:
        """Build the index again at the next request, the text unchanged (the settings, so the macro view, changed)."""
        self.epoch += 1
        with self._memo_lock:
            self._memo.clear()

    def _build_index(self) -> KernelIndex:
        with self._index_lock:
            # One reparse for every edit deferred so far; edits arriving meanwhile wait for the next.
            pair = self.parsed.snapshot()
            last = self.last_indexed
            may_expand = self.may_expand()
            if (last is not None and last.source_bytes is pair[0] and last.epoch == self.epoch
                    and not (last.pending and may_expand)):
                return last.index
            self.units = pair[1].root_node.child_count
            # Edits that touched no directive keep the last text's directive lines (and so its macro view):
            # no O(file) scan for comments and directives per keystroke.
            known = last.directives_if_known() if last is not None else None
            if known is not None and not same_directives(last.source_bytes, pair[0]):
                known = None
            view = None
            if self.reduced:
                # Reduced mode (a file over the size or declaration budget): compiler diagnostics only, an empty index.
                index = build_index(b"")
            else:
                if known is None:
                    known = directive_lines(pair[0], comment_ranges(pair[0], pair[1]))
                view = self.macro_views(self, known, may_expand) if self.macro_views is not None else None
                index = self.indexer.index(_Snapshot(pair, self.parsed.is_binary), view, may_expand=may_expand,
                                           budget=self.expansion_budget(),
                                           macros_pending=view is None and self.macro_views is not None and not may_expand)
            indexed = IndexedText(pair[0], index, pair[1], known, view, self.epoch)
            # Its line table now, where the build runs (a worker thread for a big document): the first
            # hover or outline of this index converts positions with it.
            indexed.line_starts()
            if self.prepare is not None:
                self.prepare(self, indexed)
            self.last_indexed = indexed
        freeze_long_lived()
        return index

    def complete_soon(self) -> asyncio.Future[Any] | None:
        """Complete the current revision's pending index on a worker thread (one run at a time); the future
        of that work, or None when there is no event loop to run it from."""
        key = (self.revision, self.epoch)
        running = self._completion
        if running is not None and running[0] == key and not running[1].done():
            return running[1]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a worker thread: its own build expands, nothing is pending there
            return None
        future = loop.run_in_executor(None, self._complete, key)
        self._completion = (key, future)

        def done(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and f.exception() is None and f.result() and self.on_completed is not None:
                self.on_completed(self)

        future.add_done_callback(done)
        return future

    def _complete(self, key: tuple[int, int]) -> bool:
        """The pending index of ``key`` (revision, epoch) built again with its macro view and expansions;
        True when it became the revision's index."""
        if (self.revision, self.epoch) != key:
            return False
        last = self.last_indexed
        if last is not None and self.macro_views is not None:
            # The macro view first, outside the index lock: a build the loop needs meanwhile (the next
            # keystroke's) does not wait for this preprocessor run.
            self.macro_views(self, last.directives(), True)
        index = self._build_index()
        with self._memo_lock:
            if (self.revision, self.epoch) != key:
                return False
            # What was derived from the pending index (the outline, tables) is derived again.
            self._memo = {"index": (key[0], index)}
        return True

    def resources_compile(self) -> tuple[Any, bool]:
        """(the compile whose ptxas report describes the kernels, True when that is the last good one
        standing in for a failed compile)."""
        current = self.compile
        if current is not None and current.errors and self.last_good_compile is not None:
            return self.last_good_compile, True
        return current, False

    @property
    def edited_since_compile(self) -> bool:
        return self.compile is not None and self.compile_version != self.version

    def unchanged_before(self, indexed: IndexedText) -> int:
        """How many leading bytes the current text shares with ``indexed``'s (answers about
        them are the same in both); computed once per revision."""
        if indexed.source_bytes is self.source_bytes:
            return len(self.source_bytes)
        return self._compared("unchanged-before", indexed,
                              lambda: common_prefix(indexed.source_bytes, self.source_bytes))

    def same_directives_as(self, indexed: IndexedText) -> bool:
        """The current text has ``indexed``'s directive lines (so its macro table); computed once per revision."""
        if indexed.source_bytes is self.source_bytes:
            return True
        prefix = self.unchanged_before(indexed)
        return self._compared("same-directives", indexed,
                              lambda: same_directives(indexed.source_bytes, self.source_bytes, prefix))

    def _compared(self, key: str, indexed: IndexedText, compute: Callable[[], T]) -> T:
        """``compute()``, a comparison of the current text with ``indexed``'s, once per revision and index.

        The memo refers to ``indexed`` weakly: were it the last reference to an index the worker thread
        has replaced, the next revision's comparison would free that index (thousands of objects, up
        to ~5 ms in a 10,000-line file) on the event loop, inside a hover. Without it the index dies
        where it is replaced, on the thread that built its successor.
        """
        known = self.cached(key)
        if known is not None and known[0]() is indexed:
            return known[1]
        return self.memo(key, lambda: (weakref.ref(indexed), compute()))[1]

    async def off_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` inline for a small document, on a worker thread for a big one."""
        if not self.big:
            return fn()
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    async def index_async(self) -> KernelIndex:
        """The index, built on a worker thread when the document is big; a pending one is awaited complete."""
        return (await self.indexed_async()).index

    async def indexed_async(self) -> IndexedText:
        """:meth:`indexed`, built on a worker thread when the document is big, and complete: a pending
        index is awaited while a worker thread completes it."""
        if self.cached("index") is not None or not (self.big or self._index_lock.locked()):
            text = self.indexed()
        else:
            # A big document's build, or a small one's while a worker thread holds the build (a completion
            # expanding macros): the loop does not wait on the lock.
            text = await asyncio.get_running_loop().run_in_executor(None, self.indexed)
        if text.pending:
            completion = self.complete_soon()
            if completion is not None:
                await completion
                text = self.indexed()
        return text


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

    def __init__(self, prepare: Callable[[DocumentState, IndexedText], None] | None = None,
                 give_way: Callable[[], None] = _no_pause, **wiring: Any) -> None:
        self._docs: dict[str, DocumentState] = {}
        self._prepare = prepare
        """Every document's :attr:`DocumentState.prepare`."""
        self._give_way = give_way
        """Every document's :attr:`DocumentState.give_way`, for its parses and index builds too."""
        self._wiring = wiring
        """Every document's ``macro_views``, ``may_expand``, ``expansion_budget`` and ``on_completed``."""

    def get(self, uri: str) -> DocumentState | None:
        return self._docs.get(uri)

    def all(self) -> tuple[DocumentState, ...]:
        return tuple(self._docs.values())

    async def open(self, uri: str, text: str, version: int | None, language_id: str = "cuda") -> DocumentState:
        existing = self._docs.get(uri)
        placeholder = existing or DocumentState(uri, version, ParsedDocument(b""), uri_to_path(uri), language_id,
                                                prepare=self._prepare, give_way=self._give_way, **self._wiring)
        self._docs[uri] = placeholder
        placeholder.opening = True
        async with placeholder.lock:
            try:
                def parse() -> ParsedDocument:
                    return ParsedDocument(text, self._give_way, max_parse_bytes=REDUCED_BYTES)

                if len(text) > OFFLOAD_BYTES:
                    parsed = await asyncio.get_running_loop().run_in_executor(None, parse)
                else:
                    parsed = parse()
                placeholder.parsed = parsed
                placeholder.unread_bytes = None
                # The declaration count of a fresh parse is one attribute read: reduced mode is known at once.
                placeholder.units = parsed.tree.root_node.child_count
                placeholder.indexer = IncrementalIndexer(self._give_way)
                placeholder.last_indexed = None
                placeholder.revision += 1
                placeholder.version = version
                placeholder.language_id = language_id
            finally:
                placeholder.opening = False
                queued, placeholder.queued = placeholder.queued, []
                for edit in queued:
                    edit()
        return placeholder

    def unread(self, uri: str, version: int | None, size_bytes: int) -> DocumentState:
        """Register ``uri`` as a document whose text was not read (see :attr:`DocumentState.unread_bytes`)."""
        doc = DocumentState(uri, version, ParsedDocument(b""), uri_to_path(uri), prepare=self._prepare,
                            give_way=self._give_way, unread_bytes=size_bytes)
        self._docs[uri] = doc
        return doc

    def close(self, uri: str) -> DocumentState | None:
        gc.unfreeze()
        return self._docs.pop(uri, None)
