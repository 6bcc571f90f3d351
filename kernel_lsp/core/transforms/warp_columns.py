"""Warp-per-output column reductions regrouped so that the lanes of a warp take neighbouring outputs.

A kernel that gives each warp one output (``dbias[w]``, ``w`` the warp's index in the grid, written
``blockIdx.x * warp.meta_group_size() + warp.meta_group_rank()`` or ``(blockIdx.x * blockDim.x +
threadIdx.x) / 32``) and lets its lanes share out the rows (``for (i = lane; i < N; i += 32) sum +=
x[i * LD + w]``) before a warp reduction reads a column: the lanes' loads are a row apart (a sector per
lane) while neighbouring *warps* read neighbouring elements. The rewrite runs the same warps on blocks
of ``C x 32`` threads: ``threadIdx.x`` picks one of ``C`` original warps (warp ``blockIdx.x * C +
threadIdx.x`` of the original grid), ``threadIdx.y`` its lane, so the 32 lanes of a real warp read ``C``
neighbouring elements of one row. Every thread computes the original thread and block index it stands
for (``kl_vtid``, ``kl_vbid``) and runs the original body on them: ``threadIdx.x``, ``blockIdx.x`` and
``blockDim.x`` are renamed (``gridDim.x`` is the original grid, computed from the parameters), the ranks
and sizes of the block and its 32-thread tiles are written as the same values of the stand-in indices,
and each warp reduction (``cg::reduce`` over a tile, or a butterfly of ``__shfl_xor_sync`` over offsets
16 to 1) becomes a reduction across ``threadIdx.y`` through shared memory that gives every lane the
total, as both forms do. Original
warps past the original grid's end return at once; a thread that returns is no longer waited for at a
barrier (the CUDA programming guide, from Volta on: a barrier waits for "all non-exited threads").

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a block of ``B x 1 x 1`` threads at every size of the spec, ``B`` a multiple of 32, a 1-D grid written
  as an expression of the kernel's integer parameters (the kernel computes how many warps it had);
- the kernel reads no y or z index or size, and no helper of it reads an index;
- no barrier, no shared memory, no warp operation other than ``cg::reduce`` (+, max, min) over a
  32-thread tile of the block, each one a statement at the body's top level, or a loop at the top level
  whose one statement combines a value (+, max, min) with ``__shfl_xor_sync`` over the full warp at
  offsets 16, 8, 4, 2, 1 (every thread that has not returned reaches each in the same order, as the new
  barriers need); no inline assembly;
- cooperative groups only as the block (``this_thread_block()``) and its 32-thread tiles
  (``tiled_partition<32>``), read through ``thread_rank``, ``size``, ``num_threads``,
  ``meta_group_rank`` and ``meta_group_size`` and handed to nothing but ``cg::reduce``;
- a global load in a loop that is uncoalesced under the original launch and one element apart between
  neighbouring warps (the new lanes), else nothing gains.

The results are the original's except for the order a reduction's lanes are combined in (the same
values, another summation tree: floating-point sums may round differently, the harness's tolerance
decides).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import Binding, bind, evaluate, helper_reading_thread_index
from kernel_lsp.core.analysis import has_node as _has
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.analysis import _data_dependent
from kernel_lsp.core.index import build_index
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError
from kernel_lsp.core.static_check import problem_sizes
from kernel_lsp.core.transforms.emit import BodyEdit, builtin_fields, emit, node_at, parse
from kernel_lsp.core.transforms.grid_expr import original_grid
from kernel_lsp.core.transforms.launch_edit import launch_bounds_for

#: Original warps per new block (its x extent); each new block is C x 32 threads.
COLUMNS = (16, 32)
_OTHER_AXES = frozenset({"tid.y", "tid.z", "bid.y", "bid.z", "bdim.y", "bdim.z", "gdim.y", "gdim.z"})
_OTHER_BUILTINS = re.compile(r"\b(?:threadIdx|blockIdx|blockDim|gridDim)\s*\.\s*[yz]\b")
_BUILTIN_FIELDS = {("threadIdx", "x"): "kl_vtid", ("blockIdx", "x"): "kl_vbid", ("blockDim", "x"): "kl_bdim",
                   ("gridDim", "x"): "kl_gdim"}
_RANKS = ("thread_rank", "size", "num_threads", "meta_group_rank", "meta_group_size")
_CG_OPS = {"plus": "+", "greater": "max", "less": "min"}
#: The combine of two partial results, as cooperative groups' operators define it.
_COMBINE = {"+": "{a} + {b}", "max": "({b} < {a}) ? {a} : {b}", "min": "({a} < {b}) ? {a} : {b}"}
_HELPER = {"+": "sum", "max": "max", "min": "min"}


@dataclass(frozen=True)
class _Plan:
    block: int
    """The original block's threads."""
    grid: str
    """The original grid's x extent as C over the kernel's parameters."""
    ranks: tuple[tuple[int, int, str], ...]
    """(start, end, replacement) of every group rank or size call."""
    reduces: tuple[tuple[tuple[tuple[int, int, str], ...], str], ...]
    """Every warp reduction: its edits (start, end, text with ``{fn}`` for the helper's name) and operator."""
    columns: tuple[str, ...]
    """The column loads (for the description)."""


def _unwrap(node: Node | None) -> Node | None:
    while node is not None and node.type == "parenthesized_expression" and node.named_children:
        node = node.named_children[-1]
    return node


def _short(src: bytes, fn: Node | None) -> str:
    return _text(src, fn).split("<", 1)[0].rsplit("::", 1)[-1].strip() if fn is not None else ""


_HALVING = ("{o}>>=1", "{o}/=2", "{o}={o}>>1", "{o}={o}/2")
_POSITIVE = ("{o}>0", "{o}>=1", "0<{o}", "1<={o}", "{o}!=0")
_FULL_MASKS = ("0xffffffff", "0xffffffffu", "0xFFFFFFFF", "0xFFFFFFFFu", "0xFFFFFFFFU", "0xffffffffU", "-1", "~0", "~0u")
_SHUFFLE_COMBINE = {"max": "max", "fmaxf": "max", "min": "min", "fminf": "min"}


def _compact(src: bytes, node: Node | None) -> str:
    """A node's text without whitespace or a trailing ``;``."""
    return "".join(_text(src, node).split()).rstrip(";") if node is not None else ""


def _butterfly(call: Node, src: bytes, body: Node, facts) -> tuple[tuple[Node, str, str] | None, str]:  # noqa: ANN001
    """(the loop, the value, its operator) when ``__shfl_xor_sync`` is the one statement of a loop at the
    kernel's top level that combines every lane's value over offsets 16, 8, 4, 2, 1 with the full mask: every
    lane ends with the warp's total, as the rewrite's reduction gives it."""
    loop = call
    while loop.parent is not None and loop.parent != body:
        loop = loop.parent
    if loop.type != "for_statement" or loop.parent != body:
        return None, "not in a loop at the kernel's top level (a butterfly every thread reaches in the same order)"
    cond, update, inner = (loop.child_by_field_name(f) for f in ("condition", "update", "body"))
    fact = next((lp for lp in facts.loops if lp.span == (loop.start_byte, loop.end_byte)), None)
    o = fact.var if fact is not None else None

    if o is None or fact.start != Poly.const(16) or fact.geometric != "halving" \
            or _compact(src, cond) not in {t.format(o=o) for t in _POSITIVE} \
            or _compact(src, update) not in {t.format(o=o) for t in _HALVING}:
        return None, "its loop does not halve an offset from 16 to 1 (a butterfly over the whole warp)"
    statements = inner.named_children if inner is not None and inner.type == "compound_statement" else [inner]
    if len(statements) != 1 or statements[0] is None or statements[0].type != "expression_statement":
        return None, "its loop does more than combine one value with the shuffle"
    e = statements[0].named_children[0] if statements[0].named_children else None
    args = call.child_by_field_name("arguments")
    items = args.named_children if args is not None else []
    if len(items) not in (3, 4) or _compact(src, items[0]) not in _FULL_MASKS or _compact(src, items[2]) != o \
            or len(items) == 4 and _compact(src, items[3]) != "32":
        return None, "the shuffle is not over the full warp (all lanes, offset the loop's, width 32)"
    value = _compact(src, items[1])
    if e is None or e.type != "assignment_expression" or _compact(src, e.child_by_field_name("left")) != value:
        return None, "its loop does more than combine one value with the shuffle"
    operator, right = _text(src, e.child_by_field_name("operator")), e.child_by_field_name("right")
    combine = None
    if operator == "+=" and right == call:
        combine = "+"
    elif operator == "=" and right is not None and right.type == "binary_expression" \
            and _text(src, right.child_by_field_name("operator")) == "+" \
            and {_compact(src, right.child_by_field_name(side)) for side in ("left", "right")} \
            == {value, _compact(src, call)}:
        combine = "+"
    elif operator == "=" and right is not None and right.type == "call_expression":
        pair = right.child_by_field_name("arguments")
        named = pair.named_children if pair is not None else []
        if len(named) == 2 and {_compact(src, named[0]), _compact(src, named[1])} == {value, _compact(src, call)}:
            combine = _SHUFFLE_COMBINE.get(_short(src, right.child_by_field_name("function")))
    if combine is None or e.child_by_field_name("left").type != "identifier":
        return None, f"its loop combines `{value}` otherwise than by +, max or min of the shuffled value"
    return (loop, value, combine), ""


def _operator(src: bytes, op: Node) -> str:
    """The name of a cooperative-groups operator object: ``plus`` of ``cg::plus<float>{}`` or ``cg::plus<float>()``."""
    if op.type == "compound_literal_expression":
        return _short(src, op.child_by_field_name("type"))
    if op.type == "call_expression":
        return _short(src, op.child_by_field_name("function"))
    return _short(src, op)


def _tile_size(src: bytes, call: Node, constants) -> int | None:
    """N of ``tiled_partition<N>(…)``, when N is a literal or a known constant."""
    fn = call.child_by_field_name("function")
    text = _text(src, fn) if fn is not None else ""
    if "<" not in text:
        return None
    inner = text.split("<", 1)[1].rsplit(">", 1)[0].strip()
    if inner.isdigit():
        return int(inner)
    return constants.get(inner)


class WarpColumns(Rule):
    name = "warp-columns"
    technique = "columns-per-warp"
    summary = "a warp-per-output column reduction regrouped: the lanes of a warp take neighbouring outputs"

    def plan(self, ctx: RuleContext) -> tuple[_Plan | None, str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        if ctx.spec is None:
            return None, "needs a launch spec (the launch changes: C x 32 threads per block)"
        launches = ctx.launches()
        blocks = {launch.block for launch in launches}
        if len(blocks) != 1 or next(iter(blocks))[1:] != (1, 1) or next(iter(blocks))[0] % 32:
            return None, "the block is not one size of B x 1 x 1 threads, B a multiple of 32, at every size of the spec"
        block = next(iter(blocks))[0]
        if any(launch.grid[1:] != (1, 1) for launch in launches):
            return None, "the grid is not one-dimensional at every size of the spec"
        for use in facts.index_uses:
            other = sorted(use.value.symbols & _OTHER_AXES) if use.value is not None else []
            if other or use.value is None and _OTHER_BUILTINS.search(use.text):
                return None, f"`{use.text}` reads {', '.join(other) or 'an index'} other than the x thread and block index"
        if facts.barriers:
            return None, f"`{facts.barriers[0].text}` is a barrier: the original block's threads would not meet there"
        if any(a.space == "shared" for a in facts.accesses):
            return None, "the kernel uses shared memory: the original blocks would not exist"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return None, "the kernel's definition was not found in the preprocessed view"
        if (helper := helper_reading_thread_index(facts, root, src)) is not None:
            return None, f"the helper `{helper}` reads the thread or block index"
        if _has(body, ("gnu_asm_expression", "asm_statement")):
            return None, "the kernel has inline assembly (it could read the lane or the warp)"
        groups, why = self._groups(body, src, facts)
        if why:
            return None, why
        top = {(s.start_byte, s.end_byte) for s in body.named_children}
        reduces: list[tuple[tuple[tuple[int, int, str], ...], str]] = []
        butterflies: set[tuple[int, int]] = set()
        for op in facts.warp_operations:
            call = node_at(src, root, op.span)
            if call is not None and _short(src, call.child_by_field_name("function")) == "__shfl_xor_sync":
                found, why = _butterfly(call, src, body, facts)
                if found is None:
                    return None, f"`{op.text}` at line {(op.user_line or 0) + 1}: {why}"
                loop, value, operator = found
                if (loop.start_byte, loop.end_byte) not in butterflies:
                    butterflies.add((loop.start_byte, loop.end_byte))
                    reduces.append((((loop.start_byte, loop.end_byte, f"{value} = {{fn}}({value});"),), operator))
                continue
            why = self._reduce(call, src, groups, top, body)
            if why:
                return None, f"`{op.text}` at line {(op.user_line or 0) + 1}: {why}"
            args = call.child_by_field_name("arguments").named_children  # type: ignore[union-attr]
            reduces.append((((call.start_byte, args[1].start_byte, "{fn}("), (args[1].end_byte, call.end_byte, ")")),
                            _CG_OPS[_operator(src, args[2])]))
        if not reduces:
            return None, "no warp reduction (cg::reduce over a 32-thread tile, or a butterfly of __shfl_xor_sync)"
        ranks, why = self._ranks(body, src, groups, block)
        if why:
            return None, why
        params = {name for name, _, is_pointer in facts.params if not is_pointer and ctx.spec_scalar(name)}
        grid, why = original_grid(ctx, params)
        if grid is None:
            return None, why
        sizes = problem_sizes(ctx.spec)
        for literal in (block, block // 32):
            if literal in sizes:
                return None, (f"the block's {literal} would be written in the kernel, where the harness's static check "
                              f"would take it for the problem size {sizes[literal]}")
        columns, why = self._column_loads(ctx, block)
        if why:
            return None, why
        return _Plan(block, grid, tuple(ranks), tuple(reduces), columns), ""

    def _groups(self, body: Node, src: bytes, facts) -> tuple[dict[str, str], str]:  # noqa: ANN001 - KernelFacts
        """Group objects by name: ``block`` for ``this_thread_block()``, ``tile`` for a 32-thread tile of it."""
        groups: dict[str, str] = {}
        stack = [body]
        while stack:
            n = stack.pop()
            stack.extend(reversed(n.children))
            # ``cg::thread_block_tile<32> warp = …`` reads to tree-sitter as a comparison holding an assignment.
            fields = {"init_declarator": ("declarator", "value"), "assignment_expression": ("left", "right")}.get(n.type)
            if fields is None:
                continue
            name_node, value = n.child_by_field_name(fields[0]), _unwrap(n.child_by_field_name(fields[1]))
            if value is None or value.type != "call_expression" or name_node is None or name_node.type != "identifier":
                continue
            short = _short(src, value.child_by_field_name("function"))
            name = _text(src, name_node)
            if short == "this_thread_block":
                groups[name] = "block"
            elif short == "tiled_partition":
                args = value.child_by_field_name("arguments")
                parent = _unwrap(args.named_children[0]) if args is not None and args.named_child_count == 1 else None
                of_block = parent is not None and (
                    parent.type == "identifier" and groups.get(_text(src, parent)) == "block"
                    or parent.type == "call_expression"
                    and _short(src, parent.child_by_field_name("function")) == "this_thread_block")
                if _tile_size(src, value, facts.constants) != 32 or not of_block:
                    return {}, (f"`{_text(src, n)}` is not a 32-thread tile of the block (only those are regrouped: a "
                                "new warp holds one lane of each of C original warps)")
                groups[name] = "tile"
            elif short in ("this_grid", "coalesced_threads", "this_multi_grid", "binary_partition", "labeled_partition"):
                return {}, f"`{_text(src, n)}` is a group other than the block and its 32-thread tiles"
        return groups, ""

    def _reduce(self, call: Node | None, src: bytes, groups: dict[str, str], top: set[tuple[int, int]],
                body: Node) -> str:
        if call is None or call.type != "call_expression" or _short(src, call.child_by_field_name("function")) != "reduce":
            return ("neither cg::reduce over a tile nor a __shfl_xor_sync butterfly (a reduction that leaves the total "
                    "in some lanes only would get it in every lane)")
        args = call.child_by_field_name("arguments")
        items = args.named_children if args is not None else []
        if len(items) != 3 or groups.get(_text(src, items[0])) != "tile":
            return "its group is not a 32-thread tile of the block"
        if _operator(src, items[2]) not in _CG_OPS:
            return f"its operator `{_text(src, items[2])}` is not cg::plus, cg::greater or cg::less"
        node = call
        while node.parent is not None and node.parent != body:
            node = node.parent
        if (node.start_byte, node.end_byte) not in top or node.type not in ("expression_statement", "declaration") or \
                _has(node, ("conditional_expression",)):
            return ("it is not a statement at the kernel's top level (every thread must reach it, in the same order, "
                    "for the barriers of the new reduction)")
        return ""

    def _ranks(self, body: Node, src: bytes, groups: dict[str, str], block: int
               ) -> tuple[list[tuple[int, int, str]], str]:
        """The replacement of every use of a group object: ranks and sizes in the stand-in indices; the
        group as cg::reduce's first argument and the block as tiled_partition's stay."""
        out: list[tuple[int, int, str]] = []
        stack = [body]
        while stack:
            n = stack.pop()
            if n.type == "identifier" and _text(src, n) in groups:
                parent = n.parent
                if parent is not None and parent.type == "field_expression" and parent.child_by_field_name("argument") == n:
                    call = parent.parent
                    method = _text(src, parent.child_by_field_name("field"))
                    if groups[_text(src, n)] == "tile" and method in ("size", "num_threads"):
                        continue  # the new kernel's tiles are 32 threads too
                    if call is None or call.type != "call_expression" or method not in _RANKS:
                        return [], f"`{_text(src, call or parent)}` is a group member other than its ranks and sizes"
                    kind = groups[_text(src, n)]
                    value = {("tile", "thread_rank"): "(kl_vtid % 32u)", ("tile", "meta_group_rank"): "(kl_vtid / 32u)",
                             ("tile", "meta_group_size"): f"({block // 32}u)", ("block", "thread_rank"): "kl_vtid",
                             ("block", "size"): "kl_bdim", ("block", "num_threads"): "kl_bdim"}.get((kind, method))
                    if value is None:
                        return [], f"`{_text(src, call)}` is a group member other than its ranks and sizes"
                    out.append((call.start_byte, call.end_byte, value))
                    continue
                if parent is not None and parent.type == "argument_list":
                    callee = _short(src, parent.parent.child_by_field_name("function")) if parent.parent is not None else ""
                    first = parent.named_children and parent.named_children[0] == n
                    if first and (callee == "reduce" and groups[_text(src, n)] == "tile"
                                  or callee == "tiled_partition" and groups[_text(src, n)] == "block"):
                        continue
                    return [], f"the group `{_text(src, n)}` is handed to `{callee}`, which could read the real lanes"
                if parent is not None and (parent.type == "init_declarator" and parent.child_by_field_name("declarator") == n
                                           or parent.type == "assignment_expression"
                                           and parent.child_by_field_name("left") == n):
                    # Where the group is made (_groups read what it is made of).
                    continue
                return [], f"the group `{_text(src, n)}` is used as a value at `{_text(src, parent or n)}`"
            stack.extend(n.children)
        return out, ""

    def _column_loads(self, ctx: RuleContext, block: int) -> tuple[tuple[str, ...], str]:
        """The loop's global loads that are uncoalesced now and one element apart between neighbouring warps."""
        facts = ctx.facts
        assert facts is not None
        try:
            binding = Binding.from_spec(ctx.spec)
            patterns = bind(facts, binding)
        except (SpecError, ValueError, ZeroDivisionError):
            return (), "the spec's launch does not evaluate"
        env = {**binding.values, "bdim.x": block, "bdim.y": 1, "bdim.z": 1, "tid.y": 0, "tid.z": 0, "bid.y": 0,
               "bid.z": 0, **{lp.trip_symbol: 1 for lp in facts.loops}}
        # The next warp: 32 threads on in the block, or the next block's first warp for blocks of one warp.
        here, there = ({"tid.x": 0, "bid.x": 1}, {"tid.x": 32, "bid.x": 1}) if block >= 64 else \
            ({"tid.x": 0, "bid.x": 1}, {"tid.x": 0, "bid.x": 2})
        found: list[str] = []
        for p in patterns:
            a = p.access
            if a.space != "global" or not a.reads or not a.loops or not p.uncoalesced or \
                    _data_dependent(a.index, facts.opaque):
                continue
            first, second = evaluate(a.index, {**env, **here}, facts.opaque), evaluate(a.index, {**env, **there}, facts.opaque)
            if first is not None and second is not None and second - first == 1:
                found.append(a.text)
        if not found:
            return (), ("no global load in a loop is uncoalesced across the lanes and one element apart between "
                        "neighbouring warps (nothing a regrouping would coalesce)")
        return tuple(dict.fromkeys(found)), ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        shapes = [c for c in COLUMNS if (c * 32) % plan.block == 0]
        if not shapes:
            return False, f"blocks of {plan.block} threads: no C x 32 block holds a whole number of them"
        return True, (f"one output per warp ({len(plan.reduces)} cg::reduce over its 32-thread tile), "
                      f"{', '.join(f'`{c}`' for c in plan.columns)} a row apart across the lanes and one element apart "
                      "between neighbouring warps; no barrier, shared memory or other warp operation")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        assert plan is not None
        return tuple(self._variant(ctx, plan, c) for c in COLUMNS if (c * 32) % plan.block == 0)

    def _variant(self, ctx: RuleContext, plan: _Plan, columns: int) -> Rewrite:
        facts = ctx.facts
        assert facts is not None and ctx.spec is not None
        src, root = parse(ctx.preprocessed)
        edit = BodyEdit(ctx.preprocessed, facts)
        lo, hi = facts.body_span
        edit.insert(lo + 1, f"\n    // One lane (threadIdx.y) of each of {columns} original warps (threadIdx.x): a warp's lanes read "
                            "neighbouring outputs.\n"
                            f"    const unsigned kl_vwarp = blockIdx.x * {columns}u + threadIdx.x;\n"
                            f"    const unsigned kl_gdim = (unsigned)({plan.grid});\n"
                            f"    if (kl_vwarp >= kl_gdim * {plan.block // 32}u) return;\n"
                            f"    const unsigned kl_bdim = {plan.block}u;\n"
                            "    const unsigned kl_vtid = (kl_vwarp * 32u + threadIdx.y) % kl_bdim;\n"
                            "    const unsigned kl_vbid = (kl_vwarp * 32u + threadIdx.y) / kl_bdim;\n")
        skip = [(s, e) for s, e, _ in plan.ranks]
        for node, new in builtin_fields(src, root.descendant_for_byte_range(lo, hi) or root, lo, hi, _BUILTIN_FIELDS):
            if not any(s <= node.start_byte < e for s, e in skip):
                edit.replace(node.start_byte, node.end_byte, new)
        for start, end, value in plan.ranks:
            edit.replace(start, end, value)
        ops = set()
        for edits, op in plan.reduces:
            for start, end, text in edits:
                edit.replace(start, end, text.format(fn=f"kl_lanes_{_HELPER[op]}_{columns}"))
            ops.add(op)
        helpers = "".join(_helper(op, columns) for op in sorted(ops) if f"kl_lanes_{_HELPER[op]}_{columns}" not in ctx.source)
        source, expanded = emit(edit, ctx.source, ctx.kernel, helpers)
        # The bound follows the new block; the kernel is found again in the new text (helpers moved it).
        kernel = next((f for f in build_index(source).kernels if f.name == ctx.kernel.name), None)
        bounded = launch_bounds_for(source, kernel, columns * 32) if kernel is not None else None
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        divide = columns * 32 // plan.block
        grid = ctx.spec.launch.grid[0]
        description = (f"warp columns: a block of {columns} x 32 threads runs {columns} of the original warps, "
                       f"threadIdx.x the warp (neighbouring outputs, coalesced rows), threadIdx.y its lane; "
                       f"cg::reduce across threadIdx.y through shared memory; the original grid `{plan.grid}` guards "
                       f"the last block" + note)
        return Rewrite(bounded if bounded is not None else source, description,
                       {"grid": [f"(({grid}) + {divide - 1}) / {divide}", 1, 1], "block": [columns, 32, 1],
                        "dynamic_smem": ctx.spec.launch.dynamic_smem},
                       variant=f"{columns}x32", block=(columns, 32, 1), grid_divide=(divide, 1, 1))


def _helper(op: str, columns: int) -> str:
    """A reduction across threadIdx.y of a C x 32 block, its total given to every lane, as ``cg::reduce``
    gives it; the slots are free again when it returns (a later call may reuse them)."""
    step = _COMBINE[op].format(a="kl_lanes[threadIdx.y][threadIdx.x]", b="kl_lanes[threadIdx.y + s][threadIdx.x]")
    return (f"template <typename T>\n__device__ __forceinline__ T kl_lanes_{_HELPER[op]}_{columns}(T v) {{\n"
            f"    __shared__ T kl_lanes[32][{columns}];\n"
            "    kl_lanes[threadIdx.y][threadIdx.x] = v;\n"
            "    __syncthreads();\n"
            "    for (unsigned s = 16; s > 0; s >>= 1) {\n"
            f"        if (threadIdx.y < s) kl_lanes[threadIdx.y][threadIdx.x] = {step};\n"
            "        __syncthreads();\n"
            "    }\n"
            "    T total = kl_lanes[0][threadIdx.x];\n"
            "    __syncthreads();\n"
            "    return total;\n"
            "}\n")
