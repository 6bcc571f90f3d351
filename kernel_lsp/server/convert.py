"""Position conversion between LSP (UTF-16 code units) and the core (UTF-8 bytes).

The core speaks (line, UTF-8 byte column); LSP clients speak (line, UTF-16 code
unit). Each function takes the line's UTF-8 bytes, so the work is proportional
to one line, and ASCII lines (almost all CUDA) take a fast path where both
columns are equal. Positions past the end of a line or of the document are
clamped, never raised on (LSP: "if the character value is greater than the line
length it defaults back to the line length").
"""

from __future__ import annotations

from typing import Protocol

from lsprotocol import types

from kernel_lsp.core.index import Point, Span


class Text(Protocol):
    """What conversion reads of a text: a :class:`~kernel_lsp.core.parse.ParsedDocument`, or the
    text an index was built from (:class:`~kernel_lsp.server.documents.IndexedText`)."""

    @property
    def source_bytes(self) -> bytes: ...

    def line_count(self) -> int: ...

    def line_start(self, line: int) -> int: ...


def _utf16_len(text: str) -> int:
    # Characters outside the BMP take two UTF-16 code units.
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def utf16_to_byte(line_bytes: bytes, utf16_col: int) -> int:
    """UTF-8 byte column of a UTF-16 column in one line (clamped to the line)."""
    if utf16_col <= 0:
        return 0
    if line_bytes.isascii():
        return min(utf16_col, len(line_bytes))
    units = 0
    byte_col = 0
    for ch in line_bytes.decode("utf-8", errors="replace"):
        if units >= utf16_col:
            break
        units += 2 if ord(ch) > 0xFFFF else 1
        byte_col += len(ch.encode("utf-8", errors="replace"))
    return min(byte_col, len(line_bytes))


def byte_to_utf16(line_bytes: bytes, byte_col: int) -> int:
    """UTF-16 column of a UTF-8 byte column in one line (clamped to the line)."""
    if byte_col <= 0:
        return 0
    if line_bytes.isascii():
        return min(byte_col, len(line_bytes))
    return _utf16_len(line_bytes[:byte_col].decode("utf-8", errors="ignore"))


def line_bytes(doc: Text, line: int) -> bytes:
    """The bytes of ``line`` without its newline (empty past the end)."""
    count = doc.line_count()
    if line < 0 or line >= count:
        return b""
    end = doc.line_start(line + 1) - 1 if line + 1 < count else len(doc.source_bytes)
    return doc.source_bytes[doc.line_start(line):end]


def clamp_line(doc: Text, line: int) -> int:
    return max(0, min(line, doc.line_count() - 1))


def to_point(doc: Text, position: types.Position) -> Point:
    """An LSP position as a core point, clamped into the document."""
    count = doc.line_count()
    if position.line >= count:
        last = count - 1
        return Point(last, len(line_bytes(doc, last)))
    line = max(position.line, 0)
    return Point(line, utf16_to_byte(line_bytes(doc, line), position.character))


def to_position(doc: Text, point: Point) -> types.Position:
    line = clamp_line(doc, point.line)
    if line != point.line:
        return types.Position(line=line, character=byte_to_utf16(line_bytes(doc, line), 1 << 30))
    return types.Position(line=line, character=byte_to_utf16(line_bytes(doc, line), point.column_byte))


def to_range(doc: Text, span: Span) -> types.Range:
    return types.Range(start=to_position(doc, span.start), end=to_position(doc, span.end))


def line_range(doc: Text, line: int, column_byte: int | None = None) -> types.Range:
    """A range for a compiler message on one line.

    With a column (nvcc's caret), the range covers the identifier starting there
    (or one character); without, the line's text without its indentation.
    """
    line = clamp_line(doc, line)
    text = line_bytes(doc, line)
    if column_byte is None:
        start = len(text) - len(text.lstrip())
        end = len(text.rstrip())
    else:
        start = min(max(column_byte, 0), len(text))
        end = start
        while end < len(text) and (text[end:end + 1].isalnum() or text[end] == ord("_")):
            end += 1
        if end == start:
            end = min(start + 1, len(text))
    return types.Range(
        start=types.Position(line=line, character=byte_to_utf16(text, start)),
        end=types.Position(line=line, character=byte_to_utf16(text, end)),
    )
