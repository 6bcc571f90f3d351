"""Static kernel features: what the source alone says about a kernel's likely behaviour.

The profiling tree reads them as ``static.NAME`` facts (``as_dict()`` gives
numbers: booleans as 0/1, unknown values left out) and the knowledge base uses
them to find similar kernels. Each field below has a one-line description in
:data:`FEATURE_DOCS`; the descriptions are the documentation.

How the source is read: the kernel's definition is parsed on its own with
tree-sitter. Index expressions are classified by *thread-index taint*: a value
is "x-dependent" when it comes from ``threadIdx.x`` (directly or through a
local initialised or assigned from it), and "strided" when such a value is
multiplied (or shifted) by anything but 1 before it indexes memory. Division
or shift by a multiple of the warp size (``tid / 32``, ``tid >> 5``) makes a
value warp-uniform again. These are hints: aliasing, macros and helper
functions are not followed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from tree_sitter import Node, Parser, Query, QueryCursor

import functools
import math

from kernel_lsp.core.analysis import KernelFacts, analyze, per_block_outputs, thread_mapping
from kernel_lsp.core.consteval import evaluate_int
from kernel_lsp.core.index import Function
from kernel_lsp.core.parse import CUDA_LANGUAGE, to_source_bytes
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.source import preprocess

FEATURE_DOCS: dict[str, str] = {
    "params": "Number of parameters.",
    "pointer_params": "Parameters that are pointers or arrays (global memory the kernel can read or write).",
    "const_pointer_params": "Pointer parameters to const data (read-only inputs).",
    "restrict_pointer_params": "Pointer parameters marked __restrict__ (no aliasing: enables the read-only cache).",
    "scalar_params": "Parameters passed by value (not pointers).",
    "shared_decls": "Number of __shared__ variables declared in the kernel.",
    "shared_bytes_static": "Bytes of statically sized __shared__ memory per block (unknown if any size is not a constant).",
    "dynamic_shared": "Declares extern __shared__ memory (size set at launch).",
    "loops": "Number of loops (for, while, do).",
    "max_loop_depth": "Deepest loop nesting (0 without loops).",
    "fixed_trip_loops": "for loops whose trip count is a compile-time constant.",
    "unrolled_loops": "Loops preceded by #pragma unroll.",
    "syncs": "Barrier calls (__syncthreads, __syncwarp, cooperative-groups sync).",
    "atomics": "Atomic calls (atomicAdd, atomicCAS, ...).",
    "shared_atomics": "Atomic calls whose target is a __shared__ variable.",
    "uses_2d_index": "Uses a .y or .z thread/block index or dimension (2D/3D decomposition).",
    "grid_stride_loop": "Has a loop that strides by blockDim * gridDim (grid-stride loop).",
    "gather_accesses": "Global accesses whose index depends on a value loaded from memory (x[col[j]]): gathers and scatters.",
    "shared_tree_reduction": "A reduction tree in shared memory (halving or doubling strides, looped or unrolled).",
    "loop_accumulators": "Scalars accumulated across loop iterations (acc += …, m = fmaxf(m, …)).",
    "atomic_scatter": "Atomics at data-dependent addresses (a histogram): privatisation candidates.",
    "row_per_thread": "Each thread walks a row of its own in a loop (softmax, GEMV, CSR rows): uncoalesced across a warp.",
    "per_block_outputs": "Global arrays written once per block (partial[blockIdx.x] = …): their size follows the grid.",
    "warp_shuffles": "Warp shuffle calls (__shfl_sync, __shfl_down_sync, ...).",
    "warp_votes": "Warp vote/match calls (__ballot_sync, __any_sync, __all_sync, __match_any_sync).",
    "has_launch_bounds": "Declares __launch_bounds__.",
    "launch_bounds_max_threads": "First __launch_bounds__ argument when it is a constant.",
    "global_loads_per_thread_est": "Estimated global-memory loads per thread: subscripted reads of pointer parameters, "
    "times constant trip counts of enclosing loops (unknown-trip loops count once).",
    "global_stores_per_thread_est": "Estimated global-memory stores per thread, counted like loads.",
    "strided_global_loads": "Global reads whose index moves by more than one element per threadIdx.x step "
    "(x[threadIdx.x * K], a row per thread): uncoalesced. From the access analysis, through macros and helpers.",
    "strided_global_stores": "Global writes whose index moves by more than one element per threadIdx.x step: uncoalesced.",
    "transposed_store": "A global write whose index is unit-stride in threadIdx.y but not in threadIdx.x "
    "(column-major store, the naive transpose).",
    "shared_column_access": "__shared__ accesses whose threadIdx.x stride shares a factor with the 32 banks "
    "(tile[tx][...] on an unpadded tile): bank conflicts.",
    "thread_dependent_branches": "if/switch/while/?: conditions that depend on the thread index.",
    "intra_warp_divergence_hints": "Thread-dependent conditions that split a warp: comparisons with a constant "
    "(threadIdx.x == 0, tid < 16) or tests of tid % K / tid & K.",
    "ldg_calls": "__ldg read-only cache loads.",
    "device_function_calls": "Calls to functions that are not CUDA builtins or intrinsics.",
    "uses_double": "Uses double precision (FP64 pipe; slow on consumer GPUs).",
    "uses_half": "Uses half or bfloat16 types.",
    "uses_tensor_cores": "Uses WMMA/MMA (tensor cores).",
    "uses_async_copy": "Uses asynchronous global->shared copies (cp.async, memcpy_async, TMA).",
    "uses_cooperative_groups": "Uses cooperative groups.",
    "body_lines": "Lines in the kernel body.",
}


@dataclass(frozen=True)
class StaticFeatures:
    """Static features of one kernel; see :data:`FEATURE_DOCS` for each field."""

    params: int
    pointer_params: int
    const_pointer_params: int
    restrict_pointer_params: int
    scalar_params: int
    shared_decls: int
    shared_bytes_static: int | None
    dynamic_shared: bool
    loops: int
    max_loop_depth: int
    fixed_trip_loops: int
    unrolled_loops: int
    syncs: int
    atomics: int
    shared_atomics: int
    uses_2d_index: bool
    grid_stride_loop: bool
    gather_accesses: int
    shared_tree_reduction: bool
    loop_accumulators: int
    atomic_scatter: bool
    row_per_thread: bool
    per_block_outputs: int
    warp_shuffles: int
    warp_votes: int
    has_launch_bounds: bool
    launch_bounds_max_threads: int | None
    global_loads_per_thread_est: int
    global_stores_per_thread_est: int
    strided_global_loads: int
    strided_global_stores: int
    transposed_store: bool
    shared_column_access: int
    thread_dependent_branches: int
    intra_warp_divergence_hints: int
    ldg_calls: int
    device_function_calls: int
    uses_double: bool
    uses_half: bool
    uses_tensor_cores: bool
    uses_async_copy: bool
    uses_cooperative_groups: bool
    body_lines: int

    def as_dict(self) -> dict[str, float]:
        """Name -> number (booleans 0/1); unknown (None) features are left out."""
        out: dict[str, float] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = float(value)
        return out


_QUERY = Query(
    CUDA_LANGUAGE,
    """
    (subscript_expression) @subscript
    (condition_clause) @condition
    (conditional_expression condition: (_) @condition)
    (do_statement condition: (_) @condition)
    (for_statement) @for
    """,
)
_BINDINGS = Query(
    CUDA_LANGUAGE,
    """
    (init_declarator declarator: (identifier) @name value: (_) @value)
    (assignment_expression left: (identifier) @name right: (_) @value)
    """,
)
_SHUFFLE = re.compile(r"^__shfl")
_VOTE = re.compile(r"^__(ballot|any|all|uni|match_any|match_all)(_sync)?$|^__activemask$")
_BUILTIN = re.compile(
    r"^(__|atomic|cuda|cg::|cooperative_groups::|wmma::|nvcuda::|std::|make_|min$|max$|fminf?$|fmaxf?$|"
    r"sqrtf?$|rsqrtf?$|expf?$|exp2f?$|logf?$|log2f?$|powf?$|sinf?$|cosf?$|tanhf?$|fabsf?$|abs$|floorf?$|ceilf?$|"
    r"fmaf?$|erff?$|roundf?$|truncf?$|assert$|printf$|static_cast|reinterpret_cast|const_cast|sizeof|asm)"
)
_COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!="})
_WARP = 32
_MAX_DEPTH = 200


@dataclass(frozen=True)
class _Taint:
    x: bool = False
    """Depends on threadIdx.x (at unit stride)."""
    x_strided: bool = False
    """Depends on threadIdx.x multiplied by a non-unit factor."""
    y: bool = False
    """Depends on threadIdx.y or threadIdx.z."""

    @property
    def any(self) -> bool:
        return self.x or self.x_strided or self.y

    def __or__(self, other: _Taint) -> _Taint:
        return _Taint(self.x or other.x, self.x_strided or other.x_strided, self.y or other.y)


_CLEAN = _Taint()


class _Analyzer:
    def __init__(self, src: bytes, root: Node, constants: dict[str, str]) -> None:
        self.src = src
        self.root = root
        self.constants = constants
        self.names: dict[str, _Taint] = {}

    def text(self, node: Node) -> str:
        return self.src[node.start_byte : node.end_byte].decode("utf-8", "replace")

    def const(self, node: Node) -> int | None:
        return evaluate_int(self.text(node), self.constants)

    def taint(self, node: Node, depth: int = 0) -> _Taint:
        # Generated code can nest expressions thousands deep; past this depth we stop looking.
        if depth > _MAX_DEPTH:
            return _CLEAN
        depth += 1
        kind = node.type
        if kind == "identifier":
            return self.names.get(self.text(node), _CLEAN)
        if kind == "field_expression":
            obj, field_ = node.child_by_field_name("argument"), node.child_by_field_name("field")
            if obj is not None and field_ is not None and self.text(obj) == "threadIdx":
                name = self.text(field_)
                return _Taint(x=name == "x", y=name in ("y", "z"))
            return _CLEAN
        if kind == "binary_expression":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            op = node.child_by_field_name("operator")
            if left is None or right is None or op is None:
                return _CLEAN
            lt, rt, o = self.taint(left, depth), self.taint(right, depth), self.text(op)
            if o in ("*", "<<"):
                unit = {"*": 1, "<<": 0}[o]
                for tainted, other in ((lt, right), (rt, left)):
                    if (tainted.x or tainted.x_strided) and self.const(other) != unit:
                        return _Taint(x_strided=True, y=lt.y or rt.y)
                return lt | rt
            if o in ("/", ">>"):
                divisor = self.const(right)
                if divisor is not None and (divisor % _WARP == 0 if o == "/" else divisor >= 5):
                    return _CLEAN  # warp-uniform
                return _Taint(x=lt.x or lt.x_strided, y=lt.y)
            return lt | rt
        result = _CLEAN
        for child in node.named_children:
            result = result | self.taint(child, depth)
        return result

    def learn_names(self, pairs: list[tuple[Node, Node]]) -> None:
        """Taint locals from their initialisers and assignments (three rounds reach chains like tid -> row -> idx)."""
        for _ in range(3):
            changed = False
            for name_node, value in pairs:
                name = self.text(name_node)
                new = self.names.get(name, _CLEAN) | self.taint(value)
                if new != self.names.get(name, _CLEAN):
                    self.names[name] = new
                    changed = True
            if not changed:
                break


def _loop_weight(node: Node, loops: list[tuple[int, int, int | None]]) -> int:
    """Product of the constant trip counts of the loops around ``node`` (by byte range, no parent walks:
    tree-sitter's ``parent`` costs O(depth))."""
    weight = 1
    for start, end, trips in loops:
        if start <= node.start_byte and node.end_byte <= end and trips is not None:
            weight *= max(trips, 0)
    return weight


def _access_kind(sub: Node) -> tuple[bool, bool]:
    """(is read, is write) for a subscript expression, from its parent."""
    node = sub
    parent = node.parent
    # Outer subscripts of a multi-dimensional access decide (a[i][j] = ...).
    while parent is not None and parent.type == "subscript_expression":
        node, parent = parent, parent.parent
    if parent is None:
        return True, False
    if parent.type == "assignment_expression" and parent.child_by_field_name("left") == node:
        op = parent.child_by_field_name("operator")
        compound = op is not None and op.type != "="
        return compound, True
    if parent.type == "update_expression":
        return True, True
    if parent.type == "pointer_expression" and parent.children and parent.children[0].type == "&":
        return False, False
    return True, False


def _subscript_base(sub: Node) -> tuple[Node | None, list[Node]]:
    """The array identifier and the index expressions from outermost dimension to innermost."""
    indices: list[Node] = []
    node: Node | None = sub
    while node is not None and node.type == "subscript_expression":
        idx = node.child_by_field_name("indices")
        if idx is not None:
            indices.extend(c for c in reversed(idx.named_children) if c.type != "comment")
        node = node.child_by_field_name("argument")
    indices.reverse()
    return node, indices


def static_features(function: Function, source: str | bytes, constants: dict[str, str] | None = None) -> StaticFeatures:
    """Features of ``function`` (from :func:`kernel_lsp.core.index.build_index`) in ``source``.

    ``constants`` are the file's constants (``dict(index.constants)``) for trip counts and launch bounds.
    """
    constants = constants or {}
    src_all = to_source_bytes(source)
    start = function.span.start_byte
    src = src_all[start : function.span.end_byte]
    root = Parser(CUDA_LANGUAGE).parse(src).root_node
    captures = QueryCursor(_QUERY).captures(root)
    # Name/value pairs come from matches: capture lists of different names are not aligned.
    pairs: list[tuple[Node, Node]] = []
    for _pattern, match in QueryCursor(_BINDINGS).matches(root):
        name, value = match.get("name"), match.get("value")
        if name and value:
            pairs.append((name[0], value[0]))
    an = _Analyzer(src, root, constants)
    an.learn_names(pairs)

    params = function.params
    pointer_params = [p for p in params if p.pointer_depth > 0]
    global_names = {p.name for p in pointer_params}
    shared_names = {d.name for d in function.shared}
    shared_2d = {d.name for d in function.shared if len(d.dims) >= 2}
    loops = [(lp.span.start_byte - start, lp.span.end_byte - start, lp.trip_count) for lp in function.loops]

    access = _access_features(source, function.name)
    dependent = hints = 0
    for cond in captures.get("condition", []):
        if not an.taint(cond).any:
            continue
        dependent += 1
        if _splits_warp(cond, an):
            hints += 1

    call_names = [c.name for c in function.calls]
    text = src.decode("utf-8", "replace")
    bounds_threads = evaluate_int(function.launch_bounds[0], constants) if function.launch_bounds else None
    shared_sizes = [d.size_bytes for d in function.shared if not d.is_extern]
    shared_atomics = sum(
        1 for c in function.atomics if c.args and re.sub(r"^[&\s(]*", "", c.args[0]).split("[")[0].strip() in shared_names
    )
    body = function.body_span
    return StaticFeatures(
        params=len(params),
        pointer_params=len(pointer_params),
        const_pointer_params=sum(1 for p in pointer_params if p.is_const),
        restrict_pointer_params=sum(1 for p in pointer_params if p.is_restrict),
        scalar_params=len(params) - len(pointer_params),
        shared_decls=len(function.shared),
        shared_bytes_static=None if any(s is None for s in shared_sizes) else sum(s for s in shared_sizes if s is not None),
        dynamic_shared=any(d.is_extern for d in function.shared),
        loops=len(function.loops),
        max_loop_depth=max((lp.depth for lp in function.loops), default=0),
        fixed_trip_loops=sum(1 for lp in function.loops if lp.trip_count is not None),
        unrolled_loops=sum(1 for lp in function.loops if lp.has_pragma_unroll),
        syncs=len(function.syncs),
        atomics=len(function.atomics),
        shared_atomics=shared_atomics,
        uses_2d_index=any(u.endswith((".y", ".z")) for u in function.thread_index_uses),
        grid_stride_loop=access.mapping == "grid-stride",
        gather_accesses=access.gathers,
        shared_tree_reduction=access.shared_tree,
        loop_accumulators=access.accumulators,
        atomic_scatter=access.atomic_scatter,
        row_per_thread=access.mapping == "row-per-thread",
        per_block_outputs=access.per_block_outputs,
        warp_shuffles=sum(1 for n in call_names if _SHUFFLE.match(n)),
        warp_votes=sum(1 for n in call_names if _VOTE.match(n)),
        has_launch_bounds=bool(function.launch_bounds),
        launch_bounds_max_threads=bounds_threads,
        global_loads_per_thread_est=access.loads,
        global_stores_per_thread_est=access.stores,
        strided_global_loads=access.strided_loads,
        strided_global_stores=access.strided_stores,
        transposed_store=access.transposed,
        shared_column_access=access.column_access,
        thread_dependent_branches=dependent,
        intra_warp_divergence_hints=hints,
        ldg_calls=sum(1 for n in call_names if n == "__ldg"),
        device_function_calls=sum(1 for n in call_names if not _BUILTIN.match(n) and "." not in n),
        uses_double=bool(re.search(r"\bdouble\b", text)),
        uses_half=bool(re.search(r"\b(__half2?|half2?|__nv_bfloat162?|nv_bfloat162?)\b", text)),
        uses_tensor_cores=bool(re.search(r"\bwmma::|\bmma_sync\b|\bmma\.sync|\bwgmma\b", text)),
        uses_async_copy=bool(re.search(r"cp\.async|memcpy_async|__pipeline_memcpy_async|cp_async|\btma\b|cuda::barrier", text)),
        uses_cooperative_groups=bool(re.search(r"\bcooperative_groups\b|\bcg::", text)),
        body_lines=(body.end.line - body.start.line + 1) if body is not None else 0,
    )


@dataclass(frozen=True)
class _AccessFeatures:
    loads: int = 0
    stores: int = 0
    strided_loads: int = 0
    strided_stores: int = 0
    transposed: bool = False
    column_access: int = 0
    gathers: int = 0
    shared_tree: bool = False
    accumulators: int = 0
    atomic_scatter: bool = False
    mapping: str = "other"
    per_block_outputs: int = 0


@functools.lru_cache(maxsize=16)
def _file_facts(source: str | bytes) -> dict[str, KernelFacts]:
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    return analyze(preprocess(text))


def _moves_more_than_one(stride: Poly | None) -> bool:
    return stride is not None and stride.constant not in (0, 1, -1)


def _access_features(source: str | bytes, kernel: str) -> _AccessFeatures:
    """The access-derived features, read from the access analysis of the file's own view (its
    macros expanded, helpers inlined); symbolic, so they need no launch spec."""
    facts = _file_facts(source).get(kernel)
    if facts is None:
        return _AccessFeatures()
    loads = stores = strided_loads = strided_stores = column = gathers = 0
    transposed = False
    for a in facts.accesses:
        along_x = a.index.coefficient("tid.x")
        weight = 1
        for loop_id in a.loops:
            loop = facts.loops[loop_id]
            if loop.start is not None and loop.bound is not None and loop.step is not None:
                first, last, step = loop.start.constant, loop.bound.constant, loop.step.constant
                if first is not None and last is not None and step:
                    weight *= max(1, -(-(last - first) // step))
        gather = any(s in facts.opaque and facts.opaque[s].deps and facts.opaque[s].recipe is None for s in a.index.symbols)
        if a.space == "shared":
            if along_x is not None and along_x.constant is not None and math.gcd(along_x.constant, 32) > 1:
                column += 1
            elif along_x is not None and along_x.constant is None and not gather:
                column += 1
            continue
        if a.space != "global":
            continue
        strided = _moves_more_than_one(along_x)
        gathers += gather
        if a.reads:
            loads += weight
            strided_loads += strided
        if a.writes:
            stores += weight
            strided_stores += strided
            along_y = a.index.coefficient("tid.y")
            if strided and along_y is not None and along_y.constant == 1:
                transposed = True
    return _AccessFeatures(
        loads=loads, stores=stores, strided_loads=strided_loads, strided_stores=strided_stores, transposed=transposed,
        column_access=column, gathers=gathers,
        shared_tree=any(r.kind == "shared_tree" for r in facts.reductions),
        accumulators=sum(1 for r in facts.reductions if r.kind == "accumulator"),
        atomic_scatter=any(r.kind == "atomic_scatter" for r in facts.reductions),
        mapping=thread_mapping(facts),
        per_block_outputs=len(per_block_outputs(facts)),
    )


def _splits_warp(cond: Node, an: _Analyzer) -> bool:
    """A thread-dependent condition that only part of a warp satisfies."""
    stack = [cond]
    while stack:
        node = stack.pop()
        if node.type == "binary_expression":
            op_node = node.child_by_field_name("operator")
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if op_node is not None and left is not None and right is not None:
                op = an.text(op_node)
                if op in ("%", "&") and (an.taint(left).any or an.taint(right).any):
                    return True
                if op in _COMPARISONS:
                    for tainted, other in ((left, right), (right, left)):
                        value = an.const(other)
                        if an.taint(tainted).any and value is not None and (op in ("==", "!=") or value % _WARP != 0):
                            return True
        stack.extend(node.named_children)
    return False


def _mentions_grid_stride(update: Node, an: _Analyzer, pairs: list[tuple[Node, Node]]) -> bool:
    text = an.text(update)
    if "gridDim" in text:
        return True
    # A stride held in a local: `int stride = blockDim.x * gridDim.x; ... i += stride`.
    names = set(re.findall(r"[A-Za-z_]\w*", text))
    for name_node, value in pairs:
        if an.text(name_node) in names and "gridDim" in an.text(value):
            return True
    return False
