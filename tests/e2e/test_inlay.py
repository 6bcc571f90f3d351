"""Inlay hints: registers after kernel names, occupancy after launches (once nvcc ran)."""

from __future__ import annotations

import re
from pathlib import Path

from lsp_helpers import SAXPY, lsp_session, needs_nvcc, open_doc, wait_diagnostics
from lsprotocol import types


def _params(uri: str, last_line: int) -> types.InlayHintParams:
    return types.InlayHintParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        range=types.Range(start=types.Position(line=0, character=0), end=types.Position(line=last_line, character=0)),
    )


@needs_nvcc
async def test_inlay_hints_after_compile(workspace: Path) -> None:
    async with lsp_session(workspace) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        await wait_diagnostics(client, uri)
        hints = await client.text_document_inlay_hint_async(_params(uri, 100))
        first_lines_only = await client.text_document_inlay_hint_async(_params(uri, 10))
    assert hints is not None
    labels = {(h.position.line, h.position.character): h.label for h in hints}
    lines = SAXPY.splitlines()
    # After the name "saxpy" on line 5 (character 21), and after each launch expression (lines 19, 20).
    assert re.fullmatch(r"\d+ regs · 1024 B smem", labels[(5, 21)])
    for line in (19, 20):
        launch_hints = [(col, label) for (at, col), label in labels.items() if at == line]
        assert len(launch_hints) == 1 and re.fullmatch(r"occ \d+% \(\w+\)", launch_hints[0][1])
        assert launch_hints[0][0] == lines[line].rindex(")") + 1  # right after the launch's closing parenthesis
    assert first_lines_only is not None and all(h.position.line <= 10 for h in first_lines_only)


async def test_no_inlay_hints_without_compiler(workspace: Path) -> None:
    async with lsp_session(workspace, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        await wait_diagnostics(client, uri)
        hints = await client.text_document_inlay_hint_async(_params(uri, 100))
    assert hints is not None and list(hints) == []
