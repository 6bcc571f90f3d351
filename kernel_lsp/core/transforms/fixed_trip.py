"""Loops with a small trip count the spec knows, specialised and unrolled behind a runtime guard.

Stencil and filter kernels loop over a radius, a strip of rows or the few planes of a 3-D grid
(``for (k = 1; k < nz - 1; ++k)`` with ``nz = 8``): a bound the compiler does not know keeps the
loop rolled, so each iteration's loads wait for the previous iteration's stores (they may alias)
and its index arithmetic. The rewrite keeps the loop as written and puts before it a copy whose
bound is the spec's value, fully unrolled, taken only when the bound has that value at run time:

    if ((nz - 1) == 7) {
    #pragma unroll
        for (int k = 1; k < 7; ++k) …
    } else
        for (int k = 1; k < nz - 1; ++k) …

Every other size runs the original loop. With the spec proving the pointer parameters distinct, a
second candidate also marks them ``__restrict__`` so the unrolled iterations' loads can move ahead
of the earlier iterations' stores.

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a counted loop of the kernel's own body (a ``for``, or a ``while`` stepped by one statement of its
  body: the copy is the same loop with the spec's bound) with a constant start of at least 0 (so
  ``var < 7`` compares as ``var < bound`` does, whatever the bound's type), a step of 1 and a
  condition ``var < bound`` or ``var <= bound``;
- the bound is not a constant already, is the same for every thread (so a barrier inside stays reached by all threads of a
  block on the same path), nothing in the loop assigns a name the bound reads, and it has no side
  effects (the copy does not evaluate it);
- at the spec's main size the loop runs between 2 and :data:`MAX_TRIP` times.
"""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import node_text as _text, has_effects, has_node as _has, identifiers_in as _identifiers
from kernel_lsp.core.analysis import (
    Binding, LoopFact, assigned_names, thread_dependence, trip_count,
)
from kernel_lsp.core.index import build_index
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError
from kernel_lsp.core.transforms.counted_loop import loop_test
from kernel_lsp.core.transforms.emit import BodyEdit, emit, node_at, parse, pragma_before
from kernel_lsp.core.transforms.qualifiers import requalified

#: Largest trip count unrolled (a longer loop gains little and grows the code).
MAX_TRIP = 32
#: Loops specialised in one kernel.
MAX_LOOPS = 4


@dataclass(frozen=True)
class _Loop:
    loop: LoopFact
    bound: Node
    """The condition's right operand."""
    value: int
    """Its value at the spec's main size."""
    trips: int


class FixedTripUnroll(Rule):
    name = "fixed-trip-unroll"
    technique = "loop-unrolling"
    summary = "a loop whose trip count the spec fixes, unrolled behind a guard on that count"

    def plan(self, ctx: RuleContext) -> tuple[list[_Loop] | None, str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        if ctx.spec is None:
            return None, "needs a launch spec (the trip count comes from its sizes)"
        if not facts.loops:
            return None, "the kernel has no loop"
        try:
            binding = Binding.from_spec(ctx.spec)
        except (SpecError, ValueError, ZeroDivisionError):
            return None, "the spec's sizes do not evaluate"
        src, root = parse(ctx.preprocessed)
        lo, hi = facts.body_span
        found: list[_Loop] = []
        reasons: list[str] = []
        for loop in facts.loops:
            line = (loop.user_line or 0) + 1
            if not (lo < loop.span[0] and loop.span[1] < hi):
                continue
            why, plan = self._loop(ctx, loop, src, root, binding)
            if plan is None:
                reasons.append(f"the loop at line {line}: {why}")
            elif not any(p.loop.span[0] <= loop.span[0] and loop.span[1] <= p.loop.span[1] for p in found):
                found.append(plan)
        found = found[:MAX_LOOPS]
        if not found:
            return None, "; ".join(reasons) or "no loop in the kernel's own body"
        return found, ""

    def _loop(self, ctx: RuleContext, loop: LoopFact, src: bytes, root: Node,
              binding: Binding) -> tuple[str, _Loop | None]:
        node = node_at(src, root, loop.span)
        if loop.kind == "do":
            return "it is a do loop (its first iteration runs before its test)", None
        if node is None or loop.var is None:
            return "the analysis finds no counter of the loop (a variable started, tested and stepped)", None
        if loop.step is None or loop.step.constant != 1:
            return "its step is not 1", None
        if loop.start is None or loop.start.constant is None or loop.start.constant < 0:
            # A negative start against an unsigned bound compares otherwise than against the literal.
            return "its start is not a constant of at least 0", None
        cond = loop_test(node)
        if cond is None or cond.type != "binary_expression":
            return "its counter is not bounded from above by its test", None
        left, right = cond.child_by_field_name("left"), cond.child_by_field_name("right")
        op = _text(src, cond.child_by_field_name("operator"))
        if op not in ("<", "<=") or left is None or left.type != "identifier" or _text(src, left) != loop.var:
            return "its counter is not bounded from above by its test", None
        if loop.bound is None or thread_dependence(loop.bound, ctx.facts.opaque):  # type: ignore[union-attr]
            return "its bound differs between threads or is not known", None
        if not loop.bound.symbols:
            return "its bound is already a constant (the compiler sees the trip count)", None
        if has_effects(right, src) or _has(right, ("subscript_expression", "pointer_expression", "field_expression")):
            return "its bound reads memory or has side effects", None
        body = node.child_by_field_name("body")
        changed = assigned_names(body, src) | assigned_names(node.child_by_field_name("update"), src)
        if changed & _identifiers(right, src):
            return f"the loop assigns {', '.join(sorted(changed & _identifiers(right, src)))}, which its bound reads", None
        trips = trip_count(ctx.facts, loop, binding)  # type: ignore[arg-type]
        if trips is None:
            return "its trip count is not known at the spec's size", None
        if not 2 <= trips <= MAX_TRIP:
            return f"it runs {trips} times at the spec's size (unrolled only from 2 to {MAX_TRIP})", None
        value = loop.start.constant + trips - (1 if op == "<=" else 0)
        return "", _Loop(loop, right, value, trips)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plans, why = self.plan(ctx)
        if plans is None:
            return False, why
        lines = ", ".join(f"{(p.loop.user_line or 0) + 1} ({p.trips} trips)" for p in plans)
        return True, f"loops at line {lines}: constant start, unit step, a bound the same for every thread"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plans, _ = self.plan(ctx)
        facts = ctx.facts
        assert plans is not None and facts is not None
        edit = BodyEdit(ctx.preprocessed, facts)
        for p in plans:
            start, end = p.loop.span
            copy = (edit.text(start, p.bound.start_byte) + str(p.value) + edit.text(p.bound.end_byte, end))
            indent = edit.indent_at(start)
            # A pragma written before the loop stays with the original loop, after the ``else``.
            pragma = pragma_before(edit.src, start)
            again = ""
            if pragma is not None:
                edit.replace(pragma[0], pragma[1], "")
                again = f"\n{pragma[2]}\n{indent}"
            edit.insert(start, f"if (({edit.text(p.bound.start_byte, p.bound.end_byte)}) == {p.value}) {{\n"
                               f"#pragma unroll\n{indent}{copy}\n{indent}}} else {again}")
        source, expanded = emit(edit, ctx.source, ctx.kernel)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        trips = ", ".join(str(p.trips) for p in plans)
        out = [Rewrite(source, f"loops of {trips} trips at the spec's size unrolled behind a guard on their bound, "
                               f"the original loops kept for other sizes{note}", variant="unroll")]
        restricted = _restrict(source, ctx)
        if restricted is not None:
            out.append(Rewrite(restricted, out[0].description + "; pointer parameters __restrict__ (the spec "
                                           "allocates each on its own)", variant="unroll+restrict"))
        return tuple(out)


def _restrict(source: str, ctx: RuleContext) -> str | None:
    """``source`` with the kernel's pointer parameters ``__restrict__`` (and ``const`` where never
    written nor copied to non-const pointers), when the spec proves them distinct arrays; None when
    that adds nothing."""
    if not ctx.distinct_arrays():
        return None
    kernel = next((k for k in build_index(source).kernels if k.name == ctx.kernel.name), None)
    if kernel is None:
        return None
    pointers = [p for p in kernel.params if p.pointer_depth == 1]
    if len(pointers) < 2 or all(p.is_restrict for p in pointers):
        return None
    copied = set(ctx.facts.nonconst_copies) if ctx.facts is not None else set()
    restrict = {p.name for p in pointers}
    const = {p.name for p in pointers if p.name in ctx.read_only} - copied
    return requalified(source, kernel, ctx.preprocessed.text, const, restrict) or requalified(
        source, kernel, ctx.preprocessed.text, set(), restrict)
