"""Warp-aggregated atomics: the lanes of a warp that update one element do it with one atomic.

A global ``atomicAdd(&hist[bin(data)], v)`` from every lane sends 32 updates to L2 even when
several lanes of the warp target the same element, and updates of one element serialise there.
:class:`WarpAggregate` replaces each such atomic by a call that groups the lanes arriving at it
together (``__activemask``) by their target (``__match_any_sync``), combines the group's values
with shuffles among the group only, and lets the group's lowest lane issue the one atomic: as many
atomics per warp as distinct targets. A constant increment (``atomicAdd(&count[k], 1)``) is the
group's size times it (``__popc``). ``atomicMin`` and ``atomicMax`` combine the same way. Atomics in
``__device__`` helpers are changed in copies of the helpers made for the kernel
(:mod:`kernel_lsp.core.transforms.helper_clone`). Grid and block are unchanged.

Legality, in terms of the analysis (each refusal names the missing fact):
- the atomics onto the array are ``atomicAdd``, ``atomicMin`` or ``atomicMax`` statements on a global
  array (their old value unused, their address not cast to another type);
- their index depends on loaded data and not, besides, on the thread's own index (a target that
  moves with the lane, ``out[i]``, ``dw[ix * C + c]`` with ``c`` from the thread index, is never
  shared by two lanes: grouping would only add work); an index the same for the whole block is
  :class:`~kernel_lsp.core.transforms.block_reduce.AtomicToBlockReduce`'s.

Any set of lanes that reaches the call together is a correct group: each lane's value is added once,
by its group's leader, so divergence and early exits need no proof.
"""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import Access, KernelFacts, Opaque, _data_dependent
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.poly import Poly, is_opaque
from kernel_lsp.core.rules.base import Rewrite, Rule, RuleContext
from kernel_lsp.core.transforms.block_reduce import _cast_pointer
from kernel_lsp.core.transforms.emit import BodyEdit, emit, node_at, parse
from kernel_lsp.core.transforms.helper_clone import clone_helpers

_LANE = "((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) & 31u)"
#: The helpers of :mod:`kernel_lsp.core.transforms.privatize` (a later step of a sequence sees their atomics).
_PRIVATE = {"kl_private_add", "kl_private_min", "kl_private_max"}
_COMBINE = {"atomicAdd": "total += x;", "atomicMin": "total = min(total, x);", "atomicMax": "total = max(total, x);"}


def _helper(atomic: str) -> str:
    name = f"kl_aggregated_{atomic[6:].lower()}"
    start = "(T)0" if atomic == "atomicAdd" else "(T)v"
    first = "unsigned rest = peers" if atomic == "atomicAdd" else "unsigned rest = peers & (peers - 1)"
    return (f"template <typename T, typename V>\n__device__ __forceinline__ void {name}(T* p, V v) {{\n"
            "    // The lanes that reach this call together and target one element update it once, through the lowest.\n"
            "    const unsigned active = __activemask();\n"
            "    const unsigned peers = __match_any_sync(active, (unsigned long long)p);\n"
            f"    T total = {start};\n"
            f"    for ({first}; rest; rest &= rest - 1) {{\n"
            "        const T x = __shfl_sync(peers, (T)v, __ffs(rest) - 1);\n"
            f"        {_COMBINE[atomic]}\n"
            "    }\n"
            f"    if ({_LANE} == (unsigned)(__ffs(peers) - 1)) {atomic}(p, total);\n"
            "}\n")


_COUNT_HELPER = (
    "template <typename T, typename V>\n__device__ __forceinline__ void kl_aggregated_count(T* p, V v) {\n"
    "    // The lanes that reach this call together and target one element add the same constant: once, times their number.\n"
    "    const unsigned peers = __match_any_sync(__activemask(), (unsigned long long)p);\n"
    f"    if ({_LANE} == (unsigned)(__ffs(peers) - 1)) atomicAdd(p, (T)__popc(peers) * (T)v);\n"
    "}\n")


@dataclass(frozen=True)
class _Site:
    access: Access
    helper: str
    """The helper the atomic becomes."""


def _lane_distinct(poly: Poly, opaque: dict[str, Opaque], depth: int = 0) -> bool:
    """``poly`` moves with the thread's own index other than through a loaded value (``i``, ``idx % C``)."""
    if depth > 16:
        return True
    for s in poly.symbols:
        if s.startswith("tid."):
            return True
        entry = opaque.get(s) if is_opaque(s) else None
        if entry is not None and entry.recipe is not None and entry.deps:
            parts = [x for x in entry.recipe if isinstance(x, Poly)]
            if any(_lane_distinct(x, opaque, depth + 1) for x in parts):
                return True
    return False


def _constant(node: Node) -> bool:
    while node.type in ("parenthesized_expression", "cast_expression"):
        node = node.child_by_field_name("value") if node.type == "cast_expression" else node.named_children[0]
    return node.type == "number_literal"


class WarpAggregate(Rule):
    name = "warp-aggregate"
    technique = "one-atomic-per-block"
    summary = "atomics onto data-dependent targets aggregated per warp: one atomic per distinct target and warp"

    def plan(self, ctx: RuleContext) -> tuple[list[_Site], str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return [], "the kernel's analysis is missing or incomplete"
        atomics = [a for a in facts.accesses if a.kind == "atomic" and a.space == "global"]
        if not atomics:
            return [], "no global atomics"
        src, root = parse(ctx.preprocessed)
        sites, reasons = [], []
        for array in dict.fromkeys(a.array for a in atomics):
            mine = [a for a in atomics if a.array == array]
            why = self._refusal(facts, mine)
            if why:
                reasons.append(f"`{array}`: {why}")
                continue
            for a in mine:
                call = node_at(src, root, a.span)
                args = call.child_by_field_name("arguments") if call is not None and call.type == "call_expression" else None
                if args is None or args.named_child_count != 2 or call.parent is None or call.parent.type != "expression_statement":
                    reasons.append(f"`{array}`: `{a.text}` uses the atomic's old value")
                    break
                address, value = args.named_children
                if _cast_pointer(address):
                    reasons.append(f"`{array}`: the address of `{a.text}` is cast: the element type it updates is not the array's")
                    break
                counted = a.op == "atomicAdd" and _constant(value)
                sites.append(_Site(a, "kl_aggregated_count" if counted else f"kl_aggregated_{a.op[6:].lower()}"))
        if not sites:
            return [], "; ".join(reasons)
        return sites, "; ".join(reasons)

    def _refusal(self, facts: KernelFacts, mine: list[Access]) -> str | None:
        if any(set(a.via) & _PRIVATE for a in mine):
            # A privatised copy's global atomic is the rare miss of its shared copy: nothing to group.
            return "its atomics are a privatised shared copy's fallback for targets outside it"
        if any(a.op not in _COMBINE for a in mine):
            return f"an atomic other than {', '.join(_COMBINE)}"
        index = mine[0].index
        if not _data_dependent(index, facts.opaque):
            return "its targets do not depend on loaded data (one address per block, or one per thread)"
        if any(_lane_distinct(a.index, dict(facts.opaque)) for a in mine):
            return ("its targets move with the thread's own index: two lanes of a warp never share one, so grouping "
                    "them would only add work")
        return None

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        sites, why = self.plan(ctx)
        if not sites:
            return False, why
        clones = self._clones(ctx, sites)
        if isinstance(clones, str):
            return False, clones
        arrays = ", ".join(dict.fromkeys(f"`{s.access.array}`" for s in sites))
        return True, (f"the atomics onto {arrays} target elements chosen by loaded data, not by the lane: lanes of a "
                      "warp may share one, and any group of lanes that reaches an atomic together combines correctly"
                      + (f"; left as they are: {why}" if why else ""))

    def _clones(self, ctx: RuleContext, sites: list[_Site]):
        src, root = parse(ctx.preprocessed)
        helper_of = {id(s.access): s.helper for s in sites}

        def replace(access: Access, call: Node) -> str:
            address, value = (_text(src, n) for n in call.child_by_field_name("arguments").named_children)
            return f"{helper_of[id(access)]}({address}, {value})"

        return clone_helpers(ctx.facts, src, root, [s.access for s in sites if s.access.via], replace, "", "")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        sites, _ = self.plan(ctx)
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        clones = self._clones(ctx, sites)
        edit = BodyEdit(ctx.preprocessed, facts)
        for s in sites:
            if s.access.via:
                continue
            call = node_at(src, root, s.access.span)
            fn = call.child_by_field_name("function")
            edit.replace(fn.start_byte, fn.end_byte, s.helper)
        for start, end, new in clones.calls:
            edit.replace(start, end, new)
        needed = sorted({s.helper for s in sites})
        helpers = "".join(_COUNT_HELPER if h == "kl_aggregated_count" else _helper("atomic" + h.rsplit("_", 1)[1].capitalize())
                          for h in needed if h not in ctx.source)
        source, expanded = emit(edit, ctx.source, ctx.kernel, helpers + clones.helpers)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        copied = " (their helpers copied for this kernel)" if clones.helpers else ""
        arrays = ", ".join(dict.fromkeys(f"`{s.access.array}`" for s in sites))
        return (Rewrite(source, f"the atomics onto {arrays}{copied} aggregated per warp: the lanes with one target "
                                f"combine their values with shuffles and one of them updates it; same grid and block{note}"),)
