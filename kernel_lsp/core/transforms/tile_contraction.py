"""Dot-product loops staged through shared-memory tiles.

GEMM-like kernels (each thread an output element, a loop ``k`` over ``A[i,k] * B[k,j]`` in any
layout), batched contractions and all-pairs interactions (n-body) read every operand element
from global memory once per thread that uses it. When an operand's index depends on only one of
the block's thread dimensions (a row of ``A`` is the same for every ``threadIdx.x``), or on none
(the ``j`` body of n-body is the same for the whole block), the threads of a block share it: the
rewrite walks the loop in tiles of ``TK`` iterations, the block loads each such operand's tile
once into shared memory, cooperatively and in the order that makes the global reads coalesced
(consecutive threads on the operand's unit-stride axis), and the loop body reads the tile.
Each thread still runs the original body in ascending ``k`` order, so every sum is computed in
the same order as before.

A kernel that already tiles keeps its own shared arrays, barriers and warp operations: the tiles
fit beside its shared memory, and none of its barriers or warp operations may sit in the statement
that holds the loop (that statement is predicated below); the register-blocked rewrites, whose
threads each run several original threads, are offered only for kernels whose threads do not
cooperate.

Barriers need every thread of the block, so the guards around the loop (``if (i < n && j < m)``,
``if (i >= n) return;``) are split: the guard becomes a predicate, the statements before and
after the loop run under it (their declarations hoisted so their names stay in scope), and the
tiled loop runs in every thread, computing only under the predicate. A tile element is loaded
only when a thread that reads it is active (a per-row or per-column flag in shared memory, set
by the active threads before the loop) and its iteration is inside the loop's range; otherwise
the tile is zero-filled and never read. The loads' addresses are the analysis' affine index
with the thread index replaced by the tile row: nothing the original did not read is read.

Further rewrites add register blocking (``BLOCK_SHAPES``): each thread runs the original threads
of ``ry`` blocks along y and ``rx`` along x (blocks ``(4*blockIdx.y + qy, 4*blockIdx.x + qx)``),
their statements copied with their names renamed and scopes merged, one loop over k for all
copies, so a tile shared along y (``B[k][j]`` of a GEMM) is read once from shared memory for the
copies along y, one shared along x (``A[i][k]``) once for those along x: a 4x4 micro-tile does
sixteen products for eight shared-memory reads. Where every copy is active the loop runs
without their predicates. The launch stays as it is: the blocks past ``gridDim / 4`` return at
once (the kernel may read ``gridDim``, which a smaller grid would change). It needs, besides the
above: a 2-D block of at most 256 threads, at least four blocks along each blocked axis, a tile
shared along each, no shared memory of the kernel's own, no name declared twice, no call other
than math functions (a helper would see the physical block), no ``return`` after the loop, and
``blockIdx``/``gridDim`` used only through their fields. A block of more than 256 threads (too
few registers per thread to block across blocks: at 1024 threads a 4x1 micro-tile did not launch)
is coarsened within itself instead (``WITHIN_BLOCK_SHAPES``): launched 4x4 or 2x2 times smaller
with the same grid, each thread runs the original threads ``(ty + qy*by', tx + qx*bx')`` of its
block, reading ``blockDim`` as the original block and the plain tiles; ``threadIdx``/``blockDim``
used only through their fields, and at least 64 threads left.

Every step's tile elements are read into registers before any is stored to shared memory, so a
thread's global reads of all the tiles are in flight together.

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a launch spec with one block shape at every size (2-D at most), distinct arrays, a complete
  analysis, no barrier or warp intrinsic in the kernel yet;
- the loop: a ``for`` with a unit step, no loop around it or inside it, no early exit, calling
  nothing unknown, bounds uniform across the block (no thread index in them) and computable
  from the parameters;
- the path from the kernel body to the loop is blocks and ``if``\\ s without ``else``; no
  ``return`` before the loop except a leading ``if (…) return;``;
- each tiled operand: a read of a global array (or a struct member) that the kernel never
  writes, directly in the loop's body (not under a condition), its index affine in the loop's
  counter with a block-uniform stride, depending on at most one thread dimension and leaving
  another with more than one thread (the reuse), computable from parameters and builtins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.analysis import (
    Access, Binding, KernelFacts, LoopFact, Opaque, assigned_names, declared_anywhere, evaluate, is_pure_math,
    thread_dependence, threads_cooperate, trip_count,
)
from kernel_lsp.core.poly import Poly, is_iteration, is_opaque
from kernel_lsp.core.rules.base import MAX_THREADS_PER_BLOCK, Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError
from kernel_lsp.core.transforms.counted_loop import CountedLoop, counted_loop
from kernel_lsp.core.transforms.emit import BodyEdit, UserText, emit, expands_to, node_at, parse

#: Static ``__shared__`` memory one block may declare (CUDA's limit without opt-in).
STATIC_SMEM_BYTES = 48 * 1024
#: Shared memory per SM on an H200 (228 KB); tiles are kept small enough for several blocks.
SMEM_PER_SM_BYTES = 228 * 1024
#: The tile budget per block: a quarter of the SM, so four blocks can be resident.
TILE_BUDGET_BYTES = min(STATIC_SMEM_BYTES, SMEM_PER_SM_BYTES // 4)
#: Iterations per tile for operands shared along one thread dimension (a warp's width: each
#: row of a tile is one 128-byte line of a float operand).
DEFAULT_TK = 32

#: Unroll factor for the fixed-trip loop over a tile longer than DEFAULT_TK (a whole unroll of
#: hundreds of iterations only grows the code).
UNROLL_LONG_TILE = 8

_BUILTINS = {"tid.x": "threadIdx.x", "tid.y": "threadIdx.y", "bid.x": "blockIdx.x", "bid.y": "blockIdx.y",
             "bid.z": "blockIdx.z", "bdim.x": "blockDim.x", "bdim.y": "blockDim.y", "bdim.z": "blockDim.z",
             "gdim.x": "gridDim.x", "gdim.y": "gridDim.y", "gdim.z": "gridDim.z"}
_IDENT = re.compile(r"[A-Za-z_]\w*\Z")
_EXITS = ("break_statement", "continue_statement", "return_statement", "goto_statement")


class Refused(Exception):
    """A legality condition that does not hold; its message is the reason."""


@dataclass(frozen=True)
class _Tile:
    array: str
    field: str | None
    index: Poly
    dim: str | None
    """The thread dimension the operand moves with (``tid.x``/``tid.y``), None: the same for the block."""
    elem_type: str
    elem_bytes: int
    accesses: tuple[Access, ...]
    spans: tuple[tuple[int, int], ...]
    """The text replaced by a tile read (the access, its member included)."""
    k_fastest: bool
    """Load with consecutive threads on consecutive iterations (the operand's unit stride is along k)."""


@dataclass(frozen=True)
class _Plan:
    loop: LoopFact
    tiles: tuple[_Tile, ...]
    block: tuple[int, int, int]
    tk: int
    chain: tuple[Node, ...]
    """The kernel body, then the blocks and `if`s down to the loop (the loop last)."""
    counted: CountedLoop
    """The loop's counter: where it starts and steps, however the loop is written."""
    narrow: bool = False
    """Every index the tiles compute fits in 32 bits at every size of the spec."""


class _Unmapped(Exception):
    """A statement the rewrite copies has no counterpart in the user's text (inside a macro)."""


class PolyEmitter:
    """C expressions for the analysis' polynomials, with thread indices and counters replaced."""

    def __init__(self, facts: KernelFacts, src: bytes, kernel: Node, narrow: bool = False):
        self.facts = facts
        # 32-bit arithmetic where the spec's sizes prove every value fits (fewer registers).
        self.int_type, self.suffix = ("int", "") if narrow else ("long long", "LL")
        self.params = {name for name, _, _ in facts.params}
        body = kernel.child_by_field_name("body")
        self.assigned = assigned_names(body, src)
        self.declared = declared_anywhere(body, src) if body is not None else set()

    def poly(self, poly: Poly, subs: dict[str, str]) -> str:
        parts = []
        for monomial, coefficient in poly.terms:
            factors = [self.symbol(s, subs) for s in monomial]
            c = f"{coefficient}{self.suffix}"
            parts.append("*".join([c, *factors]) if factors else c)
        return "(" + " + ".join(parts) + ")" if parts else f"0{self.suffix}"

    def symbol(self, s: str, subs: dict[str, str]) -> str:
        if s in subs:
            return f"({self.int_type})({subs[s]})"
        if s in _BUILTINS:
            return f"({self.int_type}){_BUILTINS[s]}"
        if is_iteration(s):
            raise Refused("the index uses the counter of another loop")
        if is_opaque(s):
            return self.opaque(self.facts.opaque.get(s), subs)
        if s in self.params and s not in self.assigned:
            return f"({self.int_type}){s}"
        raise Refused(f"the index uses `{s}`, which is not a parameter the kernel leaves unchanged")

    def opaque(self, entry: Opaque | None, subs: dict[str, str]) -> str:
        if entry is None:
            raise Refused("the index has a term the analysis does not model")
        if entry.recipe is not None:
            if entry.recipe[0] == "select":
                _, left, cmp, right, a, b = entry.recipe
                return (f"({self.poly(left, subs)} {cmp} {self.poly(right, subs)} ? "
                        f"{self.poly(a, subs)} : {self.poly(b, subs)})")
            op, a, b = entry.recipe
            if op in ("min", "max"):
                return f"{op}({self.poly(a, subs)}, {self.poly(b, subs)})"
            return f"({self.poly(a, subs)} {op} {self.poly(b, subs)})"
        text = entry.text.strip()
        # A name the kernel neither declares nor assigns is a macro, a constant or an unchanged
        # parameter: the same value wherever it is written.
        if entry.deps or not _IDENT.match(text) or text in self.declared or text in self.assigned:
            raise Refused(f"the index has a term (`{text}`) that cannot be recomputed elsewhere in the kernel")
        return f"({self.int_type})({text})"


def _find(node: Node, types: tuple[str, ...]) -> list[Node]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if n.type in types:
            out.append(n)
        stack.extend(n.children)
    return out


def _chain(kernel_body: Node, loop_node: Node) -> tuple[Node, ...]:
    chain = [loop_node]
    node = loop_node.parent
    while node is not None and node != kernel_body:
        chain.append(node)
        node = node.parent
    if node is None:
        raise Refused("the loop is not inside the kernel's body")
    chain.reverse()
    for parent, child in zip([kernel_body, *chain], chain):
        if parent.type == "compound_statement":
            continue
        if parent.type == "if_statement":
            if parent.child_by_field_name("alternative") is not None:
                raise Refused("the loop is under an `if` with an `else`")
            if parent.child_by_field_name("consequence") != child:
                raise Refused("the loop is not in the consequence of its `if`")
            cond = parent.child_by_field_name("condition")
            if cond is None or any(c.type in ("declaration", "init_statement") for c in cond.named_children):
                raise Refused("an `if` on the way to the loop declares a variable in its condition")
            continue
        raise Refused(f"the loop is inside a `{parent.type}`, not only blocks and `if`s")
    return (kernel_body, *chain)


def _exit_guard(stmt: Node, src: bytes) -> str | None:
    """The condition of ``if (c) return;`` (or ``{ return; }``), else None."""
    if stmt.type != "if_statement" or stmt.child_by_field_name("alternative") is not None:
        return None
    body = stmt.child_by_field_name("consequence")
    if body is not None and body.type == "compound_statement" and body.named_child_count == 1:
        body = body.named_children[0]
    if body is None or body.type != "return_statement" or body.named_child_count:
        return None
    cond = stmt.child_by_field_name("condition")
    return _text(src, cond) if cond is not None else None


_INT32_MAX = 2**31 - 1


def _nonnegative(poly: Poly, opaque, depth: int = 0) -> bool:
    """Every coefficient of ``poly`` and of the recipes of its opaque terms is >= 0, so with
    non-negative symbols each partial sum is at most the whole."""
    if depth > 8 or any(c < 0 for _, c in poly.terms):
        return False
    for s in poly.symbols:
        entry = opaque.get(s) if is_opaque(s) else None
        if entry is None or entry.recipe is None:
            continue
        if entry.recipe[0] not in ("/", "%", "min", "max", ">>", "&"):
            return False
        if not all(_nonnegative(x, opaque, depth + 1) for x in entry.recipe[1:]):
            return False
    return True


def _fits_int32(facts: KernelFacts, loop: LoopFact, tiles, binding: Binding, trips: int) -> bool:
    """At ``binding``'s size, the loop's bounds and every tile index, at the largest thread, block
    and iteration (where a polynomial with non-negative coefficients is largest), fit in an int."""
    if binding.grid is None:
        return False
    env = {**binding.values}
    for axis, i in zip("xyz", range(3)):
        env[f"bdim.{axis}"], env[f"gdim.{axis}"] = binding.block[i], binding.grid[i]
        env[f"tid.{axis}"], env[f"bid.{axis}"] = binding.block[i] - 1, binding.grid[i] - 1
    env[loop.trip_symbol] = max(trips - 1, 0)
    if any(v < 0 for v in binding.values.values()):
        return False
    for poly in (loop.start, loop.bound, *(t.index for t in tiles)):
        if not _nonnegative(poly, facts.opaque):
            return False
        value = evaluate(poly, env, facts.opaque)
        if value is None or not 0 <= value <= _INT32_MAX // 2:
            return False
    return True


def _under_condition(node: Node, stop: Node) -> bool:
    n = node.parent
    while n is not None and n != stop:
        if n.type in ("if_statement", "conditional_expression", "switch_statement", "for_statement",
                      "while_statement", "do_statement"):
            return True
        if n.type == "binary_expression":
            op = n.child_by_field_name("operator")
            if op is not None and op.type in ("&&", "||"):
                return True
        n = n.parent
    return n is None


class TileContraction(Rule):
    name = "tile-contraction"
    technique = "shared-memory-tiling"
    summary = "a dot-product loop's operands shared by a block's threads staged through shared-memory tiles"

    # ---- legality ------------------------------------------------------------------------

    def plan(self, ctx: RuleContext) -> tuple[_Plan | None, str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        if ctx.spec is None:
            return None, "needs a launch spec (the tile sizes come from its block and sizes)"
        if not ctx.distinct_arrays():
            return None, "the spec does not allocate every pointer parameter on its own (they may alias)"
        block = ctx.constant_block()
        if block is None:
            return None, "the block shape is not the same at every size of the spec"
        if block[2] != 1 or "tid.z" in facts.thread_dims:
            return None, "the block is three-dimensional"
        if facts.implicit_indices:
            return None, f"the kernel reads its thread index through a cooperative group (`{facts.implicit_indices[0]}`)"
        try:
            bindings = [Binding.from_spec(ctx.spec, v) for v in [None, *range(len(ctx.spec.variants))]]
        except (SpecError, ValueError, ZeroDivisionError):
            return None, "the spec's launch does not evaluate"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        if kernel is None or kernel.child_by_field_name("body") is None:
            return None, "the kernel's definition was not found in the preprocessed view"
        reasons = []
        # The kernel's own shared memory stays beside the tiles.
        used = sum(d.size_bytes or 0 for d in ctx.kernel.shared if not d.is_extern) + max(
            (launch.dynamic_smem_bytes for launch in ctx.launches()), default=0)
        for loop in facts.loops:
            try:
                plan = self._loop_plan(facts, loop, block, bindings, src, root, kernel, used)
                _Writer(plan, facts, src, PolyEmitter(facts, src, kernel, plan.narrow)).text()
                return plan, ""
            except Refused as exc:
                reasons.append(f"the loop at line {(loop.user_line or 0) + 1}: {exc}")
        return None, "; ".join(reasons) or "the kernel has no loop"

    def _loop_plan(self, facts, loop, block, bindings, src, root, kernel, used: int = 0) -> _Plan:
        counted, why = counted_loop(loop, node_at(src, root, loop.span), facts.body_span, src)
        if counted is None:
            raise Refused(why)
        if loop.step is None or loop.step.constant != 1 or loop.start is None or loop.bound is None:
            raise Refused("its step is not 1 or its bounds are unknown")
        if loop.parent is not None or any(other.parent == loop.id for other in facts.loops):
            raise Refused("it is nested in or contains another loop")
        if loop.calls_unknown:
            raise Refused("it calls code the analysis does not see")
        if thread_dependence(loop.start, facts.opaque) or thread_dependence(loop.bound, facts.opaque):
            raise Refused("its bounds differ between the threads of a block")
        loop_node = node_at(src, root, loop.span)
        if loop_node is None:
            raise Refused("its statement was not found")
        body = kernel.child_by_field_name("body")
        chain = _chain(body, loop_node)
        loop_body = loop_node.child_by_field_name("body")
        if loop_body is None or _find(loop_body, _EXITS):
            raise Refused("it has an early exit (break, continue, return or goto)")
        self._header(counted, loop, src)
        top = chain[1] if len(chain) > 1 else loop_node  # the statement of the body that holds the loop
        for b in facts.barriers:
            if top.start_byte <= b.span[0] < top.end_byte:
                raise Refused(f"the kernel's barrier `{b.text}` at line {(b.user_line or 0) + 1} is in the statement that "
                               "holds the loop (the rewrite predicates that statement: the barrier would become conditional)")
        for w in facts.warp_operations:
            if top.start_byte <= w.span[0] < top.end_byte:
                raise Refused(f"the warp-level operation `{w.text}` is in the statement that holds the loop (its lanes "
                               "would be predicated)")
        if _find(body, ("goto_statement",)):
            raise Refused("the kernel has a `goto`, which could jump past the barriers")
        for ret in _find(body, ("return_statement",)):
            if ret.start_byte < loop_node.end_byte and not self._leading_exit(ret, chain, src):
                raise Refused("a `return` before it would leave threads out of the barriers")
        emitter = PolyEmitter(facts, src, kernel)
        emitter.poly(loop.start, {})
        emitter.poly(loop.bound, {})
        # A ``while`` loop's one step statement is the only assignment of its counter in its body.
        if counted.step_statement is None and loop.var in assigned_names(loop_body, src):
            raise Refused("its body assigns the loop variable")
        tiles = self._tiles(facts, loop, block, src, root, loop_node, emitter)
        trips = []
        for binding in bindings:
            n = trip_count(facts, loop, binding)
            if n is None:
                raise Refused("its trip count does not evaluate at every size of the spec")
            trips.append(n)
        tk = self._tile_k(tiles, block, max(trips), used)
        if tk is None:
            raise Refused("its tiles do not fit the shared memory budget")
        narrow = all(_fits_int32(facts, loop, tiles, b, n) for b, n in zip(bindings, trips))
        return _Plan(loop, tiles, block, tk, chain, counted, narrow)

    @staticmethod
    def _leading_exit(ret: Node, chain: tuple[Node, ...], src: bytes) -> bool:
        """``ret`` is an ``if (…) return;`` directly in one of the blocks on the way to the loop
        (the rewrite turns it into a predicate)."""
        stmt = ret.parent
        while stmt is not None and stmt.type != "if_statement":
            stmt = stmt.parent
        return stmt is not None and _exit_guard(stmt, src) is not None and any(
            stmt.parent == node for node in chain if node.type == "compound_statement")

    @staticmethod
    def _header(counted: CountedLoop, loop: LoopFact, src: bytes) -> None:
        cond, init = counted.test, counted.initializer
        if cond is None or cond.type != "binary_expression":
            raise Refused("its test is not an upper bound of its counter")
        left = cond.child_by_field_name("left")
        op = cond.child_by_field_name("operator")
        if left is None or _text(src, left) != loop.var or op is None or op.type not in ("<", "<="):
            raise Refused("its test is not an upper bound of its counter")
        if init is not None and init.type == "declaration":
            decls = init.children_by_field_name("declarator")
            if len(decls) != 1 or decls[0].type != "init_declarator":
                raise Refused("its initializer declares more than the variable")

    def _tiles(self, facts, loop, block, src, root, loop_node, emitter) -> tuple[_Tile, ...]:
        trip = loop.trip_symbol
        groups: dict[tuple, list[Access]] = {}
        for a in facts.accesses:
            if a.loops != (loop.id,) or a.space != "global" or a.kind != "read" or a.via:
                continue
            groups.setdefault((a.array, a.field, a.index), []).append(a)
        tiles, why = [], []
        extent = {"tid.x": block[0], "tid.y": block[1]}
        for (array, member, index), accesses in groups.items():
            stride = index.coefficient(trip)
            if stride is None or not stride.terms or index.degree_in(trip) != 1:
                continue
            if thread_dependence(stride, facts.opaque):
                why.append(f"`{accesses[0].text}` moves by a different stride in each thread")
                continue
            deps = thread_dependence(index, facts.opaque) - {"tid.z"}
            if len(deps) > 1:
                continue
            dim = next(iter(deps), None)
            others = [d for d in extent if d != dim]
            if not any(extent[d] > 1 for d in others):
                continue
            problem = self._operand_problem(facts, array, member, accesses, src, root, loop_node)
            if problem:
                why.append(f"`{accesses[0].text}`: {problem}")
                continue
            spans = []
            for a in accesses:
                end = a.span[1]
                if member is not None:
                    tail = re.match(rb"\s*\.\s*" + re.escape(member.encode()) + rb"\b", src[end:])
                    if tail is None:
                        break
                    end += tail.end()
                spans.append((a.span[0], end))
            if len(spans) != len(accesses):
                why.append(f"`{accesses[0].text}`: its member access was not found")
                continue
            try:
                emitter.poly(index, {trip: "0", **({dim: "0"} if dim else {})})
            except Refused as exc:
                why.append(f"`{accesses[0].text}`: {exc}")
                continue
            k_fastest = stride.constant in (1, -1) or dim is None or index.coefficient(dim) != Poly.const(1)
            if member is not None:
                # The member's declared type, whatever the struct is called.
                elem_type = f"decltype({array}->{member})"
            else:
                elem_type = re.sub(r"\b(const|volatile)\b", "", accesses[0].elem_type).strip()
            if not elem_type or "*" in elem_type:
                why.append(f"`{accesses[0].text}`: its element type is not known")
                continue
            size = accesses[0].field_bytes if member is not None else accesses[0].elem_bytes
            tiles.append(_Tile(array, member, index, dim, elem_type, size or 8, tuple(accesses), tuple(spans), k_fastest))
        tiled = {a for t in tiles for a in t.accesses}
        for a in facts.accesses:
            moves = trip in a.index.symbols
            if tiles and a.loops == (loop.id,) and a.space == "global" and a.reads and a not in tiled and moves:
                raise Refused(f"`{a.text}` moves with the loop and is not shared by the block: the loop's traffic "
                               "would stay in global memory")
        if not tiles:
            raise Refused("; ".join(why) or "no operand it reads is shared by the threads of a block "
                           "(each moves with the loop and with at most one thread dimension)")
        return tuple(tiles)

    @staticmethod
    def _operand_problem(facts, array, member, accesses, src, root, loop_node) -> str | None:
        if array in facts.escaped:
            return "its address escapes to code the analysis does not see"
        params = {name for name, _, is_pointer in facts.params if is_pointer}
        if array not in params:
            return "not a pointer parameter"
        for a in facts.accesses:
            if a.array == array and a.writes and (member is None or a.field is None or a.field == member):
                return "the kernel writes it"
        loop_body = loop_node.child_by_field_name("body")
        for a in accesses:
            node = node_at(src, root, a.span)
            if node is None or _under_condition(node, loop_body):
                return "it is read under a condition inside the loop"
        return None

    @staticmethod
    def _tile_k(tiles, block, max_trips: int, used: int = 0) -> int | None:
        threads = block[0] * block[1]
        if threads > MAX_THREADS_PER_BLOCK:
            return None
        shared_only = all(t.dim is None for t in tiles)
        # Operands shared by the whole block: one element per thread per tile; others: a warp's width.
        tk = max(DEFAULT_TK, threads) if shared_only else DEFAULT_TK
        limit = 1
        while limit < max(max_trips, 1):
            limit *= 2
        tk = max(1, min(tk, limit))
        while tk >= 1:
            total = 0
            for t in tiles:
                rows = {"tid.x": block[0], "tid.y": block[1], None: 1}[t.dim]
                total += (rows + (1 if t.dim == "tid.x" else 0)) * (tk + (1 if t.dim == "tid.y" else 0)) * t.elem_bytes
            if total + 2 * 4 * (block[0] + block[1]) + used <= TILE_BUDGET_BYTES:
                return tk
            tk //= 2
        return None

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        names = ", ".join(f"`{t.accesses[0].text}`" + (f".{t.field}" if t.field else "") for t in plan.tiles)
        return True, (f"the loop at line {(plan.loop.user_line or 0) + 1} has uniform bounds and reads {names}, "
                      "never written by the kernel, each shared by the block's threads along a dimension it does not "
                      f"move with: tiles of {plan.tk} iterations in shared memory")

    # ---- rewrite -------------------------------------------------------------------------

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        emitter = PolyEmitter(facts, src, kernel, plan.narrow)
        new = _Writer(plan, facts, src, emitter).text()
        top = plan.chain[0]
        source = self._own(ctx, top, new, lambda user: _Writer(plan, facts, src, emitter, user).text())
        expanded = source is None
        if source is None:
            edit = BodyEdit(ctx.preprocessed, facts)
            edit.replace(top.start_byte, top.end_byte, new)
            source, expanded = emit(edit, ctx.source, ctx.kernel)
        what = ", ".join(f"`{t.accesses[0].text}`" for t in plan.tiles)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        tiled = Rewrite(source, f"stage {what} through shared-memory tiles of {plan.tk} iterations of the loop at line "
                                f"{(plan.loop.user_line or 0) + 1}, loaded once per block and coalesced; the guard "
                                f"split so every thread reaches the barriers{note}")
        return (tiled, *self._blocked(ctx, plan, kernel, src))

    @staticmethod
    def _own(ctx: RuleContext, top: Node, new: str, write) -> str | None:
        """The file with ``top`` replaced by the same rewrite written from the user's own text
        (``write(user)``, macros as written), or None when a statement it copies does not map
        there or the result does not expand to ``new``."""
        user = UserText(ctx.preprocessed, ctx.facts, ctx.source, ctx.kernel)
        where = user.user_range(top.start_byte, top.end_byte)
        if where is None:
            return None
        try:
            own = write(user)
        except (_Unmapped, Refused):
            return None
        if not expands_to(own, new, ctx.preprocessed):
            return None
        data = ctx.source.encode("utf-8")
        return (data[:where[0]] + own.encode("utf-8") + data[where[1]:]).decode("utf-8")

    def _blocked(self, ctx: RuleContext, plan: _Plan, kernel: Node, src: bytes) -> list[Rewrite]:
        """The same tiles with each thread computing the outputs of several blocks, one rewrite per
        micro-tile of BLOCK_SHAPES proven legal (none when none is)."""
        facts = ctx.facts
        launches = ctx.launches()
        if not launches:
            return []
        if threads_cooperate(facts):
            # A thread that runs the work of several would have to take part in their barriers, shared slots
            # and warp operations for each of them.
            return []
        out = []
        for shape in (*BLOCK_SHAPES, *WITHIN_BLOCK_SHAPES):
            if blocking_refusal(plan, facts, src, kernel, (launches[0].grid[0], launches[0].grid[1]), shape) is not None:
                continue
            override = None
            if shape.within:
                launch = ctx.spec.launch
                override = {"grid": list(launch.grid), "block": list(shape.block(plan.block)),
                            "dynamic_smem": launch.dynamic_smem}
                if not ctx.launch_ok(override):
                    continue
            emitter = PolyEmitter(facts, src, kernel, plan.narrow)
            try:
                new = _BlockedWriter(plan, facts, src, emitter, kernel, shape=shape).text()
            except Refused:
                continue
            source = self._own(ctx, plan.chain[0], new,
                               lambda user: _BlockedWriter(plan, facts, src, emitter, kernel, user, shape).text())
            if source is None:
                edit = BodyEdit(ctx.preprocessed, facts)
                edit.replace(plan.chain[0].start_byte, plan.chain[0].end_byte, new)
                source, _ = emit(edit, ctx.source, ctx.kernel)
            line = (plan.loop.user_line or 0) + 1
            if shape.within:
                bx, by, _ = shape.block(plan.block)
                out.append(Rewrite(source, f"the tiles of the loop at line {line} with each thread computing the outputs of "
                                           f"{shape.ry * shape.rx} threads of its block (a {shape.ry}x{shape.rx} micro-tile in "
                                           f"registers, each tile element read once for the outputs that share it); "
                                           f"launched with blocks of {bx}x{by} threads", override, variant=shape.variant))
                continue
            axes = " and ".join(f"{r} blocks along {axis}" for axis, r in (("y", shape.ry), ("x", shape.rx)) if r > 1)
            past = " and ".join(f"gridDim.{axis} / {r}" for axis, r in (("y", shape.ry), ("x", shape.rx)) if r > 1)
            out.append(Rewrite(source, f"the tiles of the loop at line {line} with each thread "
                                       f"computing the outputs of {axes} (a {shape.variant} micro-tile in registers, each "
                                       f"tile read once for every output that shares it); the blocks past {past} return "
                                       "at once", variant=shape.variant))
        return out


@dataclass(frozen=True)
class _Load:
    """One tile's load: its element ``kl_e`` of ``total`` goes to ``ref`` (in terms of the coordinates
    ``coords`` declares), the global ``element`` read only where ``guard`` holds (else zero)."""

    ref: str
    total: int
    coords: str
    guard: str
    element: str
    elem_type: str


def _staged(loads: list[_Load], flat: str, threads: int) -> list[str]:
    """Every tile's elements of this step read into registers first, then stored to shared memory.

    A thread's global reads of all the tiles are then in flight together: with a loop per tile, each
    tile's stores wait for its reads before the next tile's reads are issued, so the latency of global
    memory is paid once per tile per step (a register-blocked step has up to eight tiles)."""
    lines = [f"const int kl_f = {flat};"]
    stores = []
    for j, load in enumerate(loads):
        per_thread = -(-load.total // threads)
        inside = "" if load.total % threads == 0 else f"kl_e < {load.total} && "
        lines.append(f"{load.elem_type} kl_g{j}[{per_thread}];")
        lines.append(f"\n#pragma unroll\nfor (int kl_i = 0; kl_i < {per_thread}; kl_i++) {{ "
                     f"const int kl_e = kl_f + kl_i * {threads}; {load.coords} kl_g{j}[kl_i] = ({inside}{load.guard}) ? "
                     f"({load.elem_type})({load.element}) : ({load.elem_type})0; }}")
        store = f"{load.coords} {load.ref} = kl_g{j}[kl_i];"
        if inside:
            store = f"if (kl_e < {load.total}) {{ {store} }}"
        stores.append(f"\n#pragma unroll\nfor (int kl_i = 0; kl_i < {per_thread}; kl_i++) {{ "
                      f"const int kl_e = kl_f + kl_i * {threads}; {store} }}")
    return lines + stores


class _Writer:
    """The new text of the statements from the outermost guard down to the loop."""

    def __init__(self, plan: _Plan, facts: KernelFacts, src: bytes, emitter: PolyEmitter, user: UserText | None = None):
        self.plan = plan
        self.facts = facts
        self.src = src
        self.user = user
        """Where copied statements come from: the user's text when given, else the preprocessed one."""
        self.emitter = emitter
        self.on_chain = set(plan.chain)
        self.pred_count = 0
        self.loop_pragma = ""
        self.past_loop = False
        """Set by a subclass's :meth:`loop` once it is emitted: the statements after it then run under
        :meth:`after_loop`'s predicate."""

    def text(self) -> str:
        return self.node(self.plan.chain[0], None)

    def node(self, n: Node, pred: str | None) -> str:
        if n == self.plan.chain[-1]:
            return self.loop(pred)
        if n.type == "if_statement":
            cond = self.t(n.child_by_field_name("condition"))
            name = self.new_pred()
            both = f"{pred} && {cond}" if pred else cond
            return f"{{ const bool {name} = {both};\n{self.node(n.child_by_field_name('consequence'), name)} }}"
        # A block on the way to the loop.
        out = ["{"]
        for child in n.named_children:
            if child in self.on_chain:
                out.append(self.node(child, pred))
                continue
            if child.type.startswith("preproc") and child.next_named_sibling == self.plan.chain[-1]:
                # ``#pragma unroll`` before the loop goes with the loop that still walks k.
                self.loop_pragma = "\n" + self.t(child).strip() + "\n"
                continue
            guard = _exit_guard(child, self.src)
            if guard is not None:
                guard = self.t(child.child_by_field_name("condition"))
            if guard is not None and child.start_byte < self.plan.chain[-1].start_byte:
                name = self.new_pred()
                both = f"{pred} && !{guard}" if pred else f"!{guard}"
                out.append(f"const bool {name} = {both};")
                pred = name
                continue
            out.append(self.predicated(child, pred))
        out.append("}")
        return "\n".join(out)

    def new_pred(self) -> str:
        self.pred_count += 1
        return f"kl_on{self.pred_count}"

    def t(self, node: Node) -> str:
        """A statement's text as the rewrite writes it."""
        return self.span_text(node.start_byte, node.end_byte)

    def span_text(self, lo: int, hi: int) -> str:
        return self.copy(lo, hi)

    def copy(self, lo: int, hi: int, subs: list[tuple[int, int, str]] | tuple = ()) -> str:
        """The text of the preprocessed span [lo, hi) with ``subs`` applied, from the user's text
        when the writer has it (:class:`_Unmapped` when the span does not map there)."""
        if self.user is not None:
            own = self.user.span(lo, hi, subs)
            if own is None:
                raise _Unmapped(lo)
            return own
        out, at = [], lo
        for a, b, new in sorted(subs):
            out.append(self.src[at:a].decode("utf-8"))
            out.append(new)
            at = b
        out.append(self.src[at:hi].decode("utf-8"))
        return "".join(out)

    def after_loop(self, pred: str | None) -> str | None:
        """The predicate of the statements after the loop (the loop's own, unless a subclass narrows it)."""
        return pred

    def predicated(self, stmt: Node, pred: str | None) -> str:
        if self.past_loop:
            pred = self.after_loop(pred)
        text = self.t(stmt)
        if stmt.type.startswith("preproc"):
            # A directive (``#pragma unroll``) keeps a line of its own.
            return "\n" + text.strip() + "\n"
        if pred is None or stmt.type == "comment":
            return text
        if stmt.type != "declaration":
            return f"if ({pred}) {{ {text} }}"
        decls = stmt.children_by_field_name("declarator")
        if not any(d.type == "init_declarator" for d in decls):
            return text
        first = decls[0]
        type_text = self.span_text(stmt.start_byte, first.start_byte).strip()
        hoisted, assigns = [], []
        for d in decls:
            if d.type != "init_declarator":
                hoisted.append(f"{type_text} {self.t(d)};")
                continue
            target, value = d.child_by_field_name("declarator"), d.child_by_field_name("value")
            if value is None or value.type in ("initializer_list", "argument_list") or target.type not in (
                    "identifier", "pointer_declarator"):
                raise Refused("a declaration before the loop cannot be split from its initialiser")
            name = target
            while name.type == "pointer_declarator":
                name = name.child_by_field_name("declarator")
            own_type = type_text if target.type == "pointer_declarator" else re.sub(r"\bconst\b\s*", "", type_text)
            if "auto" in own_type.split() or "&" in own_type:
                raise Refused("a declaration before the loop has no type to hoist")
            hoisted.append(f"{own_type} {self.t(target)};")
            assigns.append(f"{self.t(name)} = {self.t(value)};")
        return " ".join(hoisted) + f" if ({pred}) {{ {' '.join(assigns)} }}"

    def loop(self, pred: str | None) -> str:
        plan, loop = self.plan, self.plan.loop
        node = plan.chain[-1]
        bx, by, _ = plan.block
        tk = plan.tk
        e = self.emitter
        start, trips = e.poly(loop.start, {}), e.poly(loop.bound - loop.start, {})
        lines = ["{"]
        flags: dict[str | None, str] = {}
        dims = {t.dim for t in plan.tiles}
        if pred is not None:
            if "tid.y" in dims:
                lines += [f"__shared__ int kl_rows[{by}];", "if (threadIdx.x == 0) kl_rows[threadIdx.y] = 0;"]
                flags["tid.y"] = "kl_rows[kl_r]"
            if "tid.x" in dims:
                lines += [f"__shared__ int kl_cols[{bx}];", "if (threadIdx.y == 0) kl_cols[threadIdx.x] = 0;"]
                flags["tid.x"] = "kl_cols[kl_r]"
            if flags:
                lines.append("__syncthreads();")
                sets = []
                if "tid.y" in flags:
                    sets.append("kl_rows[threadIdx.y] = 1;")
                if "tid.x" in flags:
                    sets.append("kl_cols[threadIdx.x] = 1;")
                lines.append(f"if ({pred}) {{ {' '.join(sets)} }}")
            if None in dims:
                lines.append(f"const int kl_any = __syncthreads_or({pred});")
                flags[None] = "kl_any"
            elif flags:
                lines.append("__syncthreads();")
        lines.append(f"const {e.int_type} kl_trips = {trips};")
        for n, t in enumerate(plan.tiles):
            lines.append(f"__shared__ {t.elem_type} kl_s{n}{self.shape(t)};")
        lines.append(f"for ({e.int_type} kl_t0 = 0; kl_t0 < kl_trips; kl_t0 += {tk}) {{")
        threads = bx * by
        flat = "(int)(threadIdx.y * blockDim.x + threadIdx.x)" if by > 1 else "(int)threadIdx.x"
        loads: list[_Load] = []
        for n, t in enumerate(plan.tiles):
            rows = {"tid.x": bx, "tid.y": by, None: 1}[t.dim]
            if t.k_fastest:
                r, kk = f"kl_e / {tk}", f"kl_e % {tk}"
            else:
                r, kk = f"kl_e % {rows}", f"kl_e / {rows}"
            subs = {loop.trip_symbol: "kl_t0 + kl_k"}
            if t.dim:
                subs[t.dim] = "kl_r"
            element = self.element_text(t)
            if element is None:
                index = e.poly(t.index, subs)
                element = f"{t.array}[{index}]" + (f".{t.field}" if t.field else "")
            guard = " && ".join(g for g in ("kl_t0 + kl_k < kl_trips", flags.get(t.dim) if pred else None) if g)
            coords = f"const int kl_r = {r}; const int kl_k = {kk};" if t.dim else "const int kl_k = kl_e;"
            loads.append(_Load(self.ref(n, t, "kl_r", "kl_k"), rows * tk, coords, guard, element, t.elem_type))
        lines += _staged(loads, flat, threads)
        lines.append("__syncthreads();")
        compute = self.header(node, start)
        lines.append(f"if ({pred}) {{ {compute} }}" if pred else compute)
        lines.append("__syncthreads();")
        lines.append("}")
        lines.append("}")
        return "\n".join(lines)

    def element_text(self, t: _Tile) -> str | None:
        """The tile's element at iteration ``kl_t0 + kl_k`` as the kernel writes it (its own index
        text, macros kept, the loop variable replaced by that iteration's value), when the index
        names nothing but the variable and parameters the kernel leaves unchanged; else None."""
        loop, e = self.plan.loop, self.emitter
        lo, hi = t.spans[0]
        names = set(re.findall(r"\b[A-Za-z_]\w*\b", self.src[lo:hi].decode("utf-8")))
        allowed = {loop.var, t.array, t.field} | (e.params - e.assigned)
        if t.dim is not None or not names <= allowed:
            return None
        init = self.plan.chain[-1].child_by_field_name("initializer")
        if init is not None and init.type == "declaration":
            var_type = re.sub(r"\b(const|volatile)\b", "", self.span_text(
                init.start_byte, init.children_by_field_name("declarator")[0].start_byte)).strip()
        else:
            var_type = f"decltype({loop.var})"
        value = f"(({var_type})({e.poly(loop.start, {})} + kl_t0 + kl_k))"
        subs = [(m.start() + lo, m.end() + lo, value)
                for m in re.finditer(rb"\b" + re.escape(loop.var.encode()) + rb"\b", self.src[lo:hi])]
        return self.copy(lo, hi, subs)

    def shape(self, t: _Tile) -> str:
        # +1 padding: a tile row read by lanes of different rows, or written along k, falls in other banks.
        bx, by, _ = self.plan.block
        if t.dim == "tid.y":
            return f"[{by}][{self.plan.tk + 1}]"
        if t.dim == "tid.x":
            return f"[{self.plan.tk}][{bx + 1}]"
        return f"[{self.plan.tk}]"

    def ref(self, n: int, t: _Tile, r: str, kk: str) -> str:
        if t.dim == "tid.y":
            return f"kl_s{n}[{r}][{kk}]"
        if t.dim == "tid.x":
            return f"kl_s{n}[{kk}][{r}]"
        return f"kl_s{n}[{kk}]"

    def header(self, node: Node, start: str) -> str:
        """The original loop over one tile: its header with the first value and the bound moved to
        the tile, its body reading the tiles."""
        loop, tk = self.plan.loop, self.plan.tk
        counted = self.plan.counted
        init = counted.initializer
        first = f"{start} + kl_t0"
        if init is not None and init.type == "declaration":
            d = init.children_by_field_name("declarator")[0]
            type_text = self.span_text(init.start_byte, d.start_byte).strip()
            init_text = f"{type_text} {self.t(d.child_by_field_name('declarator'))} = {first}"
        else:
            init_text = f"{loop.var} = {first}"
        body = self.body(node)
        step = self.t(counted.step)
        # A whole tile runs a fixed number of iterations, which the compiler unrolls (ascending k as
        # before); the last, ragged tile stops at the loop's own bound.
        pragma = self.loop_pragma or ("\n#pragma unroll\n" if tk <= DEFAULT_TK else f"\n#pragma unroll {UNROLL_LONG_TILE}\n")
        full = f"{pragma} for ({init_text}; {loop.var} < kl_kb + {tk}; {step}) {body}"
        ragged = f"{self.loop_pragma} for ({init_text}; {loop.var} < {start} + kl_trips; {step}) {body}"
        return f"const {self.emitter.int_type} kl_kb = {first}; if (kl_t0 + {tk} <= kl_trips) {{ {full} }} else {{ {ragged} }}"

    def body(self, node: Node) -> str:
        body = node.child_by_field_name("body")
        subs = self.plan.counted.without_step()
        for n, t in enumerate(self.plan.tiles):
            r = {"tid.x": "threadIdx.x", "tid.y": "threadIdx.y", None: ""}[t.dim]
            for lo, hi in t.spans:
                subs.append((lo, hi, self.ref(n, t, r, f"(int)({self.plan.loop.var} - kl_kb)")))
        return self.copy(body.start_byte, body.end_byte, subs)


def _mentions(poly: Poly, symbol: str, opaque, depth: int = 0) -> bool:
    """``poly`` depends on ``symbol``, directly or through the recipe of an opaque term."""
    if symbol in poly.symbols:
        return True
    if depth > 8:
        return True
    for s in poly.symbols:
        entry = opaque.get(s) if is_opaque(s) else None
        if entry is not None and entry.recipe is not None:
            parts = entry.recipe[1:] if entry.recipe[0] != "select" else entry.recipe[1:2] + entry.recipe[3:]
            if any(isinstance(x, Poly) and _mentions(x, symbol, opaque, depth + 1) for x in parts):
                return True
    return False


@dataclass(frozen=True)
class BlockShape:
    """A register-blocked micro-tile: each thread runs the original threads of ``ry`` blocks along y
    and ``rx`` along x (blocks ``ry*blockIdx.y + qy``, ``rx*blockIdx.x + qx``)."""

    ry: int
    rx: int
    within: bool = False
    """The copies are threads of the same block (``(ty + qy*by/ry, tx + qx*bx/rx)``), launched with a
    block ``ry*rx`` times smaller, instead of threads of neighbouring blocks."""

    @property
    def variant(self) -> str:
        return f"{self.ry}x{self.rx}" + ("-in-block" if self.within else "")

    def block(self, block: tuple[int, int, int]) -> tuple[int, int, int]:
        """The block launched: the original one, or the threads a within-block micro-tile leaves."""
        return (block[0] // self.rx, block[1] // self.ry, block[2]) if self.within else block

    def copies(self) -> list[tuple[int, int]]:
        """(qy, qx) of every copy, row-major."""
        return [(qy, qx) for qy in range(self.ry) for qx in range(self.rx)]


#: Largest block register-blocked: several outputs per thread need up to 255 registers each, and
#: 64K registers per SM hold 256 such threads. (At 1024 threads, 64 registers each, a 4x1 micro-tile
#: did not launch on the H200: too many resources requested.)
BLOCKED_MAX_THREADS = 256
#: The micro-tiles offered, best first: 4x4 reads eight tile elements from shared memory for
#: sixteen products (a GEMM's A and B both reused); 4x1 and 1x4 reuse the one operand that is
#: shared along one grid axis.
BLOCK_SHAPES = (BlockShape(4, 4), BlockShape(4, 1), BlockShape(1, 4))
#: The micro-tiles offered to a block larger than BLOCKED_MAX_THREADS: its own threads coarsened,
#: the block launched that many times smaller (32x32 threads become 8x8 with 16 outputs each, or
#: 16x16 with 4).
WITHIN_BLOCK_SHAPES = (BlockShape(4, 4, True), BlockShape(2, 2, True))
#: The fewest threads a coarsened block keeps (two warps).
MIN_COARSENED_THREADS = 64


def _tile_keys(t: _Tile, shape: BlockShape, opaque) -> list[tuple[int | None, int | None]]:
    """The copies of tile ``t`` a blocked rewrite needs, by (qy, qx): one per block index it
    moves with (None where it is the same for every copy along that axis)."""
    if shape.within:
        return [(None, None)]
    ys = list(range(shape.ry)) if shape.ry > 1 and _mentions(t.index, "bid.y", opaque) else [None]
    xs = list(range(shape.rx)) if shape.rx > 1 and _mentions(t.index, "bid.x", opaque) else [None]
    return [(y, x) for y in ys for x in xs]


def _key_of(t: _Tile, shape: BlockShape, opaque, qy: int, qx: int) -> tuple[int | None, int | None]:
    """The copy of tile ``t`` that copy (qy, qx) reads."""
    if shape.within:
        return (None, None)
    my = shape.ry > 1 and _mentions(t.index, "bid.y", opaque)
    mx = shape.rx > 1 and _mentions(t.index, "bid.x", opaque)
    return (qy if my else None, qx if mx else None)


def blocking_refusal(plan: _Plan, facts: KernelFacts, src: bytes, kernel: Node, grid: tuple[int, int],
                     shape: BlockShape) -> str | None:
    """Why the tiles cannot also be register-blocked as ``shape`` (None: they can). ``grid``: the
    launch's blocks along (x, y)."""
    bx, by, _ = plan.block
    grid_x, grid_y = grid
    copies = shape.rx * shape.ry
    if by == 1:
        return "register blocking needs a 2-D block"
    if shape.within:
        left = (bx // shape.rx) * (by // shape.ry)
        if bx % shape.rx or by % shape.ry or bx * by <= BLOCKED_MAX_THREADS:
            return (f"coarsening a block's own threads {shape.variant} needs a block of more than "
                    f"{BLOCKED_MAX_THREADS} threads that it divides")
        if not MIN_COARSENED_THREADS <= left <= BLOCKED_MAX_THREADS:
            return f"coarsened {shape.variant}, the block would keep {left} threads"
    else:
        if bx * by > BLOCKED_MAX_THREADS:
            return "register blocking needs a 2-D block of at most 256 threads (registers for several outputs)"
        if grid_y < shape.ry or grid_x < shape.rx:
            return f"register blocking {shape.variant} needs at least {shape.ry} blocks along y and {shape.rx} along x"
    if shape.ry > 1 and not any(t.dim == "tid.x" and not _mentions(t.index, "bid.y", facts.opaque) for t in plan.tiles):
        return "no tile is shared by blocks along y (the reuse register blocking would add)"
    if shape.rx > 1 and not any(t.dim == "tid.y" and not _mentions(t.index, "bid.x", facts.opaque) for t in plan.tiles):
        return "no tile is shared by blocks along x (the reuse register blocking would add)"
    if any(a.space == "shared" for a in facts.accesses):
        return "the kernel declares shared memory of its own"
    body = kernel.child_by_field_name("body")
    counts: dict[str, int] = {}
    for decl in _find(body, ("declaration",)):
        for name in declared_anywhere(decl, src):
            counts[name] = counts.get(name, 0) + 1
    params = {name for name, _, _ in facts.params}
    if any(c > 1 for c in counts.values()) or set(counts) & params:
        return "a name is declared twice in the kernel (the copies' scopes are merged)"
    update = plan.counted.step
    var = plan.loop.var
    if re.sub(r"\s", "", _text(src, update)) not in (f"{var}++", f"++{var}", f"{var}+=1"):
        return "the loop's update does more than step its variable"
    if any(ret.start_byte > plan.chain[-1].start_byte for ret in _find(body, ("return_statement",))):
        return "a `return` after the loop would end the other copies too"
    for call in _find(body, ("call_expression",)):
        fn = call.child_by_field_name("function")
        name = _text(src, fn).split("<", 1)[0].rsplit("::", 1)[-1].strip() if fn is not None else ""
        if not is_pure_math(name):
            return f"the kernel calls `{name}`, which the copies could not give their own block index"
    # The copies replace the fields of blockIdx (of threadIdx and blockDim within a block) one by one.
    renamed = ("threadIdx", "blockDim") if shape.within else ("blockIdx", "gridDim")
    for n in _find(body, ("identifier",)):
        if _text(src, n) in renamed and (n.parent is None or n.parent.type != "field_expression"):
            return f"the kernel uses {' or '.join(renamed)} as a whole"
    tiles_bytes = 0
    for t in plan.tiles:
        rows = {"tid.x": bx, "tid.y": by, None: 1}[t.dim]
        tiles_bytes += len(_tile_keys(t, shape, facts.opaque)) * (rows + 1) * (plan.tk + 1) * t.elem_bytes
    flags = 1 if shape.within else copies
    if tiles_bytes + flags * 4 * (bx + by) > TILE_BUDGET_BYTES:
        return "the register-blocked tiles do not fit the shared memory budget"
    return None


class _BlockedWriter(_Writer):
    """Each thread runs ``ry*rx`` original threads, those of blocks ``(ry*blockIdx.y + qy,
    rx*blockIdx.x + qx)``: every copy's statements renamed (``acc`` → ``acc_kl1``), their scopes
    merged, the loop run once for all copies so a tile shared along an axis is read once per
    iteration for all the copies along it. Where every copy is active (all but the grid's ragged
    edge), the loop runs without the copies' predicates."""

    def __init__(self, plan: _Plan, facts: KernelFacts, src: bytes, emitter: PolyEmitter, kernel: Node,
                 user: UserText | None = None, shape: BlockShape = BlockShape(4, 1)):
        super().__init__(plan, facts, src, emitter, user)
        body = kernel.child_by_field_name("body")
        self.micro = shape
        self.names = declared_anywhere(body, src)
        self.renames = [n for n in _find(body, ("identifier",)) if _text(src, n) in self.names]
        fields = [n for n in _find(body, ("field_expression",))]
        self.fields = {(name, axis): [n for n in fields if re.sub(r"\s", "", _text(src, n)) == f"{name}.{axis}"]
                       for name in ("blockIdx", "threadIdx", "blockDim") for axis in "xy"}
        self.launched = shape.block(plan.block)
        self.q = 0
        self.qy, self.qx = 0, 0
        self.tile_subs: list[tuple[int, int, str]] = []

    def block_index(self, axis: str, q: int) -> str:
        r = self.micro.ry if axis == "y" else self.micro.rx
        return f"(blockIdx.{axis} * {r} + {q})"

    def thread_index(self, axis: str, q: int) -> str:
        """The copy's original thread index along ``axis`` within a coarsened block."""
        step = self.launched[1] if axis == "y" else self.launched[0]
        return f"(threadIdx.{axis} + {step * q})" if q else f"threadIdx.{axis}"

    def replaced_fields(self) -> list[tuple[str, str, str]]:
        """(builtin, axis, what the current copy reads instead)."""
        out = []
        for axis, q, r in (("y", self.qy, self.micro.ry), ("x", self.qx, self.micro.rx)):
            if r == 1:
                continue
            if self.micro.within:
                out.append(("threadIdx", axis, self.thread_index(axis, q)))
                out.append(("blockDim", axis, str(self.plan.block[1] if axis == "y" else self.plan.block[0])))
            else:
                out.append(("blockIdx", axis, self.block_index(axis, q)))
        return out

    def span_text(self, lo: int, hi: int) -> str:
        subs = [(a, b, new) for a, b, new in self.tile_subs if lo <= a and b <= hi]
        taken = [(a, b) for a, b, _ in subs]
        for n in self.renames:
            if lo <= n.start_byte and n.end_byte <= hi and not any(a <= n.start_byte < b for a, b in taken):
                subs.append((n.start_byte, n.end_byte, f"{_text(self.src, n)}_kl{self.q}"))
        for name, axis, value in self.replaced_fields():
            for n in self.fields[(name, axis)]:
                if lo <= n.start_byte and n.end_byte <= hi and not any(a <= n.start_byte < b for a, b in taken):
                    subs.append((n.start_byte, n.end_byte, value))
        return self.copy(lo, hi, subs)

    def t(self, node: Node) -> str:
        return self.span_text(node.start_byte, node.end_byte)

    def select(self, c: int) -> None:
        self.q = c
        self.qy, self.qx = self.micro.copies()[c]

    def text(self) -> str:
        copies = []
        ry, rx = self.micro.ry, self.micro.rx
        for c, (qy, qx) in enumerate(self.micro.copies()):
            self.select(c)
            pre: list[str] = []
            post: list[str] = []
            first = f"kl_v{c}"
            inside = [f"{self.block_index(axis, q)} < gridDim.{axis}" for axis, q, r in (("y", qy, ry), ("x", qx, rx)) if r > 1]
            # Within a block every copy is a thread the original launched.
            pre.append(f"const bool {first} = {'true' if self.micro.within else ' && '.join(inside)};")
            pred = self.flatten(self.plan.chain[0], first, pre, post)
            copies.append((pre, post, pred))
        past = " || ".join(f"blockIdx.{axis} * {r} >= gridDim.{axis}" for axis, r in (("y", ry), ("x", rx)) if r > 1)
        out = ["{"] if self.micro.within else ["{", f"if ({past}) return;"]
        for pre, _, _ in copies:
            out += pre
        out.append(self.blocked_loop([pred for _, _, pred in copies]))
        for _, post, _ in copies:
            out += post
        out.append("}")
        return "\n".join(out)

    def flatten(self, n: Node, pred: str, pre: list[str], post: list[str]) -> str:
        """The statements around the loop of copy ``self.q`` in order, each under its predicate; the
        predicate at the loop."""
        if n == self.plan.chain[-1]:
            return pred
        if n.type == "if_statement":
            name = f"{self.new_pred()}_{self.q}"
            pre.append(f"const bool {name} = {pred} && {self.t(n.child_by_field_name('condition'))};")
            return self.flatten(n.child_by_field_name("consequence"), name, pre, post)
        at_loop = pred
        after = False
        for child in n.named_children:
            if child in self.on_chain:
                at_loop = self.flatten(child, pred, pre, post)
                after = True
                continue
            if child.type.startswith("preproc"):
                continue
            guard = _exit_guard(child, self.src)
            if guard is not None:
                guard = self.t(child.child_by_field_name("condition"))
            if guard is not None and not after:
                name = f"{self.new_pred()}_{self.q}"
                pre.append(f"const bool {name} = {pred} && !{self.t(child.child_by_field_name('condition'))};")
                pred = name
                continue
            (post if after else pre).append(self.predicated(child, pred))
        return at_loop

    def blocked_loop(self, preds: list[str]) -> str:
        plan, loop, e = self.plan, self.plan.loop, self.emitter
        node = plan.chain[-1]
        bx, by, _ = plan.block
        tk = plan.tk
        copies = self.micro.copies()
        opaque = self.facts.opaque
        within = self.micro.within
        threads = self.launched[0] * self.launched[1]
        flat = "(int)(threadIdx.y * blockDim.x + threadIdx.x)"
        # Within a block, its size along each axis is the original one, a constant (blockDim is the smaller one).
        dims = {"bdim.x": str(bx), "bdim.y": str(by)} if within else {}
        start, trips = e.poly(loop.start, dims), e.poly(loop.bound - loop.start, dims)
        lines = ["{"]
        if within:
            # One flag per original row and column of the block, set by the copy that is that thread.
            lines.append(f"__shared__ int kl_rows[{by}]; __shared__ int kl_cols[{bx}];")
            lines.append(f"for (int kl_i = {flat}; kl_i < {max(bx, by)}; kl_i += {threads}) {{ "
                         f"if (kl_i < {by}) kl_rows[kl_i] = 0; if (kl_i < {bx}) kl_cols[kl_i] = 0; }}")
            lines.append("__syncthreads();")
            for c, (qy, qx) in enumerate(copies):
                lines.append(f"if ({preds[c]}) {{ kl_rows[{self.thread_index('y', qy)}] = 1; "
                             f"kl_cols[{self.thread_index('x', qx)}] = 1; }}")
        else:
            for c in range(len(copies)):
                lines.append(f"__shared__ int kl_rows{c}[{by}]; __shared__ int kl_cols{c}[{bx}];")
                lines.append(f"if (threadIdx.x == 0) kl_rows{c}[threadIdx.y] = 0; if (threadIdx.y == 0) kl_cols{c}[threadIdx.x] = 0;")
            lines.append("__syncthreads();")
            for c in range(len(copies)):
                lines.append(f"if ({preds[c]}) {{ kl_rows{c}[threadIdx.y] = 1; kl_cols{c}[threadIdx.x] = 1; }}")
        lines.append(f"const int kl_all = __syncthreads_and({' && '.join(preds)});")
        if any(t.dim is None for t in plan.tiles):
            if within:
                lines.append(f"const int kl_any = __syncthreads_or({' || '.join(preds)});")
            else:
                lines += [f"const int kl_any{c} = __syncthreads_or({preds[c]});" for c in range(len(copies))]
        lines.append(f"const {e.int_type} kl_trips = {trips};")
        for n, t in enumerate(plan.tiles):
            for key in _tile_keys(t, self.micro, opaque):
                lines.append(f"__shared__ {t.elem_type} {self.tile_name(n, key)}{self.shape(t)};")
        lines.append(f"for ({e.int_type} kl_t0 = 0; kl_t0 < kl_trips; kl_t0 += {tk}) {{")
        loads: list[_Load] = []
        for n, t in enumerate(plan.tiles):
            rows = {"tid.x": bx, "tid.y": by, None: 1}[t.dim]
            r, kk = (f"kl_e / {tk}", f"kl_e % {tk}") if t.k_fastest else (f"kl_e % {rows}", f"kl_e / {rows}")
            for key in _tile_keys(t, self.micro, opaque):
                subs = {loop.trip_symbol: "kl_t0 + kl_k", **dims}
                if key[0] is not None:
                    subs["bid.y"] = f"blockIdx.y * {self.micro.ry} + {key[0]}"
                if key[1] is not None:
                    subs["bid.x"] = f"blockIdx.x * {self.micro.rx} + {key[1]}"
                if t.dim:
                    subs[t.dim] = "kl_r"
                element = f"{t.array}[{e.poly(t.index, subs)}]" + (f".{t.field}" if t.field else "")
                users = [c for c, (qy, qx) in enumerate(copies) if _key_of(t, self.micro, opaque, qy, qx) == key]
                kind = "rows" if t.dim == "tid.y" else "cols"
                if within:
                    flag = "kl_any" if t.dim is None else f"kl_{kind}[kl_r]"
                elif t.dim is None:
                    flag = "(" + " || ".join(f"kl_any{c}" for c in users) + ")"
                else:
                    flag = "(" + " || ".join(f"kl_{kind}{c}[kl_r]" for c in users) + ")"
                ref = self.ref(n, t, "kl_r", "kl_k").replace(f"kl_s{n}", self.tile_name(n, key), 1)
                loads.append(_Load(ref, rows * tk, f"const int kl_r = {r}; const int kl_k = {kk};",
                                   f"kl_t0 + kl_k < kl_trips && {flag}", element, t.elem_type))
        lines += _staged(loads, flat, threads)
        lines.append("__syncthreads();")
        guarded, bare = [], []
        for c, (qy, qx) in enumerate(copies):
            self.select(c)
            self.tile_subs = []
            for n, t in enumerate(plan.tiles):
                thread = {"tid.x": "threadIdx.x", "tid.y": "threadIdx.y", None: ""}[t.dim]
                if within and t.dim is not None:
                    thread = self.thread_index(t.dim[-1], qy if t.dim == "tid.y" else qx)
                name = self.tile_name(n, _key_of(t, self.micro, opaque, qy, qx))
                for lo, hi in t.spans:
                    self.tile_subs.append((lo, hi, self.ref(n, t, thread, "kl_kk").replace(f"kl_s{n}", name, 1)))
            self.tile_subs += plan.counted.without_step()
            init = plan.counted.initializer
            var = f"{loop.var}_kl{c}"
            if init is not None and init.type == "declaration":
                d = init.children_by_field_name("declarator")[0]
                set_var = f"{self.span_text(init.start_byte, d.start_byte).strip()} {var} = kl_kb + kl_kk;"
            else:
                set_var = f"{var} = kl_kb + kl_kk;"
            body = self.t(node.child_by_field_name("body"))
            guarded.append(f"if ({preds[c]}) {{ {set_var} {body} }}")
            bare.append(f"{{ {set_var} {body} }}")
            self.tile_subs = []
        pragma = self.loop_pragma or "\n#pragma unroll\n"
        every = "\n".join(bare)
        some = "\n".join(guarded)
        lines.append(f"const {e.int_type} kl_kb = {start} + kl_t0;")
        # Where every copy is active the predicates are all true: the same loop without them.
        lines.append(f"if (kl_t0 + {tk} <= kl_trips && kl_all) {{ {pragma} for (int kl_kk = 0; kl_kk < {tk}; kl_kk++) {{\n{every}\n}} }}")
        lines.append(f"else if (kl_t0 + {tk} <= kl_trips) {{ {pragma} for (int kl_kk = 0; kl_kk < {tk}; kl_kk++) {{\n{some}\n}} }}")
        lines.append(f"else {{ for (int kl_kk = 0; kl_kk < kl_trips - kl_t0; kl_kk++) {{\n{some}\n}} }}")
        lines.append("__syncthreads();")
        lines.append("}")
        lines.append("}")
        return "\n".join(lines)

    @staticmethod
    def tile_name(n: int, key: tuple[int | None, int | None]) -> str:
        qy, qx = key
        return f"kl_s{n}" + (f"_y{qy}" if qy is not None else "") + (f"_x{qx}" if qx is not None else "")
