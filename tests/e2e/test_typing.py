"""Typing: one didChange per keystroke, requests in between; the answers match the text they were sent for."""

from __future__ import annotations

from pathlib import Path

from lsp_helpers import SAXPY, hover_text, lsp_session, open_doc, position_of
from lsprotocol import types

TYPED = """\
__global__ void typed_kernel(float* q, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { q[i] = 2.0f * q[i]; }
}
"""


def _keystroke(uri: str, version: int, line: int, character: int, text: str) -> types.DidChangeTextDocumentParams:
    position = types.Position(line=line, character=character)
    return types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(range=types.Range(start=position, end=position), text=text)],
    )


async def _names_and_lines(client, uri: str) -> list[tuple[str, int, int]]:
    result = await client.text_document_document_symbol_async(
        types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    return [(s.name, s.range.start.line, s.range.end.line) for s in result or []]


async def test_a_typed_kernel_appears_and_hovers_in_between_stay_right(tmp_path: Path) -> None:
    path = tmp_path / "typing.cu"
    path.write_text(SAXPY)
    start_line = SAXPY.count("\n")  # typed after the last line
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        assert ("saxpy", 5, 13) in await _names_and_lines(client, uri)
        hovers = []
        line, character, version = start_line, 0, 1
        for i, char in enumerate(TYPED):
            version += 1
            client.text_document_did_change(_keystroke(uri, version, line, character, char))
            line, character = (line + 1, 0) if char == "\n" else (line, character + 1)
            if i % 25 == 24:
                # Sent while keystrokes are still queued behind it, about a kernel above the typing.
                hovers.append(client.text_document_hover_async(types.HoverParams(
                    text_document=types.TextDocumentIdentifier(uri=uri), position=position_of(SAXPY, "saxpy(int", 1))))
        answers = [await hover for hover in hovers]
        typed = await _names_and_lines(client, uri)
        fresh_path = tmp_path / "fresh.cu"
        fresh_path.write_text(SAXPY + TYPED)
        fresh = await _names_and_lines(client, open_doc(client, fresh_path))
        launch = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=position_of(SAXPY, "saxpy<<<", 1)))
    assert len(answers) == len(TYPED) // 25
    for answer in answers:
        assert "__global__ void saxpy(int n" in hover_text(answer)
        assert answer.range is not None and answer.range.start.line == 5
    assert typed == fresh
    assert ("typed_kernel", start_line, start_line + 3) in typed
    assert launch.range is not None and launch.range.start.line == position_of(SAXPY, "saxpy<<<").line
    assert "line 20: block 256 threads" in hover_text(launch)
