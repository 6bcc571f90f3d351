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

from kernel_lsp.core.analysis import explicit_instantiations
from kernel_lsp.core.consteval import evaluate_int
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


class RestrictConst(Rule):
    name = "restrict-const"
    technique = "restrict-const"
    summary = "const on never-written pointer parameters; __restrict__ when the spec proves they are distinct arrays"

    def _plan(self, ctx: RuleContext) -> tuple[set[str], set[str], set[str]]:
        """(const to add, __restrict__ to add, read-only parameters kept non-const because the kernel copies them)."""
        pointers = [p for p in ctx.kernel.params if p.pointer_depth == 1]
        facts = ctx.facts
        copied = set(facts.nonconst_copies) if facts is not None else set()
        read_only = {p.name for p in pointers if not p.is_const and p.name in ctx.read_only}
        add_const = read_only - copied
        add_restrict = {p.name for p in pointers if not p.is_restrict} if ctx.distinct_arrays() and len(pointers) > 1 else set()
        return add_const, add_restrict, read_only & copied

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if not any(p.pointer_depth == 1 for p in ctx.kernel.params):
            return False, "no pointer parameters"
        if ctx.kernel.name in explicit_instantiations(ctx.preprocessed.text):
            return False, "the file instantiates the template explicitly with these parameter types"
        add_const, add_restrict, kept = self._plan(ctx)
        note = f"; {', '.join(sorted(kept))} copied to non-const pointers, kept non-const" if kept else ""
        if not add_const and not add_restrict:
            if ctx.spec is None:
                return False, ("no pointer is provably read-only, and __restrict__ needs a launch spec proving distinct "
                               f"arrays{note}")
            return False, f"pointers are already const where provably read-only and __restrict__ where distinct{note}"
        return True, f"const: {sorted(add_const) or 'none'}; __restrict__: {sorted(add_restrict) or 'none'}{note}"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        add_const, add_restrict, _ = self._plan(ctx)
        out = ctx.source_bytes
        for p in sorted(ctx.kernel.params, key=lambda p: -p.span.start_byte):
            if p.name not in add_const | add_restrict:
                continue
            const = p.is_const or p.name in add_const
            restrict = p.is_restrict or p.name in add_restrict
            new = f"{'const ' if const else ''}{p.base_type}* {'__restrict__ ' if restrict else ''}{p.name}"
            out = out[: p.span.start_byte] + new.encode() + out[p.span.end_byte :]
        parts = []
        if add_const:
            parts.append("const on " + ", ".join(sorted(add_const)))
        if add_restrict:
            parts.append("__restrict__ on " + ", ".join(sorted(add_restrict)))
        return (Rewrite(out.decode("utf-8"), "; ".join(parts)),)


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
            if node is not None and node.type == "subscript_expression":
                found.append(a)
        return found

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        targets = self._targets(ctx)
        if not targets:
            return False, "no provably read-only pointer parameter of an __ldg type is read by subscript in the kernel's body"
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
        for lo, hi in spans:
            edit.insert(lo, "__ldg(&")
            edit.insert(hi, ")")
        source, expanded = emit(edit, ctx.source, ctx.kernel)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, "__ldg on reads of " + ", ".join(sorted({a.array for a in targets})) + note),)
