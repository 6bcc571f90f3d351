"""documentSymbol through the real server: kernels and device functions, hierarchical and flat."""

from __future__ import annotations

from pathlib import Path

from lsp_helpers import SAXPY, lsp_session, open_doc
from lsprotocol import types


async def test_hierarchical_symbols(workspace: Path) -> None:
    async with lsp_session(workspace, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        symbols = await client.text_document_document_symbol_async(
            types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
    assert symbols is not None
    by_name = {s.name: s for s in symbols}
    assert list(by_name) == ["twice", "saxpy", "scale"]  # source order
    assert isinstance(by_name["saxpy"], types.DocumentSymbol)
    assert by_name["saxpy"].kind == types.SymbolKind.Function
    assert by_name["twice"].kind == types.SymbolKind.Method  # device function, told apart from kernels
    assert "__global__" in (by_name["saxpy"].detail or "")
    # The selection range is exactly the name; the range spans the whole definition.
    saxpy = by_name["saxpy"]
    lines = SAXPY.splitlines()
    sel = saxpy.selection_range
    assert lines[sel.start.line][sel.start.character:sel.end.character] == "saxpy"
    assert saxpy.range.start.line == sel.start.line and saxpy.range.end.line == sel.start.line + 8
    # __shared__ declarations are children.
    assert [c.name for c in saxpy.children or []] == ["cache"]


async def test_flat_symbols_for_clients_without_hierarchy(workspace: Path) -> None:
    caps = types.ClientCapabilities(text_document=types.TextDocumentClientCapabilities(
        document_symbol=types.DocumentSymbolClientCapabilities(hierarchical_document_symbol_support=False)
    ))
    async with lsp_session(workspace, init_options={"nvccPath": "/nonexistent/nvcc"}, capabilities=caps) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        symbols = await client.text_document_document_symbol_async(
            types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
    assert symbols is not None
    assert all(isinstance(s, types.SymbolInformation) for s in symbols)
    names = [(s.name, s.container_name) for s in symbols]
    assert ("saxpy", None) in names and ("cache", "saxpy") in names
    assert all(s.location.uri == uri for s in symbols)


async def test_symbols_of_unknown_document_are_empty(workspace: Path) -> None:
    async with lsp_session(workspace, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        symbols = await client.text_document_document_symbol_async(types.DocumentSymbolParams(
            text_document=types.TextDocumentIdentifier(uri=(workspace / "never_opened.cu").as_uri())
        ))
    assert symbols is not None and list(symbols) == []
