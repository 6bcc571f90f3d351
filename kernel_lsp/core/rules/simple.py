"""Local rewrite rules: qualifiers, launch bounds, unrolling, read-only loads, launch shape, grid-stride loops."""

from __future__ import annotations

import re

from kernel_lsp.core.consteval import evaluate_int
from kernel_lsp.core.rules import text as T
from kernel_lsp.core.analysis import explicit_instantiations
from kernel_lsp.core.rules.base import MAX_GRID_YZ, MAX_THREADS_PER_BLOCK, Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError, with_candidate_launch

#: Streaming multiprocessors assumed when a rule caps a grid (an H200 has 132). Only the
#: launch's speed depends on it, never its correctness (grid-stride loops cover any grid).
DEFAULT_SM_COUNT = 132
#: Resident threads per SM on sm_80/sm_90.
THREADS_PER_SM = 2048
#: Longest fixed-trip loop that gets ``#pragma unroll`` (longer ones bloat the code for little gain).
MAX_UNROLL_TRIPS = 64
#: Element types ``__ldg`` has overloads for (CUDA's sm_32_intrinsics.h).
LDG_TYPES = frozenset({
    "char", "signed char", "unsigned char", "short", "unsigned short", "int", "unsigned int", "unsigned",
    "long", "unsigned long", "long long", "unsigned long long", "float", "double",
    "float2", "float4", "int2", "int4", "uint2", "uint4", "double2",
})
_WARP_LEVEL = re.compile(r"__shfl|__ballot|__activemask|__syncwarp|__any_sync|__all_sync|__match|warpSize|cooperative_groups|\bcg::")
_INDEX_TOKEN = re.compile(r"\b(threadIdx|blockIdx|blockDim|gridDim)\.[xyz]\b")
_BLOCK_SIZES = (128, 256, 512, 1024)


def _launch_ok(ctx: RuleContext, override: dict) -> bool:
    """The override parses and evaluates at every size of the spec (so the harness can use it)."""
    try:
        with_candidate_launch(ctx.spec, override)  # type: ignore[arg-type]
    except (SpecError, ValueError, ZeroDivisionError):
        return False
    return True


class RestrictConst(Rule):
    name = "restrict-const"
    technique = "restrict-const"
    summary = "const on never-written pointer parameters; __restrict__ when the spec proves they are distinct arrays"

    def _plan(self, ctx: RuleContext) -> tuple[set[str], set[str]]:
        pointers = [p for p in ctx.kernel.params if p.pointer_depth == 1]
        add_const = {p.name for p in pointers if not p.is_const and p.name in ctx.read_only}
        add_restrict = {p.name for p in pointers if not p.is_restrict} if ctx.distinct_arrays() and len(pointers) > 1 else set()
        return add_const, add_restrict

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if not any(p.pointer_depth == 1 for p in ctx.kernel.params):
            return False, "no pointer parameters"
        if ctx.kernel.name in explicit_instantiations(ctx.preprocessed.text):
            return False, "the file instantiates the template explicitly with these parameter types"
        add_const, add_restrict = self._plan(ctx)
        if not add_const and not add_restrict:
            if ctx.spec is None:
                return False, "no pointer is provably read-only, and __restrict__ needs a launch spec proving distinct arrays"
            return False, "pointers are already const where provably read-only and __restrict__ where distinct"
        return True, f"const: {sorted(add_const) or 'none'}; __restrict__: {sorted(add_restrict) or 'none'}"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        add_const, add_restrict = self._plan(ctx)
        b = ctx.source_bytes
        out = b
        for p in sorted(ctx.kernel.params, key=lambda p: -p.span.start_byte):
            if p.name not in add_const | add_restrict:
                continue
            const = p.is_const or p.name in add_const
            restrict = p.is_restrict or p.name in add_restrict
            new = f"{'const ' if const else ''}{p.base_type}* {'__restrict__ ' if restrict else ''}{p.name}"
            out = out[: p.span.start_byte] + new.encode() + out[p.span.end_byte :]
        parts = []
        if add_const:
            parts.append("const on " + ", ".join(sorted(add_const)))
        if add_restrict:
            parts.append("__restrict__ on " + ", ".join(sorted(add_restrict)))
        return (Rewrite(out.decode("utf-8"), "; ".join(parts)),)


class LaunchBounds(Rule):
    name = "launch-bounds"
    technique = "launch-bounds"
    summary = "__launch_bounds__(threads per block) when the block size is known"

    def _block_threads(self, ctx: RuleContext) -> tuple[int | None, str]:
        block = ctx.constant_block()
        if block is not None:
            return block[0] * block[1] * block[2], "from the launch spec"
        sizes = set()
        constants = dict(ctx.index.constants)
        for launch in ctx.index.launches_of(ctx.kernel.name):
            sizes.add(evaluate_int(launch.block, constants))
        if len(sizes) == 1 and None not in sizes:
            return sizes.pop(), "from every launch in this file"
        return None, "the block size is not the same known constant at every launch (give a launch spec)"

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if ctx.kernel.launch_bounds:
            return False, "the kernel already has __launch_bounds__"
        threads, why = self._block_threads(ctx)
        if threads is None:
            return False, why
        if not 0 < threads <= MAX_THREADS_PER_BLOCK:
            return False, f"block of {threads} threads is not launchable"
        return True, f"block of {threads} threads {why}"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        threads, _ = self._block_threads(ctx)
        at = ctx.kernel.name_span.start_byte
        source = T.splice(ctx.source_bytes, at, at, f"__launch_bounds__({threads}) ")
        return (Rewrite(source, f"__launch_bounds__({threads}): the compiler may use up to 64K/{threads} registers per thread"),)


class PragmaUnroll(Rule):
    name = "pragma-unroll"
    technique = "loop-unrolling"
    summary = "#pragma unroll on loops with a fixed trip count"

    def _loops(self, ctx: RuleContext):
        b = ctx.source_bytes
        out = []
        for loop in ctx.kernel.loops:
            if loop.has_pragma_unroll or loop.trip_count is None or not 1 < loop.trip_count <= MAX_UNROLL_TRIPS:
                continue
            start = T.line_start(b, loop.span.start_byte)
            if b[start : loop.span.start_byte].strip():
                continue  # something precedes the loop on its line (``else for``): no place for a pragma line
            out.append(loop)
        return out

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        loops = self._loops(ctx)
        if not loops:
            return False, f"no loop with a known trip count of 2..{MAX_UNROLL_TRIPS} lacks #pragma unroll"
        return True, "loops at lines " + ", ".join(str(lp.span.start.line + 1) for lp in loops)

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        out = ctx.source_bytes
        loops = self._loops(ctx)
        for loop in sorted(loops, key=lambda lp: -lp.span.start_byte):
            start = T.line_start(out, loop.span.start_byte)
            indent = out[start : loop.span.start_byte].decode()
            out = out[:start] + f"{indent}#pragma unroll\n".encode() + out[start:]
        trips = ", ".join(f"line {lp.span.start.line + 1} ({lp.trip_count} trips)" for lp in loops)
        return (Rewrite(out.decode("utf-8"), f"#pragma unroll on {trips}"),)


class ReadOnlyLoads(Rule):
    name = "ldg"
    technique = "read-only-cache"
    summary = "__ldg for element reads of never-written inputs"

    def _targets(self, ctx: RuleContext) -> set[str]:
        params = {p.name: p for p in ctx.kernel.params}
        return {n for n in ctx.read_only if params[n].base_type in LDG_TYPES and T.subscripts(ctx.body_masked, n)}

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        targets = self._targets(ctx)
        if not targets:
            return False, "no provably read-only pointer parameter of an __ldg type is read by subscript"
        written = {p.name for p in ctx.kernel.params if p.pointer_depth > 0} - ctx.read_only
        if written and not ctx.distinct_arrays():
            return False, "the kernel writes through other pointers and no launch spec proves they are different arrays"
        return True, "read-only inputs: " + ", ".join(sorted(targets))

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        targets = self._targets(ctx)
        body = T.rewrite_subscripts(ctx.body_masked, ctx.body_text, targets, lambda n, i: f"__ldg(&{n}[{i}])")
        return (Rewrite(ctx.replace_body(body), "__ldg on reads of " + ", ".join(sorted(targets))),)


def _one_dimensional(ctx: RuleContext) -> tuple[bool, str]:
    """The kernel's threads differ only by their global 1-D index (and the total thread count)."""
    if ctx.uses_any("threadIdx.y", "threadIdx.z", "blockIdx.y", "blockIdx.z", "blockDim.y", "blockDim.z"):
        return False, "the kernel uses y/z thread or block indices"
    rest = re.sub(T.global_index_pattern("x"), " ", ctx.body_masked)
    if rest == ctx.body_masked:
        return False, "no blockIdx.x * blockDim.x + threadIdx.x global index"
    rest = re.sub(r"\(?\s*(?:\(\w+\)\s*)?(?:blockDim\.x\s*\*\s*gridDim\.x|gridDim\.x\s*\*\s*blockDim\.x)\s*\)?", " ", rest)
    leftover = _INDEX_TOKEN.search(rest)
    if leftover:
        return False, f"'{leftover.group(0)}' is used outside the global index (threads of a block cooperate)"
    if ctx.kernel.shared or ctx.kernel.syncs or _WARP_LEVEL.search(ctx.body_masked):
        return False, "the kernel uses shared memory, barriers or warp-level operations"
    if not re.search(r"\bif\s*\([^;{]*(<|>)", ctx.body_masked) and not re.search(r"\bfor\s*\([^;]*;[^;]*(<|>)", ctx.body_masked):
        return False, "no bounds check on the index"
    return True, "1-D indexing with a bounds check, no shared memory or barriers"


class BlockSizeSweep(Rule):
    name = "block-size"
    technique = "block-size-tuning"
    summary = "other block sizes, grid recomputed to cover the same threads (1-D kernels only)"

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if ctx.spec is None:
            return False, "needs a launch spec (the launch being tuned)"
        if ctx.kernel.launch_bounds:
            return False, "__launch_bounds__ fixes the block size"
        block = ctx.constant_block()
        if block is None or block[1:] != (1, 1):
            return False, "the spec's block is not a constant 1-D shape"
        if any(launch.grid[1:] != (1, 1) for launch in ctx.launches()):
            return False, "the spec's grid is not 1-D"
        return _one_dimensional(ctx)

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        assert ctx.spec is not None
        bx = ctx.constant_block()[0]  # type: ignore[index]
        gx = ctx.spec.launch.grid[0]
        out = []
        for size in _BLOCK_SIZES:
            if size == bx:
                continue
            override = {"grid": [f"(({gx})*{bx}+{size - 1})/{size}", "1", "1"], "block": [size, 1, 1], "dynamic_smem": ctx.spec.launch.dynamic_smem}
            if _launch_ok(ctx, override) and same_work(ctx, override):
                out.append(Rewrite(ctx.source, f"block {bx} -> {size}, grid recomputed to cover the same threads", override, f"block={size}"))
        return tuple(out)


def guard_bound(ctx: RuleContext, variant: int | None) -> int | None:
    """The value at the spec's size ``variant`` of ``N`` in the body's ``if (i < N)`` (or ``if (i >= N)
    return;``) on the global index: the threads at or past it do nothing. None when there is no such
    guard or its bound does not evaluate."""
    found = _guarded_body(ctx)
    if found is None or ctx.spec is None:
        return None
    constants = {k: str(v) for k, v in ctx.spec.values(variant).items() if isinstance(v, int)}
    constants.update({k: v for k, v in ctx.preprocessed.object_macros().items() if k not in constants})
    return evaluate_int(found[2], constants)


def same_work(ctx: RuleContext, override: dict) -> bool:
    """A 1-D launch ``override`` runs the original's threads' work and nothing more, at every size of the
    spec: the same number of threads, or more threads where the original's already reach the body's
    guard (the extra ones, past the bound, do nothing). A grid rounded up past the original's threads
    is illegal otherwise: a kernel whose guard reaches further than its launch (``i < n`` with fewer than
    ``n`` threads) would compute elements the original leaves alone, and one without a guard would read
    past its arrays."""
    assert ctx.spec is not None
    candidate = with_candidate_launch(ctx.spec, override)
    for variant in [None, *range(len(ctx.spec.variants))]:
        resolved = candidate.resolve(variant)
        before = resolved.original.grid[0] * resolved.original.block[0]
        after = resolved.candidate.grid[0] * resolved.candidate.block[0]
        if after == before:
            continue
        bound = guard_bound(ctx, variant)
        if after < before or bound is None or bound > before:
            return False
    return True


def _guarded_body(ctx: RuleContext):
    """(index decl match, statements, position of the decl, guard bound, body masked, body text) for
    ``T i = <global>; if (i < N) { BODY }`` or ``T i = <global>; if (i >= N) return; BODY``."""
    masked, text = ctx.body_masked, ctx.body_text
    statements = T.split_statements(masked)
    for k, (s, e) in enumerate(statements):
        decl = T.index_declaration(masked[s:e])
        if decl is None or decl.start() != 0:
            continue
        name = decl.group("name")
        rest = statements[k + 1 :]
        if not rest:
            return None
        s1, e1 = rest[0]
        stmt = masked[s1:e1]
        guard = re.match(rf"if\s*\(\s*{name}\s*<\s*(?P<bound>[^()]+?|\([^()]*\))\s*\)\s*", stmt)
        if guard and len(rest) == 1 and "else" not in stmt:
            inner_m, inner_t = T.statement_body(stmt[guard.end() :], text[s1 + guard.end() : e1])
            return decl, (s, e), guard.group("bound").strip(), inner_m, inner_t
        early = re.fullmatch(rf"if\s*\(\s*{name}\s*>=\s*(?P<bound>[^()]+?|\([^()]*\))\s*\)\s*(\{{\s*return\s*;\s*\}}|return\s*;)", stmt.strip())
        if early and len(rest) > 1:
            s2, e2 = rest[1][0], rest[-1][1]
            return decl, (s, e), early.group("bound").strip(), masked[s2:e2], text[s2:e2]
        return None
    return None


class GridStride(Rule):
    name = "grid-stride"
    technique = "grid-stride-loop"
    summary = "one element per thread -> grid-stride loop with a grid sized to the GPU"

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if ctx.spec is None:
            return False, "needs a launch spec (the grid is resized)"
        block = ctx.constant_block()
        if block is None or block[1:] != (1, 1):
            return False, "the spec's block is not a constant 1-D shape"
        ok, why = _one_dimensional(ctx)
        if not ok:
            return ok, why
        found = _guarded_body(ctx)
        if found is None:
            return False, "the body is not 'T i = global index; if (i < N) { ... }' (or an early return)"
        decl, (s0, _), _, inner, _ = found
        name = decl.group("name")
        if ctx.body_masked[:s0].strip():
            return False, "statements precede the index declaration (they would run once per thread, not per element)"
        if re.search(r"\b(return|break|continue|goto)\b", inner):
            return False, "the guarded body returns, breaks or jumps"
        if re.search(rf"(?<![\w.]){name}\s*(=(?!=)|\+=|-=|\+\+|--)|(\+\+|--)\s*{name}\b", inner):
            return False, f"the guarded body changes '{name}'"
        if _INDEX_TOKEN.search(inner):
            return False, "the guarded body reads thread indices directly"
        return True, f"'{name}' guards the whole body"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        assert ctx.spec is not None
        decl, (s, _), bound, _, inner_text = _guarded_body(ctx)  # type: ignore[misc]
        text = ctx.body_text
        name, type_ = decl.group("name"), re.sub(r"^const\s+", "", decl.group("type"))
        glob = decl.group(0)[decl.group(0).index("=") + 1 :].rstrip(" ;")
        indent = T.indent_of(ctx.source_bytes, ctx.body[0] + len(text[:s].encode()))
        loop = (f"for ({type_} {name} = {glob.strip()}; {name} < {bound}; {name} += ({type_})blockDim.x * gridDim.x) {{"
                f"{inner_text.rstrip()}\n{indent}}}\n")
        new_body = text[:s] + loop
        bx = ctx.constant_block()[0]  # type: ignore[index]
        cap = DEFAULT_SM_COUNT * (THREADS_PER_SM // bx)
        override = {"grid": [f"min({ctx.spec.launch.grid[0]}, {cap})", "1", "1"], "block": [bx, 1, 1], "dynamic_smem": ctx.spec.launch.dynamic_smem}
        if not _launch_ok(ctx, override):
            return ()
        return (Rewrite(ctx.replace_body(new_body), f"grid-stride loop over {name}; grid capped at {cap} blocks (one full wave)", override),)


class IndexSwap(Rule):
    name = "index-swap"
    technique = "coalesce-index-mapping"
    summary = "swap the x/y roles when threadIdx.x walks the slow (row) dimension of the output"

    def _decls(self, ctx: RuleContext):
        return T.index_declaration(ctx.body_masked, "x"), T.index_declaration(ctx.body_masked, "y")

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if ctx.spec is None:
            return False, "needs a launch spec (grid and block are swapped)"
        if ctx.uses_any("threadIdx.z", "blockIdx.z", "blockDim.z", "gridDim.z"):
            return False, "the kernel uses z indices"
        if _WARP_LEVEL.search(ctx.body_masked):
            return False, "warp-level operations depend on which threads share a warp"
        dx, dy = self._decls(ctx)
        if dx is None or dy is None:
            return False, "no x and y global index declarations"
        x, y = dx.group("name"), dy.group("name")
        written = [
            sub for p in ctx.kernel.params if p.pointer_depth == 1
            for sub in T.subscripts(ctx.body_masked, p.name) if sub.written
        ]
        row_major_on_x = [s for s in written if re.fullmatch(rf"\(?{x}\)?\*[\w()]+\+\(?{y}\)?", T.squash(s.index))]
        if not written or len(row_major_on_x) != len(written):
            return False, f"the output is not indexed as {x} * stride + {y} (threadIdx.x already walks the fast dimension)"
        for launch in ctx.launches():
            if launch.grid[0] > MAX_GRID_YZ or launch.block[2] != 1 or launch.grid[2] != 1:
                return False, f"grid.x {launch.grid[0]} would exceed the grid.y limit after the swap"
        return True, f"'{x}' (from threadIdx.x) is the output's row: stores are {x}-strided"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        assert ctx.spec is not None
        swap = {"x": "y", "y": "x"}
        body = re.sub(r"\b(threadIdx|blockIdx|blockDim|gridDim)\.([xy])\b", lambda m: f"{m.group(1)}.{swap[m.group(2)]}", ctx.body_text)
        launch = ctx.spec.launch
        override = {"grid": [launch.grid[1], launch.grid[0], launch.grid[2]], "block": [launch.block[1], launch.block[0], launch.block[2]], "dynamic_smem": launch.dynamic_smem}
        if not _launch_ok(ctx, override):
            return ()
        return (Rewrite(ctx.replace_body(body), "x and y swapped: consecutive threads now write consecutive elements", override),)
