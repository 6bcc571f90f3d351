"""``workspace/executeCommand`` always answers: a client whose reply to ``window/showDocument`` fails or
does not have a ``ShowDocumentResult``'s shape still gets the command's result, and the sidecar is written."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from lsp_helpers import lsp_session, open_doc, wait_diagnostics
from lsprotocol import types

from kernel_lsp.server.profiling import CREATE_SPEC_COMMAND, SHOW_DOCUMENT_TIMEOUT_S
from kernel_lsp.services.profiler import sidecar_path

OPTIONS = {"nvccPath": "/nonexistent/nvcc", "watchFiles": False}


def _garbage(params: types.ShowDocumentParams) -> Any:
    return "not a ShowDocumentResult"


def _missing_field(params: types.ShowDocumentParams) -> Any:
    return {"shown": True}


def _list(params: types.ShowDocumentParams) -> Any:
    return [True]


def _fails(params: types.ShowDocumentParams) -> Any:
    raise RuntimeError("the editor cannot open it")


@pytest.mark.parametrize("reply", [_garbage, _missing_field, _list, _fails],
                         ids=["string", "missing-field", "list", "error"])
async def test_execute_command_answers_whatever_show_document_replies(workspace: Path, reply) -> None:
    source = workspace / "saxpy.cu"
    sidecar = Path(sidecar_path(str(source), "saxpy"))
    replies: list[str] = []
    async with lsp_session(workspace, init_options=OPTIONS) as client:
        def show_document(params: types.ShowDocumentParams) -> Any:
            replies.append(params.uri)
            return reply(params)

        # In place of pytest-lsp's own handler, which answers success.
        client.protocol.fm.features[types.WINDOW_SHOW_DOCUMENT] = show_document

        uri = open_doc(client, source)
        await wait_diagnostics(client, uri)
        # Well inside the command's own wait for the reply: the answer must not come from that timeout.
        async with asyncio.timeout(SHOW_DOCUMENT_TIMEOUT_S * 0.6):
            written = await client.workspace_execute_command_async(types.ExecuteCommandParams(
                command=CREATE_SPEC_COMMAND, arguments=[uri, "saxpy"]))
        # The server is still serving.
        hover = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=5, character=17)))
    assert replies == [sidecar.as_uri()]
    assert written == sidecar.as_uri() and sidecar.is_file()
    # Not shown by the editor: the message names the file's path instead.
    assert any("wrote saxpy.cu.saxpy.spec.json" in m.message and str(sidecar) in m.message for m in client.messages)
    assert hover is not None
