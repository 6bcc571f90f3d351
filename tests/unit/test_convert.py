"""UTF-16 <-> UTF-8 column conversion, with clamping."""

from __future__ import annotations

import pytest
from lsprotocol import types

from kernel_lsp.core.index import Point
from kernel_lsp.core.parse import ParsedDocument
from kernel_lsp.server.convert import byte_to_utf16, line_range, to_point, to_position, utf16_to_byte

LINE = "a😀é b".encode()  # a(1 byte, 1 unit) 😀(4 bytes, 2 units) é(2 bytes, 1 unit) space b


@pytest.mark.parametrize(("utf16", "byte"), [(0, 0), (1, 1), (3, 5), (4, 7), (5, 8), (6, 9), (99, 9)])
def test_utf16_to_byte(utf16: int, byte: int) -> None:
    assert utf16_to_byte(LINE, utf16) == byte


@pytest.mark.parametrize(("byte", "utf16"), [(0, 0), (1, 1), (5, 3), (7, 4), (9, 6), (99, 6)])
def test_byte_to_utf16(byte: int, utf16: int) -> None:
    assert byte_to_utf16(LINE, byte) == utf16


def test_a_column_inside_a_surrogate_pair_does_not_split_the_character() -> None:
    # UTF-16 column 2 points between the two halves of the emoji: the whole character is counted.
    assert utf16_to_byte(LINE, 2) == 5


def test_ascii_fast_path_clamps() -> None:
    assert utf16_to_byte(b"abc", 10) == 3 and byte_to_utf16(b"abc", 10) == 3 and utf16_to_byte(b"abc", -1) == 0


def test_positions_past_the_end_are_clamped() -> None:
    doc = ParsedDocument("ab\ncd😀\n")
    assert to_point(doc, types.Position(line=1, character=100)) == Point(1, 6)
    assert to_point(doc, types.Position(line=50, character=3)) == Point(2, 0)  # the empty last line
    assert to_position(doc, Point(1, 6)) == types.Position(line=1, character=4)
    assert to_position(doc, Point(9, 0)) == types.Position(line=2, character=0)


def test_line_range_covers_identifier_at_caret_or_whole_line() -> None:
    doc = ParsedDocument("  x = undefined_thing + 1;\r\n")
    at_caret = line_range(doc, 0, 6)
    assert (at_caret.start.character, at_caret.end.character) == (6, 21)
    whole = line_range(doc, 0)
    assert (whole.start.character, whole.end.character) == (2, 26)
    past = line_range(doc, 40, 500)
    assert past.start.line == 1
