"""Incremental text sync: edits in UTF-16 ranges end in the same state as opening the final text."""

from __future__ import annotations

from pathlib import Path

from lsp_helpers import SAXPY, hover_text, lsp_session, open_doc, position_of
from lsprotocol import types


def _change(start: tuple[int, int], end: tuple[int, int], text: str) -> types.TextDocumentContentChangePartial:
    return types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(line=start[0], character=start[1]),
                          end=types.Position(line=end[0], character=end[1])),
        text=text,
    )


def _apply(text: str, change: types.TextDocumentContentChangePartial) -> str:
    """Reference implementation of an LSP edit on a Python string (UTF-16 columns)."""
    lines = text.split("\n")

    def offset(pos: types.Position) -> int:
        line = lines[pos.line]
        units = line.encode("utf-16-le")[: pos.character * 2].decode("utf-16-le")
        return sum(len(item) + 1 for item in lines[: pos.line]) + len(units)

    return text[: offset(change.range.start)] + change.text + text[offset(change.range.end):]


async def _symbols(client, uri: str) -> list[tuple[str, int, int, int, int]]:
    result = await client.text_document_document_symbol_async(
        types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    return [
        (s.name, s.range.start.line, s.range.start.character, s.selection_range.start.line, s.selection_range.start.character)
        for s in result or []
    ]


async def test_edits_match_a_fresh_open(tmp_path: Path) -> None:
    path = tmp_path / "edit.cu"
    path.write_text(SAXPY)
    text = SAXPY
    saxpy_line = position_of(SAXPY, "saxpy(int").line
    steps = [
        # Rename a kernel in place (name and its launch).
        [_change((saxpy_line, 16), (saxpy_line, 21), "daxpy")],
        # Insert a new kernel with a non-ASCII comment before everything.
        [_change((0, 0), (0, 0), "// ünïcode 😀 header\n__global__ void fresh(int* q) { q[0] = 1; }\n")],
        # Two changes in one notification, applied in order: delete the device function, then type.
        [_change((5, 0), (6, 0), ""), _change((0, 3), (0, 3), "x")],
        # Multi-line insertion right after the emoji (UTF-16 column 14 is past its surrogate pair).
        [_change((0, 14), (0, 14), "\n// split\n//")],
    ]
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        assert ("saxpy", 5, 0, 5, 16) in await _symbols(client, uri)
        for version, changes in enumerate(steps, start=2):
            for change in changes:
                text = _apply(text, change)
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=changes,
            ))
        edited = await _symbols(client, uri)
        hover = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=position_of(text, "daxpy(int", 1)))
        fresh_path = tmp_path / "fresh.cu"
        fresh_path.write_text(text, encoding="utf-8")
        fresh_uri = open_doc(client, fresh_path)
        reference = await _symbols(client, fresh_uri)
    assert edited == reference
    names = [name for name, *_ in edited]
    assert "daxpy" in names and "fresh" in names and "saxpy" not in names and "twice" not in names
    assert "__global__ void daxpy(int n" in hover_text(hover)


async def test_edit_with_range_past_the_end_is_clamped(tmp_path: Path) -> None:
    path = tmp_path / "clamp.cu"
    path.write_text("__global__ void a() {}\n")
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[_change((500, 80), (900, 3), "__global__ void b() {}\n")],
        ))
        names = [name for name, *_ in await _symbols(client, uri)]
    assert names == ["a", "b"]
