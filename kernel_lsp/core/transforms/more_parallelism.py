"""More parallelism for under-filled grids.

A launch with fewer warps than the GPU can keep busy (PolyBench's one thread per row of a
4096-row matrix is 128 warps on 132 SMs: one warp per SM) leaves each SM waiting on one long
chain of loads. Two rewrites give it more threads for the same work:

- :class:`SplitLoop`: each original thread's loop split across a group of consecutive lanes
  (2 to 8, or a whole warp when no access of the loop is coalesced across threads, as in a loop
  that one thread runs alone), accumulators combined with shuffles inside the group. It is the
  warp-per-row rewrite with a lane count chosen so that accesses coalesced across threads stay
  sector-coalesced (a group of ``k`` lanes keeps ``32/k`` neighbouring threads per warp) and
  its legality is that rewrite's, stated there: iterations independent (no carried value but
  accumulators, every write at an index that moves with the iteration), no barrier, shared memory,
  warp intrinsic or atomic, and no read that could see another lane's store.
- :class:`SectorPerRow`: the same split for a short row walked a row apart across the warp
  (attention's 64-element head rows): a warp per row would leave each lane one or two iterations
  and pay five shuffle stages for them, so the row goes to as many lanes as one 32-byte sector
  holds elements (8 floats). Its legality is warp-per-row's; it is offered only where a loop
  that walks a row runs fewer than :data:`SHORT_ROW_TRIPS` iterations at the spec's main size.
- :class:`SmallerBlocks`: the same threads in blocks of 32 or 64, so that they spread over more
  SMs; only where the kernel's threads differ by their global 1-D index alone and the new launch
  runs exactly the original's work (the block-size rule's conditions).
- :class:`FullerBlocks`: a 2-D launch of tiny blocks (Rodinia's 4 x 4: half of each warp idle, and
  an SM holds at most 32 blocks, so a quarter of its threads) in blocks grown along y, the same
  threads per axis. Only where the threads differ by their global x and y indices alone (no
  other use of the thread, block or grid indices, no shared memory, barrier or warp intrinsic)
  and the new block divides the original's threads on each axis at every size of the spec. The
  x extent is kept, so the elements a warp touches in one row stay contiguous as before.
"""

from __future__ import annotations

from kernel_lsp.core.analysis import Binding, bind, index_bound, threads_differ_only_by, trip_count, value_range
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError, with_candidate_launch
from kernel_lsp.core.transforms.elementwise import DEFAULT_SM_COUNT, THREADS_PER_SM, same_work, two_dimensional_launch
from kernel_lsp.core.transforms.emit import WARP_REDUCE
from kernel_lsp.core.transforms.launch_edit import launch_bounds_for
from kernel_lsp.core.transforms.warp_per_row import WarpPerRow, walks_row

#: Warps per SM below which a launch counts as under-filled (latency is hidden by 4+ warps per
#: scheduler's worth of independent loads; one or two per SM leave it exposed).
UNDERFILLED_WARPS_PER_SM = 4
#: Bytes of one memory sector: a group of lanes keeps ``32 / lanes`` neighbouring threads of a
#: warp together, which must still fill whole sectors.
SECTOR_BYTES = 32
#: Most lanes per original thread when a loop access is coalesced across threads (a group of 8
#: keeps 4 neighbouring threads per warp: one sector of doubles).
MAX_GROUP = 8
#: Iterations below which a row is short: a warp per row would give each lane fewer than 4.
SHORT_ROW_TRIPS = 128
#: Most resident blocks per SM on sm_80/sm_90: blocks smaller than THREADS_PER_SM / this leave threads idle.
MAX_BLOCKS_PER_SM = 32
#: Threads per block a fuller 2-D block aims at (several warps; 32 of them fill an SM).
FULL_BLOCK_THREADS = 128
#: Block sizes for an under-filled 1-D launch, the first that keeps the original's threads is taken
#: (the smallest block spreads them over the most SMs).
SMALL_BLOCKS = (32, 64)

_GROUP_BODIES = {
    "+": "v += __shfl_xor_sync(kl_mask, v, o);",
    "max": "v = max(v, __shfl_xor_sync(kl_mask, v, o));",
    "min": "v = min(v, __shfl_xor_sync(kl_mask, v, o));",
}


def warps(ctx: RuleContext) -> int | None:
    """Warps the original launch runs at the spec's main size."""
    launches = ctx.launches()
    if not launches:
        return None
    launch = launches[0]
    threads_per_block = launch.block[0] * launch.block[1] * launch.block[2]
    return launch.grid[0] * launch.grid[1] * launch.grid[2] * -(-threads_per_block // 32)


def underfilled(ctx: RuleContext) -> bool:
    found = warps(ctx)
    return found is not None and found < UNDERFILLED_WARPS_PER_SM * DEFAULT_SM_COUNT


def group_reduce_name(op: str, lanes: int) -> str:
    return f"{WARP_REDUCE[op]}{lanes}"


def coalesced_cap(ctx: RuleContext) -> int:
    """Most lanes a group may give one original thread: 32 when no loop access is coalesced across
    threads (a single thread's loop, a column walk: nothing to keep); else as many as keep 32 bytes of
    neighbouring threads together in a warp (``32 / lanes`` of them)."""
    facts = ctx.facts
    if facts is None or ctx.spec is None:
        return 1
    try:
        patterns = bind(facts, Binding.from_spec(ctx.spec))
    except (SpecError, ValueError, ZeroDivisionError):
        return 1
    elem = [p.access.elem_bytes or 1 for p in patterns
            if p.access.space == "global" and p.access.loops and p.pattern == "coalesced"]
    return min(MAX_GROUP, 32 * min(elem) // SECTOR_BYTES) if elem else 32


def group_lanes(ctx: RuleContext) -> int:
    """The fewest lanes per original thread that bring an under-filled launch to enough warps, at most
    :func:`coalesced_cap`."""
    target = UNDERFILLED_WARPS_PER_SM * DEFAULT_SM_COUNT
    lanes, cap, found = 2, coalesced_cap(ctx), warps(ctx) or 1
    while lanes < cap and found * lanes < target:
        lanes *= 2
    return lanes


def group_reduce_helpers(ops: set[str], lanes: int, source: str) -> str:
    """Butterfly reductions over an aligned group of ``lanes`` lanes (every lane of the group gets
    the result); the shuffle's mask names the group only, so groups of one warp may diverge."""
    out = []
    for op in sorted(ops):
        name = group_reduce_name(op, lanes)
        if name in source:
            continue
        out.append(f"template <typename T>\n__device__ __forceinline__ T {name}(T v) {{\n"
                   f"    const unsigned kl_mask = {(1 << lanes) - 1}u << (threadIdx.x & {31 & ~(lanes - 1)}u);\n"
                   f"    for (int o = {lanes // 2}; o > 0; o >>= 1) {_GROUP_BODIES[op]}\n    return v;\n}}\n")
    return "".join(out)


class SplitLoop(WarpPerRow):
    name = "split-loop"
    technique = "split-loop-across-threads"
    summary = "an under-filled grid: each thread's loop split across a group of lanes, accumulators combined with shuffles"
    nothing_to_split = "no loop of the kernel runs more than one group's worth of iterations in an under-filled launch"
    loop_claim = "run more iterations than a group has lanes"

    def lanes(self, ctx: RuleContext) -> int:
        return group_lanes(ctx)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if ctx.spec is not None and not underfilled(ctx):
            return False, f"the launch has {warps(ctx)} warps, enough for {DEFAULT_SM_COUNT} SMs"
        if coalesced_cap(ctx) < 2:
            return False, "a loop reads elements smaller than a sector's share of two lanes: splitting would uncoalesce it"
        ok, why = super().check(ctx)
        if not ok:
            return ok, why
        return True, f"{warps(ctx)} warps only; {why}"

    def _motivates(self, ctx: RuleContext, loop, patterns) -> bool:
        """A top-level loop with more iterations than a group has lanes at the main size."""
        try:
            trips = trip_count(ctx.facts, loop, Binding.from_spec(ctx.spec))
        except (SpecError, ValueError, ZeroDivisionError):
            return False
        return trips is None or trips > self.lanes(ctx)

    def _unprofitable(self, ctx: RuleContext, patterns, plans) -> str | None:
        return None

    def _reduction(self, op: str, lanes: int) -> str:
        return super()._reduction(op, lanes) if lanes == 32 else group_reduce_name(op, lanes)

    def _helpers(self, ops: set[str], lanes: int, source: str) -> str:
        return super()._helpers(ops, lanes, source) if lanes == 32 else group_reduce_helpers(ops, lanes, source)

    def _description(self, lanes: int) -> str:
        return (f"more parallelism: each thread's loop split across {lanes} consecutive lanes, accumulators combined "
                f"with shuffles in the group; launched with {lanes} times the blocks")


class SectorPerRow(SplitLoop):
    name = "sector-per-row"
    technique = "warp-per-row"
    summary = "a short row walked per thread split across the lanes one sector feeds, accumulators combined with shuffles"
    nothing_to_split = (f"no loop walks a row shorter than {SHORT_ROW_TRIPS} iterations, or of data-dependent length, "
                        "per thread")
    loop_claim = "walk a short row per thread"

    def lanes(self, ctx: RuleContext) -> int:
        """Elements of the narrowest row-walking access that fill one sector (8 floats, 4 doubles)."""
        facts = ctx.facts
        try:
            patterns = bind(facts, Binding.from_spec(ctx.spec)) if facts is not None and ctx.spec is not None else []
        except (SpecError, ValueError, ZeroDivisionError):
            patterns = []
        elem = [p.access.elem_bytes or 4 for p in patterns
                if p.access.loops and walks_row(facts, facts.loops[p.access.loops[-1]], [p])]
        lanes = SECTOR_BYTES // max(elem) if elem else 8
        return max(2, min(16, lanes))

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        ok, why = WarpPerRow.check(self, ctx)
        return (ok, f"{why}; rows under {SHORT_ROW_TRIPS} iterations or of data-dependent length" if ok else why)

    def _motivates(self, ctx: RuleContext, loop, patterns) -> bool:
        if not walks_row(ctx.facts, loop, patterns):
            return False
        try:
            binding = Binding.from_spec(ctx.spec)
            trips = trip_count(ctx.facts, loop, binding)
            if trips is None and loop.step is not None and loop.step.constant == 1 and loop.start is not None \
                    and loop.bound is not None and (start := loop.start.evaluate({})) is not None:
                # A bound computed from the parameters (llm.c's head size C / NH): its value range is exact.
                bound = value_range(loop.bound, ctx.facts, binding)
                trips = bound[1] - start if bound is not None and bound[0] == bound[1] else None
        except (SpecError, ValueError, ZeroDivisionError):
            return False
        if trips is None:
            # Rows at data-dependent starts, of data-dependent length (CSR): how long they are is in the
            # data, not the code, so a sector's worth of lanes per row is offered beside a warp per row
            # and the harness measures which suits the user's rows.
            return any(p.pattern == "gather" and p.access.loops and p.access.loops[-1] == loop.id for p in patterns)
        return self.lanes(ctx) < trips < SHORT_ROW_TRIPS

    def _unprofitable(self, ctx: RuleContext, patterns, plans) -> str | None:
        return WarpPerRow._unprofitable(self, ctx, patterns, plans)

    def _description(self, lanes: int) -> str:
        return (f"a short row per {lanes} lanes: each thread's row loop split across {lanes} consecutive lanes (one "
                f"sector of the row per step), accumulators combined with shuffles; launched with {lanes} times the blocks")


class SmallerBlocks(Rule):
    name = "smaller-blocks"
    technique = "block-size-tuning"
    summary = "an under-filled 1-D launch in blocks of 32 (or 64) threads, spread over more SMs"

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if ctx.spec is None:
            return False, "needs a launch spec (the launch changes)"
        block = ctx.constant_block()
        if block is None or block[1:] != (1, 1) or any(launch.grid[1:] != (1, 1) for launch in ctx.launches()):
            return False, "the launch is not 1-D with a constant block"
        launch = ctx.launches()[0]
        if launch.grid[0] >= DEFAULT_SM_COUNT:
            return False, f"the launch has {launch.grid[0]} blocks, at least one per SM already"
        if block[0] <= min(SMALL_BLOCKS):
            return False, f"the block of {block[0]} threads is as small as this rule makes it"
        why = _independent(ctx, ("x",))
        if why:
            return False, why
        if not self.rewrite(ctx):
            return False, "no smaller block divides the original's threads at every size of the spec"
        return True, f"{launch.grid[0]} blocks for {DEFAULT_SM_COUNT} SMs; the threads differ by their global index only"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        assert ctx.spec is not None
        bx = ctx.constant_block()[0]  # type: ignore[index]
        gx = ctx.spec.launch.grid[0]
        out = []
        for size in SMALL_BLOCKS:
            if size >= bx or bx % size or out:
                continue
            override = {"grid": [f"({gx}) * {bx // size}", "1", "1"], "block": [size, 1, 1],
                        "dynamic_smem": ctx.spec.launch.dynamic_smem}
            source = launch_bounds_for(ctx.source, ctx.kernel, size)
            if source is not None and ctx.launch_ok(override) and same_work(ctx, override, index_bound(ctx.facts, "x")):
                out.append(Rewrite(source, f"block {bx} -> {size} with {bx // size} times the blocks: the same "
                                           "threads over more SMs", override, f"block={size}", block=(size, 1, 1)))
        return tuple(out)


def _independent(ctx: RuleContext, axes: tuple[str, ...]) -> str | None:
    """Why the kernel's threads may differ by more than their global indices along ``axes`` (the
    launch's width along them included), or None: regrouping them into other blocks keeps each one's work."""
    facts = ctx.facts
    if facts is None or not facts.complete:
        return "the kernel's analysis is missing or incomplete"
    return threads_differ_only_by(facts, axes)


def same_threads_per_axis(ctx: RuleContext, override: dict) -> bool:
    """The launch ``override`` has the original's number of threads along every axis, at every size."""
    assert ctx.spec is not None
    candidate = with_candidate_launch(ctx.spec, override)
    for variant in [None, *range(len(ctx.spec.variants))]:
        resolved = candidate.resolve(variant)
        before, after = resolved.original, resolved.candidate
        if any(before.grid[a] * before.block[a] != after.grid[a] * after.block[a] for a in range(3)):
            return False
    return True


class FullerBlocks(Rule):
    name = "fuller-blocks"
    technique = "block-size-tuning"
    summary = "a 2-D launch of tiny blocks in blocks grown along y: full warps, more threads per SM"

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if ctx.spec is None:
            return False, "needs a launch spec (the launch changes)"
        block = ctx.constant_block()
        if block is None or not two_dimensional_launch(ctx):
            return False, "the launch is not 2-D (x and y) with a constant block"
        threads = block[0] * block[1]
        if threads * MAX_BLOCKS_PER_SM >= THREADS_PER_SM:
            return False, f"blocks of {threads} threads can fill an SM already"
        why = _independent(ctx, ("x", "y"))
        if why:
            return False, why
        if not self.rewrite(ctx):
            return False, "no taller block divides the original's threads along y at every size of the spec"
        return True, (f"blocks of {threads} threads fill at most {threads * MAX_BLOCKS_PER_SM} of an SM's {THREADS_PER_SM} "
                      "threads; the threads differ by their global x and y indices only")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        assert ctx.spec is not None
        bx, by, _ = ctx.constant_block()  # type: ignore[misc]
        gx, gy, gz = ctx.spec.launch.grid
        k = FULL_BLOCK_THREADS // (bx * by)
        while k > 1:
            size = by * k
            override = {"grid": [str(gx), f"(({gy})*{by})/{size}", str(gz)], "block": [bx, size, 1],
                        "dynamic_smem": ctx.spec.launch.dynamic_smem}
            source = launch_bounds_for(ctx.source, ctx.kernel, bx * size)
            if source is not None and size <= 1024 and bx * size <= 1024 and ctx.launch_ok(override) \
                    and same_threads_per_axis(ctx, override):
                return (Rewrite(source, f"block {bx}x{by} -> {bx}x{size}: the same threads in full warps, "
                                        f"{k} times fewer blocks", override, f"block={bx}x{size}", block=(bx, size, 1)),)
            k //= 2
        return ()
