"""Typing: one didChange per keystroke, requests in between; the answers match the text they were sent for."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lsp_helpers import SAXPY, hover_text, lsp_session, open_doc, position_of
from lsprotocol import types

from kernel_lsp.server.documents import OFFLOAD_BYTES

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


def _hover_now(client, doc: types.TextDocumentIdentifier, position: types.Position) -> asyncio.Future:
    """A hover request sent at once, between the keystrokes around it (``*_async`` methods send when
    awaited)."""
    return asyncio.wrap_future(client.protocol.send_request(
        types.TEXT_DOCUMENT_HOVER, types.HoverParams(text_document=doc, position=position)))


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
                hovers.append(_hover_now(client, types.TextDocumentIdentifier(uri=uri), position_of(SAXPY, "saxpy(int", 1)))
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


def _big_file(kernels: int) -> tuple[str, list[int]]:
    """A file over the size that indexes on a worker thread, and the line of each kernel's name."""
    out: list[str] = ["#define BLOCK 256", ""]
    lines: list[int] = []
    for i in range(kernels):
        lines.append(len(out))
        out += [f"__global__ void k{i}(float* x, int n) {{",
                f"    int i = blockIdx.x * blockDim.x + threadIdx.x; // padding the file to a realistic size {i}",
                f"    if (i < n) {{ x[i] = x[i] * {i % 9 + 1}.0f + 0.5f; }}",
                "}",
                f"void run{i}(float* x, int n) {{ k{i}<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>(x, n); }}",
                ""]
    return "\n".join(out) + "\n", lines


async def test_hovers_in_a_burst_on_a_big_file_name_the_right_kernel(tmp_path: Path) -> None:
    # Big enough that parses and index builds run on a worker thread (documents.OFFLOAD_BYTES) and hovers
    # above the typing are answered from the last index while keystrokes keep coming.
    text, name_lines = _big_file(2600)
    assert len(text.encode()) > OFFLOAD_BYTES
    path = tmp_path / "big.cu"
    path.write_text(text)
    typed_at = name_lines[1300] - 1  # the empty line before a kernel in the middle
    above, below = (700, 701, 1299), (1300, 1301, 2500)
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        doc = types.TextDocumentIdentifier(uri=uri)
        await client.text_document_document_symbol_async(types.DocumentSymbolParams(text_document=doc))
        asked: list[tuple[int, int, bool, asyncio.Future]] = []
        outlines = []
        line, character, version = typed_at, 0, 1
        def hover_all(typed: bool) -> None:
            moved = line - typed_at
            for k in (*above, *below):
                at = name_lines[k] + (moved if k in below else 0)
                # Until the typed kernel is whole, tree-sitter may read the kernel after it as part of it.
                asked.append((k, at, typed or k in above, _hover_now(
                    client, doc, types.Position(line=at, character=len("__global__ void ") + 1))))
            # A launch above the typing: its occupancy line is its own.
            at = name_lines[above[0]] + 4
            asked.append((-1, at, True, _hover_now(
                client, doc, types.Position(line=at, character=len(f"void run{above[0]}(float* x, int n) {{ ") + 1))))

        for i, char in enumerate(TYPED):
            version += 1
            client.text_document_did_change(_keystroke(uri, version, line, character, char))
            line, character = (line + 1, 0) if char == "\n" else (line, character + 1)
            if i % 10 == 9:
                if i % 20 == 19:
                    # A re-index on the worker thread while the keystrokes and hovers go on.
                    outlines.append(client.protocol.send_request(
                        types.TEXT_DOCUMENT_DOCUMENT_SYMBOL, types.DocumentSymbolParams(text_document=doc)))
                hover_all(False)
        hover_all(True)
        answers = [(k, at, needed, await hover) for k, at, needed, hover in asked]
        for outline in outlines:
            await asyncio.wrap_future(outline)
        symbols = await client.text_document_document_symbol_async(types.DocumentSymbolParams(text_document=doc))
    assert len(answers) == (len(TYPED) // 10 + 1) * 7
    for k, at, needed, answer in answers:
        if answer is None and not needed:
            # Below the typing, before the typed kernel is whole: a later keystroke may have moved the
            # position before the index was built; no answer then, never another place's facts.
            continue
        shown = hover_text(answer)
        assert answer is not None and answer.range is not None and answer.range.start.line == at, (k, at, shown)
        kernel = above[0] if k < 0 else k
        assert f"__global__ void k{kernel}(float* x, int n)" in shown, (k, at, shown)
        if k < 0:
            assert f"line {at + 1}: block 256 threads" in shown
    typed_lines = TYPED.count("\n")
    names = {s.name: s.range.start.line for s in symbols or []}
    assert names["typed_kernel"] == typed_at
    assert names["k1300"] == name_lines[1300] + typed_lines and names["k1299"] == name_lines[1299]
