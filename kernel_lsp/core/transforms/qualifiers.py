"""Local edits the analysis justifies: qualifiers on pointer parameters, read-only loads, launch bounds, unrolling.

:class:`RestrictConst` — ``const`` on the pointer parameters the analysis proves are never written
(:attr:`~kernel_lsp.core.analysis.KernelFacts.read_only`: no store through them, their aliases,
macros or helpers, and no escape to code it does not see), except those the kernel copies into a
pointer or reference to non-const data (``float *p = in + base;``: ``const`` would not compile);
``__restrict__`` on every pointer when the spec gives each its own allocation.

:class:`ReadOnlyLoads` — each element read of such a parameter in the kernel's own body (also
through a local pointer into it) as ``__ldg(&…)``, where its element type has an ``__ldg``
overload and the spec proves the written arrays are other allocations.

:class:`LaunchBounds` — ``__launch_bounds__`` with the block every launch (or the spec) uses.

:class:`PragmaUnroll` — ``#pragma unroll`` before loops of a small known trip count.
"""

from __future__ import annotations

from tree_sitter import Node

from kernel_lsp.core.analysis import node_text, redeclared_parameters
from kernel_lsp.core.consteval import evaluate_int
from kernel_lsp.core.index import Function
from kernel_lsp.core.rules.base import MAX_THREADS_PER_BLOCK, Rewrite, Rule, RuleContext
from kernel_lsp.core.transforms.emit import BodyEdit, emit, node_at, parse

#: Longest fixed-trip loop that gets ``#pragma unroll`` (longer ones bloat the code for little gain).
MAX_UNROLL_TRIPS = 64
#: Element types ``__ldg`` has overloads for (CUDA's sm_32_intrinsics.h).
LDG_TYPES = frozenset({
    "char", "signed char", "unsigned char", "short", "unsigned short", "int", "unsigned int", "unsigned",
    "long", "unsigned long", "long long", "unsigned long long", "float", "double",
    "float2", "float4", "int2", "int4", "uint2", "uint4", "double2",
})


def _splice(source_bytes: bytes, at: int, new: str) -> str:
    return (source_bytes[:at] + new.encode("utf-8") + source_bytes[at:]).decode("utf-8")


def _line_start(source_bytes: bytes, at: int) -> int:
    return source_bytes.rfind(b"\n", 0, at) + 1


def requalified(source: str, kernel: Function, preprocessed: str, add_const: set[str], add_restrict: set[str]) -> str | None:
    """``source`` with ``const`` data on the pointer parameters ``add_const`` names and ``__restrict__`` on
    those ``add_restrict`` names; the kernel's forward declarations and explicit instantiations in the
    file get the same ``const`` (it is part of the parameter's type: without it they would declare
    another function, and the instantiation would instantiate nothing). None when one of them cannot be
    edited: it is in a header or made by a macro (``preprocessed`` has more of them than ``source``), or
    its parameters are not the definition's."""
    edits: list[tuple[int, int, str]] = []
    for p in kernel.params:
        if p.name not in add_const | add_restrict:
            continue
        const = p.is_const or p.name in add_const
        restrict = p.is_restrict or p.name in add_restrict
        edits.append((p.span.start_byte, p.span.end_byte,
                      f"{'const ' if const else ''}{p.base_type}* {'__restrict__ ' if restrict else ''}{p.name}"))
    newly_const = [k for k, p in enumerate(kernel.params) if p.name in add_const and not p.is_const]
    if newly_const:
        mine = redeclared_parameters(source, kernel.name)
        if len(mine) != len(redeclared_parameters(preprocessed, kernel.name)):
            return None
        for params in mine:
            if len(params) != len(kernel.params):
                return None
            edits += [(params[k][0], params[k][0], "const ") for k in newly_const if not params[k][2]]
    out = source.encode("utf-8")
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text.encode("utf-8") + out[end:]
    return out.decode("utf-8")


class RestrictConst(Rule):
    name = "restrict-const"
    technique = "restrict-const"
    summary = "const on never-written pointer parameters; __restrict__ when the spec proves they are distinct arrays"

    def _plan(self, ctx: RuleContext) -> tuple[set[str], set[str], set[str], str | None]:
        """(const to add, __restrict__ to add, read-only parameters kept non-const and why, the rewritten
        source or None when there is nothing to add)."""
        pointers = [p for p in ctx.kernel.params if p.pointer_depth == 1]
        facts = ctx.facts
        copied = set(facts.nonconst_copies) if facts is not None else set()
        read_only = {p.name for p in pointers if not p.is_const and p.name in ctx.read_only}
        add_const = read_only - copied
        add_restrict = {p.name for p in pointers if not p.is_restrict} if ctx.distinct_arrays() and len(pointers) > 1 else set()
        kept = {name: "copied to non-const pointers" for name in read_only & copied}
        source = requalified(ctx.source, ctx.kernel, ctx.preprocessed.text, add_const, add_restrict)
        if source is None:
            kept.update({name: "declared again in a header or by a macro, where its type cannot change" for name in add_const})
            add_const = set()
            source = requalified(ctx.source, ctx.kernel, ctx.preprocessed.text, add_const, add_restrict)
        note = "".join(f"; {name} {why}, kept non-const" for name, why in sorted(kept.items()))
        return add_const, add_restrict, note, source if add_const or add_restrict else None

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if not any(p.pointer_depth == 1 for p in ctx.kernel.params):
            return False, "no pointer parameters"
        add_const, add_restrict, note, _ = self._plan(ctx)
        if not add_const and not add_restrict:
            if ctx.spec is None:
                return False, ("no pointer is provably read-only, and __restrict__ needs a launch spec proving distinct "
                               f"arrays{note}")
            return False, f"pointers are already const where provably read-only and __restrict__ where distinct{note}"
        return True, f"const: {sorted(add_const) or 'none'}; __restrict__: {sorted(add_restrict) or 'none'}{note}"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        add_const, add_restrict, _, source = self._plan(ctx)
        assert source is not None
        parts = []
        if add_const:
            parts.append("const on " + ", ".join(sorted(add_const)))
        if add_restrict:
            parts.append("__restrict__ on " + ", ".join(sorted(add_restrict)))
        if add_const and redeclared_parameters(ctx.source, ctx.kernel.name):
            parts.append("the kernel's other declarations changed alike")
        return (Rewrite(source, "; ".join(parts)),)


class LaunchBounds(Rule):
    name = "launch-bounds"
    technique = "launch-bounds"
    summary = "__launch_bounds__(threads per block) when the block size is known"

    def _block_threads(self, ctx: RuleContext) -> tuple[int | None, str]:
        block = ctx.constant_block()
        if block is not None:
            return block[0] * block[1] * block[2], "from the launch spec"
        sizes = set()
        constants = dict(ctx.index.constants)
        for launch in ctx.index.launches_of(ctx.kernel.name):
            sizes.add(evaluate_int(launch.block, constants))
        if len(sizes) == 1 and None not in sizes:
            return sizes.pop(), "from every launch in this file"
        return None, "the block size is not the same known constant at every launch (give a launch spec)"

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if ctx.kernel.launch_bounds:
            return False, "the kernel already has __launch_bounds__"
        threads, why = self._block_threads(ctx)
        if threads is None:
            return False, why
        if not 0 < threads <= MAX_THREADS_PER_BLOCK:
            return False, f"block of {threads} threads is not launchable"
        return True, f"block of {threads} threads {why}"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        threads, _ = self._block_threads(ctx)
        source = _splice(ctx.source_bytes, ctx.kernel.name_span.start_byte, f"__launch_bounds__({threads}) ")
        return (Rewrite(source, f"__launch_bounds__({threads}): the compiler may use up to 64K/{threads} registers per thread"),)


class PragmaUnroll(Rule):
    name = "pragma-unroll"
    technique = "loop-unrolling"
    summary = "#pragma unroll on loops with a fixed trip count"

    def _loops(self, ctx: RuleContext):
        b = ctx.source_bytes
        out = []
        for loop in ctx.kernel.loops:
            if loop.has_pragma_unroll or loop.trip_count is None or not 1 < loop.trip_count <= MAX_UNROLL_TRIPS:
                continue
            start = _line_start(b, loop.span.start_byte)
            if b[start : loop.span.start_byte].strip():
                continue  # something precedes the loop on its line (``else for``): no place for a pragma line
            out.append(loop)
        return out

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        loops = self._loops(ctx)
        if not loops:
            return False, f"no loop with a known trip count of 2..{MAX_UNROLL_TRIPS} lacks #pragma unroll"
        return True, "loops at lines " + ", ".join(str(lp.span.start.line + 1) for lp in loops)

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        out = ctx.source_bytes
        loops = self._loops(ctx)
        for loop in sorted(loops, key=lambda lp: -lp.span.start_byte):
            start = _line_start(out, loop.span.start_byte)
            indent = out[start : loop.span.start_byte].decode()
            out = out[:start] + f"{indent}#pragma unroll\n".encode() + out[start:]
        trips = ", ".join(f"line {lp.span.start.line + 1} ({lp.trip_count} trips)" for lp in loops)
        return (Rewrite(out.decode("utf-8"), f"#pragma unroll on {trips}"),)


def _dereference(node: Node | None, src: bytes) -> Node | None:
    """The address ``*address`` reads, when ``node`` is such a read."""
    if node is None or node.type != "pointer_expression" or node_text(src, node.child_by_field_name("operator")) != "*":
        return None
    return node.child_by_field_name("argument")


class ReadOnlyLoads(Rule):
    name = "ldg"
    technique = "read-only-cache"
    summary = "__ldg for element reads of never-written inputs"

    def _targets(self, ctx: RuleContext):
        """The read-only element reads to wrap: subscripts in the kernel's own body (not in a helper,
        not a struct member) of parameters whose element type ``__ldg`` takes."""
        facts = ctx.facts
        if facts is None:
            return []
        read_only = set(ctx.read_only)
        src, root = parse(ctx.preprocessed)
        lo, hi = facts.body_span
        found = []
        for a in facts.accesses:
            if a.kind != "read" or a.space != "global" or a.array not in read_only or a.via or a.field is not None \
                    or a.elem_type not in LDG_TYPES or not lo < a.span[0] < hi:
                continue
            node = node_at(src, root, a.span)
            if node is not None and (node.type == "subscript_expression" or _dereference(node, src) is not None):
                found.append(a)
        return found

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        targets = self._targets(ctx)
        if not targets:
            return False, ("no provably read-only pointer parameter of an __ldg type is read by subscript or dereference in "
                           "the kernel's body")
        written = {p.name for p in ctx.kernel.params if p.pointer_depth > 0} - ctx.read_only
        if written and not ctx.distinct_arrays():
            return False, "the kernel writes through other pointers and no launch spec proves they are different arrays"
        return True, "read-only inputs: " + ", ".join(sorted({a.array for a in targets}))

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        targets = self._targets(ctx)
        edit = BodyEdit(ctx.preprocessed, ctx.facts)
        spans = sorted({a.span for a in targets})

        # Insertions around each read, nested reads too: they fall between tokens, so they map into the
        # user's text even where a macro expands inside the read (``hz[i * NY + j]``).
        src, root = parse(ctx.preprocessed)
        for lo, hi in spans:
            address = _dereference(node_at(src, root, (lo, hi)), src)
            if address is not None and address.type == "parenthesized_expression":
                # ``*(a + i)`` reads through the address it dereferences: ``__ldg(a + i)``, its parentheses kept.
                edit.replace(lo, address.start_byte, "__ldg")
            elif address is not None:
                edit.replace(lo, address.start_byte, "__ldg(")
                edit.insert(hi, ")")
            else:
                edit.insert(lo, "__ldg(&")
                edit.insert(hi, ")")
        source, expanded = emit(edit, ctx.source, ctx.kernel)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, "__ldg on reads of " + ", ".join(sorted({a.array for a in targets})) + note),)
