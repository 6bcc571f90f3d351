"""Block-per-output column reductions regrouped so the lanes of a warp take neighbouring outputs.

A kernel that gives each block one output element (``dbias[o]`` with ``o = blockIdx.x``) and lets the
block's threads share out the rows (``for (i = tid; i < N; i += blockDim.x) sum += x[i * LD + o]``)
before a shared-memory tree, reads a column: across a warp the loads are a row apart (one sector per
lane), while neighbouring *blocks* read neighbouring elements. The rewrite makes one block serve ``C``
neighbouring original blocks as *virtual* blocks: a block of ``C x R`` threads, ``threadIdx.x`` the
column within the group (virtual block ``blockIdx.x * C + threadIdx.x``), ``threadIdx.y`` the virtual
thread, ``blockDim.y = R`` the virtual block's width; so the lanes of a warp read neighbouring
elements of a row. The rows loop runs as written on those virtual indices; each thread's partial
result goes to its column's slot of a shared ``[R][C]`` array (lanes along the fast index: no bank
conflicts, no padding needed), and the first thread of each column combines its ``R`` slots where the
tree's root was read, then runs the original's final statement (``if (tid == 0) dbias[o] = dbias[o] +
shared[0]``) with the root replaced by that total: one store per output, read-modify-writes included.
A last group with fewer than ``C`` original blocks leaves the others out (the original grid, written
in the kernel's parameters, guards the rows loop and the final statement).

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a 1-D kernel (``tid.x``, ``bid.x``, ``bdim.x`` only: it reads no ``gridDim``) and launch, the spec's
  grid a C expression of the kernel's integer parameters, which the kernel never assigns;
- every global store is a per-block output (:func:`~kernel_lsp.core.analysis.per_block_outputs`:
  its index depends on the block, not on the thread), no atomics, no helper reading the thread index;
- exactly two loops, both at the body's top level: one block-strided loop
  (:func:`~kernel_lsp.core.analysis.block_strided_loops`: each row taken by one thread of the block,
  whatever its width) carrying one accumulator (``+``, ``max``, ``min``) it only updates, starting at the
  operator's identity for ``+``, calling nothing unseen, leaving by no ``break``; and a shared tree
  (:func:`~kernel_lsp.core.analysis.shared_combine_loops`) simulated at each block size of the spec
  (:class:`~kernel_lsp.core.transforms.block_reduce.TreeToShuffle`'s proof: every slot reduced into
  slot 0 exactly once, race-free, every thread reaching it, only the root read afterwards) with the
  accumulator's operator;
- every global load of the rows loop depends on the thread only through the loop's variable, and the
  block moves it by 0 or 1 element (the lanes after the rewrite), at least one of them uncoalesced now;
- the body is, at its top level: statements without memory accesses, calls or control flow (before
  the rows loop); the rows loop; the store of its accumulator into the tree's slot ``tid``; barriers;
  the tree; one ``if`` on ``tid == 0`` holding every later statement. Locals of the first part that
  depend on the thread or the block's width appear only in the loop's start and step and that test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core import expr
from kernel_lsp.core.analysis import (
    Binding, KernelFacts, LoopFact, Reduction, assigned_names, bind, block_strided_loops, function_definitions,
    helper_reading_thread_index, identifiers_in, per_block_outputs, shared_combine_loops, thread_dependence,
)
from kernel_lsp.core.analysis import has_node as _has
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.poly import Poly, is_iteration, is_opaque
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError, with_candidate_launch
from kernel_lsp.core.static_check import problem_sizes
from kernel_lsp.core.transforms.block_reduce import _is_barrier, replace_by_lines
from kernel_lsp.core.transforms.emit import BodyEdit, builtin_fields, emit, node_at, parse
from kernel_lsp.core.transforms.grid_expr import grid_c as _grid_c, literals as _literals
from kernel_lsp.core.transforms.tree_model import loop_tree
from kernel_lsp.core.transforms.warp_per_row import _only_updated

#: (columns per block, rows of threads per block): 16 columns give 64 row-threads per column and twice
#: the blocks (a 2-byte column still fills a 32-byte sector per row), 32 columns a warp per row.
SHAPES: tuple[tuple[int, int], ...] = ((16, 64), (32, 32))
#: Unroll factor of the rows loop: loads in flight per thread.
UNROLL = 8
_ALLOWED_BUILTINS = {"tid.x", "bid.x", "bdim.x"}
_BUILTIN_FIELDS = {("threadIdx", "x"): "threadIdx.y", ("blockDim", "x"): "blockDim.y", ("blockIdx", "x"): "kl_vbid"}
_COMBINE = {"+": "{a} + {b}", "max": "max({a}, {b})", "min": "min({a}, {b})"}


@dataclass(frozen=True)
class _Plan:
    rows: LoopFact
    accumulator: Reduction
    tree: LoopFact
    array: str
    elem_type: str
    leaf: tuple[int, int]
    """Byte range of the statement storing the accumulator into the tree's slot."""
    roots: tuple[tuple[int, int], ...]
    """Byte ranges of the root reads after the tree."""
    test: tuple[int, int]
    """Byte range of the final ``if``'s condition (``tid == 0``)."""
    grid: str
    """The original grid's x extent as a C expression of the kernel's parameters."""
    bound: tuple[int, int]
    """Byte range of the rows loop's condition (the live columns' guard goes around it)."""
    pragma_before: bool
    """The rows loop is preceded by a ``#pragma`` of the user's."""
    outputs: tuple[str, ...]
    """The per-block outputs (for the description)."""


def _is_zero(literal: str) -> bool:
    """A numeric literal of value 0 (``0``, ``0.0f``, ``0.``, ``0u``)."""
    try:
        return float(literal.strip().rstrip("fFlLuU")) == 0.0
    except ValueError:
        return False


def _statements(body: Node) -> list[Node]:
    return [c for c in body.named_children if c.type != "comment"]


def _taint(prologue: list[Node], src: bytes) -> tuple[dict[str, Node | None], set[str], set[str]]:
    """(declared name -> its initial value, names that depend on the thread, names that depend on the
    block's width), following the declarations in order."""
    values: dict[str, Node | None] = {}
    thread: set[str] = set()
    width: set[str] = set()
    for stmt in prologue:
        if stmt.type != "declaration":
            continue
        for decl in stmt.children_by_field_name("declarator"):
            value = decl.child_by_field_name("value") if decl.type == "init_declarator" else None
            target = decl.child_by_field_name("declarator") if decl.type == "init_declarator" else decl
            while target is not None and target.type not in ("identifier", "field_identifier"):
                target = target.child_by_field_name("declarator")
            if target is None:
                continue
            name = _text(src, target)
            values[name] = value
            text = _text(src, value) if value is not None else ""
            used = identifiers_in(value, src) if value is not None else set()
            if "threadIdx" in text or used & thread:
                thread.add(name)
            if "blockDim" in text or used & width:
                width.add(name)
    return values, thread, width


def _is_thread_zero(cond: Node, src: bytes, values: dict[str, Node | None], assigned: set[str]) -> bool:
    """``V == 0`` (or ``0 == V``) where V is ``threadIdx.x`` or a never-assigned local initialised to it."""
    while cond.type in ("parenthesized_expression", "condition_clause") and cond.named_children:
        cond = cond.named_children[-1] if cond.type == "condition_clause" else cond.named_children[0]
    if cond.type != "binary_expression" or _text(src, cond.child_by_field_name("operator")) != "==":
        return False
    sides = [cond.child_by_field_name("left"), cond.child_by_field_name("right")]
    texts = [_text(src, s).replace(" ", "") for s in sides]
    for value, other in ((texts[0], sides[1]), (texts[1], sides[0])):
        if value.rstrip("uUlL") != "0":
            continue
        while other.type == "parenthesized_expression" and other.named_children:
            other = other.named_children[0]
        what = _text(src, other).replace(" ", "")
        if what == "threadIdx.x":
            return True
        init = values.get(what)
        if other.type == "identifier" and what not in assigned and init is not None \
                and _text(src, init).replace(" ", "").split(")")[-1] == "threadIdx.x":
            return True
    return False


class ColumnsPerWarp(Rule):
    name = "columns-per-warp"
    technique = "columns-per-warp"
    summary = "a block-per-output column reduction regrouped: the lanes of a warp take neighbouring outputs"

    def plan(self, ctx: RuleContext) -> tuple[_Plan | None, str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        if ctx.spec is None:
            return None, "needs a launch spec (the launch changes: one block for a group of the original blocks)"
        if set(facts.thread_dims) - _ALLOWED_BUILTINS:
            extra = ", ".join(sorted(set(facts.thread_dims) - _ALLOWED_BUILTINS))
            return None, f"the kernel reads {extra}: only 1-D kernels that do not read the grid's size are regrouped"
        launches = ctx.launches()
        if not launches or any(b.block[1:] != (1, 1) for b in launches):
            return None, "the block is not one-dimensional at every size of the spec"
        if any(b.grid[1:] != (1, 1) or b.grid[0] < 1 for b in launches):
            return None, "the grid is not one-dimensional at every size of the spec"
        outputs = per_block_outputs(facts)
        if not outputs:
            return None, "no per-block output (a global array stored at an index that depends on the block, not the thread)"
        for a in facts.accesses:
            if a.kind == "atomic":
                return None, f"`{a.text}` is an atomic: the blocks' order would change"
            if a.space == "global" and a.writes and (thread_dependence(a.index, facts.opaque) or a.array not in outputs):
                return None, f"`{a.text}` stores at an index that depends on the thread: the block has more than one output"
            if a.space == "local":
                return None, f"`{a.text}` is a local array (not modelled by this rewrite)"
        rows = [lp for lp in block_strided_loops(facts) if lp.parent is None]
        if len(rows) != 1:
            return None, ("no top-level loop whose block's threads share out a range (start threadIdx.x plus a term, "
                          "step blockDim.x)" if not rows else "more than one block-strided loop")
        trees = [r for r in shared_combine_loops(facts) if r.loop is not None]
        if len(trees) != 1 or any(r.kind == "shared_tree" and r.loop is None for r in facts.reductions):
            return None, "the block's results are not combined by exactly one looped shared-memory tree"
        row, tree_red = rows[0], trees[0]
        tree = facts.loops[tree_red.loop]
        if tree.parent is not None:
            return None, "the tree sits inside another loop"
        others = [lp for lp in facts.loops if lp.id not in (row.id, tree.id)]
        if others:
            return None, f"another loop at line {(others[0].user_line or 0) + 1} (only the rows loop and the tree are modelled)"
        accs = [r for r in facts.reductions if r.kind == "accumulator" and r.loop == row.id]
        if len(accs) != 1 or any(r.kind == "accumulator" and r.loop != row.id for r in facts.reductions):
            return None, "the rows loop does not carry exactly one accumulator (one tree combines one value per thread)"
        acc = accs[0]
        if acc.op not in _COMBINE:
            return None, f"the accumulator's operator `{acc.op}` is not +, max or min"
        if row.calls_unknown:
            return None, "the rows loop calls code the analysis does not see"
        try:
            binding = Binding.from_spec(ctx.spec)
            patterns = bind(facts, binding)
        except (SpecError, ValueError, ZeroDivisionError):
            return None, "the spec's launch does not evaluate"
        why = self._column_reads(facts, row, patterns, binding)
        if why:
            return None, why
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return None, "the kernel's definition was not found in the preprocessed view"
        if (helper := helper_reading_thread_index(facts, root, src)) is not None:
            return None, f"the helper `{helper}` reads the thread or block index"
        if _has(body, ("return_statement", "goto_statement")):
            return None, "the kernel returns early or jumps (every thread must reach the new barrier)"
        if facts.shuffles:
            return None, "the kernel uses warp intrinsics (the original's warps would not exist)"
        if (helper := _helper_reading_builtins(body, root, src)) is not None:
            return None, f"the function `{helper}` reads the thread or block index or the block's size"
        params = {name for name, _, _ in facts.params}
        if assigned_names(body, src) & params:
            return None, f"the kernel assigns its parameter `{sorted(assigned_names(body, src) & params)[0]}`"
        sizes = sorted({launch.block[0] for launch in launches})
        tree_why, tree_op = loop_tree(ctx, tree, sizes)
        if tree_why:
            return None, f"the tree on `{tree_red.target}` at line {(tree.user_line or 0) + 1}: {tree_why}"
        if acc.op != tree_op:
            return None, f"the loop accumulates with `{acc.op}` but the tree combines with `{tree_op}`"
        return self._structure(ctx, facts, body, src, row, acc, tree, tree_red.target, outputs)

    def _column_reads(self, facts: KernelFacts, row: LoopFact, patterns, binding: Binding) -> str | None:
        """Every global access of the rows loop is a load that depends on the thread only through the loop's
        variable; the block moves it by 0 or 1 element (the new lanes); at least one is uncoalesced now."""
        env = {**binding.values, "bdim.x": binding.block[0]}
        width = Poly.sym("bdim.x")
        uncoalesced = False
        apart: str | None = None
        for p in patterns:
            a = p.access
            if row.id not in a.loops or a.space != "global":
                continue
            if a.writes:
                return f"the rows loop stores `{a.text}`"
            along_t, along_i = a.index.coefficient("tid.x"), a.index.coefficient(row.trip_symbol)
            if along_t is None or along_i is None or along_i != along_t * width:
                return f"`{a.text}` depends on the thread otherwise than through the loop's `{row.var}`"
            rest = a.index - along_t * Poly.sym("tid.x") - along_i * Poly.sym(row.trip_symbol)
            if any(s.startswith("tid.") or is_iteration(s) or (is_opaque(s) and facts.opaque.get(s) is not None
                                                                and facts.opaque[s].deps) for s in rest.symbols | along_t.symbols):
                return f"`{a.text}` depends on the thread otherwise than through the loop's `{row.var}`"
            along_b = a.index.coefficient("bid.x")
            if any(s.startswith("bdim.") for s in rest.symbols | along_t.symbols):
                return f"`{a.text}` moves with the block's width otherwise than through the loop's `{row.var}`"
            lanes = along_b.evaluate(env) if along_b is not None else None
            if lanes not in (0, 1) and apart is None:
                apart = (f"`{a.text}` would be {lanes} elements apart across the lanes (neighbouring blocks do not read "
                         "neighbouring elements)" if lanes is not None else f"`{a.text}`: how the block moves it is not known")
            uncoalesced = uncoalesced or p.uncoalesced
        if not uncoalesced:
            return "the rows loop's loads are already coalesced across the warp (the block reads along a row)"
        return apart

    def _structure(self, ctx: RuleContext, facts: KernelFacts, body: Node, src: bytes, row: LoopFact, acc: Reduction,
                   tree: LoopFact, array: str, outputs: tuple[str, ...]) -> tuple[_Plan | None, str]:
        stmts = _statements(body)
        at = {(s.start_byte, s.end_byte): k for k, s in enumerate(stmts)}
        if row.span not in at or tree.span not in at:
            return None, "the rows loop or the tree is not a statement of the kernel's body (a helper, a macro's block)"
        r, t = at[row.span], at[tree.span]
        prologue = stmts[:r]
        assigned = assigned_names(body, src)
        for s in prologue:
            line = (ctx.preprocessed.user_line(s.start_point[0]) or 0) + 1
            if s.type == "preproc_call" and _text(src, s).lstrip().startswith("#pragma"):
                continue
            if s.type not in ("declaration", "expression_statement") or _has(s, ("call_expression",)) \
                    or any(s.start_byte <= a.span[0] < s.end_byte for a in facts.accesses):
                return None, f"the statement at line {line} before the rows loop is not a declaration free of memory accesses and calls"
        values, thread, width = _taint(prologue, src)
        if acc.target not in values:
            return None, f"the accumulator `{acc.target}` is not declared before the rows loop"
        init = values[acc.target]
        if acc.op == "+" and (init is None or not _is_zero(_text(src, init))):
            return None, f"the accumulator `{acc.target}` does not start at 0 (each of the block's threads would add its start)"
        if init is not None and (identifiers_in(init, src) & (thread | width | set(values)) or "Idx" in _text(src, init)
                                 or "blockDim" in _text(src, init)):
            return None, f"the accumulator `{acc.target}` starts at a value that depends on the thread or the block's width"
        changed = (assigned & set(values)) - {acc.target, row.var}
        if any(acc.target in assigned_names(st, src) for st in stmts if st is not stmts[r]):
            changed.add(acc.target)
        if changed:
            return None, f"{', '.join(sorted(changed))} declared before the rows loop and assigned again"
        # The rows loop: its start and step carry the thread and the width; nothing else in it may.
        loop = stmts[r]
        if loop.type != "for_statement":
            return None, "the rows loop has no header that starts, tests and steps its counter"
        cond, update, inner = (loop.child_by_field_name(f) for f in ("condition", "update", "body"))
        if cond is None or update is None or inner is None:
            return None, "the rows loop lacks a condition or an update"
        previous = loop.prev_named_sibling
        while previous is not None and previous.type == "comment":
            previous = previous.prev_named_sibling
        pragma_before = previous is not None and _text(src, previous).lstrip().startswith("#pragma")
        if _has(inner, ("break_statement",)):
            return None, "the rows loop can leave early (a break): its rows would depend on how the block splits them"
        for part in (cond, inner):
            names = identifiers_in(part, src)
            text = _text(src, part)
            if (names & (thread | width)) - {row.var} or "threadIdx" in text or "blockDim" in text:
                return None, "the rows loop's body or bound uses the thread or the block's width other than through its variable"
        if not _only_updated(inner, src, acc.target):
            return None, f"the rows loop reads the accumulator `{acc.target}` for something else than updating it"
        if row.var in values or next(_mentions_outside(body, src, row.var, loop), None) is not None:
            return None, f"the loop's variable `{row.var}` is used outside the loop"
        # The accumulator's store into the tree's slot, barriers, the tree, barriers, the final test.
        leaf = [s for s in stmts[r + 1:t] if not _is_barrier(s, src, facts)]
        shared = [a for a in facts.accesses if a.space == "shared"]
        if any(a.array != array for a in shared):
            other = next(a for a in shared if a.array != array)
            return None, f"`{other.text}` uses another shared array than the tree's"
        leaf_write = [a for a in shared if a.writes and not tree.span[0] <= a.span[0] < tree.span[1]]
        if len(leaf) != 1 or len(leaf_write) != 1 or not leaf[0].start_byte <= leaf_write[0].span[0] < leaf[0].end_byte:
            return None, (f"between the rows loop and the tree the kernel does more than store `{acc.target}` into "
                          f"`{array}` (and wait at barriers)")
        store = leaf[0].named_children[0] if leaf[0].type == "expression_statement" and leaf[0].named_children else None
        if store is None or store.type != "assignment_expression" or _text(src, store.child_by_field_name("operator")) != "=" \
                or _text(src, store.child_by_field_name("right")).strip() != acc.target \
                or leaf_write[0].index != Poly.sym("tid.x") or leaf_write[0].kind != "write":
            return None, f"the tree's slots are not each thread's own slot holding the accumulator `{acc.target}`"
        tail = [s for s in stmts[t + 1:] if not _is_barrier(s, src, facts)]
        if len(tail) != 1 or tail[0].type != "if_statement" or tail[0].child_by_field_name("alternative") is not None:
            return None, "after the tree the kernel does more than store the result from thread 0"
        final = tail[0]
        test = final.child_by_field_name("condition")
        if test is None or not _is_thread_zero(test, src, values, assigned):
            return None, "the final statement is not guarded by `tid == 0` (one thread per block storing the output)"
        test_value = test.child_by_field_name("value") if test.type == "condition_clause" else test
        while test_value is not None and test_value.type == "parenthesized_expression" and test_value.named_children:
            test_value = test_value.named_children[0]
        if test_value is None:
            return None, "the final statement's condition was not found"
        consequence = final.child_by_field_name("consequence")
        names = identifiers_in(consequence, src)
        text = _text(src, consequence)
        if names & (thread | width | {acc.target, row.var}) or "threadIdx" in text or "blockDim" in text or _has(
                consequence, ("for_statement", "while_statement", "do_statement")) or "__sync" in text:
            return None, "the final statement uses the thread, the block's width, the accumulator, a loop or a barrier"
        roots = []
        for a in shared:
            inside = tree.span[0] <= a.span[0] < tree.span[1]
            if inside or a.writes:
                continue
            if not final.start_byte <= a.span[0] < final.end_byte or a.index.constant != 0:
                return None, f"`{a.text}` reads the tree's array outside the final statement's root"
            roots.append(a.span)
        globals_outside = [a for a in facts.accesses if a.space == "global" and row.id not in a.loops
                           and not final.start_byte <= a.span[0] < final.end_byte]
        if globals_outside:
            return None, f"`{globals_outside[0].text}` is neither in the rows loop nor in the final statement"
        params = {name for name, ty, is_pointer in facts.params if not is_pointer and ctx.spec_scalar(name)} - assigned
        try:
            grid = _grid_c(expr.parse(ctx.spec.launch.grid[0]), params)  # type: ignore[union-attr]
        except expr.ExprError:
            grid = None
        if grid is None:
            return None, (f"the spec's grid `{ctx.spec.launch.grid[0]}` is not an expression of the kernel's integer "  # type: ignore[union-attr]
                          "parameters (the last group must know how many original blocks there are)")
        sizes = problem_sizes(ctx.spec)  # type: ignore[arg-type]
        written = [n.value for n in _literals(expr.parse(ctx.spec.launch.grid[0])) if n.value in sizes]  # type: ignore[union-attr]
        if written:
            return None, (f"the grid is written with the literal {written[0]}, {sizes[written[0]]}: in the kernel, the "
                          "harness's static check would take it for a problem size written in")
        elem = next(a.elem_type for a in shared if a.array == array)
        return _Plan(row, acc, tree, array, elem, (leaf[0].start_byte, leaf[0].end_byte), tuple(roots),
                     (test_value.start_byte, test_value.end_byte), grid, (cond.start_byte, cond.end_byte), pragma_before,
                     outputs), ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        for columns, rows in SHAPES:
            try:
                with_candidate_launch(ctx.spec, self._launch(ctx, columns, rows))  # type: ignore[arg-type]
            except (SpecError, ValueError, ZeroDivisionError) as exc:
                return False, f"the new launch does not evaluate: {exc}"
        return True, (f"each block stores its own element of {', '.join(f'`{o}`' for o in plan.outputs)} from one thread; "
                      f"its threads share out the rows loop at line {(plan.rows.user_line or 0) + 1}, whose loads are a row "
                      "apart across the warp and one element apart across blocks; the tree on "
                      f"`{plan.array}` reduces every thread's `{plan.accumulator.target}` ({plan.accumulator.op}) at each block "
                      "size of the spec")

    def _launch(self, ctx: RuleContext, columns: int, rows: int) -> dict:
        spec = ctx.spec
        grid = spec.launch.grid  # type: ignore[union-attr]
        return {"grid": [f"(({grid[0]}) + {columns - 1}) / {columns}", 1, 1], "block": [columns, rows, 1],
                "dynamic_smem": spec.launch.dynamic_smem}  # type: ignore[union-attr]

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        assert plan is not None
        return tuple(self._variant(ctx, plan, columns, rows) for columns, rows in SHAPES)

    def _variant(self, ctx: RuleContext, plan: _Plan, columns: int, rows: int) -> Rewrite:
        facts = ctx.facts
        assert facts is not None
        src, root = parse(ctx.preprocessed)
        edit = BodyEdit(ctx.preprocessed, facts)
        lo, hi = facts.body_span
        edit.insert(lo + 1, f"\n    const unsigned kl_vbid = blockIdx.x * {columns}u + threadIdx.x;"
                            " // the original block this column stands for\n"
                            f"    const bool kl_live = kl_vbid < (unsigned)({plan.grid});\n"
                            f"    __shared__ {plan.elem_type} kl_cols[{rows}][{columns}];\n")
        whole = [plan.leaf, plan.tree.span]
        for node, new in builtin_fields(src, root.descendant_for_byte_range(lo, hi) or root, lo, hi, _BUILTIN_FIELDS):
            if any(s <= node.start_byte < e for s, e in whole):
                continue
            edit.replace(node.start_byte, node.end_byte, new)
        # Each thread now walks rows / R of a column's rows instead of rows / blockDim.x: unrolled, its loads
        # are in flight together (the sums still add in the loop's order). A pragma of the user's own stays.
        if not plan.pragma_before:
            edit.insert(plan.rows.span[0], f'_Pragma("unroll {UNROLL}") ')
        edit.insert(plan.bound[0], "kl_live && (")
        edit.insert(plan.bound[1], ")")
        replace_by_lines(edit, *plan.leaf, f"kl_cols[threadIdx.y][threadIdx.x] = {plan.accumulator.target};")
        step = _COMBINE[plan.accumulator.op].format(a="kl_total", b="kl_cols[kl_r][threadIdx.x]")
        indent = edit.indent_at(plan.tree.span[0])
        combine = (f"__syncthreads(); // the column's {rows} partial results, combined by its first thread\n"
                   f"{indent}{plan.elem_type} kl_total = kl_cols[0][threadIdx.x];\n"
                   f"{indent}if (threadIdx.y == 0u)\n"
                   f"{indent}    for (int kl_r = 1; kl_r < {rows}; ++kl_r) kl_total = {step};")
        replace_by_lines(edit, *plan.tree.span, combine)
        for start, end in plan.roots:
            edit.replace(start, end, "kl_total")
        edit.insert(plan.test[0], "kl_live && (")
        edit.insert(plan.test[1], ")")
        source, expanded = emit(edit, ctx.source, ctx.kernel)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        description = (f"columns per warp: a block of {columns} x {rows} threads serves {columns} neighbouring blocks, "
                       f"threadIdx.x the column (coalesced rows), {rows} threads per column sharing the rows, combined "
                       f"through shared memory; one store per column, the last group guarded by the grid `{plan.grid}`"
                       + note)
        return Rewrite(source, description, self._launch(ctx, columns, rows), variant=f"{columns}x{rows}",
                       block=(columns, rows, 1), grid_divide=(columns, 1, 1))


_BUILTIN_TEXT = re.compile(r"\b(threadIdx|blockIdx|blockDim|gridDim)\b")


def _helper_reading_builtins(body: Node, root: Node, src: bytes) -> str | None:
    """A function of the file the body calls whose own text reads a builtin index or size (the rewrite renames
    only the body's)."""
    defined = {name: node for name, node, _ in function_definitions(root, src)}
    stack = [body]
    while stack:
        n = stack.pop()
        if n.type == "call_expression":
            fn = n.child_by_field_name("function")
            name = _text(src, fn).split("<", 1)[0].rsplit("::", 1)[-1].strip() if fn is not None else ""
            if name in defined and _BUILTIN_TEXT.search(_text(src, defined[name])):
                return name
        stack.extend(n.children)
    return None


def _mentions_outside(body: Node, src: bytes, name: str, loop: Node):
    stack = [body]
    while stack:
        n = stack.pop()
        if n.start_byte >= loop.start_byte and n.end_byte <= loop.end_byte:
            continue
        if n.type == "identifier" and _text(src, n) == name:
            yield n
            continue
        stack.extend(n.children)

