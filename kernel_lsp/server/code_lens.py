"""``textDocument/codeLens``: one lens per kernel with what is known of its resources.

Text: ``32 regs · 1024 B smem · no spills · occupancy 75% @256 (registers)``,
each part present only when known (a kernel with nothing known gets no lens).
While compiles fail, the last good compile's numbers stay, marked
``(stale: the last compile failed)``; a kernel the last compile did not see
because it was written since says ``not compiled since the last edit``.
Lenses asked for before the first compile of a document was published wait
for it (up to :data:`FIRST_COMPILE_WAIT_S`), so an editor that asks once after
opening does not keep an empty answer; when the client supports
``workspace/codeLens/refresh`` every compile also asks it to ask again.
Clicking runs ``kernelLsp.kernelReport``, which shows the kernel's full report
(the hover's content as plain text) in a message: a lens never does nothing.
Modules add parts through ``state.lens_parts``.
"""

from __future__ import annotations

import asyncio
import logging
import os

from lsprotocol import types

from kernel_lsp.server.base import RAISE_ENV, KernelLspServer, ServerState, guarded
from kernel_lsp.server.convert import to_range
from kernel_lsp.server.documents import DocumentState
from kernel_lsp.server.hover import limiter_text
from kernel_lsp.services.kernel_report import KernelFacts, kernel_facts, report

log = logging.getLogger(__name__)

REPORT_COMMAND = "kernelLsp.kernelReport"
#: Longest a code lens request waits for a document's first compile, in seconds.
FIRST_COMPILE_WAIT_S = 20.0
STALE = "stale: the last compile failed"
NOT_COMPILED = "not compiled since the last edit"


def lens_text(facts: KernelFacts) -> str | None:
    parts: list[str] = []
    usage = facts.resources
    if usage is not None:
        if usage.registers_per_thread is not None:
            parts.append(f"{usage.registers_per_thread} regs")
        if usage.shared_bytes_static:
            parts.append(f"{usage.shared_bytes_static} B smem")
        if usage.spill_store_bytes is not None:
            parts.append(f"spills {usage.spill_store_bytes} B st / {usage.spill_load_bytes} B ld"
                         if usage.has_spills else "no spills")
    first = facts.first_occupancy
    if first is not None and first.occupancy is not None:
        parts.append(
            f"occupancy {first.occupancy.occupancy_pct:.0f}% @{first.block_threads} ({limiter_text(first.occupancy.limiter)})"
        )
    return " · ".join(parts) if parts else None


def kernel_report_text(facts: KernelFacts) -> str:
    lines = [facts.function.signature]
    text = lens_text(facts)
    lines.append(text or "no resource data yet (the file has not compiled)")
    for lf in facts.launches:
        where = f"launch at line {lf.launch.span.start.line + 1}"
        if lf.occupancy is not None:
            lines.append(f"{where}: block {lf.block_threads} -> occupancy {lf.occupancy.occupancy_pct:.0f}% "
                         f"(limiter: {limiter_text(lf.occupancy.limiter)})")
        else:
            lines.append(f"{where}: block {lf.launch.block}" + ("" if lf.block_threads is None else f" = {lf.block_threads}"))
    return "\n".join(lines)


def code_lenses(state: ServerState, doc: DocumentState) -> list[types.CodeLens]:
    text = doc.indexed()
    compile, stale = doc.resources_compile()
    lenses: list[types.CodeLens] = []
    for facts in report(text.index, text.source_bytes, compile, state.settings.arch, pre=state.macro_view(doc, text)):
        fn = facts.function
        known = lens_text(facts)
        if known is not None and stale:
            known += f" ({STALE})"
        elif known is None and compile is not None and not compile.tool_missing and doc.edited_since_compile:
            known = NOT_COMPILED
        parts = [known]
        for extra in state.lens_parts:
            try:
                parts.append(extra(state, doc, fn))
            except Exception:
                if os.environ.get(RAISE_ENV) == "1":
                    raise
                log.exception("lens part %s failed", getattr(extra, "__name__", extra))
        title = " · ".join(p for p in parts if p)
        if not title:
            continue
        lenses.append(types.CodeLens(
            range=to_range(text, fn.name_span),
            command=types.Command(title=title, command=REPORT_COMMAND, arguments=[doc.uri, fn.name]),
        ))
    return lenses


def register(server: KernelLspServer) -> None:
    state = server.state

    @server.feature(types.TEXT_DOCUMENT_CODE_LENS, types.CodeLensOptions(resolve_provider=False))
    @guarded(state, empty=list, what="codeLens")
    async def code_lens(params: types.CodeLensParams) -> list[types.CodeLens]:
        doc = state.documents.get(params.text_document.uri)
        if doc is None:
            return []
        compiling = not state.settings_loaded.is_set() or any(
            key.uri == doc.uri and key.kind == "compile" for key in state.jobs.active())
        if doc.compile is None and doc.path is not None and compiling:
            try:
                await asyncio.wait_for(doc.compiled.wait(), FIRST_COMPILE_WAIT_S)
            except asyncio.TimeoutError:
                log.info("code lens answered before the first compile of %s", doc.uri)
        async with doc.lock:
            await doc.index_async()
            return await doc.off_loop(lambda: code_lenses(state, doc))

    @server.command(REPORT_COMMAND)
    @guarded(state, what=REPORT_COMMAND)
    async def kernel_report(uri: str, kernel: str) -> str | None:
        doc = state.documents.get(uri)
        if doc is None:
            state.show(f"kernel-lsp: {uri} is not open", types.MessageType.Warning)
            return None
        async with doc.lock:
            indexed = await doc.indexed_async()
            fn = indexed.index.function(kernel)
            if fn is None:
                state.show(f"kernel-lsp: no kernel named {kernel} in this file", types.MessageType.Warning)
                return None
            text = kernel_report_text(kernel_facts(indexed.index, indexed.source_bytes, fn, doc.resources_compile()[0],
                                                   state.settings.arch, pre=state.macro_view(doc, indexed)))
        state.show(text, types.MessageType.Info)
        return text

