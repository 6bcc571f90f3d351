"""Thread coarsening for block reductions: each thread fills several slots before the tree.

A kernel that reduces one value per thread in a shared tree (``sdata[tid] = in[i]; …tree…;
out[blockIdx.x] = sdata[0]``) has each thread issue one load: a block of 256 threads keeps 1 KiB in
flight. :class:`TreeCoarsen` launches the same grid with blocks ``C`` times smaller; each thread
runs ``C`` of the original block's threads up to the tree (thread ``t`` runs ``t``, ``t + b``, …,
``t + (C - 1) b`` for a block of ``b = B / C`` threads, so a warp still reads consecutive
elements), sums the ``C`` slots it filled in registers, and the block combines the sums with warp
shuffles into the tree's root. The number of blocks, hence a per-block output, is unchanged; the
host's launch is edited to the new block (and ``__launch_bounds__`` with it).

The code before the tree runs as written for the thread's own first original thread (its locals
stay visible to the code after the tree), then in a loop over the others with ``threadIdx.x`` read
as ``threadIdx.x + k * blockDim.x``; ``blockDim.x`` everywhere outside the tree reads as the
original block, ``blockDim.x * C``.

Legality, in terms of the analysis (each refusal names the missing fact):
- the tree is :func:`~kernel_lsp.core.transforms.tree_model.find_trees`' (proven at every size of
  the spec), one, at the top level of the kernel's body, and the block is the same 1-D shape at
  every size;
- before the tree the kernel's threads are independent: shared memory only at each thread's own
  slots of the tree (``root + threadIdx.x``), no warp-level operation, no loop (the copies of a
  loop would run one after another: nothing more in flight, fewer threads to hide it), barriers
  only as statements of the body (they stay where they are), every name it assigns declared there
  (a copy runs in its own scope), no global array both written there and read by the kernel, no
  helper that reads the thread index or the block's size itself; a cooperative group's rank and size
  of the block (``cta.thread_rank()``, ``cta.size()``) are read as the builtins are, any other index
  read through a group is refused;
- after the tree only thread 0 does anything observable: every access there is the root's read or
  runs under a guard proving ``threadIdx.x == 0``, and it calls no helper of the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import assigned_names, declared_anywhere, function_definitions
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.index import build_index
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.transforms.block_reduce import (
    _block_reduce, block_reduce_many, replace_by_lines, slot, value_type,
)
from kernel_lsp.core.transforms.emit import (
    BodyEdit, UserText, builtin_fields, emit, expands_to, node_at, parse, warp_reduce_helpers,
)
from kernel_lsp.core.transforms.launch_edit import launch_bounds_for
from kernel_lsp.core.transforms.tree_model import SharedTree, c_index, find_trees, is_barrier

#: Original threads per new thread, in the order tried; at most two variants are offered.
FACTORS = (4, 8, 2)
_VARIANTS = 2
_BUILTIN_TEXT = re.compile(r"\b(threadIdx|blockDim)\b")


@dataclass(frozen=True)
class _Plan:
    tree: SharedTree
    block: int
    before: tuple[Node, ...]
    """The body's statements before the tree."""
    after: tuple[Node, ...]


class TreeCoarsen(Rule):
    name = "tree-coarsen"
    technique = "thread-coarsening"
    summary = "a block reduction whose threads each fill several slots first: blocks C times smaller, same grid"

    def plan(self, ctx: RuleContext) -> tuple[_Plan | None, str]:
        trees, why = find_trees(ctx)
        if not trees:
            return None, why
        if len(trees) != 1:
            return None, "the kernel has several trees (each would need its own virtual threads)"
        tree = trees[0]
        facts = ctx.facts
        block = ctx.constant_block()
        if block is None or block[1:] != (1, 1):
            return None, "the block is not the same 1-D shape at every size of the spec"
        unknown = [call for call in facts.implicit_indices if "".join(call.split()) not in facts.group_values]
        if unknown:
            return None, f"the kernel reads an index through a cooperative group as `{unknown[0]}`, which the analysis does not model"
        src, root = parse(ctx.preprocessed)
        body = node_at(src, root, facts.body_span)
        stmts = [c for c in body.named_children if c.type != "comment"] if body is not None else []
        first = next((i for i, s in enumerate(stmts) if s.start_byte == tree.span[0]), None)
        last = next((i for i, s in enumerate(stmts) if s.end_byte == tree.span[1]), None)
        if first is None or last is None:
            return None, "the tree is not at the top level of the kernel's body"
        before, after = stmts[:first], stmts[last + 1:]
        why = self._before(facts, tree, before, src, root) or self._after(facts, tree, after, src, root)
        if why:
            return None, why
        other = next((n for n, kind in group_reads(src, [*before, *after], facts) if kind == "other"), None)
        if other is not None:
            return None, (f"`{_text(src, other)}` reads the thread index through a cooperative group other than as the "
                          "block's thread rank or size")
        return _Plan(tree, block[0], tuple(before), tuple(after)), ""

    def _before(self, facts, tree: SharedTree, before: list[Node], src: bytes, root: Node) -> str | None:
        if not before:
            return "nothing before the tree fills its slots"
        lo, hi = before[0].start_byte, before[-1].end_byte
        slots = {(v.array, flat(v.first + Poly.sym("tid.x"))) for v in tree.values}
        mine = [a for a in facts.accesses if lo <= a.span[0] < hi]
        for a in mine:
            if a.space == "shared" and (a.array, flat(a.index)) not in slots:
                return f"`{a.text}` at line {(a.user_line or 0) + 1} reads or writes shared memory other than the thread's own slot"
        for b in facts.barriers:
            if lo <= b.span[0] < hi and not any(is_barrier(s, src, facts) and s.start_byte <= b.span[0] < s.end_byte for s in before):
                return f"the barrier at line {(b.user_line or 0) + 1} before the tree is not a statement of the body"
        if any(lo <= w.span[0] < hi for w in facts.warp_operations):
            return "a warp-level operation before the tree (which threads share a warp changes)"
        loop = next((lp for lp in facts.loops if lo <= lp.span[0] < hi), None)
        if loop is not None:
            # The copies of a loop run one after another: the point of coarsening, loads in flight
            # together, is lost, and the block has fewer threads to hide their latency.
            return (f"the code before the tree loops (line {(loop.user_line or 0) + 1}): a thread's original threads "
                    "would run it one after another")
        written = {a.array for a in mine if a.space == "global" and a.writes}
        read_anywhere = {a.array for a in facts.accesses if a.space == "global" and a.reads}
        if written & read_anywhere:
            return (f"the code before the tree writes `{sorted(written & read_anywhere)[0]}`, which the kernel reads: "
                    "one thread's original threads would see each other's stores in another order")
        declared: set[str] = set()
        assigned: set[str] = set()
        for s in before:
            declared |= declared_anywhere(s, src)
            assigned |= assigned_names(s, src)
        if assigned - declared:
            return f"the code before the tree assigns `{sorted(assigned - declared)[0]}`, declared outside it"
        return _helper_reading(before, src, root)

    def _after(self, facts, tree: SharedTree, after: list[Node], src: bytes, root: Node) -> str | None:
        if not after:
            return None
        lo, hi = after[0].start_byte, after[-1].end_byte
        roots = {(v.array, flat(v.root)) for v in tree.values}
        for a in facts.accesses:
            if not lo <= a.span[0] < hi:
                continue
            if a.kind == "read" and (a.array, flat(a.index)) in roots:
                continue
            if not _thread_zero(facts, a):
                return (f"`{a.text}` at line {(a.user_line or 0) + 1} after the tree runs in threads other than thread 0 "
                        "(their original threads would not all exist)")
        if any(lo <= w.span[0] < hi for w in facts.warp_operations):
            return "a warp-level operation after the tree"
        defined = {name for name, _, head in function_definitions(root, src)}
        for s in after:
            for call in _calls(s, src):
                if call in defined:
                    return f"the code after the tree calls `{call}`, whose accesses are not placed after the tree"
        return None

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        if not self._factors(plan.block):
            return False, f"a block of {plan.block} threads has no smaller block of whole warps that divides it"
        return True, (f"the tree on {', '.join(f'`{v.array}`' for v in plan.tree.values)} is proven; before it the threads "
                      "touch only their own slots and are independent, after it only thread 0 acts: a thread can run "
                      "several of the original threads up to the tree")

    @staticmethod
    def _factors(block: int) -> list[int]:
        return [c for c in FACTORS if block % c == 0 and (block // c) % 32 == 0][:_VARIANTS]

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        assert plan is not None
        out = []
        for c in self._factors(plan.block):
            rw = self._variant(ctx, plan, c)
            if rw is not None:
                out.append(rw)
        return tuple(out)

    def _variant(self, ctx: RuleContext, plan: _Plan, c: int) -> Rewrite | None:
        facts, pre = ctx.facts, ctx.preprocessed
        src, root = parse(pre)
        edit = BodyEdit(pre, facts)
        start = root.descendant_for_byte_range(*facts.body_span) or root
        width = {("blockDim", "x"): f"(blockDim.x * {c}u)"}
        groups = dict(group_reads(src, [*plan.before, *plan.after], facts))
        for part in (plan.before, plan.after):
            if part:
                for node, new in builtin_fields(src, start, part[0].start_byte, part[-1].end_byte, width):
                    edit.replace(node.start_byte, node.end_byte, new)
        for node, kind in groups.items():
            if kind == "width":
                edit.replace(node.start_byte, node.end_byte, f"({_text(src, node)} * {c}u)")
        copies = [s for s in plan.before if not is_barrier(s, src, facts) and "__shared__" not in _text(src, s)]
        last = max(s.end_byte for s in copies)
        lanes = {("threadIdx", "x"): "(threadIdx.x + kl_k * blockDim.x)", **width}
        user = UserText(pre, facts, ctx.source, ctx.kernel)
        texts = []
        for s in copies:
            subs = [(n.start_byte, n.end_byte, new) for n, new in builtin_fields(src, s, s.start_byte, s.end_byte, lanes)]
            subs += [(n.start_byte, n.end_byte, f"({_text(src, n)} + kl_k * blockDim.x)" if kind == "thread"
                      else f"({_text(src, n)} * {c}u)")
                     for n, kind in groups.items() if kind in ("thread", "width") and s.start_byte <= n.start_byte < s.end_byte]
            expanded = _apply(src, s.start_byte, s.end_byte, subs)
            own = user.span(s.start_byte, s.end_byte, subs)
            texts.append(own if own is not None and expands_to(own, expanded, pre) else expanded)
        indent = edit.indent_at(copies[0].start_byte)
        inner = ("\n" + indent + "    ").join(t.replace("\n", "\n    ") for t in texts)
        edit.insert(last, f"\n{indent}// the other {c - 1} original threads of this thread, up to the tree\n"
                          f"{indent}#pragma unroll\n{indent}for (unsigned kl_k = 1u; kl_k < {c}u; ++kl_k) {{\n"
                          f"{indent}    {inner}\n{indent}}}")
        replace_by_lines(edit, plan.tree.span[0], plan.tree.span[1],
                         self._tree_text(ctx, plan.tree, c).replace("\n", "\n" + edit.indent_at(plan.tree.span[0])))
        source, expanded = emit(edit, ctx.source, ctx.kernel, warp_reduce_helpers({v.op for v in plan.tree.values}, ctx.source))
        # The bound follows the new block; the kernel is found again in the new text (helpers moved it).
        kernel = next((f for f in build_index(source).kernels if f.name == ctx.kernel.name), None)
        source = launch_bounds_for(source, kernel, plan.block // c) if kernel is not None else None
        spec = ctx.spec
        override = {"grid": list(spec.launch.grid), "block": [plan.block // c, 1, 1], "dynamic_smem": spec.launch.dynamic_smem}
        if source is None or not ctx.launch_ok(override):
            return None
        note = " (the kernel's body with its macros expanded)" if expanded and pre.macros else ""
        return Rewrite(source, f"thread coarsening: blocks of {plan.block // c} threads, each running {c} of the original "
                               f"block's threads up to the tree, their slots summed in registers and the block combined "
                               f"with warp shuffles; same grid{note}", override, variant=f"x{c}",
                       block=(plan.block // c, 1, 1), grid_divide=(1, 1, 1))

    def _tree_text(self, ctx: RuleContext, tree: SharedTree, c: int) -> str:
        parts = []
        for j, v in enumerate(tree.values):
            elem = value_type(ctx, v)
            slots = [f"({elem})({slot(v, 'threadIdx.x' if k == 0 else f'threadIdx.x + {k}u * blockDim.x')})" for k in range(c)]
            if v.op == "+":
                value = " + ".join(slots)
            else:
                value = slots[0]
                for s in slots[1:]:
                    value = f"{v.op}({value}, {s})"
            parts.append((v.op, elem, value, f"kl_part{j}", f"kl_total{j}"))
        if len(parts) == 1:
            op, elem, value, part, _ = parts[0]
            core = _block_reduce(op, elem, value, part, "threadIdx.x", "blockDim.x")
            stores = f"{tree.values[0].name}[{c_index(tree.values[0].root)}] = kl_total;"
        else:
            core = block_reduce_many(parts, "threadIdx.x", "blockDim.x")
            stores = " ".join(f"{v.name}[{c_index(v.root)}] = kl_total{j};" for j, v in enumerate(tree.values))
        return (f"{{ // the tree as warp shuffles over this thread's {c} slots: the total written to the root slot\n"
                f"    __syncthreads();\n    {core}"
                f"    if (threadIdx.x == 0u) {{ {stores} }}\n    __syncthreads();\n}}")


def flat(poly: Poly) -> Poly:
    """``poly`` on a 1-D block: ``threadIdx.y`` and ``.z`` are 0, ``blockDim.y`` and ``.z`` are 1 (a
    cooperative group's rank is the block's linear thread index)."""
    acc: dict = {}
    for m, c in poly.terms:
        if any(s in ("tid.y", "tid.z") for s in m):
            continue
        key = tuple(s for s in m if s not in ("bdim.y", "bdim.z"))
        acc[key] = acc.get(key, 0) + c
    return Poly._from({k: v for k, v in acc.items() if v})


def _thread_zero(facts, access) -> bool:  # noqa: ANN001 - KernelFacts, Access
    """Some guard of ``access`` proves the thread is thread 0 of a 1-D block."""
    tid = Poly.sym("tid.x")
    return any(c.op == "==" and {flat(c.left), flat(c.right)} == {tid, Poly()} for c in facts.constraints(access))


def group_reads(src: bytes, stmts: list[Node], facts) -> list[tuple[Node, str]]:  # noqa: ANN001 - KernelFacts
    """The cooperative-group calls in ``stmts`` that read a thread or block index (:attr:`KernelFacts.group_values`),
    each as ``thread`` (the block's thread rank), ``width`` (the block's size), ``block`` (the same for the whole
    block) or ``other``."""
    tid, width = Poly.sym("tid.x"), Poly.sym("bdim.x")
    found, stack = [], list(stmts)
    while stack:
        n = stack.pop()
        key = "".join(_text(src, n).split()) if n.type in ("call_expression", "field_expression") else None
        if key is not None and key in facts.group_values:
            poly = facts.group_values[key]
            poly = flat(poly)
            kind = ("thread" if poly == tid else "width" if poly == width
                    else "block" if not any(s.startswith(("tid.", "bdim.")) for s in poly.symbols) else "other")
            found.append((n, kind))
            continue
        stack.extend(n.children)
    return found


def _apply(src: bytes, lo: int, hi: int, subs: list[tuple[int, int, str]]) -> str:
    out, at = [], lo
    for s, e, new in sorted(subs):
        out += [src[at:s].decode("utf-8"), new]
        at = e
    out.append(src[at:hi].decode("utf-8"))
    return "".join(out)


def _calls(node: Node, src: bytes) -> set[str]:
    found, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n.type == "call_expression":
            fn = n.child_by_field_name("function")
            if fn is not None:
                found.add(_text(src, fn).split("<", 1)[0].rsplit("::", 1)[-1].strip())
        stack.extend(n.children)
    return found


def _helper_reading(stmts: list[Node], src: bytes, root: Node) -> str | None:
    """A function of the file the statements call whose own text reads the thread index or the block's
    size (its reads are not renamed), or None."""
    defined = {name: node for name, node, _ in function_definitions(root, src)}
    for s in stmts:
        for call in _calls(s, src):
            if call in defined and _BUILTIN_TEXT.search(_text(src, defined[call])):
                return f"the function `{call}` reads the thread index or the block's size itself"
    return None
