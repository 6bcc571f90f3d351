"""The stdio message loop: large reads, and runs of ``didChange`` applied as one.

pygls 2 reads stdin through ``run_in_executor`` for every header line and every
body (three trips to a worker thread per message) and then structures and
dispatches each message on its own. A client that sends one ``didChange`` per
keystroke makes a burst of 1,000 keystrokes (a macro, a paste typed out, a
client catching up) cost ~0.3 ms a message before the server even sees the
request that follows it.

Here one thread reads stdin in large chunks and the event loop takes every
complete message already buffered at once. Consecutive ``didChange``
notifications for one document (nothing else between them) become one
notification whose changes are the concatenation of theirs, in order, with
each insertion that starts where the previous insertion ended joined to it
(typing); it carries the last version. Applying it leaves the document
exactly where applying them one by one would (LSP applies a notification's
changes in order). Every other message goes through pygls unchanged
(``protocol.handle_message``), in the order received.

A document notification larger than :data:`MAX_BODY_BYTES` is not decoded at
all: its method, URI and version are read from the raw JSON (an unescaped quote
cannot occur inside a JSON string, so ``"uri":"`` there is the key) and handed to
``on_unread`` instead; the text is left unread (decoding 50 MB held the loop
0.2 s, for a text over the compile budget that nothing would be done with).

Order: after each message other than a ``didChange``, the loop gives the
event loop a turn, so its handler starts (a ``didOpen`` registers its document,
a request reads the text it was sent for) before later edits apply; every
:data:`YIELD_EVERY` messages it gives one anyway, so tasks already running and
job results are not held up by a long stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

from kernel_lsp.core.budgets import MAX_COMPILE_BYTES
from kernel_lsp.server.foreground import Foreground

log = logging.getLogger(__name__)

#: Bytes asked of one ``os.read``.
CHUNK_BYTES = 1 << 20
#: Messages dispatched between two turns given to the event loop.
YIELD_EVERY = 64
DID_CHANGE = "textDocument/didChange"
_DID_CHANGE_BYTES = b'"textDocument/didChange"'
_CONTENT_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)
#: Message bodies above this many bytes are not decoded (a document's text over the compile budget).
MAX_BODY_BYTES = MAX_COMPILE_BYTES
_UNREAD_METHODS = ("textDocument/didOpen", "textDocument/didChange", "textDocument/didSave")
_KEY = {key: re.compile(rb'"' + key.encode() + rb'"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)')
        for key in ("method", "uri", "version", "id")}


#: Bytes one search of a large body looks at before the loop gets a turn (a few ms each).
_WINDOW_BYTES = 4 << 20
_OVERLAP_BYTES = 1 << 16


class Unread:
    """A message body over :data:`MAX_BODY_BYTES`, kept where it was read (no copy, not decoded)."""

    def __init__(self, data: bytearray, start: int, end: int) -> None:
        self._data, self._start, self._end = data, start, end

    @property
    def size_bytes(self) -> int:
        return self._end - self._start

    def body(self) -> bytes:
        return bytes(memoryview(self._data)[self._start : self._end])

    async def _search(self, pattern: re.Pattern[bytes]) -> re.Match[bytes] | None:
        """``pattern``'s first match, searched a window at a time with a turn for the loop in between."""
        pos = self._start
        while pos < self._end:
            found = pattern.search(self._data, pos, min(self._end, pos + _WINDOW_BYTES + _OVERLAP_BYTES))
            if found is not None:
                return found
            pos += _WINDOW_BYTES
            await asyncio.sleep(0)
        return None

    async def fields(self) -> tuple[str, str, int | None] | None:
        """(method, uri, version) of a document notification, read from the raw JSON (see the module
        docstring); None when the body is not one (a request has an id: it is decoded as usual)."""
        found = {key: await self._search(pattern) for key, pattern in _KEY.items()}
        if found["id"] is not None or found["method"] is None or found["uri"] is None:
            return None
        try:
            method, uri = json.loads(found["method"].group(1)), json.loads(found["uri"].group(1))
            version = json.loads(found["version"].group(1)) if found["version"] is not None else None
        except ValueError:
            return None
        if method not in _UNREAD_METHODS or not isinstance(uri, str):
            return None
        return method, uri, version if isinstance(version, int) else None


class MessageReader:
    """Complete message bodies from a byte stream read by one thread.

    ``foreground`` (optional) is marked busy as soon as bytes arrive, before the loop sees them, and
    idle when the loop has handled every complete message and waits for more (see
    :mod:`kernel_lsp.server.foreground`).
    """

    def __init__(self, stream: BinaryIO, foreground: Foreground | None = None) -> None:
        self._fd = stream.fileno()
        self._buffer = bytearray()
        self._eof = False
        self._data = asyncio.Event()
        self._thread: threading.Thread | None = None
        self._foreground = foreground

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        foreground = self._foreground

        def read_forever() -> None:
            while True:
                try:
                    chunk = os.read(self._fd, CHUNK_BYTES)
                except OSError as exc:
                    log.error("reading stdin failed: %s", exc)
                    chunk = b""
                if chunk and foreground is not None:
                    foreground.busy()
                try:
                    loop.call_soon_threadsafe(self._feed, chunk)
                except RuntimeError:  # the loop is closed: the server is gone
                    return
                if not chunk:
                    return

        self._thread = threading.Thread(target=read_forever, name="kernel-lsp-stdin", daemon=True)
        self._thread.start()

    def _feed(self, chunk: bytes) -> None:
        if chunk:
            self._buffer += chunk
            if self._foreground is not None:
                # Again on the loop, for a chunk read while the loop was going idle.
                self._foreground.busy()
        else:
            self._eof = True
        self._data.set()

    def _take(self) -> list[bytes | Unread]:
        bodies: list[bytes | Unread] = []
        buffer = self._buffer
        pos = 0
        while True:
            header_end = buffer.find(b"\r\n\r\n", pos)
            if header_end < 0:
                break
            match = _CONTENT_LENGTH.search(buffer, pos, header_end)
            if match is None:
                log.error("message without Content-Length skipped: %r", bytes(buffer[pos:header_end])[:200])
                pos = header_end + 4
                continue
            start = header_end + 4
            end = start + int(match.group(1))
            if end > len(buffer):
                break
            if end - start > MAX_BODY_BYTES:
                # Left where it is: the rest of the stream goes on in a buffer of its own.
                bodies.append(Unread(buffer, start, end))
                self._buffer = buffer = bytearray(memoryview(buffer)[end:])
                pos = 0
                continue
            bodies.append(bytes(buffer[start:end]))
            pos = end
        del buffer[:pos]
        return bodies

    async def messages(self) -> list[bytes | Unread] | None:
        """Every complete message buffered now (waiting for one if none is); None at the end of input."""
        if self._thread is None:
            self._start()
        while True:
            bodies = self._take()
            if bodies:
                return bodies
            if self._eof:
                return None
            self._data.clear()
            if self._foreground is not None:
                # Queued behind what the handlers of the last messages scheduled (a quick hover's
                # answer is written first).
                asyncio.get_running_loop().call_soon(self._idle_unless_fed)
            await self._data.wait()

    def _idle_unless_fed(self) -> None:
        # A chunk fed since the loop ran out of messages (its _feed was queued first) keeps it busy.
        if self._foreground is not None and not self._data.is_set():
            self._foreground.idle()


def _utf16_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-16-le")) // 2


def _insert_end(start: dict[str, int], text: str) -> dict[str, int]:
    """Where the cursor is after inserting ``text`` at ``start`` (LSP positions)."""
    newlines = text.count("\n")
    if newlines:
        return {"line": start["line"] + newlines, "character": _utf16_len(text[text.rfind("\n") + 1 :])}
    return {"line": start["line"], "character": start["character"] + _utf16_len(text)}


def _is_insert(change: dict[str, Any]) -> bool:
    rng = change.get("range")
    return rng is not None and rng["start"] == rng["end"]


def merge_changes(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The changes in order, an insertion that starts where the previous one ended joined to it."""
    out: list[dict[str, Any]] = []
    for change in changes:
        if out and _is_insert(change) and _is_insert(out[-1]):
            last = out[-1]
            if change["range"]["start"] == _insert_end(last["range"]["start"], last["text"]):
                last["text"] += change["text"]
                continue
        if "range" in change:
            change = {"range": change["range"], "text": change["text"]}
        out.append(change)
    return out


def _coalesced(run: list[dict[str, Any]]) -> dict[str, Any]:
    changes = [change for message in run for change in message["params"]["contentChanges"]]
    last = run[-1]
    return {"jsonrpc": last.get("jsonrpc", "2.0"), "method": DID_CHANGE,
            "params": {"textDocument": last["params"]["textDocument"], "contentChanges": merge_changes(changes)}}


def _uri(message: dict[str, Any]) -> Any:
    return message.get("params", {}).get("textDocument", {}).get("uri")


def _parsed_changes(bodies: list[bytes | Unread]) -> dict[int, Any]:
    """The bodies that may be ``didChange`` notifications, parsed, by position (None: not JSON).

    A burst of keystrokes is hundreds of small bodies in a row: one ``json.loads`` of them joined
    into an array costs ~40 % less than one call each (the burst is read before the request that
    follows it can be answered). A run holding a malformed body is parsed body by body, each one that
    is not JSON None.
    """
    positions = [i for i, body in enumerate(bodies) if isinstance(body, bytes) and _DID_CHANGE_BYTES in body]
    parsed: dict[int, Any] = {}
    start = 0
    while start < len(positions):
        end = start + 1
        while end < len(positions) and positions[end] == positions[end - 1] + 1:
            end += 1
        run = positions[start:end]
        try:
            values = json.loads(b"[" + b",".join(bodies[i] for i in run) + b"]")  # type: ignore[misc]
        except ValueError:
            values = None
        if not isinstance(values, list) or len(values) != len(run):  # e.g. a body "1,2": two values joined
            values = []
            for i in run:
                try:
                    values.append(json.loads(bodies[i]))
                except ValueError:
                    values.append(None)
        parsed.update(zip(run, values))
        start = end
    return parsed


async def serve(
    stream: BinaryIO,
    protocol: Any,
    stop_event: threading.Event,
    error_handler: Callable[[Exception, type], Any] | None = None,
    foreground: Foreground | None = None,
    on_unread: Callable[[str, str, int | None, int], None] | None = None,
) -> None:
    """Read messages from ``stream`` and hand them to pygls's ``protocol`` until EOF or ``stop_event``;
    ``foreground``: see :class:`MessageReader`; ``on_unread(method, uri, version, size_bytes)`` takes the
    document notifications over :data:`MAX_BODY_BYTES` (decoded as usual when it is None)."""
    from pygls.exceptions import JsonRpcException

    if foreground is not None:
        foreground.bind()
    reader = MessageReader(stream, foreground)

    def dispatch(message: Any) -> None:
        try:
            protocol.handle_message(message)
        except Exception as exc:
            log.exception("unable to handle a message")
            if error_handler is not None:
                error_handler(exc, JsonRpcException)

    while not stop_event.is_set():
        bodies = await reader.messages()
        if bodies is None:
            break
        run: list[dict[str, Any]] = []
        changes = _parsed_changes(bodies)
        for position, body in enumerate(bodies):
            if position and position % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if position in changes:
                raw = changes[position]
                if isinstance(raw, dict) and raw.get("method") == DID_CHANGE and "id" not in raw:
                    if run and _uri(run[-1]) != _uri(raw):
                        dispatch(protocol.structure_message(_coalesced(run)))
                        run = []
                    run.append(raw)
                    continue
            if run:
                dispatch(protocol.structure_message(_coalesced(run)))
                run = []
            if isinstance(body, Unread):
                fields = await body.fields() if on_unread is not None else None
                if fields is not None and on_unread is not None:
                    on_unread(*fields, body.size_bytes)
                    await asyncio.sleep(0)
                    continue
                body = body.body()
            try:
                message = json.loads(body, object_hook=protocol.structure_message)
            except Exception as exc:
                log.exception("unable to read a message")
                if error_handler is not None:
                    error_handler(exc, JsonRpcException)
                continue
            dispatch(message)
            # Its handler (a task, for async handlers) takes its first step before the edits after
            # it apply: a didOpen registers its document, a request sees the text it was sent for.
            await asyncio.sleep(0)
            if stop_event.is_set():
                return
        if run:
            dispatch(protocol.structure_message(_coalesced(run)))
