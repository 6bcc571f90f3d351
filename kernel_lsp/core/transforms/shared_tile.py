"""An uncoalesced store staged through a shared-memory tile, written back coalesced.

A naive transpose (``out[x * H + y] = in[y * W + x]``), a permute, a column sweep: neighbouring
lanes (``threadIdx.x``) store a whole row apart, one 32-byte sector per 4-byte element, while the
block's threads along ``threadIdx.y`` store neighbouring elements. The rewrite lets each thread
put what it would store, the element's index and the value, into a slot of a shared tile instead;
after a barrier, the block's threads write the tile out in the transposed order: flat thread
``l`` writes the element of thread ``(x = l / blockDim.y, y = l % blockDim.y)``, so consecutive
lanes write consecutive elements (``blockDim.y`` of them per row: with 8 or more 4-byte elements a
row fills whole sectors). The tile is ``blockDim.x`` rows of ``blockDim.y + 1`` slots: the +1
pads each row so the 32 lanes filling a column (``threadIdx.x`` = 0…31) hit 32 different banks.

Every store happens exactly once, with the index and value its own thread computed: only which
thread issues it, and when within the round, changes. A slot carries a flag set only by a thread
that reached the store, so the original guard (``if (x < n && y < m)``) stays the store's guard
for ragged edges while the barriers are reached by every thread: the guard decides what is
staged (the load side keeps it), the flag decides what is written back (the store side).

A *round* is one iteration of the innermost loop around the store (or the whole kernel when
there is none); the tile is written back at the end of each round, after the statement of that
loop's body (or of the kernel's body) that holds the store.

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a plain store ``A[i] = v;`` to global memory that the launch makes uncoalesced (strided), whose
  index has unit stride along ``threadIdx.y`` (neighbouring elements across the block's rows);
- ``A`` is touched by no other access, its address escapes nowhere, and the spec gives every
  pointer its own allocation (nothing else reads or writes what the deferred store writes);
- no barrier, shared memory, warp intrinsic or atomic in the original, and no ``return``,
  ``break``, ``continue`` or ``goto`` except a last ``return;`` (every thread reaches the barriers);
- the store is reached from the body through uniform counted loops only (start, bound and step
  the same for every thread of the block, the condition one comparison of the loop variable),
  then through ``if``/blocks inside one statement of the innermost such body: no other loop
  between that statement and the store, so a thread stores at most once per round;
- ``i`` and ``v`` have no side effects (no assignment, increment or call);
- the tile fits: a launch whose block does not fit the tile (or has ``blockDim.z > 1``) runs the
  original store (the condition is the same for the whole block, so the barriers stay uniform).
"""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import Access, Binding, KernelFacts, LoopFact, bind, thread_dependence
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError
from kernel_lsp.core.transforms.emit import BodyEdit, emit, node_at, parse

_JUMPS = ("break_statement", "continue_statement", "goto_statement")
_SIDE_EFFECTS = ("assignment_expression", "update_expression", "call_expression")
_COMPARISONS = ("<", "<=", ">", ">=", "!=")
#: Elements along ``threadIdx.y`` below which the written-back rows fill less than a 32-byte
#: sector of 4-byte elements twice over: the gain would not pay for the barriers.
_MIN_ROW_ELEMS = 4


@dataclass(frozen=True)
class _Plan:
    access: Access
    statement: Node
    """The expression statement ``A[i] = v;``."""
    index: Node
    value: Node
    round_statement: Node
    """The statement of the innermost loop's body (or the kernel's) that holds the store."""
    slots: int
    """Slots of the tile: the largest block of the spec, padded (``bx * (by + 1)``)."""


def _text(src: bytes, node: Node) -> str:
    return src[node.start_byte : node.end_byte].decode("utf-8")


def _find(node: Node, types: tuple[str, ...]) -> Node | None:
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type in types:
            return n
        stack.extend(n.children)
    return None


def _uniform_loop(loop: LoopFact, node: Node, facts: KernelFacts, src: bytes) -> str | None:
    """Why ``loop`` may run a different number of times in different threads of a block (None: it cannot)."""
    if node.type != "for_statement" or loop.var is None or loop.start is None or loop.step is None or loop.bound is None:
        return "is not a counted for loop"
    cond = node.child_by_field_name("condition")
    op = cond.child_by_field_name("operator") if cond is not None and cond.type == "binary_expression" else None
    if op is None or _text(src, op) not in _COMPARISONS or loop.var not in {
            _text(src, side) for side in (cond.child_by_field_name("left"), cond.child_by_field_name("right")) if side is not None}:
        return "has a condition that is not one comparison of its variable"
    if any(thread_dependence(p, facts.opaque) for p in (loop.start, loop.step, loop.bound)):
        return "runs a number of times that depends on the thread"
    return None


class SharedTileStore(Rule):
    name = "shared-tile-store"
    technique = "transpose-via-shared-memory"
    summary = "an uncoalesced 2-D store staged through a padded shared tile and written back coalesced"

    def plan(self, ctx: RuleContext) -> tuple[_Plan | None, str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        if ctx.spec is None:
            return None, "needs a launch spec (to find the uncoalesced store under the launch)"
        if not ctx.distinct_arrays():
            return None, "the spec does not allocate every pointer parameter on its own (they may alias)"
        if facts.syncs or facts.shuffles or any(a.space == "shared" for a in facts.accesses) or any(
                a.kind == "atomic" for a in facts.accesses):
            return None, "barriers, shared memory, warp intrinsics or atomics: the threads are not independent"
        launches = ctx.launches()
        if not launches:
            return None, "the spec's launch does not evaluate"
        if any(launch.block[2] != 1 for launch in launches):
            return None, "the block is three-dimensional"
        try:
            patterns = bind(facts, Binding.from_spec(ctx.spec))
        except (SpecError, ValueError, ZeroDivisionError):
            return None, "the spec's launch does not evaluate"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return None, "the kernel's definition was not found in the preprocessed view"
        why = self._jumps(body)
        if why:
            return None, why
        reasons: list[str] = []
        for p in patterns:
            a = p.access
            if a.space != "global" or a.kind != "write" or p.pattern != "strided":
                continue
            along_y = a.index.coefficient("tid.y")
            if along_y is None or along_y.constant != 1:
                reasons.append(f"the store `{a.text}` has no unit stride along threadIdx.y")
                continue
            why, plan = self._store_plan(ctx, facts, a, root, src, body, launches)
            if why:
                reasons.append(f"the store `{a.text}` at line {(a.user_line or 0) + 1}: {why}")
                continue
            return plan, ""
        return None, "; ".join(reasons) or "no uncoalesced global store under this launch"

    def _jumps(self, body: Node) -> str | None:
        if _find(body, _JUMPS) is not None:
            return "a break, continue or goto: a thread could skip the barriers"
        last = body.named_children[-1] if body.named_children else None
        stack = list(body.children)
        while stack:
            n = stack.pop()
            if n.type == "return_statement" and not (n == last and n.named_child_count == 0):
                return "a return before the kernel's end: a thread could skip the barriers"
            stack.extend(n.children)
        return None

    def _store_plan(self, ctx: RuleContext, facts: KernelFacts, a: Access, root: Node, src: bytes, body: Node,
                    launches) -> tuple[str | None, _Plan | None]:
        if a.field is not None or a.via:
            return "a struct member or inside a helper function", None
        if a.array in facts.escaped:
            return "its address escapes to code the analysis does not see", None
        others = [b for b in facts.accesses if b.array == a.array and b is not a]
        if others:
            return f"`{a.array}` is accessed elsewhere in the kernel (line {(others[0].user_line or 0) + 1})", None
        node = node_at(src, root, a.span)
        assign = node.parent if node is not None else None
        if assign is None or assign.type != "assignment_expression" or assign.child_by_field_name("left") != node \
                or _text(src, assign.child_by_field_name("operator")) != "=" or assign.parent is None \
                or assign.parent.type != "expression_statement":
            return "not a plain statement `A[i] = v;`", None
        index, value = node.child_by_field_name("indices"), assign.child_by_field_name("right")
        if index is None or value is None or node.child_by_field_name("argument") is None \
                or _text(src, node.child_by_field_name("argument")).strip() != a.array:
            return "not a subscript of the array's own name", None
        if any(_find(part, _SIDE_EFFECTS) is not None for part in (index, value)):
            return "its index or value has side effects (an assignment, an increment or a call)", None
        if index.type == "subscript_argument_list":
            parts = index.named_children
            if len(parts) != 1:
                return "a multi-index subscript", None
            index = parts[0]
        statement = assign.parent
        loops = {(lp.span[0], lp.span[1]): lp for lp in facts.loops}
        chain: list[Node] = [statement]
        while chain[-1].parent is not None and chain[-1].parent != body:
            chain.append(chain[-1].parent)
        if chain[-1].parent is None:
            return "not inside the kernel's body", None
        # Down from the body: blocks and uniform loops, then the round's statement, then no loop down to the store.
        round_statement: Node | None = None
        for n in reversed(chain):
            if round_statement is None:
                if n.type == "compound_statement":
                    continue
                if n.type == "for_statement":
                    loop = loops.get((n.start_byte, n.end_byte))
                    why = _uniform_loop(loop, n, facts, src) if loop is not None else "is not modelled"
                    if why:
                        return f"the loop at line {n.start_point[0] + 1} {why}", None
                    continue
                if n.type not in ("if_statement", "expression_statement"):
                    return f"the store sits in a {n.type.replace('_', ' ')} that is not a counted loop", None
                round_statement = n
            elif n.type in ("for_statement", "while_statement", "do_statement"):
                return "another loop between the round and the store (a thread could store twice per round)", None
        if round_statement is None:
            return "the store was not found under the kernel's body", None
        if any(launch.block[1] < _MIN_ROW_ELEMS for launch in launches):
            return (f"blockDim.y is below {_MIN_ROW_ELEMS} at some size of the spec: the written-back rows would not "
                    "fill a sector"), None
        if not a.elem_type:
            return "the element type is not known", None
        slots = max(launch.block[0] * (launch.block[1] + 1) for launch in launches)
        return None, _Plan(a, statement, index, value, round_statement, slots)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        return True, (f"the store `{plan.access.text}` is a row apart across the warp and unit stride along threadIdx.y; "
                      f"`{plan.access.array}` is touched by nothing else, every thread reaches the end of each round "
                      "(uniform loops, no early exit), and a flag per slot keeps the original guard")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        facts = ctx.facts
        assert plan is not None and facts is not None
        edit = BodyEdit(ctx.preprocessed, facts)
        elem = plan.access.elem_type
        lo, _hi = facts.body_span
        edit.insert(lo + 1, (
            f"\n    // The uncoalesced store to `{plan.access.array}` staged in a tile of blockDim.x rows x "
            "(blockDim.y + 1) slots (the +1 pads a column onto 32 banks).\n"
            f"    __shared__ long long kl_tile_index[{plan.slots}];\n"
            f"    __shared__ {elem} kl_tile_value[{plan.slots}];\n"
            f"    __shared__ unsigned char kl_tile_set[{plan.slots}];\n"
            f"    const bool kl_tiled = blockDim.z == 1 && blockDim.x * (blockDim.y + 1) <= {plan.slots}u;\n"
            "    const unsigned kl_mine = threadIdx.x * (blockDim.y + 1) + threadIdx.y;\n"))
        index = edit.text(plan.index.start_byte, plan.index.end_byte)
        value = edit.text(plan.value.start_byte, plan.value.end_byte)
        edit.replace(plan.statement.start_byte, plan.statement.end_byte, (
            f"if (kl_tiled) {{ kl_tile_index[kl_mine] = (long long)({index}); kl_tile_value[kl_mine] = ({value}); "
            f"kl_tile_set[kl_mine] = 1; }} else {plan.access.array}[{index}] = {value};"))
        indent = edit.indent_at(plan.round_statement.start_byte)
        inner = indent + "    "
        edit.insert(plan.round_statement.start_byte, "{ if (kl_tiled) kl_tile_set[kl_mine] = 0;\n" + indent)
        edit.insert(plan.round_statement.end_byte, (
            f"\n{indent}if (kl_tiled) {{\n"
            f"{inner}__syncthreads();\n"
            # Flat thread l writes back the slot of thread (l / blockDim.y, l % blockDim.y): consecutive lanes,
            # consecutive threadIdx.y, consecutive elements.
            f"{inner}const unsigned kl_l = threadIdx.y * blockDim.x + threadIdx.x;\n"
            f"{inner}const unsigned kl_slot = (kl_l / blockDim.y) * (blockDim.y + 1) + kl_l % blockDim.y;\n"
            f"{inner}if (kl_tile_set[kl_slot]) {plan.access.array}[kl_tile_index[kl_slot]] = kl_tile_value[kl_slot];\n"
            f"{inner}__syncthreads();\n"
            f"{indent}}} }}"))
        source, expanded = emit(edit, ctx.source, ctx.kernel)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"the store `{plan.access.text}` staged through a padded shared tile and written back "
                                f"with consecutive threads on consecutive elements{note}"),)
