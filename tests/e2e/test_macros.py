"""Kernels that macros define or fill, through the real server: every kernel in the outline, hover and
lens, and no syntax error on code nvcc compiles (the file below compiles without a message)."""

from __future__ import annotations

from pathlib import Path

from lsp_helpers import hover_text, lsp_session, needs_nvcc, open_doc, position_of, wait_diagnostics
from lsprotocol import types

MACROS = """\
#include <cuda_runtime.h>
#define BLOCK 128
#define GLOBAL __global__
#define BODY out[i] = a[i] + s * b[i];

// Gathers with a fixed stride, one kernel per invocation.
#define STRIDED(NAME, S)                                                          \\
  __global__ void NAME(float *__restrict__ out, const float *__restrict__ in, int n) { \\
    int i = blockIdx.x * blockDim.x + threadIdx.x;                                \\
    if (i < n) out[i] = in[((long long)i * S) % n];                               \\
  }
STRIDED(z_stride2, 2)
STRIDED(z_stride8, 8)

__global__ void axpy(float *out, const float *a, const float *b, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { BODY }
}

GLOBAL void scaled(float *x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}

void run(float *out, const float *a, const float *b, int n) {
  z_stride2<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>(out, a, n);
  axpy<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>(out, a, b, 2.0f, n);
  scaled<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>(out, 0.5f, n);
}
"""
KERNELS = ["z_stride2", "z_stride8", "axpy", "scaled"]


def _kernels(symbols) -> list[str]:
    return [s.name for s in symbols or [] if s.kind == types.SymbolKind.Event]


@needs_nvcc
async def test_macro_defined_kernels_and_statement_macros_are_seen_without_errors(tmp_path: Path) -> None:
    path = tmp_path / "macros.cu"
    path.write_text(MACROS)
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, path)
        doc = types.TextDocumentIdentifier(uri=uri)
        symbols = await client.text_document_document_symbol_async(types.DocumentSymbolParams(text_document=doc))
        # Published once nvcc has compiled the file (with its register counts).
        diagnostics = await wait_diagnostics(client, uri)
        stride = await client.text_document_hover_async(types.HoverParams(
            text_document=doc, position=position_of(MACROS, "z_stride8, 8", 2)))
        scaled = await client.text_document_hover_async(types.HoverParams(
            text_document=doc, position=position_of(MACROS, "scaled(float", 1)))
        lenses = await client.text_document_code_lens_async(types.CodeLensParams(text_document=doc))
    assert _kernels(symbols) == KERNELS
    by_name = {s.name: s for s in symbols}
    # A kernel a macro invocation defines is at the invocation; its name where the invocation writes it.
    invocation = position_of(MACROS, "STRIDED(z_stride8").line
    selected = by_name["z_stride8"].selection_range
    assert by_name["z_stride8"].range.start.line == invocation == selected.start.line
    assert MACROS.splitlines()[invocation][selected.start.character:selected.end.character] == "z_stride8"
    # nvcc compiles the file: no error, no warning, and none of tree-sitter's misreadings of the macros.
    assert [(d.source, d.message) for d in diagnostics] == []
    assert "__global__ void z_stride8(float*__restrict__ out, const float*__restrict__ in, int n)" in hover_text(stride)
    assert "Registers" in hover_text(stride)
    assert "__global__ void scaled(float* x, float s, int n)" in hover_text(scaled)
    lens_lines = {lens.range.start.line for lens in lenses or []}
    assert {by_name[name].range.start.line for name in KERNELS} <= lens_lines


async def test_a_macro_edit_is_seen_and_a_real_error_still_shows(tmp_path: Path) -> None:
    path = tmp_path / "macros.cu"
    path.write_text(MACROS)
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        doc = types.TextDocumentIdentifier(uri=uri)
        before = await client.text_document_document_symbol_async(types.DocumentSymbolParams(text_document=doc))
        # A third invocation typed in, and a statement macro whose expansion is wrong.
        line = position_of(MACROS, "STRIDED(z_stride8").line + 1
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=line, character=0),
                                  end=types.Position(line=line, character=0)),
                text="STRIDED(z_stride32, 32)\n"),
                types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=3, character=0), end=types.Position(line=4, character=0)),
                text="#define BODY out[i] = a[i] + ;\n")]))
        after = await client.text_document_document_symbol_async(types.DocumentSymbolParams(text_document=doc))
        diagnostics = await wait_diagnostics(client, uri, lambda ds: any("tree-sitter" in (d.source or "") for d in ds))
    assert _kernels(before) == KERNELS
    assert _kernels(after) == ["z_stride2", "z_stride8", "z_stride32", "axpy", "scaled"]
    # The expansion of `{ BODY }` is wrong now: its error shows, on the line that uses the macro.
    body_line = position_of(MACROS, "{ BODY }").line + 1
    assert {d.range.start.line for d in diagnostics if "tree-sitter" in (d.source or "")} == {body_line}
