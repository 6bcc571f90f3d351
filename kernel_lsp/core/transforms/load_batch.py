"""A strided load loop run in batches of iterations the compiler can prove all execute.

Grid-stride and lane-stride loops (``for (i = tid; i < n; i += blockDim.x * gridDim.x) acc += x[i];``)
keep one load in flight per thread: the compiler cannot know how many iterations remain, so each
iteration's load waits behind the previous iteration's test, and ``#pragma unroll`` alone leaves a
test between the copies (an unsigned counter may wrap, so the trip count is not computed). The
rewrite keeps every iteration and its order, and runs them ``U`` at a time while at least ``U``
remain:

    {
        size_t i = index;
        for (; i < count && (long long)(count) - (long long)(i) > (U - 1) * (long long)(grid_width); ) {
    #pragma unroll
            for (int kl_u = 0; kl_u < U; ++kl_u) { { BODY } i += grid_width; }
        }
        for (; i < count; i += grid_width) BODY
    }

Inside a batch no test separates the copies, so the ``U`` loads issue before the first is used:
memory-level parallelism where the loop is latency-bound (few threads, long strides).

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a ``for`` or ``while`` loop whose whole test is an upper bound of its counter (``i < n``, ``i <= n``,
  ``n > i``, ``n >= i``; the batch test then keeps U more steps at most on it) and whose update adds a
  step the analysis evaluates to a positive constant or a product of launch dimensions (``i++``,
  ``i += 32``, ``i += blockDim.x * gridDim.x``, ``i += warp.size()``): the ``for`` header's update, or
  the one statement of a ``while`` body's top level that steps the counter (``LoopFact.update_span``;
  such a body is copied whole, its step included); the counter is of an integer type;
- the body assigns neither the counter (a ``while`` body's step aside) nor a name the bound or the
  step reads, and neither has side effects (the batch test evaluates them again);
- the body has no ``continue``, ``return``, ``goto`` or ``switch``, no barrier or warp operation
  (threads of a warp may take the batch and the remainder differently), no unknown call, and no
  inner loop;
- a body that stores to global or shared memory (an in-place update, a scan along the loop) has
  its global loads that move with the counter made a batch ahead, into registers, then its bodies
  run in order on them; an element updated in place by a statement of its own (``y[i] += e``,
  ``y[i]++``) is loaded so too, and the update stores ``y[i] = <loaded> + (e)``. Each such load runs on every iteration (no condition inside the loop
  decides it; one that does is made where it is), outside helpers, on pointer parameters the spec
  allocates each on its own (no store through one reaches another), at an index the loop changes
  only through its counter; no store
  of the body reaches an element a load of the same or a later iteration reads (same stride per
  iteration, and a distance that is not a whole number of strides from behind; equal indices only
  with the load first: ``v = x[i]; x[i] = sum;``), and every store moves with the counter (an
  element stored on every iteration is kept in a register first, by register-accumulate); the body
  makes no atomic and does not break;
- the body may ``break`` (a search): each break decided by data the loop loads (so the loop
  reaches its bound for some input and every iteration below the bound may load), every global load
  of the body from an array the kernel never writes, at an index of the counter and names the loop
  does not change, and in a ``while`` body before the statement that steps the counter. Then a
  batch makes its U iterations' loads first, into registers, and runs the bodies in order on them;
  a break leaves the batch and the loop with the counter where the original's stops;
- the body loads global memory at an index that moves with the counter, directly or through a value
  the loop makes (``j = starts[k] + t``, a value loaded from a table; else there is nothing to
  batch); the loop has no unroll pragma of its own and a trip count the compiler does not know.

The guard's arithmetic is in ``long long``: a batch starts only when all ``U`` counters of it are
below the bound, so every iteration runs exactly as in the original loop, in the same order, and the
results are bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import KernelFacts, LoopFact, is_integer_type
from kernel_lsp.core.analysis import assigned_names, has_node as _has, identifiers_in as _identifiers, node_text as _text
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.transforms.emit import declared_type, node_at, parse, pragma_before, rebuild, rebuild_span
from kernel_lsp.core.transforms.stencil_reuse import canonical

#: Iterations per batch, one rewrite each.
BATCHES = (4, 8)
#: Loops batched in one kernel.
MAX_LOOPS = 4
#: Symbols a step may multiply: launch dimensions are positive.
LAUNCH_DIMS = frozenset(f"{d}.{a}" for d in ("bdim", "gdim") for a in "xyz")
_EFFECTS = ("assignment_expression", "update_expression", "call_expression", "subscript_expression",
            "pointer_expression", "field_expression")


def _moves(index: Poly, loop: LoopFact, facts: KernelFacts) -> bool:
    """The index may change from one iteration to the next: it has the counter, or a term made inside the
    loop (``j = ptr[k] + i``: a value loaded at the counter, from a ``__constant__`` table, say)."""
    return loop.trip_symbol in index.symbols or facts.made_inside(index, (loop.id,))


@dataclass(frozen=True)
class _Load:
    """A global load a batch makes ahead, into registers."""

    span: tuple[int, int]
    elem_type: str
    counter: tuple[tuple[int, int], ...]
    """Where the counter is written in it."""
    update: tuple[tuple[int, int], str, tuple[int, int] | None] | None = None
    """For an element updated in place (``y[i] += e``, ``y[i]++``): the whole update, its operator (``+``)
    and its right side (None for ``++``/``--``). The batch loads the element ahead and the update stores
    ``y[i] = <loaded> + (e)``."""


@dataclass(frozen=True)
class _Loop:
    loop: LoopFact
    init: tuple[int, int] | None
    """From after ``for (`` to the test: the initializer with its ``;``; None for a ``while`` loop."""
    test: tuple[int, int]
    bound: tuple[int, int]
    inclusive: bool
    """The test lets the counter reach the bound (``i <= n``)."""
    step: tuple[int, int] | None
    """The added step's expression; None for ``++``."""
    update: tuple[int, int] | None
    """The ``for`` header's update; None for a ``while`` loop, whose body steps its counter."""
    body: tuple[int, int]
    """The body's statements (inside its braces when it has them)."""
    indent: str
    """The loop's indentation."""
    breaks: tuple[tuple[int, int], ...] = ()
    """The body's ``break`` statements (an early-exit loop: its loads are made first, then its bodies run)."""
    loads: tuple[_Load, ...] = ()
    """The global loads made a batch ahead (an early-exit loop's, or those of a body that stores)."""


def positive_step(loop: LoopFact) -> bool:
    """The loop's step is a positive constant or a positive multiple of the launch's dimensions."""
    step = loop.step
    if step is None or not step.terms:
        return False
    return all(coef > 0 and all(s in LAUNCH_DIMS for s in mono) for mono, coef in step.terms)


def _counter_type(src: bytes, root: Node, lo: int, at: int, var: str, init: Node | None) -> str | None:
    """The declared type of ``var``: from the loop's initializer, else the last declaration of it in the
    kernel's body before the loop."""
    candidates: list[Node] = []
    if init is not None and init.type == "declaration":
        candidates.append(init)
    else:
        stack = [root]
        while stack:
            n = stack.pop()
            if n.end_byte <= lo or n.start_byte >= at:
                continue
            if n.type == "declaration" and n.end_byte <= at:
                candidates.append(n)
            stack.extend(n.children)
        candidates.sort(key=lambda n: n.start_byte, reverse=True)
    return next((t for t in (declared_type(decl, var, src) for decl in candidates) if t is not None), None)


class LoadBatch(Rule):
    name = "load-batch"
    technique = "loop-unrolling"
    summary = "a strided load loop run in batches of iterations that all execute, its loads in flight together"

    def plan(self, ctx: RuleContext) -> tuple[list[_Loop] | None, str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        if not facts.loops:
            return None, "the kernel has no loop"
        src, root = parse(ctx.preprocessed)
        lo, hi = facts.body_span
        found: list[_Loop] = []
        reasons: list[str] = []
        for loop in facts.loops:
            if not (lo < loop.span[0] and loop.span[1] < hi):
                continue
            why, plan = self._loop(ctx, loop, src, root)
            if plan is None:
                reasons.append(f"the loop at line {(loop.user_line or 0) + 1}: {why}")
            else:
                found.append(plan)
        if not found:
            return None, "; ".join(reasons) or "no loop in the kernel's own body"
        return found[:MAX_LOOPS], ""

    def _loop(self, ctx: RuleContext, loop: LoopFact, src: bytes, root: Node) -> tuple[str, _Loop | None]:
        facts = ctx.facts
        assert facts is not None
        node = node_at(src, root, loop.span)
        if node is None or loop.var is None:
            return "the analysis finds no counter of the loop (a variable started, tested and stepped)", None
        if loop.kind == "do":
            return "it is a do loop (its first iteration runs before the test)", None
        if loop.update_span is None:
            return (f"its counter `{loop.var}` is not stepped by one statement at the top level of its body", None) \
                if loop.kind == "while" else ("it has no update", None)
        if not positive_step(loop):
            return "its step is not a positive constant or a product of launch dimensions", None
        cond, body = node.child_by_field_name("condition"), node.child_by_field_name("body")
        update = node_at(src, root, loop.update_span)
        right = node_at(src, root, loop.bound_span) if loop.bound_span is not None else None
        if cond is None or right is None:
            return "the analysis finds no upper bound of its counter as its whole test", None
        if loop.bound is not None and loop.start is not None and not (loop.bound.symbols | loop.start.symbols) \
                and not loop.step.symbols:  # type: ignore[union-attr]
            return "its trip count is a constant (the compiler unrolls such a loop itself)", None
        if update is None or body is None:
            return "it has no update or no body", None
        step = node_at(src, root, loop.step_span) if loop.step_span is not None else None
        if step is None and not loop.increments:
            return "its update is not the counter's step added to it", None
        init = node.child_by_field_name("initializer")
        kind = _counter_type(src, root, facts.body_span[0], node.start_byte, loop.var, init)
        if kind is None or not is_integer_type(kind):
            return f"its counter's type is {kind or 'not known'}, not an integer type", None
        if _has(right, _EFFECTS) or (step is not None and _has(step, ("assignment_expression", "update_expression"))):
            return "its bound or step has side effects or reads memory (the batch test evaluates them again)", None
        # A while body steps its counter itself: that one statement aside, it may assign none of them.
        stepping = update.parent if loop.kind == "while" else None
        kept = [c for c in body.named_children if c != stepping] if body.type == "compound_statement" else [body]
        changed = {n for c in kept for n in assigned_names(c, src) | _addressed(c, src)}
        reads = {loop.var} | _identifiers(right, src) | _identifiers(step, src)
        if changed & reads:
            return f"its body assigns {', '.join(sorted(changed & reads))}, which the counter, bound or step read", None
        if _has(body, ("continue_statement", "return_statement", "goto_statement", "switch_statement")):
            return "its body leaves an iteration early (continue, return or goto) or has a switch", None
        inside = [a for a in facts.accesses if loop.id in a.loops]
        if any(b for b in facts.barriers if loop.id in b.loops) or any(w for w in facts.warp_operations
                                                                          if loop.id in w.loops):
            return "its body has a barrier or a warp operation", None
        if loop.calls_unknown:
            return "its body calls code the analysis does not see", None
        stores = sorted({a.array for a in inside if a.kind != "read" and a.space in ("global", "shared")})
        if any(inner.parent == loop.id for inner in facts.loops):
            return "its body has a loop of its own", None
        if not any(a.space == "global" and a.reads and _moves(a.index, loop, facts) for a in inside):
            return "its body loads no global memory at an index that moves with the counter", None
        if pragma_before(src, node.start_byte) is not None:
            return "it has a pragma of its own", None
        breaks = [n for n in _nodes(body) if n.type == "break_statement"]
        loads: list[_Load] = []
        if breaks and stores:
            return f"its body writes {', '.join(stores)} and can break (its loads could not be made a batch ahead)", None
        if breaks:
            why, loads = self._early_exit(ctx, loop, breaks, inside, changed, src, root)
            if why:
                return why, None
        elif stores and not ctx.distinct_arrays():
            return (f"its body writes {', '.join(stores)} and the spec does not allocate every pointer parameter on its "
                    "own (a load made ahead could pass a store to the same memory through another pointer)"), None
        elif stores:
            why, loads = self._ahead_of_stores(ctx, loop, inside, changed, src, root)
            if why:
                return f"its body writes {', '.join(stores)}: {why}", None
        inner = body.named_children if body.type == "compound_statement" else [body]
        body_span = ((inner[0].start_byte, inner[-1].end_byte) if inner else (body.end_byte - 1, body.end_byte - 1))
        if loop.kind == "while":
            init, test = None, cond.named_children[-1] if cond.type == "condition_clause" else cond
            stepped = None
        else:
            open_paren = next(c for c in node.children if c.type == "(")
            init, test, stepped = (open_paren.end_byte, cond.start_byte), cond, (update.start_byte, update.end_byte)
        return "", _Loop(loop, init, (test.start_byte, test.end_byte),
                         (right.start_byte, right.end_byte), loop.bound_inclusive,
                         None if step is None else (step.start_byte, step.end_byte),
                         stepped, body_span, _indent(src, node.start_byte),
                         tuple((b.start_byte, b.end_byte) for b in breaks), tuple(loads))

    def _early_exit(self, ctx: RuleContext, loop: LoopFact, breaks: list[Node], inside, changed: set[str],  # noqa: ANN001
                    src: bytes, root: Node) -> tuple[str, list]:
        """The facts an early-exit batch needs: the loop's loads, made for U iterations before any of them
        runs, read arrays the kernel never writes at indices of the counter and names the loop does not
        change; every ``break`` decided by data the loop loads, so the loop reaches its bound for some
        input and every iteration the bound admits may load (none of the batch's loads is one the loop
        could never make)."""
        facts = ctx.facts
        assert facts is not None
        read_only = set(facts.read_only)
        loads = []
        for a in inside:
            if a.space != "global":
                continue
            if a.via:
                return f"`{a.text}` is loaded in the helper `{a.via[-1]}` (its load could not be made early)", []
            if a.array not in read_only:
                return f"`{a.text}` reads {a.array}, which the kernel may write (its loads could not be made early)", []
            why, counter = _made_ahead(a, loop, changed, src, root)
            if why:
                return why, []
            if counter:  # a load the counter does not move stays where it is: one load, the same each iteration
                loads.append(_Load(a.span, a.elem_type, counter))
        conditions = [c for c in facts.conditions if c.kind in ("if", "exit") and loop.id in c.loops]
        for b in breaks:
            deciding = [c for c in conditions if c.statement_span[0] <= b.start_byte < c.statement_span[1]]
            if not any(c.span[0] <= a.span[0] < c.span[1] for c in deciding for a in inside if a.space == "global"):
                line = ctx.preprocessed.user_line(b.start_point[0])
                return (f"the break at line {(line or 0) + 1} is not decided by data the loop loads (iterations past it could "
                        "be ones the loop never reaches, their loads out of bounds)"), []
        return "", loads

    def _ahead_of_stores(self, ctx: RuleContext, loop: LoopFact, inside, changed: set[str],  # noqa: ANN001
                         src: bytes, root: Node) -> tuple[str, list]:
        """The loads a batch makes ahead of the stores of a body that writes memory: each global load that
        moves with the counter, made for U iterations into registers before any of their bodies runs.

        That moves iteration k's loads ahead of the stores of the iterations before it in the batch, and ahead
        of its own stores that come before it in the body. It is legal where no such store can reach the
        loaded element: a store of the same array, at the same multiple ``c`` of the iteration plus a
        constant, reaches a later iteration's load only when their distance is a positive whole number of
        ``c`` (``x[i] = …; … x[i - 1]``: the recurrence stays unbatched), and the same iteration's only when
        the distance is zero and the store comes first. Each load must also be outside helpers, at an index
        the loop does not change but through its counter; one that a condition inside the loop decides
        is made where it is, in order with the stores (a batch would make all U of them). Atomics in the body are refused (another
        thread's atomic on a loaded element would be ordered differently)."""
        facts = ctx.facts
        assert facts is not None
        if any(a.kind == "atomic" for a in inside):
            return "it makes atomics (the batched loads could not move ahead of them)", []
        trip = loop.trip_symbol
        stored = [a for a in inside if a.writes and a.space == "global"]
        if (fixed := next((a for a in inside if a.writes and trip not in a.index.symbols), None)) is not None:
            # Every iteration reads back what the one before stored there: keeping the element in a register
            # (register-accumulate) comes first, and the sequence batches the loop after it.
            return f"`{fixed.text}` is stored at the same element on every iteration", []
        loads = []
        for a in inside:
            if a.space != "global" or a.kind not in ("read", "update") or trip not in a.index.symbols:
                continue
            if a.via:
                return f"`{a.text}` is loaded in the helper `{a.via[-1]}` (its load could not be made early)", []
            # A while loop's own test guards its body; only a condition inside the loop decides a load.
            if any(loop.id in facts.conditions[g].loops and facts.conditions[g].statement_span != loop.span
                   for g, _ in a.guards):
                continue  # made where it is, in order with the stores: a batch would make it on every iteration
            update = _in_place(a, src, root) if a.kind == "update" else None
            if a.kind == "update" and update is None:
                continue  # an update whose value is used stays as written, its load in order with the stores
            why, counter = _made_ahead(a, loop, changed, src, root)
            if why:
                return why, []
            if not counter:
                return f"`{a.text}` moves with the loop through a name other than its counter `{loop.var}`", []
            load = canonical(a.index, facts)
            # An update's own store comes after its load.
            for w in (w for w in stored if w.array == a.array and w is not a):
                store = canonical(w.index, facts)
                if not _never_behind(load, store, trip, store_first=_stores_first(w, a, src, root)):
                    return f"`{w.text}` may store an element `{a.text}` loads in a later iteration", []
            loads.append(_Load(a.span, a.elem_type, counter, update))
        if not loads:
            return "every load that moves with the counter runs on a condition inside the loop (none to make ahead)", []
        return "", loads

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plans, why = self.plan(ctx)
        if plans is None:
            return False, why
        lines = ", ".join(str((p.loop.user_line or 0) + 1) for p in plans)
        exits = [str((p.loop.user_line or 0) + 1) for p in plans if p.breaks]
        stores = [str((p.loop.user_line or 0) + 1) for p in plans if p.loads and not p.breaks]
        return True, (f"loops at line {lines}: a positive step, a bound and step the body does not change, "
                      "loads that move with the counter, no barrier"
                      + (f"; the loop at line {', '.join(stores)} stores only where no later load of it reads, its "
                         "loads made a batch ahead" if stores else ", no store")
                      + (f"; the loop at line {', '.join(exits)} leaves on data it loads, its loads made a batch ahead"
                         if exits else ", no early exit"))

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plans, _ = self.plan(ctx)
        facts = ctx.facts
        assert plans is not None and facts is not None
        out = []
        for batch in BATCHES:
            if len(plans) == 1:
                source, expanded = rebuild_span(ctx.preprocessed, facts, ctx.source, ctx.kernel, plans[0].loop.span,
                                                lambda text: _batched(plans[0], batch, text))
            else:
                # Accepted loops have no inner loop, so they are disjoint: one rebuild of the body replaces each.
                lo, hi = facts.body_span
                source, expanded = rebuild(ctx.preprocessed, facts, ctx.source, ctx.kernel, lambda text: text(
                    lo + 1, hi - 1, [(p.loop.span[0], p.loop.span[1], _batched(p, batch, text)) for p in plans]))
            note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
            out.append(Rewrite(source, f"{len(plans)} strided loop(s) run {batch} iterations at a time while "
                                       f"{batch} remain, the rest one at a time; same iterations in the same "
                                       f"order{note}", variant=f"batch={batch}"))
        return tuple(out)


def _batched(p: _Loop, batch: int, text) -> str:
    """The loop ``p`` in batches of ``batch``, from pieces ``text(lo, hi)`` of the preprocessed body."""
    var = p.loop.var
    bound = text(*p.bound)
    step = text(*p.step) if p.step is not None else "1"
    guard = f"(long long)({bound}) - (long long)({var}) {'>=' if p.inclusive else '>'} {batch - 1} * (long long)({step})"
    if p.breaks or p.loads:
        return _batched_ahead(p, batch, text, guard, step)
    body, test, at = text(*p.body), text(*p.test), p.indent
    if p.update is None:
        return (f"{{\n{at}    while ({test} && {guard}) {{\n#pragma unroll\n"
                f"{at}        for (int kl_u = 0; kl_u < {batch}; ++kl_u) {{ {body} }}\n{at}    }}\n"
                f"{at}    while ({test}) {{ {body} }}\n{at}}}")
    update = text(*p.update)
    return (f"{{\n{at}    {text(*p.init).strip()}\n{at}    for (; {test} && {guard}; ) {{\n#pragma unroll\n"
            f"{at}        for (int kl_u = 0; kl_u < {batch}; ++kl_u) {{ {{ {body} }} {update}; }}\n{at}    }}\n"
            f"{at}    for (; {test}; {update}) {{ {body} }}\n{at}}}")


def _batched_ahead(p: _Loop, batch: int, text, guard: str, step: str) -> str:
    """A loop whose loads are made a batch ahead: the batch's loads first, into registers (iteration k's with
    the counter advanced k steps), then its bodies in order on them. In an early-exit loop a ``break``
    leaves the batch, the loop and the rest (``kl_left``), the counter where the original's stops."""
    var, at = p.loop.var, p.indent
    prefetch, subs = [], [(lo, hi, "{ kl_left = true; break; }") for lo, hi in p.breaks]
    made: dict[str, int] = {}
    loaded: dict[tuple[int, int], str] = {}
    for load in p.loads:
        moved = text(*load.span, [(s, e, f"({var} + kl_u * ({step}))") for s, e in load.counter])
        # One element read twice in the body (``v = x[i]; … x[i] * 3``) is loaded once per iteration.
        if moved not in made:
            k = made[moved] = len(made)
            prefetch.append(f"{at}        {load.elem_type} kl_load{k}[{batch}];\n#pragma unroll\n"
                            f"{at}        for (int kl_u = 0; kl_u < {batch}; ++kl_u) kl_load{k}[kl_u] = {moved};\n")
        loaded[load.span] = f"kl_load{made[moved]}[kl_u]"
    updates = [load.update for load in p.loads if load.update is not None]
    for load in p.loads:
        if load.update is not None:
            (lo, hi), op, right = load.update
            # The loads on its right side are replaced inside the rewritten update.
            inner = [(s, e, new) for (s, e), new in loaded.items() if right is not None and right[0] <= s and e <= right[1]]
            value = f"({text(*right, inner)})" if right is not None else "1"
            subs.append((lo, hi, f"{text(*load.span)} = {loaded[load.span]} {op} {value}"))
        elif not any(lo <= load.span[0] and load.span[1] <= hi for (lo, hi), _, _ in updates):
            subs.append((*load.span, loaded[load.span]))
    body = text(*p.body, subs)
    original = text(*p.body)
    test = text(*p.test)
    left, leave, stay = (f"{at}    bool kl_left = false;\n", f"{at}        if (kl_left) break;\n", "!kl_left && ") \
        if p.breaks else ("", "", "")
    if p.update is None:
        # A ``while`` loop: its body steps the counter (a ``break`` before the step leaves it where the original's stops).
        return (f"{{\n{left}"
                f"{at}    while ({test} && {guard}) {{\n{''.join(prefetch)}#pragma unroll\n"
                f"{at}        for (int kl_u = 0; kl_u < {batch}; ++kl_u) {{ {body} }}\n"
                f"{leave}{at}    }}\n"
                f"{at}    while ({stay}{test}) {{ {original} }}\n{at}}}")
    update = text(*p.update)
    return (f"{{\n{left}{at}    {text(*p.init).strip()}\n"
            f"{at}    for (; {test} && {guard}; ) {{\n{''.join(prefetch)}#pragma unroll\n"
            f"{at}        for (int kl_u = 0; kl_u < {batch}; ++kl_u) {{ {{ {body} }} {update}; }}\n"
            f"{leave}{at}    }}\n"
            f"{at}    for (; {stay}{test}; {update}) {{ {original} }}\n{at}}}")


def _made_ahead(a, loop: LoopFact, changed: set[str], src: bytes, root: Node) -> tuple[str, tuple[tuple[int, int], ...]]:  # noqa: ANN001
    """Why the load ``a`` cannot be made with the counter advanced, or where the counter is written in it (none:
    the counter does not move it). It must be a subscript of a known element type whose names the loop does
    not change (its array's pointer included), and in a ``while`` body come before the step: made ahead with
    the counter at the iteration's start, a load after the step would read a step early."""
    node = node_at(src, root, a.span)
    if node is None or node.type != "subscript_expression" or not a.elem_type:
        return f"`{a.text}` is not a subscript of a known element type", ()
    names = _identifiers(node, src)
    if names & changed:
        return f"`{a.text}` depends on {', '.join(sorted(names & changed))}, which the loop changes", ()
    counter = tuple((n.start_byte, n.end_byte) for n in _nodes(node) if n.type == "identifier" and _text(src, n) == loop.var)
    if counter and loop.kind == "while" and loop.update_span is not None and a.span[0] >= loop.update_span[0]:
        return f"`{a.text}` is read after the statement that steps the counter", ()
    return "", counter


#: Compound assignments and the operator each applies.
_COMPOUND = {"+=": "+", "-=": "-", "*=": "*", "/=": "/", "%=": "%", "&=": "&", "|=": "|", "^=": "^", "<<=": "<<", ">>=": ">>"}


def _in_place(a, src: bytes, root: Node) -> tuple[tuple[int, int], str, tuple[int, int] | None] | None:  # noqa: ANN001
    """The update ``a`` (``y[i] += e``, ``y[i]++``) as a statement of its own: its span, the operator it applies
    and its right side; None where its value is used (``z = y[i]++``) or it is not written so."""
    node = node_at(src, root, a.span)
    parent = node.parent if node is not None else None
    if parent is None or parent.parent is None or parent.parent.type != "expression_statement":
        return None
    if parent.type == "assignment_expression" and parent.child_by_field_name("left") == node:
        op = _text(src, parent.child_by_field_name("operator"))
        right = parent.child_by_field_name("right")
        if op in _COMPOUND and right is not None:
            return (parent.start_byte, parent.end_byte), _COMPOUND[op], (right.start_byte, right.end_byte)
    if parent.type == "update_expression":
        op = _text(src, parent.child_by_field_name("operator"))
        return (parent.start_byte, parent.end_byte), op[0], None
    return None


def _stores_first(w, r, src: bytes, root: Node) -> bool:  # noqa: ANN001 - analysis.Access
    """The store ``w`` runs before the read ``r`` in an iteration: it comes first in the text, unless ``r`` is
    on the right of ``w``'s own assignment (``x[i] = x[i] * 2``: the right side is read first)."""
    if w.span[0] > r.span[0]:
        return False
    node = node_at(src, root, w.span)
    parent = node.parent if node is not None else None
    if parent is not None and parent.type == "assignment_expression" and parent.child_by_field_name("left") == node:
        right = parent.child_by_field_name("right")
        if right is not None and right.start_byte <= r.span[0] and r.span[1] <= right.end_byte:
            return False
    return True


def _never_behind(load: Poly, store: Poly, trip: str, store_first: bool) -> bool:
    """No iteration loads an element that the same or an earlier iteration stored: both move by the same
    stride per iteration (a constant or a product of launch dimensions), so they meet only where their
    distance is a whole number of strides, reached from the store's side when that number is negative,
    or zero and the store comes first in the body."""
    stride = store.coefficient(trip)
    if stride is None or not stride.terms or load.coefficient(trip) != stride:
        return False
    gap = load - store
    if not gap.terms:
        return not store_first
    if stride.constant is None or gap.constant is None:
        return False
    return gap.constant % stride.constant != 0 or gap.constant // stride.constant > 0


def _nodes(node: Node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children)


def _indent(src: bytes, at: int) -> str:
    line = src[src.rfind(b"\n", 0, at) + 1:at].decode("utf-8")
    return line[: len(line) - len(line.lstrip())]


def _addressed(node: Node | None, src: bytes) -> set[str]:
    """Names whose address is taken under ``node`` (``&x``): a callee may assign them."""
    found: set[str] = set()
    stack = [node] if node is not None else []
    while stack:
        n = stack.pop()
        if n.type == "pointer_expression" and _text(src, n.child_by_field_name("operator")) == "&":
            arg = n.child_by_field_name("argument")
            if arg is not None and arg.type == "identifier":
                found.add(_text(src, arg))
        stack.extend(n.children)
    return found
