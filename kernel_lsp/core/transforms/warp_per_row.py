"""A warp per row instead of a thread per row.

Kernels that give each thread a row of its own (softmax, layer norms, GEMV-like rows, CSR rows)
walk memory with a stride of a whole row across the warp: 32 sectors per request. The rewrite
runs each original thread on a warp: the warp's 32 lanes split the row loop (lane ``l`` takes
iterations ``l, l+32, …``), so consecutive lanes touch consecutive elements, and the loop's
accumulators are combined with butterfly shuffles, after which every lane holds the row's
result and the code after the loop runs as before.

The original threads are kept as *virtual* threads: with the same block size and a grid 32
times larger, warp ``w`` of the new launch is thread ``w`` of the old one
(``threadIdx.x``/``blockIdx.x`` in the body become the virtual thread's, ``gridDim.x`` the old
grid), so however the kernel combines its indices, each virtual thread does the original
thread's work.

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a 1-D kernel and launch whose block is a multiple of 32 at every size of the spec;
- no barrier, shared memory, warp-level intrinsic or atomic anywhere (the original's blocks do
  not exist any more), and no helper function that reads the thread or block index;
- in each rewritten loop: a counted loop (:mod:`.counted_loop`: a ``for``, with or without an
  initializer, or a ``while`` stepped by one statement of its body) with a unit step and no nested
  loop, whose counter is dead once it ends, calling nothing the analysis does not see, with no
  early exit; the only scalars it carries are accumulators (``+``, ``max``, ``min``) that it reads
  only to update them, a local struct's members among them (``f.x += …``, the struct used in the
  loop through those members only); every array it writes is written
  at an index that moves with the iteration and read nowhere else in the loop, except at one
  element the store never reaches (a constant distance before its first one, or not a whole
  number of its strides away: a pivot ``a[r*n + r]`` read while ``a[r*n + j]`` is stored for ``j > r``);
- only innermost loops are split; the loops around them run whole on every lane of the group,
  with the same trips (nothing a lane computes differently outlives a split loop: accumulators
  are combined right after it), so a split loop nested in one (``for t2: for i: out[i] += …``)
  gives each lane the same iterations every time round;
- an array stored in one split loop and read in another is read at the same index, as a
  function of the iteration (``out[i] = 0`` then ``out[i] += …``): the element belongs to the
  same lane in both, so no lane reads another's store;
- an array stored both outside the split loops (by every lane) and in one has an accumulator's
  reduction between the two stores, which the lanes all reach: otherwise a slower lane's store of
  the first could land after the owner's of the second;
- at least one global access in such a loop walks the row (unit stride along the loop) while
  neighbouring threads are a row apart (the reason to rewrite at all).

Where the code after the last split loop would race with itself across the lanes (a reduction's
result stored, then read back; an output updated in place: ``y[i] += s``), the group's first lane
runs it alone: the last split loop must combine an accumulator (its shuffle is where every lane has
made all of its earlier accesses) and lie in no other loop or switch (its tail runs once).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import (
    Binding, KernelFacts, LoopFact, Reduction, assigned_names, bind, conditional_update, declared_anywhere,
    helper_reading_thread_index, member_path, threads_cooperate, trip_count,
)
from kernel_lsp.core.analysis import has_node as _has
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError, with_candidate_launch
from kernel_lsp.core.transforms.counted_loop import CountedLoop, counted_loop, counter_dead_after, set_first
from kernel_lsp.core.transforms.emit import (
    WARP_REDUCE, BodyEdit, builtin_fields, emit, node_at, parse, pragma_before, warp_reduce_helpers,
)

#: The ``unroll`` variant unrolls by UNROLL each split loop of at least this many iterations per
#: lane at the spec's size: each lane has one load per iteration in flight, and a long row streams
#: at the pace of the memory latency unless several iterations' loads issue together.
UNROLL_FROM_TRIPS_PER_LANE = 8
UNROLL = 4

#: What the kernel body's builtin fields become for the virtual thread of :func:`virtual_thread`.
VIRTUAL_FIELDS = {("threadIdx", "x"): "kl_vtid", ("blockIdx", "x"): "kl_vbid", ("gridDim", "x"): "(gridDim.x / {lanes}u)"}
_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class LoopPlan:
    loop: LoopFact
    accumulators: tuple[Reduction, ...]
    counted: CountedLoop
    """Where the loop's counter starts and steps (the rewrite moves both)."""


@dataclass(frozen=True)
class _Split:
    loops: tuple[LoopPlan, ...]
    tail: tuple[tuple[int, int], ...] = ()
    """Byte ranges (of the preprocessed view) run by one lane of the group only: every statement after the
    last split loop, where every lane running the original thread's code would race with the others (a
    second reduction's result stored, then read back: ``tmp[i] = a; y[i] = alpha * tmp[i] + beta * y[i]``)."""


def walks_row(facts: KernelFacts, loop: LoopFact, patterns) -> bool:
    """A global access in ``loop`` moves one element per iteration while the lanes of a warp are
    not next to each other (a row apart, or at data-dependent row starts as in CSR)."""
    for p in patterns:
        a = p.access
        if loop.id in a.loops and a.space == "global" and a.loops[-1] == loop.id and p.loop_stride_elems == 1 \
                and p.pattern in ("strided", "gather"):
            return True
    return False


def balance(patterns, loops: set[int]) -> tuple[int, int]:
    """(accesses the rewrite makes coalesced, accesses it makes uncoalesced) in the rewritten loops:
    after it, neighbouring lanes are neighbouring iterations, so an access's new warp stride is its
    old stride along the loop."""
    better = worse = 0
    for p in patterns:
        a = p.access
        if a.space != "global" or not a.loops or a.loops[-1] not in loops:
            continue
        if p.uncoalesced and p.loop_stride_elems == 1:
            better += 1
        elif p.pattern == "coalesced" and p.loop_stride_elems not in (0, 1, -1):
            worse += 1
    return better, worse


def lane_races(plans: list[LoopPlan], facts: KernelFacts, one_lane: tuple[tuple[int, int], ...] = ()) -> str | None:
    """Outside the split loops every lane of a group runs the original thread's code: each store
    there happens once per lane, and an element stored in a split loop by one lane may be read by
    another. The lanes of a group only wait for each other at an accumulator's shuffle (after its
    loop), so a read and a store of one array race unless such a shuffle lies between them, or the
    store comes first and every lane stores the same value there (outside the split loops); two stores
    of one array, one outside the split loops and one in them, race unless such a shuffle lies between.
    ``one_lane``: the ranges of code run by one lane only (after the last split loop's shuffle, which
    every lane reached once all of their earlier accesses were made): their accesses race with none."""
    split = {p.loop.id: p for p in plans}
    syncs = [p.loop.span[1] for p in plans if p.accumulators]

    def synced(a: int, b: int) -> bool:
        lo, hi = sorted((a, b))
        return any(lo < at <= hi for at in syncs)

    accesses = [a for a in facts.accesses if a.space == "global" and not any(lo <= a.span[0] < hi for lo, hi in one_lane)]
    # Two stores of one element, one by every lane and one by its owner in a split loop: unless a
    # reduction orders them, a lane still running the first may land its store after the owner's.
    for w in (a for a in accesses if a.writes and not set(a.loops) & split.keys()):
        for o in (a for a in accesses if a.writes and a.array == w.array and set(a.loops) & split.keys()):
            if (set(w.loops) & set(o.loops)) - split.keys() or not synced(w.span[0], o.span[0]):
                return (f"`{w.text}` stored at line {(w.user_line or 0) + 1} by every lane and `{o.text}` stored at line "
                        f"{(o.user_line or 0) + 1} in a split loop have no reduction between them: one lane's store may "
                        "land after another's")
    for w in (a for a in accesses if a.writes):
        w_split = set(w.loops) & split.keys()
        for r in (a for a in accesses if a.array == w.array and a.reads):
            r_split = set(r.loops) & split.keys()
            if w_split and w_split == r_split:
                continue  # within one split loop: the loop's own conditions
            if w_split and r_split and _same_owner(w, r, split):
                continue
            if (set(r.loops) & set(w.loops)) - split.keys():
                return f"`{r.text}` and `{w.text}` share a loop that every lane runs: a lane may read another's store"
            if r is w and not w_split:
                return f"`{w.text}` outside the split loops is a read-modify-write: each lane would apply it"
            # A store's left side comes before the read on its right (``y[i] = y[i] * 2``) but runs after it.
            if not w_split and r.span[0] > w.span[0] and r.line != w.line:
                continue
            if not synced(r.span[0], w.span[0]):
                return f"`{r.text}` may read `{w.array}` after another lane of its group stored it (`{w.text}`)"
    return None


def _same_owner(w, r, split: dict) -> bool:
    """Lane ``l`` runs the iterations ``l, l + lanes, …`` of every split loop, so two accesses in
    two split loops touch an element from the same lane when their indices are one function of
    the iteration."""
    (wl,), (rl,) = set(w.loops) & split.keys(), set(r.loops) & split.keys()
    return w.index.renamed(split[wl].loop.trip_symbol, split[rl].loop.trip_symbol) == r.index


#: Statements a one-lane tail may pass through on its way out to the kernel's body: the code after a
#: split loop nested in another loop, a switch or a labelled statement runs again or elsewhere, not once.
_TAIL_PARENTS = ("compound_statement", "if_statement", "else_clause")


def one_lane_tail(plans: list[LoopPlan], kernel: Node, src: bytes) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The statements after the last split loop, as ranges to run on one lane, or why they cannot be.

    Every lane holds the same values once the last split loop's accumulators are combined (nothing else a
    lane computed in a split loop outlives it), so the first lane alone does what the original thread did
    next. Its shuffle is where every lane has made all of its earlier accesses; at each enclosing level the
    statements after it are wrapped, so one lane's ``return`` still skips the rest."""
    last = max(plans, key=lambda p: p.loop.span[1])
    if not last.accumulators:
        return "the last split loop combines no accumulator, so nothing makes the other lanes finish first", ()
    body = kernel.child_by_field_name("body")
    node = node_at(src, kernel, last.loop.span)
    if body is None or node is None or _has(body, ("goto_statement", "labeled_statement")):
        return "the kernel jumps (goto or labels)", ()
    ranges = []
    while node != body:
        parent = node.parent
        if parent is None or parent.type not in _TAIL_PARENTS:
            kind = "loop" if parent is not None and parent.type in ("for_statement", "while_statement", "do_statement") \
                else "switch or labelled statement"
            return f"the last split loop lies in another {kind}, whose code after it runs again or elsewhere", ()
        if parent.type == "compound_statement":
            after = [c for c in parent.named_children if c.start_byte >= node.end_byte and c.type != "comment"]
            if after:
                ranges.append((after[0].start_byte, after[-1].end_byte))
        node = parent
    if not ranges:
        return "nothing follows the last split loop", ()
    return "", tuple(sorted(ranges))


def regroupable(ctx: RuleContext) -> tuple[tuple[KernelFacts, bytes, Node, Node] | None, str]:
    """(the facts, the preprocessed source, its tree, the kernel's node) when each original thread can become a
    group of lanes of a 1-D launch with more blocks (:func:`virtual_thread`), or why it cannot: a 1-D kernel
    and launch whose block is a multiple of 32 at every size, no barrier, shared memory, warp intrinsic or
    atomic, no helper reading the thread index."""
    facts = ctx.facts
    if facts is None or not facts.complete:
        return None, "the kernel's analysis is missing or incomplete"
    if ctx.spec is None:
        return None, "needs a launch spec (the launch changes: more blocks)"
    if set(facts.thread_dims) - {"tid.x", "bid.x", "bdim.x", "gdim.x"}:
        return None, "the kernel is not one-dimensional"
    blocks = [launch.block for launch in ctx.launches()]
    if not blocks or any(b[1] != 1 or b[2] != 1 or b[0] % 32 for b in blocks):
        return None, "the block is not one-dimensional with a multiple of 32 threads at every size"
    if any(launch.grid[1] != 1 or launch.grid[2] != 1 for launch in ctx.launches()):
        return None, "the grid is not one-dimensional"
    if threads_cooperate(facts):
        return None, "barriers, shared memory, warp intrinsics or atomics: the original's blocks and warps would not exist"
    src, root = parse(ctx.preprocessed)
    kernel = node_at(src, root, facts.span)
    if kernel is None:
        return None, "the kernel's definition was not found in the preprocessed view"
    if (helper := helper_reading_thread_index(facts, root, src)) is not None:
        return None, f"the helper `{helper}` reads the thread or block index"
    return (facts, src, root, kernel), ""


def _calls(node: Node, src: bytes) -> set[str]:
    found = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "call_expression":
            fn = n.child_by_field_name("function")
            if fn is not None:
                found.add(_text(src, fn).split("<", 1)[0].rsplit("::", 1)[-1].strip())
        stack.extend(n.children)
    return found


class WarpPerRow(Rule):
    name = "warp-per-row"
    technique = "warp-per-row"
    summary = "a thread-per-row loop split across the lanes of a warp, accumulators combined with shuffles"

    def plan(self, ctx: RuleContext) -> tuple[_Split | None, str]:
        found, why = regroupable(ctx)
        if found is None:
            return None, why
        facts, src, root, kernel = found
        try:
            patterns = bind(facts, Binding.from_spec(ctx.spec))
        except (SpecError, ValueError, ZeroDivisionError):
            return None, "the spec's launch does not evaluate"
        plans: list[LoopPlan] = []
        reasons: list[str] = []
        for loop in facts.loops:
            if any(other.parent == loop.id for other in facts.loops) or not self._motivates(ctx, loop, patterns):
                continue
            why, plan = self._loop_plan(facts, loop, root, src)
            if plan is None:
                reasons.append(f"the loop at line {(loop.user_line or 0) + 1}: {why}")
                continue
            plans.append(plan)
        if not plans:
            return None, "; ".join(reasons) or self.nothing_to_split
        if reasons:
            return None, "; ".join(reasons)
        tail: tuple[tuple[int, int], ...] = ()
        race = lane_races(plans, facts)
        if race:
            why, tail = one_lane_tail(plans, kernel, src)
            if not tail or lane_races(plans, facts, tail):
                return None, race + (f" (and the code after the last split loop cannot run on one lane: {why})"
                                     if why else "")
        why = self._unprofitable(ctx, patterns, plans)
        if why:
            return None, why
        return _Split(tuple(plans), tail), ""

    #: What the split loops were found to do (the reason to split them).
    loop_claim = "walk a row per thread"
    #: The refusal when no loop gives a reason to rewrite.
    nothing_to_split = "no loop walks a row per thread (unit stride along the loop, a row apart across the warp)"

    def lanes(self, ctx: RuleContext) -> int:
        """How many lanes share an original thread's loop (a power of two dividing 32)."""
        return 32

    def _motivates(self, ctx: RuleContext, loop: LoopFact, patterns) -> bool:
        """The loop is worth splitting: it walks a row per thread."""
        return walks_row(ctx.facts, loop, patterns)

    def _unprofitable(self, ctx: RuleContext, patterns, plans: list[LoopPlan]) -> str | None:
        better, worse = balance(patterns, {p.loop.id for p in plans})
        if better <= worse:
            return (f"{worse} access(es) coalesced across threads would become a row apart across lanes, "
                    f"against {better} that would become coalesced")
        return None

    def _reduction(self, op: str, lanes: int) -> str:
        """The call that combines ``op`` over the lanes sharing a loop."""
        return WARP_REDUCE[op]

    def _helpers(self, ops: set[str], lanes: int, source: str) -> str:
        return warp_reduce_helpers(ops, source)

    def _loop_plan(self, facts: KernelFacts, loop: LoopFact, root: Node, src: bytes) -> tuple[str, LoopPlan | None]:
        """The loop split across lanes, or why it cannot be."""
        node = node_at(src, root, loop.span)
        counted, why = counted_loop(loop, node, facts.body_span, src)
        if counted is None:
            return why, None
        if loop.step is None or loop.step.constant != 1:
            return "its step is not 1", None
        if loop.calls_unknown:
            return "it calls code the analysis does not see", None
        body = node.child_by_field_name("body")
        if body is None or _has(body, ("return_statement", "break_statement", "goto_statement")):
            return "it can leave early", None
        accumulators = tuple(r for r in facts.reductions if r.kind == "accumulator" and r.loop == loop.id)
        if any(r.op not in WARP_REDUCE for r in accumulators):
            return "an accumulator's operator has no shuffle reduction here", None
        # A name the body sets before reading it (an inner loop's counter declared further out) carries nothing,
        # provided nothing reads what the last iteration left in it.
        carried = {n for n in assigned_names(body, src) - declared_anywhere(body, src) - {loop.var}
                   if not (set_first(body, n, src) and counter_dead_after(node, n, facts.body_span, src))}
        names = {r.target for r in accumulators}
        # A local struct whose members accumulate (``f.x += …``): carried only through those members.
        bases = {name.split(".", 1)[0] for name in names if "." in name}
        if carried - names - bases:
            return f"it carries {', '.join(sorted(carried - names - bases))} from one iteration to the next", None
        for base in sorted(bases):
            if not _members_only(body, src, base, names):
                return f"it uses `{base}` otherwise than through the members it accumulates", None
        for acc in names:
            if not _only_updated(body, src, acc):
                return f"it reads the accumulator `{acc}` for something else than updating it", None
        why = independent_iterations(facts, loop)
        if why:
            return why, None
        return "", LoopPlan(loop, accumulators, counted)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        split, why = self.plan(ctx)
        if split is None:
            return False, why
        try:
            with_candidate_launch(ctx.spec, self._launch(ctx))  # type: ignore[arg-type]
        except (SpecError, ValueError, ZeroDivisionError) as exc:
            return False, f"the new launch does not evaluate: {exc}"
        lines = ", ".join(str((p.loop.user_line or 0) + 1) for p in split.loops)
        return True, (f"loops at line {lines} {self.loop_claim} with independent iterations"
                      + (" and accumulators combined associatively" if any(p.accumulators for p in split.loops) else "")
                      + "; 1-D kernel without barriers, shared memory or warp intrinsics"
                      + ("; the code after the last split loop reads back what the lanes stored there, so one lane runs it"
                         if split.tail else ""))

    def _launch(self, ctx: RuleContext) -> dict:
        return grown_launch(ctx, self.lanes(ctx))

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        split, _ = self.plan(ctx)
        assert split is not None
        lanes = self.lanes(ctx)
        source, expanded, _ = self._source(ctx, split, unroll=False)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        if split.tail:
            note += "; the code after the last split loop run by the group's first lane"
        out = [Rewrite(source, self._description(lanes) + note, self._launch(ctx), grid_scale=(lanes, 1, 1))]
        # Unrolling helps some long rows and slows others (more registers, fewer warps): the harness
        # decides between the two.
        unrolled, _, any_unrolled = self._source(ctx, split, unroll=True)
        if any_unrolled:
            out.append(Rewrite(unrolled, self._description(lanes) + f"; long split loops unrolled by {UNROLL}" + note,
                               self._launch(ctx), grid_scale=(lanes, 1, 1), variant="unroll"))
        return tuple(out)

    def _source(self, ctx: RuleContext, split: _Split, unroll: bool) -> tuple[str, bool, bool]:
        """The rewritten file, whether the kernel's macros were expanded, and whether a loop was unrolled."""
        facts = ctx.facts
        assert facts is not None
        src, root = parse(ctx.preprocessed)
        edit = BodyEdit(ctx.preprocessed, facts)
        lo, hi = facts.body_span
        lanes = self.lanes(ctx)
        binding = Binding.from_spec(ctx.spec)  # type: ignore[arg-type]
        edit.insert(lo + 1, virtual_thread(lanes))
        for node, new in builtin_fields(src, root.descendant_for_byte_range(lo, hi) or root, lo, hi, VIRTUAL_FIELDS):
            edit.replace(node.start_byte, node.end_byte, new.format(lanes=lanes))
        ops: set[str] = set()
        unrolled = False
        for n, plan in enumerate(split.loops):
            before, after = [], []
            for k, acc in enumerate(plan.accumulators):
                ops.add(acc.op)
                if acc.op == "+":
                    before.append(f"auto kl_init{n}_{k} = {acc.target}; {acc.target} = 0;")
                    after.append(f"{acc.target} = kl_init{n}_{k} + {self._reduction('+', lanes)}({acc.target});")
                else:
                    after.append(f"{acc.target} = {self._reduction(acc.op, lanes)}({acc.target});")
            indent = edit.indent_at(plan.loop.span[0])
            opening = "{ " + " ".join(before) + "\n" + indent if plan.accumulators else ""
            trips = trip_count(facts, plan.loop, binding)
            if unroll and trips is not None and trips >= UNROLL_FROM_TRIPS_PER_LANE * lanes \
                    and pragma_before(src, plan.loop.span[0]) is None:
                opening += f"#pragma unroll {UNROLL}\n" + indent
                unrolled = True
            if opening:
                edit.insert(plan.loop.span[0], opening)
            # A counter set before the loop is moved into braces of its own around the loop: inserted at the
            # same places as the accumulators' braces, the two pairs nest whichever order they come out in.
            plan.counted.restart(edit, lambda start: f"({start}) + kl_lane")
            plan.counted.restep(edit, f"{plan.loop.var} += {lanes}")
            if plan.accumulators:
                edit.insert(plan.loop.span[1], "\n" + indent + " ".join(after) + " }")
        # Inserted after the loops' own edits: where a statement follows a loop with nothing between, the
        # accumulators' combine comes first.
        for start, end in split.tail:
            edit.insert(start, "if (kl_lane == 0u) { ")
            edit.insert(end, " }")
        helpers = self._helpers(ops, lanes, ctx.source)
        source, expanded = emit(edit, ctx.source, ctx.kernel, helpers)
        return source, expanded, unrolled

    def _description(self, lanes: int) -> str:
        return ("a warp per row: the row loops split across the 32 lanes, accumulators combined with "
                "warp shuffles; launched with 32 times the blocks")




def independent_iterations(facts: KernelFacts, loop: LoopFact) -> str | None:
    """Why an iteration of ``loop`` may touch an element another iteration stores, or None: every array the
    loop writes is written at an index that moves with the iteration and read in the loop only at that same
    index or at an element the store never reaches."""
    in_loop = [a for a in facts.accesses if loop.id in a.loops and a.space != "shared"]
    for w in in_loop:
        if not w.writes:
            continue
        along = w.index.coefficient(loop.trip_symbol)
        if along is None or along.constant == 0:
            return f"it writes `{w.array}` at an index that does not move with the iteration"
        clash = next((r for r in in_loop if r is not w and r.array == w.array and r.index != w.index
                      and not _never_written(r, w, loop.trip_symbol, facts)), None)
        if clash is not None:
            return (f"it reads `{w.array}` at another index than it writes (`{clash.text}` may be an element "
                    f"`{w.text}` stores in another iteration)")
    return None


def grown_launch(ctx: RuleContext, lanes: int) -> dict:
    """The spec's launch with ``lanes`` times the blocks along x (a ``candidate`` field): a group of ``lanes`` threads
    per original thread (:func:`virtual_thread`), the block unchanged."""
    grid = ctx.spec.launch.grid  # type: ignore[union-attr]
    return {"grid": [f"({grid[0]}) * {lanes}", grid[1], grid[2]], "block": list(ctx.spec.launch.block)}  # type: ignore[union-attr]


def virtual_thread(lanes: int) -> str:
    """Declarations that make group ``w`` of ``lanes`` consecutive threads of a launch with ``lanes`` times the
    blocks do thread ``w`` of the original one (``kl_vtid``, ``kl_vbid``; ``kl_lane`` is the rank in the group).
    A block is a multiple of 32 threads, so a group never spans two warps."""
    return (f"\n    const unsigned kl_lane = threadIdx.x & {lanes - 1}u;\n"
            "    const unsigned long long kl_gwarp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) "
            f"/ {lanes}u;\n"
            "    const unsigned kl_vtid = (unsigned)(kl_gwarp % blockDim.x);\n"
            "    const unsigned kl_vbid = (unsigned)(kl_gwarp / blockDim.x);\n")


def _never_written(r, w, trip: str, facts: KernelFacts) -> bool:  # noqa: ANN001 - analysis.Access
    """The loop-invariant read ``r`` is an element the store ``w`` never reaches: ``w`` moves by a constant
    stride per iteration from a constant distance to ``r`` that is not a whole non-negative number of
    strides (a pivot ``a[k*n + k]`` read while ``a[k*n + j]`` is stored for ``j > k``)."""
    from kernel_lsp.core.transforms.stencil_reuse import canonical

    read, store = canonical(r.index, facts), canonical(w.index, facts)
    stride = store.coefficient(trip)
    if stride is None or stride.constant in (None, 0) or trip in read.symbols:
        return False
    gap = (read - (store - Poly.sym(trip) * stride)).constant
    if gap is None:
        return False
    return gap % stride.constant != 0 or gap // stride.constant < 0



def _only_updated(body: Node, src: bytes, name: str) -> bool:
    """Every mention of ``name`` (a local, or a local's member ``f.x``) in the loop is inside a statement
    that updates it (``acc += …``, ``acc = acc + …``, ``acc = fmaxf(acc, …)``), and mentions it there only
    as the target and as the one operand carried."""
    stack = [body]
    while stack:
        n = stack.pop()
        if n.type == "if_statement" and conditional_update(n, src) is not None and conditional_update(n, src)[0] == name:
            continue
        if n.type == "expression_statement":
            text = _text(src, n)
            mentions = _mentions(text, name)
            if mentions == 0:
                continue
            e = n.named_children[0] if n.named_children else None
            if e is None or e.type != "assignment_expression":
                return False
            left = e.child_by_field_name("left")
            if left is None or (_text(src, left) if left.type == "identifier" else member_path(left, src)) != name:
                return False
            op = _text(src, e.child_by_field_name("operator"))
            if op != "=" and mentions != 1:
                return False
            if op == "=" and mentions != 2:
                return False
            continue
        if n.type in ("identifier", "field_expression") and (
                _text(src, n) if n.type == "identifier" else member_path(n, src)) == name:
            return False
        stack.extend(n.children)
    return True


def _mentions(text: str, name: str) -> int:
    """How many times ``text`` names ``name`` (a member path ``f.x`` as well, spaces around its dots allowed)."""
    if "." not in name:
        return _NAME.findall(text).count(name)
    pattern = r"(?<![\w.])" + r"\s*\.\s*".join(re.escape(part) for part in name.split(".")) + r"(?!\w)"
    return len(re.findall(pattern, text))


def _members_only(body: Node, src: bytes, base: str, members: set[str]) -> bool:
    """Every mention of ``base`` in ``body`` is one of ``members`` (``f.x``), not the whole value (``g = f``)
    nor another member."""
    stack = [body]
    while stack:
        n = stack.pop()
        if n.type == "identifier" and _text(src, n) == base:
            top = n
            while top.parent is not None and top.parent.type == "field_expression" \
                    and top.parent.child_by_field_name("argument") == top:
                top = top.parent
            if member_path(top, src) not in members:
                return False
            continue
        stack.extend(n.children)
    return True


#: Iterations per thread of the block below which a block per row would leave threads idle.
MIN_ITERATIONS_PER_THREAD = 2

_BLOCK_BODIES = {"+": "w = w + scratch[i];", "max": "w = max(w, scratch[i]);", "min": "w = min(w, scratch[i]);"}


class BlockPerRow(WarpPerRow):
    """The warp-per-row rewrite with a whole block per original thread: the block's threads split the
    row loop, accumulators combined by a block reduction (warp shuffles, one slot per warp in shared
    memory, every thread given the result). Its legality is warp-per-row's (the group of lanes is the
    block: conditions on the original thread are the same for all of it, so every thread of a block
    reaches the reduction's barriers), on a block that is a power of two from 64 to 1024 threads at
    every size, offered where a row loop runs at least twice the block's threads at the spec's size."""

    name = "block-per-row"
    technique = "warp-per-row"
    summary = "a thread-per-row loop split across the threads of a block, accumulators combined by a block reduction"
    loop_claim = "walk a long row per thread"

    def lanes(self, ctx: RuleContext) -> int:
        block = ctx.constant_block()
        return block[0] if block is not None else 0

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        lanes = self.lanes(ctx)
        if ctx.spec is not None and (lanes < 64 or lanes > 1024 or lanes & (lanes - 1)):
            return False, "the block is not the same power of two from 64 to 1024 threads at every size"
        return super().check(ctx)

    def _motivates(self, ctx: RuleContext, loop, patterns) -> bool:
        if not walks_row(ctx.facts, loop, patterns):
            return False
        try:
            trips = trip_count(ctx.facts, loop, Binding.from_spec(ctx.spec))
        except (SpecError, ValueError, ZeroDivisionError):
            return False
        return trips is not None and trips >= MIN_ITERATIONS_PER_THREAD * self.lanes(ctx)

    def _reduction(self, op: str, lanes: int) -> str:
        return f"kl_block_{WARP_REDUCE[op].rsplit('_', 1)[1]}"

    def _helpers(self, ops: set[str], lanes: int, source: str) -> str:
        out = [warp_reduce_helpers(ops, source)]
        for op in sorted(ops):
            name = self._reduction(op, lanes)
            if name in source:
                continue
            out.append(
                f"// Every thread of the block gets the block's result; the first barrier lets the scratch be reused.\n"
                f"template <typename T>\n__device__ T {name}(T v) {{\n"
                f"    __shared__ T scratch[32];\n"
                f"    v = {WARP_REDUCE[op]}(v);\n"
                "    __syncthreads();\n"
                "    if ((threadIdx.x & 31u) == 0u) scratch[threadIdx.x >> 5] = v;\n"
                "    __syncthreads();\n"
                "    T w = scratch[0];\n"
                f"    for (unsigned i = 1; i < (blockDim.x + 31u) >> 5; ++i) {_BLOCK_BODIES[op]}\n"
                "    return w;\n}\n")
        return "".join(out)

    def _description(self, lanes: int) -> str:
        return (f"a block per row: the row loops split across the block's {lanes} threads, accumulators combined by a "
                f"block reduction (warp shuffles and shared memory); launched with {lanes} times the blocks")
