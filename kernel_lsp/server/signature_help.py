"""``textDocument/signatureHelp`` inside a launch: ``<<<grid, block, sharedMem, stream>>>`` and its arguments.

Triggered by ``<`` and ``,`` (and ``(``): inside the configuration the four
launch parameters are shown with the one being typed active, each with what it
means and the kernel's own facts where they help (its ``__launch_bounds__``,
its ``extern __shared__`` arrays); inside the argument list after ``>>>`` the
kernel's parameters are. The position is read from the tree by
:func:`kernel_lsp.core.cursor.launch_context`, which copes with a half-typed
launch.
"""

from __future__ import annotations

from lsprotocol import types

from kernel_lsp.core.cursor import LaunchContext, launch_context
from kernel_lsp.core.index import Function
from kernel_lsp.server.base import KernelLspServer, guarded
from kernel_lsp.server.convert import to_point
from kernel_lsp.server.documents import IndexedText

#: The launch configuration's parameters: (label, documentation).
CONFIG = (
    ("dim3 gridDim", "Blocks in the grid (x, y, z); an int means (n, 1, 1)."),
    ("dim3 blockDim", "Threads per block (x, y, z); at most 1024 in all, a multiple of 32 wastes no lanes."),
    ("size_t sharedMemBytes = 0", "Dynamic shared memory per block, in bytes: the size of the kernel's "
                                  "`extern __shared__` array."),
    ("cudaStream_t stream = 0", "The stream the launch is queued on; 0 is the default stream."),
)


def _config_signature(kernel: str, fn: Function | None) -> types.SignatureInformation:
    labels = [label for label, _ in CONFIG]
    notes = []
    if fn is not None and fn.launch_bounds:
        notes.append(f"`__launch_bounds__({', '.join(fn.launch_bounds)})`: blockDim may not exceed {fn.launch_bounds[0]} threads.")
    dynamic = [s.name for s in fn.shared if s.is_extern] if fn is not None else []
    if dynamic:
        notes.append(f"Dynamic shared memory holds: {', '.join(dynamic)}.")
    return types.SignatureInformation(
        label=f"{kernel}<<<{', '.join(labels)}>>>",
        documentation=types.MarkupContent(kind=types.MarkupKind.Markdown, value="\n\n".join(
            [f"Launch configuration of `{kernel}`."] + notes)),
        parameters=[types.ParameterInformation(label=label, documentation=doc) for label, doc in CONFIG],
    )


def _arguments_signature(fn: Function) -> types.SignatureInformation:
    params = [f"{p.type_text} {p.name}".strip() for p in fn.params]
    return types.SignatureInformation(
        label=f"{fn.name}({', '.join(params)})",
        documentation=types.MarkupContent(kind=types.MarkupKind.Markdown, value=f"```cuda\n{fn.signature}\n```"),
        parameters=[types.ParameterInformation(label=label) for label in params],
    )


def signature_help_at(text: IndexedText, position: types.Position) -> types.SignatureHelp | None:
    if text.tree is None:
        return None
    point = to_point(text, position)
    context: LaunchContext | None = launch_context(text.tree, text.source_bytes, text.byte_offset(*point))
    if context is None:
        return None
    fn = next((f for f in text.index.kernels if f.name == context.kernel.rsplit("::", 1)[-1]), None)
    if context.in_config:
        signature, count = _config_signature(context.kernel, fn), len(CONFIG)
    elif fn is not None:
        signature, count = _arguments_signature(fn), len(fn.params)
    else:
        return None
    return types.SignatureHelp(signatures=[signature], active_signature=0,
                               active_parameter=min(context.slot, max(count - 1, 0)))


def register(server: KernelLspServer) -> None:
    state = server.state

    @server.feature(types.TEXT_DOCUMENT_SIGNATURE_HELP,
                    types.SignatureHelpOptions(trigger_characters=["<", ",", "("], retrigger_characters=[","]))
    @guarded(state, what="signatureHelp")
    async def signature_help(params: types.SignatureHelpParams) -> types.SignatureHelp | None:
        doc = state.documents.get(params.text_document.uri)
        if doc is None:
            return None
        return signature_help_at(await doc.indexed_async(), params.position)
