"""A value a loop stored in one iteration and loads back in the next, kept in a register.

Recurrences along a row (PolyBench's ADI sweeps: ``X[r*n + j] = X[r*n + j] - X[r*n + (j-1)] * …``)
store an element and load it again one iteration later. The load must wait until the store has reached
the cache that serves it (L2 for global memory), and the compiler cannot forward the value itself while
other pointers of the loop may alias the array; so each iteration starts with a round trip to L2 on its
critical path. The rewrite keeps the stored value in a register and reads it there in the next
iteration; the store itself stays (the array's contents are the original's), and the first iteration,
which has no previous one, still loads from memory:

    { T kl_fwd0; bool kl_first0 = true;
    for (…) {
        X[f(j)] = (kl_fwd0 = … (kl_first0 ? X[f(j-1)] : kl_fwd0) …);
        …
        kl_first0 = false;
    } }

With the load gone from the chain, the loop's other loads no longer wait behind the previous
iteration's store (and a load batch can make them ahead: the body then only loads elements the
iteration itself stores, after loading them).

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a counted loop with a constant, non-zero step and no loop inside it; no ``continue``, ``break``,
  ``return`` or ``goto`` in its body (the flag is cleared at the end of every iteration); no barrier,
  warp operation or call the analysis does not see (no other thread nor callee may store to the element
  between the two iterations);
- the array is a pointer parameter the spec allocates on its own (no other pointer reaches its elements:
  a store through another array cannot change the element in between), whose address does not escape,
  not ``volatile``, with no atomic in the loop;
- the loop stores to it once, with a plain ``=`` in a statement directly in the loop's body (every
  iteration runs it, outside helpers), at an index that moves by a constant ``c`` elements per iteration
  and whose other terms the loop does not change;
- each forwarded load reads the array at that index minus ``c`` (the previous iteration's element) and
  runs before the store in its iteration: in an earlier statement of the body, or on the store's right
  side. Loads after the store, or of other elements, stay as written (the stores still reach memory).
The register has the array's element type, so the stored value is the one the original stores.
"""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import Access, KernelFacts, LoopFact
from kernel_lsp.core.analysis import has_node as _has
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.transforms.emit import BodyEdit, UserText, emit, node_at, parse, pragma_before
from kernel_lsp.core.transforms.stencil_reuse import canonical


@dataclass(frozen=True)
class _Forward:
    loop: LoopFact
    store: Access
    right: tuple[int, int]
    """The store's right-hand side (the value kept)."""
    loads: tuple[Access, ...]
    """The loads of the previous iteration's element that run before the store."""
    elem_type: str


def _statement_in_body(node: Node, body: Node) -> Node | None:
    """The statement of ``body``'s top level that holds ``node`` (``body`` itself when it is one statement,
    not a block), or None."""
    if body.type != "compound_statement":
        return body if body.start_byte <= node.start_byte and node.end_byte <= body.end_byte else None
    while node is not None and node.parent != body:
        node = node.parent
    return node


def _moves_only_by_trip(access: Access, loop: LoopFact, facts: KernelFacts) -> bool:
    """The index's terms other than the iteration are not made inside the loop."""
    return not facts.made_inside(access.index, (loop.id,))


class StoreForward(Rule):
    name = "store-forward"
    technique = "loop-invariant-hoisting"
    summary = "a value stored in one iteration and loaded back in the next kept in a register"

    def plan(self, ctx: RuleContext) -> tuple[list[_Forward], str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return [], "the kernel's analysis is missing or incomplete"
        if not ctx.distinct_arrays():
            return [], "the spec does not allocate every pointer parameter on its own (a store through another could reach the element)"
        src, root = parse(ctx.preprocessed)
        pointers = {name for name, _, is_pointer in facts.params if is_pointer}
        found: list[_Forward] = []
        reasons: list[str] = []
        for loop in facts.loops:
            inside = [a for a in facts.accesses if loop.id in a.loops and a.space == "global"]
            for array in dict.fromkeys(a.array for a in inside if a.writes):
                mine = [a for a in inside if a.array == array]
                why, forward = self._forward(ctx, loop, mine, array in pointers, src, root)
                if forward is not None:
                    found.append(forward)
                elif why:
                    reasons.append(f"`{array}` in the loop at line {(loop.user_line or 0) + 1}: {why}")
        if not found:
            return [], "; ".join(reasons) or "no loop stores an element and loads it back in a later iteration"
        return found, ""

    def _forward(self, ctx: RuleContext, loop: LoopFact, mine: list[Access], pointer: bool, src: bytes,
                 root: Node) -> tuple[str, _Forward | None]:
        facts = ctx.facts
        assert facts is not None
        stores = [a for a in mine if a.writes]
        step = loop.step.constant if loop.step is not None else None
        loads = []
        for r in (a for a in mine if a.kind == "read"):
            if len(stores) == 1 and _previous(r, stores[0], loop, facts):
                loads.append(r)
        if not loads:
            return "", None  # nothing to forward: not a refusal worth naming
        store = stores[0]
        if loop.var is None or not step:
            return "the loop has no counter stepped by a constant", None
        if any(other.parent == loop.id for other in facts.loops):
            return "the loop has a loop of its own", None
        if loop.calls_unknown or any(loop.id in b.loops for b in facts.barriers) or any(
                loop.id in w.loops for w in facts.warp_operations):
            return "the loop has a barrier, a warp operation or a call the analysis does not see", None
        node = node_at(src, root, loop.span)
        body = node.child_by_field_name("body") if node is not None else None
        if body is None:
            return "the analysis finds no body of the loop", None
        if _has(body, ("continue_statement", "break_statement", "return_statement", "goto_statement")):
            return "the loop's body can leave an iteration early", None
        if not pointer or store.array in facts.escaped:
            return "it is not a pointer parameter of the kernel, or its address escapes", None
        if any(a.volatile or a.kind == "atomic" or a.field or a.via for a in mine):
            return "it is volatile, a struct member, updated atomically or reached through a helper", None
        if store.kind != "write":
            return f"`{store.text}` is a compound update, not a plain store", None
        target = node_at(src, root, store.span)
        assign = target.parent if target is not None else None
        if assign is None or assign.type != "assignment_expression" or assign.child_by_field_name("left") != target \
                or src[assign.child_by_field_name("operator").start_byte:assign.child_by_field_name("operator").end_byte] != b"=":
            return f"`{store.text}` is not the left side of a plain assignment", None
        statement = _statement_in_body(assign, body)
        if statement is None or statement.type != "expression_statement" or statement.named_children[0] != assign:
            return f"`{store.text}` is not stored by a statement directly in the loop's body (every iteration)", None
        if not _moves_only_by_trip(store, loop, facts):
            return f"`{store.text}` moves with a value the loop computes", None
        right = assign.child_by_field_name("right")
        early = [r for r in loads if r.span[1] <= statement.start_byte
                 or (right.start_byte <= r.span[0] and r.span[1] <= right.end_byte)]
        if not early:
            return "every load of the previous iteration's element comes after the store", None
        kind = " ".join(w for w in store.elem_type.split() if w not in ("const", "volatile"))
        if not kind:
            return f"`{store.text}` has no known element type", None
        return "", _Forward(loop, store, (right.start_byte, right.end_byte), tuple(early), kind)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        found, why = self.plan(ctx)
        if not found:
            return False, why
        return True, "; ".join(
            f"`{f.store.text}` stored once per iteration of the loop at line {(f.loop.user_line or 0) + 1} and loaded back "
            f"the next iteration ({', '.join(sorted({f'`{r.text}`' for r in f.loads}))}); no other pointer, thread or callee "
            "can reach the element in between"
            for f in found)

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        found, _ = self.plan(ctx)
        facts = ctx.facts
        assert facts is not None
        src, root = parse(ctx.preprocessed)
        edit = BodyEdit(ctx.preprocessed, facts)
        # A load as the user wrote it (``X[i1*N + (i2-1)]``, not the ``X[i1*1024 + (i2-1)]`` it expands to).
        user = UserText(ctx.preprocessed, facts, ctx.source, ctx.kernel)
        by_loop: dict[int, list[tuple[int, _Forward]]] = {}
        for n, f in enumerate(found):
            by_loop.setdefault(f.loop.id, []).append((n, f))
            edit.insert(f.right[0], f"(kl_fwd{n} = ")
            for r in f.loads:
                own = user.span(*r.span)
                edit.replace(r.span[0], r.span[1], f"(kl_first{f.loop.id} ? {edit.text(*r.span)} : kl_fwd{n})",
                             f"(kl_first{f.loop.id} ? {own} : kl_fwd{n})" if own else None)
            edit.insert(f.right[1], ")")
        for loop_id, items in by_loop.items():
            loop = facts.loops[loop_id]
            body = node_at(src, root, loop.span).child_by_field_name("body")
            indent = edit.indent_at(loop.span[0])
            pragma = pragma_before(edit.src, loop.span[0])
            registers = " ".join(f"{f.elem_type} kl_fwd{n};" for n, f in items)
            edit.insert(loop.span[0] if pragma is None else pragma[0], f"{{ {registers} bool kl_first{loop_id} = true;\n{indent}")
            if body.type == "compound_statement":
                last = body.named_children[-1]
                edit.insert(last.end_byte, f"\n{edit.indent_at(last.start_byte)}kl_first{loop_id} = false;")
            else:  # one statement: braces around it and the flag
                edit.insert(body.start_byte, "{ ")
                edit.insert(body.end_byte, f" kl_first{loop_id} = false; }}")
            edit.insert(loop.span[1], " }")
        source, expanded = emit(edit, ctx.source, ctx.kernel)
        what = ", ".join(f"`{f.store.text}`" for f in found)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"keep {what} in a register for the next iteration, which loads it back; the first "
                                f"iteration loads it from memory{note}"),)


def _previous(r: Access, store: Access, loop: LoopFact, facts: KernelFacts) -> bool:
    """``r`` reads the element ``store`` stored one iteration before: the same index less one step."""
    load, stored = canonical(r.index, facts), canonical(store.index, facts)
    stride = stored.coefficient(loop.trip_symbol)
    if stride is None or stride.constant in (None, 0) or load.coefficient(loop.trip_symbol) != stride:
        return False
    gap = load - stored
    return gap.constant is not None and gap.constant == -stride.constant
