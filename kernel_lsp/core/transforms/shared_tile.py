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
  index has unit stride along ``threadIdx.y``, of either sign (neighbouring elements across the
  block's rows: ``dst[c * rows + (rows - 1 - r)]`` too);
- ``A`` is touched by no other access, its address escapes nowhere, and the spec gives every
  pointer its own allocation (nothing else reads or writes what the deferred store writes);
- no ``return``, ``break``, ``continue`` or ``goto`` except a last ``return;`` (every thread reaches
  the barriers); the kernel's own barriers, shared arrays and warp operations stay as they are (the
  tile only defers who issues the store), the tile fits beside its shared memory;
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

from kernel_lsp.core.analysis import has_node as _has
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.analysis import (
    Access, Binding, KernelFacts, LoopFact, assigned_names, bind, declared_anywhere, thread_dependence,
)
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError
from kernel_lsp.core.transforms.counted_loop import counted_loop, loop_test
from kernel_lsp.core.transforms.emit import BodyEdit, emit, node_at, parse, user_line_of
from kernel_lsp.core.transforms.tile_contraction import TileContraction

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


def _uniform_loop(loop: LoopFact, node: Node, facts: KernelFacts, src: bytes) -> str | None:
    """Why ``loop`` may run a different number of times in different threads of a block (None: it cannot)."""
    if loop.var is None or loop.start is None or loop.step is None or loop.bound is None:
        return "has no counter the analysis follows (a variable started, tested and stepped)"
    cond = loop_test(node)
    op = cond.child_by_field_name("operator") if cond is not None and cond.type == "binary_expression" else None
    if op is None or _text(src, op) not in _COMPARISONS or loop.var not in {
            _text(src, side) for side in (cond.child_by_field_name("left"), cond.child_by_field_name("right")) if side is not None}:
        return "has a test that does not bound its counter alone"
    if any(thread_dependence(p, facts.opaque) for p in (loop.start, loop.step, loop.bound)):
        return "runs a number of times that depends on the thread"
    # Scalars and the block's own coordinates only: a bound loaded from memory could differ between threads
    # that read it at different times.
    scalars = {name for name, _, is_pointer in facts.params if not is_pointer}
    if any(not (sym.startswith(("bdim.", "gdim.", "bid.")) or sym in scalars)
           for p in (loop.start, loop.step, loop.bound) for sym in p.symbols):
        return "has bounds that are not made of the kernel's scalars and the block's coordinates"
    changed = assigned_names(node.child_by_field_name("body"), src)
    # A ``while`` loop's counter is stepped by its body's one statement (the analysis' counter).
    if loop.kind == "while":
        changed -= {loop.var}
    if loop.var in changed or {_text(src, n) for n in _identifier_nodes(cond, src)} & changed:
        return "has a variable or bound that its body assigns"
    return None


def _independent_threads(ctx: RuleContext, access: str) -> str | None:
    """Why the threads cannot be regrouped around a tile (both rules' first conditions), or None."""
    facts = ctx.facts
    if facts is None or not facts.complete:
        return "the kernel's analysis is missing or incomplete"
    if ctx.spec is None:
        return f"needs a launch spec (to find the uncoalesced {access} under the launch)"
    if not ctx.distinct_arrays():
        return "the spec does not allocate every pointer parameter on its own (they may alias)"
    if facts.implicit_indices:
        return f"the kernel reads its thread index through a cooperative group (`{facts.implicit_indices[0]}`)"
    # The kernel's own barriers, shared arrays and warp operations stay as they are: the tile only defers
    # who issues one store (or load), and its barriers are reached by every thread.
    return None


def _shared_in_use(ctx: RuleContext) -> int:
    """Bytes of shared memory the kernel already uses per block (static arrays and the spec's dynamic size)."""
    static = sum(d.size_bytes or 0 for d in ctx.kernel.shared if not d.is_extern)
    return static + max((launch.dynamic_smem_bytes for launch in ctx.launches()), default=0)


class SharedTileStore(Rule):
    name = "shared-tile-store"
    technique = "transpose-via-shared-memory"
    summary = "an uncoalesced 2-D store staged through a padded shared tile and written back coalesced"

    def plan(self, ctx: RuleContext) -> tuple[_Plan | None, str]:
        why = _independent_threads(ctx, "store")
        if why:
            return None, why
        facts = ctx.facts
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
            # Either sign: the rows written back are consecutive elements, ascending or descending.
            if along_y is None or along_y.constant not in (1, -1):
                reasons.append(f"the store `{a.text}` has no unit stride along threadIdx.y")
                continue
            why, plan = self._store_plan(ctx, facts, a, root, src, body, launches)
            if why:
                reasons.append(f"the store `{a.text}` at line {(a.user_line or 0) + 1}: {why}")
                continue
            return plan, ""
        return None, "; ".join(reasons) or "no uncoalesced global store under this launch"

    def _jumps(self, body: Node) -> str | None:
        if _has(body, _JUMPS):
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
        # The gain: a loop the store is not in that moves global memory repeats its traffic; the store's is then a
        # small part of the kernel's and staging it would not pay for the barriers.
        busier = next((b for b in facts.accesses if b.space == "global" and b.loops
                       and not set(b.loops) <= set(a.loops)), None)
        if busier is not None:
            return (f"`{busier.text}` at line {(busier.user_line or 0) + 1} repeats in a loop the store is not in: "
                    "the store is a small part of the kernel's traffic"), None
        others = [b for b in facts.accesses if b.array == a.array and b is not a]
        if others:
            return f"`{a.array}` is accessed elsewhere in the kernel (line {(others[0].user_line or 0) + 1})", None
        node = node_at(src, root, a.span)
        assign = node.parent if node is not None else None
        if assign is None or assign.type != "assignment_expression" or assign.child_by_field_name("left") != node \
                or _text(src, assign.child_by_field_name("operator")) != "=" or assign.parent is None \
                or assign.parent.type != "expression_statement":
            return "the store is a compound assignment or part of a larger expression", None
        index, value = node.child_by_field_name("indices"), assign.child_by_field_name("right")
        if index is None or value is None or node.child_by_field_name("argument") is None \
                or _text(src, node.child_by_field_name("argument")).strip() != a.array:
            return "not a subscript of the array's own name", None
        if any(_has(part, _SIDE_EFFECTS) for part in (index, value)):
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
                if n.type in ("for_statement", "while_statement"):
                    loop = loops.get((n.start_byte, n.end_byte))
                    why = _uniform_loop(loop, n, facts, src) if loop is not None else "is not modelled"
                    if why:
                        return f"the loop at line {user_line_of(ctx.preprocessed, n.start_point[0])} {why}", None
                    continue
                if n.type not in ("if_statement", "expression_statement"):
                    return f"the store sits in a {n.type.replace('_statement', '').replace('_', ' ')} whose runs the analysis does not count", None
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
        tile_bytes = slots * (8 + (a.elem_bytes or 8) + 1)
        if tile_bytes + _shared_in_use(ctx) > _STATIC_SMEM_BYTES:
            return (f"the tile ({tile_bytes} bytes) does not fit beside the kernel's {_shared_in_use(ctx)} bytes of shared "
                    "memory"), None
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
            f"    __shared__ long long kl_stage_index[{plan.slots}];\n"
            f"    __shared__ {elem} kl_stage_value[{plan.slots}];\n"
            f"    __shared__ unsigned char kl_stage_set[{plan.slots}];\n"
            f"    const bool kl_staged = blockDim.z == 1 && blockDim.x * (blockDim.y + 1) <= {plan.slots}u;\n"
            "    const unsigned kl_stage_mine = threadIdx.x * (blockDim.y + 1) + threadIdx.y;\n"))
        index = edit.text(plan.index.start_byte, plan.index.end_byte)
        value = edit.text(plan.value.start_byte, plan.value.end_byte)
        edit.replace(plan.statement.start_byte, plan.statement.end_byte, (
            f"if (kl_staged) {{ kl_stage_index[kl_stage_mine] = (long long)({index}); kl_stage_value[kl_stage_mine] = ({value}); "
            f"kl_stage_set[kl_stage_mine] = 1; }} else {plan.access.array}[{index}] = {value};"))
        indent = edit.indent_at(plan.round_statement.start_byte)
        inner = indent + "    "
        edit.insert(plan.round_statement.start_byte, "{ if (kl_staged) kl_stage_set[kl_stage_mine] = 0;\n" + indent)
        edit.insert(plan.round_statement.end_byte, (
            f"\n{indent}if (kl_staged) {{\n"
            f"{inner}__syncthreads();\n"
            # Flat thread l writes back the slot of thread (l / blockDim.y, l % blockDim.y): consecutive lanes,
            # consecutive threadIdx.y, consecutive elements.
            f"{inner}const unsigned kl_stage_l = threadIdx.y * blockDim.x + threadIdx.x;\n"
            f"{inner}const unsigned kl_stage_slot = (kl_stage_l / blockDim.y) * (blockDim.y + 1) + kl_stage_l % blockDim.y;\n"
            f"{inner}if (kl_stage_set[kl_stage_slot]) {plan.access.array}[kl_stage_index[kl_stage_slot]] = kl_stage_value[kl_stage_slot];\n"
            f"{inner}__syncthreads();\n"
            f"{indent}}} }}"))
        source, expanded = emit(edit, ctx.source, ctx.kernel)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"the store `{plan.access.text}` staged through a padded shared tile and written back "
                                f"with consecutive threads on consecutive elements{note}"),)


# --------------------------------------------------------------------------------------------
# The load side: a thread-per-row loop reading its row, staged a few iterations at a time (not a read that
# tile-contraction shares across the block: on the H200 that gave 20-25x where this staging gave 1.3-1.6x)
# --------------------------------------------------------------------------------------------

#: One 32-byte sector of elements per thread and chunk: the loader's lanes then read whole sectors.
_SECTOR_BYTES = 32
_LINE_BYTES = 128
#: Static shared memory one block may declare.
_STATIC_SMEM_BYTES = 48 * 1024
_LOAD_INTRINSICS = ("__ldg", "__ldca", "__ldcg", "__ldcs", "__ldlu", "__ldcv")
_CONDITIONAL = ("if_statement", "conditional_expression", "switch_statement")


@dataclass(frozen=True)
class _LoadPlan:
    access: Access
    loop: LoopFact
    loop_node: Node
    guard: Node | None
    """The ``if`` around the loop (its condition is evaluated once, as before); the other statements it holds
    run under the condition's value, declarations with their initialiser under it."""
    chunk: int
    """Iterations staged at a time: a 128-byte line of elements per thread where the tile fits, down to a sector."""
    threads: int
    """The tile's rows: the spec's largest block."""


def _identifier_nodes(node: Node, src: bytes) -> list[Node]:
    found, stack = [], [node]
    while stack:
        n = stack.pop()
        if n.type == "identifier":
            found.append(n)
        elif n.type == "field_expression":
            arg = n.child_by_field_name("argument")
            if arg is not None:
                stack.append(arg)
            continue
        stack.extend(n.children)
    return found


def _substituted(src: bytes, node: Node, name: str, new: str) -> str:
    """``node``'s text with every identifier ``name`` replaced by ``new``."""
    out, at = [], node.start_byte
    for ident in sorted(_identifier_nodes(node, src), key=lambda n: n.start_byte):
        if _text(src, ident) == name:
            out.append(src[at:ident.start_byte].decode("utf-8"))
            out.append(new)
            at = ident.end_byte
    out.append(src[at:node.end_byte].decode("utf-8"))
    return "".join(out)


def _monotone_condition(cond: Node, var: str, src: bytes) -> bool:
    """``var < b`` / ``var <= b`` / ``b > var`` / ``b >= var``: once false for a growing ``var``, false for good."""
    op = _text(src, cond.child_by_field_name("operator"))
    left, right = cond.child_by_field_name("left"), cond.child_by_field_name("right")
    if op in ("<", "<=") and left.type == "identifier" and _text(src, left) == var:
        return True
    return op in (">", ">=") and right.type == "identifier" and _text(src, right) == var


def _unit_increment(update: Node | None, var: str, src: bytes) -> bool:
    if update is None:
        return False
    text = "".join(_text(src, update).split())
    return text in (f"{var}++", f"++{var}", f"{var}+=1", f"{var}={var}+1")


class SharedTileLoad(Rule):
    name = "shared-tile-load"
    technique = "transpose-via-shared-memory"
    summary = "a row read a row apart across the warp staged through a padded shared tile, a sector per thread at a time"

    def plan(self, ctx: RuleContext) -> tuple[_LoadPlan | None, str]:
        why = _independent_threads(ctx, "read")
        if why:
            return None, why
        facts = ctx.facts
        launches = ctx.launches()
        try:
            patterns = bind(facts, Binding.from_spec(ctx.spec))
        except (SpecError, ValueError, ZeroDivisionError):
            return None, "the spec's launch does not evaluate"
        if not launches:
            return None, "the spec's launch does not evaluate"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return None, "the kernel's definition was not found in the preprocessed view"
        why = SharedTileStore._jumps(None, body)  # type: ignore[arg-type]
        if why:
            return None, why
        # A read that tile-contraction stages already (an operand the block's threads share) goes through shared
        # memory there, once per block rather than once per thread: this staging would only compete with it.
        contracted, _ = TileContraction().plan(ctx)
        tiled = {t.span for tile in contracted.tiles for t in tile.accesses} if contracted is not None else set()
        reasons: list[str] = []
        for p in patterns:
            a = p.access
            if a.space != "global" or a.kind != "read" or p.pattern != "strided" or not a.loops or p.loop_stride_elems != 1:
                continue
            if a.span in tiled:
                reasons.append(f"the read `{a.text}` at line {(a.user_line or 0) + 1} is an operand tile-contraction "
                               "shares through shared memory across the block")
                continue
            why, plan = self._read_plan(ctx, facts, a, root, src, body, launches)
            if why:
                reasons.append(f"the read `{a.text}` at line {(a.user_line or 0) + 1}: {why}")
                continue
            return plan, ""
        return None, "; ".join(reasons) or "no uncoalesced global read with unit stride along its loop under this launch"

    def _read_plan(self, ctx, facts: KernelFacts, a: Access, root: Node, src: bytes, body: Node,
                   launches) -> tuple[str | None, _LoadPlan | None]:
        if a.field is not None or a.via:
            return "a struct member or inside a helper function", None
        if a.array in facts.escaped or any(b.array == a.array and b.kind != "read" for b in facts.accesses):
            return f"`{a.array}` is written in the kernel or escapes", None
        loop = facts.loops[a.loops[-1]]
        loop_node = node_at(src, root, loop.span)
        if loop_node is None:
            return "its loop was not found", None
        why = _uniform_loop(loop, loop_node, facts, src)
        if why:
            return f"its loop {why}", None
        # Whether the counter is used after the loop is asked below, with the guard's threads in mind.
        counted, why = counted_loop(loop, loop_node, facts.body_span, src, ends_elsewhere=False)
        if counted is None:
            return f"its loop: {why}", None
        cond = counted.test
        if not _monotone_condition(cond, loop.var, src) or _has(cond, _SIDE_EFFECTS + ("subscript_expression",)):
            return "its loop's test is not an upper bound of its counter fixed before the loop (it loads memory or calls code)", None
        if not _unit_increment(counted.step, loop.var, src):
            return "its loop's counter does not step by one", None
        if any(other.parent == loop.id for other in facts.loops) or loop.calls_unknown:
            return "its loop holds a nested loop or calls code the analysis does not see", None
        loop_body = loop_node.child_by_field_name("body")
        if counted.step_statement is None and loop.var in assigned_names(loop_body, src):
            return "its loop assigns its own variable in the body", None
        along = a.index.coefficient(loop.trip_symbol)
        if along is None or along.constant != 1 or facts.made_inside(a.index, (loop.id,)):
            return "its index is not the loop's iteration plus a part the loop does not change", None
        node = node_at(src, root, a.span)
        if node is None:
            return "the read was not found", None
        subscript = _loaded_subscript(node, src)
        if subscript is None:
            return "not a subscript or a load intrinsic of one", None
        if node.parent is not None and node.parent.type == "pointer_expression":
            return "its address is taken", None
        if _conditional_in(node, loop_node, src):
            return "the read is conditional inside the loop (staging would read what the original skips)", None
        if subscript.child_by_field_name("indices") is None or _has(subscript, _SIDE_EFFECTS):
            return "its index has side effects", None
        names = {_text(src, n) for n in _identifier_nodes(subscript, src)} | {a.array}
        if names & (assigned_names(loop_body, src) | declared_anywhere(loop_body, src)):
            return "its address uses names made inside the loop", None
        if _mentioned_after(body, loop_node, loop.var, src):
            return "the loop's variable is used outside the loop (threads outside the guard would now run the loop)", None
        # From the loop up to the body: at most one guard whose only statement is the loop, then blocks and uniform loops.
        guard: Node | None = None
        child, up = loop_node, loop_node.parent
        loops = {(lp.span[0], lp.span[1]): lp for lp in facts.loops}
        while up is not None and up != body:
            if up.type == "compound_statement":
                if guard is None and up.parent is not None and up.parent.type == "if_statement":
                    why = _guard_siblings_refusal(up, loop_node, src)
                    if why:
                        return f"the guard around the loop: {why}", None
            elif up.type == "if_statement" and guard is None and child == up.child_by_field_name("consequence") \
                    and up.child_by_field_name("alternative") is None:
                cond_node = up.child_by_field_name("condition")
                if cond_node is None or _has(cond_node, _SIDE_EFFECTS):
                    return "the guard's condition has side effects", None
                guard = up
            elif up.type in ("for_statement", "while_statement"):
                outer = loops.get((up.start_byte, up.end_byte))
                why = _uniform_loop(outer, up, facts, src) if outer is not None else "is not modelled"
                if why:
                    return f"the enclosing loop at line {user_line_of(ctx.preprocessed, up.start_point[0])} {why}", None
            else:
                return f"the loop sits in a {up.type.replace('_', ' ')} that every thread would not reach", None
            child, up = up, up.parent
        elem = a.elem_bytes or ctx.spec and Binding.from_spec(ctx.spec).elem_bytes.get(a.array)
        if not elem or not a.elem_type:
            return "the element type is not known", None
        threads = max(launch.block[0] * launch.block[1] * launch.block[2] for launch in launches)
        # A chunk of a 128-byte line per thread where the tile fits (the loader's warp then reads whole lines),
        # down to one 32-byte sector; per thread: the padded row of values, a pointer and a count.
        room = _STATIC_SMEM_BYTES - _shared_in_use(ctx)
        fitting = [k for k in (_LINE_BYTES // elem, _LINE_BYTES // elem // 2, _SECTOR_BYTES // elem)
                   if k >= 1 and threads * ((k + 1) * elem + 8 + 4) <= room]
        if not fitting:
            smem = threads * ((max(1, _SECTOR_BYTES // elem) + 1) * elem + 12)
            return (f"the tile ({smem} bytes for {threads} threads) does not fit the static shared memory of a block "
                    "beside the kernel's own"), None
        chunk = fitting[0]
        return None, _LoadPlan(a, loop, loop_node, guard, chunk, threads)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        return True, (f"the read `{plan.access.text}` is a row apart across the warp and unit stride along its loop; "
                      f"`{plan.access.array}` is never written, the read is unconditional in the loop, whose count is the "
                      "same for every thread; the guard around it is kept as each slot's flag")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        facts = ctx.facts
        assert plan is not None and facts is not None
        src, root = parse(ctx.preprocessed)
        edit = BodyEdit(ctx.preprocessed, facts)
        a, k, rows = plan.access, plan.chunk, plan.threads
        var = plan.loop.var
        slots = rows * (k + 1)
        lo, _hi = facts.body_span
        edit.insert(lo + 1, (
            f"\n    // The read `{a.text}` staged {k} iterations at a time in a tile of one row of {k} + 1 slots per thread "
            "(the +1 pads a column onto 32 banks).\n"
            f"    __shared__ {a.elem_type} kl_rtile_value[{slots}];\n"
            f"    __shared__ const {a.elem_type}* kl_rtile_from[{rows}];\n"
            f"    __shared__ int kl_rtile_count[{rows}];\n"
            "    const unsigned kl_rthreads = blockDim.x * blockDim.y * blockDim.z;\n"
            f"    const bool kl_rtiled = kl_rthreads <= {rows}u;\n"
            "    const unsigned kl_rme = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);\n"))
        loop_node = plan.loop_node
        loop_cond = loop_test(loop_node)
        index = src[a.span[0]:a.span[1]].decode("utf-8")
        address = "&" + _text(src, _loaded_subscript(node_at(src, root, a.span), src))
        staged_cond = _substituted(src, loop_cond, var, "kl_ri")
        loop_body = loop_node.child_by_field_name("body")
        ind = edit.indent_at(loop_node.start_byte) + "    "
        edit.insert(loop_body.start_byte, (
            f"{{\n{ind}if (kl_rtiled && kl_rk == 0) {{\n"
            f"{ind}    __syncthreads();\n"
            # Each thread notes where its next iterations read (the index moves one element per iteration) and how
            # many of them run: its guard and the loop's condition, which once false stays false ...
            f"{ind}    int kl_rn = 0;\n"
            f"{ind}    for (int kl_rj = 0; kl_rj < {k}; kl_rj++) {{\n"
            f"{ind}        const auto kl_ri = {var} + kl_rj;\n"
            f"{ind}        if (kl_rg && ({staged_cond})) kl_rn = kl_rj + 1;\n"
            f"{ind}    }}\n"
            f"{ind}    kl_rtile_count[kl_rme] = kl_rn;\n"
            f"{ind}    if (kl_rn) kl_rtile_from[kl_rme] = {address};\n"
            f"{ind}    __syncthreads();\n"
            # ... then the block reads them, consecutive threads on one thread's consecutive elements.
            f"{ind}    for (unsigned kl_rs = kl_rme; kl_rs < kl_rthreads * {k}u; kl_rs += kl_rthreads) {{\n"
            f"{ind}        const unsigned kl_rt = kl_rs / {k}u, kl_rj = kl_rs % {k}u;\n"
            f"{ind}        if ((int)kl_rj < kl_rtile_count[kl_rt]) kl_rtile_value[kl_rt * {k + 1}u + kl_rj] = kl_rtile_from[kl_rt][kl_rj];\n"
            f"{ind}    }}\n"
            f"{ind}    __syncthreads();\n"
            f"{ind}}}\n{ind}if (kl_rg) "))
        edit.replace(a.span[0], a.span[1], f"(kl_rtiled ? kl_rtile_value[kl_rme * {k + 1} + kl_rk] : {index})")
        step = f"\n{ind}kl_rk = kl_rk + 1 == {k} ? 0 : kl_rk + 1;\n{ind[:-4]}}}"
        # The guard's condition, evaluated once as before, now only decides what each thread stages and runs.
        if plan.guard is not None:
            block = plan.guard.child_by_field_name("consequence")
            for statement in _siblings(block, loop_node) if block.type == "compound_statement" else ():
                if statement.type == "declaration":
                    for decl in statement.children_by_field_name("declarator"):
                        value = decl.child_by_field_name("value") if decl.type == "init_declarator" else None
                        if value is not None:
                            name = _declarator_identifier(decl, src)
                            edit.replace(value.start_byte, value.end_byte,
                                         f"kl_rg ? ({_text(src, value)}) : decltype({name})()")
                else:
                    edit.insert(statement.start_byte, "if (kl_rg) { ")
                    edit.insert(statement.end_byte, " }")
            cond = plan.guard.child_by_field_name("condition")
            consequence = plan.guard.child_by_field_name("consequence")
            opened_at, closed_at = plan.guard.start_byte, plan.guard.end_byte
            edit.replace(opened_at, consequence.start_byte,
                         f"{{ const bool kl_rg = ({edit.text(cond.start_byte, cond.end_byte)}); int kl_rk = 0;\n"
                         + edit.indent_at(opened_at))
        else:
            opened_at, closed_at = loop_node.start_byte, loop_node.end_byte
            edit.insert(opened_at, "{ const bool kl_rg = true; int kl_rk = 0;\n" + edit.indent_at(opened_at))
        # One insert where the loop's body and the wrapper end at the same byte, so their order is fixed.
        if loop_body.end_byte == closed_at:
            edit.insert(closed_at, step + " }")
        else:
            edit.insert(loop_body.end_byte, step)
            edit.insert(closed_at, " }")
        source, expanded = emit(edit, ctx.source, ctx.kernel)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"the read `{a.text}` staged {k} iterations at a time through a padded shared tile, "
                                f"read by consecutive threads on consecutive elements{note}"),)


def _siblings(block: Node, loop_node: Node) -> list[Node]:
    """The statements of the guard's block other than (the statement holding) the loop."""
    return [n for n in block.named_children if n.type != "comment"
            and not (n.start_byte <= loop_node.start_byte and loop_node.end_byte <= n.end_byte)]


def _declarator_identifier(decl: Node, src: bytes) -> str | None:
    """The name a declarator declares (``k`` of ``int k;``, ``*p = …``, ``k = 0``); None for an array, a reference or
    a function."""
    target = decl if decl.type in ("identifier", "pointer_declarator") else decl.child_by_field_name("declarator")
    while target is not None and target.type == "pointer_declarator":
        target = target.child_by_field_name("declarator")
    return _text(src, target) if target is not None and target.type == "identifier" else None


def _guard_siblings_refusal(block: Node, loop_node: Node, src: bytes) -> str | None:
    """Why the other statements of the guard's block cannot run under the guard's value instead (None: they can):
    each declaration must be of plain variables or pointers with an ``=`` initialiser (it becomes
    ``guard ? (init) : T()``), no statement may be a label, and the loop's header names none of them."""
    declared: set[str] = set()
    for n in _siblings(block, loop_node):
        if n.type == "labeled_statement":
            return "it holds a label"
        if n.type != "declaration":
            continue
        type_node = n.child_by_field_name("type")
        if type_node is None or _text(src, type_node) in ("auto", "decltype(auto)") or any(
                c.type in ("storage_class_specifier", "attribute_specifier") or _text(src, c) in ("__shared__", "static")
                for c in n.children):
            return "it declares a variable whose type cannot be named before its initialiser (auto) or is not local"
        for decl in n.children_by_field_name("declarator"):
            value = decl.child_by_field_name("value") if decl.type == "init_declarator" else None
            name = _declarator_identifier(decl, src)
            if name is None or (value is not None and value.type in ("initializer_list", "argument_list")):
                return "it declares a reference, an array or a brace-initialised variable"
            declared.add(name)
    header = [loop_node.child_by_field_name(f) for f in ("initializer", "condition", "update")]
    used = {_text(src, ident) for part in header if part is not None for ident in _identifier_nodes(part, src)}
    # A counter declared under the guard and set by the header (``int k; for (k = 0; …)``) starts the same for
    # every thread whatever the guard.
    init = header[0]
    if init is not None and init.type == "assignment_expression" and _text(src, init.child_by_field_name("operator")) == "=":
        left, right = init.child_by_field_name("left"), init.child_by_field_name("right")
        if left is not None and left.type == "identifier" and _text(src, left) not in {
                _text(src, i) for i in _identifier_nodes(right, src)}:
            declared.discard(_text(src, left))
    if used & declared:
        return f"the loop's header uses {', '.join(sorted(used & declared))}, declared under the guard"
    # The loop must be a statement of the block itself (not nested in another statement of it).
    if loop_node.parent != block:
        return "the loop is nested in another statement of the guard's block"
    return None


def _loaded_subscript(node: Node, src: bytes) -> Node | None:
    """The subscript a read loads: the node itself, or the ``&a[i]`` argument of ``__ldg``-like intrinsics."""
    if node.type == "subscript_expression":
        return node
    if node.type == "call_expression":
        fn, args = node.child_by_field_name("function"), node.child_by_field_name("arguments")
        first = args.named_children[0] if args is not None and args.named_child_count == 1 else None
        if fn is not None and _text(src, fn) in _LOAD_INTRINSICS and first is not None and first.type == "pointer_expression" \
                and _text(src, first.child_by_field_name("operator")) == "&":
            inner = first.child_by_field_name("argument")
            return inner if inner is not None and inner.type == "subscript_expression" else None
    return None


def _conditional_in(node: Node, stop: Node, src: bytes) -> bool:
    """``node`` is evaluated only on some paths through ``stop``: in a branch of an ``if``, ``switch`` or
    ``?:``, or on the right of ``&&`` / ``||`` (their conditions and left operands always run)."""
    child, up = node, node.parent
    while up is not None and up != stop:
        if up.type in _CONDITIONAL and child != up.child_by_field_name("condition"):
            return True
        if up.type == "binary_expression" and _text(src, up.child_by_field_name("operator")) in ("&&", "||") \
                and child == up.child_by_field_name("right"):
            return True
        child, up = up, up.parent
    return False


def _mentioned_after(body: Node, loop_node: Node, var: str, src: bytes) -> bool:
    """``var`` is named outside the loop (a plain declaration aside) and was not declared by the loop itself:
    threads the guard kept out of the loop would now leave it with another value."""
    init = loop_node.child_by_field_name("initializer")
    if init is not None and init.type == "declaration":
        return False
    return any(_text(src, n) == var and not loop_node.start_byte <= n.start_byte < loop_node.end_byte
               and not (n.parent is not None and n.parent.type == "declaration")
               for n in _identifier_nodes(body, src))


# --------------------------------------------------------------------------------------------
# The store side with a 32 x 32 tile: each thread four rows of a transposing block
# --------------------------------------------------------------------------------------------

#: The tile's side and the rows a block of 32 x 8 threads covers per pass over it.
_TILE = 32
_TILE_ROWS = 8
#: The write-back's thread (threadIdx.x, threadIdx.y) at step kl_j writes the element of the virtual thread
#: (x = threadIdx.y + kl_j, y = threadIdx.x) of the 32 x 32 virtual block.
_OWNER = {"tid.x": "threadIdx.y + kl_j", "tid.y": "threadIdx.x", "bdim.x": str(_TILE), "bdim.y": str(_TILE),
          "bid.x": "blockIdx.x", "bid.y": "blockIdx.y"}


@dataclass(frozen=True)
class _TransposePlan:
    access: Access
    statement: Node
    value: Node
    bounds: tuple[str, str]
    """The bounds of the global x and y indices as written (the new grid covers them)."""
    returns: tuple[Node, ...]


def _index_text(poly, subs: dict[str, str], wide: bool = False) -> str | None:
    """``poly`` as a C expression with the symbols in ``subs`` replaced (in 64 bits when ``wide``, as
    the kernel computed it); None when it has a symbol neither there nor a scalar parameter (an
    opaque term, an iteration counter)."""
    from kernel_lsp.core.poly import is_iteration, is_opaque

    terms = []
    for monomial, c in sorted(poly.terms, key=lambda t: (-len(t[0]), t[0])):
        factors = [] if abs(c) == 1 and monomial else [str(abs(c))]
        for s in monomial:
            if s in subs:
                factors.append(f"({subs[s]})" if " " in subs[s] else subs[s])
            elif is_opaque(s) or is_iteration(s) or "." in s:
                return None
            else:
                factors.append(s)
        if wide:
            factors = [f"(long long){f}" for f in factors]
        terms.append(("- " if c < 0 else "+ ") + " * ".join(factors))
    text = " ".join(terms)
    return (text[2:] if text.startswith("+ ") else "-" + text[2:]) if text else "0"


class SharedTileTranspose(Rule):
    """Each thread of a 32 x 8 block runs the original threads of four rows of a 32 x 32 virtual block;
    the uncoalesced store is staged in a padded 32 x 33 tile and written back by rows of the transposed
    tile: 32 consecutive elements per warp.

    Legality, in terms of the analysis: the threads differ by their global x and y indices only
    (:func:`~kernel_lsp.core.analysis.threads_differ_only_by`), every global access runs under guards
    ``x < C`` and ``y < R`` that the original launch covers at every size (a virtual thread past the
    original grid does nothing); one plain store, in no loop (and no loop moving global memory beside it:
    the store would be a small part of the traffic), whose index has unit stride along
    threadIdx.y (either sign), another along threadIdx.x, and is a polynomial of the indices and the
    scalar parameters (the write-back computes it for the element's owner); the array is touched by
    nothing else and escapes nowhere, the spec gives every pointer its own allocation; every
    ``return`` ends one virtual thread (none in a loop or switch)."""

    name = "shared-tile-transpose"
    technique = "transpose-via-shared-memory"
    summary = "an uncoalesced 2-D store through a padded 32x32 tile, four rows per thread of a 32x8 block"

    def plan(self, ctx: RuleContext) -> tuple[_TransposePlan | None, str]:
        from kernel_lsp.core.analysis import global_index, index_bound, threads_differ_only_by
        from kernel_lsp.core.transforms.elementwise import _inside, _kernel_returns, bound_text

        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        if ctx.spec is None:
            return None, "needs a launch spec (the launch changes to one block per 32x32 tile)"
        if not ctx.distinct_arrays():
            return None, "the spec does not allocate every pointer parameter on its own (they may alias)"
        launches = ctx.launches()
        if not launches or any(launch.block[2] != 1 or launch.grid[2] != 1 for launch in launches):
            return None, "the launch is not two-dimensional"
        why = threads_differ_only_by(facts, ("x", "y"), grid=False)
        if why:
            return None, why
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return None, "the kernel's definition was not found in the preprocessed view"
        texts = []
        for axis in "xy":
            bound = index_bound(facts, axis)
            if bound is None:
                return None, f"no guard on the global {axis} index holds at every global access"
            text = bound_text(src, root, facts.conditions, global_index(axis), bound)
            if text is None:
                return None, f"the bound `{bound}` of the global {axis} index is not written in the kernel's own body"
            values = _axis_cover(ctx, bound, "xy".index(axis))
            if values:
                return None, values
            texts.append(text)
        try:
            patterns = bind(facts, Binding.from_spec(ctx.spec))
        except (SpecError, ValueError, ZeroDivisionError):
            return None, "the spec's launch does not evaluate"
        strided = [p.access for p in patterns if p.access.space == "global" and p.access.kind == "write" and p.pattern == "strided"]
        if not strided:
            return None, "no uncoalesced global store under this launch"
        a = strided[0]
        along_y = a.index.coefficient("tid.y")
        if along_y is None or along_y.constant not in (1, -1):
            return None, f"the store `{a.text}` has no unit stride along threadIdx.y"
        if a.loops or a.via or a.field is not None or a.array in facts.escaped:
            return None, f"the store `{a.text}` is in a loop, a helper or a struct member, or its array escapes"
        if any(b.array == a.array and b is not a for b in facts.accesses):
            return None, f"`{a.array}` is accessed elsewhere in the kernel"
        busier = next((b for b in facts.accesses if b.space == "global" and b.loops), None)
        if busier is not None:
            return None, (f"`{busier.text}` at line {(busier.user_line or 0) + 1} repeats in a loop the store is not in: "
                          "the store is a small part of the kernel's traffic")
        if _index_text(a.index, _OWNER) is None:
            return None, f"the store's index `{a.index}` is not a polynomial of the indices and the scalar parameters"
        node = node_at(src, root, a.span)
        assign = node.parent if node is not None else None
        if assign is None or assign.type != "assignment_expression" or assign.child_by_field_name("left") != node \
                or _text(src, assign.child_by_field_name("operator")) != "=" or assign.parent is None \
                or assign.parent.type != "expression_statement":
            return None, f"the store `{a.text}` is a compound assignment or part of a larger expression"
        value = assign.child_by_field_name("right")
        if _has(value, ("assignment_expression", "update_expression")):
            return None, "the stored value assigns a variable"
        returns = tuple(_kernel_returns(body))
        for ret in returns:
            if ret.named_child_count or _inside(ret, body, ("for_statement", "while_statement", "do_statement",
                                                            "switch_statement")):
                return None, f"the return at line {user_line_of(ctx.preprocessed, ret.start_point[0])} sits in a loop or switch"
        grid_y = [-(-v // _TILE) for v in (_values(ctx, index_bound(facts, "y")) or [])]
        if any(g > 65535 for g in grid_y):
            return None, "the tiles along y exceed gridDim.y at some size of the spec"
        return _TransposePlan(a, assign.parent, value, (texts[0], texts[1]), returns), ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        return True, (f"the store `{plan.access.text}` is a row apart across the warp and unit stride along threadIdx.y; "
                      "the threads differ by their global x and y indices only, the guards cover the original launch")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        from kernel_lsp.core.transforms.emit import builtin_fields, rebuild
        from kernel_lsp.core.transforms.launch_edit import launch_bounds_for

        plan, _ = self.plan(ctx)
        facts = ctx.facts
        assert plan is not None and facts is not None and ctx.spec is not None
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        lo, hi = facts.body_span
        a, elem = plan.access, plan.access.elem_type
        virtual = {("threadIdx", "y"): "(threadIdx.y + kl_j)", ("blockDim", "y"): f"{_TILE}u", ("blockDim", "x"): f"{_TILE}u"}
        subs = [(n.start_byte, n.end_byte, new) for n, new in builtin_fields(src, kernel, lo, hi, virtual)]
        subs += [(r.start_byte, r.end_byte, "continue;") for r in plan.returns]
        stmt, value = plan.statement, plan.value
        index = _index_text(a.index, _OWNER, a.wide)

        def build(text) -> str:
            inner = [s for s in subs if value.start_byte <= s[0] < value.end_byte]
            staged = (f"{{ kl_tile[threadIdx.y + kl_j][threadIdx.x] = {text(value.start_byte, value.end_byte, inner)}; "
                      "kl_set[threadIdx.y + kl_j][threadIdx.x] = 1; }")
            outer = [s for s in subs if not stmt.start_byte <= s[0] < stmt.end_byte] + [(stmt.start_byte, stmt.end_byte, staged)]
            first, last = _statements(kernel.child_by_field_name("body"))
            original = text(first, last, outer) if first < last else ""
            return (f"\n    // The store to `{a.array}` staged in a 32 x 33 tile (+1 pads a column onto 32 banks): each thread runs\n"
                    f"    // the original threads of {_TILE // _TILE_ROWS} rows of a 32 x 32 block, then the block writes the tile "
                    "back by its columns.\n"
                    f"    __shared__ {elem} kl_tile[{_TILE}][{_TILE + 1}];\n"
                    f"    __shared__ unsigned char kl_set[{_TILE}][{_TILE + 1}];\n"
                    f"    for (unsigned kl_j = 0; kl_j < {_TILE}u; kl_j += blockDim.y) {{\n"
                    "        kl_set[threadIdx.y + kl_j][threadIdx.x] = 0;\n"
                    f"        {original}\n"
                    "    }\n"
                    "    __syncthreads();\n"
                    f"    for (unsigned kl_j = 0; kl_j < {_TILE}u; kl_j += blockDim.y) {{\n"
                    "        // The element of the thread (x = threadIdx.y + kl_j, y = threadIdx.x): consecutive lanes, consecutive elements.\n"
                    f"        if (kl_set[threadIdx.x][threadIdx.y + kl_j]) {a.array}[{index}] = kl_tile[threadIdx.x][threadIdx.y + kl_j];\n"
                    "    }\n")

        source, expanded = rebuild(ctx.preprocessed, facts, ctx.source, ctx.kernel, build)
        source = launch_bounds_for(source, ctx.kernel, _TILE * _TILE_ROWS)
        if source is None:
            return ()
        cols, rows = plan.bounds
        override = {"grid": [f"(({cols})+{_TILE - 1})/{_TILE}", f"(({rows})+{_TILE - 1})/{_TILE}", "1"],
                    "block": [_TILE, _TILE_ROWS, 1], "dynamic_smem": ctx.spec.launch.dynamic_smem}
        if not ctx.launch_ok(override):
            return ()
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"32x33 shared-memory tile: the store `{a.text}` written back coalesced, four rows per "
                                f"thread of a 32x8 block{note}", override),)


def _statements(block: Node) -> tuple[int, int]:
    inner = [c for c in block.named_children]
    return (inner[0].start_byte, inner[-1].end_byte) if inner else (block.start_byte + 1, block.start_byte + 1)


def _values(ctx: RuleContext, bound) -> list[int] | None:
    from kernel_lsp.core.transforms.elementwise import bound_values

    return bound_values(ctx, bound) if bound is not None else None


def _axis_cover(ctx: RuleContext, bound, axis: int) -> str | None:
    """Why the original launch leaves some index below ``bound`` along ``axis`` without a thread, or None."""
    values = _values(ctx, bound)
    if values is None:
        return f"the bound `{bound}` does not evaluate at every size of the spec"
    for value, launch in zip(values, ctx.launches()):
        threads = launch.grid[axis] * launch.block[axis]
        if threads < value:
            return f"the original launch has {threads} threads along {'xyz'[axis]}, fewer than the bound's {value}"
    return None
