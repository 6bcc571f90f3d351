"""``textDocument/definition`` from a launch to the kernel it launches.

clangd resolves ordinary names; what it cannot follow (and what CUDA
developers ask for most) is ``saxpy<<<g, b>>>(…)`` to ``__global__ void saxpy``.
The answer is the kernel's definition in this file (every overload with the
launched name when there are several); elsewhere it is empty, so clangd's own
answer is the only one.
"""

from __future__ import annotations

from lsprotocol import types

from kernel_lsp.server.base import KernelLspServer, guarded
from kernel_lsp.server.convert import to_point, to_range
from kernel_lsp.server.documents import IndexedText


def definitions_at(uri: str, text: IndexedText, position: types.Position) -> list[types.Location]:
    point = to_point(text, position)
    index = text.index
    launch = index.launch_at(point.line, point.column_byte)
    if launch is None or not launch.kernel_span.contains(point.line, point.column_byte):
        return []
    name = launch.kernel.rsplit("::", 1)[-1]
    return [types.Location(uri=uri, range=to_range(text, fn.name_span))
            for fn in index.kernels if fn.name == name and (fn.qualified_name == launch.kernel or "::" not in launch.kernel)]


def register(server: KernelLspServer) -> None:
    state = server.state

    @server.feature(types.TEXT_DOCUMENT_DEFINITION)
    @guarded(state, empty=list, what="definition")
    async def definition(params: types.DefinitionParams) -> list[types.Location]:
        doc = state.documents.get(params.text_document.uri)
        if doc is None:
            return []
        return definitions_at(doc.uri, await doc.indexed_async(), params.position)
