"""The roles of x and y swapped when threadIdx.x walks the slow dimension of the output.

A 2-D kernel that stores ``out[x * stride + y]`` with ``x`` from ``threadIdx.x`` writes a whole row
apart across a warp's lanes, one sector per element, while neighbouring elements belong to
neighbouring threads along ``threadIdx.y``. Renaming ``threadIdx.x`` ↔ ``threadIdx.y`` (and the
block, block-index and grid builtins alike) in the kernel and launching the transposed grid and
block runs every original thread exactly once — thread ``(a, b)`` of block ``(c, d)`` now does what
thread ``(b, a)`` of block ``(d, c)`` did — with consecutive lanes on consecutive elements.

Legality, in terms of the analysis (each refusal names the missing fact):
- the spec's launch and the kernel are two-dimensional (no z index, block or grid);
- no warp-level operation and no index read through a cooperative group or inside a helper (the
  renaming reaches the kernel's own builtins only; which threads share a warp changes);
- every global store has unit stride along ``threadIdx.y`` and another, non-zero one along
  ``threadIdx.x``;
- the original grid's x extent fits gridDim.y (65535) at every size of the spec.
"""

from __future__ import annotations

from kernel_lsp.core.poly import Poly
from kernel_lsp.core.rules.base import MAX_GRID_YZ, Rewrite, Rule, RuleContext
from kernel_lsp.core.transforms.emit import BodyEdit, builtin_fields, emit, node_at, parse

_SWAPPED = {(b, a): f"{b}.{'y' if a == 'x' else 'x'}" for b in ("threadIdx", "blockIdx", "blockDim", "gridDim")
            for a in ("x", "y")}


class IndexSwap(Rule):
    name = "index-swap"
    technique = "coalesce-index-mapping"
    summary = "swap the x/y roles when threadIdx.x walks the slow (row) dimension of the output"

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return False, "the kernel's analysis is missing or incomplete"
        if ctx.spec is None:
            return False, "needs a launch spec (grid and block are swapped)"
        if {"tid.z", "bid.z", "bdim.z", "gdim.z"} & set(facts.thread_dims):
            return False, "the kernel uses z indices"
        if facts.shuffles:
            return False, "warp-level operations depend on which threads share a warp"
        if facts.implicit_indices:
            return False, f"the kernel reads its thread index through a cooperative group (`{facts.implicit_indices[0]}`)"
        helper = next((u for u in facts.index_uses if u.via), None)
        if helper is not None:
            return False, f"the helper `{helper.via[-1]}` reads the thread or block index (the renaming would not reach it)"
        stores = [a for a in facts.accesses if a.writes and a.space == "global"]
        if not stores:
            return False, "the kernel stores nothing to global memory"
        for a in stores:
            along_x, along_y = a.index.coefficient("tid.x"), a.index.coefficient("tid.y")
            if along_y != Poly.const(1) or along_x is None or along_x.constant in (0, 1, -1):
                return False, (f"the store `{a.text}` does not have unit stride along threadIdx.y and another along "
                               "threadIdx.x (threadIdx.x already walks the fast dimension)")
        for launch in ctx.launches():
            if launch.grid[0] > MAX_GRID_YZ or launch.block[2] != 1 or launch.grid[2] != 1:
                return False, f"grid.x {launch.grid[0]} would exceed the grid.y limit after the swap, or the launch is 3-D"
        return True, "every global store is a row apart along threadIdx.x and unit stride along threadIdx.y"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        assert ctx.spec is not None and ctx.facts is not None
        src, root = parse(ctx.preprocessed)
        lo, hi = ctx.facts.body_span
        edit = BodyEdit(ctx.preprocessed, ctx.facts)
        start = node_at(src, root, ctx.facts.span) or root
        for node, new in builtin_fields(src, start, lo, hi, _SWAPPED):
            edit.replace(node.start_byte, node.end_byte, new)
        launch = ctx.spec.launch
        override = {"grid": [launch.grid[1], launch.grid[0], launch.grid[2]],
                    "block": [launch.block[1], launch.block[0], launch.block[2]], "dynamic_smem": launch.dynamic_smem}
        if not ctx.launch_ok(override):
            return ()
        source, expanded = emit(edit, ctx.source, ctx.kernel)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"x and y swapped: consecutive threads now write consecutive elements{note}", override),)
