"""Launch specs that show: the action writes the sidecar, the editor is asked to open it, the .cu's
hint gives way at once, and filling the spec in is seen when the sidecar changes on disk."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fake_tools import EXISTS, GPU_H200, fake_tools_env
from lsp_helpers import SAXPY, lsp_session, open_doc, position_of, wait_diagnostics
from lsprotocol import types

from kernel_lsp.services.profiler import sidecar_path

GPU_ENV = fake_tools_env({"nvidia-smi": GPU_H200, "ncu": EXISTS})
OPTIONS = {"nvccPath": "/nonexistent/nvcc", "watchFiles": False}


def _codes(diagnostics, line: int) -> set[str]:
    return {str(d.code) for d in diagnostics if d.range.start.line == line and d.code}


async def test_create_launch_spec_writes_shows_and_updates_the_hint(workspace: Path) -> None:
    source = workspace / "saxpy.cu"
    sidecar = Path(sidecar_path(str(source), "saxpy"))
    saxpy_line = position_of(SAXPY, "saxpy(int").line
    async with lsp_session(workspace, init_options=OPTIONS, env=GPU_ENV) as client:
        uri = open_doc(client, source)
        before = await wait_diagnostics(client, uri, lambda ds: "no-spec" in _codes(ds, saxpy_line))
        at = position_of(SAXPY, "saxpy(int", 1)
        actions = await client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
            context=types.CodeActionContext(diagnostics=[])))
        action = next(a for a in actions if a.title.startswith("Create launch spec for saxpy"))
        assert isinstance(action, types.Command)
        written = await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command=action.command, arguments=action.arguments))
        # Published again without a save of the .cu: the hint is gone, the unfinished spec is named.
        after = await wait_diagnostics(client, uri, lambda ds: "spec-incomplete" in _codes(ds, saxpy_line))
        spec = json.loads(sidecar.read_text())
        placeholders = json.dumps({k: v for k, v in spec.items() if k != "comment"}).count('"FILL_ME"')

        # The user fills the spec in and saves it: the client reports the change, the warning goes.
        for param in spec["params"]:
            if param.get("value") == "FILL_ME":
                param["value"] = 1024 if param["scalar"].startswith("int") else 2.0
            if param.get("size") == "FILL_ME":
                param["size"] = "n"
        sidecar.write_text(json.dumps(spec))
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[
            types.FileEvent(uri=sidecar.as_uri(), type=types.FileChangeType.Changed)]))
        finished = await wait_diagnostics(client, uri, lambda ds: "spec-incomplete" not in _codes(ds, saxpy_line))
        again = await client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
            context=types.CodeActionContext(diagnostics=[])))
    assert "no-spec" in _codes(before, saxpy_line)
    assert written == sidecar.as_uri()
    assert [d.uri for d in client.shown_documents] == [sidecar.as_uri()]
    assert client.shown_documents[0].take_focus is True
    assert spec["kernel"] == "saxpy" and spec["block"] == [256, 1, 1]
    assert [p["name"] for p in spec["params"]] == ["n", "a", "x", "y"]
    # The title counts exactly the placeholders the file holds.
    # run(n, a, x, y) passes its own parameters: neither values nor sizes can be read.
    assert placeholders == 4
    assert action.title == f"Create launch spec for saxpy ({placeholders} values to fill in)"
    assert "no-spec" not in _codes(after, saxpy_line)
    assert not _codes(finished, saxpy_line) & {"no-spec", "spec-incomplete"}
    assert not any(a.title.startswith("Create launch spec for saxpy") for a in again)
    assert not [m for m in client.messages if "None" in m.message]
    assert any("wrote saxpy.cu.saxpy.spec.json" in m.message for m in client.messages)


async def test_the_sidecar_watch_is_registered(workspace: Path) -> None:
    registrations: list[types.RegistrationParams] = []
    async with lsp_session(workspace, init_options=OPTIONS) as client:
        @client.feature(types.CLIENT_REGISTER_CAPABILITY)
        def register(params: types.RegistrationParams) -> None:
            registrations.append(params)

        open_doc(client, workspace / "saxpy.cu")
        async with asyncio.timeout(30):
            while not registrations:
                await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    (registration,) = registrations[0].registrations
    assert registration.method == types.WORKSPACE_DID_CHANGE_WATCHED_FILES
    assert [w["globPattern"] for w in registration.register_options["watchers"]] == ["**/*.spec.json"]


async def test_an_existing_sidecar_is_never_overwritten(workspace: Path) -> None:
    source = workspace / "saxpy.cu"
    sidecar = Path(sidecar_path(str(source), "scale"))
    async with lsp_session(workspace, init_options=OPTIONS) as client:
        uri = open_doc(client, source)
        await wait_diagnostics(client, uri)
        sidecar.write_text("{}\n")
        written = await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="kernelLsp.createLaunchSpec", arguments=[uri, "scale"]))
    assert written is None and sidecar.read_text() == "{}\n"
    assert any("exists already" in m.message for m in client.messages)
