"""Views that stay true: lenses and hints refresh when a compile publishes, keep the last good
numbers (marked stale) while compiles fail, and a kernel written since the last compile says so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs
from lsp_helpers import SAXPY, hover_text, lsp_session, needs_nvcc, open_doc, position_of, wait_diagnostics
from lsprotocol import types
from pytest_lsp import client_capabilities

#: VS Code's capabilities (as pytest-lsp records them) plus inlay hint refresh, which VS Code has too.
_VSCODE = client_capabilities("visual-studio-code")
CAPABILITIES = attrs.evolve(_VSCODE, workspace=attrs.evolve(
    _VSCODE.workspace, inlay_hint=types.InlayHintWorkspaceClientCapabilities(refresh_support=True)))
NEW_KERNEL = "__global__ void fresh(float* p) { p[threadIdx.x] = 0.0f; }\n"


def _lens_params(uri: str) -> types.CodeLensParams:
    return types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))


def _titles(lenses) -> dict[str, str]:
    return {lens.command.arguments[1]: lens.command.title for lens in lenses or [] if lens.command}


@needs_nvcc
async def test_lenses_refresh_go_stale_on_a_failed_compile_and_name_new_kernels(workspace: Path) -> None:
    path = workspace / "saxpy.cu"
    refreshes: list[str] = []
    async with lsp_session(workspace, capabilities=CAPABILITIES) as client:
        @client.feature(types.WORKSPACE_CODE_LENS_REFRESH)
        def lens_refresh(params: None) -> None:
            refreshes.append("codeLens")

        @client.feature(types.WORKSPACE_INLAY_HINT_REFRESH)
        def inlay_refresh(params: None) -> None:
            refreshes.append("inlayHint")

        uri = open_doc(client, path)
        # Asked at once after opening: the answer waits for the first compile instead of being empty.
        first = await client.text_document_code_lens_async(_lens_params(uri))
        await wait_diagnostics(client, uri)
        async with asyncio.timeout(30):
            while not {"codeLens", "inlayHint"} <= set(refreshes):
                await asyncio.sleep(0.05)

        # A compile error elsewhere: every kernel keeps its numbers, marked stale.
        broken = SAXPY.replace("return 2.0f * v;", "return 2.0f * undefined_name;")
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=broken)]))
        client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
        await wait_diagnostics(client, uri, lambda ds: any(d.severity == types.DiagnosticSeverity.Error for d in ds))
        stale = await client.text_document_code_lens_async(_lens_params(uri))
        stale_hover = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=position_of(broken, "saxpy(int", 1)))
        hints = await client.text_document_inlay_hint_async(types.InlayHintParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(start=types.Position(line=0, character=0), end=types.Position(line=100, character=0))))

        # A kernel typed since (not saved): it says it was not compiled, not "ptxas reported nothing".
        edited = broken + NEW_KERNEL
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=3),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=edited)]))
        new_lenses = await client.text_document_code_lens_async(_lens_params(uri))
        new_hover = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=position_of(edited, "fresh", 1)))
    assert set(_titles(first)) == {"saxpy", "scale"} and "regs" in _titles(first)["saxpy"]
    assert all(t.endswith("(stale: the last compile failed)") and "regs" in t for t in _titles(stale).values())
    assert "regs per thread" not in hover_text(stale_hover)
    assert "Stale: the last compile failed" in hover_text(stale_hover) and "per thread" in hover_text(stale_hover)
    assert any(str(h.label).endswith("(stale)") for h in hints or [])
    assert _titles(new_lenses)["fresh"] == "not compiled since the last edit"
    assert "not compiled since the last edit" in hover_text(new_hover)
