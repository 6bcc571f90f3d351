"""documentSymbol through the real server: kernels, device and host functions, hierarchical and flat."""

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
    assert list(by_name) == ["twice", "saxpy", "scale", "run"]  # source order, the host function too
    assert isinstance(by_name["saxpy"], types.DocumentSymbol)
    # Kinds tell kernels, device functions and host functions apart (a device function is no Method).
    assert by_name["saxpy"].kind == by_name["scale"].kind == types.SymbolKind.Event
    assert by_name["twice"].kind == types.SymbolKind.Operator
    assert by_name["run"].kind == types.SymbolKind.Function
    assert "__global__" in (by_name["saxpy"].detail or "")
    assert by_name["run"].detail == "void run(int n, float a, const float* x, float* y)"
    # The selection range is exactly the name; the range spans the whole definition.
    saxpy = by_name["saxpy"]
    lines = SAXPY.splitlines()
    sel = saxpy.selection_range
    assert lines[sel.start.line][sel.start.character:sel.end.character] == "saxpy"
    assert saxpy.range.start.line == sel.start.line and saxpy.range.end.line == sel.start.line + 8
    # __shared__ declarations are children.
    assert [c.name for c in saxpy.children or []] == ["cache"]


MAIN = """\
#include <cstdio>
__device__ __forceinline__ float sq(float v) { return v * v; }

__global__ void reduce(const float* in, float* out) {
    __shared__ float partial[256];
    extern __shared__ float spill[];
    partial[threadIdx.x] = sq(in[threadIdx.x]);
    __syncthreads();
    if (threadIdx.x == 0) { out[blockIdx.x] = partial[0] + spill[0]; }
}

int main() {
    reduce<<<1, 256, 64>>>(nullptr, nullptr);
    return 0;
}
"""


async def test_main_and_shared_arrays_in_the_outline(tmp_path: Path) -> None:
    path = tmp_path / "main.cu"
    path.write_text(MAIN)
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        symbols = await client.text_document_document_symbol_async(
            types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri)))
        # An edit above main moves it (and only re-encodes what changed).
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=1, character=0), end=types.Position(line=1, character=0)),
                text="// moved\n")]))
        moved = await client.text_document_document_symbol_async(
            types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    assert symbols is not None and moved is not None
    assert [(s.name, s.kind) for s in symbols] == [
        ("sq", types.SymbolKind.Operator), ("reduce", types.SymbolKind.Event), ("main", types.SymbolKind.Function)]
    reduce = symbols[1]
    # Shared arrays are the kernel's children, never top-level symbols.
    assert [(c.name, c.kind) for c in reduce.children or []] == [
        ("partial", types.SymbolKind.Variable), ("spill", types.SymbolKind.Variable)]
    main = symbols[2]
    assert (main.range.start.line, main.range.end.line, main.selection_range.start.character) == (11, 14, 4)
    assert [(s.name, s.range.start.line) for s in moved] == [("sq", 2), ("reduce", 4), ("main", 12)]


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
    assert ("saxpy", None) in names and ("cache", "saxpy") in names and ("run", None) in names
    assert all(s.location.uri == uri for s in symbols)


async def test_symbols_of_unknown_document_are_empty(workspace: Path) -> None:
    async with lsp_session(workspace, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        symbols = await client.text_document_document_symbol_async(types.DocumentSymbolParams(
            text_document=types.TextDocumentIdentifier(uri=(workspace / "never_opened.cu").as_uri())
        ))
    assert symbols is not None and list(symbols) == []
