"""Neighbour reuse along the slow axis: each thread computes C consecutive rows of a stencil.

A 2-D stencil whose threads each read a few rows around their own (``A[(i-1)*N + j]``,
``A[i*N + j]``, ``A[(i+1)*N + j]``) loads every input row three times, once for each thread
row that needs it: the copies come from L1 at best. The rewrite gives each thread C
consecutive rows (the block keeps its width and has C times fewer rows): the C virtual threads
run one after the other, their loads first and their stores deferred to the end, so the loads
of neighbouring rows are the same addresses with no store in between and the compiler keeps
them in registers (a C-row window: C + 2 row loads instead of 3·C for a radius-1 stencil).

The original threads are kept as *virtual* threads: thread ``(x, y)`` of the new block runs
``(x, C*y + s)`` of the old one for ``s = 0 … C-1`` (``threadIdx.y`` becomes that row,
``blockDim.y`` the old block's height), so whatever the kernel does with its indices, each
virtual thread does the original thread's work. When the rows are whole blocks instead (a block
of one row, ``k = blockIdx.y``), the grid shrinks along that axis the same way (``blockIdx.y``
becomes ``C*blockIdx.y + s``, ``gridDim.y`` the old grid's), provided the grid's extent there is
a multiple of C at every size of the spec.

Boundary handling stays exact: a thread first evaluates, for each of its rows, what the
original evaluated before storing (the statements before the guard, an early ``return``, the
guard itself). Only when every row passes does it take the fast path (guard dropped, stores
deferred); otherwise it runs the original body once per row, unchanged (ragged tiles, borders).

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a launch spec whose block is the same at every size, its height a multiple of C, or whose grid
  extent along the axis is a multiple of C at every size or an expression of the kernel's integer
  parameters (the grid is then rounded up and the kernel skips the rows past it); every pointer parameter its
  own array (the virtual threads' reads move before the other virtual threads' stores, which the
  original's unordered threads allowed only if no thread reads what another writes);
- no barrier, shared memory, warp intrinsic or atomic, no helper that reads the thread
  index (the original's warps and blocks do not exist any more);
- every loop is a tap loop: a ``for`` whose start, bound and step are compile-time constants
  (at most :data:`MAX_TAP_TRIPS` iterations), that does not leave an iteration early nor assign its
  counter; unrolled (``#pragma unroll``), its reads of neighbouring rows are the same addresses in
  neighbouring virtual rows, which the compiler keeps in registers as for straight-line taps;
- the body is straight-line statements and tap loops, then at most one guard ``if (…) { … }``
  without ``else`` holding such statements; an early exit only as ``if (…) return;`` before it;
  no assignment in a condition. One branch may sit among the guarded statements (or take the
  guard's place): an ``if``/``else if``/``else`` chain whose arms are such statements and whose
  conditions are integer arithmetic on what the prelude computed (``if (i == 0) … else …``, the
  border handled apart). Its arm that reads the most global memory (the interior) is the fast
  path's: a thread takes the fast path only when all its rows take that arm, so a row taking
  another arm (a border) runs the original body with the others;
- every global store is a statement ``P[index] = value;`` on a pointer parameter, outside the tap
  loops, at an index that moves with the axis, and the stored array is read only at that same index;
- two reads of one array are a whole number of rows apart along the axis, or one read moves a
  whole number of rows per iteration of its tap loop (the reason to rewrite at all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import (
    Access, KernelFacts, LoopFact, assigned_names, declared_anywhere, helper_reading_thread_index, identifiers_in,
    threads_cooperate,
)
from kernel_lsp.core.analysis import has_node as _has, is_integer_type
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.poly import Poly, is_opaque
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError, with_candidate_launch
from kernel_lsp.core.transforms.emit import (
    BodyEdit, UserText, builtin_fields, emit, expands_to, node_at, parse, splice_body, user_line_of,
)

#: Rows per thread tried, largest first (each a separate candidate where the launch allows it).
ROWS_PER_THREAD = (8, 6, 4, 3, 2)


@dataclass(frozen=True)
class Axis:
    """A launch axis whose neighbouring rows one thread can take over."""

    symbol: str
    """The analysis' symbol (``tid.y``)."""
    index: tuple[str, str]
    """The builtin replaced by the virtual row (``threadIdx``, ``y``)."""
    extent: tuple[str, str]
    """The builtin whose value the virtual launch multiplies (``blockDim``, ``y``)."""
    launch: str
    """``block`` or ``grid``: which launch shape shrinks."""
    dim: int

    @property
    def label(self) -> str:
        return f"{self.index[0]}.{self.index[1]}"


#: Axes tried, the block's rows first (the window stays inside a block), then whole blocks along y, x.
AXES = (Axis("tid.y", ("threadIdx", "y"), ("blockDim", "y"), "block", 1),
        Axis("bid.y", ("blockIdx", "y"), ("gridDim", "y"), "grid", 1),
        Axis("bid.x", ("blockIdx", "x"), ("gridDim", "x"), "grid", 0))
#: Fewest threads the new launch keeps at the spec's main size: below about 512 threads per SM of a
#: large GPU the rows a thread runs one after the other cost more than the loads they save.
MIN_THREADS = 1 << 16
#: Candidates per kernel from this rule.
MAX_VARIANTS = 2
#: Most iterations of a tap loop (and of a nest of them) unrolled into each virtual row.
MAX_TAP_TRIPS = 64
_STRAIGHT = ("declaration", "expression_statement", "for_statement")
_JUMPS = ("break_statement", "continue_statement", "return_statement", "goto_statement")
_SIDE_EFFECTS = ("assignment_expression", "update_expression")


class _Unmapped(Exception):
    """A statement the rewrite copies has no counterpart in the user's text (inside a macro)."""


@dataclass(frozen=True)
class _Store:
    node: Node
    """The expression statement ``P[index] = value;``."""
    left: Node
    right: Node
    elem_type: str


@dataclass(frozen=True)
class _Plan:
    prelude: tuple[Node, ...]
    """Statements before the guard (``if (…) return;`` among them)."""
    guard: Node | None
    """The final ``if`` holding the stores, or None when they are top-level statements."""
    block: tuple[Node, ...]
    """The statements the fast path runs: those the guard holds (or the top-level statements after the
    prelude), with a branch among them replaced by its interior arm's statements."""
    original: tuple[Node, ...]
    """The statements after the prelude as written: what the general path runs when there is no guard."""
    arm: tuple[tuple[Node, bool], ...]
    """The conditions (each with the value it must have) under which the branch takes the interior
    arm; empty without a branch."""
    stores: tuple[_Store, ...]
    reuse: str
    """Which array's reads are rows apart (for the description)."""
    kernel: Node
    axis: Axis
    rows: tuple[int, ...]
    """Rows per thread that the launch allows at every size, largest first."""
    extent: str | None
    """The original launch's extent along the axis as the kernel computes it from its parameters
    (the spec's expression), or None when it is one constant that every choice of rows divides."""


def _pragma(node: Node) -> bool:
    return node.type.startswith("preproc") and node.text is not None and node.text.lstrip().startswith(b"#pragma")


def _statements(node: Node) -> list[Node]:
    if node.type == "compound_statement":
        return [c for c in node.named_children if c.type != "comment"]
    return [node]


def _early_return(node: Node) -> Node | None:
    """The condition of ``if (c) return;`` / ``if (c) { return; }``; None for anything else."""
    if node.type != "if_statement" or node.child_by_field_name("alternative") is not None:
        return None
    body = _statements(node.child_by_field_name("consequence"))
    if len(body) != 1 or body[0].type != "return_statement" or body[0].named_child_count:
        return None
    return node.child_by_field_name("condition")


def _plain_condition(cond: Node | None) -> bool:
    return cond is not None and cond.named_child_count == 1 and cond.named_children[0].type not in (
        "declaration", "init_statement") and not _has(cond, _SIDE_EFFECTS)


def canonical(poly: Poly, facts: KernelFacts) -> Poly:
    """``poly`` with each opaque term replaced by the first one standing for the same expression
    (``NJ`` written twice is one value, though the analysis names each occurrence)."""
    first: dict[tuple, str] = {}
    rename: dict[str, str] = {}
    for name in sorted(facts.opaque, key=lambda s: (len(s), s)):
        entry = facts.opaque[name]
        rename[name] = first.setdefault((entry.text, entry.recipe), name)
    acc: dict[tuple[str, ...], int] = {}
    for mono, coeff in poly.terms:
        m = tuple(sorted(rename.get(s, s) if is_opaque(s) else s for s in mono))
        acc[m] = acc.get(m, 0) + coeff
    return Poly(tuple(sorted((m, c) for m, c in acc.items() if c)))


def _tap_loop_refusal(loop: LoopFact, node: Node | None, src: bytes, facts: KernelFacts) -> str | None:
    """Why ``loop`` is not a tap loop of compile-time constant trips (None: it is)."""
    line = (loop.user_line or 0) + 1
    if loop.kind != "for" or node is None or loop.var is None:
        return f"the loop at line {line} has no counter the analysis follows"
    if any(p is None or p.constant is None for p in (loop.start, loop.step, loop.bound)):
        return (f"the loop at line {line} does not run a compile-time constant number of iterations (only tap loops "
                "are unrolled across the rows)")
    if loop.step.constant <= 0 or loop.geometric is not None:
        return f"the loop at line {line} does not count up by a constant step"
    trips = -(-(loop.bound.constant - loop.start.constant) // loop.step.constant)
    outer = facts.loops[loop.parent] if loop.parent is not None else None
    while outer is not None and outer.start is not None and outer.bound is not None and outer.step is not None \
            and None not in (outer.start.constant, outer.bound.constant, outer.step.constant) and outer.step.constant > 0:
        trips *= max(1, -(-(outer.bound.constant - outer.start.constant) // outer.step.constant))
        outer = facts.loops[outer.parent] if outer.parent is not None else None
    if trips > MAX_TAP_TRIPS:
        return f"the loop nest at line {line} runs more than {MAX_TAP_TRIPS} iterations to unroll into each row"
    body = node.child_by_field_name("body")
    if body is None or _has(body, _JUMPS):
        return f"the loop at line {line} can leave an iteration early"
    if loop.var in assigned_names(body, src):
        return f"the loop at line {line} assigns its counter in its body"
    if loop.calls_unknown:
        return f"the loop at line {line} calls code the analysis does not see"
    return None


def moves_rows(a: Access, facts: KernelFacts, limit: int, symbol: str) -> bool:
    """A read in a tap loop moves a whole nonzero number of rows of ``symbol`` per iteration of one of its
    loops (``in[(row + dy) * w + col]``): its iterations read neighbouring rows."""
    index = canonical(a.index, facts)
    row = index.coefficient(symbol)
    if row is None or row == Poly():
        return False
    for lid in a.loops:
        loop = facts.loops[lid]
        step = index.coefficient(loop.trip_symbol)
        if step is not None and any(step == row.scale(d) or step == row.scale(-d) for d in range(1, limit)):
            return True
    return False


def rows_apart(a: Access, b: Access, facts: KernelFacts, limit: int, symbol: str = "tid.y") -> int | None:
    """How many rows of ``symbol`` apart two accesses are (a nonzero whole number below ``limit``),
    or None."""
    ia, ib = canonical(a.index, facts), canonical(b.index, facts)
    row = ia.coefficient(symbol)
    if row is None or row == Poly() or ib.coefficient(symbol) != row:
        return None
    diff = ia - ib
    for d in range(1, limit):
        if diff == row.scale(d) or diff == row.scale(-d):
            return d
    return None


class StencilRowReuse(Rule):
    name = "stencil-row-reuse"
    technique = "thread-coarsening"
    summary = "each thread computes consecutive rows of a stencil, neighbour rows kept in registers"

    def plan(self, ctx: RuleContext) -> tuple[_Plan | None, str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        if ctx.spec is None:
            return None, "needs a launch spec (the launch changes: a block with fewer rows)"
        if not {a.symbol for a in AXES} & set(facts.thread_dims):
            return None, "the kernel uses neither threadIdx.y, blockIdx.y nor blockIdx.x (no rows to give a thread)"
        if not ctx.distinct_arrays():
            return None, "the spec does not allocate every pointer parameter on its own (reads would pass other threads' stores)"
        if threads_cooperate(facts):
            return None, "barriers, shared memory, warp intrinsics or atomics: the original's blocks and warps would not exist"
        if facts.unknowns or facts.escaped:
            return None, "the analysis could not model everything the kernel does"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        if kernel is None:
            return None, "the kernel's definition was not found in the preprocessed view"
        if (helper := helper_reading_thread_index(facts, root, src)) is not None:
            return None, f"the helper `{helper}` reads the thread or block index"
        body = kernel.child_by_field_name("body")
        if body is None:
            return None, "the kernel has no body"
        for loop in facts.loops:
            why = _tap_loop_refusal(loop, node_at(src, root, loop.span), src, facts)
            if why:
                return None, why
        shape, why = self._shape(body)
        if shape is None:
            return None, why
        prelude, guard, block, original, branch = shape
        globals_ = [a for a in facts.accesses if a.space == "global"]
        arm: tuple[tuple[Node, bool], ...] = ()
        others: tuple[Node, ...] = ()
        if branch is not None:
            chosen, why = _interior_arm(branch, globals_, src, prelude, block)
            if chosen is None:
                return None, why
            arm, statements, others = chosen
            at = block.index(branch)
            block = [*block[:at], *statements, *block[at + 1:]]
        stores, why = self._stores(src, block, globals_, facts)
        if stores is None:
            return None, why
        writes = [a for a in globals_ if a.writes]
        if not writes:
            return None, "the kernel stores nothing to global memory"
        # The accesses the fast path runs: a branch's other arms run on the general path only.
        fast = [a for a in globals_ if not any(_within(a, s) for s in others)]
        for w in writes:
            if w in fast and not any(s.left.start_byte <= w.span[0] and w.span[1] <= s.left.end_byte for s in stores):
                return None, f"`{w.text}` is stored by a compound assignment or inside a larger expression of the guarded block"
            for r in globals_:
                if r.array == w.array and not r.writes and canonical(r.index, facts) != canonical(w.index, facts):
                    return None, f"`{w.array}` is read at another index than it is stored"
        reads = [a for a in fast if a.kind == "read" and a.array not in {w.array for w in writes}]
        limit = max(ROWS_PER_THREAD) + 1
        reasons = []
        best: tuple[Axis, tuple[int, ...], str, str | None] | None = None
        for axis in AXES:
            if axis.symbol not in facts.thread_dims:
                continue
            still = [w.text for w in writes if canonical(w.index, facts).coefficient(axis.symbol) in (None, Poly())]
            if still:
                reasons.append(f"`{still[0]}` is stored at an index that does not move with {axis.label}")
                continue
            reuse = next((a.array for a in reads for b in reads
                          if a.array == b.array and rows_apart(a, b, facts, limit, axis.symbol)), None) or next(
                (a.array for a in reads if moves_rows(a, facts, limit, axis.symbol)), None)
            if reuse is None:
                reasons.append(f"no array is read at neighbouring rows along {axis.label} (nothing to reuse)")
                continue
            extent, why = _extent(ctx, axis, facts, body, src)
            if why:
                reasons.append(why)
                continue
            if axis.launch == "block" and len({launch.block for launch in ctx.launches()}) > 1:
                reasons.append("the block is not the same at every size of the spec (the host's launch could not be "
                               "given one smaller block)")
                continue
            rows = self._rows(ctx, axis, exact=extent is None)
            if not rows:
                reasons.append(f"the {axis.launch}'s {'xyz'[axis.dim]} extent is not a multiple of 2 or 3, "
                               f"or the launch would keep fewer than {MIN_THREADS} threads")
                continue
            if best is None or rows[0] > best[1][0]:
                best = (axis, rows, reuse, extent)
        if best is None:
            return None, "; ".join(reasons)
        axis, rows, reuse, extent = best
        return _Plan(tuple(prelude), guard, tuple(block), tuple(original), arm, tuple(stores), reuse, kernel, axis, rows,
                     extent), ""

    def _shape(self, body: Node) -> tuple[tuple[list[Node], Node | None, list[Node], list[Node], Node | None] | None, str]:
        """(prelude, guard, the statements after the prelude or in the guard, the statements after the prelude
        as written, the branch among them), or why the body has another shape."""
        stmts = _statements(body)
        prelude: list[Node] = []
        rest = list(stmts)
        while rest and (rest[0].type in _STRAIGHT or _pragma(rest[0]) or _early_return(rest[0]) is not None):
            if rest[0].type == "if_statement" and not _plain_condition(_early_return(rest[0])):
                return None, "an early return's condition has side effects"
            prelude.append(rest.pop(0))
        if not rest:
            # No guard: the stores are among the straight-line statements (after the last early return).
            last_exit = max((i for i, s in enumerate(prelude) if s.type == "if_statement"), default=-1)
            after = prelude[last_exit + 1 :]
            return (prelude[: last_exit + 1], None, after, after, None), ""
        if len(rest) == 1 and rest[0].type == "if_statement" and rest[0].child_by_field_name("alternative") is None:
            guard = rest[0]
            if not _plain_condition(guard.child_by_field_name("condition")):
                return None, "the guard's condition has side effects or declares a variable"
            block = _statements(guard.child_by_field_name("consequence"))
        else:
            # The statements after the prelude are the block, with no guard around them (a branch among them).
            guard, block = None, rest
        branches = [s for s in block if s.type not in _STRAIGHT and not _pragma(s)]
        if len(branches) > 1 or branches and branches[0].type != "if_statement":
            return None, ("the guarded block has branches other than one if/else" if guard is not None else
                          "the body has branches other than one guard (without else) around the stores")
        return (prelude, guard, block, rest, branches[0] if branches else None), ""

    def _stores(self, src: bytes, block: list[Node], globals_: list[Access],
                facts: KernelFacts) -> tuple[list[_Store] | None, str]:
        params = {name: (ty, ptr) for name, ty, ptr in facts.params}
        stores = []
        for stmt in block:
            writes = [a for a in globals_ if a.writes and stmt.start_byte <= a.span[0] < stmt.end_byte]
            if not writes:
                continue
            if stmt.type == "for_statement":
                return None, f"`{writes[0].text}` is stored inside a tap loop (a row's stores are deferred one by one)"
            e = stmt.named_children[0] if stmt.type == "expression_statement" and stmt.named_children else None
            if e is None or e.type != "assignment_expression" or _text(src, e.child_by_field_name("operator")) != "=":
                return None, f"`{writes[0].text}` is stored by a compound assignment or inside a larger expression"
            left, right = e.child_by_field_name("left"), e.child_by_field_name("right")
            w = writes[0]
            if len(writes) != 1 or (w.span[0], w.span[1]) != (left.start_byte, left.end_byte):
                return None, f"the statement storing `{w.text}` stores more than one element"
            if w.field is not None or w.array not in params or not params[w.array][1]:
                return None, f"`{w.text}` is not an element of a pointer parameter"
            if _has(left, _SIDE_EFFECTS + ("call_expression",)) or _has(right, _SIDE_EFFECTS):
                return None, f"the statement storing `{w.text}` has side effects besides the store"
            stores.append(_Store(stmt, left, right, params[w.array][0]))
        return stores, ""

    def _rows(self, ctx: RuleContext, axis: Axis, exact: bool) -> tuple[int, ...]:
        """Rows per thread to try; ``exact``: the extent is one constant, which they must divide (a
        thread cannot be told that its last rows do not exist otherwise)."""
        launches = ctx.launches()
        if not launches:
            return ()
        shapes = [getattr(launch, axis.launch) for launch in launches]
        main = launches[0]
        threads = _product(main.grid) * _product(main.block)
        return tuple(c for c in ROWS_PER_THREAD if (not exact or all(s[axis.dim] % c == 0 for s in shapes))
                     and threads // c >= MIN_THREADS)[:MAX_VARIANTS]

    def _launch(self, ctx: RuleContext, axis: Axis, rows: int) -> dict:
        launch = ctx.spec.launch  # type: ignore[union-attr]
        shape = {"grid": list(launch.grid), "block": list(launch.block)}
        extent = str(shape[axis.launch][axis.dim]).strip()
        # An extent that varies with the sizes is rounded up: the kernel skips the rows past it.
        shape[axis.launch][axis.dim] = int(extent) // rows if extent.isdigit() else f"(({extent}) + {rows - 1}) / {rows}"
        return shape

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        try:
            for c in plan.rows:
                with_candidate_launch(ctx.spec, self._launch(ctx, plan.axis, c))  # type: ignore[arg-type]
        except (SpecError, ValueError, ZeroDivisionError) as exc:
            return False, f"the new launch does not evaluate: {exc}"
        body = "straight-line body and tap loops of constant trips" if ctx.facts.loops else "straight-line body"
        arm = ""
        if plan.arm:
            line = user_line_of(ctx.preprocessed, plan.arm[0][0].start_point[0])
            arm = (f"; the fast path runs the arm of the branch at line {line} that reads the most, rows taking "
                   "another arm run the original body")
        return True, (f"`{plan.reuse}` is read at neighbouring rows along {plan.axis.label}; {body}, "
                      f"{len(plan.stores)} plain store(s) at the thread's own row, no barriers or shared memory; "
                      f"{' or '.join(map(str, plan.rows))} rows per thread{arm}")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        facts = ctx.facts
        assert plan is not None and facts is not None
        src = ctx.preprocessed.text.encode("utf-8")
        out = []
        axis = plan.axis
        for rows in plan.rows:
            body = self._body(src, plan, rows, facts)
            try:
                own = self._body(src, plan, rows, facts, UserText(ctx.preprocessed, facts, ctx.source, ctx.kernel))
            except _Unmapped:
                own = None
            if own is not None and expands_to(own, body, ctx.preprocessed):
                # The statements copied from the user's text, macros as written.
                source, expanded = splice_body(ctx.source, ctx.kernel, "{" + own + "}"), False
            else:
                edit = BodyEdit(ctx.preprocessed, facts)
                lo, hi = facts.body_span
                edit.replace(lo + 1, hi - 1, body)
                source, expanded = emit(edit, ctx.source, ctx.kernel)
            note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
            out.append(Rewrite(
                source,
                f"{rows} rows of {axis.label} per thread: `{plan.reuse}`'s neighbour rows reused from registers, "
                f"stores deferred; a {axis.launch} {rows} times smaller along {'xyz'[axis.dim]}, borders on the "
                f"original path{note}",
                self._launch(ctx, axis, rows), variant=f"rows={rows}", **self._host(ctx, axis, rows)))
        return tuple(out)

    @staticmethod
    def _host(ctx: RuleContext, axis: Axis, rows: int) -> dict:
        """How "Apply" edits the host's launches: the grid divided along the axis (rounded up, as the
        spec's), or the block given ``rows`` times fewer rows with the grid kept."""
        divide = [1, 1, 1]
        if axis.launch == "grid":
            divide[axis.dim] = rows
            return {"grid_divide": tuple(divide)}
        block = list(ctx.launches()[0].block)
        block[axis.dim] //= rows
        return {"grid_divide": tuple(divide), "block": tuple(block)}

    def _body(self, src: bytes, plan: _Plan, rows: int, facts: KernelFacts, user: UserText | None = None) -> str:
        """The new body, its statements copied from the preprocessed text, or from the user's own
        text when ``user`` is given (:class:`_Unmapped` when a statement does not map there)."""
        lo, hi = facts.body_span
        axis = plan.axis
        extent = f"(unsigned)({plan.extent})" if plan.extent is not None else f"{axis.extent[0]}.{axis.extent[1]} * {rows}u"
        replaced = {axis.index: "kl_vrow", axis.extent: f"({extent})"}
        builtins = list(builtin_fields(src, plan.kernel, lo, hi, replaced))

        def render(node: Node, extra: list[tuple[int, int, str]] = ()) -> str:
            if _pragma(node):
                # A directive keeps a line of its own (the statements are joined by newlines).
                return src[node.start_byte:node.end_byte].decode("utf-8").strip()
            subs = [(n.start_byte, n.end_byte, v) for n, v in builtins
                    if node.start_byte <= n.start_byte and n.end_byte <= node.end_byte]
            subs += [e for e in extra if node.start_byte <= e[0] and e[1] <= node.end_byte]
            if user is not None:
                own = user.span(node.start_byte, node.end_byte, subs)
                if own is None:
                    raise _Unmapped(node.start_byte)
                return own
            text, at = [], node.start_byte
            for s, e, v in sorted(subs):
                if s < at:
                    continue
                text.append(src[at:s].decode("utf-8"))
                text.append(v)
                at = e
            text.append(src[at:node.end_byte].decode("utf-8"))
            return "".join(text)

        ind = "\n        "
        head = f"for (unsigned kl_s = 0; kl_s < {rows}u; ++kl_s) {{{ind}const unsigned kl_vrow = {axis.label} * {rows}u + kl_s;"
        # 1. The interior test: each row's prefix as the original ran it, then its guard.
        # A rounded-up launch's rows past the original extent did not exist: they take neither path.
        missing = [] if plan.extent is None else [f"if (kl_vrow >= ({extent})) {{ kl_all = false; continue; }}"]
        check = list(missing)
        for s in plan.prelude:
            cond = _early_return(s)
            if cond is not None:
                check.append(f"if {render(cond)} {{ kl_all = false; continue; }}")
            else:
                check.append(render(s))
        # A row past the guard, or taking another arm of the branch than the interior's, is not a fast row
        # (the arm's conditions are read only where the guard holds, as in the original).
        tests = [render(plan.guard.child_by_field_name("condition"))] if plan.guard is not None else []
        tests += [render(cond) if holds else f"!{render(cond)}" for cond, holds in plan.arm]
        if tests:
            check.append(f"kl_all = kl_all && {' && '.join(tests)};")
        # 2. The fast path: every row passes, so no exit and no guard; stores deferred.
        def unrolled(stmts) -> list[str]:
            """The statements rendered, a tap loop not under a directive of the user's given ``#pragma unroll``
            (its neighbour rows are then the same addresses as the next virtual row's)."""
            out, previous = [], None
            for s in stmts:
                if s.type == "for_statement" and not (previous is not None and _pragma(previous)):
                    out.append("#pragma unroll")
                out.append(render(s))
                previous = s
            return out

        fast = unrolled([s for s in plan.prelude if _early_return(s) is None])
        decls = []
        for k, st in enumerate(plan.stores):
            decls.append(f"{st.elem_type} kl_v{k}[{rows}]; {st.elem_type} *kl_p{k}[{rows}];")
        for s in plan.block:
            store = next((k for k, st in enumerate(plan.stores) if st.node == s), None)
            if store is None:
                fast.extend(unrolled([s]) if s.type == "for_statement" and not _pragma_in(plan.block, s) else [render(s)])
                continue
            st = plan.stores[store]
            fast.append(f"kl_p{store}[kl_s] = &({render(st.left)}); kl_v{store}[kl_s] = {render(st.right)};")
        flush = " ".join(f"*kl_p{k}[kl_s] = kl_v{k}[kl_s];" for k in range(len(plan.stores)))
        # 3. The general path: the original body once per row, an early return ending that row only.
        general = [] if plan.extent is None else [f"if (kl_vrow >= ({extent})) continue;"]
        for s in [*plan.prelude, *([plan.guard] if plan.guard is not None else plan.original)]:
            cond = _early_return(s)
            general.append(f"if {render(cond)} continue;" if cond is not None else render(s))
        j = ind + "    "
        return (f"\n    // Each thread runs rows {axis.label}*{rows} … +{rows - 1} of the original launch: neighbour rows stay in registers.\n"
                f"    bool kl_all = true;\n    #pragma unroll\n    {head}{ind}" + ind.join(check) + "\n    }\n"
                "    if (kl_all) {\n        " + " ".join(decls) +
                f"\n        #pragma unroll\n        {head.replace(ind, j)}{j}" + j.join(fast) + "\n        }\n"
                f"        #pragma unroll\n        for (unsigned kl_s = 0; kl_s < {rows}u; ++kl_s) {{ {flush} }}\n"
                f"    }} else {{\n        #pragma unroll\n        {head.replace(ind, j)}{j}" + j.join(general) +
                "\n        }\n    }\n")


def _within(a: Access, stmt: Node) -> bool:
    return stmt.start_byte <= a.span[0] and a.span[1] <= stmt.end_byte


_NOT_ARITHMETIC = ("subscript_expression", "call_expression", "pointer_expression", "field_expression",
                   "assignment_expression", "update_expression", "comma_expression")


def _interior_arm(branch: Node, globals_: list[Access], src: bytes, prelude: list[Node], block: list[Node]) -> tuple[
        tuple[tuple[tuple[Node, bool], ...], list[Node], tuple[Node, ...]] | None, str]:
    """The arm of the ``if``/``else if``/``else`` chain ``branch`` that reads the most global memory (the last
    of those that read as much: the ``else``, usually the interior), as (the conditions and the values that
    select it, its statements, the other arms' statements); or why no arm can be the fast path's."""
    arms: list[tuple[tuple[tuple[Node, bool], ...], list[Node]]] = []
    taken: tuple[tuple[Node, bool], ...] = ()
    node: Node | None = branch
    while node is not None:
        cond = node.child_by_field_name("condition")
        if not _plain_condition(cond) or _has(cond, _NOT_ARITHMETIC):
            return None, ("a condition of the branch in the guarded block is not integer arithmetic on the kernel's "
                          "values (it could read memory or change something)")
        arms.append(((*taken, (cond, True)), _statements(node.child_by_field_name("consequence"))))
        taken = (*taken, (cond, False))
        alternative = node.child_by_field_name("alternative")
        rest = alternative.named_children[0] if alternative is not None and alternative.named_children else None
        if rest is not None and rest.type == "if_statement":
            node = rest
            continue
        arms.append((taken, _statements(rest) if rest is not None else []))
        node = None
    if any(s.type not in _STRAIGHT and not _pragma(s) for _, statements in arms for s in statements):
        return None, ("an arm of the branch in the guarded block has statements other than declarations, expressions "
                      "and tap loops")
    # The conditions are tested before the guarded statements run: they may read only what the prelude made.
    made = set()
    for s in block[: block.index(branch)]:
        made |= assigned_names(s, src) | declared_anywhere(s, src)
    for cond, _ in arms[-1][0]:
        if identifiers_in(cond, src) & made:
            return None, (f"the branch's condition reads {', '.join(sorted(identifiers_in(cond, src) & made))}, which "
                          "the guarded block computes before it")

    def reads(k: int) -> int:
        return sum(1 for a in globals_ if a.kind == "read" and any(_within(a, s) for s in arms[k][1]))

    best = max(range(len(arms)), key=lambda k: (reads(k), k))
    if not reads(best):
        return None, "no arm of the branch in the guarded block reads global memory"
    # The fast path runs the arm's statements in the guarded block's scope, not in braces of their own.
    around = set().union(*(declared_anywhere(s, src) for s in [*prelude, *block] if s is not branch))
    clash = set().union(*(declared_anywhere(s, src) for s in arms[best][1])) & around
    if clash:
        return None, f"the branch's arm declares {', '.join(sorted(clash))} again (a name the code around it declares)"
    others = tuple(s for k, (_, statements) in enumerate(arms) if k != best for s in statements)
    return (arms[best][0], arms[best][1], others), ""


def _pragma_in(stmts: tuple[Node, ...], stmt: Node) -> bool:
    """``stmt`` follows a directive among ``stmts``."""
    at = stmts.index(stmt)
    return at > 0 and _pragma(stmts[at - 1])


def _product(shape: tuple[int, int, int]) -> int:
    return shape[0] * shape[1] * shape[2]


def _extent(ctx: RuleContext, axis: Axis, facts: KernelFacts, body: Node, src: bytes) -> tuple[str | None, str]:
    """The spec's launch extent along ``axis`` as the kernel can compute it (None: one constant), or why
    it cannot: a launch rounded up to whole threads of C rows has rows past the original extent, which
    each thread must recognise at every size, not only at the spec's."""
    text = str(getattr(ctx.spec.launch, axis.launch)[axis.dim]).strip()  # type: ignore[union-attr]
    if text.isdigit():
        return None, ""
    where = f"the {axis.launch}'s {'xyz'[axis.dim]} extent `{text}`"
    if not re.fullmatch(r"[\w\s+\-*/%()]+", text):
        return None, f"{where} is not integer arithmetic the kernel can evaluate"
    integers = {name for name, type_, pointer in facts.params if not pointer and is_integer_type(type_)}
    names = set(re.findall(r"[A-Za-z_]\w*", text))
    if names - integers:
        return None, f"{where} reads {', '.join(sorted(names - integers))}, not an integer parameter of the kernel"
    if names & assigned_names(body, src):
        return None, f"{where} reads {', '.join(sorted(names & assigned_names(body, src)))}, which the kernel assigns"
    return text, ""
