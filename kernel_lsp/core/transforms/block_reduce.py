"""Block reductions: shared-memory trees as warp shuffles, per-element atomics as one atomic per block.

Two transformations on the reductions the analysis finds (:attr:`KernelFacts.reductions`):

:class:`TreeToShuffle` — a shared-memory tree in any of the forms
:func:`~kernel_lsp.core.transforms.tree_model.find_trees` proves (looped of any indexing, unrolled
under template guards, a ``volatile`` warp-synchronous tail in the kernel or in a helper, several
values side by side, in several arrays or in one) is replaced by a butterfly shuffle per warp, one
slot per warp and value in shared memory and a last shuffle in the first warp, which writes each
value's block total to its root slot. The number of blocks never changes, so a per-block output
(``out[blockIdx.x] = sdata[0]``) keeps its size. Legality is the proof's: the block one-dimensional,
a power of two from 32 to 1024 threads at every size of the spec; the tree reached by every thread
(not under a condition, no ``return`` before it, every enclosing loop the same for all threads of
the block), so the new barriers are reached by all; simulated at each size, race-free between warps,
and each slot read afterwards ending with its block's total.

:class:`AtomicToBlockReduce` — ``atomicAdd``, ``atomicMin`` and ``atomicMax`` onto addresses the same
for the whole block (``atomic`` reductions: the address does not depend on the thread), one or several
targets side by side, in the kernel's body or in its ``__device__`` helpers (changed in copies made for
the kernel, :mod:`kernel_lsp.core.transforms.helper_clone`), become per-thread register combines
(started from the operator's identity for the type), reduced in the block with shuffles in one pass,
and one atomic per target and block at the kernel's end. Two more forms: each block runs 8 or 32 of
the original blocks in turn (the grid divided, the original grid the spec's expression in the kernel's
parameters), so there are that many times fewer atomics; or each block leaves its totals in a slot of
``__device__`` memory and the last block to arrive (an ``atomicInc`` that wraps back to 0) combines the
slots into each target once, its hit counts cleared, so each launch starts from the loaded module state.

Legality:
- every access to the array is an atomic statement (its old value unused) of one of those kinds, one
  kind per address, and the kernel accesses the array nowhere else (no order between them to keep);
- the address names only parameters that the kernel never assigns and the block's builtins, and
  reads only arrays the kernel never writes (it is re-evaluated at the kernel's end); in a helper,
  the analysis' index must be such an expression;
- the block has a multiple of 32 threads, at most 1024, at every size of the spec; ``atomicMin`` and
  ``atomicMax`` only on integer types whose identities are known;
- every thread reaches the final reduction: a ``return`` becomes a ``break`` out of a
  ``do { … } while (0)`` around the original body, so none may sit in a loop or ``switch``; a
  kernel with barriers may not return at all (a thread that returned would now wait at them);
- only a block one of whose threads reached an atomic updates its target (``__syncthreads_or``): the
  address may be out of bounds for the others;
- for the blocks in turn: a 1-D grid, no block index read through a cooperative group or a helper.
  A kernel with barriers or shared memory (a tree in the block before its atomic) runs each original
  block's body between barriers: a ``__syncthreads()`` after each one keeps the next from writing the
  shared arrays while this one reads them, and every thread reaches it (the loop's exit depends on
  the block only, and such kernels may not return).

Thread coarsening of a tree is :mod:`kernel_lsp.core.transforms.coarsen_reduce`, privatisation
:mod:`kernel_lsp.core.transforms.privatize`; scans are not rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import node_text as _text, has_node as _has, identifiers_in as _identifiers
from kernel_lsp.core.analysis import Access, KernelFacts, LoopFact, assigned_names, thread_dependence
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.source import Preprocessed
from kernel_lsp.core.rules.base import MAX_THREADS_PER_BLOCK, Rewrite, Rule, RuleContext
from kernel_lsp.core.transforms.counted_loop import counted_loop
from kernel_lsp.core.transforms.emit import (
    WARP_REDUCE, BodyEdit, builtin_fields, emit, node_at, parse, rebuild_span, user_line_of, warp_reduce_helpers,
)
from kernel_lsp.core.analysis import helper_reading_thread_index
from kernel_lsp.core.static_check import problem_sizes
from kernel_lsp.core.transforms.grid_expr import original_grid
from kernel_lsp.core.transforms.helper_clone import HelperEdits, clone_helpers
from kernel_lsp.core.transforms.tree_model import (
    SharedTree, TreeValue, c_index, c_text, find_trees, first_line as _first_line, is_barrier as _is_barrier,
    spec_blocks as _spec_blocks,
)

_BUILTINS = {"threadIdx", "blockIdx", "blockDim", "gridDim"}


class TreeToShuffle(Rule):
    name = "tree-to-shuffle"
    technique = "warp-shuffle-reduction"
    summary = ("a shared-memory reduction tree (looped, unrolled or warp-synchronous, one value or several, over the "
               "block or per group of a warp's lanes) as warp shuffles")

    def plan(self, ctx: RuleContext) -> tuple[list[SharedTree], str]:
        return find_trees(ctx, groups=True)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plans, why = self.plan(ctx)
        if not plans:
            return False, why
        return True, "; ".join(
            f"the tree on {_names(p)} at line {(p.user_line or 0) + 1} reduces every slot into its root at each "
            "block size of the spec (simulated, race-free), every thread reaches it, and only the root is read afterwards"
            if p.values[0].segment is None else
            f"the tree on {_names(p)} at line {(p.user_line or 0) + 1} reduces each group of {p.values[0].segment} lanes "
            "into the group's first slot at each block size of the spec (simulated), every thread of a warp reaches it, "
            "and only those slots are read afterwards, each by its group's first thread"
            for p in plans)

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plans, _ = self.plan(ctx)
        edit = BodyEdit(ctx.preprocessed, ctx.facts)
        ops = set()
        for k, p in enumerate(plans):
            indent = edit.indent_at(p.span[0])
            replace_by_lines(edit, p.span[0], p.span[1], tree_shuffles(ctx, p, k).replace("\n", "\n" + indent))
            ops |= {v.op for v in p.values}
        source, expanded = emit(edit, ctx.source, ctx.kernel, warp_reduce_helpers(ops, ctx.source))
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        what = ", ".join(_names(p) for p in plans)
        how = ("warp shuffles and one slot per warp" if all(p.values[0].segment is None for p in plans)
               else "warp shuffles (within each group of lanes that reduces on its own)")
        return (Rewrite(source, f"the shared-memory tree on {what} replaced by {how}; same grid and block{note}"),)


def _names(tree: SharedTree) -> str:
    return ", ".join(dict.fromkeys(f"`{v.array}`" for v in tree.values))


def value_type(ctx: RuleContext, value: TreeValue) -> str:
    """The type a value is reduced in: the array's element type, or, in a template (whose element
    type the analysis read for one instance), the type of the slot itself."""
    if ctx.kernel.is_template:
        return f"decltype(+{value.name}[0])"
    return " ".join(w for w in value.elem_type.split() if w not in ("volatile", "const"))


def slot(value: TreeValue, thread: str) -> str:
    """The slot of ``value`` that ``thread`` filled."""
    return f"{value.name}[{thread}]" if value.first == Poly() else f"{value.name}[({c_index(value.first)}) + {thread}]"


def tree_shuffles(ctx: RuleContext, tree: SharedTree, k: int) -> str:
    """The statements replacing ``tree``: each value reduced by warp shuffles, its total in its root."""
    if tree.values[0].segment is not None:
        return group_shuffles(ctx, tree)
    if len(tree.values) == 1 and tree.values[0].root == Poly() and tree.values[0].base is None and not ctx.kernel.is_template:
        v = tree.values[0]
        core = _block_reduce(v.op, value_type(ctx, v), slot(v, "threadIdx.x"), f"kl_part{k}", "threadIdx.x", "blockDim.x")
        return ("{ // the tree as warp shuffles: every slot reduced, the total written to the root slot\n"
                f"    __syncthreads();\n    {core}"
                f"    if (threadIdx.x == 0u) {v.name}[0] = kl_total;\n    __syncthreads();\n}}")
    parts = [(v.op, value_type(ctx, v), slot(v, "threadIdx.x"), f"kl_part{k}_{j}", f"kl_total{j}")
             for j, v in enumerate(tree.values)]
    core = block_reduce_many(parts, "threadIdx.x", "blockDim.x")
    stores = " ".join(f"{v.name}[{c_index(v.root)}] = kl_total{j};" for j, v in enumerate(tree.values))
    return ("{ // the tree as warp shuffles: every value reduced, each total written to its root slot\n"
            f"    __syncthreads();\n    {core}"
            f"    if (threadIdx.x == 0u) {{ {stores} }}\n    __syncthreads();\n}}")


#: One butterfly step of each operator between the lanes ``kl_o`` apart (within a group of a power of two).
_BUTTERFLY = {"+": "{v} += __shfl_xor_sync(0xffffffffu, {v}, kl_o);",
              "max": "{v} = max({v}, __shfl_xor_sync(0xffffffffu, {v}, kl_o));",
              "min": "{v} = min({v}, __shfl_xor_sync(0xffffffffu, {v}, kl_o));"}


def group_shuffles(ctx: RuleContext, tree: SharedTree) -> str:
    """The statements replacing a tree per group of S lanes: each thread's slot reduced by a butterfly over
    the lanes of its group (xor offsets below S stay inside it), the group's first thread storing the total
    in its first slot, the one slot read afterwards. Every thread of a warp reaches it (the tree's context
    is the same for a warp's threads), as the full-warp mask needs."""
    segment = tree.values[0].segment
    lines = ["{ // the warp-synchronous tree as shuffles within each group of "
             f"{segment} lanes: each group's total in its first slot"]
    for j, v in enumerate(tree.values):
        lines.append(f"    {value_type(ctx, v)} kl_v{j} = {slot(v, 'threadIdx.x')};")
    steps = " ".join(_BUTTERFLY[v.op].format(v=f"kl_v{j}") for j, v in enumerate(tree.values))
    lines.append(f"    for (int kl_o = {segment // 2}; kl_o > 0; kl_o >>= 1) {{ {steps} }}")
    stores = " ".join(f"{slot(v, 'threadIdx.x')} = kl_v{j};" for j, v in enumerate(tree.values))
    lines += [f"    if ((threadIdx.x & {segment - 1}u) == 0u) {{ {stores} }}", "    __syncwarp();", "}"]
    return "\n".join(lines)


def replace_by_lines(edit: BodyEdit, start: int, end: int, new: str) -> None:
    """``new`` in place of ``start..end`` as one edit per line of that range (the new text on the first),
    so that each maps onto the user's own line where it reads the same and the file's macros stay."""
    src = edit.src
    at, first = start, True
    while at < end:
        stop = src.find(b"\n", at, end)
        stop = end if stop < 0 else stop
        edit.replace(at, stop, new if first else "")
        first = False
        at = stop + 1


def _identity(op: str, part: str, elem: str) -> str:
    # max and min are idempotent: a lane without a warp's total repeats the first one.
    return f"({elem})0" if op == "+" else f"{part}[0]"


def _block_reduce(op: str, elem: str, value: str, part: str, linear: str, nthreads: str) -> str:
    """Statements leaving the block's total of ``value`` in ``kl_total`` of thread 0 (every thread takes part)."""
    fn = WARP_REDUCE[op]
    return (f"__shared__ {elem} {part}[32];\n"
            f"    {elem} kl_total = {fn}(({elem})({value}));\n"
            f"    if (({linear} & 31u) == 0u) {part}[{linear} >> 5] = kl_total;\n"
            f"    __syncthreads();\n"
            f"    if ({linear} < 32u) {{\n"
            f"        kl_total = {linear} < (({nthreads}) >> 5) ? {part}[{linear}] : {_identity(op, part, elem)};\n"
            f"        kl_total = {fn}(kl_total);\n"
            f"    }}\n")


def block_reduce_many(parts: list[tuple[str, str, str, str, str]], linear: str, nthreads: str) -> str:
    """Statements leaving each value's block total in its variable in thread 0: ``parts`` are (operator,
    type, value, shared array for the warps' totals, total variable); one barrier for them all."""
    lines = []
    for op, elem, value, part, total in parts:
        lines += [f"__shared__ {elem} {part}[32];", f"{elem} {total} = {WARP_REDUCE[op]}(({elem})({value}));"]
    stores = " ".join(f"{part}[{linear} >> 5] = {total};" for _, _, _, part, total in parts)
    lines += [f"if (({linear} & 31u) == 0u) {{ {stores} }}", "__syncthreads();", f"if ({linear} < 32u) {{"]
    for op, elem, _, part, total in parts:
        lines += [f"    {total} = {linear} < (({nthreads}) >> 5) ? {part}[{linear}] : {_identity(op, part, elem)};",
                  f"    {total} = {WARP_REDUCE[op]}({total});"]
    lines.append("}")
    return "\n    ".join(lines) + "\n"


#: The atomics a register combine replaces, with the combine's operator.
ATOMIC_OPS = {"atomicAdd": "+", "atomicMin": "min", "atomicMax": "max"}
#: (largest, smallest) value of the integer types atomicMin and atomicMax take: the identities of min and max.
_LIMITS = {
    "int": ("2147483647", "(-2147483647 - 1)"),
    "unsigned int": ("0xffffffffu", "0u"),
    "unsigned": ("0xffffffffu", "0u"),
    "long long": ("9223372036854775807LL", "(-9223372036854775807LL - 1)"),
    "long long int": ("9223372036854775807LL", "(-9223372036854775807LL - 1)"),
    "unsigned long long": ("0xffffffffffffffffull", "0ull"),
    "unsigned long long int": ("0xffffffffffffffffull", "0ull"),
}


def identity(op: str, elem: str) -> str | None:
    """The value that ``op`` leaves any value of ``elem`` unchanged with, or None when not known."""
    if op == "+":
        return f"({elem})0"
    limits = _LIMITS.get(" ".join(elem.split()))
    return None if limits is None else limits[0 if op == "min" else 1]


def combine(op: str, acc: str, value: str) -> str:
    return f"{acc} += {value}" if op == "+" else f"{acc} = {op}({acc}, {value})"


def deferred(op: str, k: int, elem: str, value: str) -> str:
    """What an atomic statement's call becomes: the value combined into the thread's register, the hit noted.
    A comma expression without parentheses (the call is a whole statement), which tree-sitter reads too."""
    return f"{combine(op, f'kl_acc{k}', f'({elem})({value})')}, kl_hit{k} = true"


@dataclass(frozen=True)
class _Target:
    array: str
    elem_type: str
    address: str
    """The atomics' address as written (re-evaluated at the kernel's end), or rebuilt from the analysis'
    index when the atomics are in a helper."""
    calls: tuple[tuple[int, int, str], ...]
    """Each atomic call in the kernel's body: its byte range and the value it adds."""
    op: str = "+"
    atomic: str = "atomicAdd"
    accesses: tuple[Access, ...] = ()


class AtomicToBlockReduce(Rule):
    """Atomics onto addresses the same for the whole block (``atomicAdd``, ``atomicMin``, ``atomicMax``,
    several targets side by side, in the kernel or in its helpers) as per-thread register combines,
    a block reduction and one atomic per target and block."""

    name = "atomic-to-block-reduce"
    technique = "one-atomic-per-block"
    summary = "atomics onto one address per block: combined in registers, reduced in the block, one atomic per block"

    def plan(self, ctx: RuleContext) -> tuple[list[_Target], str]:
        facts = ctx.facts
        if facts is None or not facts.complete:
            return [], "the kernel's analysis is missing or incomplete"
        arrays = list(dict.fromkeys(r.target for r in facts.reductions if r.kind == "atomic"))
        if not arrays:
            return [], "no atomics onto an address that is the same for every thread of the block"
        if ctx.spec is None:
            return [], "needs a launch spec (the block must be whole warps at every size)"
        blocks = _spec_blocks(ctx)
        counts = sorted({b[0] * b[1] * b[2] for b in blocks})
        if not counts or any(n % 32 or n > MAX_THREADS_PER_BLOCK for n in counts):
            return [], f"the block ({', '.join(map(str, counts))} threads) is not whole warps at every size"
        src, root = parse(ctx.preprocessed)
        kernel = node_at(src, root, facts.span)
        body = kernel.child_by_field_name("body") if kernel is not None else None
        if body is None:
            return [], "the kernel's definition was not found in the preprocessed view"
        why = _exits_refusal(body, src, facts.syncs, ctx.preprocessed)
        if why:
            return [], why
        params = {name for name, _, _ in facts.params} - assigned_names(body, src)
        plans, reasons = [], []
        for array in arrays:
            mine = [a for a in facts.accesses if a.array == array]
            if any(a.kind != "atomic" or a.op not in ATOMIC_OPS for a in mine):
                reasons.append(f"`{array}` is also read, written or updated by other atomics than atomicAdd, atomicMin "
                               "or atomicMax: their order against the deferred combine is not kept")
                continue
            groups: dict[Poly, list[Access]] = {}
            for a in mine:
                groups.setdefault(a.index, []).append(a)
            for index, group in groups.items():
                found = self._target(ctx, facts, array, index, group, params, src, root)
                (reasons if isinstance(found, str) else plans).append(found)
        if reasons:
            return [], "; ".join(reasons)
        return plans, ""

    def _target(self, ctx, facts: KernelFacts, array: str, index: Poly, group: list[Access], params: set[str],
                src: bytes, root: Node) -> _Target | str:
        if thread_dependence(index, facts.opaque) or any(s.startswith("tid.") for s in index.symbols):
            return f"the atomics onto `{array}` at `{group[0].text}` do not all target one address per block"
        ops = {a.op for a in group}
        if len(ops) != 1:
            return f"the atomics onto `{array}` at one address are {' and '.join(sorted(ops))}: no one combine"
        atomic = group[0].op
        op = ATOMIC_OPS[atomic]
        elem = " ".join(w for w in group[0].elem_type.split() if w not in ("volatile", "const"))
        if identity(op, elem) is None:
            return f"{atomic} onto `{array}` of `{elem}`: no identity of `{op}` is known for that type"
        calls, addresses = [], set()
        for a in group:
            call = node_at(src, root, a.span)
            args = call.child_by_field_name("arguments") if call is not None and call.type == "call_expression" else None
            if args is None or args.named_child_count != 2 or call.parent is None or call.parent.type != "expression_statement":
                return f"`{a.text}` at line {(a.user_line or 0) + 1} uses the atomic's old value"
            address, value = args.named_children
            if _cast_pointer(address):
                return f"the address of `{a.text}` is cast: the element type it adds is not the array's"
            if a.via:
                continue
            addresses.add(_text(src, address).replace(" ", ""))
            names = _identifiers(address, src)
            if names - params - _BUILTINS:
                return (f"the address of `{a.text}` names {', '.join(sorted(names - params - _BUILTINS))}, "
                        "not an unassigned parameter or builtin: it cannot be re-evaluated at the kernel's end")
            loaded = (names & {n for n, _, is_pointer in facts.params if is_pointer}) - {array} - set(facts.read_only)
            if loaded:
                return (f"the address of `{a.text}` reads {', '.join(sorted(loaded))}, which the kernel may "
                        "write: it may differ at the kernel's end")
            calls.append((a.span[0], a.span[1], _text(src, value)))
        if len(addresses) > 1:
            return f"the atomics onto `{array}` are written with different addresses"
        if addresses:
            first = next(a for a in group if not a.via)
            address_text = _text(src, node_at(src, root, first.span).child_by_field_name("arguments").named_children[0])
        else:
            # Only in helpers: the address from the analysis' index, in the kernel's own terms.
            scalars = {n for n, _, is_pointer in facts.params if not is_pointer} & params
            if any(s not in scalars and not s.startswith(("bid.", "bdim.", "gdim.")) for s in index.symbols):
                return (f"the index of `{group[0].text}` in the helper `{group[0].via[-1]}` is not an expression of the "
                        "kernel's unassigned parameters and block indices")
            address_text = f"&{array}[{c_text(index)}]"
        return _Target(array, elem, address_text, tuple(calls), op, atomic, tuple(group))

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plans, why = self.plan(ctx)
        if not plans:
            return False, why
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        clones = self._clones(plans, facts, src, root)
        if isinstance(clones, str):
            return False, clones
        return True, "; ".join(
            f"every atomic onto `{p.array}` at `{p.address}` is an {p.atomic}, the same address for the whole block, "
            "its old value unused, the array touched nowhere else" for p in plans) + "; every thread reaches the kernel's end"

    def _clones(self, plans: list[_Target], facts: KernelFacts, src: bytes, root: Node):
        in_helpers = [(k, p) for k, p in enumerate(plans) if any(a.via for a in p.accesses)]
        if not in_helpers:
            return HelperEdits("", ())
        params = ", ".join(f"{p.elem_type}& kl_acc{k}, bool& kl_hit{k}" for k, p in in_helpers)
        args = ", ".join(f"kl_acc{k}, kl_hit{k}" for k, _ in in_helpers)
        slot = {id(a): k for k, p in in_helpers for a in p.accesses}

        def replace(access: Access, call: Node) -> str:
            k = slot[id(access)]
            p = plans[k]
            value = _text(src, call.child_by_field_name("arguments").named_children[1])
            return deferred(p.op, k, p.elem_type, value)

        atomics = [a for _, p in in_helpers for a in p.accesses if a.via]
        return clone_helpers(facts, src, root, atomics, replace, params, args)

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plans, _ = self.plan(ctx)
        out = [self._rewrite(ctx, plans, None)]
        slots = self._slots(ctx)
        if slots is not None:
            out.append(self._rewrite(ctx, plans, None, slots))
        grid, why = self._coarsening(ctx)
        if grid is not None:
            main = ctx.spec.launch.grid  # type: ignore[union-attr]
            for k in BLOCKS_PER_BLOCK:
                override = {"grid": [f"(({main[0]}) + {k - 1}) / {k}", main[1], main[2]],
                            "block": list(ctx.spec.launch.block), "dynamic_smem": ctx.spec.launch.dynamic_smem}  # type: ignore[union-attr]
                if all(launch.grid[0] >= 2 * k for launch in ctx.launches()[:1]) and ctx.launch_ok(override):
                    out.append(self._rewrite(ctx, plans, (k, grid, override)))
        return tuple(out)

    @staticmethod
    def _slots(ctx: RuleContext) -> int | None:
        """Slots of device memory for the blocks' totals: the spec's largest grid, to a power of two (a block
        past them at another size adds atomically as before); None beyond :data:`MAX_SLOTS`."""
        blocks = [launch.grid[0] * launch.grid[1] * launch.grid[2] for launch in ctx.launches()]
        if not blocks:
            return None
        slots = 1 << max(0, (max(blocks) - 1).bit_length())
        # A literal equal to one of the spec's sizes would read as that size written into the kernel.
        while slots in problem_sizes(ctx.spec):  # type: ignore[arg-type]
            slots *= 2
        return slots if slots <= MAX_SLOTS else None

    def _last_block(self, ctx: RuleContext, plans: list[_Target], slots: int, threads: str) -> str:
        """Each block's totals to its slot (a block past the slots adds its own atomically, as before); the
        block whose arrival completes the count combines the slots and updates each target once. The
        counter's ``atomicInc`` wraps back to 0 on that arrival, and the last block clears the hit counts,
        so every launch starts from the state the module was loaded with."""
        name = ctx.kernel.name
        parts = [(p.op, p.elem_type, f"kl_acc{k}", f"kl_part{k}", f"kl_total{k}") for k, p in enumerate(plans)]
        final = [(p.op, p.elem_type, f"kl_gather{k}", f"kl_fpart{k}", f"kl_final{k}") for k, p in enumerate(plans)]
        lines = [f"const int kl_any{k} = __syncthreads_or(kl_hit{k});" for k in range(len(plans))]
        lines.append("{ // the block's totals to its slot; the last block to finish combines the slots into the targets")
        inner = block_reduce_many(parts, "kl_t", threads).rstrip().split("\n    ")
        inner += ["__shared__ bool kl_last;",
                  "const unsigned kl_b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);",
                  "const unsigned kl_nb = gridDim.x * gridDim.y * gridDim.z;",
                  "if (kl_t == 0u) {"]
        for k, p in enumerate(plans):
            inner += [f"    if (kl_b < {slots}u) kl_slots_{name}_{k}[kl_b] = kl_any{k} ? kl_total{k} : {identity(p.op, p.elem_type)};",
                      f"    else if (kl_any{k}) {p.atomic}({p.address}, kl_total{k});",
                      f"    if (kl_any{k}) atomicAdd(&kl_hits_{name}_{k}, 1u);"]
        inner += ["    __threadfence();", f"    kl_last = atomicInc(&kl_done_{name}, kl_nb - 1u) == kl_nb - 1u;", "}",
                  "__syncthreads();", "if (kl_last) {"]
        for k, p in enumerate(plans):
            inner += [f"    {p.elem_type} kl_gather{k} = {identity(p.op, p.elem_type)};",
                      f"    for (unsigned kl_j = kl_t; kl_j < kl_nb && kl_j < {slots}u; kl_j += {threads})",
                      f"        {combine(p.op, f'kl_gather{k}', f'__ldcg(&kl_slots_{name}_{k}[kl_j])')};"]
        inner += ["    " + line for line in block_reduce_many(final, "kl_t", threads).rstrip().split("\n    ")]
        inner.append("    if (kl_t == 0u) {")
        for k, p in enumerate(plans):
            inner.append(f"        if (atomicExch(&kl_hits_{name}_{k}, 0u) != 0u) {{ {p.elem_type}* kl_at = {p.address}; "
                         f"*kl_at = {_combined(p.op, '__ldcg(kl_at)', f'kl_final{k}')}; }}")
        inner += ["    }", "}"]
        lines += ["    " + line for line in inner] + ["}"]
        return "\n".join("    " + line for line in lines)

    def _coarsening(self, ctx: RuleContext) -> tuple[str | None, str]:
        """The original grid's x extent as C over the kernel's parameters when a block may run several of
        the original blocks in turn (fewer blocks, fewer atomics), else why not."""
        facts = ctx.facts
        if any(launch.grid[1:] != (1, 1) for launch in ctx.launches()):
            return None, "the grid is not one-dimensional at every size"
        if any(s.startswith(("bid.y", "bid.z", "gdim.y", "gdim.z")) for s in facts.thread_dims):
            return None, "the kernel reads a block index along y or z"
        src, root = parse(ctx.preprocessed)
        if facts.implicit_indices and any(
                call not in facts.group_values or any(s.startswith(("bid.", "gdim.")) for s in facts.group_values[call].symbols)
                for call in facts.implicit_indices):
            return None, "the kernel reads an index through a cooperative group that may be its block's"
        if (helper := helper_reading_thread_index(facts, root, src)) is not None:
            return None, f"the helper `{helper}` reads the thread or block index itself"
        kernel = node_at(src, root, facts.span)
        assigned = assigned_names(kernel.child_by_field_name("body"), src) if kernel is not None else set()
        params = {name for name, _, is_pointer in facts.params if not is_pointer and ctx.spec_scalar(name)} - assigned
        return original_grid(ctx, params)

    def _rewrite(self, ctx: RuleContext, plans: list[_Target], blocks, last: int | None = None) -> Rewrite:  # noqa: ANN001
        """The rewrite; with ``blocks`` = (k, the original grid as C, the new launch), each block also runs k
        of the original blocks in turn, its registers carrying their combines to one atomic; with ``last``,
        the blocks' totals go to that many slots of device memory and the last block combines them."""
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        clones = self._clones(plans, facts, src, root)
        edit = BodyEdit(ctx.preprocessed, facts)
        lo, hi = facts.body_span
        decls = "".join(f"    {p.elem_type} kl_acc{k} = {identity(p.op, p.elem_type)};\n    bool kl_hit{k} = false;\n"
                        for k, p in enumerate(plans))
        if blocks is None:
            edit.insert(lo + 1, f"\n{decls}    do {{ // the original body; a return leaves it for the block's sums")
        else:
            k, grid, _ = blocks
            # Unrolled, the original blocks' loads are in flight together.
            edit.insert(lo + 1, f"\n{decls}    #pragma unroll {min(k, 8)}\n"
                                f"    for (unsigned kl_j = 0u; kl_j < {k}u; ++kl_j) {{ // {k} of the original blocks in turn\n"
                                f"    const unsigned kl_vbid = blockIdx.x * {k}u + kl_j;\n"
                                f"    if (kl_vbid >= (unsigned)({grid})) break;\n"
                                "    do { // the original body; a return leaves it for the next block")
            start = root.descendant_for_byte_range(lo, hi) or root
            for node, new_text in builtin_fields(src, start, lo, hi, {("blockIdx", "x"): "kl_vbid",
                                                                       ("gridDim", "x"): f"((unsigned)({grid}))"}):
                edit.replace(node.start_byte, node.end_byte, new_text)
        for k, p in enumerate(plans):
            for start, end, value in p.calls:
                edit.replace(start, end, deferred(p.op, k, p.elem_type, value))
        for start, end, new in clones.calls:
            edit.replace(start, end, new)
        kernel = node_at(src, root, facts.span)
        for ret in _returns(kernel.child_by_field_name("body")):
            edit.replace(ret.start_byte, ret.end_byte, "break;")
        if blocks is None:
            close = "    } while (0);"
        elif facts.syncs or any(a.space == "shared" for a in facts.accesses):
            # The next original block writes the shared arrays this one may still be reading; every thread
            # gets here (a return only leaves the do … while, and kernels with barriers have none).
            close = "    } while (0);\n    __syncthreads(); // the next original block reuses the shared arrays\n    }"
        else:
            close = "    } while (0);\n    }"
        tail = [close,
                "    const unsigned kl_t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);"]
        threads = "blockDim.x * blockDim.y * blockDim.z"
        scratch = ""
        if last is not None:
            tail.append(self._last_block(ctx, plans, last, threads))
            scratch = "".join(f"__device__ {p.elem_type} kl_slots_{ctx.kernel.name}_{k}[{last}];\n"
                              f"__device__ unsigned int kl_hits_{ctx.kernel.name}_{k} = 0u;\n" for k, p in enumerate(plans))
            scratch += f"__device__ unsigned int kl_done_{ctx.kernel.name} = 0u;\n"
        elif len(plans) == 1:
            p = plans[0]
            core = _block_reduce(p.op, p.elem_type, "kl_acc0", "kl_part0", "kl_t", threads)
            # Only a block one of whose threads reached the atomic touches the address (it may be out of
            # bounds for the others).
            tail.append("    if (__syncthreads_or(kl_hit0)) { // one atomic per block\n        "
                        + core.replace("\n", "\n    ").rstrip() + "\n"
                        f"        if (kl_t == 0u) {p.atomic}({p.address}, kl_total);\n    }}")
        else:
            # Every target's combine in one pass (one barrier for the warps' totals); a target's atomic only
            # where one of the block's threads reached it.
            tail += [f"    const int kl_any{k} = __syncthreads_or(kl_hit{k});" for k in range(len(plans))]
            parts = [(p.op, p.elem_type, f"kl_acc{k}", f"kl_part{k}", f"kl_total{k}") for k, p in enumerate(plans)]
            tail.append("    { // one atomic per target and block\n        "
                        + block_reduce_many(parts, "kl_t", threads).replace("\n", "\n    ").rstrip() + "\n"
                        "        if (kl_t == 0u) {\n"
                        + "".join(f"            if (kl_any{k}) {p.atomic}({p.address}, kl_total{k});\n" for k, p in enumerate(plans))
                        + "        }\n    }")
        edit.insert(hi - 1, "\n".join(tail) + "\n")
        source, expanded = emit(edit, ctx.source, ctx.kernel,
                                scratch + clones.helpers + warp_reduce_helpers({p.op for p in plans}, ctx.source))
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        what = ", ".join(dict.fromkeys(f"`{p.array}`" for p in plans))
        helpers = " (their helpers copied for this kernel)" if clones.helpers else ""
        verbs = sorted({p.atomic for p in plans})
        if last is not None:
            return Rewrite(source, f"the atomics onto {what}{helpers} ({', '.join(verbs)}) combined per thread and in the "
                                   f"block, each block's totals kept in {last} slots of device memory, the last block to "
                                   "finish combining them into the target once (its counter back at 0 after every launch); "
                                   f"same grid and block{note}", variant="last-block")
        if blocks is None:
            if verbs == ["atomicAdd"]:
                return Rewrite(source, f"the atomics onto {what}{helpers} summed per thread, reduced in the block with warp "
                                       f"shuffles, one atomicAdd per block; same grid and block{note}")
            return Rewrite(source, f"the atomics onto {what}{helpers} ({', '.join(verbs)}) combined per thread, reduced in "
                                   f"the block with warp shuffles, one atomic per target and block; same grid and block{note}")
        k, grid, override = blocks
        return Rewrite(source, f"the atomics onto {what}{helpers} ({', '.join(verbs)}) combined per thread over {k} of the "
                               f"original blocks in turn (the grid `{grid}` divided by {k}), reduced in the block with warp "
                               f"shuffles, one atomic per target and block{note}", override, variant=f"blocks={k}",
                       grid_divide=(k, 1, 1))


#: Most blocks whose totals the last-block variant of :class:`AtomicToBlockReduce` keeps in device memory.
MAX_SLOTS = 1 << 16


def _combined(op: str, a: str, b: str) -> str:
    return f"{a} + {b}" if op == "+" else f"{op}({a}, {b})"


#: Original blocks one block runs in turn, in the block-coarsened variants of :class:`AtomicToBlockReduce`.
BLOCKS_PER_BLOCK = (8, 32)






def _cast_pointer(address: Node) -> bool:
    """The atomic's address is itself a cast (``(T*)&a[i]``): it adds another element type than the array's."""
    while address.type == "parenthesized_expression" and address.named_children:
        address = address.named_children[0]
    return address.type == "cast_expression"


def _returns(body: Node) -> list[Node]:
    found, stack = [], [body]
    while stack:
        n = stack.pop()
        if n.type == "return_statement":
            found.append(n)
        stack.extend(n.children)
    return found


def _exits_refusal(body: Node, src: bytes, syncs: int, pre: Preprocessed) -> str | None:
    """Why a ``return`` cannot become a ``break`` out of a ``do … while (0)`` around the body, or None."""
    for ret in _returns(body):
        if ret.named_child_count:
            return "a return with a value"
        p = ret.parent
        while p is not None and p != body:
            if p.type in ("for_statement", "while_statement", "do_statement", "switch_statement"):
                return f"a return inside a loop or switch (line {user_line_of(pre, ret.start_point[0])}) cannot leave the body by a break"
            p = p.parent
        if syncs:
            return "a return in a kernel with barriers: the threads that left would now reach the original's barriers"
    if _has(body, ("goto_statement",)):
        return "a goto in the kernel"
    return None


# --------------------------------------------------------------------------------------------
# A tree per tile of a loop: the tiles summed in registers, one block reduction after the loop
# --------------------------------------------------------------------------------------------

#: Independent partial sums per thread in the accumulation loop (its loads are in flight together).
_PARTIALS = 4


@dataclass(frozen=True)
class _Hoist:
    tree: SharedTree
    loop: LoopFact
    loop_node: Node
    decls: tuple[Node, ...]
    """The declarations of the loop's body before the slot's store (the slot's value reads them)."""
    value: Node
    """The value each thread stores in its slot of the tree."""
    consumer: Node
    """The statement that folds the tree's root into the accumulator (``if (tid == 0) total += buf[0];``)."""
    root: Access
    start: Node
    bound: Node
    step: Node


class TreeToRegisters(Rule):
    """A shared-memory tree per iteration of a loop (a tile loaded, reduced, its root added to an
    accumulator by thread 0) as a per-thread register sum over all the iterations (four partial sums),
    then one block reduction by warp shuffles, added to the accumulator once.

    Legality, in terms of the analysis: the tree is :class:`TreeToShuffle`'s (simulated a reduction of
    every slot into slot 0 at each block size, reached by every thread, only the root read after it),
    with ``+``; its loop runs the same iterations in every thread (start, bound and step uniform);
    in that loop the array is written only at the thread's own slot, by a statement at the top of the
    loop's body whose value reads only the loop's variable, locals declared before it there and
    arrays the kernel does not write; the root is read once, to add it to an accumulator of the loop,
    and only by thread 0; the loop's body holds nothing else but barriers."""

    name = "tree-to-registers"
    technique = "warp-shuffle-reduction"
    summary = "a tree per tile of a loop: tiles summed in registers, one warp-shuffle block reduction after the loop"

    def plan(self, ctx: RuleContext) -> tuple[_Hoist | None, str]:
        trees, why = TreeToShuffle().plan(ctx)
        if not trees:
            return None, why
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        reasons = []
        for tree in trees:
            found = self._hoist(ctx, facts, tree, src, root)
            if isinstance(found, str):
                reasons.append(f"the tree on `{tree.array}`: {found}")
            else:
                return found, ""
        return None, "; ".join(reasons)

    def _hoist(self, ctx, facts: KernelFacts, tree: SharedTree, src: bytes, root: Node) -> _Hoist | str:
        if tree.loop is None or len(tree.values) != 1 or tree.values[0].root != Poly() or tree.values[0].base is not None:
            return "it is not one loop reducing one value into slot 0"
        if tree.op != "+":
            return f"its operator `{tree.op}` (only sums are regrouped over the iterations)"
        if tree.loop.parent is None:
            return "it is in no loop (tree-to-shuffle rewrites it alone)"
        loop = facts.loops[tree.loop.parent]
        node = node_at(src, root, loop.span)
        # The rewrite replaces the loop by loops of its own counter: the original's is never stepped.
        counted, why = counted_loop(loop, node, facts.body_span, src)
        if counted is None:
            return f"its loop: {why}"
        if counted.start is None:
            return f"its loop's counter `{loop.var}` is set before the loop (the sums' loops start where its header does)"
        if None in (loop.start, loop.step, loop.bound):
            return "its loop's start, step or bound is not known"
        if any(thread_dependence(p, facts.opaque) for p in (loop.start, loop.step, loop.bound)):
            return "its loop runs different iterations in different threads"
        header = _header(node, loop.var, src)
        if header is None:
            return "its loop's bound or step is not known from its header (the counter tested with `<`, stepped by `+=`)"
        start, bound, step = header
        body = node.child_by_field_name("body")
        stmts = [c for c in body.named_children if c.type != "comment"] if body.type == "compound_statement" else [body]
        tree_node = node_at(src, root, tree.loop.span)
        if tree_node not in stmts:
            return "the tree is nested deeper than its loop's body"
        at = stmts.index(tree_node)
        before, after = stmts[:at], stmts[at + 1:]
        inside = [a for a in facts.accesses if loop.span[0] <= a.span[0] < loop.span[1]]
        slot_writes = [a for a in inside if a.array == tree.array and a.writes and not tree.loop.span[0] <= a.span[0] < tree.loop.span[1]]
        roots = [a for a in inside if a.array == tree.array and a.reads and a.span[0] >= tree.loop.span[1]]
        if len(slot_writes) != 1 or slot_writes[0].kind != "write" or slot_writes[0].index != Poly.sym("tid.x"):
            return "its array is not written once per iteration, at the thread's own slot, outside the tree"
        if any(a.writes and a.space == "global" for a in inside):
            return "its loop writes global memory"
        write = slot_writes[0]
        write_stmt = next((s for s in before if s.start_byte <= write.span[0] < s.end_byte), None)
        if write_stmt is None or write_stmt.type != "expression_statement":
            return "the slot's store is nested deeper than the loop's body, or follows the tree"
        # The tree's own array, or any shared array, declared in the loop is not copied into the sums.
        decls = tuple(s for s in before if s.type == "declaration" and "__shared__" not in _text(src, s)
                      and tree.values[0].name not in _identifiers(s, src))
        for s in before:
            if s is write_stmt or s.type == "declaration" or _is_barrier(s, src, facts):
                continue  # a declaration of the tree's array or of another shared array stays where it is
            return f"the loop also runs `{_first_line(_text(src, s))}` before the tree, besides declaring locals and filling the slot"
        if any(a.writes for a in inside if any(d.start_byte <= a.span[0] < d.end_byte for d in decls)):
            return "a declaration before the slot's store writes memory"
        assign = write_stmt.named_children[0]
        value = assign.child_by_field_name("right") if assign.type == "assignment_expression" else None
        if value is None or _text(src, assign.child_by_field_name("operator")) != "=":
            return "the slot is updated in place, not stored once"
        if any(a.space == "shared" and value.start_byte <= a.span[0] < value.end_byte for a in inside):
            return "the slot's value reads shared memory (only the slot's own array is regrouped)"
        others = [s for s in after if not _is_barrier(s, src, facts)]
        if len(roots) != 1 or len(others) != 1 or not others[0].start_byte <= roots[0].span[0] < others[0].end_byte:
            return "the root is not read once, by one statement after the tree"
        consumer, root_read = others[0], roots[0]
        if not _read_by_thread_zero(facts, root_read):
            return "the root is read by threads other than thread 0"
        accumulator = next((r for r in facts.reductions if r.kind == "accumulator" and r.loop == loop.id and r.op == "+"), None)
        if accumulator is None or _identifiers(consumer, src) - {accumulator.target, tree.values[0].name} - _identifiers_of_condition(consumer, src):
            return "the root is not added to a sum the loop accumulates"
        return _Hoist(tree, loop, node, decls, value, consumer, root_read, start, bound, step)

    def check(self, ctx: RuleContext) -> tuple[bool, str]:
        plan, why = self.plan(ctx)
        if plan is None:
            return False, why
        return True, (f"the tree on `{plan.tree.array}` sums every slot each iteration of the loop at line "
                      f"{(plan.loop.user_line or 0) + 1} and only thread 0 adds its root to a sum: the iterations' values "
                      "can be summed per thread first")

    def rewrite(self, ctx: RuleContext) -> tuple[Rewrite, ...]:
        plan, _ = self.plan(ctx)
        assert plan is not None
        facts = ctx.facts
        src, root = parse(ctx.preprocessed)
        elem, var = value_type(ctx, plan.tree.values[0]), plan.loop.var
        indent = BodyEdit(ctx.preprocessed, facts).indent_at(plan.loop.span[0])

        def copies(text, at: str) -> str:
            """The loop body's declarations and the slot's value with the loop variable at ``at``."""
            def with_var(node: Node) -> str:
                subs = [(n.start_byte, n.end_byte, f"({at})") for n in _identifier_nodes(node, src) if _text(src, n) == var]
                return text(node.start_byte, node.end_byte, subs)
            return " ".join(with_var(d) for d in plan.decls), with_var(plan.value)

        def build(text) -> str:
            step = text(plan.step.start_byte, plan.step.end_byte)
            bound = text(plan.bound.start_byte, plan.bound.end_byte)
            start = text(plan.start.start_byte, plan.start.end_byte)
            lines = [f"{{ // each thread sums its values of every iteration ({_PARTIALS} partial sums), then one block reduction",
                     f"    {elem} " + ", ".join(f"kl_a{k} = ({elem})0" for k in range(_PARTIALS)) + ";",
                     f"    auto kl_b = {start};",
                     f"    for (; kl_b + {_PARTIALS - 1} * ({step}) < ({bound}); kl_b += {_PARTIALS} * ({step})) {{"]
            for k in range(_PARTIALS):
                decls, value = copies(text, f"kl_b + {k} * ({step})" if k else "kl_b")
                lines.append(f"        {{ {decls} kl_a{k} += ({elem})({value}); }}".replace("{  ", "{ "))
            decls, value = copies(text, "kl_b")
            lines += ["    }",
                      f"    for (; kl_b < ({bound}); kl_b += ({step})) {{ {decls} kl_a0 += ({elem})({value}); }}".replace("{  ", "{ "),
                      "    " + _block_reduce("+", elem, " + ".join(f"kl_a{k}" for k in range(_PARTIALS)), "kl_part", "threadIdx.x",
                                             "blockDim.x").rstrip(),
                      "    " + text(plan.consumer.start_byte, plan.consumer.end_byte,
                                    [(plan.root.span[0], plan.root.span[1], "kl_total")]),
                      "}"]
            return ("\n" + indent).join(lines)

        helpers = warp_reduce_helpers({"+"}, ctx.source)
        source, expanded = rebuild_span(ctx.preprocessed, facts, ctx.source, ctx.kernel, plan.loop.span, build, helpers)
        note = " (the kernel's body with its macros expanded)" if expanded and ctx.preprocessed.macros else ""
        return (Rewrite(source, f"the tree on `{plan.tree.array}` per iteration replaced by {_PARTIALS} register sums per "
                                f"thread over the loop and one warp-shuffle block reduction; same grid and block{note}"),)


def _header(node: Node, var: str, src: bytes) -> tuple[Node, Node, Node] | None:
    """(start, bound, step) expressions of ``for (T var = start; var < bound; var += step)``."""
    init, cond, update = (node.child_by_field_name(f) for f in ("initializer", "condition", "update"))
    start = None
    if init is not None and init.type == "declaration":
        decls = init.children_by_field_name("declarator")
        start = decls[0].child_by_field_name("value") if len(decls) == 1 and decls[0].type == "init_declarator" else None
    elif init is not None and init.type == "assignment_expression":
        start = init.child_by_field_name("right")
    if start is None or cond is None or cond.type != "binary_expression" or _text(src, cond.child_by_field_name("operator")) != "<":
        return None
    left = cond.child_by_field_name("left")
    if left is None or _text(src, left) != var:
        return None
    if update is None or update.type != "assignment_expression" or _text(src, update.child_by_field_name("operator")) != "+=" \
            or _text(src, update.child_by_field_name("left")) != var:
        return None
    return start, cond.child_by_field_name("right"), update.child_by_field_name("right")


def _read_by_thread_zero(facts: KernelFacts, access: Access) -> bool:
    """Some guard of ``access`` proves ``threadIdx.x == 0`` (on a 1-D block: thread 0 alone)."""
    tid = Poly.sym("tid.x")
    return any(c.op == "==" and {c.left, c.right} == {tid, Poly()} for c in facts.constraints(access))


def _identifiers_of_condition(stmt: Node, src: bytes) -> set[str]:
    cond = stmt.child_by_field_name("condition") if stmt.type == "if_statement" else None
    return _identifiers(cond, src) if cond is not None else set()


def _identifier_nodes(node: Node, src: bytes) -> list[Node]:
    found, stack = [], [node]
    while stack:
        n = stack.pop()
        if n.type == "identifier":
            found.append(n)
        elif n.type == "field_expression":
            arg = n.child_by_field_name("argument")
            if arg is not None:
                stack.append(arg)
            continue
        stack.extend(n.children)
    return found
