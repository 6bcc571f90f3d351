"""Code lens per kernel: only known facts, and a click that does something."""

from __future__ import annotations

import re
from pathlib import Path

from lsp_helpers import lsp_session, needs_nvcc, open_doc, wait_diagnostics, wait_message
from lsprotocol import types


def _lens_params(uri: str) -> types.CodeLensParams:
    return types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))


async def test_no_lens_while_nothing_is_known(workspace: Path) -> None:
    async with lsp_session(workspace, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        await wait_diagnostics(client, uri)  # the (failed) compile has been published
        lenses = await client.text_document_code_lens_async(_lens_params(uri))
    assert lenses is not None and list(lenses) == []


@needs_nvcc
async def test_lens_shows_resources_and_runs_the_report_command(workspace: Path) -> None:
    async with lsp_session(workspace) as client:
        uri = open_doc(client, workspace / "saxpy.cu")
        await wait_diagnostics(client, uri)
        lenses = await client.text_document_code_lens_async(_lens_params(uri))
        assert lenses is not None
        by_kernel = {lens.command.arguments[1]: lens for lens in lenses if lens.command}
        assert set(by_kernel) == {"saxpy", "scale"}  # kernels only, not the device function
        saxpy = by_kernel["saxpy"]
        assert saxpy.range.start.line == 5
        title = saxpy.command.title
        assert re.search(r"^\d+ regs · 1024 B smem · no spills · occupancy \d+% @256 \(\w+\)$", title), title
        result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command=saxpy.command.command, arguments=saxpy.command.arguments))
        message = await wait_message(client, "launch at line 20")
    assert result is not None and "__global__ void saxpy" in result
    assert "occupancy" in message.message
