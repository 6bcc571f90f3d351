"""``textDocument/documentSymbol``: kernels, device functions and host functions, hierarchical.

Every function definition is a symbol, and its kind says where it runs, so an
outline tells them apart at a glance:

* a ``__global__`` kernel is an **Event** (it is launched, ``<<< >>>``; launches
  inside a kernel, dynamic parallelism, are its children with the same kind);
* a ``__device__`` (or ``__host__ __device__``) function is an **Operator**
  (it runs on the GPU, called from kernels; not a Method: it belongs to no class);
* a host function (``main``, launch wrappers) is a **Function**, as clangd names it.

A kernel's or device function's ``__shared__`` declarations are its children
(Variable). Host-side launch sites are not symbols: hover and code lens cover
them, and listing every launch would double the outline of a big file. Clients
without hierarchical support get a flat ``SymbolInformation`` list, each child
with its function as ``containerName``.

Speed: the answer is built as plain JSON values (no lsprotocol objects, no
cattrs) and cached per document version as :class:`RawJson`, so a repeated
request costs one write. On an all-ASCII document UTF-8 byte columns are UTF-16
columns and spans convert without looking at the text. After an edit, the
hierarchical answer re-encodes only the functions whose symbol can have changed:
each function's encoded symbol is kept from one version to the next, keyed by
everything it is made of (see :func:`_fragment_key`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from operator import itemgetter
from typing import Any, NamedTuple

from lsprotocol import types

from kernel_lsp.core.index import Function, HostFunction, KernelIndex, LaunchSite, Span
from kernel_lsp.server.base import KernelLspServer, RawJson, guarded
from kernel_lsp.server.convert import Text, to_range
from kernel_lsp.server.documents import DocumentState, IndexedText

KERNEL_KIND = int(types.SymbolKind.Event)
DEVICE_FUNCTION_KIND = int(types.SymbolKind.Operator)
HOST_FUNCTION_KIND = int(types.SymbolKind.Function)
_VARIABLE = int(types.SymbolKind.Variable)
_LAUNCH = KERNEL_KIND


class _Ranges:
    """Span -> LSP range JSON for one document version."""

    def __init__(self, doc: Text) -> None:
        self._doc = doc
        self._ascii = doc.source_bytes.isascii()

    def __call__(self, span: Span) -> dict[str, Any]:
        if self._ascii:
            return {
                "start": {"line": span.start.line, "character": span.start.column_byte},
                "end": {"line": span.end.line, "character": span.end.column_byte},
            }
        rng = to_range(self._doc, span)
        return {
            "start": {"line": rng.start.line, "character": rng.start.character},
            "end": {"line": rng.end.line, "character": rng.end.character},
        }


def _launch_symbol(ranges: _Ranges, launch: LaunchSite) -> dict[str, Any]:
    return {
        "name": f"{launch.kernel}<<<{launch.grid}, {launch.block}>>>",
        "detail": "launch",
        "kind": _LAUNCH,
        "range": ranges(launch.span),
        "selectionRange": ranges(launch.kernel_span),
    }


def _inner_launches(index: KernelIndex) -> dict[str, list[LaunchSite]]:
    """Launches inside indexed functions (dynamic parallelism), by enclosing function name."""
    inner: dict[str, list[LaunchSite]] = {}
    known = {fn.name for fn in index.functions}
    for launch in index.launches:
        if launch.enclosing_function in known:
            inner.setdefault(launch.enclosing_function, []).append(launch)
    return inner


def _launches_in(fn: Function, inner: dict[str, list[LaunchSite]]) -> list[LaunchSite]:
    # Overloads share a name: a launch belongs to the overload whose span holds it.
    return [
        launch for launch in inner.get(fn.name, ())
        if fn.span.start_byte <= launch.span.start_byte < fn.span.end_byte
    ]


def _function_symbol(ranges: _Ranges, fn: Function, launches: list[LaunchSite]) -> dict[str, Any]:
    children = [
        {
            "name": shared.name,
            "detail": f"__shared__ {shared.type_text}" + "".join(f"[{d}]" for d in shared.dims),
            "kind": _VARIABLE,
            "range": ranges(shared.span),
            "selectionRange": ranges(shared.span),
        }
        for shared in fn.shared
    ]
    if launches:
        children += [_launch_symbol(ranges, launch) for launch in launches]
        children.sort(key=lambda s: (s["range"]["start"]["line"], s["range"]["start"]["character"]))
    symbol: dict[str, Any] = {
        "name": fn.name,
        "detail": fn.signature,
        "kind": KERNEL_KIND if fn.is_kernel else DEVICE_FUNCTION_KIND,
        "range": ranges(fn.span),
        "selectionRange": ranges(fn.name_span),
    }
    if children:
        symbol["children"] = children
    return symbol


def _host_symbol(ranges: _Ranges, host: HostFunction) -> dict[str, Any]:
    return {
        "name": host.name,
        "detail": host.signature,
        "kind": HOST_FUNCTION_KIND,
        "range": ranges(host.span),
        "selectionRange": ranges(host.name_span),
    }


def document_symbols(doc: Text, index: KernelIndex) -> list[dict[str, Any]]:
    """Hierarchical ``DocumentSymbol`` JSON, in source order."""
    ranges = _Ranges(doc)
    inner = _inner_launches(index)
    symbols = [_function_symbol(ranges, fn, _launches_in(fn, inner)) for fn in index.functions]
    symbols += [_host_symbol(ranges, host) for host in index.host_functions]
    symbols.sort(key=lambda s: (s["range"]["start"]["line"], s["range"]["start"]["character"]))
    return symbols


def _fragment_key(source: bytes, fn: Function | HostFunction) -> tuple[bytes, str]:
    """What a function's symbol is made of, but for the line it starts on: its text from the start of
    its first line (the bytes before it on that line decide its UTF-16 columns there) and its
    qualified name (from the enclosing namespaces, shown in the signature). The launches under it
    lie inside its text."""
    span = fn.span
    return source[span.start_byte - span.start.column_byte : span.end_byte], fn.qualified_name


_first = itemgetter(0)
#: Functions encoded between two yield points of the outline.
_YIELD_EVERY = 64
#: A position's line in an encoded symbol. A ``{"`` cannot occur inside a JSON string (its quote
#: would be escaped), so only positions match.
_LINE = re.compile(r'\{"line":(\d+),')


class _Fragment(NamedTuple):
    """One function's encoded symbol, and how to write it again for another first line."""

    line: int
    """The line the symbol starts on in ``text``."""
    text: str
    template: str
    """``text`` with every position's line a ``%d`` (and ``%`` written ``%%``)."""
    lines: tuple[int, ...]
    """Those lines, relative to ``line``."""


Fragments = dict[tuple[bytes, str], _Fragment]
"""Per function (:func:`_fragment_key`): its encoded symbol."""


def _fragment(line: int, text: str) -> _Fragment:
    lines = tuple(int(found) - line for found in _LINE.findall(text))
    return _Fragment(line, text, _LINE.sub('{"line":%d,', text.replace("%", "%%")), lines)


def _moved(fragment: _Fragment, line: int) -> _Fragment:
    """An encoded symbol moved to start on ``line``: its lines shifted by one C-level format, the rest
    as it was (several times cheaper than encoding it anew; a new line moves half a file)."""
    if line == fragment.line:
        return fragment
    text = fragment.template % tuple([line + rel for rel in fragment.lines])
    # tuple.__new__: a NamedTuple's own constructor is a Python frame, and half a file moves.
    return _new_fragment(_Fragment, (line, text, fragment.template, fragment.lines))


_new_fragment = tuple.__new__


class _EncodedSymbols(RawJson):
    """The hierarchical answer joined from encoded per-function symbols."""

    __slots__ = ()

    def __init__(self, fragments: list[str]) -> None:
        self.text = "[" + ",".join(fragments) + "]"


def encoded_document_symbols(doc: Text, index: KernelIndex, previous: Fragments,
                             give_way: Callable[[], None] | None = None) -> tuple[RawJson, Fragments]:
    """The hierarchical answer, and the encoded symbol of each function for the next call.

    A function whose key is in ``previous`` (the last calls') is not encoded again: typing in one
    function of a 10,000-line file re-encodes that function, not the 800 others, and the ones a new
    line moved down only have their lines shifted (a few times cheaper than encoding them anew).
    ``give_way``: a yield point, called every :data:`_YIELD_EVERY` functions (a big document's answer
    is built off the event loop).
    """
    source = doc.source_bytes
    ranges = _Ranges(doc)
    fragments: Fragments = {}
    placed: list[tuple[tuple[int, int], str]] = []
    for count, fn in enumerate(index.functions, 1):
        if give_way is not None and count % _YIELD_EVERY == 0:
            give_way()
        span = fn.span
        key = _fragment_key(source, fn)
        known = previous.get(key)
        if known is None:
            # Only this function's launches: the index places the others only if someone asks.
            launches = [
                launch for launch in index.launches_within(span.start_byte, span.end_byte)
                if launch.enclosing_function == fn.name
            ]
            known = _fragment(span.start.line, json.dumps(_function_symbol(ranges, fn, launches), separators=(",", ":")))
        else:
            known = _moved(known, span.start.line)
        fragments[key] = known
        placed.append((span.start, known.text))
    for host in index.host_functions:
        key = _fragment_key(source, host)
        known = previous.get(key)
        if known is None:
            known = _fragment(host.span.start.line, json.dumps(_host_symbol(ranges, host), separators=(",", ":")))
        else:
            known = _moved(known, host.span.start.line)
        fragments[key] = known
        placed.append((host.span.start, known.text))
    # Byte columns order a line like UTF-16 columns do; a start Point is (line, byte column).
    placed.sort(key=_first)
    answer = _EncodedSymbols([text for _, text in placed])
    # The symbols this version lacks are kept too, up to as many as it has (the newest first): while
    # a typed "{" has no "}", tree-sitter reads every function below it as part of the one typed,
    # and the version that closes it finds their symbols here instead of encoding them all again.
    room = len(fragments)
    for key, known in previous.items():
        if room <= 0:
            break
        if key not in fragments:
            fragments[key] = known
            room -= 1
    return answer, fragments


def flat_symbols(uri: str, symbols: list[dict[str, Any]], container: str | None = None) -> list[dict[str, Any]]:
    """``SymbolInformation`` JSON for clients without hierarchical symbols."""
    flat: list[dict[str, Any]] = []
    for symbol in symbols:
        info: dict[str, Any] = {"name": symbol["name"], "kind": symbol["kind"],
                                "location": {"uri": uri, "range": symbol["range"]}}
        if container is not None:
            info["containerName"] = container
        flat.append(info)
        flat += flat_symbols(uri, symbol.get("children", []), symbol["name"])
    return flat


def symbols_answer(doc: DocumentState, text: IndexedText, hierarchical: bool) -> RawJson:
    """The encoded answer, computed once per document version (positions from the index's own text)."""
    index = text.index

    def compute() -> RawJson:
        if not hierarchical:
            return RawJson(flat_symbols(doc.uri, document_symbols(text, index)))
        answer, doc.extra[_FRAGMENTS] = encoded_document_symbols(text, index, doc.extra.get(_FRAGMENTS, {}),
                                                                 doc.give_way)
        return answer

    return doc.memo(_memo_key(hierarchical), compute)


#: ``doc.extra`` key of the encoded per-function symbols of the last hierarchical answer.
_FRAGMENTS = "symbols-fragments"


def _memo_key(hierarchical: bool) -> str:
    return "symbols-hierarchical" if hierarchical else "symbols-flat"


def register(server: KernelLspServer) -> None:
    state = server.state

    @server.feature(types.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    @guarded(state, empty=list, what="documentSymbol")
    async def document_symbol(params: types.DocumentSymbolParams) -> RawJson | list[Any]:
        doc = state.documents.get(params.text_document.uri)
        if doc is None:
            return []
        caps = server.client_capabilities.text_document
        hierarchical = bool(caps and caps.document_symbol and caps.document_symbol.hierarchical_document_symbol_support)
        async with doc.lock:
            cached = doc.cached(_memo_key(hierarchical))
            if cached is not None:
                return cached
            if not doc.big:
                # Inline for a small document: the index first, completed if its macros were pending.
                return symbols_answer(doc, await doc.indexed_async(), hierarchical)
            # One trip to the worker thread for both: after an edit neither is cached.
            return await doc.off_loop(lambda: symbols_answer(doc, doc.indexed(), hierarchical))
