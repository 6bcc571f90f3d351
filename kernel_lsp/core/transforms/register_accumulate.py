"""Keep a loop-invariant global or shared element in a register across the loop.

PolyBench-style kernels accumulate straight into global memory: ``for (k…) C[i*NJ + j] +=
A[i*NK + k] * B[k*NJ + j];`` reads and writes ``C`` once per iteration, a round trip through L1
or L2 each time, and the compiler may not keep it in a register because ``C`` could alias
``A`` or ``B``. Reductions that add each thread's inputs into its shared slot first
(``for (…) sdata[tid] += in[i + k*blockSize];``) make the same round trip through shared
memory on every iteration. When the analysis proves the element is the same on every iteration
and no other access can touch it, the element is loaded once before the loop and stored once after.

Legality, in terms of the analysis:
- every access to the array inside the loop has the same index, and that index is invariant in
  the loop (no iteration counter of the loop or of a loop inside it, no term made inside it);
- each of those accesses is a statement directly in the loop's body (not under a condition);
- the array is distinct from every other array the kernel touches (the spec allocates each
  pointer parameter on its own), it escapes to no unknown call, no atomic touches it and the
  loop calls nothing the analysis does not see;
- the names in its index are not declared inside the loop (the load moves before it);
- the loop runs at least once at every size of the spec (so the load and store before and after
  it touch only an element the original touched);
- for a shared array, also: the loop has no barrier and no warp operation, so no other thread may
  read or write the element while the loop runs without racing with the original's own accesses
  (its value is only seen by other threads after a barrier, which comes after the store). A
  ``volatile`` array (a warp-synchronous tree's) is no exception: a thread reading the slot while
  the loop runs, without a barrier, could see the value before the loop or after it in the
  original too, as its read can fall before the first store or after the last.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernel_lsp.core.analysis import Access, Binding, KernelFacts, LoopFact, declared_anywhere, trip_count
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError
from kernel_lsp.core.transforms.emit import BodyEdit, UserText, emit, node_at, parse, pragma_before


_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Plan:
    loop: LoopFact
    array: str
    accesses: tuple[Access, ...]


def _inside(facts: KernelFacts, loop: LoopFact) -> set[int]:
    """``loop`` and every loop nested in it."""
    found = {loop.id}
    changed = True
    while changed:
        changed = False
        for other in facts.loops:
            if other.parent in found and other.id not in found:
                found.add(other.id)
                changed = True
    return found


def _invariant(access: Access, facts: KernelFacts, loops: set[int]) -> bool:
    trips = {facts.loops[i].trip_symbol for i in loops}
    return not access.index.symbols & trips and not facts.made_inside(access.index, loops)


def _direct_statement(root, src: bytes, access: Access, loop: LoopFact) -> bool:
    """The access sits in an expression statement that is directly in the loop's body."""
    node = node_at(src, root, access.span)
    loop_node = node_at(src, root, loop.span)
    if node is None or loop_node is None:
        return False
    body = loop_node.child_by_field_name("body")
    while node is not None and node.type != "expression_statement":
        node = node.parent
    if node is None or body is None:
        return False
    return node == body or (node.parent == body and body.type == "compound_statement")


def _declared_in(root, src: bytes, loop: LoopFact) -> set[str]:
    loop_node = node_at(src, root, loop.span)
    return declared_anywhere(loop_node, src) if loop_node is not None else set()


def _identifiers(text: str) -> set[str]:
    return set(_NAME.findall(text))


class RegisterAccumulate(Rule):
    name = "register-accumulate"
    technique = "loop-invariant-hoisting"
    summary = "a loop-invariant global or shared element read and written in a loop kept in a register across it"

    def plans(self, ctx: RuleContext) -> tuple[list[Plan], str]:
        facts = ctx.facts
        if facts is None:
            return [], "the kernel was not found in the preprocessed view"
        if not facts.complete:
            return [], "the analysis of the kernel is incomplete"
        if ctx.spec is None:
            return [], "needs a launch spec (to prove the arrays distinct and the loop non-empty)"
        distinct = ctx.distinct_arrays()
        src, root = parse(ctx.preprocessed)
        try:
            bindings = [Binding.from_spec(ctx.spec, v) for v in [None, *range(len(ctx.spec.variants))]]
        except (SpecError, ValueError, ZeroDivisionError):
            return [], "the spec's launch does not evaluate"
        plans: list[Plan] = []
        taken: set[str] = set()
        reasons: list[str] = []
        pointers = {name for name, _, is_pointer in facts.params if is_pointer}
        # Outermost loops first: the element is hoisted as far out as it stays invariant.
        for loop in sorted(facts.loops, key=lambda lp: (lp.parent is not None, lp.id)):
            loops = _inside(facts, loop)
            in_loop = [a for a in facts.accesses if loop.id in a.loops and a.space in ("global", "shared")]
            for array in dict.fromkeys(a.array for a in in_loop if a.kind in ("update", "write")):
                mine = [a for a in in_loop if a.array == array]
                shared = mine[0].space == "shared"
                if array in taken or not (shared or array in pointers):
                    continue
                if shared:
                    why = self._shared_refusal(facts, loop, mine)
                else:
                    why = None if distinct else "the spec does not allocate every pointer parameter on its own (they may alias)"
                why = why or self._refusal(facts, loop, loops, mine, root, src, bindings)
                if why:
                    reasons.append(f"`{array}` in the loop at line {(loop.user_line or 0) + 1}: {why}")
                    continue
                plans.append(Plan(loop, array, tuple(mine)))
                taken.add(array)
        if not plans:
            return [], "; ".join(reasons) or "no loop reads and writes a global or shared element it does not move"
        return plans, ""

    @staticmethod
    def _shared_refusal(facts: KernelFacts, loop: LoopFact, mine: list[Access]) -> str | None:
        if any(loop.id in b.loops for b in facts.barriers) or any(loop.id in w.loops for w in facts.warp_operations):
            return "the loop has a barrier or a warp operation (other threads may see the element while it runs)"
        return None

    def _refusal(self, facts, loop, loops, mine, root, src, bindings) -> str | None:
        if loop.calls_unknown:
            return "the loop calls code the analysis does not see"
        if any(a.kind == "atomic" for a in mine) or any(a.field for a in mine):
            return "atomics or struct members"
        if len({a.index for a in mine}) != 1:
            return "its accesses use different indices"
        if not _invariant(mine[0], facts, loops):
            return "its index changes inside the loop"
        if mine[0].array in facts.escaped:
            return "its address escapes to code the analysis does not see"
        if not all(_direct_statement(root, src, a, loop) for a in mine):
            return "an access is under a condition inside the loop"
        whole = src[mine[0].span[0]:mine[0].span[1]].decode("utf-8")
        index_names = _identifiers(whole.split("[", 1)[1] if "[" in whole else "")
        if index_names & _declared_in(root, src, loop):
            return "its index uses names declared inside the loop"
        for binding in bindings:
            trips = trip_count(facts, loop, binding)
            if trips is None or trips < 1:
                return "the loop may run zero times at some size of the spec"
        return None

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plans, why = self.plans(ctx)
        if not plans:
            return False, why
        return True, "; ".join(
            f"`{p.accesses[0].text}` is the same element on every iteration of the loop at line {(p.loop.user_line or 0) + 1}, "
            "no other access can touch it (distinct arrays or a shared slot no other thread reaches during the loop, "
            "no unknown calls), and the loop runs at least once"
            for p in plans)

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plans, _ = self.plans(ctx)
        facts = ctx.facts
        edit = BodyEdit(ctx.preprocessed, facts)
        by_loop: dict[int, list[tuple[str, Plan]]] = {}
        for n, plan in enumerate(plans):
            name = f"kl_acc{n}"
            for a in plan.accesses:
                edit.replace(a.span[0], a.span[1], name, name)
            by_loop.setdefault(plan.loop.id, []).append((name, plan))
        types = {n: t for n, t, _ in facts.params}
        types.update({p.array: " ".join(w for w in p.accesses[0].elem_type.split() if w != "const")
                      for p in plans if p.accesses[0].space == "shared"})
        # The element type as the user wrote it where that is a macro (``DATA_TYPE``): the candidate keeps
        # following it if the file's definition changes.
        written = {q.name: q.base_type for q in ctx.kernel.params
                   if q.pointer_depth == 1 and q.base_type in ctx.preprocessed.macros}
        user = UserText(ctx.preprocessed, facts, ctx.source, ctx.kernel)

        def element(p: Plan, own: bool) -> str:
            """The element's text, as the user wrote it when ``own`` and it maps (``r[k*NJ + j]``, not the
            ``r[k*2048 + j]`` it expands to: a size literal the file never wrote would tie the candidate to it)."""
            return (own and user.span(*p.accesses[0].span)) or edit.text(*p.accesses[0].span)

        for loop_id, items in by_loop.items():
            loop = facts.loops[loop_id]
            indent = edit.indent_at(loop.span[0])

            def around(own: bool) -> tuple[str, str]:
                # In a template the element's type is the instance's: ``auto`` (cv-qualifiers dropped) is each
                # instance's own.
                loads = " ".join(f"{'auto' if ctx.kernel.is_template else written.get(p.array, types[p.array]) if own else types[p.array]} "
                                 f"{name} = {element(p, own)};" for name, p in items)
                stores = " ".join(f"{element(p, own)} = {name};" for name, p in items)
                return "{ " + loads + "\n" + indent, "\n" + indent + stores + " }"

            (head, tail), (own_head, own_tail) = around(False), around(True)
            # A pragma of the user's stays right before its loop: the load goes before the pragma.
            pragma = pragma_before(edit.src, loop.span[0])
            edit.insert(loop.span[0] if pragma is None else pragma[0], head, own_head)
            edit.insert(loop.span[1], tail, own_tail)
        source, expanded = emit(edit, ctx.source, ctx.kernel)
        what = ", ".join(f"`{p.accesses[0].text}`" for p in plans)
        macro_note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"keep {what} in a register across its loop: loaded once before, stored once after"
                                + macro_note),)
