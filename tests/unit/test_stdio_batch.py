"""The stdio loop parses a run of didChange bodies in one go, and falls back body by body."""

from __future__ import annotations

import json

from kernel_lsp.server.stdio import _parsed_changes


def _change(i: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": "textDocument/didChange",
                       "params": {"textDocument": {"uri": "file:///a.cu", "version": i},
                                  "contentChanges": [{"text": str(i)}]}}).encode()


def test_runs_of_changes_are_parsed_by_position() -> None:
    hover = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "textDocument/hover", "params": {}}).encode()
    bodies = [_change(0), _change(1), hover, _change(2)]
    parsed = _parsed_changes(bodies)
    assert sorted(parsed) == [0, 1, 3]
    assert [parsed[i]["params"]["textDocument"]["version"] for i in (0, 1, 3)] == [0, 1, 2]


def test_a_malformed_body_spoils_only_itself() -> None:
    # Alone it is no JSON value; joined into an array it would read as two and shift the rest.
    two_values = b'"textDocument/didChange",2'
    bodies = [_change(0), two_values, _change(2), b'{"textDocument/didChange": ', _change(4)]
    parsed = _parsed_changes(bodies)
    assert parsed[1] is None and parsed[3] is None
    assert [parsed[i]["params"]["textDocument"]["version"] for i in (0, 2, 4)] == [0, 2, 4]
