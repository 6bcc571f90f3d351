"""Block reductions: shared-memory trees as warp shuffles, per-element atomics as one atomic per block.

Two transformations on the reductions the analysis finds (:attr:`KernelFacts.reductions`):

:class:`TreeToShuffle` — a looped shared-memory tree (``shared_tree`` with its loop) of any
indexing (interleaved ``tid % (2*s) == 0``, strided ``index = 2*s*tid``, sequential halving
``tid < s``) is replaced by a butterfly shuffle per warp, one slot per warp in shared memory
and a last shuffle in the first warp, which writes the block's total to the tree's root slot.
The number of blocks never changes, so a per-block output (``out[blockIdx.x] = sdata[0]``)
keeps its size.

Legality, in terms of the analysis (each refusal names the fact that was missing):
- the block is one-dimensional, a power of two from 32 to 1024 threads at every size of the spec;
- the tree's loop is reached by every thread (not under a condition, no ``return`` before it,
  every enclosing loop's start, bound and step the same for all threads of the block), so the
  new barriers are reached by all;
- its body is barriers, local declarations and one (guarded) update ``A[w] op= A[r]`` with
  ``op`` in ``+``, ``max``, ``min``, with a barrier at its top level between the steps;
- simulated at each size of the spec (the guard, indices and loop header evaluated for every
  thread and step), the steps are race-free (no slot written by one thread is read or written by
  another in the same step), stay within the block's slots, and leave in slot 0 every slot's
  initial value exactly once: the tree computes the block's total;
- afterwards (after the loop, or anywhere in an enclosing loop) the array is read only at slot 0
  (the other slots' partial sums, which the shuffles do not produce, are never observed).

:class:`AtomicToBlockReduce` — ``atomicAdd`` onto one address per block (an ``atomic``
reduction: the address does not depend on the thread) becomes a per-thread register sum, reduced
in the block with shuffles, added by one atomic per block at the kernel's end.

Legality:
- every atomic onto the array is an ``atomicAdd`` statement (its old value unused) at that one
  address, and the kernel accesses the array nowhere else (no order between them to keep);
- the address names only parameters that the kernel never assigns and the block's builtins, and
  reads only arrays the kernel never writes (it is re-evaluated at the kernel's end);
- the block has a multiple of 32 threads, at most 1024, at every size of the spec;
- every thread reaches the final reduction: a ``return`` becomes a ``break`` out of a
  ``do { … } while (0)`` around the original body, so none may sit in a loop or ``switch``; a
  kernel with barriers may not return at all (a thread that returned would now wait at them);
- only a block one of whose threads reached an atomic adds its total (``__syncthreads_or``): the
  address may be out of bounds for the others.

Not done here (privatisation is :mod:`kernel_lsp.core.transforms.privatize`): thread
coarsening (no target needed it without changing a per-block output), unrolled and
warp-synchronous (``volatile``) trees, scans.
"""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import node_text as _text, has_node as _has, identifiers_in as _identifiers
from kernel_lsp.core.analysis import Access, KernelFacts, LoopFact, assigned_names, shared_combine_loops, thread_dependence
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.rules.base import MAX_THREADS_PER_BLOCK, Rewrite, Rule, RuleContext
from kernel_lsp.core.transforms.emit import (
    WARP_REDUCE, BodyEdit, emit, node_at, parse, rebuild_span, warp_reduce_helpers,
)

#: Most steps simulated for one tree (a 1024-thread tree has 10).
_MAX_STEPS = 64
_BUILTINS = {"threadIdx", "blockIdx", "blockDim", "gridDim"}
_MINMAX = {"max": "max", "fmaxf": "max", "fmax": "max", "min": "min", "fminf": "min", "fmin": "min"}


class _Unknown(Exception):
    """An expression the evaluator cannot compute; its message names what."""


class _Eval:
    """Integer values of the small expressions trees are written with: the loop header, the guard,
    the indices. Locals are resolved through their single declaration before ``limit`` (a byte
    offset) when the kernel never assigns them again."""

    def __init__(self, src: bytes, body: Node, limit: int, group_values=None):  # noqa: ANN001 - Mapping[str, Poly]
        self.src = src
        # ``cta.thread_rank()``, ``block.size()`` …: the thread-index polynomials they stand for.
        self.group_values = group_values or {}
        self.assigned = assigned_names(body, src)
        self.decls: dict[str, Node] = {}
        stack = [body]
        while stack:
            n = stack.pop()
            if n.type == "init_declarator" and n.start_byte < limit:
                name = n.child_by_field_name("declarator")
                value = n.child_by_field_name("value")
                if name is not None and name.type == "identifier" and value is not None:
                    key = _text(src, name)
                    self.decls[key] = None if key in self.decls else value  # type: ignore[assignment]
            stack.extend(n.children)

    def value(self, node: Node, env: dict[str, int], depth: int = 0) -> int:
        v = self._value(node, env, depth)
        # Non-negative values below 2**31 behave the same in signed and unsigned C arithmetic, whose
        # types the evaluator does not track: anything else is refused rather than guessed.
        if not 0 <= v < 2 ** 31:
            raise _Unknown(f"a value outside 0..2^31 ({v} for `{_text(self.src, node)}`), whose signedness is not modelled")
        return v

    def _value(self, node: Node, env: dict[str, int], depth: int = 0) -> int:
        if depth > 40:
            raise _Unknown("an expression nested too deeply")
        t, src = node.type, self.src
        if t == "number_literal":
            text = _text(src, node).rstrip("uUlL")
            try:
                return int(text, 0)
            except ValueError:
                raise _Unknown(f"the literal `{_text(src, node)}`") from None
        if t == "parenthesized_expression":
            return self.value(node.named_children[0], env, depth + 1)
        if t == "cast_expression":
            return self.value(node.child_by_field_name("value"), env, depth + 1)
        if t in ("field_expression", "call_expression") and "".join(_text(src, node).split()) in self.group_values:
            poly = self.group_values["".join(_text(src, node).split())]
            names = {"tid": "threadIdx", "bid": "blockIdx", "bdim": "blockDim", "gdim": "gridDim"}
            bound = {s: env.get(f"{names[s.split('.')[0]]}.{s.split('.')[1]}") for s in poly.symbols if "." in s}
            value = poly.evaluate(bound) if None not in bound.values() else None
            if value is None:
                raise _Unknown(f"`{_text(src, node)}`")
            return value
        if t == "field_expression":
            key = _text(src, node).replace(" ", "")
            if key in env:
                return env[key]
            raise _Unknown(f"`{key}`")
        if t == "identifier":
            name = _text(src, node)
            if name in env:
                return env[name]
            value = self.decls.get(name)
            if value is None or name in self.assigned:
                raise _Unknown(f"`{name}`, which is not one value for the whole tree")
            return self.value(value, env, depth + 1)
        if t == "unary_expression":
            op = _text(src, node.child_by_field_name("operator"))
            v = self.value(node.child_by_field_name("argument"), env, depth + 1)
            return {"-": -v, "+": v, "!": int(not v), "~": ~v}[op]
        if t == "conditional_expression":
            cond = self.value(node.child_by_field_name("condition"), env, depth + 1)
            return self.value(node.child_by_field_name("consequence" if cond else "alternative"), env, depth + 1)
        if t == "binary_expression":
            op = _text(src, node.child_by_field_name("operator"))
            a = self.value(node.child_by_field_name("left"), env, depth + 1)
            if op == "&&" and not a:
                return 0
            if op == "||" and a:
                return 1
            b = self.value(node.child_by_field_name("right"), env, depth + 1)
            return _binary(op, a, b)
        raise _Unknown(f"`{_text(src, node)}`")


def _binary(op: str, a: int, b: int) -> int:
    if op in ("/", "%"):
        if b == 0:
            raise _Unknown("a division by zero")
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        return q if op == "/" else a - q * b
    table = {"+": a + b, "-": a - b, "*": a * b, "<<": a << b if 0 <= b < 64 else 0, ">>": a >> b if 0 <= b < 64 else 0,
             "&": a & b, "|": a | b, "^": a ^ b, "<": int(a < b), "<=": int(a <= b), ">": int(a > b),
             ">=": int(a >= b), "==": int(a == b), "!=": int(a != b), "&&": int(bool(a and b)), "||": int(bool(a or b))}
    if op not in table:
        raise _Unknown(f"the operator `{op}`")
    return table[op]


@dataclass(frozen=True)
class _Update:
    """``A[w] op= A[r]`` (or ``A[w] = A[w] op A[r]``, ``A[w] = max(A[w], A[r])``)."""
    op: str
    write: Node
    read: Node


@dataclass(frozen=True)
class _Tree:
    loop: LoopFact
    array: str
    elem_type: str
    op: str


def _subscript(node: Node, src: bytes, array: str) -> Node | None:
    """The index of ``array[i]`` (one dimension), else None."""
    if node.type == "parenthesized_expression":
        return _subscript(node.named_children[0], src, array)
    if node.type != "subscript_expression":
        return None
    arg = node.child_by_field_name("argument")
    if arg is None or arg.type != "identifier" or _text(src, arg) != array:
        return None
    idx = node.child_by_field_name("indices") or node.child_by_field_name("index")
    if idx is not None and idx.type == "subscript_argument_list":
        return idx.named_children[0] if idx.named_child_count == 1 else None
    return idx


def _update(stmt: Node, src: bytes, array: str) -> _Update | None:
    if stmt.type == "compound_statement":
        inner = [c for c in stmt.named_children if c.type != "comment"]
        return _update(inner[0], src, array) if len(inner) == 1 else None
    if stmt.type != "expression_statement" or not stmt.named_children:
        return None
    e = stmt.named_children[0]
    if e.type != "assignment_expression":
        return None
    op = _text(src, e.child_by_field_name("operator"))
    left, right = e.child_by_field_name("left"), e.child_by_field_name("right")
    w = _subscript(left, src, array)
    if w is None:
        return None
    if op == "+=":
        r = _subscript(right, src, array)
        return _Update("+", w, r) if r is not None else None
    if op != "=":
        return None
    while right.type == "parenthesized_expression":
        right = right.named_children[0]
    if right.type == "binary_expression" and _text(src, right.child_by_field_name("operator")) == "+":
        operands = [right.child_by_field_name("left"), right.child_by_field_name("right")]
        kind = "+"
    elif right.type == "call_expression" and _text(src, right.child_by_field_name("function")) in _MINMAX:
        args = right.child_by_field_name("arguments")
        operands = list(args.named_children) if args is not None else []
        kind = _MINMAX[_text(src, right.child_by_field_name("function"))]
    else:
        return None
    if len(operands) != 2:
        return None
    idx = [_subscript(o, src, array) for o in operands]
    if any(i is None for i in idx):
        return None
    same = [i for i in idx if _text(src, i).replace(" ", "") == _text(src, w).replace(" ", "")]
    if not same:
        return None
    other = idx[1] if idx[0] is same[0] else idx[0]
    return _Update(kind, w, other)


def _is_barrier(stmt: Node, src: bytes, facts: KernelFacts) -> bool:
    """The statement is a block barrier and nothing else (``__syncthreads();``, ``cta.sync();``,
    ``cg::sync(block);``), as the analysis found it."""
    if stmt.type != "expression_statement" or stmt.named_child_count != 1:
        return False
    call = stmt.named_children[0]
    return any(b.scope == "block" and b.span == (call.start_byte, call.end_byte) for b in facts.barriers)


def _spec_blocks(ctx: RuleContext) -> list[tuple[int, int, int]]:
    return [launch.block for launch in ctx.launches()]


class TreeToShuffle(Rule):
    name = "tree-to-shuffle"
    technique = "warp-shuffle-reduction"
    summary = "a shared-memory reduction tree of any indexing replaced by warp shuffles (same grid)"

    def plan(self, ctx: RuleContext) -> tuple[list[_Tree], str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return [], "the kernel's analysis is missing or incomplete"
        unrolled = [r for r in facts.reductions if r.kind == "shared_tree" and r.loop is None]
        trees = [*unrolled, *shared_combine_loops(facts)]
        if not trees:
            return [], "no shared-memory reduction tree (no loop combines a shared array's slots in place)"
        if ctx.spec is None:
            return [], "needs a launch spec (the tree is simulated at each of its block sizes)"
        blocks = _spec_blocks(ctx)
        if not blocks or any(b[1] != 1 or b[2] != 1 for b in blocks):
            return [], "the block is not one-dimensional at every size (a tree over threadIdx.y is not modelled)"
        sizes = sorted({b[0] for b in blocks})
        if any(n < 32 or n > MAX_THREADS_PER_BLOCK or n & (n - 1) for n in sizes):
            return [], f"the block ({', '.join(map(str, sizes))} threads) is not a power of two from 32 to 1024 at every size"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return [], "the kernel's definition was not found in the preprocessed view"
        plans, reasons = [], []
        for red in trees:
            if red.loop is None:
                reasons.append(f"the tree on `{red.target}` at line {(red.user_line or 0) + 1} is unrolled "
                               "(only a looped tree is simulated)")
                continue
            loop = facts.loops[red.loop]
            why, op = self._refusal(facts, loop, red.target, body, root, src, sizes)
            if why:
                reasons.append(f"the tree on `{red.target}` at line {(loop.user_line or 0) + 1}: {why}")
                continue
            elem = next(a.elem_type for a in facts.accesses if a.array == red.target and a.space == "shared")
            plans.append(_Tree(loop, red.target, elem, op))
        if not plans:
            return [], "; ".join(reasons)
        return plans, ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plans, why = self.plan(ctx)
        if not plans:
            return False, why
        return True, "; ".join(
            f"the tree on `{p.array}` at line {(p.loop.user_line or 0) + 1} reduces every slot into slot 0 at each "
            "block size of the spec (simulated, race-free), every thread reaches it, and only the root is read afterwards"
            for p in plans)

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plans, _ = self.plan(ctx)
        edit = BodyEdit(ctx.preprocessed, ctx.facts)
        for k, p in enumerate(plans):
            indent = edit.indent_at(p.loop.span[0])
            core = _block_reduce(p.op, p.elem_type, f"{p.array}[threadIdx.x]", f"kl_part{k}", "threadIdx.x", "blockDim.x")
            text = ("{ // the tree as warp shuffles: every slot reduced, the total written to the root slot\n"
                    f"    __syncthreads();\n    {core}"
                    f"    if (threadIdx.x == 0u) {p.array}[0] = kl_total;\n    __syncthreads();\n}}")
            replace_by_lines(edit, p.loop.span[0], p.loop.span[1], text.replace("\n", "\n" + indent))
        source, expanded = emit(edit, ctx.source, ctx.kernel, warp_reduce_helpers({p.op for p in plans}, ctx.source))
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        what = ", ".join(f"`{p.array}`" for p in plans)
        return (Rewrite(source, f"the shared-memory tree on {what} replaced by warp shuffles and one slot per warp; "
                                f"same grid and block{note}"),)

    def _refusal(self, facts: KernelFacts, loop: LoopFact, array: str, body: Node, root: Node, src: bytes,
                 sizes: list[int]) -> tuple[str | None, str]:
        node = node_at(src, root, loop.span)
        if node is None or node.type != "for_statement" or loop.var is None:
            return "the analysis finds no counter of its loop (a variable started, tested and stepped)", ""
        if not facts.body_span[0] <= loop.span[0] < loop.span[1] <= facts.body_span[1]:
            return "the tree is in a helper function, not in the kernel's body", ""
        if "volatile" in next((a.elem_type for a in facts.accesses if a.array == array), ""):
            return "the array is volatile (warp-synchronous code the shuffles would have to reproduce)", ""
        # Every thread reaches the loop: only blocks and thread-uniform loops above it.
        parent = node.parent
        while parent is not None and parent != body:
            if parent.type in ("if_statement", "while_statement", "do_statement", "switch_statement",
                               "conditional_expression", "case_statement"):
                return f"it sits under a condition (`{_text(src, parent).split(chr(10), 1)[0][:60]}`): " \
                       "not every thread would reach the new barriers", ""
            if parent.type == "for_statement":
                outer = next((lp for lp in facts.loops if lp.span == (parent.start_byte, parent.end_byte)), None)
                if outer is None or any(p is None or thread_dependence(p, facts.opaque) for p in (outer.start, outer.bound, outer.step)):
                    return "an enclosing loop's start, bound or step is not proven the same for every thread", ""
            parent = parent.parent
        if _has_before(body, node.start_byte, ("return_statement", "goto_statement")):
            return "a thread may return before the tree (it would miss the new barriers)", ""
        # The partial sums the shuffles do not produce must never be read.
        outermost = node
        p = node.parent
        while p is not None and p != body:
            if p.type == "for_statement":
                outermost = p
            p = p.parent
        if outermost is not node and _has(outermost, ("return_statement", "break_statement", "continue_statement")):
            return "an enclosing loop holds a return, break or continue: a thread may skip a later iteration's tree", ""
        for a in facts.accesses:
            if a.array != array or not a.reads:
                continue
            inside = loop.span[0] <= a.span[0] < loop.span[1]
            later = a.span[0] >= loop.span[1] or outermost.start_byte <= a.span[0] < outermost.end_byte
            root_slot = a.index.constant == 0
            if later and not inside and not root_slot:
                return f"`{a.text}` at line {(a.user_line or 0) + 1} reads a slot other than the root after the tree", ""
        header_and_body = self._steps(node, src, array, facts)
        if isinstance(header_and_body, str):
            return header_and_body, ""
        init, cond, update, stmts, upd = header_and_body
        ev = _Eval(src, body, node.start_byte, facts.group_values)
        for n in sizes:
            why = _simulate(ev, loop.var, init, cond, update, stmts, upd, n)
            if why:
                return f"at {n} threads per block: {why}", ""
        return None, upd[1].op

    def _steps(self, node: Node, src: bytes, array: str, facts: KernelFacts):
        init, cond, update = (node.child_by_field_name(f) for f in ("initializer", "condition", "update"))
        if init is None or cond is None or update is None:
            return "the loop header lacks a start, a condition or an update"
        loop_body = node.child_by_field_name("body")
        stmts = [c for c in loop_body.named_children if c.type != "comment"] if loop_body.type == "compound_statement" else [loop_body]
        updates, barrier = [], False
        for s in stmts:
            if _is_barrier(s, src, facts):
                barrier = True
            elif s.type == "declaration":
                continue
            elif s.type == "if_statement" and s.child_by_field_name("alternative") is None:
                u = _update(s.child_by_field_name("consequence"), src, array)
                if u is None:
                    return f"the guarded statement `{_first_line(_text(src, s))}` does more than combine two slots of `{array}`"
                updates.append((s, u))
            elif _update(s, src, array) is not None:
                updates.append((s, _update(s, src, array)))
            else:
                return f"its loop also runs `{_first_line(_text(src, s))}`, besides combining slots of `{array}` and barriers"
        if len(updates) != 1:
            return "its body does not hold exactly one tree step"
        if not barrier:
            return "no barrier at the top level of its body separates the steps"
        if updates[0][1].op not in WARP_REDUCE:
            return f"the operator `{updates[0][1].op}` has no shuffle reduction here"
        return init, cond, update, [s for s in stmts if s.type == "declaration"], updates[0]


def _first_line(text: str) -> str:
    line = text.split("\n", 1)[0].strip()
    return line if len(line) <= 60 and "\n" not in text else line[:60] + " …"


def replace_by_lines(edit: BodyEdit, start: int, end: int, new: str) -> None:
    """``new`` in place of ``start..end`` as one edit per line of that range (the new text on the first),
    so that each maps onto the user's own line where it reads the same and the file's macros stay."""
    src = edit.src
    at, first = start, True
    while at < end:
        stop = src.find(b"\n", at, end)
        stop = end if stop < 0 else stop
        edit.replace(at, stop, new if first else "")
        first = False
        at = stop + 1


def _has_before(body: Node, at: int, types: tuple[str, ...]) -> bool:
    stack = [body]
    while stack:
        n = stack.pop()
        if n.start_byte >= at:
            continue
        if n.type in types:
            return True
        stack.extend(n.children)
    return False


def _simulate(ev: _Eval, var: str, init: Node, cond: Node, update: Node, decls: list[Node], step, n: int) -> str | None:
    """Runs the tree for a block of ``n`` threads on multisets of the slots' initial values; the reason
    it is not a reduction of the ``n`` slots into slot 0, or None."""
    stmt, upd = step
    guard = stmt.child_by_field_name("condition") if stmt.type == "if_statement" else None
    if guard is not None and guard.type == "condition_clause":
        guard = guard.child_by_field_name("value") or guard.named_children[0]
    base = {"blockDim.x": n, "blockDim.y": 1, "blockDim.z": 1, "threadIdx.y": 0, "threadIdx.z": 0, "warpSize": 32}
    src = ev.src
    try:
        if init.type == "declaration":
            decl = next(iter(init.children_by_field_name("declarator")), None)
            if decl is None or decl.type != "init_declarator":
                return "the loop's start was not found"
            s = ev.value(decl.child_by_field_name("value"), dict(base))
        elif init.type == "assignment_expression":
            s = ev.value(init.child_by_field_name("right"), dict(base))
        else:
            return "the loop's start was not found"
        slots: list[dict[int, int]] = [{j: 1} for j in range(n)]
        for _ in range(_MAX_STEPS):
            env = dict(base, **{var: s})
            if not ev.value(cond, env):
                break
            writes: dict[int, int] = {}
            reads: dict[int, set[int]] = {}
            for t in range(n):
                tenv = dict(env, **{"threadIdx.x": t})
                for d in decls:
                    for sub in d.children_by_field_name("declarator"):
                        if sub.type == "init_declarator":
                            tenv[_text(src, sub.child_by_field_name("declarator"))] = ev.value(sub.child_by_field_name("value"), tenv)
                if guard is not None and not ev.value(guard, tenv):
                    continue
                w, r = ev.value(upd.write, tenv), ev.value(upd.read, tenv)
                if not (0 <= w < n and 0 <= r < n):
                    return f"a step reads or writes slot {r if not 0 <= r < n else w}, outside the block's slots"
                if w in writes or w == r:
                    return f"slot {w} is written twice in one step"
                writes[w] = r
                reads.setdefault(r, set()).add(t)
                reads.setdefault(w, set()).add(t)
            for w in writes:
                if len(reads.get(w, ())) > 1:
                    return f"slot {w} is written and read by different threads in one step (a race)"
            new = list(slots)
            for w, r in writes.items():
                merged = dict(slots[w])
                for k, c in slots[r].items():
                    merged[k] = merged.get(k, 0) + c
                new[w] = merged
            slots = new
            s = _next(ev, update, var, env)
        else:
            return f"the tree does not end within {_MAX_STEPS} steps"
    except _Unknown as exc:
        return f"the tree's loop, guard or indices use {exc}, which the simulation cannot evaluate"
    if slots[0] != {j: 1 for j in range(n)}:
        return "slot 0 does not end with every slot's value exactly once"
    return None


def _next(ev: _Eval, update: Node, var: str, env: dict[str, int]) -> int:
    src = ev.src
    if update.type == "assignment_expression":
        left = update.child_by_field_name("left")
        if _text(src, left) != var:
            raise _Unknown(f"the update `{_text(src, update)}`")
        op = _text(src, update.child_by_field_name("operator"))
        v = ev.value(update.child_by_field_name("right"), env)
        if op == "=":
            return v
        return _binary(op[:-1], env[var], v)
    if update.type == "update_expression":
        return env[var] + (1 if "++" in _text(src, update) else -1)
    raise _Unknown(f"the update `{_text(src, update)}`")


def _identity(op: str, part: str, elem: str) -> str:
    # max and min are idempotent: a lane without a warp's total repeats the first one.
    return f"({elem})0" if op == "+" else f"{part}[0]"


def _block_reduce(op: str, elem: str, value: str, part: str, linear: str, nthreads: str) -> str:
    """Statements leaving the block's total of ``value`` in ``kl_total`` of thread 0 (every thread takes part)."""
    fn = WARP_REDUCE[op]
    return (f"__shared__ {elem} {part}[32];\n"
            f"    {elem} kl_total = {fn}(({elem})({value}));\n"
            f"    if (({linear} & 31u) == 0u) {part}[{linear} >> 5] = kl_total;\n"
            f"    __syncthreads();\n"
            f"    if ({linear} < 32u) {{\n"
            f"        kl_total = {linear} < (({nthreads}) >> 5) ? {part}[{linear}] : {_identity(op, part, elem)};\n"
            f"        kl_total = {fn}(kl_total);\n"
            f"    }}\n")


@dataclass(frozen=True)
class _Target:
    array: str
    elem_type: str
    address: str
    """The atomics' address as written (re-evaluated at the kernel's end)."""
    calls: tuple[tuple[int, int, str], ...]
    """Each atomic call's byte range and the value it adds."""


class AtomicToBlockReduce(Rule):
    name = "atomic-to-block-reduce"
    technique = "one-atomic-per-block"
    summary = "per-element atomicAdd onto one address: summed in registers, reduced in the block, one atomic per block"

    def plan(self, ctx: RuleContext) -> tuple[list[_Target], str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return [], "the kernel's analysis is missing or incomplete"
        arrays = list(dict.fromkeys(r.target for r in facts.reductions if r.kind == "atomic"))
        if not arrays:
            return [], "no atomics onto an address that is the same for every thread of the block"
        if ctx.spec is None:
            return [], "needs a launch spec (the block must be whole warps at every size)"
        blocks = _spec_blocks(ctx)
        counts = sorted({b[0] * b[1] * b[2] for b in blocks})
        if not counts or any(n % 32 or n > MAX_THREADS_PER_BLOCK for n in counts):
            return [], f"the block ({', '.join(map(str, counts))} threads) is not whole warps at every size"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return [], "the kernel's definition was not found in the preprocessed view"
        why = _exits_refusal(body, src, facts.syncs)
        if why:
            return [], why
        params = {name for name, _, _ in facts.params} - assigned_names(body, src)
        plans, reasons = [], []
        for array in arrays:
            mine = [a for a in facts.accesses if a.array == array]
            if any(a.kind != "atomic" or a.op != "atomicAdd" for a in mine):
                reasons.append(f"`{array}` is also read, written or updated by other atomics than atomicAdd: "
                               "their order against the deferred sum is not kept")
                continue
            if any(a.via for a in mine):
                reasons.append(f"an atomic onto `{array}` is in a helper function, not in the kernel's body")
                continue
            calls, addresses = [], set()
            for a in mine:
                call = node_at(src, root, a.span)
                args = call.child_by_field_name("arguments") if call is not None and call.type == "call_expression" else None
                if args is None or args.named_child_count != 2 or call.parent is None or call.parent.type != "expression_statement":
                    reasons.append(f"`{a.text}` at line {(a.user_line or 0) + 1} uses the atomic's old value")
                    break
                address, value = args.named_children
                if _cast_pointer(address):
                    reasons.append(f"the address of `{a.text}` is cast: the element type it adds is not the array's")
                    break
                addresses.add(_text(src, address).replace(" ", ""))
                names = _identifiers(address, src)
                if names - params - _BUILTINS:
                    reasons.append(f"the address of `{a.text}` names {', '.join(sorted(names - params - _BUILTINS))}, "
                                   "not an unassigned parameter or builtin: it cannot be re-evaluated at the kernel's end")
                    break
                loaded = (names & {n for n, _, is_pointer in facts.params if is_pointer}) - {array} - set(facts.read_only)
                if loaded:
                    reasons.append(f"the address of `{a.text}` reads {', '.join(sorted(loaded))}, which the kernel may "
                                   "write: it may differ at the kernel's end")
                    break
                calls.append((a.span[0], a.span[1], _text(src, value)))
            else:
                if len(addresses) != 1:
                    reasons.append(f"the atomics onto `{array}` are written with different addresses")
                    continue
                plans.append(_Target(array, mine[0].elem_type, _text(src, node_at(src, root, mine[0].span)
                                                                        .child_by_field_name("arguments").named_children[0]),
                                     tuple(calls)))
        if reasons:
            return [], "; ".join(reasons)
        return plans, ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plans, why = self.plan(ctx)
        if not plans:
            return False, why
        return True, "; ".join(
            f"every atomic onto `{p.array}` is an atomicAdd at `{p.address}`, the same address for the whole block, "
            "its old value unused, the array touched nowhere else" for p in plans) + "; every thread reaches the kernel's end"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plans, _ = self.plan(ctx)
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        edit = BodyEdit(ctx.preprocessed, facts)
        lo, hi = facts.body_span
        decls = "".join(f"    {p.elem_type} kl_acc{k} = ({p.elem_type})0;\n    bool kl_hit{k} = false;\n"
                        for k, p in enumerate(plans))
        edit.insert(lo + 1, f"\n{decls}    do {{ // the original body; a return leaves it for the block's sums")
        for k, p in enumerate(plans):
            for start, end, value in p.calls:
                edit.replace(start, end, f"(kl_acc{k} += ({p.elem_type})({value}), kl_hit{k} = true)")
        kernel = node_at(src, root, facts.span)
        for ret in _returns(kernel.child_by_field_name("body")):
            edit.replace(ret.start_byte, ret.end_byte, "break;")
        tail = ["    } while (0);",
                "    const unsigned kl_t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);"]
        for k, p in enumerate(plans):
            core = _block_reduce("+", p.elem_type, f"kl_acc{k}", f"kl_part{k}", "kl_t", "blockDim.x * blockDim.y * blockDim.z")
            # Only a block one of whose threads reached the atomic touches the address (it may be out of
            # bounds for the others).
            tail.append(f"    if (__syncthreads_or(kl_hit{k})) {{ // one atomic per block\n        "
                        + core.replace("\n", "\n    ").rstrip() + "\n"
                        f"        if (kl_t == 0u) atomicAdd({p.address}, kl_total);\n    }}")
        edit.insert(hi - 1, "\n".join(tail) + "\n")
        source, expanded = emit(edit, ctx.source, ctx.kernel, warp_reduce_helpers({"+"}, ctx.source))
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        what = ", ".join(f"`{p.array}`" for p in plans)
        return (Rewrite(source, f"the atomics onto {what} summed per thread, reduced in the block with warp shuffles, "
                                f"one atomicAdd per block; same grid and block{note}"),)


def _cast_pointer(address: Node) -> bool:
    """The atomic's address is itself a cast (``(T*)&a[i]``): it adds another element type than the array's."""
    while address.type == "parenthesized_expression" and address.named_children:
        address = address.named_children[0]
    return address.type == "cast_expression"


def _returns(body: Node) -> list[Node]:
    found, stack = [], [body]
    while stack:
        n = stack.pop()
        if n.type == "return_statement":
            found.append(n)
        stack.extend(n.children)
    return found


def _exits_refusal(body: Node, src: bytes, syncs: int) -> str | None:
    """Why a ``return`` cannot become a ``break`` out of a ``do … while (0)`` around the body, or None."""
    for ret in _returns(body):
        if ret.named_child_count:
            return "a return with a value"
        p = ret.parent
        while p is not None and p != body:
            if p.type in ("for_statement", "while_statement", "do_statement", "switch_statement"):
                return f"a return inside a loop or switch (line {ret.start_point[0] + 1}) cannot leave the body by a break"
            p = p.parent
        if syncs:
            return "a return in a kernel with barriers: the threads that left would now reach the original's barriers"
    if _has(body, ("goto_statement",)):
        return "a goto in the kernel"
    return None


# --------------------------------------------------------------------------------------------
# A tree per tile of a loop: the tiles summed in registers, one block reduction after the loop
# --------------------------------------------------------------------------------------------

#: Independent partial sums per thread in the accumulation loop (its loads are in flight together).
_PARTIALS = 4


@dataclass(frozen=True)
class _Hoist:
    tree: _Tree
    loop: LoopFact
    loop_node: Node
    decls: tuple[Node, ...]
    """The declarations of the loop's body before the slot's store (the slot's value reads them)."""
    value: Node
    """The value each thread stores in its slot of the tree."""
    consumer: Node
    """The statement that folds the tree's root into the accumulator (``if (tid == 0) total += buf[0];``)."""
    root: Access
    start: Node
    bound: Node
    step: Node


class TreeToRegisters(Rule):
    """A shared-memory tree per iteration of a loop (a tile loaded, reduced, its root added to an
    accumulator by thread 0) as a per-thread register sum over all the iterations (four partial sums),
    then one block reduction by warp shuffles, added to the accumulator once.

    Legality, in terms of the analysis: the tree is :class:`TreeToShuffle`'s (simulated a reduction of
    every slot into slot 0 at each block size, reached by every thread, only the root read after it),
    with ``+``; its loop runs the same iterations in every thread (start, bound and step uniform);
    in that loop the array is written only at the thread's own slot, by a statement at the top of the
    loop's body whose value reads only the loop's variable, locals declared before it there and
    arrays the kernel does not write; the root is read once, to add it to an accumulator of the loop,
    and only by thread 0; the loop's body holds nothing else but barriers."""

    name = "tree-to-registers"
    technique = "warp-shuffle-reduction"
    summary = "a tree per tile of a loop: tiles summed in registers, one warp-shuffle block reduction after the loop"

    def plan(self, ctx: RuleContext) -> tuple[_Hoist | None, str]:
        trees, why = TreeToShuffle().plan(ctx)
        if not trees:
            return None, why
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        reasons = []
        for tree in trees:
            found = self._hoist(ctx, facts, tree, src, root)
            if isinstance(found, str):
                reasons.append(f"the tree on `{tree.array}`: {found}")
            else:
                return found, ""
        return None, "; ".join(reasons)

    def _hoist(self, ctx, facts: KernelFacts, tree: _Tree, src: bytes, root: Node) -> _Hoist | str:
        if tree.op != "+":
            return f"its operator `{tree.op}` (only sums are regrouped over the iterations)"
        if tree.loop.parent is None:
            return "it is in no loop (tree-to-shuffle rewrites it alone)"
        loop = facts.loops[tree.loop.parent]
        node = node_at(src, root, loop.span)
        if node is None or node.type != "for_statement" or loop.var is None or None in (loop.start, loop.step, loop.bound):
            return "its loop's start, step or bound is not known"
        if any(thread_dependence(p, facts.opaque) for p in (loop.start, loop.step, loop.bound)):
            return "its loop runs different iterations in different threads"
        header = _header(node, loop.var, src)
        if header is None:
            return "its loop's bound or step is not known from its header (the counter tested with `<`, stepped by `+=`)"
        start, bound, step = header
        body = node.child_by_field_name("body")
        stmts = [c for c in body.named_children if c.type != "comment"] if body.type == "compound_statement" else [body]
        tree_node = node_at(src, root, tree.loop.span)
        if tree_node not in stmts:
            return "the tree is nested deeper than its loop's body"
        at = stmts.index(tree_node)
        before, after = stmts[:at], stmts[at + 1:]
        inside = [a for a in facts.accesses if loop.span[0] <= a.span[0] < loop.span[1]]
        slot_writes = [a for a in inside if a.array == tree.array and a.writes and not tree.loop.span[0] <= a.span[0] < tree.loop.span[1]]
        roots = [a for a in inside if a.array == tree.array and a.reads and a.span[0] >= tree.loop.span[1]]
        if len(slot_writes) != 1 or slot_writes[0].kind != "write" or slot_writes[0].index != Poly.sym("tid.x"):
            return "its array is not written once per iteration, at the thread's own slot, outside the tree"
        if any(a.writes and a.space == "global" for a in inside):
            return "its loop writes global memory"
        write = slot_writes[0]
        write_stmt = next((s for s in before if s.start_byte <= write.span[0] < s.end_byte), None)
        if write_stmt is None or write_stmt.type != "expression_statement":
            return "the slot's store is nested deeper than the loop's body, or follows the tree"
        # The tree's own array, or any shared array, declared in the loop is not copied into the sums.
        decls = tuple(s for s in before if s.type == "declaration" and "__shared__" not in _text(src, s)
                      and tree.array not in _identifiers(s, src))
        for s in before:
            if s is write_stmt or s.type == "declaration" or _is_barrier(s, src, facts):
                continue  # a declaration of the tree's array or of another shared array stays where it is
            return f"the loop also runs `{_first_line(_text(src, s))}` before the tree, besides declaring locals and filling the slot"
        if any(a.writes for a in inside if any(d.start_byte <= a.span[0] < d.end_byte for d in decls)):
            return "a declaration before the slot's store writes memory"
        assign = write_stmt.named_children[0]
        value = assign.child_by_field_name("right") if assign.type == "assignment_expression" else None
        if value is None or _text(src, assign.child_by_field_name("operator")) != "=":
            return "the slot is updated in place, not stored once"
        if any(a.space == "shared" and value.start_byte <= a.span[0] < value.end_byte for a in inside):
            return "the slot's value reads shared memory (only the slot's own array is regrouped)"
        others = [s for s in after if not _is_barrier(s, src, facts)]
        if len(roots) != 1 or len(others) != 1 or not others[0].start_byte <= roots[0].span[0] < others[0].end_byte:
            return "the root is not read once, by one statement after the tree"
        consumer, root_read = others[0], roots[0]
        if not _read_by_thread_zero(facts, root_read):
            return "the root is read by threads other than thread 0"
        accumulator = next((r for r in facts.reductions if r.kind == "accumulator" and r.loop == loop.id and r.op == "+"), None)
        if accumulator is None or _identifiers(consumer, src) - {accumulator.target, tree.array} - _identifiers_of_condition(consumer, src):
            return "the root is not added to a sum the loop accumulates"
        return _Hoist(tree, loop, node, decls, value, consumer, root_read, start, bound, step)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        return True, (f"the tree on `{plan.tree.array}` sums every slot each iteration of the loop at line "
                      f"{(plan.loop.user_line or 0) + 1} and only thread 0 adds its root to a sum: the iterations' values "
                      "can be summed per thread first")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        assert plan is not None
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        elem, var = plan.tree.elem_type, plan.loop.var
        indent = BodyEdit(ctx.preprocessed, facts).indent_at(plan.loop.span[0])

        def copies(text, at: str) -> str:
            """The loop body's declarations and the slot's value with the loop variable at ``at``."""
            def with_var(node: Node) -> str:
                subs = [(n.start_byte, n.end_byte, f"({at})") for n in _identifier_nodes(node, src) if _text(src, n) == var]
                return text(node.start_byte, node.end_byte, subs)
            return " ".join(with_var(d) for d in plan.decls), with_var(plan.value)

        def build(text) -> str:
            step = text(plan.step.start_byte, plan.step.end_byte)
            bound = text(plan.bound.start_byte, plan.bound.end_byte)
            start = text(plan.start.start_byte, plan.start.end_byte)
            lines = [f"{{ // each thread sums its values of every iteration ({_PARTIALS} partial sums), then one block reduction",
                     f"    {elem} " + ", ".join(f"kl_a{k} = ({elem})0" for k in range(_PARTIALS)) + ";",
                     f"    auto kl_b = {start};",
                     f"    for (; kl_b + {_PARTIALS - 1} * ({step}) < ({bound}); kl_b += {_PARTIALS} * ({step})) {{"]
            for k in range(_PARTIALS):
                decls, value = copies(text, f"kl_b + {k} * ({step})" if k else "kl_b")
                lines.append(f"        {{ {decls} kl_a{k} += ({elem})({value}); }}".replace("{  ", "{ "))
            decls, value = copies(text, "kl_b")
            lines += ["    }",
                      f"    for (; kl_b < ({bound}); kl_b += ({step})) {{ {decls} kl_a0 += ({elem})({value}); }}".replace("{  ", "{ "),
                      "    " + _block_reduce("+", elem, " + ".join(f"kl_a{k}" for k in range(_PARTIALS)), "kl_part", "threadIdx.x",
                                             "blockDim.x").rstrip(),
                      "    " + text(plan.consumer.start_byte, plan.consumer.end_byte,
                                    [(plan.root.span[0], plan.root.span[1], "kl_total")]),
                      "}"]
            return ("\n" + indent).join(lines)

        helpers = warp_reduce_helpers({"+"}, ctx.source)
        source, expanded = rebuild_span(ctx.preprocessed, facts, ctx.source, ctx.kernel, plan.loop.span, build, helpers)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"the tree on `{plan.tree.array}` per iteration replaced by {_PARTIALS} register sums per "
                                f"thread over the loop and one warp-shuffle block reduction; same grid and block{note}"),)


def _header(node: Node, var: str, src: bytes) -> tuple[Node, Node, Node] | None:
    """(start, bound, step) expressions of ``for (T var = start; var < bound; var += step)``."""
    init, cond, update = (node.child_by_field_name(f) for f in ("initializer", "condition", "update"))
    start = None
    if init is not None and init.type == "declaration":
        decls = init.children_by_field_name("declarator")
        start = decls[0].child_by_field_name("value") if len(decls) == 1 and decls[0].type == "init_declarator" else None
    elif init is not None and init.type == "assignment_expression":
        start = init.child_by_field_name("right")
    if start is None or cond is None or cond.type != "binary_expression" or _text(src, cond.child_by_field_name("operator")) != "<":
        return None
    left = cond.child_by_field_name("left")
    if left is None or _text(src, left) != var:
        return None
    if update is None or update.type != "assignment_expression" or _text(src, update.child_by_field_name("operator")) != "+=" \
            or _text(src, update.child_by_field_name("left")) != var:
        return None
    return start, cond.child_by_field_name("right"), update.child_by_field_name("right")


def _read_by_thread_zero(facts: KernelFacts, access: Access) -> bool:
    """Some guard of ``access`` proves ``threadIdx.x == 0`` (on a 1-D block: thread 0 alone)."""
    tid = Poly.sym("tid.x")
    return any(c.op == "==" and {c.left, c.right} == {tid, Poly()} for c in facts.constraints(access))


def _identifiers_of_condition(stmt: Node, src: bytes) -> set[str]:
    cond = stmt.child_by_field_name("condition") if stmt.type == "if_statement" else None
    return _identifiers(cond, src) if cond is not None else set()


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
