"""Kernel-level summaries of the facts: thread mapping, per-block outputs, stencils, value ranges, trees."""

from __future__ import annotations

import re
from collections.abc import Mapping

from tree_sitter import Node

from kernel_lsp.core.analysis.binding import Binding, bind, describe, trip_count
from kernel_lsp.core.analysis.facts import Access, KernelFacts, LoopFact, Opaque, Reduction, thread_dependence
from kernel_lsp.core.analysis.syntax import function_definitions, node_text
from kernel_lsp.core.poly import Poly, is_opaque


# --------------------------------------------------------------------------------------------
# Kernel-level summaries
# --------------------------------------------------------------------------------------------


def thread_mapping(facts: KernelFacts) -> str:
    """How threads map onto work: ``grid-stride``, ``row-per-thread``, ``block-per-row``,
    ``element`` (1-D), ``element-2d``/``element-3d``, ``tile`` or ``other``."""
    writes = [a for a in facts.accesses if a.writes and a.space == "global"]
    for loop in facts.loops:
        if loop.step is not None and any(m for m, _ in loop.step.terms if "gdim.x" in m and "bdim.x" in m):
            return "grid-stride"
    for a in facts.accesses:
        if a.space != "global" or not a.loops:
            continue
        inner = facts.loops[a.loops[-1]]
        along_loop = a.index.coefficient(inner.trip_symbol)
        along_x = a.index.coefficient("tid.x")
        step = inner.step
        if along_loop is None or along_x is None or along_x == Poly():
            if along_x is not None and along_x == Poly() and step is not None and "bdim.x" in step.symbols \
                    and a.index.coefficient("bid.x") not in (None, Poly()):
                return "block-per-row"
            continue
        if along_loop.constant == 1 and (step is not None and step.constant == 1) and along_x.constant != 1:
            return "row-per-thread"
        if step is not None and "bdim.x" in step.symbols and along_x.constant == 1 and a.index.coefficient("bid.x") not in (None, Poly()) \
                and "bdim.x" not in (a.index.coefficient("bid.x") or Poly()).symbols:
            return "block-per-row"
    if facts.syncs and any(a.space == "shared" for a in facts.accesses) and "tid.y" in facts.thread_dims:
        return "tile"
    if "tid.z" in facts.thread_dims or "bid.z" in facts.thread_dims:
        return "element-3d"
    if "tid.y" in facts.thread_dims or "bid.y" in facts.thread_dims:
        return "element-2d"
    if writes:
        return "element"
    return "other"


def per_block_outputs(facts: KernelFacts) -> tuple[str, ...]:
    """Global arrays written at an index that depends on the block but not on the thread
    (``partial[blockIdx.x] = sdata[0]``): their size is the grid's, a rewrite must keep it."""
    out = []
    for a in facts.accesses:
        if a.space != "global" or a.kind not in ("write", "update"):
            continue
        deps = thread_dependence(a.index, facts.opaque)
        if not deps and any(s.startswith("bid.") for s in a.index.symbols):
            out.append(a.array)
    return tuple(dict.fromkeys(out))


def stencil_offsets(facts: KernelFacts) -> dict[str, tuple[int, ...]]:
    """Reads of one global array at constant offsets from each other within the same loop nest:
    the neighbour offsets (in elements) a stencil reuses."""
    groups: dict[tuple[str, tuple[int, ...]], list[Access]] = {}
    for a in facts.accesses:
        if a.space == "global" and a.kind == "read":
            groups.setdefault((a.array, a.loops), []).append(a)
    found: dict[str, tuple[int, ...]] = {}
    for (array, _), reads in groups.items():
        if len(reads) < 3:
            continue
        anchor = reads[0].index
        deltas = []
        for r in reads:
            d = (r.index - anchor).constant
            if d is None:
                break
            deltas.append(d)
        else:
            offsets = tuple(sorted(set(deltas)))
            if len(offsets) >= 3:
                centre = sorted(offsets)[len(offsets) // 2]
                found[array] = tuple(o - centre for o in offsets)
    return found


def summary(facts: KernelFacts, binding: Binding | None) -> dict:
    """A JSON-ready summary (``kernel-lsp check --json``, the knowledge base, model prompts)."""
    patterns = bind(facts, binding) if binding is not None else ()
    accesses = []
    for i, a in enumerate(facts.accesses):
        entry = {"array": a.array, "space": a.space, "kind": a.kind, "index": str(a.index),
                 "line": (a.user_line + 1) if a.user_line is not None else None, "text": a.text}
        if a.op:
            entry["op"] = a.op
        if a.via:
            entry["via"] = list(a.via)
        if a.wide:
            entry["wide_index"] = True
        if patterns:
            p = patterns[i]
            entry.update({"pattern": p.pattern, "warp_stride_elems": p.warp_stride_elems,
                          "sectors_per_request": p.sectors_per_request, "describe": describe(p)})
        accesses.append(entry)
    return {
        "kernel": facts.kernel,
        "mapping": thread_mapping(facts),
        "written": list(facts.written),
        "read_only": [n for n in facts.read if n not in facts.written],
        "accesses": accesses,
        "loops": [{"line": (l.user_line + 1) if l.user_line is not None else None, "var": l.var,
                   "step": str(l.step) if l.step is not None else None, "bound": str(l.bound) if l.bound is not None else None,
                   "geometric": l.geometric, "trips": trip_count(facts, l, binding) if binding is not None else None}
                  for l in facts.loops],
        "reductions": [{"kind": r.kind, "target": r.target, "op": r.op,
                        "line": (r.user_line + 1) if r.user_line is not None else None} for r in facts.reductions],
        "per_block_outputs": list(per_block_outputs(facts)),
        "stencil_offsets": {k: list(v) for k, v in stencil_offsets(facts).items()},
        "syncs": facts.syncs,
        "shuffles": facts.shuffles,
        "unknowns": list(facts.unknowns),
    }


# --------------------------------------------------------------------------------------------
# Value ranges: the interval an index takes over a block's threads and any loaded data
# --------------------------------------------------------------------------------------------


def split_block_base(poly: Poly, facts: KernelFacts) -> tuple[Poly, Poly]:
    """(base, offset): ``base`` holds the terms that are the same for every thread of a block and
    every loaded value (scalar parameters, block indices, block and grid sizes), ``offset`` the rest."""
    fixed = ("bid.", "bdim.", "gdim.")
    scalars = {name for name, _, is_pointer in facts.params if not is_pointer}
    base: dict = {}
    rest: dict = {}
    for m, c in poly.terms:
        uniform = all(s.startswith(fixed) or s in scalars for s in m)
        (base if uniform else rest)[m] = c
    return Poly._from(base), Poly._from(rest)


def value_range(poly: Poly, facts: KernelFacts, binding: Binding) -> tuple[int, int] | None:
    """The interval ``poly`` can take in any block under ``binding`` for any thread and any loaded
    value, by interval arithmetic over the opaque terms' recipes (``x & m``, ``x % m``, ``/``,
    ``>>``, ``min``, ``max``, selects); None when a term is unbounded (a loaded value used as is)."""
    bx, by, bz = binding.block
    gx, gy, gz = binding.grid if binding.grid is not None else (None, None, None)
    known: dict[str, tuple[int, int]] = {k: (v, v) for k, v in binding.values.items()}
    known.update({"bdim.x": (bx, bx), "bdim.y": (by, by), "bdim.z": (bz, bz),
                  "tid.x": (0, bx - 1), "tid.y": (0, by - 1), "tid.z": (0, bz - 1)})
    for axis, g in zip("xyz", (gx, gy, gz)):
        if g is not None:
            known[f"gdim.{axis}"] = (g, g)
            known[f"bid.{axis}"] = (0, g - 1)
    return _interval(poly, known, facts.opaque, 0)


def _interval(poly: Poly, known: Mapping[str, tuple[int, int]], opaque: Mapping[str, Opaque],
              depth: int) -> tuple[int, int] | None:
    if depth > 32:
        return None
    lo = hi = 0
    for m, c in poly.terms:
        term = (c, c)
        for s in m:
            iv = known.get(s)
            if iv is None:
                entry = opaque.get(s)
                iv = _recipe_interval(entry, known, opaque, depth + 1) if entry is not None else None
            if iv is None:
                return None
            products = [a * b for a in term for b in iv]
            term = (min(products), max(products))
        lo, hi = lo + term[0], hi + term[1]
    return lo, hi


def _recipe_interval(entry: Opaque, known: Mapping[str, tuple[int, int]], opaque: Mapping[str, Opaque],
                     depth: int) -> tuple[int, int] | None:
    recipe = entry.recipe
    if recipe is None:
        return None
    if recipe[0] == "select":
        a, b = _interval(recipe[4], known, opaque, depth), _interval(recipe[5], known, opaque, depth)
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    op, x, y = recipe
    yv = _interval(y, known, opaque, depth)
    xv = _interval(x, known, opaque, depth)
    if op == "&":
        # A non-negative mask bounds the result whatever the other operand is.
        masks = [v for v in (xv, yv) if v is not None and v[0] >= 0]
        return (0, min(v[1] for v in masks)) if masks else None
    if op == "%":
        if yv is None or yv[0] <= 0:
            return None
        bound = yv[1] - 1
        return (0, bound) if xv is not None and xv[0] >= 0 else (-bound, bound)
    if xv is None or yv is None:
        return None
    if op == "/" and yv[0] > 0:
        ends = [a // b if a >= 0 else -((-a) // b) for a in xv for b in yv]
        return min(ends), max(ends)
    if op == ">>" and yv[0] >= 0 and xv[0] >= 0:
        return xv[0] >> yv[1], xv[1] >> yv[0]
    if op in ("min", "max"):
        f = min if op == "min" else max
        return f(xv[0], yv[0]), f(xv[1], yv[1])
    return None


def shared_combine_loops(facts: KernelFacts) -> tuple[Reduction, ...]:
    """The looped ``shared_tree`` reductions plus every other loop that combines a shared array's
    slots in place (a slot written from another slot of the same array in the same loop): trees the
    analysis did not recognise by their update (a 2-D tree, a counted loop with ``pow``), candidates
    for a transformation to prove or refuse."""
    found = [r for r in facts.reductions if r.kind == "shared_tree" and r.loop is not None]
    seen = {(r.target, r.loop) for r in found}
    for w in facts.accesses:
        if w.space != "shared" or not w.writes or not w.loops:
            continue
        loop = w.loops[-1]
        if (w.array, loop) in seen:
            continue
        if any(r.array == w.array and r.reads and r.loops and r.loops[-1] == loop and r.index != w.index
               for r in facts.accesses if r.space == "shared"):
            found.append(Reduction("shared_tree", w.array, w.op or "+", w.line, w.user_line, loop))
            seen.add((w.array, loop))
    return tuple(found)


def threads_cooperate(facts: KernelFacts) -> bool:
    """The kernel's threads work together: a barrier, a warp intrinsic, shared memory or an atomic.
    A rewrite that regroups threads into other blocks or warps must leave such a kernel alone."""
    return bool(facts.syncs or facts.shuffles or any(a.space == "shared" for a in facts.accesses)
                or any(a.kind == "atomic" for a in facts.accesses))


def helper_reading_thread_index(facts: KernelFacts, root: Node, src: bytes) -> str | None:
    """A function the kernel's accesses go through that reads the thread or block index itself (a
    rewrite that renames the kernel's own indices would not reach it), or None."""
    helpers = {name for a in facts.accesses for name in a.via}
    for name, node, _head in function_definitions(root, src):
        if name in helpers and _THREAD_INDEX.search(node_text(src, node)):
            return name
    return None


_THREAD_INDEX = re.compile(r"\b(threadIdx|blockIdx|gridDim|blockDim)\b")


def block_strided_loops(facts: KernelFacts) -> tuple[LoopFact, ...]:
    """Loops whose iterations the threads of a block share out (``for (i = tid + c; i < n; i += blockDim.x)``):
    the start is ``tid.x`` plus a term, the step is ``bdim.x``, and that term and the bound are polynomials in
    neither the thread, the block's width nor an opaque value, so each value of the range is taken by exactly
    one thread of the block, whatever its width."""
    found = []
    width = Poly.sym("bdim.x")
    for loop in facts.loops:
        if loop.var is None or loop.start is None or loop.step is None or loop.bound is None or loop.step != width:
            continue
        offset = loop.start - Poly.sym("tid.x")
        if any(s.startswith(("tid.", "bdim.", "gdim.")) or is_opaque(s) for s in offset.symbols | loop.bound.symbols):
            continue
        found.append(loop)
    return tuple(found)


def global_index(axis: str) -> Poly:
    """``blockIdx.a * blockDim.a + threadIdx.a``."""
    return Poly.sym(f"bdim.{axis}") * Poly.sym(f"bid.{axis}") + Poly.sym(f"tid.{axis}")


def grid_threads(axis: str) -> Poly:
    """``gridDim.a * blockDim.a``: the launch's threads along an axis."""
    return Poly.sym(f"bdim.{axis}") * Poly.sym(f"gdim.{axis}")


def outside_global_index(poly: Poly | None, axes: tuple[str, ...], opaque: Mapping[str, Opaque],
                         grid: bool = True, depth: int = 0) -> bool:
    """Whether ``poly`` reads a builtin index other than through the global indices along ``axes``
    (``blockIdx.a * blockDim.a + threadIdx.a``) and, when ``grid``, the launch's threads along them
    (``gridDim.a * blockDim.a``): a thread's own position in its block or its block's position on
    their own, or any index along another axis."""
    if poly is None or depth > 32:
        return True
    rest = poly
    for axis in axes:
        along = rest.coefficient(f"tid.{axis}")
        if along is None or any(s.startswith(("tid.", "bid.")) for s in along.symbols):
            return True
        rest = rest - along * global_index(axis)
    for monomial, _ in rest.terms:
        names = set(monomial)
        for axis in axes:
            if grid and {f"bdim.{axis}", f"gdim.{axis}"} <= names:
                names -= {f"bdim.{axis}", f"gdim.{axis}"}
        if any(n.startswith(("tid.", "bid.", "bdim.", "gdim.")) for n in names):
            return True
        for n in names:
            entry = opaque.get(n)
            if entry is not None and entry.recipe is not None:
                parts = [x for x in entry.recipe if isinstance(x, Poly)]
                if any(outside_global_index(x, axes, opaque, grid, depth + 1) for x in parts):
                    return True
            elif entry is not None and entry.deps:
                # A value made from the thread's index in a way the analysis does not model (a load at
                # it, a conversion): how it depends on the index is not known.
                return True
    return False


def threads_differ_only_by(facts: KernelFacts, axes: tuple[str, ...] = ("x",), grid: bool = True) -> str | None:
    """Why the kernel's threads may differ by more than their global indices along ``axes`` (so that
    regrouping them into other blocks would change what one of them does), or None. They must not
    cooperate (no barrier, shared memory or warp-level operation), read no index through a
    cooperative group, and read the builtins only as ``blockIdx.a * blockDim.a + threadIdx.a`` (and,
    when ``grid``, ``gridDim.a * blockDim.a``)."""
    if facts.syncs:
        return "the kernel has barriers: its threads cooperate within a block"
    if facts.shuffles:
        return "the kernel uses warp-level operations: which threads share a warp matters"
    if any(a.space == "shared" for a in facts.accesses):
        return "the kernel uses shared memory: its threads cooperate within a block"
    if facts.implicit_indices:
        return f"the kernel reads its thread index through a cooperative group (`{facts.implicit_indices[0]}`)"
    for use in facts.index_uses:
        if outside_global_index(use.value, axes, facts.opaque, grid):
            where = f" (in `{use.via[-1]}`)" if use.via else ""
            return (f"`{use.text}` at line {(use.user_line or 0) + 1}{where} reads the thread or block index other "
                    f"than as the global index along {' and '.join(axes)}")
    return None


def index_bound(facts: KernelFacts, axis: str = "x") -> Poly | None:
    """The bound ``N`` that the guards of every global access put on the global index along ``axis``
    (``i < N`` around or before each of them), the same for all; None when some access runs
    without it or the accesses are bounded differently."""
    gx = global_index(axis)
    bound = None
    found = False
    for a in facts.accesses:
        if a.space != "global":
            continue
        bounds = [b for c in facts.constraints(a) if (b := c.upper_bound(gx)) is not None]
        if not bounds or (found and bound not in bounds):
            return None
        if not found:
            bound, found = bounds[0], True
    return bound if found else None
