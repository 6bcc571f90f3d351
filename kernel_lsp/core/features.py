"""Static kernel features: what the source alone says about a kernel's likely behaviour.

The profiling tree reads them as ``static.NAME`` facts (``as_dict()`` gives
numbers: booleans as 0/1, unknown values left out) and the knowledge base uses
them to find similar kernels. Each field below has a one-line description in
:data:`FEATURE_DOCS`; the descriptions are the documentation.

How the source is read: the kernel index (:mod:`kernel_lsp.core.index`) gives
the declarations, loops, barriers, atomics and calls as written; the access
analysis (:mod:`kernel_lsp.core.analysis`, on the file's own preprocessed view,
so macros and helpers are seen) gives every access's index, the conditions and
whether each depends on the thread, the reductions and the types the kernel
uses. Nothing here reads the source a second way.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, fields

from kernel_lsp.core.analysis import KernelFacts, analyze, per_block_outputs, thread_mapping
from kernel_lsp.core.consteval import evaluate_int
from kernel_lsp.core.index import Function
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


_SHUFFLE = re.compile(r"^__shfl")
_VOTE = re.compile(r"^__(ballot|any|all|uni|match_any|match_all)(_sync)?$|^__activemask$")
_BUILTIN = re.compile(
    r"^(__|atomic|cuda|cg::|cooperative_groups::|wmma::|nvcuda::|std::|make_|min$|max$|fminf?$|fmaxf?$|"
    r"sqrtf?$|rsqrtf?$|expf?$|exp2f?$|logf?$|log2f?$|powf?$|sinf?$|cosf?$|tanhf?$|fabsf?$|abs$|floorf?$|ceilf?$|"
    r"fmaf?$|erff?$|roundf?$|truncf?$|assert$|printf$|static_cast|reinterpret_cast|const_cast|sizeof|asm)"
)
_TENSOR_CALLS = re.compile(r"(^|::)(wmma::\w+|mma_sync|load_matrix_sync|store_matrix_sync|fill_fragment|wgmma\w*)$")
_ASYNC_CALLS = re.compile(r"(memcpy_async|__pipeline_memcpy_async|cp_async\w*|__pipeline_commit|__pipeline_wait_prior)$")
_GROUP_CALLS = re.compile(r"(^|::)(this_thread_block|tiled_partition|this_grid|coalesced_threads|sync|reduce)$|^(cg|cooperative_groups)::")
_HALF_TYPES = frozenset({"__half", "half", "__half2", "half2", "__nv_bfloat16", "nv_bfloat16", "__nv_bfloat162",
                         "nv_bfloat162"})
#: The kinds of :class:`~kernel_lsp.core.analysis.Condition` that are branches of the kernel's code (the
#: operands of ``&&``/``||`` are parts of one).
_BRANCHES = frozenset({"if", "exit", "select", "while", "do", "switch"})


def static_features(function: Function, source: str | bytes, constants: dict[str, str] | None = None) -> StaticFeatures:
    """Features of ``function`` (from :func:`kernel_lsp.core.index.build_index`) in ``source``.

    ``constants`` are the file's constants (``dict(index.constants)``) for launch bounds.
    """
    constants = constants or {}
    facts = _file_facts(source).get(function.name)
    access = _access_features(facts)
    params = function.params
    pointer_params = [p for p in params if p.pointer_depth > 0]
    branches = [c for c in facts.conditions if c.kind in _BRANCHES and not c.via] if facts is not None else []
    dependent = [c for c in branches if c.thread_dependent and not c.warp_uniform]
    call_names = [c.name for c in function.calls]
    types = set(facts.value_types) | {a.elem_type for a in facts.accesses} if facts is not None else set()
    bounds_threads = evaluate_int(function.launch_bounds[0], constants) if function.launch_bounds else None
    shared_sizes = [d.size_bytes for d in function.shared if not d.is_extern]
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
        shared_atomics=sum(1 for a in facts.accesses if a.kind == "atomic" and a.space == "shared") if facts else 0,
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
        thread_dependent_branches=len(dependent),
        intra_warp_divergence_hints=sum(1 for c in dependent if c.splits_warp),
        ldg_calls=sum(1 for n in call_names if n == "__ldg"),
        device_function_calls=sum(1 for n in call_names if not _BUILTIN.match(n) and "." not in n),
        uses_double=any(t == "double" or t.startswith("double") and t[6:].isdigit() for t in types),
        uses_half=bool(types & _HALF_TYPES),
        uses_tensor_cores=any(_TENSOR_CALLS.search(n) for n in call_names),
        uses_async_copy=any(_ASYNC_CALLS.search(n) for n in call_names),
        uses_cooperative_groups=any(_GROUP_CALLS.search(n) for n in call_names) or bool(
            facts is not None and (facts.implicit_indices or any(not b.text.startswith("__sync") for b in facts.barriers))),
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


def _access_features(facts: KernelFacts | None) -> _AccessFeatures:
    """The access-derived features, read from the access analysis of the file's own view (its
    macros expanded, helpers inlined); symbolic, so they need no launch spec."""
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
            # A stride of 0 is a broadcast (one word for the whole warp), never a conflict.
            if along_x is not None and along_x.constant not in (None, 0) and math.gcd(along_x.constant, 32) > 1:
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
