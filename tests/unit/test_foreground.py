"""Background work gives way to the event loop while it handles messages: the stdin reader marks the
loop busy when bytes arrive and idle once they are handled; a worker's yield point waits meanwhile."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from kernel_lsp.core.parse import ParsedDocument
from kernel_lsp.server import foreground
from kernel_lsp.server.foreground import Foreground
from kernel_lsp.server.stdio import MessageReader


def _yielding_worker(fg: Foreground) -> tuple[threading.Thread, threading.Event, threading.Event]:
    started, returned = threading.Event(), threading.Event()

    def work() -> None:
        started.set()
        fg.give_way()
        returned.set()

    thread = threading.Thread(target=work)
    thread.start()
    return thread, started, returned


def test_a_worker_waits_while_the_loop_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(foreground, "MAX_PAUSE_S", 30.0)
    fg = Foreground()
    fg.busy()
    thread, started, returned = _yielding_worker(fg)
    assert started.wait(5)
    assert not returned.wait(0.05)
    fg.idle()
    assert returned.wait(5)
    thread.join()


def test_no_wait_when_idle_or_on_the_loop_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(foreground, "MAX_PAUSE_S", 30.0)
    fg = Foreground()
    thread, _, returned = _yielding_worker(fg)
    assert returned.wait(5)
    thread.join()
    fg.bind()
    fg.busy()
    fg.give_way()  # the loop's own thread (a small document indexed inline) never waits on itself


def test_a_pause_is_bounded_and_runs_out_once_per_busy_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(foreground, "MAX_PAUSE_S", 0.01)
    fg = Foreground()
    fg.busy()
    thread, _, returned = _yielding_worker(fg)
    assert returned.wait(5)  # the loop never went idle
    thread.join()
    # The loop is still busy (or blocked on a lock the work holds): later yield points go on at once.
    monkeypatch.setattr(foreground, "MAX_PAUSE_S", 30.0)
    thread, _, returned = _yielding_worker(fg)
    assert returned.wait(5)
    thread.join()
    fg.busy()  # the same busy period
    thread, _, returned = _yielding_worker(fg)
    assert returned.wait(5)
    thread.join()
    # A new busy period pauses again.
    fg.idle()
    fg.busy()
    thread, started, returned = _yielding_worker(fg)
    assert started.wait(5) and not returned.wait(0.05)
    fg.idle()
    assert returned.wait(5)
    thread.join()


def test_a_reparse_gives_way_and_gives_the_same_tree() -> None:
    calls: list[int] = []
    source = "".join(f"__global__ void k{i}(float* x) {{ x[{i}] = {i}.0f; }}\n" for i in range(300))
    parsed = ParsedDocument(source, give_way=lambda: calls.append(1))
    assert calls  # tree-sitter's progress callback reached it
    calls.clear()
    parsed.apply_edit(150, 0, 150, 0, "__global__ void typed(float* x) { for (int k", defer=True)
    edited = parsed.tree
    assert calls
    assert str(edited.root_node) == str(ParsedDocument(parsed.source_bytes).tree.root_node)


def _message(method: str) -> bytes:
    body = b'{"jsonrpc":"2.0","method":"%s","params":{}}' % method.encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


async def test_the_reader_marks_the_loop_busy_until_what_arrived_is_handled() -> None:
    fg = Foreground()
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb", buffering=0) as stream:
        reader = MessageReader(stream, fg)
        os.write(write_end, _message("initialized"))
        assert len(await reader.messages()) == 1
        assert fg.is_busy  # the loop is handling it
        waiting = asyncio.ensure_future(reader.messages())
        for _ in range(3):
            await asyncio.sleep(0)
        assert not fg.is_busy  # nothing buffered: background work may go on
        os.write(write_end, _message("textDocument/didSave"))
        assert len(await asyncio.wait_for(waiting, 5)) == 1
        assert fg.is_busy
        os.close(write_end)
        assert await asyncio.wait_for(reader.messages(), 5) is None
