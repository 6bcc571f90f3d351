"""Global atomics onto few, data-dependent targets (histograms) privatised in shared memory.

``atomicAdd(&hist[base + bin(data)], v)`` from every thread sends each update to L2, and updates
of the same bin serialise there. When the targets one block can reach are few enough to fit
shared memory, the block keeps its own copy of them: zeroed at the start, updated with shared
atomics, added to the global array once per block at the end (only the entries it changed).

Legality, in terms of the analysis (each refusal names the missing fact):
- the atomics onto the array are ``atomicAdd`` statements whose old value is unused, at an index
  that depends on loaded data (else neighbouring threads do not collide and a private copy only
  adds work);
- the index splits into a part the same for the whole block (scalar parameters, block indices:
  ``base``) and an offset whose interval over every thread and every loaded value
  (:func:`~kernel_lsp.core.analysis.value_range`) is non-negative and, at every size of the spec,
  small enough that the private copy fits the shared memory left beside the kernel's own;
- an update whose offset falls outside the copy at run time goes to the global array as before
  (the interval is the analysis', the guard keeps any input correct);
- the kernel reads the array nowhere else, and writes it only before a barrier at the top level
  of its body that precedes every atomic (a block clearing its own bins); the pointer and the
  names in ``base`` are never assigned;
- every thread reaches the final merge: returns as for
  :class:`~kernel_lsp.core.transforms.block_reduce.AtomicToBlockReduce`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import Binding, _data_dependent, assigned_names, split_block_base, value_range
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.spec import SpecError
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.transforms.block_reduce import _cast_pointer, _exits_refusal, _is_barrier, _returns
from kernel_lsp.core.transforms.emit import BodyEdit, emit, node_at, parse
from kernel_lsp.core.transforms.tree_model import c_text

#: Shared memory a block may use without opting in (every GPU since compute capability 2.0).
SHARED_BYTES = 48 * 1024
_BUILTIN = {"bid.x": "blockIdx.x", "bid.y": "blockIdx.y", "bid.z": "blockIdx.z", "bdim.x": "blockDim.x",
            "bdim.y": "blockDim.y", "bdim.z": "blockDim.z", "gdim.x": "gridDim.x", "gdim.y": "gridDim.y",
            "gdim.z": "gridDim.z"}
_HELPER = """template <typename T, typename V>
__device__ __forceinline__ void kl_private_add(T* p, V v, T* base, T* priv, long long count) {
    // The block's own copy when the target falls in it, the global array otherwise.
    long long o = (long long)(p - base);
    if (o >= 0 && o < count) atomicAdd(&priv[o], (T)v); else atomicAdd(p, (T)v);
}
"""


@dataclass(frozen=True)
class _Private:
    array: str
    elem_type: str
    base: str
    count: int
    calls: tuple[tuple[int, int, str, str], ...]
    """Each atomic call's byte range, its address and its value as written."""


class SharedPrivatize(Rule):
    name = "shared-privatize"
    technique = "privatized-histogram"
    summary = "atomics onto few data-dependent targets kept in a per-block shared copy, merged once per block"

    def plan(self, ctx: RuleContext) -> tuple[list[_Private], str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return [], "the kernel's analysis is missing or incomplete"
        pointers = {name for name, _, is_pointer in facts.params if is_pointer}
        arrays = list(dict.fromkeys(a.array for a in facts.accesses if a.kind == "atomic" and a.space == "global"
                                    and a.array in pointers))
        if not arrays:
            return [], "no global atomics onto a pointer parameter"
        if ctx.spec is None:
            return [], "needs a launch spec (the private copy must fit shared memory at every size)"
        try:
            variants = [None, *range(len(ctx.spec.variants))]
            bindings = [Binding.from_spec(ctx.spec, v) for v in variants]
            launches = [ctx.spec.resolve(v).original for v in variants]
        except (SpecError, ValueError, ZeroDivisionError):
            return [], "the spec's launch does not evaluate"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return [], "the kernel's definition was not found in the preprocessed view"
        why = _exits_refusal(body, src, facts.syncs)
        if why:
            return [], why
        assigned = assigned_names(body, src)
        static_bytes = sum(d.size_bytes or 0 for d in ctx.kernel.shared if not d.is_extern)
        left = min(SHARED_BYTES - static_bytes - launch.dynamic_smem_bytes for launch in launches)
        plans, reasons = [], []
        for array in arrays:
            why, plan = self._one(ctx, facts, array, assigned, bindings, body, root, src, left)
            if why:
                reasons.append(f"`{array}`: {why}")
            else:
                plans.append(plan)
                left -= plan.count * _elem_bytes(ctx, plan)
        if not plans:
            return [], "; ".join(reasons)
        return plans, ""

    def _one(self, ctx, facts, array, assigned, bindings, body: Node, root: Node, src: bytes, left: int):
        mine = [a for a in facts.accesses if a.array == array]
        atomics = [a for a in mine if a.kind == "atomic"]
        if any(a.op != "atomicAdd" for a in atomics):
            return "an atomic other than atomicAdd", None
        if any(a.via for a in atomics):
            return "an atomic in a helper function", None
        if array in assigned:
            return "the pointer is assigned in the kernel", None
        if len({a.index for a in atomics}) != 1:
            return "the atomics use different indices", None
        if not _data_dependent(atomics[0].index, facts.opaque):
            return ("its targets do not depend on loaded data (neighbouring threads do not collide: "
                    "a private copy would only add work)"), None
        first = min(a.span[0] for a in atomics)
        barrier = next((s for s in body.named_children if _is_barrier(s, src, facts) and s.end_byte <= first), None)
        for other in mine:
            if other.kind == "atomic":
                continue
            if other.reads:
                return f"`{other.text}` reads it: the order against the deferred merge is not kept", None
            if barrier is None or other.span[1] > barrier.start_byte:
                return (f"`{other.text}` writes it without a barrier at the top level of the body between it and "
                        "every atomic"), None
        base, offset = split_block_base(atomics[0].index, facts)
        if any(s not in _BUILTIN and s in assigned for s in base.symbols):
            return "a name in the block's base index is assigned in the kernel", None
        count = 0
        for binding in bindings:
            rng = value_range(offset, facts, binding)
            if rng is None:
                return (f"the offset `{offset}` of its targets within a block has no bound "
                        "(a loaded value used as an index as is)"), None
            if rng[0] < 0:
                return f"the offset `{offset}` of its targets may be negative", None
            count = max(count, rng[1] + 1)
        elem = atomics[0].elem_bytes or 4
        if count * elem > left:
            return (f"its {count} targets per block ({count * elem} bytes) do not fit the {max(left, 0)} bytes "
                    "of shared memory left at every size"), None
        calls = []
        for a in atomics:
            call = node_at(src, root, a.span)
            args = call.child_by_field_name("arguments") if call is not None and call.type == "call_expression" else None
            if args is None or args.named_child_count != 2 or call.parent is None or call.parent.type != "expression_statement":
                return f"`{a.text}` uses the atomic's old value", None
            address, value = args.named_children
            if _cast_pointer(address):
                return f"the address of `{a.text}` is cast: the element type it adds is not the array's", None
            calls.append((a.span[0], a.span[1], _text(src, address), _text(src, value)))
        return None, _Private(array, atomics[0].elem_type, c_text(base), count, tuple(calls))

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plans, why = self.plan(ctx)
        if not plans:
            return False, why
        return True, "; ".join(
            f"the atomics onto `{p.array}` reach at most {p.count} targets per block, at an offset from a base "
            "the same for the whole block, and the array is touched nowhere else before them" for p in plans)

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plans, _ = self.plan(ctx)
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        edit = BodyEdit(ctx.preprocessed, facts)
        lo, hi = facts.body_span
        head = ["", "    const unsigned kl_t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);",
                "    const unsigned kl_n = blockDim.x * blockDim.y * blockDim.z;"]
        tail = ["    } while (0);", "    __syncthreads();"]
        for k, p in enumerate(plans):
            head += [f"    __shared__ {p.elem_type} kl_priv{k}[{p.count}];",
                     f"    for (unsigned kl_j = kl_t; kl_j < {p.count}u; kl_j += kl_n) kl_priv{k}[kl_j] = ({p.elem_type})0;"]
            for start, end, address, value in p.calls:
                edit.replace(start, end, f"kl_private_add({address}, {value}, {p.array} + ({p.base}), kl_priv{k}, {p.count}LL)")
            tail.append(f"    for (unsigned kl_j = kl_t; kl_j < {p.count}u; kl_j += kl_n)\n"
                        f"        if (kl_priv{k}[kl_j] != ({p.elem_type})0) atomicAdd({p.array} + ({p.base}) + kl_j, kl_priv{k}[kl_j]);")
        head += ["    __syncthreads();", "    do { // the original body; a return leaves it for the merge"]
        edit.insert(lo + 1, "\n".join(head))
        kernel = node_at(src, root, facts.span)
        for ret in _returns(kernel.child_by_field_name("body")):
            edit.replace(ret.start_byte, ret.end_byte, "break;")
        edit.insert(hi - 1, "\n".join(tail) + "\n")
        helper = _HELPER if "kl_private_add" not in ctx.source else ""
        source, expanded = emit(edit, ctx.source, ctx.kernel, helper)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        what = ", ".join(f"`{p.array}` ({p.count} per block)" for p in plans)
        return (Rewrite(source, f"the atomics onto {what} privatised in shared memory, merged once per block; "
                                f"same grid and block{note}"),)


def _elem_bytes(ctx: RuleContext, plan: _Private) -> int:
    access = next(a for a in ctx.facts.accesses if a.array == plan.array)
    return access.elem_bytes or 4
