"""A running sum split across the lanes of a group: each thread's scan loop, in an under-filled launch.

A loop that carries a sum and stores its running value (Rodinia hybridsort's bucket offsets:
``int x = d[i]; d[i] = sum; sum += x;`` over a column, one thread per column) cannot be split like a
reduction: each iteration needs the sum of all the iterations before it. With few threads, each of them
walks its chain of loads and stores alone. The rewrite runs each original thread on a group of ``L``
consecutive lanes (the split-loop layout: ``L`` times the blocks, ``kl_vtid``/``kl_vbid`` the original
thread) and the loop in rounds of ``L`` iterations, lane ``l`` taking the ``l``-th of each round:

    for (i = start; i < bound; i += L * step) {          // the counter is lane 0's iteration
        T kl_e = 0;
        { const auto i = kl_r + kl_lane * step; if (test) { <the term's inputs>; kl_e = term; } }
        T kl_total; T kl_before = kl_group_scan_add_L(kl_e, kl_total);   // exclusive scan in the group
        { const auto i = …; if (test) { sum = kl_carry + kl_before; <the body as written> } }
        kl_carry += kl_total;
    }
    sum = kl_carry; __syncwarp(group);

so every iteration sees the sum of the iterations before it, as in the original, and the sum after the
loop is the same on every lane. :class:`RowScan` makes the same rewrite with a warp per original thread
where the loop walks a row that the threads of a warp read a row apart (a cumulative sum per row): the
lanes then read neighbouring elements, whatever the launch's size. The term's inputs are evaluated once more in the second block (the body
as written): they have no side effects and read nothing the body stores before them.

Legality, in terms of the analysis (each refusal names the missing fact):
- a 1-D kernel and launch whose block is a multiple of 32 at every size, under-filled (fewer warps than
  :data:`~.more_parallelism.UNDERFILLED_WARPS_PER_SM` per SM), with no barrier, shared memory, warp
  intrinsic or atomic, and no helper reading the thread index (the original's blocks and warps are gone);
- the loop is a counted loop (:mod:`.counted_loop`) stepped by adding a value it does not change (without
  side effects), tested by ``var < bound`` or ``var <= bound`` with a bound it does not change (an
  original loop that ends steps upwards, so lane 0 passing the test means the round has work), holds no
  other loop, calls nothing the analysis does not see, and cannot leave early or skip to the next
  iteration;
- one local it does not declare is carried from one iteration to the next: the sum, updated by one
  statement at the top level of the body (``sum += term`` or ``sum = sum + term``) and read elsewhere in
  the body (else it is a plain accumulator, split-loop's case); the term does not read the sum;
- an integer sum takes a term shown to be an integer (``sum += t`` converts at every step, which does not
  distribute over a regrouped sum when ``t`` is floating);
- what the term reads is computed before the update by declarations without side effects that do not
  read the sum, and nothing the body runs before the update assigns those names or stores into an array
  they read after the store (distinct arrays, by the spec, when the body stores);
- iterations are independent apart from the sum (:func:`~.warp_per_row.independent_iterations`);
- outside the loop, the lanes of a group run the original thread's code: the race check of warp-per-row
  applies, with the ``__syncwarp`` after the loop as the point where every lane has finished the loop
  (code after it that would race runs on the group's first lane).

The sum is reassociated (a tree in the group, then the rounds in order): exact for integers, within the
spec's tolerance for floating point, as for every reduction the harness verifies.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from tree_sitter import Node

from kernel_lsp.core.analysis import (
    Binding, KernelFacts, LoopFact, Reduction, assigned_names, bind, declared_anywhere, has_node,
    has_effects, identifiers_in, is_integer_type, node_text,
)
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError, with_candidate_launch
from kernel_lsp.core.transforms.counted_loop import CountedLoop, counted_loop
from kernel_lsp.core.transforms.emit import (
    BodyEdit, UserText, builtin_fields, declared_type, emit, node_at, parse, type_seen_at,
)
from kernel_lsp.core.transforms.more_parallelism import (
    DEFAULT_SM_COUNT, group_lanes, underfilled, warps,
)
from kernel_lsp.core.transforms.warp_per_row import (
    VIRTUAL_FIELDS, LoopPlan, balance, grown_launch, independent_iterations, lane_races, one_lane_tail, regroupable,
    virtual_thread, walks_row,
)

#: Floating types a running sum may have besides the integers (``decltype`` copies it; zero is the identity).
_FLOATS = ("float", "double")
_EXITS = ("return_statement", "break_statement", "continue_statement", "goto_statement")


@dataclass(frozen=True)
class _Scan:
    loop: LoopFact
    counted: CountedLoop
    target: str
    """The running sum."""
    update: tuple[int, int]
    """The statement that adds the term to it."""
    term: tuple[int, int]
    inputs: tuple[tuple[int, int], ...]
    """The declarations before the update that compute what the term reads, in order."""
    lanes: int
    tail: tuple[tuple[int, int], ...] = ()
    """Code after the loop run by the group's first lane only (see warp-per-row's one-lane tail)."""


class SplitScan(Rule):
    name = "split-scan"
    technique = "split-loop-across-threads"
    summary = "an under-filled grid: each thread's running-sum loop split across a group of lanes, a shuffle scan per round"

    def plan(self, ctx: RuleContext) -> tuple[_Scan | None, str]:
        found, why = regroupable(ctx)
        if found is None:
            return None, why
        facts, src, root, kernel = found
        lanes, why = self.lanes(ctx)
        if not lanes:
            return None, why
        try:
            patterns = bind(facts, Binding.from_spec(ctx.spec))
        except (SpecError, ValueError, ZeroDivisionError):
            return None, "the spec's launch does not evaluate"
        reasons = []
        for loop in facts.loops:
            node = node_at(src, root, loop.span)
            found = _running_sum(loop, node, src) if node is not None else None
            if found is None or not self.motivates(facts, loop, patterns):
                continue
            why, scan = self._scan(ctx, facts, loop, node, found, lanes, src)
            if scan is None:
                reasons.append(f"the loop at line {(loop.user_line or 0) + 1}: {why}")
                continue
            plan = LoopPlan(loop, (Reduction("accumulator", scan.target, "+", loop.line, loop.user_line, loop.id),),
                            scan.counted)
            race = lane_races([plan], facts)
            if race:
                why, tail = one_lane_tail([plan], kernel, src)
                if not tail or lane_races([plan], facts, tail):
                    reasons.append(race + (f" (and the code after the loop cannot run on one lane: {why})" if why else ""))
                    continue
                scan = replace(scan, tail=tail)
            return scan, ""
        return None, "; ".join(reasons) or self.nothing_to_split

    #: The refusal when no loop is a scan worth splitting.
    nothing_to_split = "no loop stores or reads the running value of a sum it carries (a scan)"

    def lanes(self, ctx: RuleContext) -> tuple[int, str]:
        """Lanes per original thread, or 0 and why the launch gives no reason to split."""
        if not underfilled(ctx):
            return 0, f"the launch has {warps(ctx)} warps, enough for {DEFAULT_SM_COUNT} SMs"
        lanes = group_lanes(ctx)
        if lanes < 2:
            return 0, "a loop reads elements smaller than a sector's share of two lanes: splitting would uncoalesce it"
        return lanes, ""

    def motivates(self, facts: KernelFacts, loop: LoopFact, patterns) -> bool:
        """The scan loop is worth splitting: in an under-filled launch, any is."""
        return True

    #: What the check says about the launch (after the warps it has).
    claim = "warps only"

    #: How the description starts.
    headline = "a running sum"

    def _scan(self, ctx: RuleContext, facts: KernelFacts, loop: LoopFact, node: Node, found: tuple[str, Node, Node],
              lanes: int, src: bytes) -> tuple[str, _Scan | None]:
        target, update, term = found
        if any(other.parent == loop.id for other in facts.loops):
            return "it holds another loop", None
        counted, why = counted_loop(loop, node, facts.body_span, src)
        if counted is None:
            return why, None
        if loop.step is None or (loop.step_span is None and not loop.increments):
            return "its counter is not stepped by adding a value", None
        step = node_at(src, node, loop.step_span) if loop.step_span is not None else None
        if step is not None and has_node(step, ("assignment_expression", "update_expression", "call_expression")):
            return "its step has side effects or calls a function", None
        test = counted.test
        if test is None or test.type != "binary_expression" or node_text(src, test.child_by_field_name("operator")) \
                not in ("<", "<=") or node_text(src, test.child_by_field_name("left")) != loop.var:
            return "its test is not `counter < bound` or `counter <= bound`", None
        if has_node(test, ("assignment_expression", "update_expression", "call_expression")):
            return "its test has side effects or calls a function", None
        body = node.child_by_field_name("body")
        if loop.calls_unknown:
            return "it calls code the analysis does not see", None
        if has_node(body, _EXITS):
            return "it can leave early or skip to the next iteration", None
        if assigned_names(body, src) & (identifiers_in(test, src) - {loop.var}):
            return "it assigns a name its test reads", None
        if step is not None and assigned_names(body, src) & (identifiers_in(step, src) - {loop.var}):
            return "it assigns a name its step reads", None
        carried = assigned_names(body, src) - declared_anywhere(body, src) - {loop.var}
        if carried - {target}:
            return f"it carries {', '.join(sorted(carried - {target}))} from one iteration to the next besides `{target}`", None
        if _assignments(body, target, src) != [update]:
            return f"it assigns `{target}` elsewhere than in `{node_text(src, update)}`", None
        if target in identifiers_in(term, src):
            return f"the term added to `{target}` reads `{target}`", None
        declared = type_seen_at(node, target, src) or ""
        if not (is_integer_type(declared) or declared in _FLOATS):
            return f"`{target}` is not declared before the loop with an arithmetic type", None
        why, inputs = _term_inputs(body, update, term, target, src)
        if inputs is None:
            return why, None
        if is_integer_type(declared):
            # ``sum += t`` converts ``sum + t`` to the sum's type at every step: with a floating term that
            # conversion does not distribute over a regrouped sum (an int 1 plus -0.5 truncates to 0, plus a
            # truncated -0.5 stays 1), so an integer sum takes integer terms only.
            kinds = _local_types(body, inputs, counted, src)
            reads = {a.span: a.elem_type for a in facts.accesses}
            if not _integral(term, src, kinds, reads):
                return f"`{target}` is an integer and the term `{node_text(src, term)}` is not shown to be one", None
        stores = [a for a in facts.accesses if loop.id in a.loops and a.writes and a.span[0] < update.start_byte]
        if stores and not ctx.distinct_arrays():
            return "the body stores before the update and the spec does not allocate every pointer parameter on its own", None
        for store in stores:
            late = [a for a in facts.accesses if a.reads and a.array == store.array and a.span[0] > store.span[0]
                    and any(lo <= a.span[0] < hi for lo, hi in [*inputs, (term.start_byte, term.end_byte)])]
            if late:
                return (f"the term's inputs read `{store.array}` (`{late[0].text}`) after the body stores it "
                        f"(`{store.text}`)"), None
        why = independent_iterations(facts, loop)
        if why:
            return why, None
        return "", _Scan(loop, counted, target, (update.start_byte, update.end_byte), (term.start_byte, term.end_byte),
                         inputs, lanes)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        scan, why = self.plan(ctx)
        if scan is None:
            return False, why
        try:
            with_candidate_launch(ctx.spec, grown_launch(ctx, scan.lanes))  # type: ignore[arg-type]
        except (SpecError, ValueError, ZeroDivisionError) as exc:
            return False, f"the new launch does not evaluate: {exc}"
        return True, (f"{warps(ctx)} {self.claim}; the loop at line {(scan.loop.user_line or 0) + 1} carries the running sum "
                      f"`{scan.target}` and nothing else, its iterations otherwise independent; 1-D kernel without "
                      "barriers, shared memory or warp intrinsics"
                      + ("; the code after the loop reads back what the lanes stored, so one lane runs it" if scan.tail else ""))

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        scan, _ = self.plan(ctx)
        assert scan is not None and ctx.facts is not None
        facts, lanes = ctx.facts, scan.lanes
        src, root = parse(ctx.preprocessed)
        edit = BodyEdit(ctx.preprocessed, facts)
        user = UserText(ctx.preprocessed, facts, ctx.source, ctx.kernel)
        lo, hi = facts.body_span
        edit.insert(lo + 1, virtual_thread(lanes))
        fields = [(n.start_byte, n.end_byte, new.format(lanes=lanes))
                  for n, new in builtin_fields(src, root.descendant_for_byte_range(lo, hi) or root, lo, hi, VIRTUAL_FIELDS)]
        for start, end, new in fields:
            edit.replace(start, end, new)

        def copy(a: int, b: int) -> tuple[str, str | None]:
            """The preprocessed text of [a, b) with the virtual thread's fields, and the user's text of it."""
            subs = [(s, e, new) for s, e, new in fields if a <= s and e <= b]
            text, at = [], a
            for s, e, new in sorted(subs):
                text += [src[at:s].decode("utf-8"), new]
                at = e
            text.append(src[at:b].decode("utf-8"))
            return "".join(text), user.span(a, b, subs)

        node = scan.counted.node
        body = node.child_by_field_name("body")
        var, target = scan.loop.var, scan.target
        test = scan.counted.test
        assert var is not None and body is not None and test is not None
        # The step as written (``DIVISIONS``, not what it expands to); ``++i`` steps by one.
        written = copy(*scan.loop.step_span) if scan.loop.step_span is not None else ("1", "1")
        pieces = [copy(s, e) for s, e in scan.inputs] + [copy(*scan.term), copy(test.start_byte, test.end_byte), written]
        inputs, (term, term_user), (cond, cond_user), (step_text, step_user) = \
            pieces[:-3], pieces[-3], pieces[-2], pieces[-1]

        inner = "\n" + edit.indent_at(node.start_byte) + "    "

        def first(texts: list[str], term_text: str, cond_text: str, step_text: str) -> str:
            lane_index = f"const decltype(kl_r) {var} = (decltype(kl_r))(kl_r + (decltype(kl_r))kl_lane * ({step_text}));"
            return (f"{inner}const decltype({var}) kl_r = {var}; decltype({target}) kl_e = 0;"
                    f"{inner}{{ {lane_index} if ({cond_text}) {{ {' '.join(texts)} kl_e = ({term_text}); }} }}"
                    f"{inner}decltype({target}) kl_total; const decltype({target}) kl_before = "
                    f"{_scan_name(lanes)}(kl_e, kl_total);"
                    f"{inner}{{ {lane_index} if ({cond_text}) {{ {target} = kl_carry + kl_before;")
        head = first([t for t, _ in inputs], term, cond, step_text)
        head_user = None
        if all(u is not None for _, u in inputs) and None not in (term_user, cond_user, step_user):
            head_user = first([u for _, u in inputs], term_user, cond_user, step_user)  # type: ignore[misc, arg-type]
        step_statement = scan.counted.step_statement
        round_step = f"{var} += {lanes} * ({step_text})"
        round_user = f"{var} += {lanes} * ({step_user})" if step_user is not None else None
        if step_statement is not None:
            # A while loop's step moves to the round's end (the counter is lane 0's iteration there).
            edit.replace(step_statement.start_byte, step_statement.end_byte, "")
            closing_step, closing_user = f" {round_step};", (f" {round_user};" if round_user is not None else None)
        else:
            step_node = scan.counted.step
            edit.replace(step_node.start_byte, step_node.end_byte, round_step, round_user)
            closing_step, closing_user = "", ""
        # The body is a block (a scan reads its sum beside the update): the round goes inside its braces.
        edit.insert(body.start_byte + 1, head, head_user)
        edit.insert(body.end_byte - 1, f" }} }}{inner}kl_carry += kl_total;{closing_step}",
                    f" }} }}{inner}kl_carry += kl_total;{closing_user}" if closing_user is not None else None)
        indent = edit.indent_at(node.start_byte)
        mask = f"(({(1 << lanes) - 1}u) << (threadIdx.x & {31 & ~(lanes - 1)}u))"
        edit.insert(node.start_byte, f"{{ decltype({target}) kl_carry = {target};\n{indent}")
        edit.insert(node.end_byte, f"\n{indent}{target} = kl_carry; __syncwarp({mask}); }}")
        for start, end in scan.tail:
            edit.insert(start, "if (kl_lane == 0u) { ")
            edit.insert(end, " }")
        source, expanded = emit(edit, ctx.source, ctx.kernel, _scan_helper(lanes, ctx.source))
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        if scan.tail:
            note += "; the code after the loop run by the group's first lane"
        return (Rewrite(source, f"{self.headline} split across {lanes} lanes per thread: the loop in rounds of {lanes} "
                                f"iterations, each lane's share of `{target}` from a shuffle scan in its group; launched with "
                                f"{lanes} times the blocks" + note, grown_launch(ctx, lanes), grid_scale=(lanes, 1, 1)),)


def _scan_name(lanes: int) -> str:
    return f"kl_group_scan_add{lanes}"


def _scan_helper(lanes: int, source: str) -> str:
    """The exclusive sum over an aligned group of ``lanes`` lanes (Hillis-Steele with ``__shfl_up_sync`` at the
    group's width), the group's total returned through ``total``; the mask names the group only."""
    name = _scan_name(lanes)
    if name in source:
        return ""
    return (f"template <typename T>\n__device__ __forceinline__ T {name}(T v, T& total) {{\n"
            f"    const unsigned kl_mask = {(1 << lanes) - 1}u << (threadIdx.x & {31 & ~(lanes - 1)}u);\n"
            f"    const unsigned kl_rank = threadIdx.x & {lanes - 1}u;\n"
            "    T s = v;\n"
            f"    for (unsigned o = 1; o < {lanes}u; o <<= 1) {{\n"
            f"        const T u = __shfl_up_sync(kl_mask, s, o, {lanes});\n"
            "        if (kl_rank >= o) s += u;\n"
            "    }\n"
            f"    total = __shfl_sync(kl_mask, s, {lanes - 1}, {lanes});\n"
            f"    const T before = __shfl_up_sync(kl_mask, s, 1, {lanes});\n"
            "    return kl_rank == 0u ? T(0) : before;\n}\n")


def _running_sum(loop: LoopFact, node: Node, src: bytes) -> tuple[str, Node, Node] | None:
    """(the sum, its update statement, the term added) when a top-level statement of the loop's body adds a
    term to a local (``s += t``, ``s = s + t``, ``s = t + s``) that the body also reads elsewhere."""
    body = node.child_by_field_name("body")
    if body is None or body.type != "compound_statement":
        return None
    for statement in body.named_children:
        found = _added(statement, src)
        if found is None:
            continue
        target, term = found
        rest = [c for c in body.named_children if c != statement]
        if any(target in identifiers_in(c, src) for c in rest) and target != loop.var:
            return target, statement, term
    return None


def _added(statement: Node, src: bytes) -> tuple[str, Node] | None:
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    e = statement.named_children[0]
    if e.type != "assignment_expression":
        return None
    left, right = e.child_by_field_name("left"), e.child_by_field_name("right")
    op = node_text(src, e.child_by_field_name("operator"))
    if left is None or right is None or left.type != "identifier":
        return None
    target = node_text(src, left)
    if op == "+=":
        return target, right
    if op == "=" and right.type == "binary_expression" and node_text(src, right.child_by_field_name("operator")) == "+":
        a, b = right.child_by_field_name("left"), right.child_by_field_name("right")
        if a is not None and a.type == "identifier" and node_text(src, a) == target and b is not None:
            return target, b
        if b is not None and b.type == "identifier" and node_text(src, b) == target and a is not None:
            return target, a
    return None


def _assignments(body: Node, name: str, src: bytes) -> list[Node]:
    """The statements of ``body`` that assign ``name`` (as a whole: ``name = …``, ``name op= …``, ``name++``)."""
    found = []
    stack = [body]
    while stack:
        n = stack.pop()
        if n.type in ("assignment_expression", "update_expression"):
            target = n.child_by_field_name("left") if n.type == "assignment_expression" else n.child_by_field_name("argument")
            if target is not None and target.type == "identifier" and node_text(src, target) == name:
                statement = n
                while statement.parent is not None and statement.type != "expression_statement":
                    statement = statement.parent
                found.append(statement)
        stack.extend(n.children)
    return found


def _term_inputs(body: Node, update: Node, term: Node, target: str, src: bytes) -> tuple[str, tuple[tuple[int, int], ...] | None]:
    """The declarations before ``update`` that compute what ``term`` reads (transitively), or why the term
    cannot be evaluated ahead of the body: an input assigned by another statement, or computed with side
    effects or from the sum."""
    before = [c for c in body.named_children if c.end_byte <= update.start_byte]
    needed = identifiers_in(term, src)
    if has_effects(term, src):
        return "the term added to the sum has side effects or calls a function that is not pure math", None
    inputs = []
    for statement in reversed(before):
        declared = declared_anywhere(statement, src) if statement.type == "declaration" else set()
        if declared & needed:
            if has_effects(statement, src) or target in identifiers_in(statement, src):
                return (f"`{node_text(src, statement).strip()}` computes the term's input with side effects or from "
                        f"`{target}`"), None
            inputs.append((statement.start_byte, statement.end_byte))
            needed |= identifiers_in(statement, src) - declared
            continue
        if assigned_names(statement, src) & needed:
            return (f"`{', '.join(sorted(assigned_names(statement, src) & needed))}`, which the term reads, is assigned "
                    f"before the update by `{node_text(src, statement).strip()}`"), None
    return "", tuple(reversed(inputs))


def _local_types(body: Node, inputs: tuple[tuple[int, int], ...], loop: CountedLoop,
                 src: bytes) -> Callable[[str], str | None]:
    """The declared type of a name the term reads: one of its inputs' declarations, the counter's in the loop's
    header, else what the loop sees."""
    declared = {}
    for c in body.named_children:
        if (c.start_byte, c.end_byte) in inputs:
            for name in declared_anywhere(c, src):
                declared[name] = declared_type(c, name, src)
    header = loop.initializer
    if header is not None and header.type == "declaration":
        declared[loop.var] = declared_type(header, loop.var, src)
    return lambda name: declared[name] if name in declared else type_seen_at(loop.node, name, src)


_COMPARISONS = {"<", "<=", ">", ">=", "==", "!=", "&&", "||"}
_FLOATING = re.compile(r"[.pP]|^[^xX]*[eE]|[fF]$")


def _integral(node: Node, src: bytes, kinds: Callable[[str], str | None], reads: Mapping[tuple[int, int], str]) -> bool:
    """``node`` has an integer type by what the analysis knows: integer literals, names and elements declared
    with integer types, casts to them, comparisons, and arithmetic on integers."""
    kind = node.type
    if kind == "number_literal":
        return not _FLOATING.search(node_text(src, node))
    if kind in ("char_literal", "true", "false"):
        return True
    if kind == "identifier":
        return is_integer_type(kinds(node_text(src, node)) or "")
    if kind == "subscript_expression":
        return is_integer_type(reads.get((node.start_byte, node.end_byte), ""))
    if kind == "parenthesized_expression":
        return len(node.named_children) == 1 and _integral(node.named_children[0], src, kinds, reads)
    if kind == "cast_expression":
        cast = node.child_by_field_name("type")
        return cast is not None and is_integer_type(node_text(src, cast))
    if kind == "binary_expression":
        if node_text(src, node.child_by_field_name("operator")) in _COMPARISONS:
            return True
        return all(_integral(node.child_by_field_name(f), src, kinds, reads) for f in ("left", "right"))
    if kind == "unary_expression":
        if node_text(src, node.child_by_field_name("operator")) == "!":
            return True
        return _integral(node.child_by_field_name("argument"), src, kinds, reads)
    if kind == "conditional_expression":
        return all(_integral(node.child_by_field_name(f), src, kinds, reads) for f in ("consequence", "alternative"))
    return False


class RowScan(SplitScan):
    """The same rewrite with a warp per original thread, for a scan along a row that each thread walks while
    the threads of a warp are a row apart (a cumulative sum per row): after it, the lanes read neighbouring
    elements. Offered where the row walk's accesses that become coalesced outnumber those that stop being
    so, whatever the launch's size (warp-per-row's motivation)."""

    name = "warp-per-row-scan"
    technique = "warp-per-row"
    summary = "a thread-per-row running sum split across the lanes of a warp, a shuffle scan per round"
    nothing_to_split = "no loop walks a row per thread while storing or reading the running value of a sum it carries"
    claim = "warps; the row walk becomes coalesced"
    headline = "a running sum along a row"

    def lanes(self, ctx: RuleContext) -> tuple[int, str]:
        return 32, ""

    def motivates(self, facts: KernelFacts, loop: LoopFact, patterns) -> bool:
        better, worse = balance(patterns, {loop.id})
        return walks_row(facts, loop, patterns) and better > worse
