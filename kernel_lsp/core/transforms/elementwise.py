"""Kernels whose threads each handle the element of their global index: grid-stride loops, other
block sizes, float4 vectors.

All three start from one fact about the kernel (:func:`elements`): its threads differ only by the
global index ``i = blockIdx.x * blockDim.x + threadIdx.x`` (no barrier, shared memory, warp-level
operation or cooperative group, and every read of a builtin is ``i`` itself:
:func:`~kernel_lsp.core.analysis.threads_differ_only_by`), and every global access runs under a
guard ``i < N`` (:func:`~kernel_lsp.core.analysis.index_bound`), whatever the statements look like:
``if (i < n) {…}``, ``if (i >= n) return;``, a condition on two indices, a macro or a helper.

:class:`GridStride` — the element loop ``for (e = i; e < N; e += gridDim.x * blockDim.x)`` around
the kernel's body, with a grid of one wave of the GPU. Legal when the original launch has at least
``N`` threads at every size of the spec (the loop then computes exactly the elements the original
threads computed), the kernel does not read the launch's width (``gridDim.x * blockDim.x``, which
the new grid changes) and every ``return`` can end one element (none inside a loop or ``switch``).
Where the global index is held in a variable declared at the body's top level, that declaration
becomes the loop's header and the guard that held the rest of the body its condition.

:class:`BlockSizeSweep` — the same threads in other 1-D blocks, the grid recomputed to cover them;
a launch with more threads than before is taken only where the guard leaves the extra ones idle
(:func:`same_work`).

:class:`VectorizeElementwise` — ``out[i] = f(a[i], b[i], scalars)`` on float arrays as a float4
grid-stride loop plus a scalar tail: the kernel's only global store is one element at the index
of every thread's element (``i``, a grid-stride loop's ``i``, or ``i * C + k`` of a chunk of ``C``),
every global read is an element of a float array at that same index, the stored value is made of
those elements, the kernel's scalar parameters and math functions only, the spec gives every array
its own allocation, and the original launch covers every element below ``N``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import (
    Access, KernelFacts, LoopFact, assigned_names, global_index, grid_threads, index_bound, is_pure_math,
    threads_differ_only_by,
)
from kernel_lsp.core.analysis import has_node as _has
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import with_candidate_launch
from kernel_lsp.core.transforms.emit import node_at, parse, rebuild, user_line_of
from kernel_lsp.core.transforms.launch_edit import launch_bounds_for

#: Streaming multiprocessors assumed when a rule caps a grid (an H200 has 132). Only the
#: launch's speed depends on it, never its correctness (grid-stride loops cover any grid).
DEFAULT_SM_COUNT = 132
#: Resident threads per SM on sm_80/sm_90.
THREADS_PER_SM = 2048
_BLOCK_SIZES = (128, 256, 512, 1024)
_LOOPS = ("for_statement", "while_statement", "do_statement", "for_range_loop", "switch_statement")


def one_dimensional_launch(ctx: RuleContext) -> str | None:
    """Why the spec's launch is not 1-D with a constant block, or None."""
    if ctx.spec is None:
        return "needs a launch spec (the launch changes)"
    block = ctx.constant_block()
    if block is None or block[1:] != (1, 1):
        return "the spec's block is not one-dimensional and the same at every size"
    if any(launch.grid[1:] != (1, 1) for launch in ctx.launches()):
        return "the spec's grid is not one-dimensional"
    return None


def elements(ctx: RuleContext, grid: bool = True) -> tuple[Poly | None, str]:
    """(the bound ``N`` of the elements, why not): the kernel's threads differ only by their global
    1-D index (and, when ``grid``, the launch's width), and every global access runs under ``i < N``."""
    facts = ctx.facts
    if facts is None or not facts.complete:
        return None, "the kernel's analysis is missing or incomplete"
    why = threads_differ_only_by(facts, ("x",), grid)
    if why:
        return None, why
    bound = index_bound(facts, "x")
    if bound is None:
        return None, "no guard `i < N` on the global index holds at every global access (the threads past the data would run)"
    return bound, ""


def bound_values(ctx: RuleContext, bound: Poly) -> list[int] | None:
    """The bound at every size of the spec (main size first); None when it names something the spec does not give."""
    assert ctx.spec is not None
    constants = {k: int(v) for k, v in ctx.preprocessed.object_macros().items() if str(v).lstrip("-").isdigit()}
    out = []
    for variant in [None, *range(len(ctx.spec.variants))]:
        values = {k: v for k, v in ctx.spec.values(variant).items() if isinstance(v, int)}
        value = bound.evaluate({**constants, **values})
        if value is None:
            return None
        out.append(value)
    return out


def same_work(ctx: RuleContext, override: dict, bound: Poly | None, axis: int = 0) -> bool:
    """A launch ``override`` runs the original's threads' work along ``axis`` (0: x, 1: y) and nothing more, at
    every size of the spec: the same number of threads, or more threads where the original's already reach
    the guard's bound (the extra ones, past it, do nothing). A grid rounded up past the original's threads is
    illegal otherwise: a kernel whose guard reaches further than its launch (``i < n`` with fewer than
    ``n`` threads) would compute elements the original leaves alone."""
    assert ctx.spec is not None
    candidate = with_candidate_launch(ctx.spec, override)
    values = bound_values(ctx, bound) if bound is not None else None
    for k, variant in enumerate([None, *range(len(ctx.spec.variants))]):
        resolved = candidate.resolve(variant)
        before = resolved.original.grid[axis] * resolved.original.block[axis]
        after = resolved.candidate.grid[axis] * resolved.candidate.block[axis]
        if after == before:
            continue
        if after < before or values is None or values[k] > before:
            return False
    return True


def covers(ctx: RuleContext, bound: Poly, per_thread: int = 1) -> str | None:
    """Why the original launch leaves some element below the bound alone (fewer threads than ``N``), or None."""
    values = bound_values(ctx, bound)
    if values is None:
        return f"the bound `{bound}` does not evaluate at every size of the spec"
    for k, launch in enumerate(ctx.launches()):
        threads = launch.grid[0] * launch.block[0] * per_thread
        if threads < values[k]:
            return f"the original launch covers {threads} elements, fewer than the bound's {values[k]}"
    return None


def _comparisons(test) -> list:
    """The comparisons of a test in the order they are written (``a < b && c < d``: both)."""
    if test[0] == "cmp":
        return [test[1]]
    if test[0] in ("and", "or"):
        return [c for part in test[1] for c in _comparisons(part)]
    if test[0] == "not":
        return _comparisons(test[1])
    return [None]


def _comparison_nodes(node: Node | None, src: bytes) -> list[Node]:
    """The comparison expressions of a condition in the order they are written."""
    while node is not None and node.type == "parenthesized_expression" and node.named_children:
        node = node.named_children[-1]
    if node is None:
        return []
    if node.type == "binary_expression":
        op = _text(src, node.child_by_field_name("operator"))
        if op in ("&&", "||"):
            return _comparison_nodes(node.child_by_field_name("left"), src) + \
                _comparison_nodes(node.child_by_field_name("right"), src)
        return [node]
    if node.type == "unary_expression":
        return _comparison_nodes(node.child_by_field_name("argument"), src)
    return [node]


def bound_text(src: bytes, root: Node, conditions, index: Poly, bound: Poly) -> str | None:
    """How the kernel writes the bound ``bound`` of ``index`` in one of its own conditions (``n`` in
    ``if (i < n)`` or ``if (r >= rows || c >= cols) return;``); None when no condition of its body does."""
    for condition in conditions:
        if condition.via:
            continue
        comparisons = _comparisons(condition.test)
        nodes = _comparison_nodes(node_at(src, root, condition.span), src)
        if len(nodes) != len(comparisons):
            continue
        for c, node in zip(comparisons, nodes):
            if c is None or bound not in (c.upper_bound(index), c.negated().upper_bound(index)):
                continue
            side = "right" if c.left == index else "left" if c.right == index else None
            operand = node.child_by_field_name(side) if side else None
            if operand is not None:
                return _text(src, operand)
    return None


def loop_bound_text(ctx: RuleContext, src: bytes, root: Node, facts: KernelFacts, index: Poly, bound: Poly) -> str | None:
    """The bound as a loop header before the body can write it: as the kernel writes it where that names
    only parameters, macros and literals, else the polynomial over the scalar parameters; None when it
    holds anything else (a value the kernel computes)."""
    written = bound_text(src, root, facts.conditions, index, bound)
    params = {name for name, _, _ in facts.params}
    if written is not None:
        node = parse_expression(written)
        names = {_text(node[0], n) for n in _identifiers(node[1])} if node is not None else None
        if names is not None and names <= params | set(ctx.preprocessed.object_macros()):
            return written
    scalars = {name for name, _, is_pointer in facts.params if not is_pointer}
    if not bound.symbols <= scalars:
        return None
    terms = []
    for monomial, c in sorted(bound.terms, key=lambda t: (-len(t[0]), t[0])):
        factors = ([] if abs(c) == 1 and monomial else [str(abs(c))]) + list(monomial)
        terms.append(("- " if c < 0 else "+ ") + " * ".join(factors))
    text = " ".join(terms) or "+ 0"
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def parse_expression(text: str) -> tuple[bytes, Node] | None:
    from kernel_lsp.core.analysis import parse_text

    src, root = parse_text(f"int kl_bound = ({text});")
    return (src, root) if not root.has_error else None


def _identifiers(node: Node) -> list[Node]:
    found, stack = [], [node]
    while stack:
        n = stack.pop()
        if n.type == "identifier" and not (n.parent is not None and n.parent.type == "init_declarator"
                                          and n.parent.child_by_field_name("declarator") == n):
            found.append(n)
        stack.extend(n.children)
    return found


# --------------------------------------------------------------------------------------------
# Grid-stride loops
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stride:
    bound: Poly
    bound_text: str
    declaration: Node | None
    """The top-level ``T i = <global index>;`` that becomes the loop's header, or None (the loop gets its own variable)."""
    var: str
    type_text: str
    guard: Node | None
    """The ``if (i < N)`` holding the rest of the body, or the ``if (i >= N) return;`` before it (dropped: the loop's condition)."""
    returns: tuple[Node, ...]
    """The kernel's own returns that become ``continue`` (they end one element)."""


class GridStride(Rule):
    name = "grid-stride"
    technique = "grid-stride-loop"
    summary = "one element per thread -> grid-stride loop with a grid sized to the GPU"

    def plan(self, ctx: RuleContext) -> tuple[_Stride | None, str]:
        why = one_dimensional_launch(ctx)
        if why:
            return None, why
        bound, why = elements(ctx, grid=False)
        if bound is None:
            return None, why
        why = covers(ctx, bound)
        if why:
            return None, f"{why}: a grid-stride loop would compute elements the original leaves alone"
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return None, "the kernel's definition was not found in the preprocessed view"
        gx = global_index("x")
        written = loop_bound_text(ctx, src, root, facts, gx, bound)
        if written is None:
            return None, f"the bound `{bound}` of the global index is neither written with the kernel's parameters nor made of them"
        uses = [u for u in facts.index_uses if not u.via]
        if any(u.value != gx for u in uses) or any(u.via for u in facts.index_uses):
            return None, "the global index is read scaled, offset or inside a helper, not as the element's index"
        declaration, var, type_text = self._declaration(src, body, facts, uses)
        returns = tuple(n for n in _kernel_returns(body))
        for ret in returns:
            if ret.named_child_count or _inside(ret, body, _LOOPS):
                line = user_line_of(ctx.preprocessed, ret.start_point[0])
                return None, f"the return at line {line} sits in a loop or switch (it would end every later element)"
        guard = self._guard(src, root, body, facts, declaration, bound) if declaration is not None else None
        if guard is not None and guard.type == "if_statement" and guard.child_by_field_name("alternative") is None \
                and _only_return(guard.child_by_field_name("consequence")):
            returns = tuple(r for r in returns if not guard.start_byte <= r.start_byte < guard.end_byte)
        return _Stride(bound, written, declaration, var, type_text, guard, returns), ""

    @staticmethod
    def _declaration(src: bytes, body: Node, facts: KernelFacts, uses) -> tuple[Node | None, str, str]:
        """The top-level declaration ``T i = <global index>;`` that every access's element comes from, when
        nothing before it touches memory or declares what the rest assigns (it runs once per thread, before
        the loop); else (None, the loop's own variable, its type)."""
        assigned = assigned_names(body, src)
        for stmt in body.named_children:
            if stmt.type == "declaration" and set(_declared(stmt, src)) & assigned:
                break
            if stmt.type == "declaration":
                decls = stmt.children_by_field_name("declarator")
                value = decls[0].child_by_field_name("value") if len(decls) == 1 and decls[0].type == "init_declarator" else None
                target = decls[0].child_by_field_name("declarator") if value is not None else None
                if value is not None and target is not None and target.type == "identifier" and len(uses) == 1 \
                        and (value.start_byte, value.end_byte) == uses[0].span \
                        and _text(src, target) not in assigned:
                    type_node = stmt.child_by_field_name("type")
                    return stmt, _text(src, target), _text(src, type_node) if type_node is not None else "int"
            if any(stmt.start_byte <= a.span[0] < stmt.end_byte for a in facts.accesses) or _has(stmt, ("call_expression",)):
                break
        text = uses[0].text if uses else "blockIdx.x * blockDim.x + threadIdx.x"
        return None, "kl_e", f"decltype({text})"

    @staticmethod
    def _guard(src: bytes, root: Node, body: Node, facts: KernelFacts, declaration: Node, bound: Poly) -> Node | None:
        """The statement right after the declaration that only checks the bound: ``if (i < N) {…}`` as the last
        statement, or ``if (i >= N) return;``."""
        top = [c for c in body.named_children if c.type != "comment"]
        at = top.index(declaration)
        rest = top[at + 1:]
        if not rest or rest[0].type != "if_statement":
            return None
        gx = global_index("x")
        condition = next((c for c in facts.conditions if c.statement_span == (rest[0].start_byte, rest[0].end_byte)), None)
        if condition is None or condition.test[0] != "cmp":
            return None
        if condition.kind == "if" and len(rest) == 1 and rest[0].child_by_field_name("alternative") is None \
                and condition.test[1].upper_bound(gx) == bound:
            return rest[0]
        if condition.kind == "exit" and condition.test[1].negated().upper_bound(gx) == bound \
                and _only_return(rest[0].child_by_field_name("consequence")):
            return rest[0]
        return None

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        return True, (f"every thread handles the element of its global index below `{plan.bound_text}`, and the "
                      "original launch has a thread for each")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        assert plan is not None and ctx.spec is not None
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body")
        lo, hi = facts.body_span
        subs = [(r.start_byte, r.end_byte, "continue;") for r in plan.returns]
        indent = _indent(src, body)
        nested = False
        if plan.declaration is None:
            subs += [(u.span[0], u.span[1], "kl_e") for u in facts.index_uses if not u.via]
            start = next(u.text for u in facts.index_uses)
            header = (f"for ({plan.type_text} kl_e = {start}; kl_e < {plan.bound_text}; "
                      f"kl_e += ({plan.type_text})blockDim.x * gridDim.x) {{")
            first, last = _inner(body)
            piece = (first, last)
            prologue = None
        else:
            decl = plan.declaration
            init = decl.children_by_field_name("declarator")[0].child_by_field_name("value")
            type_text = _strip_const(plan.type_text)
            prologue = (lo + 1, decl.start_byte) if _inner(body)[0] < decl.start_byte else None
            header_init = init
            header = None
            if plan.guard is not None and plan.guard.child_by_field_name("alternative") is None \
                    and not _only_return(plan.guard.child_by_field_name("consequence")):
                # The guard's block is already a level deeper than the declaration that becomes the loop.
                nested = plan.guard.child_by_field_name("consequence").type == "compound_statement"
                first, last = _inner(plan.guard.child_by_field_name("consequence"))
            elif plan.guard is not None:
                first, last = plan.guard.end_byte, _inner(body)[1]
            else:
                first, last = decl.end_byte, _inner(body)[1]
            piece = (first, last)

        def build(text) -> str:
            inner = text(piece[0], piece[1], [s for s in subs if piece[0] <= s[0] < piece[1]]) if piece[0] < piece[1] else ""
            if plan.declaration is not None:
                head = (f"for ({type_text} {plan.var} = {text(header_init.start_byte, header_init.end_byte)}; "
                        f"{plan.var} < {plan.bound_text}; {plan.var} += ({type_text})blockDim.x * gridDim.x) {{")
            else:
                head = header
            before = (text(prologue[0], prologue[1]) + "\n" + indent) if prologue is not None else ""
            if not nested:
                inner = inner.replace("\n", "\n    ")  # one level deeper, inside the loop
            return f"\n{indent}{before}{head}\n{indent}    {inner}\n{indent}}}\n"

        source, expanded = rebuild(ctx.preprocessed, facts, ctx.source, ctx.kernel, build)
        bx = ctx.constant_block()[0]  # type: ignore[index]
        cap = DEFAULT_SM_COUNT * (THREADS_PER_SM // bx)
        override = {"grid": [f"min({ctx.spec.launch.grid[0]}, {cap})", "1", "1"], "block": [bx, 1, 1],
                    "dynamic_smem": ctx.spec.launch.dynamic_smem}
        if not ctx.launch_ok(override):
            return ()
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"grid-stride loop over {plan.var}; grid capped at {cap} blocks (one full wave){note}",
                        override),)


def _declared(stmt: Node, src: bytes) -> list[str]:
    from kernel_lsp.core.analysis.syntax import _declared_names

    return _declared_names(stmt, src)


def _kernel_returns(body: Node) -> list[Node]:
    found, stack = [], [body]
    while stack:
        n = stack.pop()
        if n.type == "return_statement":
            found.append(n)
        stack.extend(n.children)
    return sorted(found, key=lambda n: n.start_byte)


def _inside(node: Node, stop: Node, types: tuple[str, ...]) -> bool:
    up = node.parent
    while up is not None and up != stop:
        if up.type in types:
            return True
        up = up.parent
    return False


def _only_return(node: Node | None) -> bool:
    while node is not None and node.type == "compound_statement":
        inner = [c for c in node.named_children if c.type != "comment"]
        if len(inner) != 1:
            return False
        node = inner[0]
    return node is not None and node.type == "return_statement" and node.named_child_count == 0


def _inner(block: Node) -> tuple[int, int]:
    """The byte range of a block's statements (its braces and the blanks inside them left out); a
    single statement's own range."""
    if block.type != "compound_statement":
        return block.start_byte, block.end_byte
    inner = [c for c in block.named_children]
    if not inner:
        return block.start_byte + 1, block.start_byte + 1
    return inner[0].start_byte, inner[-1].end_byte


def _indent(src: bytes, body: Node) -> str:
    first = next(iter(body.named_children), None)
    if first is None:
        return "    "
    line = src[src.rfind(b"\n", 0, first.start_byte) + 1:first.start_byte].decode("utf-8")
    return line if not line.strip() else "    "


def _strip_const(type_text: str) -> str:
    words = type_text.split()
    return " ".join(w for w in words if w != "const") or "int"


# --------------------------------------------------------------------------------------------
# Block sizes
# --------------------------------------------------------------------------------------------


#: Block shapes tried for a 2-D kernel, in order, at most :data:`MAX_SHAPES_2D` of them besides the original:
#: rows of 64 and 128 threads first (fewer, longer row segments per block), then fewer and more threads.
_SHAPES_2D = ((64, 4), (128, 2), (32, 8), (32, 4), (64, 8), (32, 16))
MAX_SHAPES_2D = 3


def two_dimensional_launch(ctx: RuleContext) -> bool:
    """The spec's launch is 2-D (x and y) with a constant block of more than one row."""
    block = ctx.constant_block()
    return block is not None and block[1] > 1 and block[2] == 1 and all(
        launch.grid[2] == 1 for launch in ctx.launches())


class BlockSizeSweep(Rule):
    name = "block-size"
    technique = "block-size-tuning"
    summary = ("other block sizes (1-D) or shapes (2-D), the grid recomputed per axis to cover the same threads; the "
               "host's launch edited alike")

    def _axes(self, ctx: RuleContext) -> tuple[tuple[str, ...] | None, str]:
        why = one_dimensional_launch(ctx)
        if why is None:
            return ("x",), ""
        if ctx.spec is not None and two_dimensional_launch(ctx):
            return ("x", "y"), ""
        return None, (why if ctx.spec is None else
                      "the spec's launch is neither 1-D nor 2-D (x and y) with the same block at every size")

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        axes, why = self._axes(ctx)
        if axes is None:
            return False, why
        facts = ctx.facts
        if facts is None or not facts.complete:
            return False, "the kernel's analysis is missing or incomplete"
        why = threads_differ_only_by(facts, axes)
        if why:
            return False, why
        if len(axes) == 2 and not {"tid.y", "bid.y"} & set(facts.thread_dims):
            return False, "the kernel does not read its y index: the block's rows of threads repeat one another's work"
        notes = []
        for axis in axes:
            bound = index_bound(facts, axis)
            notes.append(f"guard on the global {axis} index `< {bound}`" if bound is not None else
                         f"no guard on the global {axis} index (only blocks that divide the original along {axis}, the "
                         "same threads at every size)")
        return True, f"the threads differ by their global index only; {'; '.join(notes)}"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        assert ctx.spec is not None
        axes, _ = self._axes(ctx)
        block = ctx.constant_block()
        assert axes is not None and block is not None
        grid = ctx.spec.launch.grid
        bounds = [index_bound(ctx.facts, axis) if ctx.facts is not None else None for axis in axes]
        shapes = [(size,) for size in _BLOCK_SIZES] if len(axes) == 1 else [
            shape for shape in _SHAPES_2D if shape != block[:2]][:MAX_SHAPES_2D]
        out = []
        for shape in shapes:
            # Without a guard every thread works: a block that does not divide the original one along an axis
            # rounds the grid up past the original's threads at sizes the spec does not name.
            if shape == block[:len(shape)] or any(bound is None and block[k] % size
                                                  for k, (size, bound) in enumerate(zip(shape, bounds))):
                continue
            new_grid = [f"(({grid[k]})*{block[k]}+{size - 1})/{size}" for k, size in enumerate(shape)]
            new_block = [*shape, *([1] * (3 - len(shape)))]
            override = {"grid": [*new_grid, *(["1"] if len(shape) == 2 else ["1", "1"])], "block": new_block,
                        "dynamic_smem": ctx.spec.launch.dynamic_smem}
            if not ctx.launch_ok(override) or not all(same_work(ctx, override, bound, k) for k, bound in enumerate(bounds)):
                continue
            threads = shape[0] * (shape[1] if len(shape) == 2 else 1)
            source = launch_bounds_for(ctx.source, ctx.kernel, threads)
            if source is None:
                continue
            before, after = " x ".join(map(str, block[:len(shape)])), " x ".join(map(str, shape))
            out.append(Rewrite(source, f"block {before} -> {after}, grid recomputed to cover the same threads"
                               + (f"; __launch_bounds__({threads})" if source != ctx.source else ""), override,
                               f"block={after.replace(' x ', 'x')}", block=tuple(new_block)))  # type: ignore[arg-type]
        return tuple(out)


# --------------------------------------------------------------------------------------------
# float4 vectors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Vector:
    store: Access
    reads: tuple[Access, ...]
    value: Node
    bound: Poly
    bound_text: str
    per_thread: int


class VectorizeElementwise(Rule):
    name = "vectorize-float4"
    technique = "vectorized-loads"
    summary = "elementwise float kernels as a float4 grid-stride loop plus a scalar tail"

    def plan(self, ctx: RuleContext) -> tuple[_Vector | None, str]:
        why = one_dimensional_launch(ctx)
        if why:
            return None, why
        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        why = threads_differ_only_by(facts, ("x",))
        if why:
            return None, why
        stores = [a for a in facts.accesses if a.writes]
        if len(stores) != 1 or stores[0].kind != "write" or stores[0].space != "global":
            return None, "the kernel does not make exactly one plain global store"
        store = stores[0]
        reads = tuple(a for a in facts.accesses if a is not store)
        if any(a.space != "global" or a.kind != "read" for a in reads):
            return None, "the kernel accesses local, shared or constant memory beside its store"
        if store.via or any(a.via for a in reads) or store.field or any(a.field for a in reads):
            return None, "an access is a struct member or inside a helper function"
        for a in (store, *reads):
            if a.elem_type != "float":
                return None, f"`{a.array}` is not an array of float"
            if a.index != store.index:
                return None, f"`{a.text}` is not at the index of the store"
        found = self._elements(ctx, facts, store)
        if isinstance(found, str):
            return None, found
        bound, per_thread = found
        if not ctx.distinct_arrays():
            return None, "the spec does not prove the arrays are separate allocations (16-byte alignment, no overlap)"
        src, root = parse(ctx.preprocessed)
        node = node_at(src, root, store.span)
        assign = node.parent if node is not None else None
        if assign is None or assign.type != "assignment_expression" or assign.child_by_field_name("left") != node:
            return None, "the store is not an assignment of a value"
        value = assign.child_by_field_name("right")
        why = self._value_refusal(ctx, facts, src, value, reads)
        if why:
            return None, why
        scalars = {n for n, _, p in facts.params if not p}
        bound_text = " ".join(str(bound).split()) if bound.symbols <= scalars else None
        if bound_text is None or not all(ctx.spec_scalar(s) for s in bound.symbols):
            return None, f"the bound `{bound}` is not made of the spec's integer scalars"
        why = covers(ctx, bound, per_thread) if per_thread else None
        if why:
            return None, why
        return _Vector(store, reads, value, bound, bound_text, per_thread), ""

    @staticmethod
    def _elements(ctx: RuleContext, facts: KernelFacts, store: Access) -> tuple[Poly, int] | str:
        """(the bound of the elements, elements per thread of the original launch, 0 for a grid-stride
        loop) when the store's index runs over every element once across the launch."""
        gx, width = global_index("x"), grid_threads("x")
        index = store.index
        loops: list[LoopFact] = [facts.loops[k] for k in store.loops]
        if not loops:
            bound = index_bound(facts, "x")
            if index != gx or bound is None:
                return "the store is not at the global index under a guard `i < N`"
            return bound, 1
        if len(loops) != 1 or len(facts.loops) != 1:
            return "the store sits in more than one loop, or the kernel has other loops"
        loop = loops[0]
        it = Poly.sym(loop.trip_symbol)
        if loop.start == gx and loop.step == width and loop.bound is not None and index == gx + width * it:
            return loop.bound, 0
        if loop.start == Poly() and loop.step == Poly.const(1) and loop.bound is not None \
                and loop.bound.constant is not None and loop.bound.constant > 0 and index == gx.scale(loop.bound.constant) + it:
            bounds = [b for c in facts.constraints(store) if (b := c.upper_bound(index)) is not None]
            if bounds and all(bounds[0] in [b for c in facts.constraints(a) if (b := c.upper_bound(index)) is not None]
                              for a in facts.accesses):
                return bounds[0], loop.bound.constant
        return "the store's index is not the global index, a grid-stride loop's or a chunk's element"

    @staticmethod
    def _value_refusal(ctx: RuleContext, facts: KernelFacts, src: bytes, value: Node | None, reads) -> str | None:
        if value is None:
            return "the store has no value"
        spans = [(a.span[0], a.span[1]) for a in reads]
        scalars = {n for n, _, p in facts.params if not p}
        stack = [value]
        while stack:
            n = stack.pop()
            if any(lo <= n.start_byte and n.end_byte <= hi for lo, hi in spans):
                continue
            if n.type in ("assignment_expression", "update_expression"):
                return "the stored value has a side effect"
            if n.type == "call_expression":
                fn = n.child_by_field_name("function")
                if fn is None or not is_pure_math(_text(src, fn)):
                    return f"the stored value calls `{_text(src, fn) if fn is not None else '?'}`, not a math function"
                stack.extend(c for c in n.named_children if c is not fn)
                continue
            if n.type == "identifier" and _text(src, n) not in scalars:
                return f"the stored value depends on `{_text(src, n)}`, neither a scalar parameter nor an element at the store's index"
            stack.extend(n.named_children)
        return None

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        return True, (f"elementwise store to {plan.store.array}[i] over i < {plan.bound_text}, float arrays, separate "
                      "allocations")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        assert plan is not None and ctx.spec is not None
        facts = ctx.facts
        out_name, n = plan.store.array, plan.bound_text
        names = sorted({a.array for a in plan.reads})

        def build(text) -> str:
            lines = ["    long long kl_n4 = (long long)" + n + " / 4;"]
            for r in names:
                const = "" if r == out_name else "const "
                lines.append(f"    {const}float4* kl_{r}4 = reinterpret_cast<{const}float4*>({r});")
            if out_name not in names:
                lines.append(f"    float4* kl_{out_name}4 = reinterpret_cast<float4*>({out_name});")
            lines.append("    long long kl_stride = (long long)blockDim.x * gridDim.x;")
            lines.append("    for (long long kl_v = (long long)blockIdx.x * blockDim.x + threadIdx.x; kl_v < kl_n4; kl_v += kl_stride) {")
            for r in names:
                lines.append(f"        float4 kl_{r} = kl_{r}4[kl_v];")
            lines.append("        float4 kl_r;")
            for c in "xyzw":
                lane = text(plan.value.start_byte, plan.value.end_byte,
                            [(a.span[0], a.span[1], f"kl_{a.array}.{c}") for a in plan.reads])
                lines.append(f"        kl_r.{c} = {lane};")
            lines.append(f"        kl_{out_name}4[kl_v] = kl_r;")
            lines.append("    }")
            lines.append("    // Tail: the last n % 4 elements, one per thread.")
            lines.append(f"    for (long long kl_i = kl_n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; kl_i < {n}; "
                         "kl_i += kl_stride) {")
            tail = text(plan.value.start_byte, plan.value.end_byte,
                        [(a.span[0], a.span[1], f"{a.array}[kl_i]") for a in plan.reads])
            lines.append(f"        {out_name}[kl_i] = {tail};")
            lines.append("    }")
            return "\n" + "\n".join(lines) + "\n"

        source, expanded = rebuild(ctx.preprocessed, facts, ctx.source, ctx.kernel, build)
        bx = ctx.constant_block()[0]  # type: ignore[index]
        cap = DEFAULT_SM_COUNT * (THREADS_PER_SM // bx) * 4
        override = {"grid": [f"max(1, min(({n}+{4 * bx - 1})/{4 * bx}, {cap}))", "1", "1"], "block": [bx, 1, 1],
                    "dynamic_smem": ctx.spec.launch.dynamic_smem}
        if not ctx.launch_ok(override):
            return ()
        what = ", ".join(sorted(set(names) | {out_name}))
        return (Rewrite(source, f"float4 loads/stores of {what} in a grid-stride loop, scalar tail", override),)
