"""The protocol's futures table: what pygls 2.1.1 keeps per notification, and cancelling."""

from __future__ import annotations

import asyncio
import json

from kernel_lsp.server.server import create_server

TEXT = "__global__ void k(float* a) { a[0] = 1.0f; }\n"


def _message(method: str, params, msg_id=None):
    """A parsed incoming message, as pygls's reader hands it to ``handle_message``."""
    payload = {"jsonrpc": "2.0", "method": method, "params": params}
    if msg_id is not None:
        payload["id"] = msg_id
    server = _message.server  # type: ignore[attr-defined]
    return json.loads(json.dumps(payload), object_hook=server.protocol.structure_message)


async def _drive(edits: int) -> tuple[int, int]:
    server = create_server()
    _message.server = server  # type: ignore[attr-defined]
    protocol = server.protocol
    protocol.writer = type("W", (), {"write": lambda self, data: None})()
    state = server.state
    protocol.handle_message(_message("initialize", {"processId": None, "rootUri": None, "capabilities": {}}, msg_id=1))
    await asyncio.sleep(0.05)
    uri = "file:///tmp/table.cu"
    protocol.handle_message(_message("textDocument/didOpen", {"textDocument": {
        "uri": uri, "languageId": "cuda", "version": 1, "text": TEXT}}))
    await asyncio.sleep(0.05)
    for version in range(2, edits + 2):
        protocol.handle_message(_message("textDocument/didChange", {
            "textDocument": {"uri": uri, "version": version},
            "contentChanges": [{"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}},
                                "text": ""}]}))
        if version % 100 == 0:
            await asyncio.sleep(0)
    for _ in range(50):
        await asyncio.sleep(0)
    peak_table = len(protocol._request_futures)
    state.jobs.shutdown()
    return peak_table, state.documents.get(uri).version


def test_notifications_leave_no_futures_behind() -> None:
    table, version = asyncio.run(_drive(2000))
    assert version == 2001  # every edit was applied
    # pygls 2.1.1 alone keeps two entries per notification (its built-in handler's and ours): 4,002 here.
    assert table <= 2, table


def test_cancel_of_an_answered_request_is_quiet(caplog) -> None:
    server = create_server()
    server.protocol._handle_cancel_notification(99)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
