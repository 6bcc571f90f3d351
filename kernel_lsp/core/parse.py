"""tree-sitter-cuda parsing, incremental on edits.

A :class:`ParsedDocument` owns the source as UTF-8 bytes and its tree. Edits
are applied with ``tree.edit`` and an incremental reparse that hands
tree-sitter the old tree, so a keystroke in a 10,000-line file reparses only
the region around the edit.

Edits may be *deferred* (``defer=True``): the text and line table change at
once, the tree edits are queued, and the first read of the tree applies them
all and reparses once. A burst of keystrokes then costs one reparse, not one
per keystroke.

Positions here are (line, UTF-8 byte column); the server converts from UTF-16.
Parsing never fails: any bytes (binary, unterminated comments, 5 MB) give a
tree, possibly with ERROR and MISSING nodes.
"""

from __future__ import annotations

import bisect
import itertools
import re
import threading
from collections.abc import Callable

import tree_sitter_cuda
from tree_sitter import Language, Parser, Query, QueryCursor, Tree

CUDA_LANGUAGE = Language(tree_sitter_cuda.language())


_BINARY_SAMPLE_BYTES = 65536
MAX_PENDING_EDITS = 256


def looks_binary(source: bytes) -> bool:
    """True for data that is not source text: NUL bytes, or >10% invalid UTF-8 in the first 64 KiB.

    tree-sitter needs ~1.5 s per 200 KB of random bytes (error recovery explores many
    states), so binary input is not parsed at all.
    """
    sample = source[:_BINARY_SAMPLE_BYTES]
    if b"\x00" in sample:
        return True
    decoded = sample.decode("utf-8", errors="replace")
    # A sample cut mid-character adds at most one replacement character.
    return decoded.count("\ufffd") > max(1, len(decoded) // 10)


#: A function-like ``#define`` with an empty body and whitespace after its parameters
#: (``#define CHECK(x) ``): tree-sitter-cuda reads the next line as its body, so a kernel there vanished.
#: The search starts at ``define`` rather than at every line start (``^…``): ten times faster over a file, which
#: every reparse scans; what precedes it on its line is checked apart (:data:`_DIRECTIVE_HEAD`).
_EMPTY_MACRO_TAIL = re.compile(rb"define[ \t]+[A-Za-z_]\w*\([^()\n]*\)[ \t]*?([ \t])\r?$", re.MULTILINE)
_DIRECTIVE_HEAD = re.compile(rb"[ \t]*#[ \t]*\Z")


def _patched_at(source: bytes) -> list[int]:
    """Where :func:`parser_input` changes a byte of ``source``."""
    found = []
    for match in _EMPTY_MACRO_TAIL.finditer(source) if b"define" in source else ():
        if _DIRECTIVE_HEAD.match(source, source.rfind(b"\n", 0, match.start()) + 1, match.start()):
            found.append(match.start(1))
    return found


def parser_input(source: bytes) -> bytes:
    """The bytes tree-sitter is given for ``source``: the same length and lines, every node where it is in
    ``source``; only the last blank of an empty function-like macro body is a ``0`` (a body tree-sitter ends
    at the line's end). Text is always read from ``source`` itself, where that body is blank."""
    positions = _patched_at(source)
    if not positions:
        return source
    patched = bytearray(source)
    for at in positions:
        patched[at] = ord("0")
    return bytes(patched)


def _patched_lines(old: bytes, new: bytes, edits: list[tuple]) -> list[tuple[int, int]]:
    """Byte ranges of ``new``'s lines where what tree-sitter read of ``old`` and is given of ``new`` differ
    outside the edits: a byte patched in one text and not in the other (``old``'s mapped through ``edits``).
    An incremental reparse must be told they changed, or it could keep a macro body that is no longer there."""
    mapped = set()
    for at in _patched_at(old):
        for start_byte, old_end_byte, new_end_byte, *_ in edits:
            if at >= old_end_byte:
                at += new_end_byte - old_end_byte
            elif at >= start_byte:
                break  # inside an edit: reparsed anyway
        else:
            mapped.add(at)
    positions = mapped ^ set(_patched_at(new))
    ranges = set()
    for at in positions:
        end = new.find(b"\n", at)
        ranges.add((new.rfind(b"\n", 0, at) + 1, len(new) if end < 0 else end))
    return sorted(r for r in ranges if r[0] < r[1])


#: Bytes handed to tree-sitter per read while it parses (see :func:`_parse`).
READ_CHUNK_BYTES = 4096


def _parse(parser: Parser, source: bytes, old_tree: Tree | None = None,
           give_way: Callable[[], None] | None = None) -> Tree:
    """``parser.parse(source, old_tree)``, the text read through a callback in chunks.

    tree-sitter holds the GIL for a whole parse: a reparse that cannot reuse much (a ``{`` or
    ``for (`` typed and not closed yet, a file opened) takes 50-300 ms of a 10,000-line file, and the
    server's event loop, whose hover needs no new tree, could not run meanwhile. Each read runs
    Python code, where the interpreter hands the GIL to a thread that asked for it (after the switch
    interval): the loop waits milliseconds, not the whole parse. No syscall, nothing the tree
    depends on. ``give_way``: called from tree-sitter's progress callback (every ~100 parse
    operations, tens of microseconds apart, where reads may be a few ms apart), where the caller may
    pause the parse (see :mod:`kernel_lsp.server.foreground`); the tree is the same.
    """
    text = parser_input(source)

    def read(offset: int, _point: tuple[int, int]) -> bytes:
        return text[offset : offset + READ_CHUNK_BYTES]

    options: dict[str, Callable[[int, bool], bool]] = {}
    if give_way is not None:
        def progress(_offset: int, _has_error: bool) -> bool:
            give_way()
            return False  # never cancel

        options["progress_callback"] = progress
    tree = parser.parse(read, old_tree, **options) if old_tree is not None else parser.parse(read, **options)
    assert tree is not None  # the parser has its language and no timeout
    return tree


def binary_reason(source: bytes) -> str | None:
    """What makes ``source`` binary data to :func:`looks_binary`, for the user (None when it is text)."""
    sample = source[:_BINARY_SAMPLE_BYTES]
    nul = sample.find(b"\x00")
    if nul >= 0:
        line = sample.count(b"\n", 0, nul)
        column = nul - sample.rfind(b"\n", 0, nul)
        return (f"holds a NUL byte (line {line + 1}, byte {column}), so it is "
                "read as binary data: no kernel index, hovers or symbols; remove the NUL bytes to have it analysed")
    if looks_binary(source):
        return ("is over a tenth not UTF-8 in its first 64 KiB, so it is read as binary data: no kernel index, "
                "hovers or symbols")
    return None


def newline_of(text: str) -> str:
    """The text's line ending: CRLF where most of its lines end so (a Windows checkout), else LF. A rewrite
    written with it changes only the lines it means to, not every line's ending."""
    crlf = text.count("\r\n")
    return "\r\n" if crlf > text.count("\n") - crlf else "\n"


def to_source_bytes(text: str | bytes) -> bytes:
    """UTF-8 bytes for ``text``; lone surrogates (from a bad decode) become U+FFFD."""
    if isinstance(text, bytes):
        return text
    return text.encode("utf-8", errors="replace")


class ParsedDocument:
    """Source bytes plus their tree-sitter tree; mutable through edits only."""

    def __init__(self, text: str | bytes, give_way: Callable[[], None] | None = None, *,
                 max_parse_bytes: int | None = None) -> None:
        self._parser = Parser(CUDA_LANGUAGE)
        self._give_way = give_way
        """Called at the parses' yield points (see :func:`_parse`)."""
        self._max_parse_bytes = max_parse_bytes
        """Text longer than this is kept but parsed as an empty file, as binary data is (a 50 MB file's tree
        alone would take gigabytes); None: any length is parsed."""
        source = to_source_bytes(text)
        self.is_binary = looks_binary(source)
        """Binary data is kept but parsed as an empty file; the index reports it as a syntax error."""
        self._source = source
        """The newest text; ``_snapshot`` may lag behind it by the edits in ``_pending``."""
        self._snapshot: tuple[bytes, Tree] = (source, _parse(self._parser, self._parsed_text(source),
                                                             give_way=give_way))
        self._pending: list[tuple[int, int, int, tuple[int, int], tuple[int, int], tuple[int, int]]] = []
        """Tree edits made to the text since ``_snapshot``'s tree was parsed, oldest first."""
        self._line_starts: list[int] | None = None
        # Typing on one line moves the start of every later line: rather than rewrite the table
        # for each keystroke, lines after _shift_line start _shift_bytes later than the table says
        # until an edit elsewhere (or a reader of the whole table) applies the shift.
        self._shift_line = 0
        self._shift_bytes = 0
        # _state guards (_source, _snapshot, _pending) as one; _parsing serialises reparses, which
        # may run on a worker thread while the owner keeps making deferred edits.
        self._state = threading.Lock()
        self._parsing = threading.Lock()

    def _too_long(self, source: bytes) -> bool:
        return self._max_parse_bytes is not None and len(source) > self._max_parse_bytes

    def _unparsed(self, source: bytes) -> bool:
        return self.is_binary or self._too_long(source)

    def _parsed_text(self, source: bytes) -> bytes:
        """What tree-sitter is given for ``source``: nothing for binary data or text over ``max_parse_bytes``."""
        return b"" if self._unparsed(source) else source

    @property
    def unparsed(self) -> bool:
        """The text is binary data or longer than ``max_parse_bytes``: its tree is an empty file's."""
        return self._unparsed(self._source)

    @property
    def source_bytes(self) -> bytes:
        return self._source

    @property
    def tree(self) -> Tree:
        return self.snapshot()[1]

    @property
    def has_pending_edits(self) -> bool:
        """Deferred edits wait for a reparse (the next read of the tree)."""
        return bool(self._pending)

    def snapshot(self) -> tuple[bytes, Tree]:
        """(source bytes, tree) of one version, consistent with each other; reparses deferred edits first.

        Edits never mutate a published tree (they edit a copy), so a worker
        thread may index a snapshot while the owner applies further edits; an
        edit deferred during the reparse waits for the next one.
        """
        if not self._pending:
            return self._snapshot
        with self._parsing:
            with self._state:
                source, (parsed_source, tree), edits = self._source, self._snapshot, list(self._pending)
            if not edits:
                return self._snapshot
            edited = tree.copy()
            for start_byte, old_end_byte, new_end_byte, start_point, old_end_point, new_end_point in edits:
                edited.edit(start_byte=start_byte, old_end_byte=old_end_byte, new_end_byte=new_end_byte,
                            start_point=start_point, old_end_point=old_end_point, new_end_point=new_end_point)
            for start, end in _patched_lines(parsed_source, source, edits):
                at, to = _point_in(source, start), _point_in(source, end)
                edited.edit(start_byte=start, old_end_byte=end, new_end_byte=end, start_point=at, old_end_point=to,
                            new_end_point=to)
            parsed = _parse(self._parser, source, edited, self._give_way)
            with self._state:
                del self._pending[: len(edits)]
                self._snapshot = (source, parsed)
                return self._snapshot

    @property
    def text(self) -> str:
        return self.source_bytes.decode("utf-8", errors="replace")

    def apply_change(
        self,
        start_byte: int,
        old_end_byte: int,
        new_end_byte: int,
        start_point: tuple[int, int],
        old_end_point: tuple[int, int],
        new_end_point: tuple[int, int],
        new_text: str | bytes,
        *,
        defer: bool = False,
    ) -> None:
        """Replace ``source[start_byte:old_end_byte]`` by ``new_text`` and reparse incrementally
        (at once, or with ``defer`` at the next read of the tree).

        Points are (line, byte column). ``new_end_byte`` must equal
        ``start_byte + len(new_text as UTF-8)``; tree-sitter needs all six to shift
        the old tree's nodes before it reuses them.
        """
        new_bytes = to_source_bytes(new_text)
        old_source = self._source
        source = old_source[:start_byte] + new_bytes + old_source[old_end_byte:]
        if self.is_binary or looks_binary(new_bytes) or self._too_long(old_source) != self._too_long(source):
            self._line_starts = None
            self._shift_bytes = 0
            self.replace_all(source)
            return
        if self._line_starts is not None:
            line = start_point[0]
            if line == old_end_point[0] and b"\n" not in new_bytes and (not self._shift_bytes or line == self._shift_line):
                self._shift_line = line
                self._shift_bytes += len(new_bytes) - (old_end_byte - start_byte)
            else:
                self._line_starts = _edited_line_starts(self.line_starts(), start_byte, old_end_byte, new_bytes)
        if self._too_long(source):
            # Still too long to parse: the text and its line table change, the (empty) tree stays.
            with self._state:
                self._source = source
                self._snapshot = (source, self._snapshot[1])
            return
        with self._state:
            self._source = source
            self._pending.append((start_byte, old_end_byte, new_end_byte, start_point, old_end_point, new_end_point))
            # A burst with no request in between (20,000 keystrokes pasted by a client) must not queue
            # edits without bound: past MAX_PENDING_EDITS they are applied, one reparse per batch.
            due = len(self._pending) >= MAX_PENDING_EDITS
        if not defer or due:
            self.snapshot()

    def apply_edit(
        self,
        start_line: int,
        start_column_byte: int,
        end_line: int,
        end_column_byte: int,
        new_text: str | bytes,
        *,
        defer: bool = False,
    ) -> None:
        """Apply an LSP-style range replacement given in (line, UTF-8 byte column); ``defer`` as in
        :meth:`apply_change`.

        Positions past the end of a line or of the document are clamped, as LSP
        asks servers to do, so a stale client position never raises.
        """
        start_byte = self.byte_offset(start_line, start_column_byte)
        old_end_byte = max(start_byte, self.byte_offset(end_line, end_column_byte))
        new_bytes = to_source_bytes(new_text)
        start_point = self.point_of(start_byte)
        old_end_point = self.point_of(old_end_byte)
        newline_count = new_bytes.count(b"\n")
        if newline_count:
            new_end_point = (start_point[0] + newline_count, len(new_bytes) - new_bytes.rfind(b"\n") - 1)
        else:
            new_end_point = (start_point[0], start_point[1] + len(new_bytes))
        self.apply_change(
            start_byte,
            old_end_byte,
            start_byte + len(new_bytes),
            start_point,
            old_end_point,
            new_end_point,
            new_bytes,
            defer=defer,
        )

    def replace_all(self, text: str | bytes, *, defer: bool = False) -> None:
        """Full-document sync. The changed region is found by comparing old and new text, then
        reparsed incrementally: a client that sends the whole 10,000-line file after each
        keystroke costs a few milliseconds, not a full parse."""
        source = to_source_bytes(text)
        old_source = self.source_bytes
        if source == old_source:
            return
        if self._unparsed(old_source) or self._unparsed(source) or not old_source or looks_binary(source):
            with self._parsing:
                self.is_binary = looks_binary(source)
                parsed = _parse(self._parser, self._parsed_text(source), give_way=self._give_way)
                with self._state:
                    self._source = source
                    self._snapshot = (source, parsed)
                    self._pending.clear()
            self._line_starts = None
            self._shift_bytes = 0
            return
        prefix = common_prefix(old_source, source)
        suffix = common_suffix(old_source, source, min(len(old_source), len(source)) - prefix)
        old_end, new_end = len(old_source) - suffix, len(source) - suffix
        self.apply_change(
            prefix,
            old_end,
            new_end,
            _point_in(old_source, prefix),
            _point_in(old_source, old_end),
            _point_in(source, new_end),
            source[prefix:new_end],
            defer=defer,
        )

    def _table(self) -> list[int]:
        """The line table as stored (lines after ``_shift_line`` still to be shifted)."""
        if self._line_starts is None:
            # split + accumulate run in C: ~1 ms for 10,000 lines, a find() loop is several times slower.
            lengths = [len(line) + 1 for line in self.source_bytes.split(b"\n")]
            self._line_starts = [0, *itertools.accumulate(lengths[:-1])]
            self._shift_bytes = 0
        return self._line_starts

    def line_starts(self) -> list[int]:
        """Byte offset of the start of each line (computed once per version)."""
        starts = self._table()
        if self._shift_bytes:
            cut = self._shift_line + 1
            starts[cut:] = map(self._shift_bytes.__add__, starts[cut:])
            self._shift_bytes = 0
        return starts

    def line_count(self) -> int:
        return len(self._table())

    def line_start(self, line: int) -> int:
        """Byte offset where ``line`` starts (0 <= line < line_count())."""
        start = self._table()[line]
        return start + self._shift_bytes if line > self._shift_line else start

    def byte_offset(self, line: int, column_byte: int) -> int:
        """Byte offset of (line, byte column), clamped into the document and the line."""
        count = self.line_count()
        if line < 0:
            return 0
        if line >= count:
            return len(self.source_bytes)
        line_end = self.line_start(line + 1) - 1 if line + 1 < count else len(self.source_bytes)
        return min(self.line_start(line) + max(column_byte, 0), line_end)

    def point_of(self, byte_offset: int) -> tuple[int, int]:
        """(line, byte column) of a byte offset."""
        starts = self._table()
        cut = self._shift_line + 1
        if self._shift_bytes and cut < len(starts) and byte_offset >= starts[cut] + self._shift_bytes:
            line = bisect.bisect_right(starts, byte_offset - self._shift_bytes, cut) - 1
        else:
            line = bisect.bisect_right(starts, byte_offset, 0, cut if self._shift_bytes else len(starts)) - 1
        return line, byte_offset - self.line_start(line)


def _edited_line_starts(starts: list[int], start_byte: int, old_end_byte: int, new_bytes: bytes) -> list[int]:
    """The line table after replacing ``[start_byte, old_end_byte)`` by ``new_bytes``.

    Rebuilding the table costs ~1 ms per keystroke in a 10,000-line file; this keeps the lines
    before the edit, adds those the new text starts and moves the rest with ``map`` (C speed).
    """
    first = bisect.bisect_right(starts, start_byte) - 1
    last = bisect.bisect_right(starts, old_end_byte) - 1
    inserted = []
    newline = new_bytes.find(b"\n")
    while newline >= 0:
        inserted.append(start_byte + newline + 1)
        newline = new_bytes.find(b"\n", newline + 1)
    delta = len(new_bytes) - (old_end_byte - start_byte)
    tail = starts[last + 1 :]
    return starts[: first + 1] + inserted + (list(map(delta.__add__, tail)) if delta else tail)


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the common prefix; binary search over C-level slice comparisons (~1 ms for 400 KB)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(b[:mid]):  # one slice copied, not two
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """Length of the common suffix, at most ``limit`` (so it never overlaps the prefix)."""
    lo, hi = 0, max(0, limit)
    # An insertion or a deletion (typing, most edits) shares all of it: one comparison, no search.
    if a.endswith(b[len(b) - hi :]):
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.endswith(b[len(b) - mid :]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _point_in(source: bytes, offset: int) -> tuple[int, int]:
    """(line, byte column) of ``offset``, counted in C without building a line table."""
    line = source.count(b"\n", 0, offset)
    return line, offset - (source.rfind(b"\n", 0, offset) + 1)


#: The second byte of a comment's opener (``//``, ``/*``).
_COMMENT_SECOND = b"/*"
_LITERALS = Query(CUDA_LANGUAGE, """
    (comment) @c
    (string_literal) @s
    (char_literal) @s
    (raw_string_literal) @s
    (system_lib_string) @s
""")


def _ranges(query: Query, source: bytes) -> list[tuple[int, int]]:
    root = Parser(CUDA_LANGUAGE).parse(parser_input(source)).root_node
    captures = QueryCursor(query).captures(root)
    found = sorted((n.start_byte, n.end_byte) for nodes in captures.values() for n in nodes)
    merged: list[tuple[int, int]] = []
    for start, end in found:
        if merged and start < merged[-1][1]:
            continue  # nested (a string inside a comment is the comment's)
        merged.append((start, end))
    return merged


def comment_ranges(source: bytes, tree: Tree | None = None) -> list[tuple[int, int]]:
    """Byte ranges of the comments in ``source``, in order, as tree-sitter lexes them (``tree``: its tree,
    when the caller has it, e.g. a document's: no second parse).

    Every comment starts with ``//`` or ``/*``, so only those places are asked of the tree (the node there
    is a comment, or a string or an operator that holds them): ~1 ms for a 10,000-line file, where a query
    over the whole tree takes ~40 ms.
    """
    root = (tree if tree is not None else Parser(CUDA_LANGUAGE).parse(parser_input(source))).root_node
    found: list[tuple[int, int]] = []
    pos = 0
    while True:
        slash = source.find(b"/", pos)
        if slash < 0 or slash + 1 >= len(source):
            return found
        pos = slash + 1
        if source[pos] not in _COMMENT_SECOND:
            continue
        node = root.descendant_for_byte_range(slash, slash + 2)
        if node is not None and node.type == "comment" and node.start_byte == slash:
            found.append((slash, node.end_byte))
            pos = max(pos, node.end_byte)


def comment_and_literal_ranges(source: bytes) -> list[tuple[int, int]]:
    """Byte ranges of comments and string/char literals (``"..."``, ``'x'``, ``R"(...)"``, ``<stdio.h>``), in order."""
    return _ranges(_LITERALS, source)
