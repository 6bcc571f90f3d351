"""A row that several loops of a thread read element by element, loaded once into registers.

Normalisations, softmaxes and their warp-per-row forms walk one row in several passes: the mean,
then the variance, then the output, each pass reading ``x[i]`` again for the same ``i``
(``for (i = lane; i < C; i += 32)`` three times). The later passes' loads come back from the L1 or
L2 cache at best, and each waits behind its loop's test. When a thread's share of the row is small,
the first pass can keep it in registers and the others read it from there:

    T kl_row[K];                                   // before the statement holding the first pass
    ...
    if (TRIPS <= K) {                               // the original loop's iterations fit the registers
    #pragma unroll
        for (int kl_k = 0; kl_k < K; ++kl_k) {
            int i = (START) + kl_k * (STEP);
            if (i < BOUND) { kl_row[kl_k] = x[i]; BODY }      // the first pass loads
        }
    } else ORIGINAL LOOP
    ...
    if (TRIPS <= K) { ... if (i < BOUND) { BODY with x[i] as kl_row[kl_k] } ... } else ORIGINAL LOOP

Each cached pass runs the iterations of its original loop in the same order with the same values, so
the results are the same bit for bit; a thread whose share does not fit runs the original loops.

Legality, in terms of the analysis (each refusal names the fact that was missing):
- two or more counted loops (``for``, or ``while`` stepped by a statement of its body) at one nesting level (the same enclosing loop, or none) with one counter
  start, one positive step and one upper bound each (the analysis' polynomials compare equal), each
  test an upper bound of the counter that its written form evaluates again (``LoopFact.bound_span``);
- an array the kernel never writes (nor hands to code the analysis does not see) read directly in
  two or more of them, one element per iteration, at the same element in every loop for the same
  iteration (its index polynomials equal with the iteration counters identified);
- in the first loop that reads it, every iteration reads that element whatever it computes (no
  condition inside the loop decides the read), so loading it at the iteration's start loads nothing
  the original does not;
- no loop of the group leaves early (``break``, ``continue``, ``return``, ``goto``) or assigns its
  counter, and nothing between the first and the last of them assigns a name their starts, steps
  and bounds read (every pass takes the cached path or none does);
- the first loop is its statement of the block that holds them all, or sits in plain blocks there (no
  ``if``, loop or ``switch`` between, which could skip the loads for a thread that runs the later passes);
- the counters have an integer type, declared by a ``for`` header, or before a ``while`` loop whose previous
  statement sets it (that value is the pass's start; the counter is dead after the loop); the reads are subscripts, dereferences
  or load intrinsics (``__ldcs(x + i)``) in the kernel's own body (not inside a helper), of an element
  type the file names: in a template, the reads subscript a pointer parameter, whose declared element type
  the registers take (``T`` of ``const T* x``);
- the loops' trip count at the spec's sizes is at most :data:`MAX_CACHED` (registers, not local
  memory: the cached loops are unrolled whole, so every register array index is a constant).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import Access, Binding, KernelFacts, LoopFact, evaluate, is_integer_type
from kernel_lsp.core.analysis import assigned_names, has_node as _has, identifiers_in as _identifiers, node_text as _text
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError
from kernel_lsp.core.transforms.counted_loop import counted_loop, value_set_before
from kernel_lsp.core.transforms.emit import declared_type, node_at, parse, rebuild, type_seen_at
from kernel_lsp.core.transforms.load_batch import positive_step

#: Most elements of a row one thread keeps in registers.
MAX_CACHED = 32
_EXITS = ("break_statement", "continue_statement", "return_statement", "goto_statement")
_ITERATION = "kl.k"


@dataclass(frozen=True)
class _Pass:
    loop: LoopFact
    node: Node
    counter_type: str
    test: tuple[int, int]
    start: tuple[int, int]
    """The counter's start: in a ``for`` header, or set by the statement before a ``while`` loop."""
    step: tuple[int, int] | None
    """The added step's expression; None for ``++``."""
    body: tuple[int, int]
    """The body's statements (inside its braces when it has them)."""
    reads: tuple[tuple[int, int], ...]
    """The spans of the cached reads in this loop."""
    stepped: tuple[int, int] | None = None
    """A ``while`` loop's statement that steps the counter (left out of the cached pass, which counts itself)."""


@dataclass(frozen=True)
class _Plan:
    array: str
    elem_type: str
    passes: tuple[_Pass, ...]
    """In program order; the first loads."""
    slots: int
    anchor: tuple[int, int]
    """The statement holding the first pass in the innermost block holding every pass: the register array
    is declared before it."""


def _same_iteration(a: Access, b: Access, la: LoopFact, lb: LoopFact, facts: KernelFacts) -> bool:
    return _canonical(a.index.renamed(la.trip_symbol, _ITERATION), facts) == _canonical(
        b.index.renamed(lb.trip_symbol, _ITERATION), facts)


def _canonical(poly: Poly, facts: KernelFacts) -> Poly:
    """``poly`` with each opaque term the analysis can compute named by how it is computed: two calls of
    ``warp.thread_rank()`` are one value (the same recipe on the same thread indices)."""
    for symbol in sorted(poly.symbols):
        entry = facts.opaque.get(symbol)
        if entry is not None and entry.recipe is not None:
            recipe = tuple(_canonical(r, facts) if isinstance(r, Poly) else r for r in entry.recipe)
            poly = poly.renamed(symbol, f"?{recipe!r}")
    return poly


def _trips(facts: KernelFacts, loop: LoopFact, ctx: RuleContext) -> int | None:
    """The most iterations a thread runs of ``loop`` at the spec's sizes (its first and last thread of the
    first and last block), or None when the spec does not tell."""
    if ctx.spec is None or loop.start is None or loop.step is None or loop.bound is None:
        return None
    most = 0
    for variant in [None, *range(len(ctx.spec.variants))]:
        try:
            binding = Binding.from_spec(ctx.spec, variant)
        except (SpecError, ValueError, ZeroDivisionError):
            return None
        block, grid = binding.block, binding.grid or (1, 1, 1)
        for tid, bid in ((0, 0), (1, 0), (31, 0), (block[0] - 1, grid[0] - 1)):
            env = {**binding.values, "tid.x": tid, "tid.y": 0, "tid.z": 0, "bid.x": bid, "bid.y": 0, "bid.z": 0,
                   "bdim.x": block[0], "bdim.y": block[1], "bdim.z": block[2],
                   "gdim.x": grid[0], "gdim.y": grid[1], "gdim.z": grid[2]}
            start, step, bound = (evaluate(p, env, facts.opaque) for p in (loop.start, loop.step, loop.bound))
            if start is None or step is None or bound is None or step <= 0:
                return None
            most = max(most, -(-(bound - start) // step))
    return most


class RowCache(Rule):
    name = "row-cache"
    technique = "loop-invariant-hoisting"
    summary = "a row several loops read element by element, loaded once into registers by the first"

    def plan(self, ctx: RuleContext) -> tuple[_Plan | None, str]:
        """The array to cache and its loops: of the arrays that qualify, the one read by the most loops (one
        array per rewrite: its register array is what the rewrite costs)."""
        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        src, root = parse(ctx.preprocessed)
        lo, hi = facts.body_span
        groups: dict[tuple, list[LoopFact]] = {}
        for loop in facts.loops:
            if loop.kind not in ("for", "while") or loop.var is None or loop.start is None or loop.bound is None or loop.bound_span is None \
                    or not positive_step(loop) or not lo < loop.span[0] < hi:
                continue
            key = (loop.parent, *(_canonical(p, facts) for p in (loop.start, loop.step, loop.bound)), loop.bound_inclusive)
            groups.setdefault(key, []).append(loop)
        groups = {k: v for k, v in groups.items() if len(v) > 1}
        if not groups:
            return None, "no two loops at one level run the same iterations (one start, step and upper bound)"
        written = set(facts.written) | set(facts.escaped)
        plans: list[_Plan] = []
        reasons: list[str] = []
        for loops in groups.values():
            loops = sorted(loops, key=lambda lp: lp.span[0])
            by_array: dict[str, list[tuple[Access, LoopFact]]] = {}
            for a in facts.accesses:
                if a.space == "global" and a.kind == "read" and a.loops and a.array not in written:
                    loop = next((lp for lp in loops if a.loops[-1] == lp.id), None)
                    if loop is not None:
                        by_array.setdefault(a.array, []).append((a, loop))
            for array, reads in sorted(by_array.items()):
                if len({lp.id for _, lp in reads}) < 2:
                    continue
                why, plan = self._plan(ctx, facts, src, root, array, reads, loops)
                if plan is None:
                    reasons.append(f"`{array}` in the loops at line {', '.join(str((lp.user_line or 0) + 1) for lp in loops)}: {why}")
                else:
                    plans.append(plan)
        if not plans:
            return None, "; ".join(reasons) or ("no array the kernel never writes is read in two of the loops that run the "
                                                "same iterations")
        return max(plans, key=lambda p: len(p.passes)), ""

    def _plan(self, ctx: RuleContext, facts: KernelFacts, src: bytes, root: Node, array: str,
              reads: list[tuple[Access, LoopFact]], loops: list[LoopFact]) -> tuple[str, _Plan | None]:
        first_access, first_loop = reads[0]
        if any(not _same_iteration(a, first_access, lp, first_loop, facts) for a, lp in reads):
            return "the loops read it at different elements for the same iteration", None
        if any(a.via for a, _ in reads):
            return f"`{next(a.text for a, _ in reads if a.via)}` is read in a helper function", None
        used = [lp for lp in loops if any(lp.id == rl.id for _, rl in reads)]
        span = (used[0].span[0], used[-1].span[1])
        passes: list[_Pass] = []
        for loop in used:
            node = node_at(src, root, loop.span)
            line = (loop.user_line or 0) + 1
            if node is None:
                return f"the loop at line {line} was not found", None
            body, stepped, value = node.child_by_field_name("body"), None, None
            if node.type == "while_statement":
                # The counter is set before the loop and stepped by a statement of the body: the cached pass
                # starts from the counter's value on entry and leaves the step out (the counter is dead after).
                counted, why = counted_loop(loop, node, facts.body_span, src)
                if counted is None:
                    return f"the loop at line {line}: {why}", None
                cond, stepped = counted.test, counted.step_statement
                kind = type_seen_at(node, loop.var, src)
                if body is None or cond is None or stepped is None:
                    return f"the loop at line {line} lacks a body, a test or a step", None
                if _has(body, _EXITS):
                    return f"the loop at line {line} can leave an iteration or the loop early", None
                if kind is None or not is_integer_type(kind):
                    return f"the loop at line {line} counts with `{loop.var}`, not declared before it with an integer type", None
                value = value_set_before(node, loop.var, src)
                if value is None:
                    return f"the loop at line {line}: the statement before it does not set its counter `{loop.var}`", None
            else:
                init = node.child_by_field_name("initializer")
                cond = node.child_by_field_name("condition")
                start = node_at(src, root, (init.start_byte, init.end_byte)) if init is not None else None
                if body is None or cond is None or start is None:
                    return f"the loop at line {line} lacks a body or a test", None
                if _has(body, _EXITS):
                    return f"the loop at line {line} can leave an iteration or the loop early", None
                if loop.var in assigned_names(body, src):
                    return f"the loop at line {line} assigns its counter `{loop.var}` in its body", None
                kind = declared_type(init, loop.var, src) if init.type == "declaration" else None
                if kind is None or not is_integer_type(kind):
                    return f"the loop at line {line} does not declare an integer counter", None
                value = next((c.child_by_field_name("value") for c in init.children_by_field_name("declarator")
                              if c.type == "init_declarator"), None)
                if value is None:
                    return f"the loop at line {line} does not start its counter in its header", None
            mine = [a for a, lp in reads if lp.id == loop.id]
            for a in mine:
                if not _element_read(node_at(src, root, a.span), src):
                    return f"`{a.text}` is not a subscript, a dereference or a load intrinsic", None
            inner = body.named_children if body.type == "compound_statement" else [body]
            body_span = (inner[0].start_byte, inner[-1].end_byte) if inner else (body.end_byte - 1, body.end_byte - 1)
            passes.append(_Pass(loop, node, kind, (cond.start_byte, cond.end_byte), (value.start_byte, value.end_byte),
                                loop.step_span, body_span,
                                tuple(sorted({a.span for a in mine})),
                                (stepped.start_byte, stepped.end_byte) if stepped is not None else None))
        first = passes[0]
        own_test = {c.id for c in facts.conditions if c.statement_span == first.loop.span}
        for a, lp in reads:
            if lp.id != first.loop.id:
                continue
            deciding = [cid for cid, _ in a.guards if cid not in own_test
                        and first.loop.span[0] <= facts.conditions[cid].statement_span[0] < first.loop.span[1]]
            if not deciding:
                break
        else:
            return (f"in the loop at line {(first.loop.user_line or 0) + 1}, a condition inside the loop decides whether "
                    f"`{first_access.text}` is read (loading it at every iteration could read what the original does not)"), None
        header = _identifiers(first.node.child_by_field_name("condition"), src) | _identifiers(
            node_at(src, root, first.start), src) | (_identifiers(node_at(src, root, first.step), src) if first.step else set())
        counters = {p.loop.var for p in passes}
        changed = {n for stmt in _statements_between(src, root, facts, span) for n in assigned_names(stmt, src)} - counters
        if header & changed:
            return (f"{', '.join(sorted(header & changed))}, read by the loops' headers, is assigned between the first and "
                    "the last of them"), None
        trips = _trips(facts, first.loop, ctx)
        if trips is not None and trips > MAX_CACHED:
            return f"a thread runs up to {trips} iterations at the spec's sizes (at most {MAX_CACHED} are kept in registers)", None
        elem = first_access.elem_type
        if ctx.kernel.is_template:
            # The analysis reads an instance's element type (``float``); the register array is declared in the
            # template, with the element type its parameter names (``T``).
            param = next((p for p in ctx.kernel.params if p.name == array and p.pointer_depth == 1), None)
            indirect = next((a.text for a, _ in reads if not re.match(rf"{re.escape(array)}\s*\[", a.text)), None)
            if param is None or indirect is not None:
                return (f"the kernel is a template and `{indirect or array}` does not subscript one of its pointer "
                        "parameters (its element type is the instance's, not one the file names)"), None
            elem = param.base_type
        if not elem or elem == "void":
            return "its element type is not known", None
        anchor = _anchor(src, root, [p.node for p in passes])
        if anchor is None:
            return "no block holds every loop apart from the others (a statement holds two of them)", None
        if _conditional(first.node, anchor):
            return (f"the loop at line {(first.loop.user_line or 0) + 1} runs under a statement the later loops are not "
                    "in (a thread could skip the loads and still run the passes that read the registers)"), None
        slots = MAX_CACHED if trips is None else max(1, trips)
        return "", _Plan(array, elem, tuple(passes), slots, anchor)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        return True, (f"`{plan.array}` read at the same element by the loops at line "
                      f"{', '.join(str((q.loop.user_line or 0) + 1) for q in plan.passes)} (the same iterations, the array "
                      f"never written, the first loop reading it at every iteration): {plan.slots} elements per thread "
                      "in registers")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        facts = ctx.facts
        assert plan is not None and facts is not None
        lo, hi = facts.body_span
        first = plan.passes[0]

        def build(text) -> str:  # noqa: ANN001 - emit's piece reader
            # The register array is declared before the statement holding the first pass, which that
            # statement's own text carries (the first pass rewritten in it).
            inner = (first.loop.span[0], first.loop.span[1], _cached(first, plan, True, text))
            subs = [(plan.anchor[0], plan.anchor[1],
                     f"{plan.elem_type} kl_row[{plan.slots}];\n    " + text(*plan.anchor, [inner]))]
            subs += [(p.loop.span[0], p.loop.span[1], _cached(p, plan, False, text)) for p in plan.passes[1:]]
            return text(lo + 1, hi - 1, subs)

        source, expanded = rebuild(ctx.preprocessed, facts, ctx.source, ctx.kernel, build)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"`{plan.array}` ({plan.slots} elements per thread) loaded once by the loop at line "
                                f"{(first.loop.user_line or 0) + 1} and read from registers by {len(plan.passes) - 1} "
                                f"later loop(s); the original loops where a thread's share is larger{note}"),)


def _cached(p: _Pass, plan: _Plan, loads: bool, text) -> str:  # noqa: ANN001
    """The loop ``p`` as its cached pass, beside the original for a larger share."""
    var = p.loop.var
    # A while loop's counter holds its start on entry; the cached pass's own counter shadows it, so the
    # start is read into a name of its own first.
    start = text(*p.start) if p.stepped is None else "kl_from"
    step = text(*p.step) if p.step is not None else "1"
    bound = text(*p.loop.bound_span)  # type: ignore[misc]
    fits = (f"(long long)({bound}) - (long long)({start}) {'<' if p.loop.bound_inclusive else '<='} "
            f"{plan.slots}LL * (long long)({step})")
    read = text(*p.reads[0])
    body = text(*p.body, [(s, e, "kl_row[kl_k]") for s, e in p.reads] + ([(*p.stepped, "")] if p.stepped else []))
    load = f"kl_row[kl_k] = {read}; " if loads else ""
    original = text(p.loop.span[0], p.loop.span[1])
    cached = (f"if ({fits}) {{\n#pragma unroll\n"
              f"        for (int kl_k = 0; kl_k < {plan.slots}; ++kl_k) {{\n"
              f"            {p.counter_type} {var} = ({start}) + kl_k * ({step});\n"
              f"            if ({text(*p.test)}) {{ {load}{body} }}\n"
              f"        }}\n    }} else {original}")
    return cached if p.stepped is None else f"{{ const {p.counter_type} kl_from = {var};\n    {cached} }}"


#: CUDA's load functions (``__ldcs(x + c)``): a read of one element whose value the register holds as well.
_LOAD_INTRINSICS = frozenset({"__ldg", "__ldcg", "__ldca", "__ldcs", "__ldlu", "__ldcv"})


def _element_read(node: Node | None, src: bytes) -> bool:
    """``node`` reads one element and nothing else: ``x[i]``, ``*(x + i)`` or ``__ldcs(x + i)``."""
    if node is None:
        return False
    if node.type == "subscript_expression":
        return True
    if node.type == "pointer_expression":
        return _text(src, node).lstrip().startswith("*")
    if node.type == "call_expression":
        fn = node.child_by_field_name("function")
        return fn is not None and _text(src, fn).strip() in _LOAD_INTRINSICS
    return False


def _statements_between(src: bytes, root: Node, facts: KernelFacts, span: tuple[int, int]) -> list[Node]:
    """The statements of the kernel's body that lie within ``span`` (the first pass to the last)."""
    body = node_at(src, root, facts.body_span)
    found: list[Node] = []
    stack = [body] if body is not None else []
    while stack:
        n = stack.pop()
        if n.end_byte <= span[0] or n.start_byte >= span[1]:
            continue
        if span[0] <= n.start_byte and n.end_byte <= span[1] and n.type.endswith("statement"):
            found.append(n)
            continue
        stack.extend(n.children)
    return found


def _conditional(loop: Node, anchor: tuple[int, int]) -> bool:
    """Whether ``loop`` lies inside a statement of its anchor other than plain blocks: an ``if``, a loop or a
    ``switch`` there decides whether the loads run at all."""
    node = loop
    while (node.start_byte, node.end_byte) != anchor:
        node = node.parent
        if node is None or node.type != "compound_statement":
            return True
    return False


def _anchor(src: bytes, root: Node, loops: list[Node]) -> tuple[int, int] | None:
    """The statement holding the first loop in the innermost block holding every loop, when no statement
    of that block holds two of them."""
    block = loops[0].parent
    while block is not None and not (block.type == "compound_statement"
                                     and all(block.start_byte <= n.start_byte and n.end_byte <= block.end_byte for n in loops)):
        block = block.parent
    if block is None:
        return None
    holders = []
    for n in loops:
        child = next((c for c in block.named_children if c.start_byte <= n.start_byte and n.end_byte <= c.end_byte), None)
        if child is None:
            return None
        holders.append(child)
    if len({(c.start_byte, c.end_byte) for c in holders}) != len(holders):
        return None
    return holders[0].start_byte, holders[0].end_byte
