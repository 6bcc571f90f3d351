"""``textDocument/codeAction``: the union of every registered provider's actions.

Features add actions without touching this module: a provider is
``fn(ctx: CodeActionContext) -> list[types.CodeAction]`` appended to
:data:`PROVIDERS` of the server (``providers(state)``) in its ``register``. The
profiler adds "Create launch spec for <kernel>"; the optimizer adds its rewrites.
A provider that raises is logged (re-raised under tests) and the others still
answer.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from lsprotocol import types

from kernel_lsp.core.index import Function, KernelIndex, Point
from kernel_lsp.server.base import RAISE_ENV, KernelLspServer, ServerState, guarded
from kernel_lsp.server.convert import to_point
from kernel_lsp.server.documents import DocumentState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CodeActionContext:
    """What a provider gets."""

    state: ServerState
    doc: DocumentState
    index: KernelIndex
    params: types.CodeActionParams
    start: Point
    """Start of the requested range (UTF-8 columns)."""
    function: Function | None
    """The innermost function containing the range start, if any."""


Provider = Callable[[CodeActionContext], list[types.CodeAction]]

_PROVIDERS: "weakref.WeakKeyDictionary[ServerState, list[Provider]]" = weakref.WeakKeyDictionary()


def providers(state: ServerState) -> list[Provider]:
    """The provider list of one server (append to it in ``register``)."""
    return _PROVIDERS.setdefault(state, [])


def actions_at(ctx: CodeActionContext) -> list[types.CodeAction]:
    out: list[types.CodeAction] = []
    for provider in providers(ctx.state):
        try:
            out.extend(provider(ctx))
        except Exception:
            if os.environ.get(RAISE_ENV) == "1":
                raise
            log.exception("code action provider %s failed", getattr(provider, "__name__", provider))
    return out


def register(server: KernelLspServer) -> None:
    state = server.state
    providers(state)

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, types.CodeActionKind.Source,
                                                  types.CodeActionKind.RefactorRewrite]),
    )
    @guarded(state, empty=list, what="code action")
    async def code_action(params: types.CodeActionParams) -> list[types.CodeAction]:
        doc = state.documents.get(params.text_document.uri)
        if doc is None:
            return []
        async with doc.lock:
            index = await doc.index_async()
            start = to_point(doc.parsed, params.range.start)
            function = index.function_at(start.line, start.column_byte)
            return actions_at(CodeActionContext(state, doc, index, params, start, function))
