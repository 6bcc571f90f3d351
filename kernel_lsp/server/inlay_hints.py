"""``textDocument/inlayHint``: resource usage after each kernel's name, occupancy after each launch.

``__global__ void saxpy(…)`` gets ``32 regs · 1 KiB smem`` (and spills when there
are any) right after its name; ``saxpy<<<g, 256>>>(…)`` gets ``occ 75% (registers)``
after the launch. Only known values are shown; before a compile there are no
hints (the code lens says the same more visibly). While compiles fail, the last
good compile's numbers stay, marked ``(stale)``.
"""

from __future__ import annotations

from lsprotocol import types

from kernel_lsp.server.base import KernelLspServer, ServerState, guarded
from kernel_lsp.server.convert import to_position
from kernel_lsp.server.documents import DocumentState
from kernel_lsp.server.hover import limiter_text
from kernel_lsp.services.kernel_report import report


def _in_range(position: types.Position, rng: types.Range) -> bool:
    return (rng.start.line, rng.start.character) <= (position.line, position.character) <= (rng.end.line, rng.end.character)


def inlay_hints(state: ServerState, doc: DocumentState, rng: types.Range) -> list[types.InlayHint]:
    text = doc.indexed()
    compile, stale = doc.resources_compile()
    hints: list[types.InlayHint] = []
    for facts in report(text.index, text.source_bytes, compile, state.settings.arch, pre=state.macro_view(doc, text)):
        fn = facts.function
        usage = facts.resources
        if usage is not None and usage.registers_per_thread is not None:
            label = f"{usage.registers_per_thread} regs"
            if usage.shared_bytes_static:
                label += f" · {usage.shared_bytes_static} B smem"
            if usage.has_spills:
                label += f" · spills {usage.spill_store_bytes or 0}/{usage.spill_load_bytes or 0} B"
            if stale:
                label += " (stale)"
            position = to_position(text, fn.name_span.end)
            if _in_range(position, rng):
                hints.append(types.InlayHint(position=position, label=label, padding_left=True,
                                             kind=types.InlayHintKind.Type))
        for lf in facts.launches:
            if lf.occupancy is None:
                continue
            position = to_position(text, lf.launch.span.end)
            if _in_range(position, rng):
                hints.append(types.InlayHint(
                    position=position,
                    label=f"occ {lf.occupancy.occupancy_pct:.0f}% ({limiter_text(lf.occupancy.limiter)})",
                    padding_left=True,
                    kind=types.InlayHintKind.Parameter,
                ))
    return hints


def register(server: KernelLspServer) -> None:
    state = server.state

    @server.feature(types.TEXT_DOCUMENT_INLAY_HINT)
    @guarded(state, empty=list, what="inlayHint")
    async def inlay_hint(params: types.InlayHintParams) -> list[types.InlayHint]:
        doc = state.documents.get(params.text_document.uri)
        if doc is None:
            return []
        async with doc.lock:
            await doc.index_async()
            return await doc.off_loop(lambda: inlay_hints(state, doc, params.range))
