"""Long sessions: no memory kept per notification, and ``$/cancelRequest`` cancels a running request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsp_helpers import SAXPY, lsp_session, open_doc
from lsprotocol import types

EDITS = 20_000
#: Edits before the first measurement, so that caches, the allocator and the parse tree have settled.
WARM_UP = 20_000


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def edit(client, uri: str, version: int) -> None:
    # Type one character at the end of line 0 and delete it again: the text stays the same size.
    text = "x" if version % 2 else ""
    end = 1 if not version % 2 else 0
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=0, character=0), end=types.Position(line=0, character=end)),
            text=text,
        )],
    ))


async def settle(client, uri: str) -> None:
    """A request answered after every earlier notification was handled (messages are handled in order)."""
    await client.text_document_document_symbol_async(types.DocumentSymbolParams(
        text_document=types.TextDocumentIdentifier(uri=uri)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read the server's RSS")
async def test_20000_edits_do_not_grow_memory(tmp_path: Path) -> None:
    path = tmp_path / "saxpy.cu"
    path.write_text(SAXPY)
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        pid = client._server.pid  # type: ignore[union-attr]
        uri = open_doc(client, path)
        version = 1
        # The warm-up is as long as the measured run: a burst at machine speed queues messages faster
        # than the server handles them, and the allocator keeps that peak; growth after it is the leak.
        for n in range(WARM_UP):
            version += 1
            edit(client, uri, version)
            if n % 1000 == 999:
                await asyncio.sleep(0)
        await settle(client, uri)

        async def window() -> tuple[int, int]:
            nonlocal version
            before = rss_kb(pid)
            for n in range(EDITS):
                version += 1
                edit(client, uri, version)
                if n % 1000 == 999:
                    await asyncio.sleep(0)  # let the client's writer drain
            await settle(client, uri)
            return before, rss_kb(pid)

        # Two measured windows: a leak grows the RSS in both, the allocator's noise (a burst's queue
        # landing in fresh pages on a loaded machine) in one at most.
        windows = [await window(), await window()]
    growths = [after - before for before, after in windows]
    for (before, after), growth_kb in zip(windows, growths):
        print(f"RSS over {EDITS} edits: {before / 1024:.1f} -> {after / 1024:.1f} MB ({growth_kb / EDITS * 1024:.0f} B/edit)")
    # pygls 2.1.1 kept one future per notification: ~2.7 KB each, 54 MB over 20,000 edits.
    assert min(growths) < 8 * 1024, f"RSS grew {growths} KB over each of two runs of {EDITS} edits"


def big_source(kernels: int) -> str:
    unit = "__global__ void k{n}(float* a, int n) {{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] *= 2.0f; }}\n"
    return "".join(unit.format(n=n) for n in range(kernels))


async def test_cancel_request_cancels_the_running_request(tmp_path: Path) -> None:
    path = tmp_path / "big.cu"
    # ~1.5 MB: indexed on a worker thread, so the request is still running when the cancel arrives.
    path.write_text(big_source(14_000))
    async with lsp_session(tmp_path, init_options={"nvccPath": "/nonexistent/nvcc"}) as client:
        uri = open_doc(client, path)
        params = types.DocumentSymbolParams(text_document=types.TextDocumentIdentifier(uri=uri))
        pending = asyncio.ensure_future(
            client.protocol.send_request_async(types.TEXT_DOCUMENT_DOCUMENT_SYMBOL, params, msg_id=4242))
        await asyncio.sleep(0)  # one turn of the loop: pytest-lsp's coroutine writes the request
        client.cancel_request(types.CancelParams(id=4242))
        with pytest.raises(Exception) as raised:
            await asyncio.wait_for(pending, 60)
        assert "cancel" in str(raised.value).lower()
        # The server goes on answering; the same request without a cancel gets its symbols.
        symbols = await client.text_document_document_symbol_async(params)
        assert symbols is not None and len(symbols) >= 14_000
