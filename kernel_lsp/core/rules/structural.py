"""Structural templates: whole-kernel rewrites for patterns the index proves.

Each rule recognizes one shape of naive kernel exactly (statement by statement,
on the body with comments masked and whitespace removed) and emits the
well-known fast version with the kernel's own name, parameter list and
expressions. Anything outside the recognized shape makes the rule refuse.

Helper functions a template needs are emitted ``static __device__`` with the
kernel's name in theirs (``kl_warp_sum_<kernel>``), so two rewrites in one file
do not collide.
"""

from __future__ import annotations

import re

from kernel_lsp.core.consteval import evaluate_int
from kernel_lsp.core.rules import text as T
from kernel_lsp.core.rules.base import MAX_GRID_YZ, Rewrite, Rule, RuleContext
from kernel_lsp.core.rules.simple import DEFAULT_SM_COUNT, THREADS_PER_SM, _guarded_body, _launch_ok

_Q = re.escape
_ZERO = r"(?:0|0\.0?f?|0\.f|0u)"
_ACC_TYPES = frozenset({"float", "double", "int", "unsigned int", "unsigned", "long long", "unsigned long long"})
_WARP_RE = re.compile(r"__shfl|__ballot|__syncwarp|__activemask")
_INDEX_RE = re.compile(r"\b(threadIdx|blockIdx|blockDim|gridDim)\b")
_FUNCS = frozenset({
    "expf", "exp", "logf", "log", "sqrtf", "sqrt", "rsqrtf", "fabsf", "fabs", "fmaxf", "fminf", "fmax", "fmin",
    "max", "min", "sinf", "cosf", "tanhf", "tanh", "powf", "pow", "__expf", "__logf", "fmaf", "abs",
})


def _warp_sum(kernel: str, type_: str) -> str:
    suffix = re.sub(r"\W+", "_", type_)
    return (
        f"static __device__ __forceinline__ {type_} kl_warp_sum_{suffix}_{kernel}({type_} v)\n"
        "{\n"
        "    for (int offset = 16; offset > 0; offset >>= 1) {\n"
        "        v += __shfl_down_sync(0xffffffffu, v, offset);\n"
        "    }\n"
        "    return v;\n"
        "}\n\n"
    ), f"kl_warp_sum_{suffix}_{kernel}"


def _block_ok(ctx: RuleContext, *, need_warp_multiple: bool = True) -> tuple[bool, str]:
    block = ctx.constant_block()
    if ctx.spec is None:
        return False, "needs a launch spec (the block shape decides the rewrite's correctness)"
    if block is None or block[1:] != (1, 1):
        return False, "the spec's block is not a constant 1-D shape"
    if need_warp_multiple and block[0] % 32:
        return False, f"block {block[0]} is not a multiple of 32 (full-warp shuffles)"
    return True, f"block {block[0]}"


def _tile_rows_problem(ctx: RuleContext, rows: str) -> str | None:
    """Why one block per 32 rows of ``rows`` would exceed gridDim.y at some size of the spec; None when it fits."""
    assert ctx.spec is not None
    for v in [None, *range(len(ctx.spec.variants))]:
        value = ctx.spec.values(v)[rows]
        if (int(value) + 31) // 32 > MAX_GRID_YZ:
            return f"{rows}={value} needs more than {MAX_GRID_YZ} tile rows"
    return None


def _block_total(v: str, wsum: str, then: str) -> str:
    """CUDA lines that finish a block sum of each warp's ``v`` (already summed by ``wsum``).

    Lane 0 of every warp leaves its total in ``kl_warp_totals`` (declared by the caller), then warp 0
    sums those with ``wsum`` and runs ``then`` with the block's total in ``v``.
    """
    return f"""    if ((threadIdx.x & 31) == 0) {{
        kl_warp_totals[threadIdx.x >> 5] = {v};
    }}
    __syncthreads();
    if (threadIdx.x < 32) {{
        {v} = threadIdx.x < ((blockDim.x + 31) >> 5) ? kl_warp_totals[threadIdx.x] : 0;
        {v} = {wsum}({v});
        {then}
    }}
"""


def _pointer(ctx: RuleContext, name: str):
    return next((p for p in ctx.kernel.params if p.name == name and p.pointer_depth == 1), None)


# --------------------------------------------------------------------------- elementwise float4


class VectorizeElementwise(Rule):
    """``out[i] = f(a[i], b[i], scalars)`` over ``i < n``, however threads enumerate ``i``, as a float4 grid-stride loop."""

    name = "vectorize-float4"
    technique = "vectorized-loads"
    summary = "elementwise float kernels as a float4 grid-stride loop plus a scalar tail"

    def _match(self, ctx: RuleContext):
        m = T.squash(ctx.body_masked)
        writes = [
            (p.name, sub) for p in ctx.kernel.params if p.pointer_depth == 1
            for sub in T.subscripts(ctx.body_masked, p.name) if sub.written
        ]
        if len(writes) != 1:
            return None, "not exactly one array store"
        out, sub = writes[0]
        i = T.squash(sub.index)
        if not re.fullmatch(T.IDENT, i):
            return None, "the store's index is not a plain variable"
        stmt_m = re.search(rf"(?<![\w.]){_Q(out)}\s*\[\s*{_Q(i)}\s*\]\s*=(?!=)(?P<expr>[^;]*);", ctx.body_masked)
        if stmt_m is None:
            return None, "the store is not 'out[i] = expression;'"
        statement = T.squash(stmt_m.group(0))
        expr_m = stmt_m.group("expr")
        reads = {n for n in ctx.param_names if _pointer(ctx, n) and T.subscripts(expr_m, n)}
        for n in reads:
            if any(T.squash(s.index) != i for s in T.subscripts(expr_m, n)):
                return None, f"'{n}' is read at an index other than '{i}'"
        stripped = expr_m
        for n in reads:
            stripped = re.sub(rf"(?<![\w.]){_Q(n)}\s*\[[^\]]*\]", " ", stripped)
        for ident in re.findall(r"(?<![\w.])[A-Za-z_]\w*", re.sub(r"\d+\.?\d*(?:[eE][-+]?\d+)?[fF]?", " ", stripped)):
            if ident not in ctx.scalar_params and ident not in _FUNCS:
                return None, f"'{ident}' in the expression is neither a scalar parameter nor a math function"
        for n in reads | {out}:
            p = _pointer(ctx, n)
            if p is None or p.base_type != "float":
                return None, f"'{n}' is not a float array"
        placeholder = m.replace(statement, "S;", 1)
        g = T.global_index_pattern("x")
        decl_t = r"(?:const)?(?:longlong|unsigned(?:int)?|int|size_t|long|int64_t)"
        forms = {
            "guard": rf"{decl_t}{_Q(i)}=(?:{g});if\({_Q(i)}<(?P<n>\w+)\)(?:\{{S;\}}|S;)",
            "early": rf"{decl_t}{_Q(i)}=(?:{g});if\({_Q(i)}>=(?P<n>\w+)\)(?:\{{return;\}}|return;)S;",
            "chunk": rf"{decl_t}(?P<st>\w+)=\(?(?:{g})\)?\*(?P<c>\w+);for\(int(?P<k>\w+)=0;(?P=k)<(?P=c);(?:\+\+(?P=k)|(?P=k)\+\+|(?P=k)\+=1)\)\{{{decl_t}{_Q(i)}=(?P=st)\+(?P=k);if\({_Q(i)}<(?P<n>\w+)\)(?:\{{S;\}}|S;)\}}",
            "stride": rf"for\({decl_t}{_Q(i)}=(?:{g});{_Q(i)}<(?P<n>\w+);{_Q(i)}\+=\(?(?:\(\w+\))?(?:blockDim\.x\*gridDim\.x|gridDim\.x\*blockDim\.x)\)?\)(?:\{{S;\}}|S;)",
        }
        for form, pattern in forms.items():
            f = re.fullmatch(pattern, placeholder)
            if f:
                return (form, f, out, i, reads, stmt_m), ""
        return None, "the body is not one of: guarded index, early return, chunk per thread, grid-stride loop"

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        ok, why = _block_ok(ctx, need_warp_multiple=False)
        if not ok:
            return ok, why
        found, why = self._match(ctx)
        if found is None:
            return False, why
        form, f, out, i, reads, _ = found
        n = f.group("n")
        if not ctx.spec_scalar(n):
            return False, f"the bound '{n}' is not an integer scalar of the spec"
        if not ctx.distinct_arrays():
            return False, "the spec does not prove the arrays are separate allocations (16-byte alignment, no overlap)"
        if form in ("guard", "early", "chunk"):
            per_thread = 1
            if form == "chunk":
                constants = dict(ctx.index.constants)
                per_thread = evaluate_int(f.group("c"), constants)
                if per_thread is None:
                    return False, f"chunk size '{f.group('c')}' is not a constant"
            for v in [None, *range(len(ctx.spec.variants))]:  # type: ignore[union-attr]
                resolved = ctx.spec.resolve(v)  # type: ignore[union-attr]
                launch = resolved.original
                threads = launch.grid[0] * launch.block[0] * per_thread
                if threads < resolved.values[n]:
                    return False, f"the original launch covers {threads} elements, fewer than {n}={resolved.values[n]}"
        return True, f"elementwise store to {out}[{i}] over {i} < {n} ({form} form), float arrays, separate allocations"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        found, _ = self._match(ctx)
        _, f, out, i, reads, stmt_m = found  # type: ignore[misc]
        n = f.group("n")
        expr_text = ctx.body_text[stmt_m.start("expr") : stmt_m.end("expr")].strip()
        expr_mask = T.mask(expr_text)
        lines = ["    long long kl_n4 = (long long)" + n + " / 4;"]
        for r in sorted(reads):
            const = "" if r == out else "const "
            lines.append(f"    {const}float4* kl_{r}4 = reinterpret_cast<{const}float4*>({r});")
        if out not in reads:
            lines.append(f"    float4* kl_{out}4 = reinterpret_cast<float4*>({out});")
        lines.append("    long long kl_stride = (long long)blockDim.x * gridDim.x;")
        lines.append("    for (long long kl_v = (long long)blockIdx.x * blockDim.x + threadIdx.x; kl_v < kl_n4; kl_v += kl_stride) {")
        for r in sorted(reads):
            lines.append(f"        float4 kl_{r} = kl_{r}4[kl_v];")
        lines.append("        float4 kl_r;")
        for c in "xyzw":
            lane = T.rewrite_subscripts(expr_mask, expr_text, reads, lambda name, _idx, c=c: f"kl_{name}.{c}")
            lines.append(f"        kl_r.{c} = {lane};")
        lines.append(f"        kl_{out}4[kl_v] = kl_r;")
        lines.append("    }")
        lines.append("    // Tail: the last n % 4 elements, one per thread.")
        lines.append(f"    for (long long {i} = kl_n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; {i} < {n}; {i} += kl_stride) {{")
        lines.append(f"        {out}[{i}] = {expr_text};")
        lines.append("    }")
        bx = ctx.constant_block()[0]  # type: ignore[index]
        cap = DEFAULT_SM_COUNT * (THREADS_PER_SM // bx) * 4
        override = {"grid": [f"max(1, min(({n}+{4 * bx - 1})/{4 * bx}, {cap}))", "1", "1"], "block": [bx, 1, 1], "dynamic_smem": ctx.spec.launch.dynamic_smem}  # type: ignore[union-attr]
        if not _launch_ok(ctx, override):
            return ()
        body = "\n" + "\n".join(lines) + "\n"
        return (Rewrite(ctx.replace_body(body), f"float4 loads/stores of {', '.join(sorted(reads | {out}))} in a grid-stride loop, scalar tail", override),)


# --------------------------------------------------------------------------- tiled transpose


class TiledTranspose(Rule):
    name = "tiled-transpose"
    technique = "transpose-via-shared-memory"
    summary = "out[c*R+r] = in[r*C+c] through 32x33 shared-memory tiles"

    def _match(self, ctx: RuleContext):
        dx, dy = T.index_declaration(ctx.body_masked, "x"), T.index_declaration(ctx.body_masked, "y")
        if dx is None or dy is None:
            return None, "no x and y global index declarations"
        c, r = dx.group("name"), dy.group("name")
        m = T.squash(ctx.body_masked)
        decls = {T.squash(dx.group(0)), T.squash(dy.group(0))}
        rest = m
        for d in decls:
            rest = rest.replace(d, "", 1)
        ident = r"([A-Za-z_]\w*)"
        guard = re.fullmatch(
            rf"if\((?:{r}<{ident}&&{c}<{ident}|{c}<{ident}&&{r}<{ident})\)\{{?{ident}\[(.+?)\]={ident}\[(.+?)\];\}}?", rest)
        if guard is None:
            return None, "the body is not 'if (r < R && c < C) out[...] = in[...];' after the index declarations"
        g = guard.groups()
        rows, cols = (g[0], g[1]) if g[0] is not None else (g[3], g[2])
        out, out_idx, inp, in_idx = g[4], g[5], g[6], g[7]
        if out_idx not in (f"{c}*{rows}+{r}", f"{r}+{c}*{rows}") or in_idx not in (f"{r}*{cols}+{c}", f"{c}+{r}*{cols}"):
            return None, f"the indices are not out[{c}*{rows}+{r}] and in[{r}*{cols}+{c}]"
        for name in (out, inp):
            if _pointer(ctx, name) is None:
                return None, f"'{name}' is not a pointer parameter"
        for name in (rows, cols):
            if name not in ctx.scalar_params:
                return None, f"'{name}' is not a scalar parameter"
        return (out, inp, rows, cols), ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if ctx.spec is None:
            return False, "needs a launch spec (the launch changes to one block per 32x32 tile)"
        found, why = self._match(ctx)
        if found is None:
            return False, why
        out, inp, rows, cols = found
        if not (ctx.spec_scalar(rows) and ctx.spec_scalar(cols)):
            return False, "rows and columns are not integer scalars of the spec"
        problem = _tile_rows_problem(ctx, rows)
        if problem:
            return False, problem
        if _pointer(ctx, out).base_type != _pointer(ctx, inp).base_type:  # type: ignore[union-attr]
            return False, "input and output element types differ"
        return True, f"out[c*{rows}+r] = in[r*{cols}+c] with 2-D indexing"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        (out, inp, rows, cols), _ = self._match(ctx)  # type: ignore[misc]
        t = _pointer(ctx, inp).base_type  # type: ignore[union-attr]
        body = f"""
    // 32x32 tiles through shared memory, rows padded to 33 elements (no bank conflicts); block (32, 8).
    __shared__ {t} kl_tile[32][33];
    int kl_c = blockIdx.x * 32 + threadIdx.x;
    int kl_r0 = blockIdx.y * 32 + threadIdx.y;
    for (int kl_j = 0; kl_j < 32; kl_j += 8) {{
        int kl_r = kl_r0 + kl_j;
        if (kl_r < {rows} && kl_c < {cols}) {{
            kl_tile[threadIdx.y + kl_j][threadIdx.x] = {inp}[kl_r * {cols} + kl_c];
        }}
    }}
    __syncthreads();
    int kl_oc = blockIdx.y * 32 + threadIdx.x;
    int kl_or0 = blockIdx.x * 32 + threadIdx.y;
    for (int kl_j = 0; kl_j < 32; kl_j += 8) {{
        int kl_orow = kl_or0 + kl_j;
        if (kl_orow < {cols} && kl_oc < {rows}) {{
            {out}[kl_orow * {rows} + kl_oc] = kl_tile[threadIdx.x][threadIdx.y + kl_j];
        }}
    }}
"""
        override = {"grid": [f"({cols}+31)/32", f"({rows}+31)/32", "1"], "block": [32, 8, 1], "dynamic_smem": 0}
        if not _launch_ok(ctx, override):
            return ()
        return (Rewrite(ctx.replace_body(body), "32x33 shared-memory tiles: coalesced reads and writes", override),)


# --------------------------------------------------------------------------- reductions


class TreeReductionToShuffle(Rule):
    """A per-block shared-memory tree sum (one tile per iteration) as register accumulation plus warp shuffles."""

    name = "shuffle-reduction"
    technique = "warp-shuffle-reduction"
    summary = "shared-memory tree sum -> per-thread accumulation and warp-shuffle block reduction"

    def _match(self, ctx: RuleContext):
        masked, text = ctx.body_masked, ctx.body_text
        statements = T.split_statements(masked)
        loop_at = None
        for k, (s, e) in enumerate(statements):
            head = re.match(r"for\s*\(\s*(?P<t>[\w\s]+?)\s+(?P<base>\w+)\s*=\s*(?P<begin>[^;]+);\s*(?P=base)\s*<\s*(?P<end>[^;]+);\s*(?P=base)\s*\+=\s*blockDim\.x\s*\)", masked[s:e])
            if head:
                loop_at = (k, head)
                break
        if loop_at is None:
            return None, "no 'for (base = begin; base < end; base += blockDim.x)' tile loop"
        k, head = loop_at
        if len(statements) != k + 2:
            return None, "the tile loop is not followed by exactly one statement (the result store)"
        base, begin, end = head.group("base"), head.group("begin").strip(), head.group("end").strip()
        s, e = statements[k]
        loop_body = T.squash(masked[s + head.end() : e])
        shared = {d.name for d in ctx.kernel.shared}
        tid_decl = re.search(r"(?:unsignedint|unsigned|int)(\w+)=threadIdx\.x;", T.squash(masked[: statements[k][0]]))
        tid = tid_decl.group(1) if tid_decl else "threadIdx.x"
        tq = _Q(tid)
        pat = (
            rf"\{{(?:longlong|int|unsigned|unsignedint|size_t)(?P<i>\w+)={_Q(base)}\+{tq};"
            rf"(?P<buf>\w+)\[{tq}\]=(?P=i)<{_Q(T.squash(end))}\?(?P<inp>\w+)\[(?P=i)\]:{_ZERO};"
            rf"__syncthreads\(\);"
            rf"(?:for\([\w]+(?P<s>\w)=1;(?P=s)<blockDim\.x;(?P=s)(?:\*=2|<<=1)\)\{{if\({tq}%\(2\*(?P=s)\)==0\)"
            rf"|for\([\w]+(?P<s2>\w)=blockDim\.x/2;(?P=s2)>0;(?P=s2)(?:>>=1|/=2)\)\{{if\({tq}<(?P=s2)\))"
            rf"\{{?(?P=buf)\[{tq}\]\+=(?P=buf)\[{tq}\+(?:(?P=s)|(?P=s2))\];\}}?__syncthreads\(\);\}}"
            rf"if\({tq}==0\)\{{?(?P<acc>\w+)\+=(?P=buf)\[0\];\}}?__syncthreads\(\);\}}"
        )
        loop_m = re.fullmatch(pat, loop_body.replace("unsignedint", "unsigned"))
        if loop_m is None:
            return None, "the tile loop is not load-tile / tree-sum / accumulate-tile-total"
        buf, inp, acc = loop_m.group("buf"), loop_m.group("inp"), loop_m.group("acc")
        if buf not in shared or _pointer(ctx, inp) is None:
            return None, f"'{buf}' is not shared memory or '{inp}' not a pointer parameter"
        fs, fe = statements[k + 1]
        final = T.squash(masked[fs:fe])
        final_m = re.fullmatch(rf"if\({tq}==0\)\{{?(?P<out>\w+)\[(?P<idx>[^\]]+)\]={_Q(acc)};\}}?", final)
        if final_m is None or _pointer(ctx, final_m.group("out")) is None:
            return None, "the last statement is not 'if (tid == 0) out[...] = total;'"
        prelude_m = masked[: statements[k][0]]
        acc_type = T.declared_type(prelude_m, acc)
        if acc_type not in _ACC_TYPES or not re.search(rf"\b{_Q(acc)}\s*=\s*{_ZERO}\s*;", prelude_m):
            return None, f"the accumulator '{acc}' is not a zero-initialized arithmetic local"
        if len(T.occurrences(masked, buf)) != len(T.occurrences(prelude_m, buf)) + 4:
            return None, f"'{buf}' is used outside the tree"
        return dict(k=k, head=head, begin=begin, end=end, inp=inp, acc=acc, acc_type=acc_type, buf=buf,
                    loop_type=head.group("t"), final=(fs, fe), statements=statements), ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        ok, why = _block_ok(ctx)
        if not ok:
            return ok, why
        found, why = self._match(ctx)
        if found is None:
            return False, why
        return True, f"tree sum of {found['inp']} into '{found['acc']}' per tile, one result store"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        f, _ = self._match(ctx)
        text, masked = ctx.body_text, ctx.body_masked
        statements = f["statements"]
        prelude_parts = []
        for s, e in statements[: f["k"]]:
            if re.search(rf"__shared__[^;]*\b{_Q(f['buf'])}\b", masked[s:e]):
                continue
            prelude_parts.append(text[s:e])
        acc_t, acc, lt, inp = f["acc_type"], f["acc"], f["loop_type"], f["inp"]
        helper, wsum = _warp_sum(ctx.kernel.name, acc_t)
        fs, fe = f["final"]
        final = text[fs:fe].replace("\n", "\n    ")
        body = "\n    " + "\n    ".join(prelude_parts) + f"""
    // Each thread sums a strided slice in registers (4 independent accumulators), then
    // warps combine with shuffles and one shared-memory exchange between warps.
    __shared__ {acc_t} kl_warp_totals[32];
    {{
        {acc_t} kl_a0 = 0, kl_a1 = 0, kl_a2 = 0, kl_a3 = 0;
        {lt} kl_step = blockDim.x;
        {lt} kl_i = {f['begin']} + threadIdx.x;
        for (; kl_i + 3 * kl_step < {f['end']}; kl_i += 4 * kl_step) {{
            kl_a0 += {inp}[kl_i];
            kl_a1 += {inp}[kl_i + kl_step];
            kl_a2 += {inp}[kl_i + 2 * kl_step];
            kl_a3 += {inp}[kl_i + 3 * kl_step];
        }}
        for (; kl_i < {f['end']}; kl_i += kl_step) {{
            kl_a0 += {inp}[kl_i];
        }}
        {acc} = {wsum}((kl_a0 + kl_a1) + (kl_a2 + kl_a3));
    }}
""" + _block_total(acc, wsum, final)
        return (Rewrite(ctx.with_helpers(body, helper), "register accumulation + warp-shuffle block sum (no tree, 1 barrier)"),)


class AtomicPerBlock(Rule):
    """``if (i < n) atomicAdd(&out[K], f(i));`` with a block-invariant address: one atomic per block."""

    name = "atomic-per-block"
    technique = "one-atomic-per-block"
    summary = "an atomicAdd per element into one address -> block sum by warp shuffles, one atomicAdd per block"

    def _match(self, ctx: RuleContext):
        found = _guarded_body(ctx)
        if found is None:
            return None, "the body is not 'T i = global index; if (i < n) atomicAdd(...)'"
        decl, (s0, _), bound, inner_m, inner_t = found
        if ctx.body_masked[:s0].strip():
            return None, "statements precede the index declaration"
        m = re.fullmatch(r"\s*\{?\s*atomicAdd\s*\(\s*&\s*(?P<out>\w+)\s*\[(?P<idx>[^\]]*)\]\s*,(?P<val>.*)\)\s*;\s*\}?\s*", inner_m, re.S)
        if m is None:
            return None, "the guarded statement is not one atomicAdd(&out[k], value)"
        idx = T.squash(m.group("idx"))
        if not (re.fullmatch(r"\d+", idx) or idx in ctx.scalar_params):
            return None, f"the atomic's address index '{idx}' is not block-invariant (a literal or a scalar parameter)"
        out = _pointer(ctx, m.group("out"))
        if out is None or out.base_type not in ("float", "double", "int", "unsigned int", "unsigned long long"):
            return None, "the atomic's target is not a float/int array parameter"
        value = inner_t[m.start("val") : m.end("val")].strip()
        return dict(decl=ctx.body_text[s0 + decl.start() : s0 + decl.end()], name=decl.group("name"), bound=bound, out=out.name, idx=m.group("idx").strip(), t=out.base_type, value=value), ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        ok, why = _block_ok(ctx)
        if not ok:
            return ok, why
        if ctx.kernel.shared or ctx.kernel.syncs:
            return False, "the kernel already uses shared memory or barriers"
        if len(ctx.kernel.atomics) != 1:
            return False, "not exactly one atomic"
        found, why = self._match(ctx)
        if found is None:
            return False, why
        return True, f"one atomicAdd per element into {found['out']}[{found['idx']}]"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        f, _ = self._match(ctx)
        helper, wsum = _warp_sum(ctx.kernel.name, f["t"])
        name, t = f["name"], f["t"]
        body = f"""
    {f['decl']}
    // Every thread (in range or not) joins the shuffles; the block adds once.
    {t} kl_v = 0;
    if ({name} < {f['bound']}) {{
        kl_v = {f['value']};
    }}
    kl_v = {wsum}(kl_v);
    __shared__ {t} kl_warp_totals[32];
""" + _block_total("kl_v", wsum, f"""if (threadIdx.x == 0) {{
            atomicAdd(&{f['out']}[{f['idx']}], kl_v);
        }}""")
        return (Rewrite(ctx.with_helpers(body, helper), "warp-shuffle block sum, one atomicAdd per block"),)


# --------------------------------------------------------------------------- histogram


class PrivatizedHistogram(Rule):
    name = "privatized-histogram"
    technique = "privatized-histogram"
    summary = "atomicAdd(&hist[v & (B-1)], 1) with a small known B -> shared-memory bins, flushed once per block"

    #: Largest bin count privatized (4 bytes each: 16 KB of shared memory).
    MAX_BINS = 4096

    def _match(self, ctx: RuleContext):
        masked = ctx.body_masked
        if not ctx.kernel.atomics or any(a.name != "atomicAdd" for a in ctx.kernel.atomics):
            return None, "no atomicAdd, or other atomics too"
        constants = dict(ctx.index.constants)
        sites = list(re.finditer(r"atomicAdd\s*\(\s*&\s*(?P<h>\w+)\s*\[(?P<idx>[^\[\]]*(?:\[[^\]]*\][^\[\]]*)*)\]\s*,\s*(?P<inc>[^;]*?)\)\s*;", masked))
        if len(sites) != len(ctx.kernel.atomics):
            return None, "an atomicAdd is not of the form atomicAdd(&h[bin], increment)"
        bases = {s.group("h") for s in sites}
        if len(bases) != 1:
            return None, "atomics target several arrays"
        h = bases.pop()
        bins = set()
        for s in sites:
            idx = T.squash(s.group("idx"))
            mask_m = re.fullmatch(r".+&\((?P<b>\w+)-1\)|.+&(?P<lit>0x[0-9a-fA-F]+|\d+)|.+%(?P<mod>\w+)", idx)
            if mask_m is None:
                return None, f"bin index '{idx}' is not 'value & (B - 1)', 'value & MASK' or 'value % B'"
            if mask_m.group("b"):
                b = evaluate_int(mask_m.group("b"), constants)
            elif mask_m.group("lit"):
                lit = int(mask_m.group("lit"), 0)
                b = lit + 1 if lit & (lit + 1) == 0 else None
            else:
                b = evaluate_int(mask_m.group("mod"), constants)
                if "%" in idx and not (b and b & (b - 1) == 0):
                    b = None  # a negative value % B is negative: only masks prove a bin range
            if b is None:
                return None, f"bin count of '{idx}' is not a known power of two"
            bins.add(b)
        if len(bins) != 1:
            return None, "the atomics use different bin counts"
        nbins = bins.pop()
        if not 1 < nbins <= self.MAX_BINS:
            return None, f"{nbins} bins is outside 2..{self.MAX_BINS}"
        target = _pointer(ctx, h)
        decl = None
        if target is None:
            decl = re.search(rf"(?P<t>(?:unsigned\s+int|unsigned|int))\s*\*\s*{_Q(h)}\s*=\s*(?P<base>\w+)\s*\+[^;]*;", masked)
            if decl is None or _pointer(ctx, decl.group("base")) is None:
                return None, f"'{h}' is neither a pointer parameter nor 'T* {h} = param + offset;'"
            before = masked[: decl.start()]
            if before.count("{") != before.count("}"):
                return None, f"'{h}' is not declared at the body's top level (the flush could not see it)"
            elem = re.sub(r"\s+", " ", decl.group("t"))
        else:
            elem = target.base_type
        if elem not in ("unsigned int", "unsigned", "int"):
            return None, "bins are not 32-bit integers"
        if re.search(r"\breturn\b", masked):
            return None, "the body returns early (every thread must reach the flush barrier)"
        first_atomic = sites[0].start()
        for sub in T.subscripts(masked, h):
            inside_atomic = any(m.start() < sub.start < m.end() for m in sites)
            if sub.start > first_atomic and not inside_atomic:
                return None, f"'{h}' is accessed after the atomics begin (privatized counts arrive only at the flush)"
        if len(T.occurrences(masked, h)) != len(T.subscripts(masked, h)) + (1 if decl is not None else 0):
            return None, f"'{h}' is used other than by subscript"
        return dict(h=h, nbins=nbins, sites=sites, elem="unsigned int" if elem.startswith("unsigned") else "int"), ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        found, why = self._match(ctx)
        if found is None:
            return False, why
        return True, f"{len(found['sites'])} atomicAdd site(s) into {found['h']} with {found['nbins']} bins"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        f, _ = self._match(ctx)
        h, nbins, elem = f["h"], f["nbins"], f["elem"]
        text, masked = ctx.body_text, ctx.body_masked
        out, pos = [], 0
        for s in f["sites"]:
            bracket = masked.index("[", s.start())
            out.append(text[pos : s.start()])
            # 'atomicAdd(&h[bin], inc);' -> 'atomicAdd(&kl_bins[bin], inc);' (bin and increment as written).
            out.append(f"atomicAdd(&kl_bins{text[bracket:s.end()]}")
            pos = s.end()
        out.append(text[pos:])
        rewritten = "".join(out)
        tid = "(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z))"
        nthreads = "(blockDim.x * blockDim.y * blockDim.z)"
        body = f"""
    // Privatized bins: shared-memory atomics resolve in the SM; one flush per block.
    __shared__ {elem} kl_bins[{nbins}];
    for (int kl_b = {tid}; kl_b < {nbins}; kl_b += {nthreads}) {{
        kl_bins[kl_b] = 0;
    }}
    __syncthreads();
{rewritten}
    __syncthreads();
    for (int kl_b = {tid}; kl_b < {nbins}; kl_b += {nthreads}) {{
        if (kl_bins[kl_b] != 0) {{
            atomicAdd(&{h}[kl_b], kl_bins[kl_b]);
        }}
    }}
"""
        return (Rewrite(ctx.replace_body(body), f"{nbins} bins privatized in shared memory, flushed with one atomicAdd per bin per block"),)


# --------------------------------------------------------------------------- row-wise kernels


_REDUCE_FORMS = (
    ("max", r"(?P<v>\w+)=fmaxf\((?P=v),(?P<e>.+)\)"),
    ("max", r"(?P<v>\w+)=fmaxf\((?P<e>.+),(?P=v)\)"),
    ("max", r"(?P<v>\w+)=max\((?P=v),(?P<e>.+)\)"),
    ("min", r"(?P<v>\w+)=fminf\((?P=v),(?P<e>.+)\)"),
    ("min", r"(?P<v>\w+)=min\((?P=v),(?P<e>.+)\)"),
    ("sum", r"(?P<v>\w+)\+=(?P<e>.+)"),
)


class RowParallel(Rule):
    """One thread per row looping over columns -> a block (or a warp) per row with combined partials."""

    name = "row-parallel"
    technique = "warp-per-row"
    summary = "one thread per row -> one block per row and one warp per row (two candidates)"

    def _match(self, ctx: RuleContext):
        masked, text = ctx.body_masked, ctx.body_text
        statements = T.split_statements(masked)
        if len(statements) < 3:
            return None, "too few statements"
        s0, e0 = statements[0]
        decl = T.index_declaration(masked[s0:e0])
        if decl is None or decl.start() != 0:
            return None, "the first statement is not 'int r = blockIdx.x * blockDim.x + threadIdx.x;'"
        r = decl.group("name")
        s1, e1 = statements[1]
        early = re.fullmatch(rf"if\({_Q(r)}>=(?P<rows>\w+)\)\{{?return;\}}?", T.squash(masked[s1:e1]))
        if early is None:
            return None, f"the second statement is not 'if ({r} >= rows) return;'"
        loops, others = [], []
        for s, e in statements[2:]:
            st = masked[s:e]
            head = re.match(r"for\s*\(\s*int\s+(?P<c>\w+)\s*=\s*0\s*;\s*(?P=c)\s*<\s*(?P<n>\w+)\s*;\s*(?:\+\+(?P=c)|(?P=c)\+\+|(?P=c)\s*\+=\s*1)\s*\)", st)
            if st.lstrip().startswith("for") or st.lstrip().startswith("while") or st.lstrip().startswith("do"):
                if head is None:
                    return None, "a loop is not 'for (int c = 0; c < n; ++c)'"
                inner_m, inner_t = T.statement_body(st[head.end() :], text[s + head.end() : e])
                one = T.split_statements(inner_m)
                if len(one) != 1:
                    return None, "a column loop holds more than one statement"
                stmt = T.squash(inner_m)
                kind = None
                for form, pat in _REDUCE_FORMS:
                    fm = re.fullmatch(pat + ";", stmt)
                    if fm:
                        kind = (form, fm.group("v"))
                        break
                if kind is None:
                    if re.fullmatch(r"(\w+)\[[^=]*\]=(?!=).+;", stmt) and re.search(rf"\[{_Q(head.group('c'))}\]", stmt.split("=", 1)[0]):
                        kind = ("store", None)
                    else:
                        return None, f"column loop statement '{stmt}' is neither a max/min/sum accumulation nor a store at [c]"
                if _INDEX_RE.search(inner_m):
                    return None, "a column loop uses thread indices"
                loops.append((s, e, head, kind))
            else:
                if re.search(r"\b(threadIdx|blockIdx|blockDim|gridDim|return|__syncthreads)\b", st):
                    return None, "a statement between loops uses thread indices or returns"
                others.append((s, e))
        if not loops:
            return None, "no column loops"
        for _, _, _, (form, v) in loops:
            if form != "store" and T.declared_type(masked, v) not in ("float", "double", "int"):
                return None, f"accumulator '{v}' is not a float, double or int local"
        return dict(r=r, rows=early.group("rows"), loops=loops, decl=decl, statements=statements), ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        ok, why = _block_ok(ctx)
        if not ok:
            return ok, why
        if ctx.kernel.shared or ctx.kernel.syncs or ctx.kernel.atomics or _WARP_RE.search(ctx.body_masked):
            return False, "the kernel already uses shared memory, barriers, atomics or warp operations"
        found, why = self._match(ctx)
        if found is None:
            return False, why
        if not ctx.spec_scalar(found["rows"]):
            return False, f"'{found['rows']}' is not an integer scalar of the spec"
        return True, f"one thread per row '{found['r']}' with {len(found['loops'])} column loops"

    def _emit(self, ctx: RuleContext, f: dict, per: str) -> str:
        text, masked = ctx.body_text, ctx.body_masked
        statements = f["statements"]
        r, k = f["r"], ctx.kernel.name
        pieces = []
        if per == "block":
            unit, first = "blockDim.x", "threadIdx.x"
            for t in sorted({T.declared_type(masked, v) for *_, (form, v) in f["loops"] if form != "store"}):
                pieces.append(f"__shared__ {t} kl_scratch_{t}[32];")
            pieces.append(f"int {r} = blockIdx.x;")
        else:
            unit, first = "32", "kl_lane"
            pieces.append("int kl_lane = threadIdx.x & 31;")
            pieces.append(f"int {r} = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);")
        s1, e1 = statements[1]
        pieces.append(text[s1:e1])
        loop_at = {s: (e, head, kind) for s, e, head, kind in f["loops"]}
        for s, e in statements[2:]:
            if s not in loop_at:
                pieces.append(text[s:e])
                continue
            _, head, (form, v) = loop_at[s]
            c, n = head.group("c"), head.group("n")
            pieces.append(f"for (int {c} = {first}; {c} < {n}; {c} += {unit}){text[s + head.end() : e]}")
            if form == "store":
                continue
            t = T.declared_type(masked, v)
            suffix = f"{form}_{t.replace(' ', '_')}_{k}"
            if per == "block":
                pieces.append(f"{v} = kl_block_{suffix}({v}, kl_scratch_{t});")
            else:
                pieces.append(f"{v} = kl_warp_{suffix}({v});")
        return "\n    " + "\n    ".join(pieces) + "\n"

    def _helpers(self, ctx: RuleContext, f: dict, per: str) -> str:
        # Plain (non-template) functions per type: templates cannot sit inside an extern "C" block.
        k = ctx.kernel.name
        pairs = sorted({(kind[0], T.declared_type(ctx.body_masked, kind[1])) for *_, kind in f["loops"] if kind[0] != "store"})
        ops = {"sum": "a + b", "max": "a > b ? a : b", "min": "a < b ? a : b"}
        out = []
        for form, t in pairs:
            suffix = f"{form}_{t.replace(' ', '_')}_{k}"
            out.append(
                f"static __device__ __forceinline__ {t} kl_warp_{suffix}({t} v)\n{{\n"
                f"    for (int o = 16; o > 0; o >>= 1) {{\n        {t} a = v, b = __shfl_xor_sync(0xffffffffu, v, o);\n        v = {ops[form]};\n    }}\n    return v;\n}}\n\n"
            )
            if per == "block":
                out.append(
                    f"// Every thread gets the block's result; the trailing barrier lets the scratch be reused.\n"
                    f"static __device__ {t} kl_block_{suffix}({t} v, {t}* scratch)\n{{\n"
                    f"    v = kl_warp_{suffix}(v);\n"
                    f"    if ((threadIdx.x & 31) == 0) {{\n        scratch[threadIdx.x >> 5] = v;\n    }}\n"
                    f"    __syncthreads();\n"
                    f"    int nwarps = (blockDim.x + 31) >> 5;\n"
                    f"    {t} w = scratch[0];\n"
                    f"    for (int i = 1; i < nwarps; ++i) {{\n        {t} a = w, b = scratch[i];\n        w = {ops[form]};\n    }}\n"
                    f"    __syncthreads();\n    return w;\n}}\n\n"
                )
        return "".join(out)

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        f, _ = self._match(ctx)
        assert ctx.spec is not None
        rows = f["rows"]
        out = []
        for per in ("block", "warp"):
            if per == "warp":
                override = {"grid": [f"({rows}+7)/8", "1", "1"], "block": [256, 1, 1], "dynamic_smem": 0}
                description = "one warp per row: lanes read consecutive columns, partials combined with shuffles"
            else:
                override = {"grid": [rows, "1", "1"], "block": [256, 1, 1], "dynamic_smem": 0}
                description = "one block per row: threads read consecutive columns, partials combined per block"
            if _launch_ok(ctx, override):
                source = ctx.with_helpers(self._emit(ctx, f, per), self._helpers(ctx, f, per))
                out.append(Rewrite(source, description, override, f"per={per}"))
        return tuple(out)


# --------------------------------------------------------------------------- CSR SpMV


class VectorCsr(Rule):
    name = "vector-csr"
    technique = "vector-csr"
    summary = "scalar CSR (a thread walks rowptr[r]..rowptr[r+1]) -> one warp per row with a shuffle sum"

    def _match(self, ctx: RuleContext):
        masked, text = ctx.body_masked, ctx.body_text
        found = _guarded_body(ctx)
        if found is None:
            return None, "the body is not 'int r = global index; if (r < rows) { ... }'"
        decl, (s0, _), bound, inner_m, inner_t = found
        if masked[:s0].strip():
            return None, "statements precede the row index declaration"
        r = decl.group("name")
        statements = T.split_statements(inner_m)
        if len(statements) != 3:
            return None, "the row body is not: accumulator, row loop, store"
        (a0, a1), (l0, l1), (w0, w1) = statements
        acc_m = re.fullmatch(rf"(?P<t>float|double)(?P<acc>\w+)={_ZERO};", T.squash(inner_m[a0:a1]))
        if acc_m is None:
            return None, "no zero-initialized float/double accumulator"
        acc = acc_m.group("acc")
        loop = inner_m[l0:l1]
        head = re.match(rf"for\s*\(\s*int\s+(?P<j>\w+)\s*=\s*(?P<rp>\w+)\s*\[\s*{_Q(r)}\s*\]\s*;\s*(?P=j)\s*<\s*(?P=rp)\s*\[\s*{_Q(r)}\s*\+\s*1\s*\]\s*;\s*(?:\+\+(?P=j)|(?P=j)\+\+)\s*\)", loop)
        if head is None:
            return None, f"the loop is not 'for (int j = rowptr[{r}]; j < rowptr[{r} + 1]; ++j)'"
        lb_m, lb_t = T.statement_body(loop[head.end() :], inner_t[l0 + head.end() : l1])
        add = re.fullmatch(rf"\s*{_Q(acc)}\s*\+=(?P<e>[^;]+);\s*", lb_m)
        if add is None:
            return None, f"the loop body is not '{acc} += expression;'"
        if re.search(rf"(?<![\w.]){_Q(r)}\b", add.group("e")) or _INDEX_RE.search(add.group("e")):
            return None, "the summand depends on the row or thread index directly"
        store = re.fullmatch(rf"(?P<y>\w+)\[{_Q(r)}\]={_Q(acc)};", T.squash(inner_m[w0:w1]))
        if store is None or _pointer(ctx, store.group("y")) is None:
            return None, f"the last statement is not 'y[{r}] = {acc};'"
        if _pointer(ctx, head.group("rp")) is None:
            return None, "rowptr is not a pointer parameter"
        return dict(r=r, bound=bound, t=acc_m.group("t"), acc=acc, j=head.group("j"), rp=head.group("rp"),
                    summand=lb_t[add.start("e") : add.end("e")].strip(), y=store.group("y")), ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        ok, why = _block_ok(ctx)
        if not ok:
            return ok, why
        if ctx.kernel.shared or ctx.kernel.syncs or ctx.kernel.atomics:
            return False, "the kernel uses shared memory, barriers or atomics"
        found, why = self._match(ctx)
        if found is None:
            return False, why
        if not ctx.spec_scalar(found["bound"]):
            return False, f"'{found['bound']}' is not an integer scalar of the spec"
        return True, f"scalar CSR: row {found['r']} walks {found['rp']}[{found['r']}]..{found['rp']}[{found['r']}+1]"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        f, _ = self._match(ctx)
        r, j, t, acc = f["r"], f["j"], f["t"], f["acc"]
        body = f"""
    // One warp per row: lanes read consecutive nonzeros (coalesced), then a shuffle sum.
    int kl_lane = threadIdx.x & 31;
    int {r} = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if ({r} >= {f['bound']}) {{
        return;
    }}
    int kl_begin = {f['rp']}[{r}];
    int kl_end = {f['rp']}[{r} + 1];
    {t} {acc} = 0;
    for (int {j} = kl_begin + kl_lane; {j} < kl_end; {j} += 32) {{
        {acc} += {f['summand']};
    }}
    for (int kl_o = 16; kl_o > 0; kl_o >>= 1) {{
        {acc} += __shfl_down_sync(0xffffffffu, {acc}, kl_o);
    }}
    if (kl_lane == 0) {{
        {f['y']}[{r}] = {acc};
    }}
"""
        override = {"grid": [f"({f['bound']}+7)/8", "1", "1"], "block": [256, 1, 1], "dynamic_smem": 0}
        if not _launch_ok(ctx, override):
            return ()
        return (Rewrite(ctx.replace_body(body), "vector CSR: one warp per row, coalesced nonzeros, shuffle sum", override),)


# --------------------------------------------------------------------------- dense matmul


class TiledMatmul(Rule):
    """``C[row*N+col] = sum_k A[row*K+k] * B[k*N+col]``, one output per thread, as 32x32 shared-memory tiles."""

    name = "tiled-matmul"
    technique = "shared-memory-tiling"
    summary = "one output per thread, operands from global memory -> 32x32 tiles of A and B staged in shared memory"

    def _match(self, ctx: RuleContext):
        dx, dy = T.index_declaration(ctx.body_masked, "x"), T.index_declaration(ctx.body_masked, "y")
        if dx is None or dy is None:
            return None, "no x and y global index declarations"
        m = T.squash(ctx.body_masked)
        for d in (dx, dy):
            m = m.replace(T.squash(d.group(0)), "", 1)
        ident = r"([A-Za-z_]\w*)"
        shape = re.fullmatch(
            rf"if\({ident}<{ident}&&{ident}<{ident}\)\{{(float|double){ident}={_ZERO};"
            rf"for\(int{ident}=0;\7<{ident};(?:\+\+\7|\7\+\+)\)\{{?\6\+={ident}\[\1\*\8\+\7\]\*{ident}\[\7\*\4\+\3\];\}}?"
            rf"{ident}\[\1\*\4\+\3\]=\6;\}}", m)
        if shape is None:
            return None, "the body is not 'if (row < M && col < N) { acc = 0; for k < K: acc += A[row*K+k] * B[k*N+col]; C[row*N+col] = acc; }'"
        row, rows, col, cols, t, acc, k, depth, a, b, c = shape.groups()
        if {row, col} != {dx.group("name"), dy.group("name")}:
            return None, "row and column are not the two thread indices"
        for name in (a, b, c):
            p = _pointer(ctx, name)
            if p is None or p.base_type != t:
                return None, f"'{name}' is not a {t} array parameter"
        for name in (rows, cols, depth):
            if not ctx.spec_scalar(name):
                return None, f"'{name}' is not an integer scalar of the spec"
        return dict(row=row, M=rows, col=col, N=cols, t=t, K=depth, A=a, B=b, C=c), ""

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        if ctx.spec is None:
            return False, "needs a launch spec (the launch changes to 32x32 blocks)"
        if ctx.kernel.shared or ctx.kernel.syncs or ctx.uses_any("threadIdx.z", "blockIdx.z"):
            return False, "the kernel already uses shared memory, barriers or z indices"
        found, why = self._match(ctx)
        if found is None:
            return False, why
        problem = _tile_rows_problem(ctx, found["M"])
        if problem:
            return False, problem
        return True, f"{found['C']} = {found['A']} x {found['B']}, one output per thread, k in order"

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        f, _ = self._match(ctx)
        t, M, N, K, A, B, C = f["t"], f["M"], f["N"], f["K"], f["A"], f["B"], f["C"]
        body = f"""
    // 32x32 tiles of {A} and {B} in shared memory (zero-padded at the edges); threadIdx.x walks the
    // columns of {C}, so loads and stores are coalesced. k still runs 0..{K}-1 in order per output.
    __shared__ {t} kl_As[32][32];
    __shared__ {t} kl_Bs[32][33];
    int kl_tx = threadIdx.x;
    int kl_ty = threadIdx.y;
    int {f['row']} = blockIdx.y * 32 + kl_ty;
    int {f['col']} = blockIdx.x * 32 + kl_tx;
    {t} kl_acc = 0;
    for (int kl_k0 = 0; kl_k0 < {K}; kl_k0 += 32) {{
        kl_As[kl_ty][kl_tx] = ({f['row']} < {M} && kl_k0 + kl_tx < {K}) ? {A}[{f['row']} * {K} + kl_k0 + kl_tx] : 0;
        kl_Bs[kl_ty][kl_tx] = (kl_k0 + kl_ty < {K} && {f['col']} < {N}) ? {B}[(kl_k0 + kl_ty) * {N} + {f['col']}] : 0;
        __syncthreads();
        for (int kl_k = 0; kl_k < 32; ++kl_k) {{
            kl_acc += kl_As[kl_ty][kl_k] * kl_Bs[kl_k][kl_tx];
        }}
        __syncthreads();
    }}
    if ({f['row']} < {M} && {f['col']} < {N}) {{
        {C}[{f['row']} * {N} + {f['col']}] = kl_acc;
    }}
"""
        override = {"grid": [f"({N}+31)/32", f"({M}+31)/32", "1"], "block": [32, 32, 1], "dynamic_smem": 0}
        if not _launch_ok(ctx, override):
            return ()
        return (Rewrite(ctx.replace_body(body), "32x32 shared-memory tiles of both operands, coalesced loads and stores", override),)
