"""Bad input: the server answers, says what is wrong, never crashes, never writes the user's file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lsp_helpers import hover_text, lsp_session, needs_nvcc, open_doc, position_of, wait_diagnostics
from lsprotocol import types


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _symbol_names(client, uri: str) -> list[str]:
    result = await client.text_document_document_symbol_async(
        types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    return [s.name for s in result or []]


async def test_non_utf8_bytes(tmp_path: Path) -> None:
    path = tmp_path / "latin1.cu"
    path.write_bytes(b"// caf\xe9 \xff\xfe\n__global__ void k(float* p) { p[0] = 1.0f; }\n")
    before = _digest(path)
    # What an editor sends after decoding bad bytes: U+FFFD replacement characters.
    text = path.read_bytes().decode("utf-8", errors="replace")
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path, text=text)
        names = await _symbol_names(client, uri)
        hover = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=position_of(text, "k(float")))
    assert names == ["k"]
    assert "void k(float" in hover_text(hover)
    assert _digest(path) == before


@needs_nvcc
async def test_non_utf8_file_compiles_from_the_buffer(tmp_path: Path) -> None:
    path = tmp_path / "latin1.cu"
    path.write_bytes(b"// caf\xe9\n__global__ void k(float* p) { p[0] = undefined_x; }\n")
    before = _digest(path)
    text = path.read_bytes().decode("utf-8", errors="replace")
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, path, text=text)
        diagnostics = await wait_diagnostics(client, uri, lambda ds: any("undefined_x" in d.message for d in ds))
    [error] = [d for d in diagnostics if "undefined_x" in d.message]
    assert error.range.start.line == 1
    assert _digest(path) == before


async def test_five_megabyte_file(tmp_path: Path) -> None:
    # Big CUDA files in the wild are mostly generated tables; 300 kernels around a __constant__ array,
    # just under the 5 MB above which a document gets the reduced mode (test_security_bounded.py).
    kernels = "".join(
        f"__global__ void k{i}(float* p, int n) {{ int i = threadIdx.x; if (i < n) p[i] *= table[i]; }}\n"
        for i in range(300)
    )
    values = ", ".join(f"{i % 1000}.5f" for i in range(5 * 1024 * 1024 // 8))
    text = f"__constant__ float table[] = {{\n{values}\n}};\n" + kernels
    assert 4.9 * 1024 * 1024 < len(text.encode()) <= 5 * 1024 * 1024
    path = tmp_path / "huge.cu"
    path.write_text(text)
    last_line = text.count("\n")
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        names = await _symbol_names(client, uri)
        hover = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=last_line - 1, character=len("__global__ void k"))))
        # An edit at the very end still works on the big document.
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=last_line, character=0),
                                  end=types.Position(line=last_line, character=0)),
                text="__global__ void last_one() {}\n")],
        ))
        after = await _symbol_names(client, uri)
    assert names == [f"k{i}" for i in range(300)]
    assert "void k299(float" in hover_text(hover)
    assert after == names + ["last_one"]


async def test_text_that_is_not_cuda(tmp_path: Path) -> None:
    path = tmp_path / "notes.cu"
    text = "import os\n\ndef main():\n    print('hello')  # not CUDA at all }}}{{{ <<<>>>\n" + "\x00\x01binary\n"
    path.write_text(text)
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        names = await _symbol_names(client, uri)
        hover = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=3, character=6)))
        lenses = await client.text_document_code_lens_async(
            types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    assert names == []
    assert hover is None
    assert lenses is not None and list(lenses) == []


async def test_unterminated_comment_and_string(tmp_path: Path) -> None:
    path = tmp_path / "open.cu"
    text = (
        "__global__ void before(int* p) { p[0] = 1; }\n"
        'const char* s = "never closed\n'
        "/* a comment that never ends\n"
        "still in the comment\n"
    )
    path.write_text(text)
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        names = await _symbol_names(client, uri)
        hover = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=position_of(text, "before")))
        # The user closes the comment, writes a kernel after it, then closes the string.
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(start=types.Position(line=4, character=0), end=types.Position(line=4, character=0)),
                    text="*/\n__global__ void after(int* p) { p[0] = 2; }\n"),
                types.TextDocumentContentChangePartial(
                    range=types.Range(start=types.Position(line=1, character=99), end=types.Position(line=1, character=99)),
                    text='";'),
            ],
        ))
        fixed = await _symbol_names(client, uri)
    assert names == ["before"]
    assert "void before(int*" in hover_text(hover)
    assert fixed == ["before", "after"]


async def test_requests_for_positions_past_the_end(tmp_path: Path) -> None:
    path = tmp_path / "small.cu"
    path.write_text("__global__ void k() {}\n")
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        doc = types.TextDocumentIdentifier(uri=uri)
        hover = await client.text_document_hover_async(
            types.HoverParams(text_document=doc, position=types.Position(line=99, character=99)))
        hints = await client.text_document_inlay_hint_async(types.InlayHintParams(
            text_document=doc, range=types.Range(start=types.Position(line=50, character=0),
                                                 end=types.Position(line=90, character=0))))
    assert hover is None
    assert hints is not None and list(hints) == []


@needs_nvcc
async def test_compile_commands_of_the_wrong_shape(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("__global__ void k(int* p) { p[0] = nope; }\n")
    (tmp_path / "compile_commands.json").write_text(json.dumps({"not": "a list"}))
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(client, uri, lambda ds: any("nope" in d.message for d in ds))
        messages = [m.message for m in client.messages]
    assert any("must be a JSON array" in m for m in messages)
    assert diagnostics
