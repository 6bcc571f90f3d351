"""Global atomics onto few, data-dependent targets (histograms) privatised in shared memory.

``atomicAdd(&hist[base + bin(data)], v)`` from every thread sends each update to L2, and updates
of the same bin serialise there. When the targets one block can reach are few enough to fit
shared memory, the block keeps its own copy of them: set to the operation's identity at the start
(0 for a sum, the type's largest or smallest value for ``atomicMin`` / ``atomicMax``), updated with
shared atomics, combined into the global array once per block at the end (only the entries it
changed). The bins may be of any type the original's atomic takes (``int``, ``unsigned``,
``float``, ``unsigned long long`` …); atomics inside ``__device__`` helpers are changed in copies of
the helpers made for the kernel (:mod:`kernel_lsp.core.transforms.helper_clone`).

Legality, in terms of the analysis (each refusal names the missing fact):
- the atomics onto the array are statements whose old value is unused, all ``atomicAdd``, all
  ``atomicMin`` or all ``atomicMax``, at one index that depends on loaded data (else neighbouring
  threads do not collide and a private copy only adds work);
- the index splits into a part the same for the whole block (scalar parameters, block indices:
  ``base``) and an offset; the copy holds the offsets the analysis' interval over every thread and
  every loaded value allows (:func:`~kernel_lsp.core.analysis.value_range`), and, when that has no
  bound and the base is 0, the array's own size in the spec (an in-bounds original reaches no
  other); at every size of the spec the copy must fit the shared memory left beside the kernel's own;
- an update whose offset falls outside the copy at run time goes to the global array as before
  (the interval and the spec's size only size the copy: the guard keeps any input correct);
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
from kernel_lsp.core.static_check import problem_sizes
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.analysis import Access
from kernel_lsp.core.transforms.block_reduce import _cast_pointer, _exits_refusal, _is_barrier, _returns, identity
from kernel_lsp.core.transforms.helper_clone import HelperEdits, clone_helpers
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
#: The atomics privatised, with the helper's name and the combine's operator.
_OPS = {"atomicAdd": ("kl_private_add", "+"), "atomicMin": ("kl_private_min", "min"), "atomicMax": ("kl_private_max", "max")}


def _helper(atomic: str) -> str:
    name = _OPS[atomic][0]
    return _HELPER.replace("kl_private_add", name).replace("atomicAdd", atomic)


@dataclass(frozen=True)
class _Private:
    array: str
    elem_type: str
    base: str
    count: int
    calls: tuple[tuple[int, int, str, str], ...]
    """Each atomic call's byte range, its address and its value as written (in the kernel's body)."""
    atomic: str = "atomicAdd"
    accesses: tuple[Access, ...] = ()


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
        why = _exits_refusal(body, src, facts.syncs, ctx.preprocessed)
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
        kinds = {a.op for a in atomics}
        if len(kinds) != 1 or not kinds <= set(_OPS):
            return f"its atomics are {', '.join(sorted(kinds))}: not all atomicAdd, all atomicMin or all atomicMax", None
        atomic = atomics[0].op
        elem_type = atomics[0].elem_type
        if identity(_OPS[atomic][1], elem_type) is None:
            return f"{atomic} on `{elem_type}`: no identity to start the private copy from is known for that type", None
        if array in assigned:
            return "the pointer is assigned in the kernel", None
        if len({a.index for a in atomics}) != 1:
            return "the atomics use different indices", None
        if not _data_dependent(atomics[0].index, facts.opaque):
            return ("its targets do not depend on loaded data (neighbouring threads do not collide: "
                    "a private copy would only add work)"), None
        first = min(a.span[0] for a in atomics if not a.via) if any(not a.via for a in atomics) else None
        calls_first = first if first is not None else _first_call(body, atomics)
        barrier = next((s for s in body.named_children if _is_barrier(s, src, facts) and calls_first is not None
                        and s.end_byte <= calls_first), None)
        for other in mine:
            if other.kind == "atomic":
                continue
            if other.reads:
                return f"`{other.text}` reads it: the order against the deferred merge is not kept", None
            if other.via or barrier is None or other.span[1] > barrier.start_byte:
                return (f"`{other.text}` writes it without a barrier at the top level of the body between it and "
                        "every atomic"), None
        base, offset = split_block_base(atomics[0].index, facts)
        if any(s not in _BUILTIN and s in assigned for s in base.symbols):
            return "a name in the block's base index is assigned in the kernel", None
        count = 0
        for binding, variant in zip(bindings, [None, *range(len(ctx.spec.variants))]):
            rng = value_range(offset, facts, binding)
            size = _spec_size(ctx, facts, array, variant) if base == Poly() else None
            if rng is None and size is None:
                return (f"the offset `{offset}` of its targets within a block has no bound "
                        "(a loaded value used as an index as is)"), None
            if rng is not None and rng[0] < 0 and size is None:
                return f"the offset `{offset}` of its targets may be negative", None
            reach = size if rng is None or rng[0] < 0 else rng[1] + 1 if size is None else min(rng[1] + 1, size)
            count = max(count, reach)
        # A literal equal to one of the spec's sizes would read as that size written into the kernel (the
        # harness's static check): one more entry, never reached, is harmless.
        sizes = problem_sizes(ctx.spec)
        while count in sizes:
            count += 1
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
            if not a.via:
                calls.append((a.span[0], a.span[1], _text(src, address), _text(src, value)))
        return None, _Private(array, elem_type, c_text(base), count, tuple(calls), atomic, tuple(atomics))

    def _clones(self, plans: list[_Private], facts, src: bytes, root: Node):
        in_helpers = [(k, p) for k, p in enumerate(plans) if any(a.via for a in p.accesses)]
        if not in_helpers:
            return HelperEdits("", ())
        params = ", ".join(f"{p.elem_type}* kl_pbase{k}, {p.elem_type}* kl_priv{k}" for k, p in in_helpers)
        args = ", ".join(f"kl_pbase{k}, kl_priv{k}" for k, _ in in_helpers)
        slot = {id(a): k for k, p in in_helpers for a in p.accesses}

        def replace(access, call: Node) -> str:
            k = slot[id(access)]
            p = plans[k]
            address, value = (_text(src, n) for n in call.child_by_field_name("arguments").named_children)
            return f"{_OPS[p.atomic][0]}({address}, {value}, kl_pbase{k}, kl_priv{k}, {p.count}LL)"

        return clone_helpers(facts, src, root, [a for _, p in in_helpers for a in p.accesses if a.via], replace, params, args)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plans, why = self.plan(ctx)
        if not plans:
            return False, why
        src, root = parse(ctx.preprocessed)
        clones = self._clones(plans, ctx.facts, src, root)
        if isinstance(clones, str):
            return False, clones
        return True, "; ".join(
            f"the atomics onto `{p.array}` reach at most {p.count} targets per block, at an offset from a base "
            "the same for the whole block, and the array is touched nowhere else before them" for p in plans)

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plans, _ = self.plan(ctx)
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        clones = self._clones(plans, facts, src, root)
        edit = BodyEdit(ctx.preprocessed, facts)
        lo, hi = facts.body_span
        head = ["", "    const unsigned kl_t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);",
                "    const unsigned kl_n = blockDim.x * blockDim.y * blockDim.z;"]
        tail = ["    } while (0);", "    __syncthreads();"]
        for k, p in enumerate(plans):
            name, op = _OPS[p.atomic]
            start_value = identity(op, p.elem_type)
            head += [f"    __shared__ {p.elem_type} kl_priv{k}[{p.count}];",
                     f"    for (unsigned kl_j = kl_t; kl_j < {p.count}u; kl_j += kl_n) kl_priv{k}[kl_j] = {start_value};"]
            if any(a.via for a in p.accesses):
                head.append(f"    {p.elem_type}* const kl_pbase{k} = {p.array} + ({p.base});")
            for start, end, address, value in p.calls:
                edit.replace(start, end, f"{name}({address}, {value}, {p.array} + ({p.base}), kl_priv{k}, {p.count}LL)")
            tail.append(f"    for (unsigned kl_j = kl_t; kl_j < {p.count}u; kl_j += kl_n)\n"
                        f"        if (kl_priv{k}[kl_j] != {start_value}) {p.atomic}({p.array} + ({p.base}) + kl_j, kl_priv{k}[kl_j]);")
        head += ["    __syncthreads();", "    do { // the original body; a return leaves it for the merge"]
        edit.insert(lo + 1, "\n".join(head))
        for start, end, new in clones.calls:
            edit.replace(start, end, new)
        kernel = node_at(src, root, facts.span)
        for ret in _returns(kernel.child_by_field_name("body")):
            edit.replace(ret.start_byte, ret.end_byte, "break;")
        edit.insert(hi - 1, "\n".join(tail) + "\n")
        helpers = "".join(_helper(a) for a in sorted({p.atomic for p in plans}) if _OPS[a][0] not in ctx.source)
        source, expanded = emit(edit, ctx.source, ctx.kernel, helpers + clones.helpers)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        what = ", ".join(f"`{p.array}` ({p.count} per block)" for p in plans)
        copied = " (their helpers copied for this kernel)" if clones.helpers else ""
        return (Rewrite(source, f"the atomics onto {what}{copied} privatised in shared memory, merged once per block; "
                                f"same grid and block{note}"),)


def _first_call(body: Node, atomics) -> int | None:  # noqa: ANN001 - tuple of Access
    """Where the kernel's body first calls a helper on the way to one of ``atomics`` (the atomics
    themselves lie in the helpers)."""
    names = {a.via[0] for a in atomics if a.via}
    found, stack = [], [body]
    while stack:
        n = stack.pop()
        if n.type == "call_expression":
            fn = n.child_by_field_name("function")
            text = fn.text.decode("utf-8", "replace") if fn is not None and fn.text is not None else ""
            if text.split("<", 1)[0].rsplit("::", 1)[-1].strip() in names:
                found.append(n.start_byte)
        stack.extend(n.children)
    return min(found) if found else None


def _spec_size(ctx: RuleContext, facts, array: str, variant) -> int | None:  # noqa: ANN001
    """The element count the spec gives the array parameter ``array`` at ``variant``, or None."""
    names = [name for name, _, _ in facts.params]
    if array not in names or ctx.spec is None or len(ctx.spec.params) != len(names):
        return None
    try:
        return int(ctx.spec.resolve(variant).sizes[ctx.spec.params[names.index(array)].name])
    except (KeyError, SpecError, ValueError, ZeroDivisionError):
        return None


def _elem_bytes(ctx: RuleContext, plan: _Private) -> int:
    access = next(a for a in ctx.facts.accesses if a.array == plan.array)
    return access.elem_bytes or 4
