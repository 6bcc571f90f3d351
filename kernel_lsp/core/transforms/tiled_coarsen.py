"""Register blocking inside a kernel's own shared-memory tiling: each thread runs the threads of R blocks.

A GEMM-like kernel that already tiles (``As[ty][tx] = A[…]; Bs[ty][tx] = B[…]; __syncthreads();
for (k…) sum += As[ty][k] * Bs[k][tx]; __syncthreads();`` in a loop over tiles, or LU's update of a
block from a row panel and a column panel) reads two shared-memory elements per multiply-add, and
each block loads its tiles alone although its neighbour along one grid axis loads the same tile of
one operand (``Bs`` does not depend on ``blockIdx.y``). The rewrite gives each thread the work of
the same thread in R neighbouring blocks along that axis (blocks ``R*blockIdx.y + q``), in
lockstep: the kernel's statements are emitted once per copy where they differ between the copies
(their locals and shared arrays renamed, ``acc`` → ``acc_kl1``) and once for all where they do not
(the shared tile of the operand the copies have in common, the loop over tiles, the barriers), so a
tile element loaded once is read for R outputs, and the copies' loads and multiply-adds are
independent instructions. The grid is divided by R along that axis, rounded up.

What differs between copies is found by dependence on ``blockIdx`` along the axis: a local is a
copy's own when any assignment to it reads ``blockIdx`` there, a copy's own local or shared array,
or runs under a condition that does; a shared array is a copy's own when any store to it does, or
when a statement that must run per copy stores to it. A statement runs once for all copies only
when it reads nothing of a copy's own, makes no atomic or read-modify-write access to global memory
and calls nothing but math functions: every copy would have done exactly that.

Interleaving the copies is a schedule the original allowed: the copies are different blocks, which
the original does not order, and each copy's statements keep their order; the copies meet at the
kernel's barriers together, each barrier still reached by every thread of the block.

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a launch spec with one block shape at every size, at most 256 threads for four copies (512 for
  two), whose grid along the axis is an expression of the kernel's integer parameters: the grid is
  divided by R rounded up, and a copy past the original grid runs the last block's threads again
  but stores nothing to global memory (its statements that do are skipped);
- the kernel tiles already: it has barriers and shared arrays, and at least one shared array is the
  same for neighbouring blocks along the axis and read by the copies' own statements (the reuse);
- no ``return`` or ``goto``; ``blockIdx`` and ``gridDim`` read through their fields only, no helper
  call (it could read the block index), no cooperative group reading the block index;
- every statement holding a barrier is the barrier, a block, an ``if`` whose condition is the same
  for every copy, or a ``for`` whose header is the same for every copy without ``break``/``continue``;
- a shared array is named only where it is subscripted or declared, a copy's own one has a static
  size, and R copies of the shared arrays of a copy's own fit in 48 KB;
- no declaration declares both a copy's own names and names shared by the copies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core import expr
from kernel_lsp.core.analysis import KernelFacts, declared_anywhere, function_definitions, is_pure_math
from kernel_lsp.core.analysis import has_node as _has
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.index import build_index
from kernel_lsp.core.source import Preprocessed
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.static_check import problem_sizes
from kernel_lsp.core.transforms.columns_per_warp import _grid_c, _literals
from kernel_lsp.core.transforms.emit import node_at, parse, rebuild, user_line_of
from kernel_lsp.core.transforms.tile_contraction import STATIC_SMEM_BYTES

#: Copies per thread tried, most first (each a candidate where the launch allows it).
COPIES = (4, 2)
#: Most threads of a block for R copies (each copy's accumulators are registers of its own).
MAX_THREADS = {4: 256, 2: 512}
_LOOPS = ("for_statement", "while_statement", "do_statement")
_CONTROL = ("if_statement", "for_statement", "while_statement", "do_statement", "switch_statement",
            "conditional_expression")
_EXITS = ("break_statement", "continue_statement", "return_statement", "goto_statement")


class _Refusal(Exception):
    """A legality condition that does not hold; its message is the reason."""


@dataclass(frozen=True)
class _Plan:
    axis: str
    """``x`` or ``y``: the grid axis whose neighbouring blocks one block takes over."""
    copies: int
    own: frozenset[str]
    """Locals and shared arrays each copy has its own of (renamed)."""
    common_shared: tuple[str, ...]
    """Shared arrays the copies have in common, read by their own statements (the reuse)."""
    shared: frozenset[str]
    """Every shared array of the kernel."""
    block: tuple[int, int, int]
    kernel: Node
    body: Node
    grid: str
    """The original grid's extent along the axis, a C expression of the kernel's parameters."""


def _identifiers(node: Node, src: bytes) -> set[str]:
    out, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n.type == "identifier":
            out.add(_text(src, n))
        stack.extend(n.children)
    return out


def _fields(node: Node, src: bytes, name: str, axis: str) -> list[Node]:
    """The ``name.axis`` field expressions under ``node``."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if n.type == "field_expression" and re.sub(r"\s", "", _text(src, n)) == f"{name}.{axis}":
            out.append(n)
            continue
        stack.extend(n.children)
    return out


def _find(node: Node, types: tuple[str, ...]) -> list[Node]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if n.type in types:
            out.append(n)
        stack.extend(n.children)
    return out


def _base_name(node: Node, src: bytes) -> str | None:
    """The array a (possibly multi-dimensional) subscript stores to: ``As[ty][tx]`` → ``As``."""
    while node.type == "subscript_expression":
        node = node.child_by_field_name("argument")
    if node.type == "parenthesized_expression" and node.named_child_count == 1:
        return _base_name(node.named_children[0], src)
    return _text(src, node) if node.type == "identifier" else None


class _Copies:
    """The kernel's body as R lockstep copies: the classification of its statements, and their text."""

    def __init__(self, facts: KernelFacts, src: bytes, body: Node, axis: str, copies: int, shared: set[str],
                 pre: Preprocessed, grid: str = ""):
        """``grid``: the original grid's extent along ``axis`` as a C expression of the kernel's parameters; ``pre``:
        the preprocessed view (its lines name the user's in refusals)."""
        self.facts, self.src, self.body, self.axis, self.copies, self.shared = facts, src, body, axis, copies, shared
        self.pre = pre
        self.grid = grid
        self.locals = declared_anywhere(body, src)
        self.own: set[str] = set()
        self.barrier_spans = [b.span for b in facts.barriers]
        self.warp_spans = [w.span for w in facts.warp_operations]
        self._classify()

    # ---- what differs between copies ---------------------------------------------------------

    def _conditions(self, node: Node) -> set[str]:
        """Identifiers of the conditions ``node`` runs under (up to the kernel's body)."""
        out: set[str] = set()
        n = node.parent
        while n is not None and n != self.body:
            if n.type in _CONTROL:
                for field in ("condition", "update"):
                    c = n.child_by_field_name(field)
                    if c is not None:
                        out |= _identifiers(c, self.src)
                if n.type == "for_statement":
                    init = n.child_by_field_name("initializer")
                    if init is not None:
                        out |= _identifiers(init, self.src)
            n = n.parent
        return out

    def _under_own_block_index(self, node: Node) -> bool:
        n = node.parent
        while n is not None and n != self.body:
            if n.type in _CONTROL:
                for field in ("condition", "update", "initializer"):
                    c = n.child_by_field_name(field)
                    if c is not None and _fields(c, self.src, "blockIdx", self.axis):
                        return True
            n = n.parent
        return False

    def _definitions(self) -> list[tuple[str, Node, Node]]:
        """(name stored, the value's expression, the storing node) for every store to a local or a shared array."""
        out = []
        for n in _find(self.body, ("assignment_expression", "init_declarator", "update_expression")):
            if n.type == "assignment_expression":
                left, value = n.child_by_field_name("left"), n
            elif n.type == "init_declarator":
                left, value = n.child_by_field_name("declarator"), n.child_by_field_name("value")
            else:
                left, value = n.child_by_field_name("argument"), n
            if left is None or value is None:
                continue
            while left.type in ("pointer_declarator", "array_declarator", "reference_declarator"):
                left = left.child_by_field_name("declarator") or left.named_children[0]
            name = _base_name(left, self.src) if left.type != "identifier" else _text(self.src, left)
            # Locals and shared arrays are the block's own; a store to global memory names no copy of anything.
            if name is not None and (name in self.locals or name in self.shared):
                out.append((name, value, n))
        return out

    def _classify(self) -> None:
        definitions = self._definitions()
        while True:
            before = set(self.own)
            for name, value, node in definitions:
                if name in self.own:
                    continue
                reads = _identifiers(value, self.src) | self._conditions(node)
                if reads & self.own or _fields(value, self.src, "blockIdx", self.axis) or self._under_own_block_index(node):
                    self.own.add(name)
            # A statement that must run per copy stores its own copy of whatever it stores.
            for leaf in self.leaves():
                if self.per_copy(leaf):
                    for name, _, node in definitions:
                        if leaf.start_byte <= node.start_byte < leaf.end_byte:
                            self.own.add(name)
            if self.own == before:
                return

    # ---- the structure ------------------------------------------------------------------------

    def holds_barrier(self, node: Node) -> bool:
        return any(node.start_byte <= lo and hi <= node.end_byte for lo, hi in self.barrier_spans)

    def is_barrier(self, node: Node) -> bool:
        if node.type != "expression_statement" or not node.named_children:
            return False
        e = node.named_children[0]
        return (e.start_byte, e.end_byte) in self.barrier_spans

    def uniform(self, node: Node | None) -> bool:
        """``node`` (a condition, a header) has the same value in every copy."""
        return node is None or not (_identifiers(node, self.src) & self.own or _fields(node, self.src, "blockIdx", self.axis))

    def header(self, loop: Node) -> list[Node]:
        return [c for c in (loop.child_by_field_name(f) for f in ("initializer", "condition", "update")) if c is not None]

    def fused(self, node: Node) -> bool:
        """A loop run once for all copies, its body emitted statement by statement."""
        body = node.child_by_field_name("body")
        return node.type == "for_statement" and body is not None and not _has(body, _EXITS) and all(
            self.uniform(h) for h in self.header(node))

    def structural(self, node: Node) -> bool:
        """``node`` is emitted as a structure around its statements (not copied whole)."""
        if node.type == "compound_statement":
            return True
        if node.type == "if_statement":
            return self.uniform(node.child_by_field_name("condition"))
        if node.type == "for_statement":
            return self.fused(node)
        return False

    def children(self, node: Node) -> list[Node]:
        if node.type == "compound_statement":
            return [c for c in node.named_children if c.type != "comment"]
        if node.type == "if_statement":
            out = [node.child_by_field_name("consequence")]
            alt = node.child_by_field_name("alternative")
            if alt is not None:
                out.append(alt.named_children[0] if alt.type == "else_clause" else alt)
            return [c for c in out if c is not None]
        return [node.child_by_field_name("body")]

    def leaves(self, node: Node | None = None) -> list[Node]:
        """The statements emitted whole (once or per copy), in order."""
        node = self.body if node is None else node
        out = []
        for child in self.children(node):
            if child.type.startswith("preproc") or self.is_barrier(child):
                continue
            if self.structural(child):
                out += self.leaves(child)
            else:
                out.append(child)
        return out

    def per_copy(self, leaf: Node) -> bool:
        if _identifiers(leaf, self.src) & self.own or _fields(leaf, self.src, "blockIdx", self.axis):
            return True
        inside = [a for a in self.facts.accesses if leaf.start_byte <= a.span[0] < leaf.end_byte]
        return any(a.kind == "atomic" or (a.space == "global" and a.kind == "update") for a in inside)

    def refusal(self) -> str | None:
        for leaf in self.leaves():
            if self.holds_barrier(leaf):
                kind = leaf.type.replace("_", " ")
                if leaf.type == "for_statement":
                    return (f"the loop at line {user_line_of(self.pre, leaf.start_point[0])} holds a barrier and its header differs between the "
                            "copies or it can leave early")
                if leaf.type == "if_statement":
                    return (f"a barrier is under a condition that differs between the copies (line "
                            f"{user_line_of(self.pre, leaf.start_point[0])})")
                return f"a barrier is inside a {kind}, which the copies cannot share"
            if leaf.type == "declaration" and self.per_copy(leaf) and self.writes_global(leaf):
                return "a declaration's initialiser writes global memory (a copy past the grid could not skip it)"
            if leaf.type == "declaration":
                names = {_base_name(d, self.src) or _declared(d, self.src) for d in leaf.children_by_field_name("declarator")}
                if names & self.own and names - self.own:
                    return "a declaration declares both names of each copy's own and names the copies share"
        return None

    def writes_global(self, leaf: Node) -> bool:
        return any(a.space == "global" and a.writes for a in self.facts.accesses
                   if leaf.start_byte <= a.span[0] < leaf.end_byte)

    # ---- the text -----------------------------------------------------------------------------

    def prologue(self) -> str:
        """Each copy's block (the last one stands in for the copies past the grid, which store nothing)."""
        a, r = self.axis, self.copies
        lines = [f"const unsigned kl_grid = (unsigned)({self.grid});"]
        for q in range(r):
            lines.append(f"const bool kl_live{q} = blockIdx.{a} * {r}u + {q}u < kl_grid;")
            lines.append(f"const unsigned kl_b{q} = kl_live{q} ? blockIdx.{a} * {r}u + {q}u : kl_grid - 1u;")
        return "\n".join(lines)

    def subs(self, node: Node, q: int | None) -> list[tuple[int, int, str]]:
        """Substitutions under ``node`` for copy ``q`` (None: the text shared by every copy)."""
        out = [(n.start_byte, n.end_byte, "kl_grid") for n in _fields(node, self.src, "gridDim", self.axis)]
        if q is None:
            return out
        out += [(n.start_byte, n.end_byte, f"kl_b{q}") for n in _fields(node, self.src, "blockIdx", self.axis)]
        stack = [node]
        while stack:
            n = stack.pop()
            if n.type == "identifier" and _text(self.src, n) in self.own:
                out.append((n.start_byte, n.end_byte, f"{_text(self.src, n)}_kl{q}"))
            stack.extend(n.children)
        return out

    def emit(self, node: Node, text) -> str:
        """The statements of ``node`` (a compound statement, an ``if`` or a fused loop) for every copy."""
        parts = []
        for child in self.children(node):
            if child.type.startswith("preproc"):
                parts.append("\n" + text(child.start_byte, child.end_byte).strip() + "\n")
            elif self.is_barrier(child):
                parts.append(text(child.start_byte, child.end_byte))
            elif child.type == "compound_statement":
                parts.append("{\n" + self.emit(child, text) + "\n}")
            elif child.type == "if_statement" and self.structural(child):
                cons = child.child_by_field_name("consequence")
                out = text(child.start_byte, cons.start_byte, self.subs_between(child, cons, None)) + "{\n" + \
                    self.emit_one(cons, text) + "\n}"
                alt = child.child_by_field_name("alternative")
                if alt is not None:
                    inner = alt.named_children[0] if alt.type == "else_clause" else alt
                    out += " else {\n" + self.emit_one(inner, text) + "\n}"
                parts.append(out)
            elif child.type == "for_statement" and self.structural(child):
                body = child.child_by_field_name("body")
                parts.append(text(child.start_byte, body.start_byte, self.subs_between(child, body, None)) + "{\n" +
                             self.emit_one(body, text) + "\n}")
            elif self.per_copy(child):
                for q in range(self.copies):
                    copy = text(child.start_byte, child.end_byte, self.subs(child, q))
                    parts.append(f"if (kl_live{q}) {{ {copy} }}" if self.writes_global(child) else copy)
            else:
                parts.append(text(child.start_byte, child.end_byte, self.subs(child, None)))
        return "\n".join(parts)

    def emit_one(self, stmt: Node, text) -> str:
        """A statement in a branch or loop body, emitted for every copy (a block's statements, or itself)."""
        if stmt.type == "compound_statement":
            return self.emit(stmt, text)
        wrapper = _Wrapper(stmt)
        return self.emit(wrapper, text)  # type: ignore[arg-type]

    def subs_between(self, node: Node, child: Node, q: int | None) -> list[tuple[int, int, str]]:
        return [s for s in self.subs(node, q) if s[1] <= child.start_byte]


class _Wrapper:
    """A single statement seen as a block of one (``for (…) stmt;``)."""

    type = "compound_statement"

    def __init__(self, stmt: Node):
        self.named_children = [stmt]


def _declared(declarator: Node, src: bytes) -> str | None:
    node = declarator
    while node is not None and node.type != "identifier":
        node = node.child_by_field_name("declarator") or (node.named_children[0] if node.named_children else None)
    return _text(src, node) if node is not None else None


_BLOCK_INDEX = re.compile(r"\b(blockIdx|gridDim)\b")
#: Written like calls, but casts or checks that touch no memory and read no index.
_NO_CALLS = frozenset({"static_cast", "reinterpret_cast", "const_cast", "assert", "this_thread_block", "tiled_partition"})


def _call_refusal(facts: KernelFacts, body: Node, root: Node, src: bytes) -> str | None:
    """Why a call of the kernel could make the copies differ in ways the rewrite does not see (None: none can).

    Math functions and vector constructors are functions of their arguments; a helper defined in the file
    is one too when it reads no block index and stores nothing (the analysis sees its stores), nor calls
    anything that does. A cast written like a call (``(floatX)(x)``, ``reinterpret_cast<float4*>(p)``) is
    no call; ``assert`` reads and writes nothing the copies differ in, nor does making a thread block's
    group or its tiles; a cooperative group's rank or size
    that the analysis reads as a thread-index polynomial (:attr:`KernelFacts.group_values`) is the same
    for every copy."""
    # Barriers, warp operations and atomics are calls the analysis models (each copy makes its own atomics).
    allowed = {*(b.span for b in facts.barriers), *(w.span for w in facts.warp_operations),
               *(a.span for a in facts.accesses if a.kind == "atomic")}
    thread_only = set(facts.group_values)
    helpers = {name: node for name, node, _ in function_definitions(root, src)}
    storing = {name for a in facts.accesses if a.writes for name in a.via}
    seen: set[str] = set()

    def check(node: Node, depth: int) -> str | None:
        for call in _find(node, ("call_expression",)):
            fn = call.child_by_field_name("function")
            if fn is None or fn.type == "parenthesized_expression" or (call.start_byte, call.end_byte) in allowed:
                continue
            name = _text(src, fn).split("<", 1)[0].rsplit("::", 1)[-1].rsplit(".", 1)[-1].strip()
            if is_pure_math(name) or name.startswith("make_") or name in seen or name in _NO_CALLS \
                    or "".join(_text(src, call).split()) in thread_only:
                continue
            helper = helpers.get(name)
            if helper is None:
                return f"the kernel calls `{name}`, which the analysis does not see (it could read the block index)"
            if _BLOCK_INDEX.search(_text(src, helper)):
                return f"the helper `{name}` reads the block index of the block it runs in"
            if name in storing:
                return f"the helper `{name}` stores to memory (each copy would have to call it)"
            seen.add(name)
            if depth > 4:
                return f"the helper `{name}` calls helpers too deeply"
            inner = check(helper, depth + 1)
            if inner:
                return inner
        return None

    return check(body, 0)


class TiledCoarsen(Rule):
    name = "tiled-register-block"
    technique = "thread-coarsening"
    summary = "a kernel that tiles through shared memory already: each thread runs the same thread of R neighbouring blocks"

    def plans(self, ctx: RuleContext) -> tuple[list[_Plan], str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return [], "the kernel's analysis is missing or incomplete"
        if ctx.spec is None:
            return [], "needs a launch spec (the launch changes: the grid divided along an axis)"
        block = ctx.constant_block()
        if block is None:
            return [], "the block shape is not the same at every size of the spec"
        if not facts.syncs or not any(a.space == "shared" for a in facts.accesses):
            return [], "the kernel does not tile through shared memory with barriers (no tiling to block registers in)"
        if any(re.search(r"\b(group_index|block_index|block_rank)\b", t) for t in facts.implicit_indices):
            return [], "the kernel reads its block index through a cooperative group"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return [], "the kernel's definition was not found in the preprocessed view"
        if _find(body, ("return_statement", "goto_statement")):
            return [], "a `return` or `goto` would end or move every copy the thread runs"
        for n in _find(body, ("identifier",)):
            if _text(src, n) in ("blockIdx", "gridDim") and (n.parent is None or n.parent.type != "field_expression"):
                return [], f"the kernel uses {_text(src, n)} as a whole"
        why = _call_refusal(facts, body, root, src)
        if why:
            return [], why
        pre_kernel = next((k for k in build_index(ctx.preprocessed.text).kernels if k.name == ctx.kernel.name), None)
        decls = {d.name: d for d in (pre_kernel.shared if pre_kernel is not None else ())}
        shared = {a.array for a in facts.accesses if a.space == "shared"} | set(decls)
        for n in _find(body, ("identifier",)):
            if _text(src, n) in shared and n.parent is not None and n.parent.type not in (
                    "subscript_expression", "array_declarator", "init_declarator", "declaration"):
                return [], f"the shared array `{_text(src, n)}` is used other than through a subscript"
        launches = ctx.launches()
        threads = block[0] * block[1] * block[2]
        used = sum(d.size_bytes or 0 for d in decls.values() if not d.is_extern) + max(
            (launch.dynamic_smem_bytes for launch in launches), default=0)
        reasons, found = [], []
        scalars = {name for name, _, is_pointer in facts.params if not is_pointer and ctx.spec_scalar(name)}
        sizes = problem_sizes(ctx.spec)
        for axis in ("y", "x"):
            dim = "xy".index(axis)
            if all(launch.grid[dim] == 1 for launch in launches):
                continue
            written = str(ctx.spec.launch.grid[dim])
            try:
                tree = expr.parse(written)
                grid = _grid_c(tree, scalars)
            except expr.ExprError:
                grid = None
            if grid is None:
                reasons.append(f"along {axis}: the spec's grid `{written}` is not an expression of the kernel's integer "
                               "parameters (the copies past the grid must know where it ends)")
                continue
            literal = next((n.value for n in _literals(tree) if n.value in sizes), None)
            if literal is not None:
                reasons.append(f"along {axis}: the grid is written with the literal {literal}, {sizes[literal]}: in the "
                               "kernel, the harness's static check would take it for a problem size written in")
                continue
            try:
                copies = _Copies(facts, src, body, axis, 2, shared, ctx.preprocessed, grid)
            except RecursionError:
                return [], "the kernel's body nests too deeply"
            why = copies.refusal()
            if why:
                reasons.append(f"along {axis}: {why}")
                continue
            common = [s for s in sorted(shared - copies.own)
                      if any(copies.per_copy(leaf) and s in _identifiers(leaf, src) for leaf in copies.leaves())]
            if not common:
                reasons.append(f"along {axis}: no shared array is the same for neighbouring blocks and read by what each "
                               "block computes (nothing to share)")
                continue
            own_shared = [s for s in shared & copies.own]
            if any(s not in decls or decls[s].is_extern or decls[s].size_bytes is None for s in own_shared):
                reasons.append(f"along {axis}: a shared array of each copy's own has no static size")
                continue
            own_bytes = sum(decls[s].size_bytes for s in own_shared)
            for r in COPIES:
                if threads > MAX_THREADS[r]:
                    reasons.append(f"along {axis}: {r} copies need a block of at most {MAX_THREADS[r]} threads")
                    continue
                if all(launch.grid[dim] < r for launch in launches):
                    reasons.append(f"along {axis}: the grid has fewer than {r} blocks at every size of the spec")
                    continue
                if used + (r - 1) * own_bytes > STATIC_SMEM_BYTES:
                    reasons.append(f"along {axis}: {r} copies of the shared arrays do not fit 48 KB")
                    continue
                found.append(_Plan(axis, r, frozenset(copies.own), tuple(common), frozenset(shared), block, kernel, body,
                                   grid))
        if not found:
            return [], "; ".join(reasons) or "the grid has one block along x and y"
        return found[:2], ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plans, why = self.plans(ctx)
        if not plans:
            return False, why
        p = plans[0]
        return True, (f"barriers and shared tiles, {', '.join(f'`{s}`' for s in p.common_shared)} the same for neighbouring "
                      f"blocks along {p.axis}: {' or '.join(str(q.copies) + ' along ' + q.axis for q in plans)} blocks "
                      "per block")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plans, _ = self.plans(ctx)
        facts = ctx.facts
        src = ctx.preprocessed.text.encode("utf-8")
        out = []
        for plan in plans:
            copies = _Copies(facts, src, plan.body, plan.axis, plan.copies, set(plan.shared), ctx.preprocessed, plan.grid)
            source, expanded = rebuild(ctx.preprocessed, facts, ctx.source, ctx.kernel,
                                       lambda text, c=copies: "\n" + c.prologue() + "\n" + c.emit(plan.body, text) + "\n")
            dim = "xy".index(plan.axis)
            launch = ctx.spec.launch  # type: ignore[union-attr]
            grid = [str(g) for g in launch.grid]
            grid[dim] = f"ceil_div({grid[dim]}, {plan.copies})"
            override = {"grid": grid, "block": list(launch.block), "dynamic_smem": launch.dynamic_smem}
            if not ctx.launch_ok(override):
                continue
            divide = tuple(plan.copies if k == dim else 1 for k in range(3))
            note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
            out.append(Rewrite(
                source, f"each thread runs the same thread of {plan.copies} neighbouring blocks along {plan.axis} in lockstep: "
                        f"{', '.join(f'`{s}`' for s in plan.common_shared)} loaded once for all of them, the rest per copy; "
                        f"the grid divided by {plan.copies} along {plan.axis}{note}",
                override, variant=f"{plan.copies}{plan.axis}", block=plan.block, grid_divide=divide))  # type: ignore[arg-type]
        return tuple(out)
