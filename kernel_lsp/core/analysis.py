"""What a kernel means: every memory access, its index as a polynomial, loops and reductions.

The analysis reads the preprocessed view (:mod:`kernel_lsp.core.source`), so a body written as a
macro or split into ``__device__`` helpers is seen whole: helpers defined in the file are
inlined for analysis (up to :data:`_MAX_INLINE_DEPTH` deep), their pointer parameters bound to
the caller's arrays.

For every subscript of a pointer parameter, a local pointer into one, a ``__shared__`` array or
a local array it records an :class:`Access`: the array, read / write / update / atomic, and the
index as a :class:`~kernel_lsp.core.poly.Poly` over ``tid.*``, ``bid.*``, ``bdim.*``, ``gdim.*``,
scalar parameters and loop iteration counters. Anything it cannot model (a value loaded from
memory, a division by a variable, a variable assigned in a branch) becomes an opaque term that
remembers whether it depends on the thread index: a gather is reported as a gather, never
guessed as coalesced.

:func:`bind` then evaluates the accesses under a launch (a spec's block shape and scalar values):
for the 32 lanes of a warp it computes the addresses, hence the 32-byte sectors one request
touches, and names the pattern (coalesced, strided, broadcast, gather). Pure: no IO.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from tree_sitter import Node, Parser

from kernel_lsp.core.consteval import TYPE_SIZES_BYTES, evaluate_int
from kernel_lsp.core.parse import CUDA_LANGUAGE
from kernel_lsp.core.poly import ONE, ZERO, Poly, is_opaque
from kernel_lsp.core.source import Preprocessed

_MAX_INLINE_DEPTH = 3
_MAX_EXPR_DEPTH = 150
"""Expression nesting the walk follows by recursion; deeper parts are scanned flat."""
_MAX_NODES = 200_000
"""Expression nodes visited per kernel before the analysis stops (a generated 50,000-line kernel
must not hold a worker for minutes); what was not reached is reported as not modelled."""
_WARP = 32
_SECTOR_BYTES = 32
_BUILTINS = {"threadIdx": "tid", "blockIdx": "bid", "blockDim": "bdim", "gridDim": "gdim"}
_WIDE_TYPES = ("long", "size_t", "int64_t", "uint64_t", "ptrdiff_t", "intptr_t", "uintptr_t", "long long")
_SHUFFLES = ("__shfl_sync", "__shfl_down_sync", "__shfl_up_sync", "__shfl_xor_sync", "__shfl", "__shfl_down",
             "__shfl_xor", "__shfl_up", "__reduce_add_sync", "__reduce_max_sync", "__reduce_min_sync")
_SYNCS = ("__syncthreads", "__syncwarp", "__syncthreads_count", "__syncthreads_and", "__syncthreads_or")
_LOAD_INTRINSICS = ("__ldg", "__ldcg", "__ldca", "__ldcs", "__ldlu", "__ldcv")
_STORE_INTRINSICS = ("__stcg", "__stcs", "__stwb", "__stwt")
_COMPUTABLE = ("/", "%", "&", "|", "^", ">>", "<<")
_REDUCING_CALLS = {"max": "max", "fmaxf": "max", "fmax": "max", "min": "min", "fminf": "min", "fmin": "min"}
_COMPOUND = {"+=": "+", "-=": "+", "*=": "*", "|=": "|", "&=": "&", "^=": "^", "/=": "/", "%=": "%",
             "<<=": "<<", ">>=": ">>"}


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    array: str
    """The base array: a pointer parameter, a ``__shared__`` array or a local array."""
    space: str
    """``global``, ``shared`` or ``local``."""
    kind: str
    """``read``, ``write``, ``update`` (read-modify-write: ``+=``, ``++``) or ``atomic``."""
    op: str | None
    """The atomic function or the compound operator; None for plain reads and writes."""
    index: Poly
    """Element index into the base array (a struct element for arrays of structs)."""
    elem_type: str
    elem_bytes: int | None
    field: str | None
    """The struct member read or written (``ps[i].x`` → ``x``); None for whole elements."""
    line: int
    """0-based line in the preprocessed text."""
    user_line: int | None
    """0-based line in the user's file; None when the access sits in a local header."""
    text: str
    """The access as written (after expansion)."""
    loops: tuple[int, ...]
    """Ids of the enclosing loops, outermost first (:attr:`KernelFacts.loops`)."""
    via: tuple[str, ...] = ()
    """Helper functions inlined on the way to it, outermost first."""
    wide: bool = False
    """The index was computed in 64 bits (``long``, ``size_t`` or a cast to one)."""
    field_offset_bytes: int | None = None
    field_bytes: int | None = None
    """Where the member sits in the struct and its size, when the struct's layout is known."""
    span: tuple[int, int] = (0, 0)
    """Byte range of the access in the preprocessed text (for transformations)."""

    @property
    def writes(self) -> bool:
        return self.kind in ("write", "update", "atomic")

    @property
    def reads(self) -> bool:
        return self.kind in ("read", "update", "atomic")


@dataclass(frozen=True)
class LoopFact:
    id: int
    line: int
    user_line: int | None
    kind: str
    """``for``, ``while`` or ``do``."""
    var: str | None
    """The induction variable, when there is one."""
    start: Poly | None
    step: Poly | None
    """Added per iteration; None for a geometric or unknown update."""
    bound: Poly | None
    """Exclusive bound of the variable (``i < n`` → ``n``; ``i <= n`` → ``n + 1``); None when unknown."""
    geometric: str | None
    """``halving`` or ``doubling`` for ``s >>= 1`` / ``s *= 2`` style updates (reduction trees)."""
    parent: int | None
    trip_symbol: str
    """The iteration counter symbol: the variable's value is ``start + step * trip_symbol``."""
    span: tuple[int, int] = (0, 0)
    """Byte range of the whole loop statement in the preprocessed text."""
    calls_unknown: bool = False
    """The body calls code the analysis does not see."""


@dataclass(frozen=True)
class Reduction:
    kind: str
    """``accumulator`` (a scalar carried by a loop), ``shared_tree`` (a halving/doubling tree in
    shared memory, looped or unrolled), ``atomic`` (atomics onto addresses that do not depend on
    the thread), ``atomic_scatter`` (atomics at data-dependent addresses: a histogram) or
    ``warp_shuffle``."""
    target: str
    op: str
    line: int
    user_line: int | None
    loop: int | None = None


@dataclass(frozen=True)
class KernelFacts:
    kernel: str
    params: tuple[tuple[str, str, bool], ...]
    """(name, element or scalar type, is pointer) in order."""
    accesses: tuple[Access, ...]
    loops: tuple[LoopFact, ...]
    reductions: tuple[Reduction, ...]
    thread_dims: tuple[str, ...]
    """Builtins used (``tid.x``, ``bid.y``, ``bdim.x`` …)."""
    syncs: int
    shuffles: int
    unknowns: tuple[str, ...]
    """What the analysis could not model, each with why."""
    opaque: Mapping[str, Opaque] = field(default_factory=dict)
    """Opaque symbol -> what it stands for."""
    span: tuple[int, int] = (0, 0)
    """Byte range of the kernel's definition in the preprocessed text."""
    body_span: tuple[int, int] = (0, 0)
    """Byte range of its body (the braces included)."""
    escaped: tuple[str, ...] = ()
    """Arrays whose address reaches code the analysis does not see (an unknown call, a store of
    the pointer itself): they may be written there."""
    complete: bool = True
    """False when the analysis stopped early (budget, nesting): then nothing is proven read-only."""
    line: int = 0
    user_line: int | None = None

    @property
    def read_only(self) -> tuple[str, ...]:
        """Pointer parameters provably never written: not written, not escaped, analysis complete."""
        if not self.complete:
            return ()
        written = set(self.written) | set(self.escaped)
        return tuple(name for name, _, is_pointer in self.params if is_pointer and name not in written)

    @property
    def written(self) -> tuple[str, ...]:
        """Pointer parameters the kernel writes (directly, through aliases, macros or helpers)."""
        pointers = {name for name, _, is_pointer in self.params if is_pointer}
        return tuple(dict.fromkeys(a.array for a in self.accesses if a.writes and a.array in pointers))

    @property
    def read(self) -> tuple[str, ...]:
        pointers = {name for name, _, is_pointer in self.params if is_pointer}
        return tuple(dict.fromkeys(a.array for a in self.accesses if a.reads and a.array in pointers))


class Opaque(NamedTuple):
    """What an opaque symbol stands for."""

    text: str
    """The expression as written."""
    deps: frozenset[str]
    """Thread-index symbols it depends on (``tid.x`` …), directly or through other terms."""
    recipe: tuple | None = None
    """How to compute it once the launch binds its operands: ``(op, a, b)`` for ``/ % & | ^ >> <<
    min max`` on polynomials, ``("select", l, cmp, r, a, b)`` for ``l cmp r ? a : b``; None for
    values the analysis cannot compute (a load from memory, an unknown call): a gather."""
    created_in: tuple[int, ...] = ()
    """Loops (ids, outermost first) the term was made in: it may change from one iteration to the next."""


def thread_dependence(poly: Poly, opaque: Mapping[str, Opaque]) -> frozenset[str]:
    """Thread-index symbols ``poly`` depends on, through opaque terms too."""
    found: set[str] = set()
    for s in poly.symbols:
        if s.startswith("tid."):
            found.add(s)
        elif is_opaque(s):
            entry = opaque.get(s)
            if entry is not None:
                found |= entry.deps
    return frozenset(found)


# --------------------------------------------------------------------------------------------
# Values during the walk
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pointer:
    """A pointer value: ``base`` array plus an element offset."""

    base: str
    space: str
    offset: Poly
    elem_type: str


@dataclass(frozen=True)
class _Array:
    name: str
    space: str
    elem_type: str
    dims: tuple[int | None, ...]
    """Extents of a shared or local array, outermost first; () for a pointer parameter."""


_Value = Poly | _Pointer


def node_text(src: bytes, node: Node) -> str:
    """The source text of a syntax node."""
    return src[node.start_byte : node.end_byte].decode("utf-8", errors="replace")


def has_node(node: Node, types: tuple[str, ...]) -> bool:
    """Whether ``node`` or any node below it is of one of ``types``."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type in types:
            return True
        stack.extend(n.children)
    return False


def _strip_qualifiers(type_text: str) -> str:
    words = [w for w in type_text.replace("*", " ").replace("&", " ").split()
             if w not in ("const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "unsigned",
                          "signed", "static", "register")]
    base = " ".join(words)
    if "unsigned" in type_text.split() and base in ("", "int", "char", "short", "long", "long long"):
        base = ("unsigned " + base).strip() if base else "unsigned"
    return base or "int"


class _Budget(Exception):
    pass


class _Walker:
    def __init__(self, src: bytes, pre: Preprocessed | None, helpers: Mapping[str, Node],
                 structs: Mapping[str, _Struct], constants: Mapping[str, str]) -> None:
        self.src = src
        self.pre = pre
        self.helpers = helpers
        self.structs = structs
        self.constants = constants
        self.accesses: list[Access] = []
        self.loops: list[LoopFact] = []
        self.reductions: list[Reduction] = []
        self.unknowns: list[str] = []
        self.opaque: dict[str, Opaque] = {}
        self.builtins: set[str] = set()
        self.syncs = 0
        self.shuffles = 0
        self.env: dict[str, _Value] = {}
        self.arrays: dict[str, _Array] = {}
        self.wide_vars: set[str] = set()
        self.loop_stack: list[int] = []
        self.via: list[str] = []
        self.returns: list[_Value] = []
        self.declared_in_loop: list[set[str]] = []
        self.loop_vars: list[set[str]] = []
        self.escaped: set[str] = set()
        self.overrides: dict[int, _Value | None] = {}
        self.depth = 0
        self.unknown_calls = 0
        self.types: dict[str, str] = {}
        self.functors: Mapping[str, Functor] = {}
        """Structs of the file with a ``__device__ operator()``, by name: their objects are called inline."""
        self.objects: dict[str, tuple[Functor, dict[str, _Value | None]]] = {}
        self.type_names: frozenset[str] = frozenset()
        """``typedef`` and ``using`` names of the file: ``(floatX)(x)`` with one of them is a cast."""
        """Local function objects (``texReader r = {vec};``): their struct and their members' values."""
        """Template type parameters bound by the instantiation (``T`` → ``float``)."""
        self.complete = True
        self.nodes = 0

    # -- helpers ------------------------------------------------------------------------------
    def user_line(self, line: int) -> int | None:
        return self.pre.user_line(line) if self.pre is not None else line

    def fresh(self, text: str, deps: Iterable[Poly | _Pointer | None] = (), recipe: tuple | None = None) -> Poly:
        thread: set[str] = set()
        for d in deps:
            if isinstance(d, Poly):
                thread |= thread_dependence(d, self.opaque)
            elif isinstance(d, _Pointer):
                thread |= thread_dependence(d.offset, self.opaque)
        name = f"?{len(self.opaque)}"
        self.opaque[name] = Opaque(text[:80], frozenset(thread), recipe, tuple(self.loop_stack))
        return Poly.sym(name)

    def poly(self, value: _Value | None, node: Node) -> Poly:
        if isinstance(value, Poly):
            return value
        return self.fresh(node_text(self.src, node), [value] if value is not None else [])

    def elem_bytes(self, elem_type: str) -> int | None:
        if elem_type in TYPE_SIZES_BYTES:
            return TYPE_SIZES_BYTES[elem_type]
        layout = self.structs.get(elem_type)
        return layout.size_bytes if layout is not None else None

    def record(self, pointer: _Pointer, index: Poly, kind: str, op: str | None, node: Node, field_name: str | None = None,
               wide: bool = False) -> None:
        line = node.start_point[0]
        layout = self.structs.get(pointer.elem_type)
        member = layout.fields.get(field_name) if layout is not None and field_name is not None else None
        self.accesses.append(Access(
            array=pointer.base, space=pointer.space, kind=kind, op=op, index=pointer.offset + index,
            elem_type=pointer.elem_type, elem_bytes=self.elem_bytes(pointer.elem_type), field=field_name,
            line=line, user_line=self.user_line(line), text=node_text(self.src, node)[:120],
            loops=tuple(self.loop_stack), via=tuple(self.via), wide=wide,
            field_offset_bytes=member[0] if member else None, field_bytes=member[1] if member else None,
            span=(node.start_byte, node.end_byte),
        ))

    def tick(self) -> None:
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            raise _Budget

    # -- expressions --------------------------------------------------------------------------
    def expr(self, node: Node | None) -> _Value | None:
        """The value of an expression (recording the accesses it makes as reads)."""
        if node is None:
            return None
        self.tick()
        if self.depth > _MAX_EXPR_DEPTH:
            return self.flat_reads(node)
        kind = node.type
        handler = getattr(self, "e_" + kind, None)
        self.depth += 1
        try:
            if handler is not None:
                return handler(node)
            values = [self.expr(c) for c in node.named_children]
            return self.fresh(node_text(self.src, node), values)
        finally:
            self.depth -= 1

    def flat_reads(self, node: Node) -> _Value:
        """An expression nested deeper than the walk recurses (a generated 3,000-term sum): its
        subscripts are still recorded as reads, found without recursion, and its value is opaque."""
        stack = [node]
        values: list[_Value | None] = []
        while stack:
            n = stack.pop()
            if n.type == "subscript_expression":
                saved, self.depth = self.depth, 0
                try:
                    values.append(self.subscript(n, "read", None))
                finally:
                    self.depth = saved
                continue
            stack.extend(n.named_children)
        return self.fresh(node_text(self.src, node), values)

    def e_number_literal(self, node: Node) -> _Value:
        text = node_text(self.src, node).rstrip("uUlL").replace("'", "")
        try:
            return Poly.const(int(text, 0))
        except ValueError:
            return self.fresh(text)

    def e_true(self, node: Node) -> _Value:
        return ONE

    def e_false(self, node: Node) -> _Value:
        return ZERO

    def e_identifier(self, node: Node) -> _Value:
        name = node_text(self.src, node)
        if name in self.env:
            return self.env[name]
        if name in self.arrays:
            a = self.arrays[name]
            return _Pointer(a.name, a.space, ZERO, a.elem_type)
        if name == "warpSize":
            return Poly.const(_WARP)
        value = evaluate_int(name, self.constants) if name in self.constants else None
        if value is not None:
            return Poly.const(value)
        return self.fresh(name)

    def e_parenthesized_expression(self, node: Node) -> _Value | None:
        inner = node.named_children
        return self.expr(inner[-1]) if inner else None

    def e_cast_expression(self, node: Node) -> _Value | None:
        if node.id in self.overrides:
            return self.overrides[node.id]
        type_node = node.child_by_field_name("type")
        value_node = node.child_by_field_name("value")
        type_text = node_text(self.src, type_node) if type_node is not None else ""
        misread = self.misread_cast(type_text.strip(), value_node)
        if misread is not None:
            return misread
        value = self.expr(value_node)
        if isinstance(value, Poly) and any(w in type_text for w in ("float", "double", "half")):
            return self.fresh(node_text(self.src, node), [value])
        if isinstance(value, _Pointer) and "*" in type_text:
            return self.retype(value, self.ty(_strip_qualifiers(type_text)), node, "const" in type_text.split("*")[0])
        return value

    def ty(self, name: str) -> str:
        return self.types.get(name, name)

    def bind_template(self, fn: Node, args: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        """(types, constants) for ``fn``'s template parameters bound to ``args`` (texts), which are
        read in the current binding (``scanLocalMem<T, blockSize>`` inside an instance)."""
        types: dict[str, str] = {}
        consts: dict[str, str] = {}
        for (name, is_type), arg in zip(_template_params(fn, self.src), args):
            if is_type:
                types[name] = self.ty(_strip_qualifiers(arg))
            else:
                value = evaluate_int(arg, self.constants)
                if value is not None:
                    consts[name] = str(value)
        return types, consts

    def unresolved(self, name: str, elem_type: str, origin: Node | None) -> _Pointer:
        """A pointer whose target the analysis cannot name (returned by a method, loaded from a
        struct): its accesses are still recorded, on an array named after the pointer, in
        memory of ``unknown`` space, and the reason is kept."""
        where = f" (from `{node_text(self.src, origin)[:60]}`)" if origin is not None else ""
        self.unknowns.append(f"`{name}` points to memory the analysis cannot resolve{where}")
        return _Pointer(name, "unknown", ZERO, elem_type)

    def retype(self, pointer: _Pointer, elem_type: str, node: Node, to_const: bool = True) -> _Value:
        """A pointer cast to another element type (``reinterpret_cast<float4*>(&a[4*i])``): the
        offset is re-expressed in the new elements, exactly or not at all. A cast to a pointer to
        non-const data counts as an escape: the array may be written through it, and a ``const``
        added to the parameter would not compile (the cast would cast it away)."""
        if not to_const:
            self.escaped.add(pointer.base)
        if elem_type in ("void", pointer.elem_type):
            return pointer
        old, new = self.elem_bytes(pointer.elem_type), self.elem_bytes(elem_type)
        if old is None or new is None:
            return self.fresh(node_text(self.src, node), [pointer])
        scaled = pointer.offset.scale(old).exact_div(new)
        if scaled is None:
            return self.fresh(node_text(self.src, node), [pointer])
        return _Pointer(pointer.base, pointer.space, scaled, elem_type)

    def regroup_misread_cast(self, node: Node) -> _Value | None:
        """``(i)+a*b`` parses as ``((i)+a) * b`` once the cast is misread (see :meth:`misread_cast`):
        the multiplicative chain above the cast is evaluated with ``a`` in its place, then added."""
        leftmost = node.child_by_field_name("left")
        while leftmost is not None and leftmost.type == "binary_expression" and node_text(
                self.src, leftmost.child_by_field_name("operator") or leftmost) in ("*", "/", "%"):
            leftmost = leftmost.child_by_field_name("left")
        if leftmost is None or leftmost.type != "cast_expression" or leftmost.id in self.overrides:
            return None
        type_node = leftmost.child_by_field_name("type")
        value_node = leftmost.child_by_field_name("value")
        name = node_text(self.src, type_node).strip() if type_node is not None else ""
        if value_node is None or value_node.type != "unary_expression" or name not in self.env:
            return None
        op_node = value_node.child_by_field_name("operator")
        sign = node_text(self.src, op_node) if op_node is not None else ""
        if sign not in ("+", "-"):
            return None
        self.overrides[leftmost.id] = self.expr(value_node.child_by_field_name("argument"))
        try:
            rest = self.expr(node)
        finally:
            self.overrides.pop(leftmost.id, None)
        base = self.env[name]
        if isinstance(base, Poly) and isinstance(rest, Poly):
            return base + rest if sign == "+" else base - rest
        if isinstance(base, _Pointer) and isinstance(rest, Poly):
            return _Pointer(base.base, base.space, base.offset + (rest if sign == "+" else -rest), base.elem_type)
        return self.fresh(node_text(self.src, node), [base, rest])

    def misread_cast(self, name: str, value_node: Node | None) -> _Value | None:
        """``(i)+n*k`` parses as a cast of ``+n*k`` to a type named ``i`` (C's own ambiguity,
        resolved by tree-sitter without knowing which names are types; macro bodies write
        ``(_i)+_nx*…`` all the time). When ``i`` is a variable, it was an addition."""
        if value_node is None or value_node.type not in ("unary_expression", "pointer_expression"):
            return None
        if name not in self.env and name not in self.arrays:
            return None
        op_node = value_node.child_by_field_name("operator")
        op = node_text(self.src, op_node) if op_node is not None else ""
        if op not in ("+", "-", "*", "&"):
            return None
        left = self.env[name] if name in self.env else _Pointer(name, self.arrays[name].space, ZERO, self.arrays[name].elem_type)
        right = self.expr(value_node.child_by_field_name("argument"))
        if isinstance(left, _Pointer) and isinstance(right, Poly) and op in "+-":
            return _Pointer(left.base, left.space, left.offset + (right if op == "+" else -right), left.elem_type)
        if isinstance(left, Poly) and isinstance(right, Poly):
            combined = _arith(op, left, right)
            if combined is not None:
                return combined
        return self.fresh(name + op + node_text(self.src, value_node), [left, right])

    def e_comma_expression(self, node: Node) -> _Value | None:
        self.expr(node.child_by_field_name("left"))
        return self.expr(node.child_by_field_name("right"))

    def e_sizeof_expression(self, node: Node) -> _Value:
        size = evaluate_int(node_text(self.src, node), self.constants)
        return Poly.const(size) if size is not None else self.fresh(node_text(self.src, node))

    def e_field_expression(self, node: Node) -> _Value | None:
        arg = node.child_by_field_name("argument")
        fld = node.child_by_field_name("field")
        if arg is not None and arg.type == "identifier" and fld is not None:
            prefix = _BUILTINS.get(node_text(self.src, arg))
            if prefix is not None and arg.text is not None and node_text(self.src, arg) not in self.env:
                symbol = f"{prefix}.{node_text(self.src, fld)}"
                self.builtins.add(symbol)
                return Poly.sym(symbol)
        if arg is not None and arg.type == "subscript_expression":
            self.subscript(arg, "read", None, field_name=node_text(self.src, fld) if fld is not None else None)
            return self.fresh(node_text(self.src, node), [])
        value = self.expr(arg)
        return self.fresh(node_text(self.src, node), [value])

    def e_unary_expression(self, node: Node) -> _Value | None:
        op = node.child_by_field_name("operator")
        value = self.expr(node.child_by_field_name("argument"))
        text = node_text(self.src, op) if op is not None else ""
        if isinstance(value, Poly):
            if text == "-":
                return -value
            if text == "+":
                return value
        return self.fresh(node_text(self.src, node), [value])

    def e_binary_expression(self, node: Node) -> _Value | None:
        op_node = node.child_by_field_name("operator")
        if op_node is not None and node_text(self.src, op_node) in ("*", "/", "%"):
            regrouped = self.regroup_misread_cast(node)
            if regrouped is not None:
                return regrouped
        left = self.expr(node.child_by_field_name("left"))
        right = self.expr(node.child_by_field_name("right"))
        op_node = node.child_by_field_name("operator")
        op = node_text(self.src, op_node) if op_node is not None else ""
        if isinstance(left, _Pointer) and isinstance(right, Poly) and op in "+-":
            return _Pointer(left.base, left.space, left.offset + (right if op == "+" else -right), left.elem_type)
        if isinstance(right, _Pointer) and isinstance(left, Poly) and op == "+":
            return _Pointer(right.base, right.space, right.offset + left, right.elem_type)
        if isinstance(left, Poly) and isinstance(right, Poly):
            combined = _arith(op, left, right)
            if combined is not None:
                return combined
            if op in _COMPUTABLE:
                return self.fresh(node_text(self.src, node), [left, right], (op, left, right))
        return self.fresh(node_text(self.src, node), [left, right])

    def e_conditional_expression(self, node: Node) -> _Value | None:
        cond = self.expr(node.child_by_field_name("condition"))
        a = self.expr(node.child_by_field_name("consequence"))
        b = self.expr(node.child_by_field_name("alternative"))
        if isinstance(a, Poly) and a == b:
            return a
        recipe = self.select_recipe(node.child_by_field_name("condition"), a, b)
        return self.fresh(node_text(self.src, node), [cond, a, b], recipe)

    def select_recipe(self, cond: Node | None, a: _Value | None, b: _Value | None) -> tuple | None:
        """``l < r ? a : b`` on polynomials: computable once the launch binds them."""
        while cond is not None and cond.type in ("parenthesized_expression", "condition_clause") and cond.named_children:
            cond = cond.named_children[-1]
        if cond is None or cond.type != "binary_expression" or not isinstance(a, Poly) or not isinstance(b, Poly):
            return None
        op_node = cond.child_by_field_name("operator")
        op = node_text(self.src, op_node) if op_node is not None else ""
        if op not in ("<", "<=", ">", ">=", "==", "!="):
            return None
        # The condition's operands were evaluated with the condition itself; their values are
        # re-read without recording their accesses a second time.
        saved = len(self.accesses)
        left, right = self.expr(cond.child_by_field_name("left")), self.expr(cond.child_by_field_name("right"))
        del self.accesses[saved:]
        if not isinstance(left, Poly) or not isinstance(right, Poly):
            return None
        return ("select", left, op, right, a, b)

    def e_pointer_expression(self, node: Node) -> _Value | None:
        op = node.child_by_field_name("operator")
        arg = node.child_by_field_name("argument")
        if op is not None and node_text(self.src, op) == "&":
            return self.address(arg)
        pointer = self.expr(arg)
        if isinstance(pointer, _Pointer):
            self.record(pointer, ZERO, "read", None, node)
            return self.fresh(node_text(self.src, node), [pointer])
        return self.fresh(node_text(self.src, node), [pointer])

    def e_subscript_expression(self, node: Node) -> _Value | None:
        return self.subscript(node, "read", None)

    def e_assignment_expression(self, node: Node) -> _Value | None:
        return self.assign(node)

    def e_update_expression(self, node: Node) -> _Value | None:
        arg = node.child_by_field_name("argument")
        op = node.child_by_field_name("operator")
        op_text = node_text(self.src, op) if op is not None else "++"
        if arg is not None and arg.type == "identifier":
            name = node_text(self.src, arg)
            old = self.env.get(name)
            if isinstance(old, Poly):
                self.env[name] = old + (ONE if op_text == "++" else -ONE)
            elif isinstance(old, _Pointer):
                self.env[name] = _Pointer(old.base, old.space, old.offset + (ONE if op_text == "++" else -ONE), old.elem_type)
            return old
        self.lvalue(arg, "update", op_text[0])
        return self.fresh(node_text(self.src, node))

    def e_call_expression(self, node: Node) -> _Value | None:
        return self.call(node)

    def e_initializer_list(self, node: Node) -> _Value | None:
        self.escape([self.expr(c) for c in node.named_children])
        return None

    # -- accesses -----------------------------------------------------------------------------
    def element(self, node: Node) -> tuple[_Pointer, Poly, bool] | None:
        """(base pointer, element index, 64-bit?) of a subscript chain ``a[i]`` / ``sh[y][x]``."""
        chain: list[Node] = []
        base = node
        while base.type == "subscript_expression":
            chain.append(base)
            base = base.child_by_field_name("argument")
            if base is None:
                return None
        indices: list[Poly] = []
        wide = False
        for sub in reversed(chain):
            idx_list = sub.child_by_field_name("indices") or sub.child_by_field_name("index")
            idx_nodes = idx_list.named_children if idx_list is not None and idx_list.type == "subscript_argument_list" else (
                [idx_list] if idx_list is not None else [])
            idx_node = idx_nodes[0] if idx_nodes else None
            value = self.expr(idx_node)
            wide = wide or (idx_node is not None and self.is_wide(idx_node))
            indices.append(self.poly(value, idx_node) if idx_node is not None else ZERO)
        pointer = self.expr(base)
        if not isinstance(pointer, _Pointer):
            return None
        array = self.arrays.get(pointer.base)
        dims = array.dims if array is not None and len(array.dims) == len(indices) else ()
        flat = ZERO
        if dims:
            for k, idx in enumerate(indices):
                stride = 1
                for d in dims[k + 1 :]:
                    stride = stride * d if d is not None and stride is not None else None
                flat = flat + (idx.scale(stride) if stride is not None else self.fresh("row of " + pointer.base, [idx]))
        elif len(indices) == 1:
            flat = indices[0]
        else:
            # A pointer to pointers or to arrays (float (*a)[N]); each level is a load of its own.
            flat = self.fresh(node_text(self.src, node), indices)
        return pointer, flat, wide

    def subscript(self, node: Node, kind: str, op: str | None, field_name: str | None = None) -> _Value:
        found = self.element(node)
        if found is None:
            return self.fresh(node_text(self.src, node))
        pointer, index, wide = found
        self.record(pointer, index, kind, op, node, field_name, wide)
        return self.fresh(node_text(self.src, node), [index] if kind != "write" else [])

    def lvalue(self, node: Node | None, kind: str, op: str | None) -> None:
        """Record a store (or read-modify-write) to ``node``."""
        if node is None:
            return
        if node.type == "parenthesized_expression" and node.named_children:
            self.lvalue(node.named_children[-1], kind, op)
        elif node.type == "subscript_expression":
            self.subscript(node, kind, op)
        elif node.type == "field_expression":
            arg = node.child_by_field_name("argument")
            fld = node.child_by_field_name("field")
            if arg is not None and arg.type == "subscript_expression":
                self.subscript(arg, kind, op, field_name=node_text(self.src, fld) if fld is not None else None)
            elif arg is not None and arg.type == "pointer_expression":
                self.lvalue(arg, kind, op)
            elif arg is not None:
                self.expr(arg)
        elif node.type == "pointer_expression":
            pointer = self.expr(node.child_by_field_name("argument"))
            if isinstance(pointer, _Pointer):
                self.record(pointer, ZERO, kind, op, node)
        elif node.type == "identifier":
            name = node_text(self.src, node)
            if name in self.arrays and not self.arrays[name].dims:
                a = self.arrays[name]
                self.record(_Pointer(a.name, a.space, ZERO, a.elem_type), ZERO, kind, op, node)
        else:
            self.expr(node)

    def address(self, node: Node | None) -> _Value | None:
        """``&a[i]`` as a pointer value (no access: the callee or the store decides)."""
        if node is None:
            return None
        if node.type == "parenthesized_expression" and node.named_children:
            return self.address(node.named_children[-1])
        if node.type == "subscript_expression":
            found = self.element(node)
            if found is not None:
                pointer, index, _ = found
                return _Pointer(pointer.base, pointer.space, pointer.offset + index, pointer.elem_type)
        if node.type == "field_expression":
            arg = node.child_by_field_name("argument")
            if arg is not None and arg.type == "subscript_expression":
                return self.address(arg)
        if node.type == "identifier":
            name = node_text(self.src, node)
            if name in self.arrays:
                a = self.arrays[name]
                return _Pointer(a.name, a.space, ZERO, a.elem_type)
        return self.fresh(node_text(self.src, node), [self.expr(node)])

    def assign(self, node: Node) -> _Value | None:
        left = node.child_by_field_name("left")
        op_node = node.child_by_field_name("operator")
        op = node_text(self.src, op_node) if op_node is not None else "="
        right_node = node.child_by_field_name("right")
        right = self.expr(right_node)
        if left is not None and left.type == "identifier":
            name = node_text(self.src, left)
            if name in self.arrays and not self.arrays[name].dims:
                self.lvalue(left, "write" if op == "=" else "update", _COMPOUND.get(op))
                return right
            old = self.env.get(name)
            if op == "=":
                self.env[name] = right if right is not None else self.fresh(name)
                self.accumulator_by_call(name, right_node, node)
            else:
                self.note_accumulator(name, _COMPOUND.get(op, op), node)
                combined = _arith(_COMPOUND.get(op, ""), old, right) if isinstance(old, Poly) and isinstance(right, Poly) else None
                if isinstance(old, _Pointer) and isinstance(right, Poly) and op in ("+=", "-="):
                    self.env[name] = _Pointer(old.base, old.space, old.offset + (right if op == "+=" else -right), old.elem_type)
                else:
                    self.env[name] = combined if combined is not None else self.fresh(name, [old, right])
            return self.env[name]
        self.lvalue(left, "write" if op == "=" else "update", _COMPOUND.get(op))
        self.escape([right])
        return right

    def note_accumulator(self, name: str, op: str, node: Node) -> None:
        if not self.loop_stack or name in self.declared_in_loop[-1] or op not in ("+", "*", "|", "&", "^", "max", "min"):
            return
        if any(name in counters for counters in self.loop_vars):
            return
        line = node.start_point[0]
        if not any(r.target == name and r.loop == self.loop_stack[-1] for r in self.reductions):
            self.reductions.append(Reduction("accumulator", name, op, line, self.user_line(line), self.loop_stack[-1]))

    def accumulator_by_call(self, name: str, right: Node | None, node: Node) -> None:
        """``acc = acc + f`` or ``acc = fmaxf(acc, f)`` inside a loop."""
        if right is None or not self.loop_stack:
            return
        if right.type == "binary_expression":
            left = right.child_by_field_name("left")
            op_node = right.child_by_field_name("operator")
            if left is not None and left.type == "identifier" and node_text(self.src, left) == name and op_node is not None:
                self.note_accumulator(name, node_text(self.src, op_node), node)
        elif right.type == "call_expression":
            fn = right.child_by_field_name("function")
            args = right.child_by_field_name("arguments")
            fname = node_text(self.src, fn) if fn is not None else ""
            if fname in _REDUCING_CALLS and args is not None and any(
                    a.type == "identifier" and node_text(self.src, a) == name for a in args.named_children):
                self.note_accumulator(name, _REDUCING_CALLS[fname], node)

    def is_wide(self, node: Node) -> bool:
        text = node_text(self.src, node)
        return any(w in text for w in _WIDE_TYPES) or any(
            v in self.wide_vars for v in identifiers_in(node, self.src))

    # -- calls --------------------------------------------------------------------------------
    def call(self, node: Node) -> _Value | None:
        fn = node.child_by_field_name("function")
        args_node = node.child_by_field_name("arguments")
        args = list(args_node.named_children) if args_node is not None else []
        name = node_text(self.src, fn) if fn is not None else ""
        short = name.split("<", 1)[0].rsplit("::", 1)[-1].rsplit(".", 1)[-1].rsplit("->", 1)[-1].strip()
        if short in ("reinterpret_cast", "static_cast", "const_cast") and fn is not None and fn.type == "template_function" and args:
            type_args = fn.child_by_field_name("arguments")
            type_text = node_text(self.src, type_args).strip("<> ") if type_args is not None else ""
            value = self.expr(args[0])
            if isinstance(value, _Pointer) and "*" in type_text:
                return self.retype(value, self.ty(_strip_qualifiers(type_text)), node, "const" in type_text.split("*")[0])
            if isinstance(value, Poly) and not any(w in type_text for w in ("float", "double", "half")):
                return value
            return self.fresh(node_text(self.src, node), [value])
        if short.startswith("atomic") and args:
            target = self.address(args[0]) if args[0].type == "pointer_expression" and node_text(self.src, args[0]).startswith("&") else self.expr(args[0])
            if args[0].type == "pointer_expression" and node_text(self.src, args[0]).startswith("&"):
                target = self.address(args[0].child_by_field_name("argument"))
            values = [self.expr(a) for a in args[1:]]
            if isinstance(target, _Pointer):
                self.record(target, ZERO, "atomic", short, node)
                index = target.offset
                line = node.start_point[0]
                loop = self.loop_stack[-1] if self.loop_stack else None
                if not thread_dependence(index, self.opaque):
                    self.reductions.append(Reduction("atomic", target.base, short, line, self.user_line(line), loop))
                elif any(is_opaque(s) and self.opaque[s].deps and self.opaque[s].recipe is None for s in index.symbols):
                    self.reductions.append(Reduction("atomic_scatter", target.base, short, line, self.user_line(line), loop))
            else:
                self.unknowns.append(f"line {self.user_line_text(node)}: {short} on `{node_text(self.src, args[0])}`, "
                                     "whose target array could not be resolved")
            return self.fresh(node_text(self.src, node), values)
        if short in _SYNCS:
            self.syncs += 1
            return None
        if short in _SHUFFLES:
            self.shuffles += 1
            values = [self.expr(a) for a in args]
            line = node.start_point[0]
            self.reductions.append(Reduction("warp_shuffle", short, short, line, self.user_line(line),
                                             self.loop_stack[-1] if self.loop_stack else None))
            return self.fresh(node_text(self.src, node), values)
        if short in _LOAD_INTRINSICS and args:
            pointer = self.address(args[0].child_by_field_name("argument")) if (
                args[0].type == "pointer_expression" and node_text(self.src, args[0]).startswith("&")) else self.expr(args[0])
            if isinstance(pointer, _Pointer):
                self.record(pointer, ZERO, "read", None, node)
            return self.fresh(node_text(self.src, node), [pointer])
        if short in _STORE_INTRINSICS and len(args) >= 2:
            pointer = self.expr(args[0])
            value = self.expr(args[1])
            if isinstance(pointer, _Pointer):
                self.record(pointer, ZERO, "write", None, node)
            return value
        if short in ("__mul24", "__umul24") and len(args) == 2:
            a, b = self.expr(args[0]), self.expr(args[1])
            if isinstance(a, Poly) and isinstance(b, Poly):
                return a * b
            return self.fresh(node_text(self.src, node), [a, b])
        if short in ("min", "max", "umin", "umax", "llmin", "llmax") and len(args) == 2:
            a, b = self.expr(args[0]), self.expr(args[1])
            if isinstance(a, Poly) and isinstance(b, Poly):
                return self.fresh(node_text(self.src, node), [a, b], (short.lstrip("ul"), a, b))
            return self.fresh(node_text(self.src, node), [a, b])
        helper = self.helpers.get(short)
        if helper is not None and len(self.via) < _MAX_INLINE_DEPTH and short not in self.via:
            return self.inline(short, helper, args, node)
        if fn is not None and fn.type == "parenthesized_expression" and len(args) == 1 and self.is_type(fn):
            return self.fresh(node_text(self.src, node), [self.expr(args[0])])
        if fn is not None and fn.type == "identifier" and name in self.objects and len(self.via) < _MAX_INLINE_DEPTH \
                and "operator()" not in self.via:
            functor, members = self.objects[name]
            return self.inline("operator()", functor.call, args, node, members)
        values = [self.expr(a) for a in args]
        self.escape(values)
        if not _is_pure_math(short):
            self.unknown_calls += 1
        return self.fresh(node_text(self.src, node), values)

    def is_type(self, node: Node) -> bool:
        """``(T)`` names a type: a typedef of the file, a template type parameter or a sized builtin,
        and no variable of the same name is in scope."""
        inner = node.named_children[0] if len(node.named_children) == 1 else None
        if inner is None or inner.type not in ("identifier", "type_identifier", "primitive_type"):
            return False
        name = node_text(self.src, inner)
        if name in self.env or name in self.arrays or name in self.helpers:
            return False
        return name in self.type_names or name in self.types or name in TYPE_SIZES_BYTES

    def escape(self, values: Iterable[_Value | None]) -> None:
        """Pointers handed to code the analysis does not see may be written there."""
        for v in values:
            if isinstance(v, _Pointer):
                self.escaped.add(v.base)

    def user_line_text(self, node: Node) -> str:
        line = self.user_line(node.start_point[0])
        return str(line + 1) if line is not None else "?"

    def inline(self, name: str, helper: Node, args: list[Node], node: Node,
               members: Mapping[str, _Value | None] | None = None) -> _Value | None:
        """The helper's body walked with its parameters bound to the arguments (and, for a function
        object's ``operator()``, its members bound to the values the object was made with)."""
        values = [self.expr(a) for a in args]
        params = [(n, self.ty(t), p) for n, t, p in _param_list(helper, self.src)]
        saved_env, saved_returns, saved_arrays = self.env, self.returns, dict(self.arrays)
        saved_types, saved_constants = self.types, self.constants
        fn = node.child_by_field_name("function")
        type_args = fn.child_by_field_name("arguments") if fn is not None and fn.type == "template_function" else None
        if type_args is not None:
            types, consts = self.bind_template(helper, [node_text(self.src, a) for a in type_args.named_children])
            self.types = {**self.types, **types}
            self.constants = {**self.constants, **consts}
        env: dict[str, _Value] = {k: v if v is not None else self.fresh(k) for k, v in (members or {}).items()}
        for (pname, ptype, is_pointer), value, arg in zip(params, values, args):
            if is_pointer and not isinstance(value, _Pointer):
                value = self.unresolved(pname, ptype, arg)
            elif value is None:
                value = self.fresh(pname)
            env[pname] = value
        self.env, self.returns = env, []
        self.via.append(name)
        try:
            body = helper.child_by_field_name("body")
            if body is not None:
                self.statement(body)
        finally:
            self.via.pop()
            returns = self.returns
            self.env, self.returns = saved_env, saved_returns
            self.arrays = saved_arrays
            self.types, self.constants = saved_types, saved_constants
        if len(returns) == 1:
            return returns[0]
        return self.fresh(node_text(self.src, node), returns)

    # -- statements ---------------------------------------------------------------------------
    def statement(self, node: Node | None) -> None:
        if node is None:
            return
        self.tick()
        kind = node.type
        if kind == "compound_statement":
            declared_before = set(self.env)
            shadowed = {}
            for child in node.named_children:
                if child.type == "declaration":
                    for name in _declared_names(child, self.src):
                        if name in self.env and name not in shadowed:
                            shadowed[name] = self.env[name]
                self.statement(child)
            for name in list(self.env):
                if name not in declared_before:
                    del self.env[name]
            self.env.update(shadowed)
        elif kind == "declaration":
            self.declaration(node)
        elif kind == "expression_statement":
            for c in node.named_children:
                self.expr(c)
        elif kind == "if_statement":
            self.if_statement(node)
        elif kind in ("for_statement", "for_range_loop", "while_statement", "do_statement"):
            self.loop(node)
        elif kind == "return_statement":
            value = self.expr(node.named_children[0]) if node.named_children else None
            if value is not None:
                self.returns.append(value)
        elif kind in ("comment", "preproc_call", "break_statement", "continue_statement", "goto_statement"):
            return
        elif kind == "switch_statement":
            self.expr(node.child_by_field_name("condition"))
            before = dict(self.env)
            self.statement(node.child_by_field_name("body"))
            self.merge(before, [self.env])
        else:
            for c in node.named_children:
                if c.type.endswith("statement") or c.type in ("declaration", "case_statement"):
                    self.statement(c)
                elif c.type not in ("comment",):
                    self.expr(c)

    def declaration(self, node: Node) -> None:
        text = node_text(self.src, node)
        type_node = node.child_by_field_name("type")
        base_type = self.ty(_strip_qualifiers(node_text(self.src, type_node))) if type_node is not None else "int"
        shared = "__shared__" in text.split("=")[0]
        wide = any(w == base_type or base_type.startswith(w) for w in _WIDE_TYPES)
        for decl in node.children_by_field_name("declarator"):
            target = decl.child_by_field_name("declarator") if decl.type == "init_declarator" else decl
            value_node = decl.child_by_field_name("value") if decl.type == "init_declarator" else None
            is_pointer = target is not None and target.type == "pointer_declarator"
            if target is not None and target.type == "array_declarator":
                name, dims = self.array_dims(target)
                if name:
                    self.arrays[name] = _Array(name, "shared" if shared else "local", base_type, dims)
                    self.env.pop(name, None)
                    if value_node is not None:
                        self.expr(value_node)
                continue
            name = _declarator_name(target, self.src)
            if not name:
                continue
            if self.declared_in_loop:
                self.declared_in_loop[-1].add(name)
            if wide:
                self.wide_vars.add(name)
            functor = self.functors.get(base_type)
            if functor is not None and not is_pointer and value_node is not None and value_node.type == "initializer_list" \
                    and len(value_node.named_children) <= len(functor.fields):
                members = dict(zip(functor.fields, (self.expr(c) for c in value_node.named_children)))
                self.objects[name] = (functor, members)
                self.env[name] = self.fresh(name)
                continue
            self.objects.pop(name, None)
            value = self.expr(value_node) if value_node is not None else None
            if shared and not is_pointer:
                self.arrays[name] = _Array(name, "shared", base_type, ())
                continue
            if is_pointer and isinstance(value, _Pointer):
                self.env[name] = _Pointer(value.base, value.space, value.offset, base_type if base_type != "void" else value.elem_type)
            elif is_pointer and value_node is not None:
                self.env[name] = self.unresolved(name, base_type, value_node)
            elif value is None:
                self.env[name] = self.fresh(name)
            elif isinstance(value, Poly) and any(w in base_type for w in ("float", "double", "half", "bfloat")):
                self.env[name] = self.fresh(name, [value])
            else:
                self.env[name] = value

    def array_dims(self, node: Node) -> tuple[str | None, tuple[int | None, ...]]:
        dims: list[int | None] = []
        while node is not None and node.type == "array_declarator":
            size = node.child_by_field_name("size")
            dims.append(evaluate_int(node_text(self.src, size), self.constants) if size is not None else None)
            node = node.child_by_field_name("declarator")
        name = _declarator_name(node, self.src) if node is not None else None
        return name, tuple(reversed(dims))

    def if_statement(self, node: Node) -> None:
        found = conditional_update(node, self.src)
        if found is not None:
            self.note_accumulator(found[0], found[1], node)
        cond = node.child_by_field_name("condition")
        self.expr(cond.named_children[-1] if cond is not None and cond.named_children else cond)
        before = dict(self.env)
        self.statement(node.child_by_field_name("consequence"))
        after_then = self.env
        self.env = dict(before)
        alt = node.child_by_field_name("alternative")
        if alt is not None:
            self.statement(alt.named_children[-1] if alt.type == "else_clause" and alt.named_children else alt)
        self.merge(before, [after_then, self.env])

    def merge(self, before: Mapping[str, _Value], branches: list[dict[str, _Value]]) -> None:
        merged = dict(before)
        for name in before:
            values = [b.get(name) for b in branches]
            if all(v == before[name] for v in values):
                continue
            first = values[0]
            if all(v == first for v in values) and first is not None:
                merged[name] = first
            else:
                merged[name] = self.fresh(name, [before[name], *values])
        self.env = merged

    def loop(self, node: Node) -> None:
        loop_id = len(self.loops)
        kind = {"for_statement": "for", "while_statement": "while", "do_statement": "do"}.get(node.type, "for")
        body = node.child_by_field_name("body")
        init = node.child_by_field_name("initializer")
        cond = node.child_by_field_name("condition")
        update = node.child_by_field_name("update")
        self.declared_in_loop.append(set())
        if init is not None:
            if init.type == "declaration":
                self.declaration(init)
            else:
                self.expr(init)
        self.declared_in_loop[-1].clear()
        assigned = assigned_names(body, self.src) | (assigned_names(update, self.src) if update is not None else set())
        var, step, geometric = self.induction(update, body, cond)
        trip_symbol = f"it@L{loop_id}:{var or '#'}"
        start = self.env.get(var) if var is not None else None
        start_poly = start if isinstance(start, Poly) else None
        before = dict(self.env)
        inductions = self.secondary_inductions(body, assigned, var)
        if var is not None and start_poly is not None and step is not None:
            inductions[var] = (start_poly, step)
        for name in assigned:
            old = self.env.get(name)
            if name in inductions:
                first, increment = inductions[name]
                self.env[name] = (first + increment * Poly.sym(trip_symbol) if isinstance(first, Poly)
                                  else _Pointer(first.base, first.space, first.offset + increment * Poly.sym(trip_symbol), first.elem_type))
            elif isinstance(old, _Pointer):
                self.env[name] = _Pointer(old.base, old.space, self.fresh(name, [old.offset]), old.elem_type)
            elif name in self.env:
                extra = []
                if name == var:
                    extra = [old]
                self.env[name] = self.fresh(name, [old, *extra])
        bound = self.bound(cond, var, before) if var is not None else None
        line = node.start_point[0]
        self.loops.append(LoopFact(loop_id, line, self.user_line(line), kind, var, start_poly if var else None,
                                   step, bound, geometric, self.loop_stack[-1] if self.loop_stack else None, trip_symbol,
                                   span=(node.start_byte, node.end_byte)))
        escaped_before = set(self.escaped)
        unknown_calls_before = self.unknown_calls
        self.loop_stack.append(loop_id)
        self.loop_vars.append(set(inductions) | ({var} if var else set()))
        try:
            if cond is not None:
                self.expr(cond.named_children[-1] if cond.type == "condition_clause" and cond.named_children else cond)
            self.statement(body)
            if update is not None:
                self.expr(update)
        finally:
            self.loop_stack.pop()
            self.loop_vars.pop()
            self.declared_in_loop.pop()
        if self.unknown_calls != unknown_calls_before or self.escaped != escaped_before:
            self.loops[loop_id] = replace(self.loops[loop_id], calls_unknown=True)
        after = self.env
        self.env = dict(before)
        trips = None
        for name in assigned:
            if name not in after or name not in before:
                continue
            if name in inductions:
                # After the loop a counter stands at its start plus a whole number of steps: the
                # number of iterations is one value for the warp unless the bounds vary by thread.
                if trips is None:
                    loop = self.loops[loop_id]
                    trips = self.fresh(f"iterations of the loop at line {(loop.user_line or 0) + 1}",
                                       [loop.start, loop.bound] + ([] if loop.bound is not None else [self.fresh("?", [after[name]])]))
                first, increment = inductions[name]
                self.env[name] = (first + increment * trips if isinstance(first, Poly)
                                  else _Pointer(first.base, first.space, first.offset + increment * trips, first.elem_type))
            else:
                self.env[name] = self.fresh(name, [before[name], after[name]])
        if geometric is not None:
            self.shared_tree(loop_id)

    def secondary_inductions(self, body: Node | None, assigned: set[str], var: str | None) -> dict[str, tuple[_Value, Poly]]:
        """Variables stepped once per iteration by a loop-invariant amount (``c += xy;`` at the body's
        top level, assigned nowhere else in it): ``value = start + step * iteration``."""
        found: dict[str, tuple[_Value, Poly]] = {}
        if body is None:
            return found
        statements = body.named_children if body.type == "compound_statement" else [body]
        counts = _assignment_counts(body, self.src)
        declared = declared_anywhere(body, self.src)
        invariant = set(self.env) - assigned - declared
        for st in statements:
            if st.type != "expression_statement" or not st.named_children:
                continue
            e = st.named_children[0]
            left = e.child_by_field_name("left") if e.type == "assignment_expression" else e.child_by_field_name("argument")
            if left is None or left.type != "identifier":
                continue
            name = node_text(self.src, left)
            if name == var or counts.get(name) != 1 or name not in self.env:
                continue
            if e.type == "update_expression":
                op = e.child_by_field_name("operator")
                step: _Value | None = ONE if op is not None and node_text(self.src, op) == "++" else -ONE
            else:
                op_node = e.child_by_field_name("operator")
                op = node_text(self.src, op_node) if op_node is not None else ""
                right = e.child_by_field_name("right")
                # Only an increment the loop cannot change: names bound before the loop, never
                # assigned or declared in it (a float accumulator ``acc += x[j]`` is no counter).
                if op not in ("+=", "-=") or right is None or not identifiers_in(right, self.src) <= invariant | _BUILTIN_NAMES:
                    continue
                saved = len(self.accesses)
                step = self.expr(right)
                del self.accesses[saved:]
                if isinstance(step, Poly) and op == "-=":
                    step = -step
            start = self.env[name]
            if isinstance(step, Poly) and isinstance(start, (Poly, _Pointer)):
                found[name] = (start, step)
        return found

    def induction(self, update: Node | None, body: Node | None, cond: Node | None) -> tuple[str | None, Poly | None, str | None]:
        """The loop's counter: from the ``for`` update, else a single ``v += c`` at the body's top level."""
        candidates: list[Node] = []
        if update is not None:
            candidates.append(update)
        elif body is not None:
            statements = body.named_children if body.type == "compound_statement" else [body]
            cond_names = identifiers_in(cond, self.src) if cond is not None else set()
            for st in statements:
                if st.type == "expression_statement" and st.named_children:
                    e = st.named_children[0]
                    if e.type in ("assignment_expression", "update_expression") and (assigned_names(e, self.src) & cond_names):
                        candidates.append(e)
        for cand in candidates:
            found = self.step_of(cand)
            if found is not None:
                return found
        return None, None, None

    def step_of(self, node: Node) -> tuple[str, Poly | None, str | None] | None:
        if node.type == "comma_expression":
            return self.step_of(node.child_by_field_name("left")) if node.child_by_field_name("left") else None
        if node.type == "update_expression":
            arg = node.child_by_field_name("argument")
            op = node.child_by_field_name("operator")
            if arg is not None and arg.type == "identifier":
                return node_text(self.src, arg), (ONE if op is not None and node_text(self.src, op) == "++" else -ONE), None
            return None
        if node.type != "assignment_expression":
            return None
        left = node.child_by_field_name("left")
        op_node = node.child_by_field_name("operator")
        right = node.child_by_field_name("right")
        if left is None or left.type != "identifier" or op_node is None or right is None:
            return None
        name, op = node_text(self.src, left), node_text(self.src, op_node)
        if op in ("+=", "-="):
            value = self.expr(right)
            if isinstance(value, Poly) and not (value.symbols & assigned_names(node.parent, self.src) - {name}):
                return name, value if op == "+=" else -value, None
            return name, None, None
        if op in (">>=", "/="):
            return name, None, "halving"
        if op in ("<<=", "*="):
            return name, None, "doubling"
        if op == "=" and right.type == "binary_expression":
            r_left = right.child_by_field_name("left")
            r_op = right.child_by_field_name("operator")
            if r_left is not None and r_left.type == "identifier" and node_text(self.src, r_left) == name and r_op is not None:
                text = node_text(self.src, r_op)
                if text in ("+", "-"):
                    value = self.expr(right.child_by_field_name("right"))
                    if isinstance(value, Poly):
                        return name, value if text == "+" else -value, None
                if text in (">>", "/"):
                    return name, None, "halving"
                if text in ("<<", "*"):
                    return name, None, "doubling"
        return name, None, None

    def bound(self, cond: Node | None, var: str, env: Mapping[str, _Value]) -> Poly | None:
        if cond is None:
            return None
        node = cond.named_children[-1] if cond.type == "condition_clause" and cond.named_children else cond
        if node.type != "binary_expression":
            return None
        op_node = node.child_by_field_name("operator")
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        op = node_text(self.src, op_node) if op_node is not None else ""
        if left is None or right is None or left.type != "identifier" or node_text(self.src, left) != var:
            return None
        saved = self.env
        self.env = dict(env)
        try:
            value = self.expr(right)
        finally:
            self.env = saved
        if not isinstance(value, Poly):
            return None
        if op == "<":
            return value
        if op == "<=":
            return value + ONE
        return None

    def shared_tree(self, loop_id: int) -> None:
        """A halving/doubling loop that updates a shared array from another element of it."""
        inside = [a for a in self.accesses if loop_id in a.loops and a.space in ("shared", "unknown")]
        for w in inside:
            if not w.writes:
                continue
            partners = [r for r in inside if r.array == w.array and r.kind == "read" and r.index != w.index]
            if partners or w.kind == "update":
                self.reductions.append(Reduction("shared_tree", w.array, w.op or "+", w.line, w.user_line, loop_id))
                return


_MATH_PREFIXES = ("__f", "__d", "__int2", "__float2", "__half2", "__expf", "__logf", "__powf", "__sinf", "__cosf")


def _is_pure_math(name: str) -> bool:
    """Functions of values only (no memory side effects): the CUDA math library and intrinsics."""
    if name.startswith(_MATH_PREFIXES) or name in ("__saturatef", "__popc", "__clz", "__ffs", "__brev"):
        return True
    base = name[:-1] if name.endswith("f") else name
    return base in _MATH_FUNCTIONS


_MATH_FUNCTIONS = frozenset({
    "sqrt", "rsqrt", "cbrt", "exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p", "pow", "sin", "cos", "tan",
    "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "fabs", "abs", "floor", "ceil",
    "round", "trunc", "fmod", "fma", "fmax", "fmin", "max", "min", "erf", "erfc", "hypot", "copysign", "rint", "lrint",
    "sincos", "normcdf", "isnan", "isinf", "isfinite", "signbit", "frexp", "ldexp", "rcbrt", "rhypot", "norm3d",
    "float", "int", "double",
})


def conditional_update(node: Node, src: bytes) -> tuple[str, str] | None:
    """``if (x > m) m = x;`` (or ``<``, ``>=``, ``<=``, either side): (``m``, ``max``/``min``)."""
    if node.type != "if_statement" or node.child_by_field_name("alternative") is not None:
        return None
    cond = node.child_by_field_name("condition")
    while cond is not None and cond.type in ("condition_clause", "parenthesized_expression") and cond.named_children:
        cond = cond.named_children[-1]
    body = node.child_by_field_name("consequence")
    while body is not None and body.type == "compound_statement" and body.named_child_count == 1:
        body = body.named_children[0]
    if cond is None or cond.type != "binary_expression" or body is None or body.type != "expression_statement":
        return None
    assign = body.named_children[0] if body.named_children else None
    if assign is None or assign.type != "assignment_expression" or node_text(src, assign.child_by_field_name("operator")) != "=":
        return None
    target, value = assign.child_by_field_name("left"), assign.child_by_field_name("right")
    left, right = cond.child_by_field_name("left"), cond.child_by_field_name("right")
    op = node_text(src, cond.child_by_field_name("operator"))
    if target is None or value is None or left is None or right is None or target.type != "identifier":
        return None
    t, v, l, r = (node_text(src, n).replace(" ", "") for n in (target, value, left, right))
    if op in (">", ">=") and (l, r) == (v, t) or op in ("<", "<=") and (l, r) == (t, v):
        return node_text(src, target), "max"
    if op in ("<", "<=") and (l, r) == (v, t) or op in (">", ">=") and (l, r) == (t, v):
        return node_text(src, target), "min"
    return None


def _arith(op: str, left: Poly, right: Poly) -> Poly | None:
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    k = right.constant
    if op == "/" and k:
        return left.exact_div(k)
    if op == "<<" and k is not None and 0 <= k < 63:
        return left.scale(1 << k)
    if op == ">>" and k is not None and 0 <= k < 63:
        return left.exact_div(1 << k)
    if op == "%" and k and left.constant is not None:
        return Poly.const(int(left.constant % k))
    return None


def identifiers_in(node: Node | None, src: bytes) -> set[str]:
    """Every identifier written in ``node`` (none for None)."""
    if node is None:
        return set()
    found: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "identifier":
            found.add(node_text(src, n))
        stack.extend(n.children)
    return found


def assigned_names(node: Node | None, src: bytes) -> set[str]:
    """Local names assigned anywhere under ``node`` (``x = …``, ``x += …``, ``x++``)."""
    if node is None:
        return set()
    found: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "assignment_expression":
            left = n.child_by_field_name("left")
            if left is not None and left.type == "identifier":
                found.add(node_text(src, left))
        elif n.type == "update_expression":
            arg = n.child_by_field_name("argument")
            if arg is not None and arg.type == "identifier":
                found.add(node_text(src, arg))
        stack.extend(n.children)
    return found


_BUILTIN_NAMES = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize"})


def declared_anywhere(node: Node, src: bytes) -> set[str]:
    found: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "declaration":
            found.update(_declared_names(n, src))
        stack.extend(n.children)
    return found


def _assignment_counts(node: Node, src: bytes) -> dict[str, int]:
    counts: dict[str, int] = {}
    stack = [node]
    while stack:
        n = stack.pop()
        target = None
        if n.type == "assignment_expression":
            target = n.child_by_field_name("left")
        elif n.type == "update_expression":
            target = n.child_by_field_name("argument")
        if target is not None and target.type == "identifier":
            name = node_text(src, target)
            counts[name] = counts.get(name, 0) + 1
        stack.extend(n.children)
    return counts


def _declarator_name(node: Node | None, src: bytes) -> str | None:
    while node is not None and node.type not in ("identifier", "field_identifier"):
        inner = node.child_by_field_name("declarator")
        if inner is None:
            named = [c for c in node.named_children if c.type in ("identifier", "pointer_declarator", "reference_declarator",
                                                                    "array_declarator", "init_declarator")]
            inner = named[0] if named else None
        node = inner
    return node_text(src, node) if node is not None else None


def _declared_names(node: Node, src: bytes) -> list[str]:
    names = []
    for decl in node.children_by_field_name("declarator"):
        target = decl.child_by_field_name("declarator") if decl.type == "init_declarator" else decl
        while target is not None and target.type == "array_declarator":
            target = target.child_by_field_name("declarator")
        name = _declarator_name(target, src)
        if name:
            names.append(name)
    return names


def _param_list(fn: Node, src: bytes) -> list[tuple[str, str, bool]]:
    declarator = fn.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    params = declarator.child_by_field_name("parameters") if declarator is not None else None
    out: list[tuple[str, str, bool]] = []
    for p in params.named_children if params is not None else []:
        if p.type not in ("parameter_declaration", "optional_parameter_declaration"):
            continue
        type_node = p.child_by_field_name("type")
        decl = p.child_by_field_name("declarator")
        text = node_text(src, p)
        is_pointer = decl is not None and (decl.type in ("pointer_declarator", "array_declarator") or "*" in node_text(src, decl).split(_declarator_name(decl, src) or "\0")[0])
        name = _declarator_name(decl, src) if decl is not None else None
        base = _strip_qualifiers(node_text(src, type_node)) if type_node is not None else "int"
        if "unsigned" in text.split() and base == "int":
            base = "unsigned int"
        out.append((name or f"_{len(out)}", base, is_pointer))
    return out


def _function_name(fn: Node, src: bytes) -> str | None:
    declarator = fn.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    if declarator is None:
        return None
    name = declarator.child_by_field_name("declarator")
    if name is None:
        return None
    text = node_text(src, name)
    return text.split("<", 1)[0].rsplit("::", 1)[-1].strip()


def function_definitions(root: Node, src: bytes) -> Iterator[tuple[str, Node, str]]:
    """(name, definition, qualifier text) for every function definition, through templates,
    namespaces, ``extern "C"`` blocks and preprocessor conditionals."""
    stack = [root]
    while stack:
        node = stack.pop()
        for child in reversed(node.children):
            if child.type == "function_definition":
                name = _function_name(child, src)
                if name:
                    head = src[child.start_byte : (child.child_by_field_name("body") or child).start_byte].decode(
                        "utf-8", errors="replace")
                    yield name, child, head
            elif child.type in ("template_declaration", "namespace_definition", "linkage_specification",
                                "declaration_list", "preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif",
                                "ERROR", "class_specifier", "struct_specifier", "field_declaration_list",
                                "access_specifier"):
                stack.append(child)


def threads_cooperate(facts: KernelFacts) -> bool:
    """The kernel's threads work together: a barrier, a warp intrinsic, shared memory or an atomic.
    A rewrite that regroups threads into other blocks or warps must leave such a kernel alone."""
    return bool(facts.syncs or facts.shuffles or any(a.space == "shared" for a in facts.accesses)
                or any(a.kind == "atomic" for a in facts.accesses))


def helper_reading_thread_index(facts: KernelFacts, root: Node, src: bytes) -> str | None:
    """A function the kernel's accesses go through that reads the thread or block index itself (a
    rewrite that renames the kernel's own indices would not reach it), or None."""
    helpers = {name for a in facts.accesses for name in a.via}
    for name, node, _head in function_definitions(root, src):
        if name in helpers and _THREAD_INDEX.search(node_text(src, node)):
            return name
    return None


_THREAD_INDEX = re.compile(r"\b(threadIdx|blockIdx|gridDim|blockDim)\b")


@dataclass(frozen=True)
class _Struct:
    size_bytes: int
    fields: Mapping[str, tuple[int, int]]
    """Member name -> (byte offset, byte size)."""


def _struct_layouts(root: Node, src: bytes) -> dict[str, _Struct]:
    """Layouts of file-scope structs whose members all have known sizes (natural alignment),
    named by tag and by ``typedef``."""
    layouts: dict[str, _Struct] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        for child in node.children:
            if child.type in ("struct_specifier", "class_specifier"):
                layout = _layout(child, src, layouts)
                name_node = child.child_by_field_name("name")
                if layout is not None and name_node is not None:
                    layouts[node_text(src, name_node)] = layout
            elif child.type == "type_definition":
                inner = child.child_by_field_name("type")
                alias = child.child_by_field_name("declarator")
                if inner is not None and alias is not None and inner.type == "struct_specifier":
                    layout = _layout(inner, src, layouts)
                    if layout is not None:
                        layouts[node_text(src, alias)] = layout
            elif child.type in ("declaration", "namespace_definition", "declaration_list", "linkage_specification",
                                "template_declaration"):
                stack.append(child)
    return layouts


def _layout(node: Node, src: bytes, known: Mapping[str, _Struct]) -> _Struct | None:
    body = node.child_by_field_name("body")
    if body is None:
        return None
    offset, align = 0, 1
    fields: dict[str, tuple[int, int]] = {}
    for f in body.named_children:
        if f.type != "field_declaration":
            continue
        type_node = f.child_by_field_name("type")
        if type_node is None:
            return None
        type_name = _strip_qualifiers(node_text(src, type_node))
        size = TYPE_SIZES_BYTES.get(type_name)
        if size is None and type_name in known:
            size = known[type_name].size_bytes
        if size is None:
            return None
        a = min(size, 16) if size & (size - 1) == 0 else 4
        for decl in f.children_by_field_name("declarator") or [None]:
            count = 1
            target = decl
            while target is not None and target.type == "array_declarator":
                extent = target.child_by_field_name("size")
                n = evaluate_int(node_text(src, extent)) if extent is not None else None
                if n is None:
                    return None
                count *= n
                target = target.child_by_field_name("declarator")
            offset = (offset + a - 1) // a * a
            if target is not None:
                fields[node_text(src, target)] = (offset, size)
            offset += size * count
        align = max(align, a)
    return _Struct((offset + align - 1) // align * align, fields)


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------

_PARSER_CACHE: list[Parser] = []


def parse_text(text: str) -> tuple[bytes, Node]:
    """(UTF-8 bytes, tree root) of ``text``, with a parser reused across calls."""
    parser = _PARSER_CACHE.pop() if _PARSER_CACHE else Parser(CUDA_LANGUAGE)
    try:
        src = text.encode("utf-8", errors="replace")
        return src, parser.parse(src).root_node
    finally:
        _PARSER_CACHE.append(parser)


def analyze(pre: Preprocessed | str, constants: Mapping[str, str] | None = None) -> dict[str, KernelFacts]:
    """Facts for every ``__global__`` function of the (preprocessed) file, by kernel name."""
    if isinstance(pre, str):
        text, view = pre, None
    else:
        text, view = pre.text, pre
    src, root = parse_text(text)
    functions = list(function_definitions(root, src))
    helpers = {name: node for name, node, head in functions if "__global__" not in head and "__device__" in head}
    structs = _struct_layouts(root, src)
    instances = _instantiations(root, src)
    functors = call_operators(root, src)
    aliases = type_aliases(root, src)
    consts = dict(view.object_macros()) if view is not None else {}
    consts.update(constants or {})
    consts.update(_file_constants(root, src))
    out: dict[str, KernelFacts] = {}
    for name, node, head in functions:
        if "__global__" not in head or name in out:
            continue
        out[name] = _analyze_kernel(name, node, src, view, helpers, structs, consts, instances.get(name), functors, aliases)
    return out


def _template_params(fn: Node, src: bytes) -> list[tuple[str, bool]]:
    """(name, is a type) of the template parameters of ``fn`` (empty when it is no template)."""
    parent = fn.parent
    if parent is None or parent.type != "template_declaration":
        return []
    plist = parent.child_by_field_name("parameters")
    out: list[tuple[str, bool]] = []
    for p in plist.named_children if plist is not None else []:
        if p.type in ("type_parameter_declaration", "optional_type_parameter_declaration"):
            ident = next((c for c in p.named_children if c.type == "type_identifier"), None)
            if ident is not None:
                out.append((node_text(src, ident), True))
        elif p.type in ("parameter_declaration", "optional_parameter_declaration"):
            name = _declarator_name(p.child_by_field_name("declarator"), src)
            if name:
                out.append((name, False))
    return out


def _instantiations(root: Node, src: bytes) -> dict[str, tuple[str, ...]]:
    """Template arguments of the first explicit instantiation of each function
    (``template __global__ void reduce<float, 256>(…);``) or, failing that, of its first launch
    with explicit arguments (``reduce<float, 256><<<…>>>``)."""
    found: dict[str, tuple[str, ...]] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type in ("template_instantiation", "call_expression", "cuda_kernel_call_expression") or node.type.endswith("kernel_call"):
            tf = next((d for d in _descendants(node, 3) if d.type == "template_function"), None)
            if tf is not None:
                name_node = tf.child_by_field_name("name")
                args = tf.child_by_field_name("arguments")
                if name_node is not None and args is not None:
                    found.setdefault(node_text(src, name_node).rsplit("::", 1)[-1],
                                     tuple(node_text(src, a) for a in args.named_children))
        stack.extend(reversed(node.children))
    return found


def explicit_instantiations(text: str) -> frozenset[str]:
    """Names of the function templates the text instantiates explicitly (``template __global__ void
    k<float>(float* p);``): such a declaration repeats the parameter types, so a rewrite that
    changes them must change it too."""
    src, root = parse_text(text)
    found = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "template_instantiation":
            tf = next((d for d in _descendants(node, 3) if d.type == "template_function"), None)
            name = tf.child_by_field_name("name") if tf is not None else None
            if name is not None:
                found.add(node_text(src, name).rsplit("::", 1)[-1])
        stack.extend(node.children)
    return frozenset(found)


def _descendants(node: Node, depth: int) -> Iterator[Node]:
    frontier = [node]
    for _ in range(depth):
        frontier = [c for n in frontier for c in n.named_children]
        yield from frontier


def _file_constants(root: Node, src: bytes) -> dict[str, str]:
    """``const int N = 512, M = 4;`` and ``constexpr`` integers at file scope."""
    found: dict[str, str] = {}
    for child in root.children:
        if child.type != "declaration":
            continue
        text = node_text(src, child)
        if not ("const" in text.split("=")[0] or "constexpr" in text.split("=")[0]):
            continue
        for decl in child.children_by_field_name("declarator"):
            if decl.type == "init_declarator":
                name = decl.child_by_field_name("declarator")
                value = decl.child_by_field_name("value")
                if name is not None and name.type == "identifier" and value is not None:
                    found[node_text(src, name)] = node_text(src, value)
    return found


def _analyze_kernel(name: str, node: Node, src: bytes, pre: Preprocessed | None, helpers: Mapping[str, Node],
                    structs: Mapping[str, _Struct], constants: Mapping[str, str],
                    instance: tuple[str, ...] | None = None, functors: Mapping[str, Functor] | None = None,
                    type_names: frozenset[str] = frozenset()) -> KernelFacts:
    walker = _Walker(src, pre, helpers, structs, constants)
    walker.functors = functors or {}
    walker.type_names = type_names
    if instance is not None:
        types, consts = walker.bind_template(node, list(instance))
        walker.types = types
        walker.constants = {**walker.constants, **consts}
    params = [(n, walker.ty(t), p) for n, t, p in _param_list(node, src)]
    for pname, ptype, is_pointer in params:
        if is_pointer:
            walker.arrays[pname] = _Array(pname, "global", ptype, ())
        else:
            walker.env[pname] = Poly.sym(pname)
            if any(w == ptype or ptype.startswith(w) for w in _WIDE_TYPES):
                walker.wide_vars.add(pname)
    body = node.child_by_field_name("body")
    try:
        walker.statement(body)
    except _Budget:
        walker.complete = False
        walker.unknowns.append(f"the kernel is larger than the analysis budget ({_MAX_NODES} nodes): later accesses not modelled")
    except RecursionError:
        walker.complete = False
        walker.unknowns.append("expressions nested too deeply to analyse: later accesses not modelled")
    _unrolled_trees(walker)
    line = node.start_point[0]
    return KernelFacts(
        kernel=name,
        params=tuple(params),
        accesses=tuple(walker.accesses),
        loops=tuple(walker.loops),
        reductions=tuple(walker.reductions),
        thread_dims=tuple(sorted(walker.builtins)),
        syncs=walker.syncs,
        shuffles=walker.shuffles,
        unknowns=tuple(dict.fromkeys(walker.unknowns)),
        opaque=dict(walker.opaque),
        escaped=tuple(sorted(walker.escaped)),
        complete=walker.complete,
        span=(node.start_byte, node.end_byte),
        body_span=(body.start_byte, body.end_byte) if body is not None else (0, 0),
        line=line,
        user_line=walker.user_line(line),
    )


def _unrolled_trees(walker: _Walker) -> None:
    """``sdata[tid] += sdata[tid + 32]; sdata[tid] += sdata[tid + 16]; …`` outside any loop: an
    unrolled shared-memory tree (the warp-synchronous tail of classic reductions)."""
    by_array: dict[str, list[Access]] = {}
    for a in walker.accesses:
        if a.space == "shared":
            by_array.setdefault(a.array, []).append(a)
    for array, accesses in by_array.items():
        if any(r.kind == "shared_tree" and r.target == array for r in walker.reductions):
            continue
        offsets = set()
        for w in accesses:
            if not w.writes:
                continue
            for r in accesses:
                if r.kind == "read" and r.line == w.line:
                    delta = (r.index - w.index).constant
                    if delta and delta > 0 and delta & (delta - 1) == 0:
                        offsets.add(delta)
        if len(offsets) >= 2:
            first = next(a for a in accesses if a.writes)
            walker.reductions.append(Reduction("shared_tree", array, first.op or "+", first.line, first.user_line))


# --------------------------------------------------------------------------------------------
# Binding to a launch: numbers for strides, sectors and trip counts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Binding:
    """The launch an analysis is evaluated under."""

    values: Mapping[str, int]
    """Integer scalar parameters by name."""
    block: tuple[int, int, int]
    grid: tuple[int, int, int] | None = None
    elem_bytes: Mapping[str, int] = field(default_factory=dict)
    """Element sizes by array name where the source cannot tell (templates): from the spec."""

    @staticmethod
    def from_spec(spec, variant: int | None = None) -> Binding:  # noqa: ANN001 - core.spec.Spec
        from kernel_lsp.core.spec import FLOAT_TYPES, ArrayParam

        resolved = spec.resolve(variant)
        values = {k: int(v) for k, v in resolved.values.items()
                  if not any(p.name == k and p.type in FLOAT_TYPES for p in spec.scalars)}
        sizes = {"int8": 1, "uint8": 1, "float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4, "float32": 4,
                 "int64": 8, "uint64": 8, "float64": 8}
        elem = {p.name: sizes[p.type] for p in spec.params if isinstance(p, ArrayParam) and p.type in sizes}
        return Binding(values, resolved.original.block, resolved.original.grid, elem)


@dataclass(frozen=True)
class Pattern:
    access: Access
    pattern: str
    """``coalesced``, ``strided``, ``broadcast`` (one address for the warp), ``gather`` (the index
    depends on loaded data or on something not modelled that varies by thread) or ``unknown``."""
    warp_stride_elems: int | None
    """Elements between neighbouring lanes along ``threadIdx.x`` (None: not linear or not known)."""
    sectors_per_request: int | None
    ideal_sectors: int | None
    loop_stride_elems: int | None
    """Elements between consecutive iterations of the innermost enclosing loop, per thread."""
    why: str

    @property
    def uncoalesced(self) -> bool:
        return self.pattern in ("strided", "gather")


def _lane_env(lane: int, block: tuple[int, int, int]) -> dict[str, int]:
    bx, by, _ = block
    return {"tid.x": lane % bx, "tid.y": (lane // bx) % max(by, 1), "tid.z": lane // (bx * max(by, 1))}


def _base_env(facts: KernelFacts, binding: Binding) -> dict[str, int]:
    env = dict(binding.values)
    bx, by, bz = binding.block
    env.update({"bdim.x": bx, "bdim.y": by, "bdim.z": bz, "bid.x": 1, "bid.y": 1, "bid.z": 1})
    if binding.grid is not None:
        gx, gy, gz = binding.grid
        env.update({"gdim.x": gx, "gdim.y": gy, "gdim.z": gz})
    for loop in facts.loops:
        env[loop.trip_symbol] = 1
    return env


def evaluate(poly: Poly, env: Mapping[str, int], opaque: Mapping[str, Opaque]) -> int | None:
    """``poly``'s value under ``env``, computing opaque terms from their recipes; an opaque term
    without one counts 0 when it does not depend on the thread (the same for every lane, so it
    moves no address relative to another) and makes the value unknown otherwise."""
    values: dict[str, int] = {}
    for s in poly.symbols:
        if s in env:
            continue
        entry = opaque.get(s)
        if entry is None:
            return None
        value = _compute(entry, env, opaque) if entry.recipe is not None else (None if entry.deps else 0)
        if value is None:
            return None
        values[s] = value
    return poly.evaluate({**env, **values}) if values else poly.evaluate(env)


def _compute(entry: Opaque, env: Mapping[str, int], opaque: Mapping[str, Opaque]) -> int | None:
    recipe = entry.recipe
    if recipe[0] == "select":
        _, l, cmp, r, a, b = recipe
        lv, rv = evaluate(l, env, opaque), evaluate(r, env, opaque)
        if lv is None or rv is None:
            return None
        taken = {"<": lv < rv, "<=": lv <= rv, ">": lv > rv, ">=": lv >= rv, "==": lv == rv, "!=": lv != rv}[cmp]
        return evaluate(a if taken else b, env, opaque)
    op, a, b = recipe
    av, bv = evaluate(a, env, opaque), evaluate(b, env, opaque)
    if av is None or bv is None:
        return None
    if op in ("/", "%"):
        if bv == 0:
            return None
        q = abs(av) // abs(bv) * (1 if (av >= 0) == (bv >= 0) else -1)  # C truncates toward zero
        return q if op == "/" else av - q * bv
    if op in (">>", "<<") and not 0 <= bv < 64:
        return None
    return {"&": av & bv, "|": av | bv, "^": av ^ bv, ">>": av >> bv if op == ">>" else 0, "<<": av << bv if op == "<<" else 0,
            "min": min(av, bv), "max": max(av, bv)}[op]


def bind(facts: KernelFacts, binding: Binding) -> tuple[Pattern, ...]:
    """The pattern of every access of ``facts`` under ``binding``."""
    base = _base_env(facts, binding)
    lanes = [_lane_env(lane, binding.block) for lane in range(min(_WARP, binding.block[0] * binding.block[1] * binding.block[2]))]
    return tuple(_pattern(a, facts, base, lanes, binding) for a in facts.accesses)


def _pattern(a: Access, facts: KernelFacts, base: Mapping[str, int], lanes: list[dict[str, int]], binding: Binding) -> Pattern:
    elem = a.elem_bytes or binding.elem_bytes.get(a.array)
    loop_stride = None
    if a.loops:
        inner = facts.loops[a.loops[-1]]
        coeff = a.index.coefficient(inner.trip_symbol)
        loop_stride = coeff.evaluate(base) if coeff is not None else None
    deps = thread_dependence(a.index, facts.opaque)
    addresses = []
    for lane in lanes:
        value = evaluate(a.index, {**base, **lane}, facts.opaque)
        if value is None and _data_dependent(a.index, facts.opaque):
            reason = _data_term(a.index, facts.opaque)
            return Pattern(a, "gather", None, None, None, loop_stride, f"the index depends on `{reason}`, which varies by thread")
        if value is None:
            missing = sorted(s for s in a.index.symbols if s not in base and not s.startswith("tid."))
            computed = [s for s in missing if s in facts.opaque and facts.opaque[s].recipe is not None]
            if computed:
                return Pattern(a, "unknown", None, None, None, loop_stride,
                               f"`{facts.opaque[computed[0]].text}` has no value under this launch "
                               "(a shift by 64 bits or more, or a division by zero)")
            return Pattern(a, "unknown", None, None, None, loop_stride,
                           f"the index needs {', '.join(missing) or 'values'}, which the launch does not give")
        addresses.append(value)
    coeff_x = a.index.coefficient("tid.x")
    stride = evaluate(coeff_x, base, facts.opaque) if coeff_x is not None and not any(
        opaque_symbol in facts.opaque and facts.opaque[opaque_symbol].deps for opaque_symbol in a.index.symbols) else None
    if stride is None and len(addresses) > 1 and binding.block[0] > 1:
        steps = {addresses[i + 1] - addresses[i] for i in range(min(len(addresses), binding.block[0]) - 1)}
        stride = steps.pop() if len(steps) == 1 else None
    if not deps or len(set(addresses)) == 1:
        return Pattern(a, "broadcast", 0, 1, 1, loop_stride, "every thread of a warp uses the same element")
    if elem is None:
        return Pattern(a, "unknown", stride, None, None, loop_stride, "the element size is not known (template type?)")
    offset, useful = (a.field_offset_bytes or 0), (a.field_bytes or elem)
    sectors = len({(addr * elem + offset + k) // _SECTOR_BYTES for addr in addresses for k in (0, useful - 1)})
    ideal = max(1, -(-len(set(addresses)) * useful // _SECTOR_BYTES))
    if a.space == "shared":
        banks = [((addr * elem) // 4) % 32 for addr in addresses]
        words = {}
        for addr, bank in zip(addresses, banks):
            words.setdefault(bank, set()).add((addr * elem) // 4)
        ways = max(len(w) for w in words.values())
        pattern = "coalesced" if ways <= 1 else "strided"
        return Pattern(a, pattern, stride, ways, 1, loop_stride,
                       "no bank conflicts" if ways <= 1 else f"{ways}-way bank conflicts")
    pattern = "coalesced" if sectors <= ideal + 1 else "strided"
    return Pattern(a, pattern, stride, sectors, ideal, loop_stride,
                   f"{sectors} sectors per request (ideal {ideal})")


def _data_dependent(poly: Poly, opaque: Mapping[str, Opaque], depth: int = 0) -> bool:
    """True when a thread-dependent term of ``poly`` has no recipe (a loaded value, an unknown call)."""
    if depth > 64:
        return True
    for s in poly.symbols:
        entry = opaque.get(s)
        if entry is None or not entry.deps:
            continue
        if entry.recipe is None:
            return True
        polys = [x for x in entry.recipe if isinstance(x, Poly)]
        if any(_data_dependent(x, opaque, depth + 1) for x in polys):
            return True
    return False


def _data_term(poly: Poly, opaque: Mapping[str, Opaque]) -> str:
    for s in sorted(poly.symbols):
        entry = opaque.get(s)
        if entry is not None and entry.deps:
            if entry.recipe is None:
                return entry.text
            inner = next((_data_term(x, opaque) for x in entry.recipe if isinstance(x, Poly) and _data_dependent(x, opaque)), "")
            if inner:
                return inner
    return ""


def describe(p: Pattern) -> str:
    """One line for hover: ``store to `out`: 4096 elements apart across a warp, 32 sectors per request — uncoalesced``."""
    a = p.access
    verb = {"read": "load of", "write": "store to", "update": "update of", "atomic": f"{a.op} on"}[a.kind]
    where = {"global": "", "unknown": " (memory not resolved)"}.get(a.space, f" ({a.space})")
    target = f"`{a.array}{'.' + a.field if a.field else ''}`{where}"
    if p.pattern == "broadcast":
        body = "the same element for every thread of a warp (broadcast)"
    elif p.pattern == "gather":
        body = f"gather: {p.why}"
    elif p.pattern == "unknown":
        body = f"pattern unknown: {p.why}"
    elif a.space == "shared":
        body = f"{p.why}" + (f", {p.warp_stride_elems} elements apart across a warp" if p.warp_stride_elems not in (None, 1) else "")
    else:
        apart = ("unit stride across a warp" if p.warp_stride_elems == 1
                 else f"{p.warp_stride_elems} elements apart across a warp" if p.warp_stride_elems is not None
                 else "lanes not evenly spaced")
        verdict = "coalesced" if p.pattern == "coalesced" else "uncoalesced"
        body = f"{apart}, {p.sectors_per_request} sectors per request — {verdict}"
    if p.loop_stride_elems not in (None, 0):
        body += f"; {p.loop_stride_elems} element{'s' if abs(p.loop_stride_elems) != 1 else ''} further each loop iteration"
    via = f" (in {' → '.join(a.via)})" if a.via else ""
    return f"{verb} {target}{via}: {body}"


def trip_count(facts: KernelFacts, loop: LoopFact, binding: Binding) -> int | None:
    """Iterations of ``loop`` for thread 0 of block 0 under ``binding`` (None: not known)."""
    env = _base_env(facts, binding)
    env.update({"tid.x": 0, "tid.y": 0, "tid.z": 0, "bid.x": 0, "bid.y": 0, "bid.z": 0})
    if loop.geometric is not None or loop.step is None or loop.start is None or loop.bound is None:
        return None
    start, step, bound = loop.start.evaluate(env), loop.step.evaluate(env), loop.bound.evaluate(env)
    if start is None or step is None or bound is None or step <= 0:
        return None
    return max(0, -(-(bound - start) // step))


# --------------------------------------------------------------------------------------------
# Kernel-level summaries
# --------------------------------------------------------------------------------------------


def thread_mapping(facts: KernelFacts) -> str:
    """How threads map onto work: ``grid-stride``, ``row-per-thread``, ``block-per-row``,
    ``element`` (1-D), ``element-2d``/``element-3d``, ``tile`` or ``other``."""
    writes = [a for a in facts.accesses if a.writes and a.space == "global"]
    for loop in facts.loops:
        if loop.step is not None and any(m for m, _ in loop.step.terms if "gdim.x" in m and "bdim.x" in m):
            return "grid-stride"
    for a in facts.accesses:
        if a.space != "global" or not a.loops:
            continue
        inner = facts.loops[a.loops[-1]]
        along_loop = a.index.coefficient(inner.trip_symbol)
        along_x = a.index.coefficient("tid.x")
        step = inner.step
        if along_loop is None or along_x is None or along_x == Poly():
            if along_x is not None and along_x == Poly() and step is not None and "bdim.x" in step.symbols \
                    and a.index.coefficient("bid.x") not in (None, Poly()):
                return "block-per-row"
            continue
        if along_loop.constant == 1 and (step is not None and step.constant == 1) and along_x.constant != 1:
            return "row-per-thread"
        if step is not None and "bdim.x" in step.symbols and along_x.constant == 1 and a.index.coefficient("bid.x") not in (None, Poly()) \
                and "bdim.x" not in (a.index.coefficient("bid.x") or Poly()).symbols:
            return "block-per-row"
    if facts.syncs and any(a.space == "shared" for a in facts.accesses) and "tid.y" in facts.thread_dims:
        return "tile"
    if "tid.z" in facts.thread_dims or "bid.z" in facts.thread_dims:
        return "element-3d"
    if "tid.y" in facts.thread_dims or "bid.y" in facts.thread_dims:
        return "element-2d"
    if writes:
        return "element"
    return "other"


def per_block_outputs(facts: KernelFacts) -> tuple[str, ...]:
    """Global arrays written at an index that depends on the block but not on the thread
    (``partial[blockIdx.x] = sdata[0]``): their size is the grid's, a rewrite must keep it."""
    out = []
    for a in facts.accesses:
        if a.space != "global" or a.kind not in ("write", "update"):
            continue
        deps = thread_dependence(a.index, facts.opaque)
        if not deps and any(s.startswith("bid.") for s in a.index.symbols):
            out.append(a.array)
    return tuple(dict.fromkeys(out))


def stencil_offsets(facts: KernelFacts) -> dict[str, tuple[int, ...]]:
    """Reads of one global array at constant offsets from each other within the same loop nest:
    the neighbour offsets (in elements) a stencil reuses."""
    groups: dict[tuple[str, tuple[int, ...]], list[Access]] = {}
    for a in facts.accesses:
        if a.space == "global" and a.kind == "read":
            groups.setdefault((a.array, a.loops), []).append(a)
    found: dict[str, tuple[int, ...]] = {}
    for (array, _), reads in groups.items():
        if len(reads) < 3:
            continue
        anchor = reads[0].index
        deltas = []
        for r in reads:
            d = (r.index - anchor).constant
            if d is None:
                break
            deltas.append(d)
        else:
            offsets = tuple(sorted(set(deltas)))
            if len(offsets) >= 3:
                centre = sorted(offsets)[len(offsets) // 2]
                found[array] = tuple(o - centre for o in offsets)
    return found


def summary(facts: KernelFacts, binding: Binding | None) -> dict:
    """A JSON-ready summary (``kernel-lsp check --json``, the knowledge base, model prompts)."""
    patterns = bind(facts, binding) if binding is not None else ()
    accesses = []
    for i, a in enumerate(facts.accesses):
        entry = {"array": a.array, "space": a.space, "kind": a.kind, "index": str(a.index),
                 "line": (a.user_line + 1) if a.user_line is not None else None, "text": a.text}
        if a.op:
            entry["op"] = a.op
        if a.via:
            entry["via"] = list(a.via)
        if a.wide:
            entry["wide_index"] = True
        if patterns:
            p = patterns[i]
            entry.update({"pattern": p.pattern, "warp_stride_elems": p.warp_stride_elems,
                          "sectors_per_request": p.sectors_per_request, "describe": describe(p)})
        accesses.append(entry)
    return {
        "kernel": facts.kernel,
        "mapping": thread_mapping(facts),
        "written": list(facts.written),
        "read_only": [n for n in facts.read if n not in facts.written],
        "accesses": accesses,
        "loops": [{"line": (l.user_line + 1) if l.user_line is not None else None, "var": l.var,
                   "step": str(l.step) if l.step is not None else None, "bound": str(l.bound) if l.bound is not None else None,
                   "geometric": l.geometric, "trips": trip_count(facts, l, binding) if binding is not None else None}
                  for l in facts.loops],
        "reductions": [{"kind": r.kind, "target": r.target, "op": r.op,
                        "line": (r.user_line + 1) if r.user_line is not None else None} for r in facts.reductions],
        "per_block_outputs": list(per_block_outputs(facts)),
        "stencil_offsets": {k: list(v) for k, v in stencil_offsets(facts).items()},
        "syncs": facts.syncs,
        "shuffles": facts.shuffles,
        "unknowns": list(facts.unknowns),
    }


# --------------------------------------------------------------------------------------------
# Value ranges: the interval an index takes over a block's threads and any loaded data
# --------------------------------------------------------------------------------------------


def split_block_base(poly: Poly, facts: KernelFacts) -> tuple[Poly, Poly]:
    """(base, offset): ``base`` holds the terms that are the same for every thread of a block and
    every loaded value (scalar parameters, block indices, block and grid sizes), ``offset`` the rest."""
    fixed = ("bid.", "bdim.", "gdim.")
    scalars = {name for name, _, is_pointer in facts.params if not is_pointer}
    base: dict = {}
    rest: dict = {}
    for m, c in poly.terms:
        uniform = all(s.startswith(fixed) or s in scalars for s in m)
        (base if uniform else rest)[m] = c
    return Poly._from(base), Poly._from(rest)


def value_range(poly: Poly, facts: KernelFacts, binding: Binding) -> tuple[int, int] | None:
    """The interval ``poly`` can take in any block under ``binding`` for any thread and any loaded
    value, by interval arithmetic over the opaque terms' recipes (``x & m``, ``x % m``, ``/``,
    ``>>``, ``min``, ``max``, selects); None when a term is unbounded (a loaded value used as is)."""
    bx, by, bz = binding.block
    gx, gy, gz = binding.grid if binding.grid is not None else (None, None, None)
    known: dict[str, tuple[int, int]] = {k: (v, v) for k, v in binding.values.items()}
    known.update({"bdim.x": (bx, bx), "bdim.y": (by, by), "bdim.z": (bz, bz),
                  "tid.x": (0, bx - 1), "tid.y": (0, by - 1), "tid.z": (0, bz - 1)})
    for axis, g in zip("xyz", (gx, gy, gz)):
        if g is not None:
            known[f"gdim.{axis}"] = (g, g)
            known[f"bid.{axis}"] = (0, g - 1)
    return _interval(poly, known, facts.opaque, 0)


def _interval(poly: Poly, known: Mapping[str, tuple[int, int]], opaque: Mapping[str, Opaque],
              depth: int) -> tuple[int, int] | None:
    if depth > 32:
        return None
    lo = hi = 0
    for m, c in poly.terms:
        term = (c, c)
        for s in m:
            iv = known.get(s)
            if iv is None:
                entry = opaque.get(s)
                iv = _recipe_interval(entry, known, opaque, depth + 1) if entry is not None else None
            if iv is None:
                return None
            products = [a * b for a in term for b in iv]
            term = (min(products), max(products))
        lo, hi = lo + term[0], hi + term[1]
    return lo, hi


def _recipe_interval(entry: Opaque, known: Mapping[str, tuple[int, int]], opaque: Mapping[str, Opaque],
                     depth: int) -> tuple[int, int] | None:
    recipe = entry.recipe
    if recipe is None:
        return None
    if recipe[0] == "select":
        a, b = _interval(recipe[4], known, opaque, depth), _interval(recipe[5], known, opaque, depth)
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    op, x, y = recipe
    yv = _interval(y, known, opaque, depth)
    xv = _interval(x, known, opaque, depth)
    if op == "&":
        # A non-negative mask bounds the result whatever the other operand is.
        masks = [v for v in (xv, yv) if v is not None and v[0] >= 0]
        return (0, min(v[1] for v in masks)) if masks else None
    if op == "%":
        if yv is None or yv[0] <= 0:
            return None
        bound = yv[1] - 1
        return (0, bound) if xv is not None and xv[0] >= 0 else (-bound, bound)
    if xv is None or yv is None:
        return None
    if op == "/" and yv[0] > 0:
        ends = [a // b if a >= 0 else -((-a) // b) for a in xv for b in yv]
        return min(ends), max(ends)
    if op == ">>" and yv[0] >= 0 and xv[0] >= 0:
        return xv[0] >> yv[1], xv[1] >> yv[0]
    if op in ("min", "max"):
        f = min if op == "min" else max
        return f(xv[0], yv[0]), f(xv[1], yv[1])
    return None


def shared_combine_loops(facts: KernelFacts) -> tuple[Reduction, ...]:
    """The looped ``shared_tree`` reductions plus every other loop that combines a shared array's
    slots in place (a slot written from another slot of the same array in the same loop): trees the
    analysis did not recognise by their update (a 2-D tree, a counted loop with ``pow``), candidates
    for a transformation to prove or refuse."""
    found = [r for r in facts.reductions if r.kind == "shared_tree" and r.loop is not None]
    seen = {(r.target, r.loop) for r in found}
    for w in facts.accesses:
        if w.space != "shared" or not w.writes or not w.loops:
            continue
        loop = w.loops[-1]
        if (w.array, loop) in seen:
            continue
        if any(r.array == w.array and r.reads and r.loops and r.loops[-1] == loop and r.index != w.index
               for r in facts.accesses if r.space == "shared"):
            found.append(Reduction("shared_tree", w.array, w.op or "+", w.line, w.user_line, loop))
            seen.add((w.array, loop))
    return tuple(found)


@dataclass(frozen=True)
class Functor:
    """A struct whose objects are called like functions (SHOC's texture readers): its data members
    in declaration order (the order of a brace initialiser) and its ``__device__ operator()``."""
    fields: tuple[str, ...]
    call: Node


def call_operators(root: Node, src: bytes) -> dict[str, Functor]:
    """Structs and classes of the file that define a ``__device__ operator()`` in their body, by name."""
    found: dict[str, Functor] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        for child in node.children:
            if child.type in ("struct_specifier", "class_specifier"):
                name_node, body = child.child_by_field_name("name"), child.child_by_field_name("body")
                if name_node is None or body is None:
                    continue
                fields: list[str] = []
                call = None
                for member in body.named_children:
                    if member.type == "field_declaration":
                        fields.extend(n for d in member.children_by_field_name("declarator")
                                      if (n := _declarator_name(d, src)))
                    elif member.type == "function_definition" and _function_name(member, src) == "operator()":
                        head = src[member.start_byte:(member.child_by_field_name("body") or member).start_byte]
                        call = member if b"__device__" in head else call
                if call is not None:
                    found[node_text(src, name_node)] = Functor(tuple(fields), call)
            elif child.type in ("declaration", "namespace_definition", "declaration_list", "linkage_specification",
                                "template_declaration"):
                stack.append(child)
    return found


def type_aliases(root: Node, src: bytes) -> frozenset[str]:
    """Names the file's ``typedef`` and ``using X = …;`` declarations give to types, at any scope."""
    found: set[str] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "type_definition":
            for d in node.children_by_field_name("declarator"):
                while d is not None and d.type != "type_identifier":
                    d = d.child_by_field_name("declarator")
                if d is not None:
                    found.add(node_text(src, d))
        elif node.type == "alias_declaration":
            name = node.child_by_field_name("name")
            if name is not None:
                found.add(node_text(src, name))
        elif node.type != "function_definition":
            stack.extend(node.children)
    return frozenset(found)


def is_pure_math(name: str) -> bool:
    """``name`` is a CUDA math function or intrinsic: a function of its arguments only (it reads
    no thread or block index and touches no memory)."""
    return _is_pure_math(name)


def block_strided_loops(facts: KernelFacts) -> tuple[LoopFact, ...]:
    """Loops whose iterations the threads of a block share out (``for (i = tid + c; i < n; i += blockDim.x)``):
    the start is ``tid.x`` plus a term, the step is ``bdim.x``, and that term and the bound are polynomials in
    neither the thread, the block's width nor an opaque value, so each value of the range is taken by exactly
    one thread of the block, whatever its width."""
    found = []
    width = Poly.sym("bdim.x")
    for loop in facts.loops:
        if loop.var is None or loop.start is None or loop.step is None or loop.bound is None or loop.step != width:
            continue
        offset = loop.start - Poly.sym("tid.x")
        if any(s.startswith(("tid.", "bdim.", "gdim.")) or is_opaque(s) for s in offset.symbols | loop.bound.symbols):
            continue
        found.append(loop)
    return tuple(found)
