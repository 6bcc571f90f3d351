"""An under-filled launch's loops split across a new axis of the block, partial results combined in shared memory.

PolyBench's column kernels (a mean, a standard deviation, ``y = A^T x``: one thread per column, a loop
over the rows) read coalesced across the threads, and a launch of a few thousand columns is a few warps
per SM, each waiting on one long chain of loads. Splitting the loop across lanes of a warp (split-loop)
keeps a sector's worth of neighbouring columns together only for up to four lanes; this rewrite
instead gives each original thread S threads along ``threadIdx.y`` of a block S times taller: thread
``(x, s)`` runs the iterations ``s, s + S, …`` of thread ``x``'s loop, the warps still hold neighbouring
columns (coalescing unchanged), and the launch has S times the warps. After the loop, each accumulator's
S partial values meet in shared memory after one barrier and thread ``(x, 0)`` combines them (the
loop's start value added back once) and runs the code after the loop, the others nothing.

The barrier needs every thread of the block, so the guards around the loop are split as for
tile-contraction (a predicate; the statements before the loop run under it, their declarations hoisted;
the loop and the combine run in every thread, computing only under it).

Legality, in terms of the analysis (each refusal names the fact that was missing):
- a launch spec with a 1-D block of one size at every size of the spec and fewer warps than
  ``UNDERFILLED_WARPS_PER_SM`` per SM of the GPU at its main size; a 1-D kernel that reads no
  ``threadIdx.y``/``blockDim.y`` (the new axis) nor a cooperative group's rank;
- no barrier, shared memory, warp intrinsic or atomic (the original's blocks cooperate in no way the new
  axis would change);
- the loop: warp-per-row's loop legality (a unit-step ``for`` whose iterations are independent, carrying
  only accumulators of ``+``, ``max``, ``min``), reached from the body through blocks and ``if``\\ s
  without ``else``, no ``return`` before it but leading ``if (…) return;`` exits;
- before the loop, no read-modify-write of global memory (every part runs that code) and no access
  to an array the loop stores (the other parts of the thread run the loop meanwhile); a plain store
  there is made by every part with the same value;
- the loop runs at least 2 S iterations at the spec's main size (each part gets two or more).
"""

from __future__ import annotations

from kernel_lsp.core.analysis import Binding, threads_cooperate, trip_count
from kernel_lsp.core.rules.base import MAX_THREADS_PER_BLOCK, Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError
from kernel_lsp.core.transforms.elementwise import DEFAULT_SM_COUNT
from kernel_lsp.core.transforms.emit import node_at, parse, rebuild_span
from kernel_lsp.core.transforms.launch_edit import launch_bounds_for
from kernel_lsp.core.transforms.more_parallelism import UNDERFILLED_WARPS_PER_SM, warps
from kernel_lsp.core.transforms.tile_contraction import (
    PolyEmitter, Refused, TileContraction, _chain, _find, _Plan, _Writer,
)
from kernel_lsp.core.transforms.warp_per_row import WarpPerRow

#: Most parts one original thread's loop is split into.
MAX_PARTS = 32
#: Shared memory the partial results may take.
PARTS_BUDGET_BYTES = 16 * 1024
_COMBINE = {"+": "{a} = {a} + {b};", "max": "{a} = max({a}, {b});", "min": "{a} = min({a}, {b});"}


class _SplitWriter(_Writer):
    """The guards split into predicates around the loop, which is emitted split across ``threadIdx.y``."""

    def __init__(self, plan: _Plan, facts, src: bytes, emitter: PolyEmitter, accumulators, parts: int, width: int,
                 user=None):
        super().__init__(plan, facts, src, emitter, user)
        self.accumulators = accumulators
        self.parts = parts
        self.width = width

    def after_loop(self, pred: str | None) -> str:
        return f"{pred} && threadIdx.y == 0" if pred else "threadIdx.y == 0"

    def loop(self, pred: str | None) -> str:
        node = self.plan.chain[-1]
        loop = self.plan.loop
        counted = self.plan.counted
        # The loop as written, its start moved by the part and its step multiplied by the parts; a counter
        # set before the loop is moved just before it.
        subs = [(counted.step.start_byte, counted.step.end_byte, f"{loop.var} += {self.parts}")]
        moved = ""
        if counted.start is not None:
            subs.append((counted.start.start_byte, counted.start.end_byte, f"({self.t(counted.start)}) + (int)threadIdx.y"))
        else:
            moved = f"{loop.var} = ({loop.var}) + (int)threadIdx.y; "
        split = self.copy(node.start_byte, node.end_byte, subs)
        before, combine = [], []
        shared = []
        for k, acc in enumerate(self.accumulators):
            name = acc.target
            if acc.op == "+":
                before.append(f"kl_init{k} = {name}; {name} = 0;")
            part = f"kl_part{k}[kl_s][threadIdx.x]"
            shared.append(f"__shared__ decltype({name} + 0) kl_part{k}[{self.parts}][{self.width}];")
            combine.append(_COMBINE[acc.op].format(a=name, b=part))
        inits = " ".join(f"decltype({a.target} + 0) kl_init{k} = 0;" for k, a in enumerate(self.accumulators)
                         if a.op == "+")
        body = f"{moved}{self.loop_pragma}{split}"
        lines = ["{", *shared]
        if inits:
            lines.append(inits)
        guarded = f"{' '.join(before)} {body}"
        lines.append(f"if ({pred}) {{ {guarded} }}" if pred else f"{{ {guarded} }}")
        for k, acc in enumerate(self.accumulators):
            lines.append(f"if ({pred}) kl_part{k}[threadIdx.y][threadIdx.x] = {acc.target};" if pred else
                         f"kl_part{k}[threadIdx.y][threadIdx.x] = {acc.target};")
        # Every part's stores and partial values are seen by part 0 after the barrier.
        lines.append("__syncthreads();")
        finish = [f"for (int kl_s = 1; kl_s < {self.parts}; ++kl_s) {{ {' '.join(combine)} }}"] if combine else []
        finish += [f"{a.target} = kl_init{k} + {a.target};" for k, a in enumerate(self.accumulators) if a.op == "+"]
        if finish:
            lines.append(f"if ({self.after_loop(pred)}) {{ {' '.join(finish)} }}")
        lines.append("}")
        self.past_loop = True
        return "\n".join(lines)


class SplitReduction(Rule):
    name = "split-reduction"
    technique = "split-loop-across-threads"
    summary = "an under-filled 1-D launch: each thread's loop split across threads along a new block axis, combined in shared memory"

    def plan(self, ctx: RuleContext):
        facts = ctx.facts
        if facts is None or not facts.complete:
            return None, "the kernel's analysis is missing or incomplete"
        if ctx.spec is None:
            return None, "needs a launch spec (the launch changes: a block S times taller)"
        block = ctx.constant_block()
        if block is None or block[1:] != (1, 1):
            return None, "the block is not one-dimensional with one size at every size of the spec"
        if set(facts.thread_dims) - {"tid.x", "bid.x", "bdim.x", "gdim.x"}:
            return None, "the kernel is not one-dimensional (it reads the y or z thread or block index)"
        if facts.implicit_indices:
            return None, f"the kernel reads its thread index through a cooperative group (`{facts.implicit_indices[0]}`)"
        found = warps(ctx)
        if found is None or found >= UNDERFILLED_WARPS_PER_SM * DEFAULT_SM_COUNT:
            return None, f"the launch has {found} warps, enough for {DEFAULT_SM_COUNT} SMs"
        if threads_cooperate(facts):
            return None, "barriers, shared memory, warp intrinsics or atomics: the new axis would change how the block cooperates"
        try:
            binding = Binding.from_spec(ctx.spec)
        except (SpecError, ValueError, ZeroDivisionError):
            return None, "the spec's launch does not evaluate"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return None, "the kernel's definition was not found in the preprocessed view"
        parts = 2
        while parts < MAX_PARTS and found * parts < UNDERFILLED_WARPS_PER_SM * DEFAULT_SM_COUNT \
                and block[0] * parts * 2 <= MAX_THREADS_PER_BLOCK:
            parts *= 2
        if block[0] * parts > MAX_THREADS_PER_BLOCK:
            return None, f"a block of {block[0]} threads cannot grow {parts} times"
        reasons = []
        for loop in facts.loops:
            if loop.parent is not None:
                continue
            line = (loop.user_line or 0) + 1
            why, split = WarpPerRow()._loop_plan(facts, loop, root, src)
            if split is None:
                reasons.append(f"the loop at line {line}: {why}")
                continue
            accumulators = split.accumulators
            trips = trip_count(facts, loop, binding)
            if trips is not None and trips < 2 * parts:
                reasons.append(f"the loop at line {line} runs {trips} iterations, fewer than two for each of {parts} parts")
                continue
            node = node_at(src, root, loop.span)
            try:
                chain = _chain(body, node)
                for ret in _find(body, ("return_statement",)):
                    if ret.start_byte < node.end_byte and not TileContraction._leading_exit(ret, chain, src):
                        raise Refused("a `return` before it would leave threads out of the barrier")
                if _find(body, ("goto_statement",)):
                    raise Refused("the kernel has a `goto`, which could jump past the barrier")
            except Refused as exc:
                reasons.append(f"the loop at line {line}: {exc}")
                continue
            written = {a.array for a in facts.accesses if loop.id in a.loops and a.writes}
            # Every part runs what comes before the loop: a plain store there is made S times with one value,
            # which is harmless unless the loop stores to that array too; a read-modify-write would not be.
            early = [a for a in facts.accesses if loop.id not in a.loops and a.span[0] < loop.span[0]
                     and (a.space == "global" and a.kind in ("update", "atomic") or a.array in written)]
            if early:
                reasons.append(f"the loop at line {line}: `{early[0].text}` before it would race with the other parts' "
                               "iterations")
                continue
            if sum(parts * block[0] * 8 for _ in accumulators) > PARTS_BUDGET_BYTES:
                reasons.append(f"the loop at line {line}: its partial results do not fit the shared memory budget")
                continue
            plan = _Plan(loop, (), block, 0, chain, split.counted)
            try:
                _SplitWriter(plan, facts, src, PolyEmitter(facts, src, kernel), accumulators, parts, block[0]).text()
            except Refused as exc:
                reasons.append(f"the loop at line {line}: {exc}")
                continue
            return (plan, accumulators, parts, kernel), ""
        return None, "; ".join(reasons) or "the kernel has no loop"

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        found, why = self.plan(ctx)
        if found is None:
            return False, why
        plan, accumulators, parts, _ = found
        accs = ", ".join(f"`{a.target}` ({a.op})" for a in accumulators) or "no accumulator"
        return True, (f"{warps(ctx)} warps only; the loop at line {(plan.loop.user_line or 0) + 1} has independent "
                      f"iterations and {accs}: {parts} parts per thread along threadIdx.y")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        found, _ = self.plan(ctx)
        plan, accumulators, parts, kernel = found
        facts = ctx.facts
        src = ctx.preprocessed.text.encode("utf-8")
        emitter = PolyEmitter(facts, src, kernel)
        top = plan.chain[0]
        width = plan.block[0]
        new_block = (width, parts, 1)

        def build(text) -> str:
            user = _TextAdapter(text)
            return _SplitWriter(plan, facts, src, emitter, accumulators, parts, width, user).text()

        source, expanded = rebuild_span(ctx.preprocessed, facts, ctx.source, ctx.kernel, (top.start_byte, top.end_byte),
                                        build)
        source = launch_bounds_for(source, ctx.kernel, width * parts)
        launch = ctx.spec.launch
        override = {"grid": list(launch.grid), "block": list(new_block), "dynamic_smem": launch.dynamic_smem}
        if source is None or not ctx.launch_ok(override):
            return ()
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"more parallelism: each thread's loop at line {(plan.loop.user_line or 0) + 1} split across "
                                f"{parts} threads along threadIdx.y (blocks of {width} x {parts}), partial results "
                                f"combined in shared memory after one barrier, the code after the loop run once{note}",
                        override, variant=f"parts={parts}", block=new_block, grid_divide=(1, 1, 1)),)


class _TextAdapter:
    """The writer's source of statement text (``span(lo, hi, subs)``) over :func:`rebuild_span`'s pieces."""

    def __init__(self, text):
        self.text = text

    def span(self, lo: int, hi: int, subs=()):
        return self.text(lo, hi, list(subs))

