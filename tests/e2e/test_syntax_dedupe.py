"""A syntax error both nvcc and tree-sitter see is shown once: nvcc's message."""

from __future__ import annotations

from pathlib import Path

from lsp_helpers import lsp_session, needs_nvcc, open_doc, wait_diagnostics
from lsprotocol import types

BROKEN = """\
__global__ void k(float* p) {
    float x = ;
    p[0] = x;
}
"""
TREE_SITTER = "kernel-lsp (tree-sitter)"


@needs_nvcc
async def test_tree_sitter_hint_dropped_where_nvcc_reports_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.cu"
    path.write_text(BROKEN)
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(
            client, uri, lambda ds: any(d.severity == types.DiagnosticSeverity.Error for d in ds))
    errors = [d for d in diagnostics if d.severity == types.DiagnosticSeverity.Error]
    assert errors and all(d.source == "nvcc" for d in errors)
    assert {d.range.start.line for d in errors} == {1}
    assert not [d for d in diagnostics if d.source == TREE_SITTER and d.range.start.line == 1]


async def test_tree_sitter_hint_stays_without_nvcc(tmp_path: Path) -> None:
    path = tmp_path / "broken.cu"
    path.write_text(BROKEN)
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        diagnostics = await wait_diagnostics(client, uri, lambda ds: any(d.source == TREE_SITTER for d in ds))
    assert [d.range.start.line for d in diagnostics if d.source == TREE_SITTER] == [1]
