"""Shared-memory reduction trees read from the kernel model and proven by simulating them.

A *tree* is a run of statements of the kernel's body that combine slots of shared arrays in place
(``A[w] op= A[r]``, ``A[w] = A[w] op A[r]``, ``A[w] = max(A[w], A[r])``), with barriers between:
a looped tree (``for (s = blockDim.x / 2; s > 0; s >>= 1) { if (tid < s) A[tid] += A[tid + s];
__syncthreads(); }``, or a ``while`` whose counter is set right before it and stepped by its body's
last statement), an unrolled one (``if (blockSize >= 512) { if (tid < 256) A[tid] += A[tid +
256]; __syncthreads(); }`` …), a warp-synchronous tail without barriers (``if (tid < 32) { A[tid] +=
A[tid + 32]; A[tid] += A[tid + 16]; … }``, written in the kernel or in a ``__device__`` helper on a
``volatile`` pointer), or all of them in a row, on one array or on several side by side (a sum, a
minimum and a maximum in one pass). Which array a statement combines, its indices and the
conditions it runs under are the analysis' (:class:`~kernel_lsp.core.analysis.KernelFacts`:
through macros, template constants, aliases and helpers); a loop's steps are evaluated from its
header, since its counter halves or doubles.

:func:`find_trees` proves each run at every block size of the spec by running it for every thread
on multisets of the slots' initial values, step by step, each step's reads before its writes (the
lockstep a warp-synchronous tail was written for):

- every thread that runs a step reads and writes slots the analysis can evaluate;
- no slot is written twice in one step, and no two threads of *different warps* touch a slot that
  one of them writes without a block barrier between them (the same warp may: the tail's lockstep,
  which the rewrite makes explicit with shuffles, is what the tree means; the original's own race on
  Volta and later is not reproduced);
- every block barrier in the run is reached by all threads or by none;
- afterwards the kernel reads each array only at slots the same for every thread (its *roots*): at
  an index that does not depend on the thread, or in a thread its guards pin (``if (tid ==
  blockDim.x - 1) out[b] = A[tid];`` reads the last slot); reads in a branch the tree's own
  conditions exclude do not count;
- each root ``r`` ends holding every slot ``b .. b + n - 1`` exactly once for a block of ``n``
  threads, where ``b`` is ``r`` (a tree that gathers into its first slot) or, for a root read in a
  pinned thread, ``r - n + 1`` (a tree that gathers into its last slot, ``if ((tid + 1) % i == 0)
  A[tid] += A[tid - i/2];``): the tree computes, into ``r``, the block's total of the values the
  threads left in their slots ``b + threadIdx.x``.

Each refusal names the fact that was missing (a statement that is no step, an index the analysis
cannot evaluate, a race, a slot read afterwards that holds no total).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import Access, Barrier, KernelFacts, LoopFact, Opaque, assigned_names, function_definitions
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.analysis import has_node as _has
from kernel_lsp.core.analysis import shared_combine_loops, thread_dependence
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.rules.base import MAX_THREADS_PER_BLOCK, RuleContext
from kernel_lsp.core.transforms.counted_loop import value_set_before
from kernel_lsp.core.transforms.emit import WARP_REDUCE, node_at, parse, user_line_of

#: Most steps simulated for one loop (a 1024-thread tree has 10).
MAX_STEPS = 64
#: Helpers followed into from a tree's statements (a tail helper calling another).
_MAX_HELPER_DEPTH = 3
MINMAX = {"max": "max", "fmaxf": "max", "fmax": "max", "min": "min", "fminf": "min", "fmin": "min"}
_BUILTIN_C = {"tid.x": "threadIdx.x", "tid.y": "threadIdx.y", "tid.z": "threadIdx.z", "bdim.x": "blockDim.x",
              "bdim.y": "blockDim.y", "bdim.z": "blockDim.z", "bid.x": "blockIdx.x", "bid.y": "blockIdx.y",
              "bid.z": "blockIdx.z", "gdim.x": "gridDim.x", "gdim.y": "gridDim.y", "gdim.z": "gridDim.z"}


class Unknown(Exception):
    """An expression the evaluator cannot compute; its message names what."""


def _in_range(v: int, what: str) -> int:
    # Non-negative values below 2**31 behave the same in signed and unsigned C arithmetic, whose types
    # the evaluator does not track: anything else is refused rather than guessed.
    if not 0 <= v < 2 ** 31:
        raise Unknown(f"a value outside 0..2^31 ({v} for `{what}`), whose signedness is not modelled")
    return v


class Eval:
    """Integer values of the small expressions a tree's loop is written with: its header, the guard,
    the indices. Locals are resolved through their single declaration before ``limit`` (a byte
    offset) when the kernel never assigns them again; ``constants`` are the instance's template
    constants and the file's (:attr:`KernelFacts.constants`)."""

    def __init__(self, src: bytes, body: Node, limit: int, group_values: Mapping[str, Poly] | None = None,
                 constants: Mapping[str, int] | None = None):
        self.src = src
        # ``cta.thread_rank()``, ``block.size()`` …: the thread-index polynomials they stand for.
        self.group_values = group_values or {}
        self.constants = constants or {}
        self.assigned = assigned_names(body, src)
        self.decls: dict[str, Node | None] = {}
        stack = [body]
        while stack:
            n = stack.pop()
            if n.type == "init_declarator" and n.start_byte < limit:
                name = n.child_by_field_name("declarator")
                value = n.child_by_field_name("value")
                if name is not None and name.type == "identifier" and value is not None:
                    key = _text(src, name)
                    self.decls[key] = None if key in self.decls else value
            stack.extend(n.children)

    def value(self, node: Node, env: dict[str, int], depth: int = 0) -> int:
        return _in_range(self._value(node, env, depth), _text(self.src, node))

    def _value(self, node: Node, env: dict[str, int], depth: int = 0) -> int:
        if depth > 40:
            raise Unknown("an expression nested too deeply")
        t, src = node.type, self.src
        if t == "number_literal":
            text = _text(src, node).rstrip("uUlL")
            try:
                return int(text, 0)
            except ValueError:
                raise Unknown(f"the literal `{_text(src, node)}`") from None
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
                raise Unknown(f"`{_text(src, node)}`")
            return value
        if t == "field_expression":
            key = _text(src, node).replace(" ", "")
            if key in env:
                return env[key]
            raise Unknown(f"`{key}`")
        if t == "identifier":
            name = _text(src, node)
            if name in env:
                return env[name]
            value = self.decls.get(name)
            if value is None and name not in self.decls and name not in self.assigned and name in self.constants:
                return self.constants[name]
            if value is None or name in self.assigned:
                raise Unknown(f"`{name}`, which is not one value for the whole tree")
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
            return binary(op, a, b)
        raise Unknown(f"`{_text(src, node)}`")


def binary(op: str, a: int, b: int) -> int:
    if op in ("/", "%"):
        if b == 0:
            raise Unknown("a division by zero")
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        return q if op == "/" else a - q * b
    table = {"+": a + b, "-": a - b, "*": a * b, "<<": a << b if 0 <= b < 64 else 0, ">>": a >> b if 0 <= b < 64 else 0,
             "&": a & b, "|": a | b, "^": a ^ b, "<": int(a < b), "<=": int(a <= b), ">": int(a > b),
             ">=": int(a >= b), "==": int(a == b), "!=": int(a != b), "&&": int(bool(a and b)), "||": int(bool(a or b))}
    if op not in table:
        raise Unknown(f"the operator `{op}`")
    return table[op]


def poly_value(poly: Poly, env: Mapping[str, int], opaque: Mapping[str, Opaque], depth: int = 0) -> int:
    """``poly``'s value under ``env``, its opaque terms computed from their recipes; a term without
    one (a load, a value the analysis does not model) makes it unknown."""
    if depth > 32:
        raise Unknown("an expression nested too deeply")
    values: dict[str, int] = {}
    for s in poly.symbols:
        if s in env:
            continue
        entry = opaque.get(s)
        if entry is None or entry.recipe is None:
            raise Unknown(f"`{entry.text if entry is not None else s}`, which is not one value for the whole tree")
        values[s] = _recipe_value(entry, env, opaque, depth + 1)
    value = poly.evaluate({**env, **values})
    if value is None:
        raise Unknown(f"`{poly}`")
    return _in_range(value, str(poly))


def _recipe_value(entry: Opaque, env: Mapping[str, int], opaque: Mapping[str, Opaque], depth: int) -> int:
    recipe = entry.recipe
    if recipe[0] == "select":
        _, left, cmp, right, a, b = recipe
        taken = binary(cmp, poly_value(left, env, opaque, depth), poly_value(right, env, opaque, depth))
        return poly_value(a if taken else b, env, opaque, depth)
    op, a, b = recipe
    av, bv = poly_value(a, env, opaque, depth), poly_value(b, env, opaque, depth)
    if op in ("min", "max"):
        return min(av, bv) if op == "min" else max(av, bv)
    return _in_range(binary(op, av, bv), entry.text)


def test_value(test: tuple, env: Mapping[str, int], opaque: Mapping[str, Opaque]) -> bool:
    """A condition of the analysis (:data:`~kernel_lsp.core.analysis.facts.Test`) under ``env``."""
    kind = test[0]
    if kind == "cmp":
        c = test[1]
        return bool(binary(c.op, poly_value(c.left, env, opaque), poly_value(c.right, env, opaque)))
    if kind == "not":
        return not test_value(test[1], env, opaque)
    if kind == "and":
        return all(test_value(t, env, opaque) for t in test[1])
    if kind == "or":
        return any(test_value(t, env, opaque) for t in test[1])
    raise Unknown("a condition the analysis does not model")


def c_index(poly: Poly) -> str:
    """A thread-independent index polynomial as C (``2*bdim.x`` → ``2 * blockDim.x``)."""
    terms = []
    for monomial, coefficient in poly.terms:
        factors = [_BUILTIN_C.get(s, s) for s in monomial]
        if coefficient != 1 or not factors:
            factors.insert(0, str(coefficient))
        terms.append(" * ".join(factors))
    return " + ".join(terms) or "0"


def c_text(poly: Poly) -> str:
    """``poly`` as a 64-bit C expression of scalar parameters and builtins."""
    terms = []
    for m, c in poly.terms:
        factors = [str(c)] + [_BUILTIN_C.get(s, s) for s in m]
        terms.append("*".join(f"(long long)({f})" for f in factors))
    return " + ".join(terms) or "0"


@dataclass(frozen=True)
class Update:
    """``A[w] op= A[r]`` (or ``A[w] = A[w] op A[r]``, ``A[w] = max(A[w], A[r])``): the slots' index
    expressions and the two subscripts (which array they name is the analysis')."""
    op: str
    write: Node
    read: Node
    write_ref: Node
    read_ref: Node


def _subscript(node: Node, src: bytes) -> tuple[Node, Node] | None:
    """(the subscript, its one index) of ``name[i]``, else None."""
    while node.type == "parenthesized_expression" and node.named_children:
        node = node.named_children[0]
    if node.type != "subscript_expression":
        return None
    arg = node.child_by_field_name("argument")
    if arg is None or arg.type != "identifier":
        return None
    idx = node.child_by_field_name("indices") or node.child_by_field_name("index")
    if idx is not None and idx.type == "subscript_argument_list":
        idx = idx.named_children[0] if idx.named_child_count == 1 else None
    return (node, idx) if idx is not None else None


def _same(src: bytes, a: Node, b: Node) -> bool:
    return "".join(_text(src, a).split()) == "".join(_text(src, b).split())


def update_form(stmt: Node, src: bytes) -> Update | None:
    if stmt.type == "compound_statement":
        inner = [c for c in stmt.named_children if c.type != "comment"]
        return update_form(inner[0], src) if len(inner) == 1 else None
    if stmt.type != "expression_statement" or not stmt.named_children:
        return None
    e = stmt.named_children[0]
    if e.type != "assignment_expression":
        return None
    op = _text(src, e.child_by_field_name("operator"))
    left, right = e.child_by_field_name("left"), e.child_by_field_name("right")
    w = _subscript(left, src)
    if w is None or right is None:
        return None
    name = _text(src, w[0].child_by_field_name("argument"))
    if op == "+=":
        r = _subscript(right, src)
        if r is None or _text(src, r[0].child_by_field_name("argument")) != name:
            return None
        return Update("+", w[1], r[1], w[0], r[0])
    if op != "=":
        return None
    while right.type == "parenthesized_expression":
        right = right.named_children[0]
    if right.type == "binary_expression" and _text(src, right.child_by_field_name("operator")) == "+":
        operands = [right.child_by_field_name("left"), right.child_by_field_name("right")]
        kind = "+"
    elif right.type == "call_expression" and _text(src, right.child_by_field_name("function")) in MINMAX:
        args = right.child_by_field_name("arguments")
        operands = list(args.named_children) if args is not None else []
        kind = MINMAX[_text(src, right.child_by_field_name("function"))]
    else:
        return None
    if len(operands) != 2:
        return None
    refs = [_subscript(o, src) for o in operands]
    if any(r is None or _text(src, r[0].child_by_field_name("argument")) != name for r in refs):
        return None
    same = [r for r in refs if _same(src, r[1], w[1])]
    if not same:
        return None
    other = refs[1] if refs[0] is same[0] else refs[0]
    return Update(kind, w[1], other[1], w[0], other[0])


def barrier_of(stmt: Node, facts: KernelFacts) -> Barrier | None:
    """The barrier the statement is and nothing else (``__syncthreads();``, ``cta.sync();``,
    ``cg::sync(block);``, ``__syncwarp();``), as the analysis found it."""
    if stmt.type != "expression_statement" or stmt.named_child_count != 1:
        return None
    call = stmt.named_children[0]
    return next((b for b in facts.barriers if b.span == (call.start_byte, call.end_byte)), None)


def is_barrier(stmt: Node, src: bytes, facts: KernelFacts) -> bool:
    """The statement is a block barrier and nothing else."""
    b = barrier_of(stmt, facts)
    return b is not None and b.scope == "block"


def first_line(text: str) -> str:
    line = text.split("\n", 1)[0].strip()
    return line if len(line) <= 60 and "\n" not in text else line[:60] + " …"


@dataclass(frozen=True)
class TreeValue:
    """One value a tree reduces: the slots ``base + threadIdx.x`` of ``array`` into ``root``."""
    array: str
    """The analysis' name of the array."""
    name: str
    """The array as the kernel's body names it where the tree is (``sdata`` for ``s_float`` reached
    through a pointer)."""
    elem_type: str
    op: str
    root: Poly
    base: Poly | None = None
    """The block's first slot when it is not the root (a tree gathering into its last slot)."""
    segment: int | None = None
    """Lanes per group when the tree reduces each group of ``segment`` neighbouring threads of a warp
    on its own (a warp-synchronous tree per warp or per part of one), each group's total in its first
    slot ``root + threadIdx.x`` read by that group's first thread; None for a tree over the block."""

    @property
    def first(self) -> Poly:
        """The slot thread 0 fills: the block's slots are ``first + threadIdx.x``."""
        return self.root if self.base is None else self.base


@dataclass(frozen=True)
class SharedTree:
    span: tuple[int, int]
    """From the first statement of the tree to the end of its last, in the preprocessed text."""
    values: tuple[TreeValue, ...]
    loop: LoopFact | None
    """The tree's loop when the tree is that one loop."""
    user_line: int | None

    @property
    def array(self) -> str:
        return self.values[0].array

    @property
    def elem_type(self) -> str:
        return self.values[0].elem_type

    @property
    def op(self) -> str:
        return self.values[0].op


@dataclass(frozen=True)
class _LoopBody:
    node: Node
    loop: LoopFact
    start: Node
    """The counter's first value (the ``for``'s initializer, or the declaration before a ``while``)."""
    cond: Node
    update: Node
    decls: tuple[Node, ...]
    items: tuple[tuple, ...]
    """In body order: ``("barrier",)`` or ``("update", guard node or None, Update, array)``."""


class _Reader:
    """The statements of one kernel body read as tree items: ``("barrier", Barrier)``, ``("step",
    Update, write access, read access)`` or ``("loop", _LoopBody)``."""

    def __init__(self, facts: KernelFacts, src: bytes, root: Node, body: Node):
        self.facts, self.src, self.root, self.body = facts, src, root, body
        self.by_span: dict[tuple[int, int], list[Access]] = {}
        for a in facts.accesses:
            self.by_span.setdefault(a.span, []).append(a)
        self.helpers = {name: node for name, node, head in function_definitions(root, src) if "__global__" not in head}
        self.loops = {lp.span: lp for lp in facts.loops}

    def _shared(self, ref: Node, write: bool, array: str | None = None) -> Access | None:
        found = [a for a in self.by_span.get((ref.start_byte, ref.end_byte), ())
                 if a.space == "shared" and (a.writes if write else a.kind == "read") and (array is None or a.array == array)]
        return found[0] if len(found) == 1 else None

    def _accesses_in(self, node: Node) -> list[Access]:
        return [a for span, found in self.by_span.items() if node.start_byte <= span[0] < node.end_byte for a in found]

    def step(self, stmt: Node) -> tuple | str | None:
        """The statement as a step, a reason it cannot be one, or None when it combines no slots."""
        u = update_form(stmt, self.src)
        if u is None:
            return None
        write = self._shared(u.write_ref, True)
        read = self._shared(u.read_ref, False, write.array) if write is not None else None
        if write is None or read is None:
            return f"`{first_line(_text(self.src, stmt))}` combines no two slots of one shared array the analysis sees once"
        return ("step", u, write, read)

    def items(self, stmt: Node, top: bool, depth: int = 0) -> list | str:
        src, t = self.src, stmt.type
        where = f"`{first_line(_text(src, stmt))}` at line {stmt.start_point[0] + 1}"
        if t == "comment":
            return []
        barrier = barrier_of(stmt, self.facts)
        if barrier is not None:
            if barrier.scope == "grid":
                return f"{where} is a grid barrier"
            # A warp's barrier orders nothing the simulation's lockstep does not already.
            return [("barrier", barrier)] if barrier.scope == "block" else []
        if t == "compound_statement":
            out: list = []
            for c in stmt.named_children:
                found = self.items(c, False, depth)
                if isinstance(found, str):
                    return found
                out += found
            return out
        if t == "expression_statement":
            step = self.step(stmt)
            if step is not None:
                return step if isinstance(step, str) else [step]
            return self._call(stmt, depth) or f"{where} does more than combine two slots of a shared array"
        if t == "declaration":
            if top:
                return f"{where} declares a name the code after it may read"
            if "__shared__" in _text(src, stmt) or self._accesses_in(stmt):
                return f"{where} declares shared memory or reads memory"
            return []
        if t == "if_statement":
            if stmt.child_by_field_name("alternative") is not None:
                return f"{where} has an else branch"
            cond = stmt.child_by_field_name("condition")
            if cond is not None and self._accesses_in(cond):
                return f"{where} reads memory in its condition"
            found = self.items(stmt.child_by_field_name("consequence"), False, depth)
            if isinstance(found, list) and any(i[0] == "loop" for i in found):
                return f"{where} runs a tree's loop under a condition"
            return found
        if t in ("for_statement", "while_statement") and top:
            body = self.loop_body(stmt)
            return body if isinstance(body, str) else [("loop", body)]
        return f"{where} is not a step of a tree, a barrier or a condition around them"

    def _call(self, stmt: Node, depth: int) -> list | str | None:
        """A call of a helper of the file whose body is tree items (a warp-synchronous tail)."""
        call = stmt.named_children[0] if stmt.named_child_count == 1 else None
        if call is None or call.type != "call_expression":
            return None
        fn = call.child_by_field_name("function")
        name = _text(self.src, fn).split("<", 1)[0].rsplit("::", 1)[-1].strip() if fn is not None else ""
        helper = self.helpers.get(name)
        body = helper.child_by_field_name("body") if helper is not None else None
        if body is None or depth >= _MAX_HELPER_DEPTH:
            return None
        inside = self._accesses_in(body)
        if not inside or any(len(self.by_span[a.span]) != 1 for a in inside):
            return f"the helper `{name}` is called more than once in the kernel, or touches no shared array"
        found = self.items(body, False, depth + 1)
        return found if isinstance(found, str) or any(i[0] == "step" for i in found) else None

    def loop_body(self, node: Node, anchor: str = "a shared array") -> _LoopBody | str:
        src, facts = self.src, self.facts
        loop = self.loops.get((node.start_byte, node.end_byte))
        if loop is None or node.type not in ("for_statement", "while_statement") or loop.var is None:
            return "the analysis finds no counter of its loop (a variable started, tested and stepped)"
        if not facts.body_span[0] <= loop.span[0] < loop.span[1] <= facts.body_span[1]:
            return "the tree is in a helper function, not in the kernel's body"
        loop_body = node.child_by_field_name("body")
        stmts = [c for c in loop_body.named_children if c.type != "comment"] if loop_body.type == "compound_statement" else [loop_body]
        if node.type == "for_statement":
            init, cond, update = (node.child_by_field_name(f) for f in ("initializer", "condition", "update"))
            start = _start_value(init)
        else:
            # ``int s = blockDim.x / 2; while (s != 0) { …; s /= 2; }``: the counter set right before the loop,
            # stepped by the body's last statement.
            cond, start, update = node.child_by_field_name("condition"), value_set_before(node, loop.var, self.src), None
            if stmts and stmts[-1].type == "expression_statement" and stmts[-1].named_child_count == 1 \
                    and _steps_var(stmts[-1].named_children[0], loop.var, src):
                update = stmts[-1].named_children[0]
                stmts = stmts[:-1]
            if cond is not None and cond.type == "condition_clause":
                cond = cond.child_by_field_name("value") or cond.named_children[0]
        if node.type == "while_statement" and (start is None or update is None):
            return (f"its counter `{loop.var}` is not set by the statement right before the loop and stepped by the "
                    "last statement of its body")
        if start is None or cond is None or update is None:
            return "the loop header lacks a start, a condition or an update"
        items: list[tuple] = []
        decls = []
        barrier = False
        for s in stmts:
            b = barrier_of(s, facts)
            if b is not None and b.scope == "block":
                items.append(("barrier",))
                barrier = True
            elif b is not None and b.scope == "warp":
                continue
            elif s.type == "declaration":
                decls.append(s)
            elif s.type == "if_statement" and s.child_by_field_name("alternative") is None:
                guard = s.child_by_field_name("condition")
                if guard is not None and guard.type == "condition_clause":
                    guard = guard.child_by_field_name("value") or guard.named_children[0]
                then = s.child_by_field_name("consequence")
                inner = [c for c in then.named_children if c.type != "comment"] if then.type == "compound_statement" else [then]
                for c in inner:
                    u = update_form(c, src)
                    write = self._shared(u.write_ref, True) if u is not None else None
                    if write is None or self._shared(u.read_ref, False, write.array) is None:
                        return f"the guarded statement `{first_line(_text(src, s))}` does more than combine two slots of {anchor}"
                    items.append(("update", guard, u, write.array))
            elif (u := update_form(s, src)) is not None and (write := self._shared(u.write_ref, True)) is not None \
                    and self._shared(u.read_ref, False, write.array) is not None:
                items.append(("update", None, u, write.array))
            else:
                return f"its loop also runs `{first_line(_text(src, s))}`, besides combining slots of {anchor} and barriers"
        updates = [i for i in items if i[0] == "update"]
        if not updates:
            return "its body does not hold a tree step"
        if not barrier:
            return "no barrier at the top level of its body separates the steps"
        for i in updates:
            if i[2].op not in WARP_REDUCE:
                return f"the operator `{i[2].op}` has no shuffle reduction here"
        return _LoopBody(node, loop, start, cond, update, tuple(decls), tuple(items))

    def regions(self) -> list[tuple[list[Node], list[list]]]:
        """Maximal runs of sibling statements that are tree items, trimmed to those that combine slots;
        a run inside another is left out."""
        found: list[tuple[list[Node], list[list]]] = []
        stack = [self.body]
        while stack:
            block = stack.pop()
            if any(s[0].start_byte <= block.start_byte and block.end_byte <= s[-1].end_byte for s, _ in found):
                continue
            if block.type == "compound_statement":
                run: list[tuple[Node, list]] = []
                for c in [*block.named_children, None]:
                    got = self.items(c, True) if c is not None else "end"
                    if isinstance(got, list) and c is not None:
                        run.append((c, got))
                        continue
                    while run and not any(i[0] != "barrier" for i in run[-1][1]):
                        run.pop()
                    while run and not any(i[0] != "barrier" for i in run[0][1]):
                        run.pop(0)
                    if run:
                        found.append(([s for s, _ in run], [i for _, i in run]))
                    run = []
            stack.extend(reversed(block.named_children))
        return found


class _Sim:
    """Slots of shared arrays as multisets of the slots' initial values, updated step by step, with
    the accesses since the last block barrier for the race check."""

    def __init__(self, domains: Mapping[str, set[int]], strict: bool = False):
        """``strict``: a slot outside ``domains`` is a refusal at once (every root is slot 0, so no other
        reading of the tree can make it one)."""
        self.slots: dict[tuple[str, int], dict[int, int]] = {}
        self.ops: dict[tuple[str, int], frozenset[str]] = {}
        """The operators that combined each slot's value (one value is one operator's)."""
        self.epoch: dict[tuple[str, int], list[tuple[int, bool]]] = {}
        self.domains = domains
        self.outside: int | None = None
        self.strict = strict
        """The first slot a step touched outside the roots' slots."""

    def value(self, array: str, slot: int) -> dict[int, int]:
        return self.slots.get((array, slot), {slot: 1})

    def barrier(self) -> None:
        self.epoch.clear()

    def step(self, array: str, op: str, pairs: Mapping[int, tuple[int, int]]) -> str | None:
        """Every thread's ``(write, read)`` of one step: all reads happen before the writes."""
        writes: dict[int, int] = {}
        reads: dict[int, list[int]] = {}
        domain = self.domains[array]
        for t, (w, r) in pairs.items():
            if (w not in domain or r not in domain) and self.outside is None:
                self.outside = r if r not in domain else w
                if self.strict:
                    return f"a step reads or writes slot {self.outside}, outside the block's slots"
            if w in writes or w == r:
                return f"slot {w} is written twice in one step"
            writes[w] = t
            reads.setdefault(r, []).append(t)
        for w, t in writes.items():
            seen = self.epoch.get((array, w), []) + [(u, False) for u in reads.get(w, ())]
            if any(u != t and u // 32 != t // 32 for u, _ in seen):
                return f"slot {w} is written and read by different warps with no barrier between (a race)"
        for r, ts in reads.items():
            if any(is_write and u // 32 != t // 32 for u, is_write in self.epoch.get((array, r), ()) for t in ts):
                return f"slot {r} is written and read by different warps with no barrier between (a race)"
        new = {}
        for w, t in writes.items():
            merged = dict(self.value(array, w))
            for k, c in self.value(array, pairs[t][1]).items():
                merged[k] = merged.get(k, 0) + c
            new[w] = merged
        for w, v in new.items():
            self.slots[(array, w)] = v
        for w, t in writes.items():
            self.ops[(array, w)] = self.ops.get((array, w), frozenset()) | self.ops.get((array, pairs[t][1]), frozenset()) | {op}
        for w, t in writes.items():
            self.epoch.setdefault((array, w), []).append((t, True))
        for r, ts in reads.items():
            self.epoch.setdefault((array, r), []).extend((t, False) for t in ts)
        return None


def _thread_varying(index: Poly, facts: KernelFacts) -> bool:
    return bool(thread_dependence(index, facts.opaque)) or any(s.startswith(("tid.", "bid.")) for s in index.symbols)


def _pinned_index(access: Access, facts: KernelFacts) -> Poly | None:
    """``access``'s index in the one thread its guards allow (``if (tid == blockDim.x - 1)`` pins
    ``tid.x``), when that makes it the same for every block's run; else None."""
    for c in facts.constraints(access):
        if c.op != "==":
            continue
        for thread, value in ((c.left, c.right), (c.right, c.left)):
            if thread != Poly.sym("tid.x") or _thread_varying(value, facts):
                continue
            coefficient = access.index.coefficient("tid.x")
            if coefficient is None or _thread_varying(coefficient, facts):
                continue
            pinned = access.index - coefficient * Poly.sym("tid.x") + coefficient * value
            if not _thread_varying(pinned, facts):
                return pinned
    return None


def _env(t: int, n: int) -> dict[str, int]:
    return {"tid.x": t, "tid.y": 0, "tid.z": 0, "bdim.x": n, "bdim.y": 1, "bdim.z": 1}


def _loop_events(reader: _Reader, body: _LoopBody, sim: _Sim, n: int) -> str | None:
    """Runs a tree's loop for a block of ``n`` threads: the reason it is not a tree, or None."""
    src, facts = reader.src, reader.facts
    ev = Eval(src, reader.body, body.node.start_byte, facts.group_values, facts.constants)
    var = body.loop.var
    base = {"blockDim.x": n, "blockDim.y": 1, "blockDim.z": 1, "threadIdx.y": 0, "threadIdx.z": 0, "warpSize": 32}
    s = ev.value(body.start, dict(base))
    for _ in range(MAX_STEPS):
        env = dict(base, **{var: s})
        if not ev.value(body.cond, env):
            return None
        for item in body.items:
            if item[0] == "barrier":
                sim.barrier()
                continue
            _, guard, u, array = item
            pairs = {}
            for t in range(n):
                tenv = dict(env, **{"threadIdx.x": t})
                for d in body.decls:
                    for sub in d.children_by_field_name("declarator"):
                        if sub.type == "init_declarator":
                            tenv[_text(src, sub.child_by_field_name("declarator"))] = ev.value(sub.child_by_field_name("value"), tenv)
                if guard is not None and not ev.value(guard, tenv):
                    continue
                pairs[t] = (ev.value(u.write, tenv), ev.value(u.read, tenv))
            why = sim.step(array, u.op, pairs)
            if why:
                return why
        s = _next(ev, body.update, var, env)
    return f"the tree does not end within {MAX_STEPS} steps"


def _start_value(init: Node | None) -> Node | None:
    """The first value of a ``for``'s counter: its declaration's or assignment's right side."""
    if init is None:
        return None
    if init.type == "declaration":
        decl = next(iter(init.children_by_field_name("declarator")), None)
        return decl.child_by_field_name("value") if decl is not None and decl.type == "init_declarator" else None
    if init.type == "assignment_expression":
        return init.child_by_field_name("right")
    return None


def _steps_var(e: Node, var: str, src: bytes) -> bool:
    """``e`` assigns or steps ``var`` alone (``var /= 2``, ``var >>= 1``, ``var++``)."""
    if e.type == "assignment_expression":
        return _text(src, e.child_by_field_name("left")) == var
    if e.type == "update_expression":
        arg = e.child_by_field_name("argument")
        return arg is not None and _text(src, arg) == var
    return False


def _next(ev: Eval, update: Node, var: str, env: dict[str, int]) -> int:
    src = ev.src
    if update.type == "assignment_expression":
        left = update.child_by_field_name("left")
        if _text(src, left) != var:
            raise Unknown(f"the update `{_text(src, update)}`")
        op = _text(src, update.child_by_field_name("operator"))
        v = ev.value(update.child_by_field_name("right"), env)
        if op == "=":
            return v
        return binary(op[:-1], env[var], v)
    if update.type == "update_expression":
        return env[var] + (1 if "++" in _text(src, update) else -1)
    raise Unknown(f"the update `{_text(src, update)}`")


def _guards_value(access: Access | Barrier, facts: KernelFacts, env: Mapping[str, int], region: tuple[int, int],
                  skip: frozenset[int] = frozenset()) -> bool:
    """Whether ``access`` runs under ``env``: its guards, less the tests of loops around the whole tree
    (proven the same for every thread of the block elsewhere) and the conditions ``skip`` names (around a
    warp's tree, proven the same for every thread of a warp)."""
    for cid, value in access.guards:
        c = facts.conditions[cid]
        if cid in skip:
            continue
        if c.kind in ("while", "do", "for") and c.statement_span[0] <= region[0] and region[1] <= c.statement_span[1]:
            continue
        if test_value(c.test, env, facts.opaque) != value:
            return False
    return True


def _simulate(reader: _Reader, items: list, region: tuple[int, int], n: int, domains: Mapping[str, set[int]],
              strict: bool, skip: frozenset[int] = frozenset()) -> _Sim | str:
    facts = reader.facts
    sim = _Sim(domains, strict)
    try:
        for item in items:
            if item[0] == "barrier":
                reached = {_guards_value(item[1], facts, _env(t, n), region, skip) for t in range(n)}
                if len(reached) > 1:
                    return f"the barrier at line {(item[1].user_line or 0) + 1} is reached by some threads only"
                if reached == {True}:
                    sim.barrier()
            elif item[0] == "step":
                _, u, write, read = item
                pairs = {}
                for t in range(n):
                    env = _env(t, n)
                    if _guards_value(write, facts, env, region, skip):
                        pairs[t] = (poly_value(write.index, env, facts.opaque), poly_value(read.index, env, facts.opaque))
                why = sim.step(write.array, u.op, pairs)
                if why:
                    return why
            else:
                why = _loop_events(reader, item[1], sim, n)
                if why:
                    return why
    except Unknown as exc:
        return f"the tree's loop, guard or indices use {exc}, which the simulation cannot evaluate"
    return sim


def _arrays(items: list) -> list[str]:
    """Every array the items combine, in order."""
    out: dict[str, None] = {}
    for item in items:
        if item[0] == "step":
            out.setdefault(item[2].array, None)
        elif item[0] == "loop":
            for i in item[1].items:
                if i[0] == "update":
                    out.setdefault(i[3], None)
    return list(out)


def _flat_items(items: list) -> list:
    return [i for group in items for i in group]


def _region_accesses(reader: _Reader, items: list) -> set[int]:
    """``id``s of the accesses the tree's items are (the helpers' included)."""
    found: set[int] = set()
    for item in items:
        if item[0] == "step":
            found |= {id(item[2]), id(item[3])}
        elif item[0] == "loop":
            found |= {id(a) for a in reader._accesses_in(item[1].node)}
    return found


class TreeReading:
    """The trees of one kernel under a spec: :meth:`trees` and the reasons for the rest."""

    def __init__(self, ctx: RuleContext):
        self.ctx = ctx
        self.reasons: list[str] = []
        self.trees: list[SharedTree] = []
        self.error: str | None = None
        facts = ctx.facts
        if facts is None or not facts.complete:
            self.error = "the kernel's analysis is missing or incomplete"
            return
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            self.error = "the kernel's definition was not found in the preprocessed view"
            return
        self.src, self.root, self.body = src, root, body
        self.reader = _Reader(facts, src, root, body)

    def read(self, sizes: list[int]) -> None:
        facts = self.ctx.facts
        covered: list[tuple[int, int]] = []
        anchors = [facts.loops[r.loop].span for r in shared_combine_loops(facts) if r.loop is not None]
        for stmts, groups in self.reader.regions():
            span = (stmts[0].start_byte, stmts[-1].end_byte)
            if not any(i[0] == "loop" for g in groups for i in g) and any(a[0] < span[0] and span[1] <= a[1] for a in anchors):
                continue  # steps of a loop that combines slots: that loop is the tree, or why it is none is said below
            items = _flat_items(groups)
            found = self._tree(stmts, items, span, sizes)
            covered.append(span)
            line = stmts[0].start_point[0]
            if isinstance(found, str):
                names = ", ".join(f"`{a}`" for a in _arrays(items)) or "a shared array"
                self.reasons.append(f"the tree on {names} at line {self._user_line(line)}: {found}")
            else:
                self.trees.append(found)
        # Trees the analysis found that no run of statements holds: why their loop is no tree.
        unrolled = [r for r in facts.reductions if r.kind == "shared_tree" and r.loop is None]
        told: set[int] = set()
        for red in [*shared_combine_loops(facts), *unrolled]:
            if red.loop is not None:
                loop = facts.loops[red.loop]
                if any(s[0] <= loop.span[0] < s[1] for s in covered) or red.loop in told:
                    continue
                told.add(red.loop)
                node = node_at(self.src, self.root, loop.span)
                why = self.reader.loop_body(node, f"`{red.target}`") if node is not None else "its loop was not found"
                if isinstance(why, str):
                    self.reasons.append(f"the tree on `{red.target}` at line {(loop.user_line or 0) + 1}: {why}")
                else:
                    self.reasons.append(f"the tree on `{red.target}` at line {(loop.user_line or 0) + 1}: "
                                        f"{self._context_refusal(node) or 'the statements around it are no part of a tree'}")
            elif not any(t.array == red.target for t in self.trees) and not any(red.target in r for r in self.reasons):
                self.reasons.append(f"the tree on `{red.target}` at line {(red.user_line or 0) + 1}: its steps are "
                                    "not statements that combine two slots, barriers and conditions around them")

    def _user_line(self, line: int) -> int:
        return user_line_of(self.ctx.preprocessed, line)

    def _context_refusal(self, first: Node) -> str | None:
        """Why not every thread reaches the statement ``first`` (the new barriers would hang), or None."""
        facts, src, body = self.ctx.facts, self.src, self.body
        parent = first.parent
        while parent is not None and parent != body:
            if parent.type == "if_statement" and self._block_uniform(parent):
                parent = parent.parent
                continue
            if parent.type in ("if_statement", "while_statement", "do_statement", "switch_statement",
                               "conditional_expression", "case_statement"):
                return (f"it sits under a condition (`{_text(src, parent).split(chr(10), 1)[0][:60]}`): "
                        "not every thread would reach the new barriers")
            if parent.type == "for_statement":
                outer = next((lp for lp in facts.loops if lp.span == (parent.start_byte, parent.end_byte)), None)
                if outer is None or any(p is None or thread_dependence(p, facts.opaque) for p in (outer.start, outer.bound, outer.step)):
                    return "an enclosing loop's start, bound or step is not proven the same for every thread"
            parent = parent.parent
        if _has_before(body, first.start_byte, ("return_statement", "goto_statement")):
            return "a thread may return before the tree (it would miss the new barriers)"
        outermost = self._outermost(first)
        if outermost is not first and _has(outermost, ("return_statement", "break_statement", "continue_statement")):
            return "an enclosing loop holds a return, break or continue: a thread may skip a later iteration's tree"
        return None

    def _block_uniform(self, statement: Node) -> bool:
        """The ``if`` statement's test has one value for every thread of a block (it reads no thread index,
        directly or through locals, loaded data or helpers): all of them take the same branch."""
        span = (statement.start_byte, statement.end_byte)
        found = [c for c in self.ctx.facts.conditions if c.kind == "if" and c.statement_span == span]
        return bool(found) and not any(c.thread_dependent for c in found)

    def _outermost(self, first: Node) -> Node:
        outermost, p = first, first.parent
        while p is not None and p != self.body:
            if p.type == "for_statement":
                outermost = p
            p = p.parent
        return outermost

    def _tree(self, stmts: list[Node], items: list, span: tuple[int, int], sizes: list[int]) -> SharedTree | str:
        facts = self.ctx.facts
        why = self._context_refusal(stmts[0])
        outermost = self._outermost(stmts[0])
        mine = _region_accesses(self.reader, items)
        # The conditions around the tree and every loop holding it (block-uniform: the context check above),
        # each decided once for the whole block: a read under the other outcome of one never runs after
        # this tree (another branch's tree and its root read).
        context = {(cid, value) for a in facts.accesses if id(a) in mine for cid, value in a.guards
                   if facts.conditions[cid].kind == "if" and facts.conditions[cid].statement_span[0] <= outermost.start_byte
                   and outermost.end_byte <= facts.conditions[cid].statement_span[1]}
        roots: list[tuple[str, Poly, Access | None]] = []
        pinned: set[tuple[str, Poly]] = set()
        grouped: list[tuple[str, Access]] = []
        for array in _arrays(items):
            found: dict[Poly, Access] = {}
            for a in facts.accesses:
                if a.array != array or id(a) in mine:
                    continue
                if any((cid, not value) in context for cid, value in a.guards):
                    continue
                if a.via and a.reads:
                    return f"`{a.text}` in the helper `{a.via[-1]}` reads `{array}` outside the tree"
                later = a.span[0] >= span[1] or (outermost is not stmts[0] and outermost.start_byte <= a.span[0] < outermost.end_byte
                                                 and not span[0] <= a.span[0] < span[1])
                if not later or not a.reads:
                    continue
                index = a.index
                if _thread_varying(index, facts):
                    index = _pinned_index(a, facts)
                    if index is None:
                        grouped.append((array, a))
                        continue
                    pinned.add((array, index))
                found.setdefault(index, a)
            roots += [(array, p, a) for p, a in found.items()] or [(array, Poly(), None)]
        if grouped:
            return self._group_tree(stmts, items, span, sizes, grouped, roots)
        if why:
            return why
        # A root read in one pinned thread may hold the block's slots from the root on (the usual tree) or
        # up to it (a tree that gathers into its last slot): whichever the simulation proves at every size.
        # With one block size the base is a number (slot 0 rather than ``511 + 1 - blockDim.x``).
        last = Poly.const(1 - sizes[0]) if len(sizes) == 1 else Poly.const(1) - Poly.sym("bdim.x")
        choices = [{}] + ([{key: key[1] + last for key in pinned}] if pinned else [])
        proofs = []
        for bases in choices:
            proofs.append(self._proven(items, span, sizes, roots, bases))
            if not isinstance(proofs[-1], str):
                break
        if isinstance(proofs[-1], str):
            # The usual tree's reason: the slot read holds no total.
            return proofs[0]
        ops = proofs[-1]
        values = []
        for array, root_poly, _ in roots:
            name = self._name(items, array, {p: a for arr, p, a in roots if arr == array})
            if name is None:
                return f"the kernel's body does not name `{array}` where the tree is"
            elem = next(a.elem_type for a in facts.accesses if a.array == array and a.space == "shared")
            values.append(TreeValue(array, name, elem, ops[(array, root_poly)], root_poly, bases.get((array, root_poly))))
        loop = items[0][1].loop if len(items) == 1 and items[0][0] == "loop" else None
        return SharedTree(span, tuple(values), loop, self._user_line(stmts[0].start_point[0]) - 1)

    def _group_tree(self, stmts: list[Node], items: list, span: tuple[int, int], sizes: list[int],
                    grouped: list[tuple[str, Access]], roots: list[tuple[str, Poly, Access | None]]) -> SharedTree | str:
        """The tree as one per group of neighbouring lanes of a warp (``if (lane < 16) s[t] += s[t + 16];
        … if (lane == 0) out[row] = s[t];``): every slot read after it is ``base + threadIdx.x`` in the first
        thread of a group of S lanes (S a power of two up to 32, the same at each block size), and the
        simulation leaves in it its group's S slots exactly once. No block barrier is part of it, and the
        conditions around it are the same for the 32 threads of a warp (each warp runs it whole or not at
        all), so warp shuffles within each group replace it."""
        facts = self.ctx.facts
        array, first = grouped[0]
        slot_read = f"`{first.text}` at line {(first.user_line or 0) + 1} reads a slot other than the root after the tree"
        # Every array of the tree is read only so: its roots are the groups' first slots, none the block's.
        if {arr for arr, _ in grouped} != set(_arrays(items)) or any(p != Poly() or a is not None for _, p, a in roots):
            return slot_read
        if any(i[0] == "barrier" for i in items) or any(i[0] == "loop" for i in items):
            return f"{slot_read} (a tree per group of lanes is taken only as barrier-free steps)"
        context = self._warp_context(stmts[0])
        if isinstance(context, str):
            return context
        bases: dict[str, Poly] = {}
        for arr, a in grouped:
            coefficient = a.index.coefficient("tid.x")
            base = a.index - Poly.sym("tid.x") if coefficient == Poly.const(1) else None
            if base is None or _thread_varying(base, facts) or bases.setdefault(arr, base) != base:
                return f"`{a.text}` at line {(a.user_line or 0) + 1} reads a slot other than the root after the tree"
        segment = None
        ops: dict[str, str] = {}
        for n in sizes:
            try:
                readers = {t for arr, a in grouped for t in range(n) if _guards_value(a, facts, _env(t, n), span, context)}
                starts = {arr: poly_value(b, _env(0, n), facts.opaque) for arr, b in bases.items()}
            except Unknown as exc:
                return f"at {n} threads per block: the threads reading the tree's slots use {exc}"
            group = min((t for t in readers if t), default=n)
            if readers != set(range(0, n, group)) or group > 32 or group < 2 or group & (group - 1) \
                    or segment not in (None, group):
                return f"{slot_read} (its readers are not the first thread of each group of 2 to 32 lanes)"
            segment = group
            domains = {arr: set(range(b, b + n)) for arr, b in starts.items()}
            sim = _simulate(self.reader, items, span, n, domains, False, context)
            if isinstance(sim, str):
                return f"at {n} threads per block: {sim}"
            if sim.outside is not None:
                return f"at {n} threads per block: a step reads or writes slot {sim.outside}, outside the block's slots"
            for arr, b in starts.items():
                for g in range(b, b + n, group):
                    if sim.value(arr, g) != {j: 1 for j in range(g, g + group)}:
                        return (f"at {n} threads per block: slot {g} of `{arr}` does not end with its group's slots "
                                f"{g}..{g + group - 1} exactly once")
                    combined = sim.ops.get((arr, g), frozenset())
                    if len(combined) != 1 or ops.setdefault(arr, next(iter(combined))) not in combined:
                        return f"at {n} threads per block: slot {g} of `{arr}` is combined with more than one operator"
        values = []
        for arr, base in bases.items():
            name = self._name(items, arr, {})
            if name is None:
                return f"the kernel's body does not name `{arr}` where the tree is"
            elem = next(a.elem_type for a in facts.accesses if a.array == arr and a.space == "shared")
            values.append(TreeValue(arr, name, elem, ops[arr], base, None, segment))
        return SharedTree(span, tuple(values), None, self._user_line(stmts[0].start_point[0]) - 1)

    def _warp_context(self, first: Node) -> frozenset[int] | str:
        """The conditions around the statement ``first`` when each has one value for the 32 threads of a
        warp (their ids: a warp runs what they guard whole or not at all); else why a warp's threads may
        part before it."""
        facts, src, body = self.ctx.facts, self.src, self.body
        around: set[int] = set()
        parent = first.parent
        while parent is not None and parent != body:
            if parent.type == "if_statement":
                span = (parent.start_byte, parent.end_byte)
                found = [c for c in facts.conditions if c.kind == "if" and c.statement_span == span]
                if not found or not all(c.warp_uniform for c in found):
                    return (f"it sits under a condition (`{_text(src, parent).split(chr(10), 1)[0][:60]}`) that the "
                            "threads of a warp may not share")
                around |= {c.id for c in found}
            elif parent.type in ("while_statement", "do_statement", "switch_statement", "conditional_expression",
                                 "case_statement", "for_statement"):
                return f"it sits in a loop or switch (`{_text(src, parent).split(chr(10), 1)[0][:60]}`)"
            parent = parent.parent
        if _has_before(body, first.start_byte, ("return_statement", "goto_statement", "break_statement",
                                                  "continue_statement")):
            return "a thread may leave before the tree (its warp's shuffles would miss it)"
        return frozenset(around)

    def _proven(self, items: list, span: tuple[int, int], sizes: list[int], roots: list[tuple[str, Poly, Access | None]],
                bases: Mapping[tuple[str, Poly], Poly]) -> dict[tuple[str, Poly], str] | str:
        """Each root's operator when the tree, simulated at every size, leaves in each root the block's
        slots from its base (the root itself where ``bases`` names none); else why not."""
        facts = self.ctx.facts
        ops: dict[tuple[str, Poly], str] = {}
        for n in sizes:
            domains: dict[str, set[int]] = {}
            starts: dict[tuple[str, Poly], tuple[int, int]] = {}
            try:
                for array, root_poly, _ in roots:
                    r = poly_value(root_poly, _env(0, n), facts.opaque)
                    b = poly_value(bases.get((array, root_poly), root_poly), _env(0, n), facts.opaque)
                    starts[(array, root_poly)] = (r, b)
                    domains.setdefault(array, set()).update(range(b, b + n))
            except Unknown as exc:
                return f"at {n} threads per block: the root slot is {exc}"
            sim = _simulate(self.reader, items, span, n, domains, all(p == Poly() for _, p, _ in roots))
            if isinstance(sim, str):
                return f"at {n} threads per block: {sim}"
            outside = f"at {n} threads per block: a step reads or writes slot {sim.outside}, outside the block's slots"
            if sim.outside is not None and all(p == Poly() for _, p, _ in roots):
                return outside
            for array, root_poly, _ in roots:
                r, b = starts[(array, root_poly)]
                if sim.value(array, r) != {j: 1 for j in range(b, b + n)}:
                    if root_poly == Poly():
                        return f"at {n} threads per block: slot 0 does not end with every slot's value exactly once"
                    return (f"at {n} threads per block: slot {r} of `{array}`, read after the tree, does not end with "
                            f"slots {b}..{b + n - 1} exactly once: it reads a slot other than the root after the tree")
                combined = sim.ops.get((array, r), frozenset())
                if len(combined) != 1 or ops.setdefault((array, root_poly), next(iter(combined))) not in combined:
                    return (f"at {n} threads per block: slot {r} of `{array}` is combined with "
                            f"{' and '.join(sorted(combined))}, not one operator")
            if sim.outside is not None:
                return outside
        return ops

    def _name(self, items: list, array: str, roots: Mapping[Poly, Access | None]) -> str | None:
        """The identifier the kernel's body writes the array with, at the tree or at a root read."""
        lo, hi = self.ctx.facts.body_span
        refs = []
        for item in items:
            if item[0] == "step":
                refs.append(item[1].write_ref)
            elif item[0] == "loop":
                refs += [i[2].write_ref for i in item[1].items if i[0] == "update" and i[3] == array]
        for access in roots.values():
            if access is not None:
                node = node_at(self.src, self.root, access.span)
                if node is not None and _subscript(node, self.src) is not None:
                    refs.append(node)
        for ref in refs:
            if lo <= ref.start_byte < hi and any(a.array == array for a in self.reader.by_span.get((ref.start_byte, ref.end_byte), ())):
                return _text(self.src, ref.child_by_field_name("argument"))
        return None


def spec_blocks(ctx: RuleContext) -> list[tuple[int, int, int]]:
    return [launch.block for launch in ctx.launches()]


def find_trees(ctx: RuleContext, groups: bool = False) -> tuple[list[SharedTree], str]:
    """Every tree of the kernel proven at each block size of the spec, or why there is none; ``groups``:
    trees per group of a warp's lanes (:attr:`TreeValue.segment`) too, which only warp shuffles replace."""
    facts = ctx.facts
    if facts is None or not facts.complete:
        return [], "the kernel's analysis is missing or incomplete"
    unrolled = [r for r in facts.reductions if r.kind == "shared_tree" and r.loop is None]
    if not unrolled and not shared_combine_loops(facts):
        return [], "no shared-memory reduction tree (no loop combines a shared array's slots in place)"
    if ctx.spec is None:
        return [], "needs a launch spec (the tree is simulated at each of its block sizes)"
    blocks = spec_blocks(ctx)
    if not blocks or any(b[1] != 1 or b[2] != 1 for b in blocks):
        return [], "the block is not one-dimensional at every size (trees are read over threadIdx.x only)"
    sizes = sorted({b[0] for b in blocks})
    if any(n < 32 or n > MAX_THREADS_PER_BLOCK or n & (n - 1) for n in sizes):
        return [], f"the block ({', '.join(map(str, sizes))} threads) is not a power of two from 32 to 1024 at every size"
    reading = TreeReading(ctx)
    if reading.error:
        return [], reading.error
    reading.read(sizes)
    trees = [t for t in reading.trees if groups or t.values[0].segment is None]
    if not trees:
        skipped = [f"the tree at line {(t.user_line or 0) + 1} reduces groups of {t.values[0].segment} lanes, not the block"
                   for t in reading.trees]
        return [], "; ".join(dict.fromkeys([*reading.reasons, *skipped])) or "no run of statements combines a shared array's slots"
    return trees, ""


def loop_tree(ctx: RuleContext, loop: LoopFact, sizes: list[int]) -> tuple[str | None, str]:
    """(why ``loop`` alone is not a proven tree, or None; its operator): for a transformation that
    replaces that loop by a combine of its own."""
    reading = TreeReading(ctx)
    if reading.error:
        return reading.error, ""
    reading.read(sizes)
    tree = next((t for t in reading.trees if t.loop is not None and t.loop.span == loop.span), None)
    if tree is not None and len(tree.values) == 1 and tree.values[0].root == Poly() and tree.values[0].base is None:
        return None, tree.op
    if any(t.span[0] <= loop.span[0] < t.span[1] for t in reading.trees):
        return "the tree is more than its loop (other steps or values around it)", ""
    mine = [r for r in reading.reasons if f"line {(loop.user_line or 0) + 1}" in r]
    return (mine[0].split(": ", 1)[-1] if mine else "; ".join(reading.reasons) or "no tree"), ""


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
