"""``textDocument/hover`` on a kernel name or a launch site: signature, resources, occupancy.

The Markdown is built from :mod:`kernel_lsp.services.kernel_report` (the same
facts as ``kernel-lsp check``). Other modules add sections through
``state.hover_sections``: each ``fn(ctx: HoverContext) -> str | None`` gets the
function and/or launch under the cursor and returns Markdown (or None to add
nothing); sections are appended in list order after a horizontal rule.

On any other name that is a CUDA built-in (``__shfl_down_sync``, ``atomicAdd``,
``threadIdx``, ``__launch_bounds__`` …) the hover documents it, from
``data/intrinsics.json`` (see :mod:`kernel_lsp.services.intrinsics`).

A hover never waits for the re-index of keystrokes it cannot be about: when
the document changed since the last index was built, and the name under the
cursor, its definition and every launch of it lie before the first changed
byte, the answer comes from that index (it is the same answer). Otherwise the
hover waits for the one re-index that covers every edit so far; when that
index already holds edits sent after the hover (they apply while it waits), it
answers only what those edits cannot have moved, by the same rule, and
otherwise nothing: a hover never shows the facts of what a later edit put at
its position. The per-index look-up tables (:class:`Lookup`, the kernels'
launch units, the macro view) are built with every index, where it is built
(``state.on_indexed``), so the first hover of an index reads only the hovered
kernel's facts.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lsprotocol import types

from kernel_lsp.core.cursor import token_at
from kernel_lsp.core.index import Function, KernelIndex, LaunchSite, Point
from kernel_lsp.core.parse import common_prefix
from kernel_lsp.core.source import Preprocessed, same_directives
from kernel_lsp.server.base import RAISE_ENV, KernelLspServer, ServerState, guarded
from kernel_lsp.server.convert import to_point, to_position, to_range
from kernel_lsp.server.documents import DocumentState, IndexedText
from kernel_lsp.services.intrinsics import Intrinsic, intrinsics
from kernel_lsp.services.kernel_report import KernelFacts, LaunchFacts, kernel_facts, launch_facts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HoverContext:
    """What a hover section gets."""

    state: ServerState
    doc: DocumentState
    index: KernelIndex
    point: Point
    function: Function | None
    """The function whose *name* is under the cursor, or the launched kernel at a launch site."""
    launch: LaunchSite | None
    """The launch expression under the cursor, if any."""
    facts: KernelFacts | None
    source: bytes = b""
    """The text ``index`` was built from (spans read from it)."""
    pre: Preprocessed | None = None
    """That text's macro view (launch sizes read its macro table)."""


HoverSection = Callable[[HoverContext], "str | None"]


def _bytes(value: int | None) -> str:
    return "?" if value is None else f"{value} B"


def resources_markdown(facts: KernelFacts, compile: Any, arch: str, *, stale: bool = False, edited: bool = False) -> str:
    """``compile``: the one the facts come from; ``stale``: it is the last good one standing in for a
    failed compile; ``edited``: the document changed since the last compile."""
    usage = facts.resources
    if usage is None:
        if compile is None:
            return "_Resources: not compiled yet._"
        if compile.tool_missing:
            return "_Resources unknown: nvcc is not available._"
        if edited:
            return "_Resources: not compiled since the last edit (save to compile)._"
        if compile.errors or stale:
            return "_Resources unknown: the last compile failed._"
        return "_Resources unknown: ptxas reported nothing for this kernel (not instantiated?)._"
    rows = [
        ("Registers", "?" if usage.registers_per_thread is None else f"{usage.registers_per_thread} per thread"),
        ("Spills", f"{_bytes(usage.spill_store_bytes)} stores, {_bytes(usage.spill_load_bytes)} loads"),
        ("Shared memory", f"{_bytes(usage.shared_bytes_static)} static"),
        ("Stack", _bytes(usage.stack_frame_bytes)),
    ]
    # A list, not a table: Neovim before 0.10 shows Markdown tables as raw pipes.
    items = "\n".join(f"- {name}: {value}" for name, value in rows)
    note = "\n\n_Stale: the last compile failed; these are from the last successful one._" if stale else ""
    return f"**Resources** ({arch}, ptxas)\n\n{items}{note}"


def limiter_text(limiter: str) -> str:
    """``shared_memory`` -> ``shared memory``."""
    return limiter.replace("_", " ")


def occupancy_line(lf: LaunchFacts) -> str:
    where = f"line {lf.launch.span.start.line + 1}"
    if lf.block_threads is None:
        return f"- {where}: block `{lf.launch.block}` — size not a constant, occupancy unknown"
    if lf.occupancy is None:
        return f"- {where}: block {lf.block_threads} threads — occupancy needs register counts"
    occ = lf.occupancy
    smem = f", {lf.dynamic_shared_bytes} B dynamic smem" if lf.dynamic_shared_bytes else ""
    return (f"- {where}: block {lf.block_threads}{smem} → **{occ.occupancy_pct:.0f}%** occupancy "
            f"(limiter: {limiter_text(occ.limiter)}, {occ.active_blocks_per_sm} blocks/SM)")


def hover_markdown(ctx: HoverContext) -> str:
    parts: list[str] = []
    fn = ctx.function
    compile, stale = ctx.doc.resources_compile()
    arch = ctx.state.settings.arch
    if fn is not None:
        parts.append(f"```cuda\n{fn.signature}\n```")
    elif ctx.launch is not None:
        parts.append(f"```cuda\n{ctx.launch.kernel}<<<{ctx.launch.grid}, {ctx.launch.block}>>>\n```")
        parts.append("_The launched kernel is not defined in this file._")
    facts = ctx.facts
    if facts is not None and fn is not None and fn.is_kernel:
        parts.append(resources_markdown(facts, compile, arch, stale=stale, edited=ctx.doc.edited_since_compile))
        launches = facts.launches
        if ctx.launch is not None:
            launches = tuple(lf for lf in launches if lf.launch == ctx.launch) or (
                launch_facts(ctx.index, ctx.source, ctx.launch, facts.resources, arch,
                             compile.defines if compile is not None else None, ctx.pre),
            )
        if launches:
            parts.append("**Occupancy** (theoretical)\n\n" + "\n".join(occupancy_line(lf) for lf in launches))
    elif fn is not None and fn.qualifier:
        parts.append(f"_{fn.qualifier} function: resources are counted in the kernels that call it._")
    return "\n\n".join(parts)


class Lookup:
    """Position -> function name or launch, by bisection over byte offsets (built once per index).

    Reads only what the hovered position needs: after an edit every function and launch below it
    has moved, and placing them all (~1,200 functions, ~800 launches in a 10,000-line file) would
    cost the first hover of each new index several milliseconds.
    """

    def __init__(self, index: KernelIndex) -> None:
        self._index = index
        # Definitions are in document order and do not overlap, and a function's span (unlike its
        # other positions) is placed when the index is built.
        functions = index.functions
        starts = [f.span.start_byte for f in functions]
        if starts != sorted(starts):
            functions = tuple(sorted(functions, key=lambda f: f.span.start_byte))
            starts = [f.span.start_byte for f in functions]
        self._functions = functions
        self._starts = starts
        self._launches: dict[str, tuple[LaunchSite, ...]] = {}
        self.by_name: dict[str, Function] = {}
        for fn in index.functions:
            # The first definition wins, as in KernelIndex.function.
            self.by_name.setdefault(fn.name, fn)

    def function_name_at(self, offset: int) -> Function | None:
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        name = self._functions[i].name_span
        return self._functions[i] if name.start_byte <= offset <= name.end_byte else None

    def launch_at(self, offset: int) -> LaunchSite | None:
        return self._index.launch_holding(offset)

    def launches_of(self, kernel: str) -> tuple[LaunchSite, ...]:
        """The launches of ``kernel`` by its unqualified name (as :func:`group_launches` groups them)."""
        found = self._launches.get(kernel)
        if found is None:
            found = self._launches[kernel] = self._index.launches_named(kernel)
        return found


def lookup_of(text: IndexedText) -> Lookup:
    """The hover's :class:`Lookup` of an index (built once per index)."""
    return text.derived("hover-lookup", lambda: Lookup(text.index))


def prepare_hover(state: ServerState, doc: DocumentState, text: IndexedText) -> None:
    """What a hover reads of every index, built with it (``state.on_indexed``): the look-up and the
    kernels' launch units by name (the macro view comes with the index). A hover on the event loop then
    reads only what the hovered kernel needs, however many functions the index has."""
    lookup_of(text)
    text.index.parts_by_name()


def context_at(state: ServerState, doc: DocumentState, text: IndexedText, point: Point) -> HoverContext | None:
    index = text.index
    lookup = lookup_of(text)
    offset = text.byte_offset(point.line, point.column_byte)
    launch = lookup.launch_at(offset)
    if launch is not None:
        fn = lookup.by_name.get(launch.kernel.rsplit("::", 1)[-1])
    else:
        fn = lookup.function_name_at(offset)
        if fn is None:
            return None
    facts = None
    pre = state.macro_view(doc, text) if fn is not None and fn.is_kernel else None
    if fn is not None and fn.is_kernel:
        launches = lookup.launches_of(fn.name)
        facts = kernel_facts(index, text.source_bytes, fn, doc.resources_compile()[0], state.settings.arch,
                             launches=launches, pre=pre)
    return HoverContext(state, doc, index, point, fn, launch, facts, text.source_bytes, pre)


def hover_at(state: ServerState, doc: DocumentState, text: IndexedText, position: types.Position) -> types.Hover | None:
    point = to_point(text, position)
    ctx = context_at(state, doc, text, point)
    if ctx is None:
        return builtin_hover_at(text, point) or line_hover_at(state, doc, text.index, point.line)
    return _hover(ctx, text)


def intrinsic_markdown(entry: Intrinsic) -> str:
    parts = [f"```cuda\n{entry.signature}\n```", f"_CUDA {entry.kind}_", entry.summary]
    if entry.notes:
        parts.append(entry.notes)
    return "\n\n".join(parts)


def builtin_hover_at(text: IndexedText, point: Point) -> types.Hover | None:
    """Documentation of the CUDA built-in under the cursor, or None."""
    if text.tree is None:
        return None
    offset = text.byte_offset(point.line, point.column_byte)
    token = token_at(text.tree, text.source_bytes, offset)
    entry = intrinsics().get(token.text) if token is not None else None
    if entry is None or token is None:
        return None
    start, end = text.point_of(token.start_byte), text.point_of(token.end_byte)
    span_range = types.Range(start=to_position(text, Point(*start)), end=to_position(text, Point(*end)))
    return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=intrinsic_markdown(entry)),
                       range=span_range)


def _spans_before(ctx: HoverContext, limit: int) -> bool:
    """Everything the hover reads (name, definition, launches) ends before byte ``limit``."""
    ends = [ctx.launch.span.end_byte] if ctx.launch is not None else []
    if ctx.function is not None:
        ends.append(ctx.function.span.end_byte)
    if ctx.facts is not None:
        ends += [lf.launch.span.end_byte for lf in ctx.facts.launches]
    return bool(ends) and max(ends) < limit


def hover_from_last_index(state: ServerState, doc: DocumentState, position: types.Position) -> types.Hover | None | bool:
    """The hover from the last index built when the edits since cannot change it; False when they can."""
    text = doc.last_indexed
    if text is None or text.pending:
        return False
    return _unmoved_hover(state, doc, text, position, doc.unchanged_before(text), lambda: doc.same_directives_as(text))


def hover_from_newer_index(state: ServerState, doc: DocumentState, text: IndexedText, sent: bytes,
                           position: types.Position) -> types.Hover | None:
    """The hover at ``position`` of the text ``sent`` (the document when the request came), from the
    index of a later text: edits that came after the request were applied while it waited for that
    index. Only what those edits cannot have moved is answered (as from an older index); a position
    they may have moved gets no hover, never the facts of what is there now."""
    unchanged = common_prefix(text.source_bytes, sent)
    answer = _unmoved_hover(state, doc, text, position, unchanged,
                            lambda: same_directives(sent, text.source_bytes, unchanged))
    return None if answer is False else answer


def _unmoved_hover(state: ServerState, doc: DocumentState, text: IndexedText, position: types.Position,
                   unchanged: int, same_directives_: Callable[[], bool]) -> types.Hover | None | bool:
    """The hover from ``text``'s index when everything it reads lies in the first ``unchanged`` bytes,
    which ``text`` shares with the text ``position`` refers to, and no directive differs
    (``same_directives_``); False otherwise."""
    point = to_point(text, position)
    # The launch sizes read the macro table at the end of the file: edits after the hovered spans must
    # not have changed a directive either.
    if text.byte_offset(point.line, point.column_byte) >= unchanged or not same_directives_():
        return False
    ctx = context_at(state, doc, text, point)
    if ctx is None or not _spans_before(ctx, unchanged):
        return False
    return _hover(ctx, text)


def _hover(ctx: HoverContext, text: IndexedText) -> types.Hover:
    state = ctx.state
    sections = [hover_markdown(ctx)]
    for section in state.hover_sections:
        try:
            extra = section(ctx)
        except Exception:
            if os.environ.get(RAISE_ENV) == "1":
                raise
            log.exception("hover section %s failed", getattr(section, "__name__", section))
            continue
        if extra:
            sections.append(extra)
    span = ctx.launch.kernel_span if ctx.launch is not None else ctx.function.name_span  # type: ignore[union-attr]
    return types.Hover(
        contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value="\n\n---\n\n".join(sections)),
        range=to_range(text, span),
    )


def line_hover_at(state: ServerState, doc: DocumentState, index: KernelIndex, line: int) -> types.Hover | None:
    """A hover from ``state.line_hovers`` (e.g. a profiled line's counters), or None."""
    for provider in state.line_hovers:
        try:
            text = provider(state, doc, index, line)
        except Exception:
            if os.environ.get(RAISE_ENV) == "1":
                raise
            log.exception("line hover %s failed", getattr(provider, "__name__", provider))
            continue
        if text:
            return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=text))
    return None


def register(server: KernelLspServer) -> None:
    state = server.state
    state.on_indexed.append(prepare_hover)

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    @guarded(state, what="hover")
    async def hover(params: types.HoverParams) -> types.Hover | None:
        doc = state.documents.get(params.text_document.uri)
        if doc is None:
            return None
        # The text the position refers to: edits sent after this request apply while it waits below.
        sent = doc.source_bytes
        if doc.cached("index") is None:
            quick = hover_from_last_index(state, doc, params.position)
            if quick is not False:
                return quick  # type: ignore[return-value]
        async with doc.lock:
            text = await doc.indexed_async()
            if text.source_bytes is not sent:
                return hover_from_newer_index(state, doc, text, sent, params.position)
            return hover_at(state, doc, text, params.position)
