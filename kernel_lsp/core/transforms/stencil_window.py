"""Stencil and filter inputs staged through a shared-memory window with its halo.

A stencil or filter reads its input at a few offsets around each thread's own element: straight
line (``A[i-1] + A[i] + A[i+1]``) or in tap loops (``for (dy = -R; dy <= R; ++dy) for (dx = …)
sum += in[(row + dy) * w + col + dx] * mask[…]``). Neighbouring threads read the same elements,
each one as many times as there are taps that reach it. The rewrite loads, once per block, the
window of the input the block's threads read (the block's own elements plus the halo the taps
reach beyond it) into shared memory, cooperatively (consecutive threads on consecutive elements),
then one barrier, then the kernel's code as written with every tap read from the window.

The window's axes are the memory axes the reads move along: ``threadIdx.x`` at unit stride (the
window's rows are contiguous), ``threadIdx.y`` and ``threadIdx.z`` with their pitches (1-D, 2-D
and 3-D blocks), and planes the taps reach along an axis no thread moves on (a 3-D filter's
``i - 1`` and ``i + 1`` planes around one plane per launch, channels in a tap loop). A read's
offset from the window's origin is found by writing the difference of its index from the first
read's as whole steps of those pitches, exactly (a polynomial identity, checked), per tap: the
window is the box of all taps' offsets, and each tap reads element ``position + offset - low``.

Nothing is read that the original did not read. The fast path runs only where every thread of the
block would have read every tap (its guards hold for the whole block, ``__syncthreads_and``), and
it loads only the window elements some tap of some thread of the block reaches (the union of the
taps' boxes: a cross-shaped stencil leaves the window's corners out). Any other block (the grid's
borders, ragged edges), and any launch in blocks of another shape than the spec's (for which the
window is sized), runs the original code unchanged. The decision is the same for the whole
block, so every thread reaches the barrier.

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a launch spec with one block shape at every size (the window's size is a constant), the spec
  allocating every pointer on its own, a complete analysis;
- the staged array is a pointer parameter the kernel never writes (nor lets escape), read at unit
  stride along ``threadIdx.x`` and with one stride along each other thread axis, every read an
  affine offset from the others in the pitches, not through a helper or a struct member;
- every loop around a read is a tap loop: a counted loop (a ``for``, or a ``while`` stepped by one
  statement of its body) with a constant positive step whose start and bound are constants or
  integer parameters the kernel leaves unchanged (the fast path is taken only when they have the
  spec's values), without ``break``, ``continue``, ``return`` or ``goto``, assigning its counter
  nowhere but in its step, running at least once;
- every read runs under no condition but the kernel's leading ``if (…) return;`` exits and one
  guard ``if (…) { … }`` (without ``else``) around the code that reads: each thread that passes
  them reads every tap;
- before that code, the statements after the first exit compute locals only (no memory access,
  no call but math functions, no barrier), since the rewrite evaluates them in threads that the
  original sent away; no other ``return`` or ``goto`` there;
- the window fits the shared memory left beside the kernel's own, and saves loads: the taps'
  reads of a block are at least :data:`MIN_REUSE` times the window's elements.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import (
    Access, Binding, KernelFacts, LoopFact, assigned_names, evaluate, is_pure_math, thread_dependence, trip_count,
)
from kernel_lsp.core.analysis import has_node as _has
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.poly import Poly, is_iteration
from kernel_lsp.core.rules.base import MAX_THREADS_PER_BLOCK, Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError
from kernel_lsp.core.static_check import problem_sizes
from kernel_lsp.core.transforms.emit import node_at, parse, rebuild
from kernel_lsp.core.transforms.stencil_reuse import canonical
from kernel_lsp.core.transforms.tile_contraction import STATIC_SMEM_BYTES, PolyEmitter, Refused

#: Largest offset of a tap from the window's origin along one axis (a wider reach is not a stencil).
MAX_RADIUS = 16
#: Most iterations of the tap loops around one read that are enumerated.
MAX_TAP_POINTS = 4096
#: Global reads of a block's taps per window element below which the window is not worth its barrier.
MIN_REUSE = 2.0
#: Shared memory the windows of one kernel may take (several blocks stay resident per SM).
WINDOW_BUDGET_BYTES = 32 * 1024
_AXES = ("x", "y", "z")
_JUMPS = ("break_statement", "continue_statement", "return_statement", "goto_statement")


class _Refusal(Exception):
    """A legality condition that does not hold; its message is the reason."""


_LITERAL = re.compile(r"(?<![\w.])(\d+)(LL|ll|u|U)?\b")


class _SizeNames:
    """Integer literals of the emitted code that equal a problem size of the spec (the harness's static check
    takes such a literal, absent from the original, for a size written in) written as the user's own
    object-like macro of that value (``NJ`` for the 4096 its expansion gave the analysis), or refused."""

    def __init__(self, sizes: dict[int, str], macros, kernel_text: str, source: str) -> None:  # noqa: ANN001
        # A literal the original holds too is no finding of the check.
        held = {int(m.group(1)) for m in _LITERAL.finditer(source)}
        self.sizes = {v: what for v, what in sizes.items() if v not in held}
        self.names: dict[int, str] = {}
        used = set(re.findall(r"[A-Za-z_]\w*", kernel_text))
        # The macros the kernel itself names first (``NJ`` rather than another macro of the same value).
        for m in sorted(macros, key=lambda m: (m.name not in used, m.name)):
            body = m.body.strip()
            while body.startswith("(") and body.endswith(")"):
                body = body[1:-1].strip()
            if m.params is None and re.fullmatch(r"\d+[uUlL]*", body):
                self.names.setdefault(int(body.rstrip("uUlL")), m.name)

    def __call__(self, text: str) -> str:
        def name(match: re.Match) -> str:
            value = int(match.group(1))
            if value not in self.sizes:
                return match.group(0)
            if value not in self.names:
                raise _Refusal(f"the window's code would hold the literal {value}, {self.sizes[value]}, which the "
                               "harness's static check takes for a problem size written in (no macro of the file names it)")
            return f"((long long){self.names[value]})"
        return _LITERAL.sub(name, text)


@dataclass(frozen=True)
class _Axis:
    """One axis of a window, in elements of the staged array."""

    pitch: Poly
    """Elements between neighbours along it (1 along ``threadIdx.x``)."""
    thread: str | None
    """``x``/``y``/``z`` when the block's threads move along it; None for a plane axis."""
    threads: int
    """The block's threads along it (1 for a plane axis)."""
    low: int
    high: int
    """The smallest and largest offset a tap reads along it."""

    @property
    def extent(self) -> int:
        return self.threads + self.high - self.low


@dataclass(frozen=True)
class _Read:
    access: Access
    offsets: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]
    """Per window axis: (constant, ((loop id, coefficient), ...)): the offset as an affine function of
    the iteration counters of its tap loops."""


@dataclass(frozen=True)
class _Window:
    array: str
    elem_type: str
    elem_bytes: int
    origin: Poly
    """The staged array's index of the window's first element (block-uniform)."""
    axes: tuple[_Axis, ...]
    """Slowest first; the last one is ``threadIdx.x``'s."""
    reads: tuple[_Read, ...]
    boxes: tuple[tuple[tuple[int, int], ...], ...]
    """The elements some tap reaches: a union of boxes, each ``[lo, hi)`` per axis."""
    taps: int

    @property
    def elements(self) -> int:
        out = 1
        for axis in self.axes:
            out *= axis.extent
        return out


@dataclass(frozen=True)
class _Plan:
    windows: tuple[_Window, ...]
    prelude: tuple[Node, ...]
    """The body's children before the code that reads (exits among them)."""
    exits: tuple[Node, ...]
    work_start: int
    """Where the code that reads starts (a ``#pragma`` right before it included)."""
    guard: Node | None
    fixed: tuple[tuple[str, int], ...]
    """Parameters the tap loops' bounds read, with the spec's values the fast path is taken for."""
    block: tuple[int, int, int]
    kernel: Node
    body: Node
    loops: dict
    """Loop id -> (:class:`LoopFact`, trips) of the tap loops."""
    names: _SizeNames


def _substituted(poly: Poly, env: dict[str, int]) -> Poly:
    """``poly`` with the symbols of ``env`` replaced by their values (the others kept)."""
    acc: dict[tuple[str, ...], int] = {}
    for m, c in poly.terms:
        rest = []
        for s in m:
            if s in env:
                c *= env[s]
            else:
                rest.append(s)
        key = tuple(rest)
        acc[key] = acc.get(key, 0) + c
    return Poly._from(acc)


def _decompose(diff: Poly, pitches: list[Poly]) -> tuple[int, ...] | None:
    """``diff`` as whole steps of ``pitches`` (largest first) plus a constant (the unit axis), or None.

    A symbolic pitch takes the steps its leading monomial's coefficient says, a constant one the nearest
    whole number of steps of what is left; the remainder must be a constant. The result is exact
    (``diff == sum(d * p) + rest``) whatever the choice, which only decides the window's shape."""
    rest = diff
    out = []
    for p in pitches:
        if p.constant is not None:
            c = rest.constant if rest.constant is not None else dict(rest.terms).get((), 0)
            d = (2 * c + p.constant) // (2 * p.constant)
        else:
            mono, coeff = max(p.terms, key=lambda t: (len(t[0]), t[0]))
            found = dict(rest.terms).get(mono, 0)
            if found % coeff:
                return None
            d = found // coeff
        rest = rest - p.scale(d)
        out.append(d)
    if rest.constant is None:
        return None
    out.append(rest.constant)
    return tuple(out)


def _merge(boxes: set[tuple[tuple[int, int], ...]]) -> list[tuple[tuple[int, int], ...]]:
    """Boxes merged while two differ along one axis only and touch there."""
    boxes = set(boxes)
    changed = True
    while changed:
        changed = False
        for a, b in itertools.combinations(sorted(boxes), 2):
            differ = [k for k in range(len(a)) if a[k] != b[k]]
            if len(differ) != 1:
                continue
            k = differ[0]
            if a[k][1] < b[k][0] or b[k][1] < a[k][0]:
                continue
            merged = tuple((min(a[k][0], b[k][0]), max(a[k][1], b[k][1])) if j == k else a[j] for j in range(len(a)))
            boxes -= {a, b}
            boxes.add(merged)
            changed = True
            break
    return sorted(boxes)


def _exit_condition(stmt: Node) -> Node | None:
    """The condition of ``if (c) return;`` / ``if (c) { return; }``; None for anything else."""
    if stmt.type != "if_statement" or stmt.child_by_field_name("alternative") is not None:
        return None
    body = stmt.child_by_field_name("consequence")
    if body is not None and body.type == "compound_statement" and body.named_child_count == 1:
        body = body.named_children[0]
    if body is None or body.type != "return_statement" or body.named_child_count:
        return None
    return stmt.child_by_field_name("condition")


def _calls(node: Node, src: bytes) -> list[str]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if n.type == "call_expression":
            fn = n.child_by_field_name("function")
            out.append(_text(src, fn).split("<", 1)[0].rsplit("::", 1)[-1].strip() if fn is not None else "")
        stack.extend(n.children)
    return out


class StencilWindow(Rule):
    name = "stencil-shared-window"
    technique = "shared-memory-tiling"
    summary = "a stencil's or filter's input loaded once per block into a shared-memory window with its halo"

    # ---- legality ------------------------------------------------------------------------

    def plan(self, ctx: RuleContext) -> tuple[_Plan | None, str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        if ctx.spec is None:
            return None, "needs a launch spec (the window's size comes from its block)"
        block = ctx.constant_block()
        if block is None:
            return None, "the block shape is not the same at every size of the spec"
        if block[0] * block[1] * block[2] > MAX_THREADS_PER_BLOCK:
            return None, "the block has more threads than a block may"
        if not ctx.distinct_arrays():
            return None, "the spec does not allocate every pointer parameter on its own (they may alias)"
        try:
            binding = Binding.from_spec(ctx.spec)
        except (SpecError, ValueError, ZeroDivisionError):
            return None, "the spec's launch does not evaluate"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return None, "the kernel's definition was not found in the preprocessed view"
        params = {name for name, _, is_pointer in facts.params if not is_pointer}
        assigned = assigned_names(body, src)
        env = {**binding.values, "bdim.x": block[0], "bdim.y": block[1], "bdim.z": block[2]}
        if binding.grid is not None:
            env.update({f"gdim.{a}": binding.grid[i] for i, a in enumerate(_AXES)})
        loops = {loop.id: loop for loop in facts.loops}
        fixed: dict[str, int] = {}
        tap_loops: dict[int, LoopFact] = {}
        windows, reasons = [], []
        used = sum(d.size_bytes or 0 for d in ctx.kernel.shared if not d.is_extern) + max(
            (launch.dynamic_smem_bytes for launch in ctx.launches()), default=0)
        budget = min(WINDOW_BUDGET_BYTES, STATIC_SMEM_BYTES - used)
        for array in facts.read_only:
            reads = [a for a in facts.accesses if a.array == array and a.space == "global"]
            if not any("tid.x" in a.index.symbols for a in reads):
                continue
            try:
                window = self._window(ctx, facts, array, reads, block, env, params, assigned, loops, src, root,
                                      kernel, fixed, tap_loops, budget)
            except _Refusal as exc:
                reasons.append(f"`{array}`: {exc}")
                continue
            budget -= window.elements * window.elem_bytes
            windows.append(window)
        if not windows:
            return None, "; ".join(reasons) or "no array the kernel only reads is read at neighbouring offsets by the threads of a block"
        try:
            shape = self._shape(facts, windows, body, src, tap_loops)
        except _Refusal as exc:
            return None, str(exc)
        prelude, exits, work_start, guard = shape
        plan = _Plan(tuple(windows), prelude, exits, work_start, guard, tuple(sorted(fixed.items())), block, kernel,
                     body, tap_loops, _SizeNames(problem_sizes(ctx.spec), ctx.preprocessed.macros.values(),
                                                 ctx.source[ctx.kernel.span.start_byte:ctx.kernel.span.end_byte], ctx.source))
        emitter = PolyEmitter(facts, src, kernel)
        try:
            for n, w in enumerate(windows):
                plan.names(self._load(n, w, plan, emitter))
                for r in w.reads:
                    self._tap(n, w, r, plan, emitter)
        except _Refusal as exc:
            return None, str(exc)
        return plan, ""

    def _tap_loop(self, facts: KernelFacts, loop: LoopFact, ctx: RuleContext, binding_env: dict, params: set[str],
                  assigned: set[str], src: bytes, root: Node, fixed: dict[str, int]) -> int:
        """The loop's trips when it is a tap loop (else :class:`_Refusal`); its bounds' parameters go to ``fixed``."""
        line = (loop.user_line or 0) + 1
        if loop.var is None or loop.start is None or loop.step is None or loop.bound is None or loop.geometric is not None:
            raise _Refusal(f"the loop at line {line} has no counter the analysis follows")
        if loop.step.constant is None or loop.step.constant <= 0:
            raise _Refusal(f"the loop at line {line} does not step by a constant")
        for part, poly in (("start", loop.start), ("bound", loop.bound)):
            for s in sorted(poly.symbols):
                if s not in params or s in assigned or not ctx.spec_scalar(s) or s not in binding_env:
                    what = facts.opaque[s].text if s in facts.opaque else s
                    raise _Refusal(f"the loop at line {line} has a {part} (`{what}`) that is neither a constant nor an "
                                   "integer parameter the kernel leaves unchanged")
                fixed[s] = binding_env[s]
        if loop.calls_unknown:
            raise _Refusal(f"the loop at line {line} calls code the analysis does not see")
        node = node_at(src, root, loop.span)
        inner = node.child_by_field_name("body") if node is not None else None
        if inner is None or _has(inner, _JUMPS):
            raise _Refusal(f"the loop at line {line} can leave an iteration early (break, continue, return or goto)")
        # A ``while`` loop's counter is stepped by its one statement in the body (the analysis' counter).
        if loop.kind == "for" and loop.var in assigned_names(inner, src):
            raise _Refusal(f"the loop at line {line} assigns its counter in its body")
        trips = trip_count(facts, loop, Binding(binding_env, (1, 1, 1)))
        if not trips:
            raise _Refusal(f"the loop at line {line} may run no iteration")
        return trips

    def _window(self, ctx, facts, array, reads, block, env, params, assigned, loops, src, root, kernel,
                fixed, tap_loops, budget) -> _Window:
        for a in reads:
            if a.field is not None:
                raise _Refusal(f"`{a.text}` reads a member of a struct element")
            if a.via:
                raise _Refusal(f"`{a.text}` is read inside the helper `{a.via[-1]}`")
            if a.kind != "read":
                raise _Refusal(f"`{a.text}` is not a plain read")
        indices = [canonical(a.index, facts) for a in reads]
        pitches: dict[str, Poly] = {}
        for axis in _AXES:
            coefficients = {p.coefficient(f"tid.{axis}") for p in indices}
            if None in coefficients:
                raise _Refusal(f"it is read at an index that is not linear in threadIdx.{axis}")
            if len(coefficients) > 1:
                raise _Refusal(f"it is read with different strides along threadIdx.{axis}")
            c = coefficients.pop()
            if c == Poly():
                continue
            if thread_dependence(c, facts.opaque) or any(is_iteration(s) for s in c.symbols):
                raise _Refusal(f"its stride along threadIdx.{axis} differs between threads or iterations")
            pitches[axis] = c
        if pitches.get("x") != Poly.const(1):
            raise _Refusal("it is not read at unit stride along threadIdx.x")
        rests = []
        for a, p in zip(reads, indices):
            rest = p - sum((Poly.sym(f"tid.{ax}") * c for ax, c in pitches.items()), Poly())
            if thread_dependence(rest, facts.opaque):
                raise _Refusal(f"`{a.text}` depends on the thread other than through its position")
            for lid in a.loops:
                if lid not in tap_loops:
                    tap_loops[lid] = None  # type: ignore[assignment]
                    try:
                        trips = self._tap_loop(facts, loops[lid], ctx, env, params, assigned, src, root, fixed)
                    except _Refusal:
                        del tap_loops[lid]
                        raise
                    tap_loops[lid] = (loops[lid], trips)  # type: ignore[assignment]
            rests.append(rest)
        trip_of = {loops[lid].trip_symbol: lid for a in reads for lid in a.loops}
        base = _substituted(rests[0], {s: 0 for s in trip_of})
        # Planes: axes no thread moves along, the strides of the block-uniform symbols of the index.
        thread_pitches = [c for ax, c in pitches.items() if ax != "x"]
        planes: list[Poly] = []
        for p in indices:
            for s in sorted(p.symbols):
                if not (s in params or s == "bid.z" or is_iteration(s)):
                    continue
                c = p.coefficient(s)
                # A plane's stride is the same for every block (a block's own index would move it).
                if c is None or c == Poly() or c.constant in (1, -1) or thread_dependence(c, facts.opaque) \
                        or any(is_iteration(t) or t.startswith("bid.") for t in c.symbols):
                    continue
                if max(c.terms, key=lambda t: (len(t[0]), t[0]))[1] < 0:
                    c = -c
                if c not in thread_pitches and c not in planes:
                    planes.append(c)

        def value(p: Poly) -> int:
            v = evaluate(p, env, facts.opaque)
            if v is None:
                raise _Refusal(f"its stride `{p}` does not evaluate at the spec's size")
            return abs(v)

        order = sorted([*thread_pitches, *planes], key=value, reverse=True)
        fixed_env = dict(fixed)
        points: list[tuple[Access, list[tuple[dict[str, int], tuple[int, ...]]]]] = []
        for a, rest in zip(reads, rests):
            diff = _substituted(rest - base, fixed_env)
            symbols = sorted(s for s in diff.symbols if s in trip_of)
            counts = [tap_loops[trip_of[s]][1] for s in symbols]  # type: ignore[index]
            total = 1
            for n in counts:
                total *= n
            if total > MAX_TAP_POINTS:
                raise _Refusal(f"`{a.text}` is in tap loops of more than {MAX_TAP_POINTS} iterations")
            found = []
            for values in itertools.product(*(range(n) for n in counts)):
                trips = dict(zip(symbols, values))
                d = _decompose(_substituted(diff, trips), order)
                if d is None:
                    raise _Refusal(f"`{a.text}` is not read at a small whole number of rows, planes and elements from "
                                   "the other reads")
                found.append((trips, d))
            points.append((a, found))
        # Plane axes a tap moves along are window axes; the others only shift the origin.
        offsets_all = [d for _, found in points for _, d in found]
        if any(abs(x) > MAX_RADIUS for d in offsets_all for x in d):
            raise _Refusal(f"a read reaches more than {MAX_RADIUS} rows, planes or elements from the others")
        kept = [k for k, p in enumerate(order) if p in thread_pitches or len({d[k] for d in offsets_all}) > 1]
        axes_all = [*order, Poly.const(1)]
        kept.append(len(order))
        axes = []
        for k in kept:
            p = axes_all[k]
            ax = "x" if k == len(order) else next((a2 for a2, c in pitches.items() if c == p and a2 != "x"), None)
            threads = {"x": block[0], "y": block[1], "z": block[2], None: 1}[ax]
            values_k = [d[k] for d in offsets_all]
            axes.append(_Axis(p, ax, threads, min(values_k), max(values_k)))
        # The window starts at every axis' lowest offset; a plane axis that no tap moves along has one
        # offset, which only shifts the origin.
        origin = base + sum((axes_all[k].scale(min(d[k] for d in offsets_all)) for k in range(len(axes_all))), Poly())
        read_offsets = []
        for a, found in points:
            zero = next(d for t, d in found if not any(t.values()))
            per_axis = []
            for k in kept:
                coeffs = []
                for s in sorted({s for t, _ in found for s in t}):
                    unit = next((d for t, d in found if t[s] == 1 and not any(v for s2, v in t.items() if s2 != s)), None)
                    if unit is not None and unit[k] != zero[k]:
                        coeffs.append((trip_of[s], unit[k] - zero[k]))
                per_axis.append((zero[k], tuple(coeffs)))
            for t, d in found:
                for j, k in enumerate(kept):
                    const, coeffs = per_axis[j]
                    if const + sum(c * t[loops[lid].trip_symbol] for lid, c in coeffs) != d[k]:
                        raise _Refusal(f"`{a.text}`'s offset is not affine in its tap loops' counters")
            read_offsets.append(_Read(a, tuple(per_axis)))
        taps = {tuple(d[k] for k in kept) for d in offsets_all}
        boxes = set()
        for tap in taps:
            boxes.add(tuple((o - ax.low, o - ax.low + ax.threads) for o, ax in zip(tap, axes)))
        elem_type = re.sub(r"\b(const|volatile|__restrict__)\b", "", reads[0].elem_type).strip()
        if not elem_type or "*" in elem_type or reads[0].elem_bytes is None:
            raise _Refusal("its element type is not known")
        window = _Window(array, elem_type, reads[0].elem_bytes, origin, tuple(axes), tuple(read_offsets),
                         tuple(_merge(boxes)), len(taps))
        threads = block[0] * block[1] * block[2]
        if len(taps) < 2:
            raise _Refusal("each thread reads it at one offset only (no neighbours to share)")
        if window.elements * window.elem_bytes > budget:
            raise _Refusal(f"its window of {window.elements} elements does not fit the shared memory left")
        reuse = len(taps) * threads / window.elements
        if reuse < MIN_REUSE:
            raise _Refusal(f"its {len(taps)} tap(s) read each element of the window {reuse:.1f} times per block "
                           f"(fewer than {MIN_REUSE:g}: not worth a barrier)")
        emitter = PolyEmitter(facts, src, kernel)
        try:
            emitter.poly(window.origin, {})
            for ax in axes:
                emitter.poly(ax.pitch, {})
        except Refused as exc:
            raise _Refusal(f"its window's origin cannot be computed at the block's start: {exc}") from None
        return window

    def _shape(self, facts: KernelFacts, windows: list[_Window], body: Node, src: bytes, tap_loops: dict):
        spans = [r.access.span for w in windows for r in w.reads]
        children = [c for c in body.named_children if c.type != "comment"]
        statements = [c for c in children if not c.type.startswith("preproc")]
        first = next((i for i, s in enumerate(statements)
                      if any(s.start_byte <= lo and hi <= s.end_byte for lo, hi in spans)), None)
        if first is None:
            raise _Refusal("the reads are not inside the kernel's statements")
        work = statements[first]
        prelude = tuple(c for c in children if c.end_byte <= work.start_byte)
        exits = []
        for stmt in prelude:
            if stmt.type.startswith("preproc"):
                continue
            if _exit_condition(stmt) is not None:
                exits.append(stmt)
                continue
            if _has(stmt, ("return_statement", "goto_statement")):
                raise _Refusal("a statement before the stencil's code can return other than as a leading "
                               "`if (…) return;`")
            if any(stmt.start_byte <= b.span[0] < stmt.end_byte for b in facts.barriers) and exits:
                raise _Refusal("a barrier follows an early exit before the stencil's code")
            if exits:
                if stmt.type not in ("declaration", "expression_statement"):
                    raise _Refusal(f"a `{stmt.type.replace('_', ' ')}` after an early exit would run in threads the "
                                   "original sent away")
                if any(stmt.start_byte <= a.span[0] < stmt.end_byte for a in facts.accesses):
                    raise _Refusal("a statement after an early exit accesses memory (the rewrite evaluates it in threads "
                                   "the original sent away)")
                if any(not is_pure_math(name) for name in _calls(stmt, src)):
                    raise _Refusal("a statement after an early exit calls a function other than a math function")
        start = work.start_byte
        before = [c for c in children if c.end_byte <= work.start_byte]
        if before and before[-1].type.startswith("preproc") and _text(src, before[-1]).lstrip().startswith("#pragma"):
            start = before[-1].start_byte
            prelude = prelude[:-1]
        guard = None
        if work.type == "if_statement" and work.child_by_field_name("alternative") is None:
            cons = work.child_by_field_name("consequence")
            cond = work.child_by_field_name("condition")
            if cons is not None and cond is not None and all(cons.start_byte <= lo and hi <= cons.end_byte for lo, hi in spans) \
                    and not any(c.type in ("declaration", "init_statement") for c in cond.named_children):
                guard = work
        allowed = set()
        for c in facts.conditions:
            if c.kind == "exit" and any(c.statement_span == (e.start_byte, e.end_byte) for e in exits):
                allowed.add((c.id, False))
            if guard is not None and c.kind == "if" and c.statement_span == (guard.start_byte, guard.end_byte):
                allowed.add((c.id, True))
            # A ``while`` tap loop's test is its bound, as a ``for`` header's is: every thread runs its trips.
            if c.kind == "while" and any(c.statement_span == loop.span for loop, _ in tap_loops.values()):
                allowed.add((c.id, True))
        for w in windows:
            for r in w.reads:
                if not set(r.access.guards) <= allowed:
                    raise _Refusal(f"`{r.access.text}` runs under a condition other than the kernel's leading exits and "
                                   "guard (a thread that passes them might not read it)")
        return prelude, tuple(exits), start, guard

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        parts = [f"`{w.array}` ({w.taps} taps, a window of {' x '.join(str(a.extent) for a in w.axes)})" for w in plan.windows]
        gate = f"; the fast path needs {', '.join(f'{n} == {v}' for n, v in plan.fixed)}" if plan.fixed else ""
        loops = f", in tap loops of {'spec-known' if plan.fixed else 'constant'} trips" if plan.loops else ""
        return True, (f"{', '.join(parts)} read-only, every tap read by each thread that passes the kernel's guards"
                      f"{loops}{gate}")

    # ---- rewrite -------------------------------------------------------------------------

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        facts = ctx.facts
        assert plan is not None and facts is not None
        src = ctx.preprocessed.text.encode("utf-8")
        emitter = PolyEmitter(facts, src, plan.kernel)

        def build(text) -> str:
            return self._body(plan, text, emitter, src)

        source, expanded = rebuild(ctx.preprocessed, facts, ctx.source, ctx.kernel, build)
        if not expanded:
            # The window's own code in the user's text names a problem size by the user's macro (the analysis
            # saw its expansion); the candidate was checked against the expanded body with the literal.
            for n, w in enumerate(plan.windows):
                load = self._load(n, w, plan, emitter)
                source = source.replace(load, plan.names(load), 1)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        staged = ", ".join(f"`{w.array}` ({' x '.join(str(a.extent) for a in w.axes)}, {w.taps} taps)" for w in plan.windows)
        return (Rewrite(source, f"stage {staged} through a shared-memory window with its halo, loaded once per block and "
                                f"coalesced, one barrier; blocks where a thread fails the guards run the original code{note}"),)

    def _body(self, plan: _Plan, text, emitter: PolyEmitter, src: bytes) -> str:
        body = plan.body
        end = body.end_byte - 1

        def piece(lo: int, hi: int, subs=()) -> str:
            return text(lo, hi, subs) if src[lo:hi].strip() else ""

        subs = []
        for n, w in enumerate(plan.windows):
            for r in w.reads:
                subs.append((r.access.span[0], r.access.span[1], self._tap(n, w, r, plan, emitter)))
        on = bool(plan.exits or plan.guard is not None)
        out = ["\n    bool kl_on = true;"] if on else []
        for child in plan.prelude:
            if child in plan.exits:
                cond = child.child_by_field_name("condition")
                out.append(f"if (kl_on && {piece(cond.start_byte, cond.end_byte)}) kl_on = false;")
            else:
                out.append(piece(child.start_byte, child.end_byte))
        if plan.guard is not None:
            cond = plan.guard.child_by_field_name("condition")
            out.append(f"kl_on = kl_on && {piece(cond.start_byte, cond.end_byte)};")
        fast = [self._load(n, w, plan, emitter) for n, w in enumerate(plan.windows)]
        fast.append("__syncthreads();")
        if plan.guard is not None:
            cons = plan.guard.child_by_field_name("consequence")
            lo, hi = (cons.start_byte + 1, cons.end_byte - 1) if cons.type == "compound_statement" else (cons.start_byte, cons.end_byte)
            inner = [(a, b, v) for a, b, v in subs if lo <= a and b <= hi]
            fast.append(piece(lo, hi, inner))
            rest = [(a, b, v) for a, b, v in subs if plan.guard.end_byte <= a]
            fast.append(piece(plan.guard.end_byte, end, rest))
        else:
            fast.append(piece(plan.work_start, end, subs))
        fast_text = "\n".join(f for f in fast if f)
        slow_text = piece(plan.work_start, end)
        # The window is sized for the spec's block: another launch of the kernel takes the original path.
        bx, by, bz = plan.block
        gate = " && ".join([f"blockDim.x == {bx}u && blockDim.y == {by}u && blockDim.z == {bz}u",
                            *(f"{name} == {value}" for name, value in plan.fixed)])
        out.append("// The block's window of the stencil's input in shared memory, when every thread of the block reads "
                   "every tap; the original code elsewhere.")
        if on:
            out.append("const int kl_all = __syncthreads_and(kl_on);")
            out.append(f"if (kl_all && {gate}) {{\n{fast_text}\n}} else if (kl_on) {{\n{slow_text}\n}}")
        else:
            out.append(f"if ({gate}) {{\n{fast_text}\n}} else {{\n{slow_text}\n}}")
        return "\n    ".join(out) + "\n"

    @staticmethod
    def _tap(n: int, w: _Window, r: _Read, plan: _Plan, emitter: PolyEmitter) -> str:
        """The window element a tap read becomes."""
        parts = []
        for axis, (const, coeffs) in zip(w.axes, r.offsets):
            terms = [f"(int)threadIdx.{axis.thread}"] if axis.thread is not None else []
            if const - axis.low or not terms:
                terms.append(str(const - axis.low))
            for lid, c in coeffs:
                loop, _ = plan.loops[lid]
                trip = f"(int)({loop.var} - {emitter.poly(loop.start, {})})"
                if loop.step.constant != 1:
                    trip = f"({trip} / {loop.step.constant})"
                terms.append(f"{c} * {trip}" if c != 1 else trip)
            parts.append("[" + " + ".join(terms) + "]")
        return plan.names(f"kl_w{n}" + "".join(parts))

    @staticmethod
    def _load(n: int, w: _Window, plan: _Plan, emitter: PolyEmitter) -> str:
        """The window's cooperative load: consecutive threads on consecutive elements of its rows."""
        bx, by, bz = plan.block
        threads = bx * by * bz
        flat = "(int)threadIdx.x" + (f" + {bx} * (int)threadIdx.y" if by > 1 else "") + (
            f" + {bx * by} * (int)threadIdx.z" if bz > 1 else "")
        dims = "".join(f"[{a.extent}]" for a in w.axes)
        coords = []
        stride = 1
        for k in range(len(w.axes) - 1, -1, -1):
            extent = w.axes[k].extent
            value = "kl_e" if stride == 1 else f"kl_e / {stride}"
            coords.append(f"const int kl_i{k} = ({value}){f' % {extent}' if k else ''};")
            stride *= extent
        coords.reverse()
        index = " + ".join([emitter.poly(w.origin, {})] + [
            f"(long long)kl_i{k} * {emitter.poly(a.pitch, {})}" if a.pitch != Poly.const(1) else f"(long long)kl_i{k}"
            for k, a in enumerate(w.axes)])
        full = tuple((0, a.extent) for a in w.axes)
        cover = []
        if full not in w.boxes:
            for box in w.boxes:
                terms = [f"kl_i{k} >= {lo} && kl_i{k} < {hi}" for k, (lo, hi) in enumerate(box)
                         if (lo, hi) != (0, w.axes[k].extent)]
                cover.append("(" + " && ".join(terms) + ")" if terms else "true")
        element = f"kl_w{n}" + "".join(f"[kl_i{k}]" for k in range(len(w.axes)))
        store = f"{element} = {w.array}[{index}];"
        if cover:
            store = f"if ({' || '.join(cover)}) {store}"
        return (f"__shared__ {w.elem_type} kl_w{n}{dims};\n"
                f"for (int kl_e = {flat}; kl_e < {w.elements}; kl_e += {threads}) {{ {' '.join(coords)} {store} }}")
