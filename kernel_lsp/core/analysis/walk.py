"""The walk over a kernel's body: values as polynomials, every access recorded, loops and reductions."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from tree_sitter import Node

from kernel_lsp.core.analysis.binding import _data_dependent
from kernel_lsp.core.analysis.facts import (
    Access, Barrier, Comparison, Condition, IndexUse, KernelFacts, LoopFact, Opaque, Reduction, Test, WarpOperation,
    thread_dependence,
)
from kernel_lsp.core.analysis.program import (
    Alias, Functor, _file_constants, _instantiations, _Struct, _struct_layouts, _template_params, alias_table,
    call_operators,
)
from kernel_lsp.core.analysis.syntax import (
    _BUILTIN_NAMES, _assignment_counts, _declarator_name, _declared_names, _is_pure_math, _param_list, _strip_qualifiers,
    assigned_names, conditional_update, declared_anywhere, function_definitions, identifiers_in, in_constant_space,
    member_path, node_text, parse_text,
)
from kernel_lsp.core.consteval import TYPE_SIZES_BYTES, evaluate_int
from kernel_lsp.core.poly import ONE, ZERO, Poly
from kernel_lsp.core.source import Preprocessed

_MAX_INLINE_DEPTH = 3
_MAX_EXPR_DEPTH = 150
"""Expression nesting the walk follows by recursion; deeper parts are scanned flat."""
_MAX_NODES = 200_000
"""Expression nodes visited per kernel before the analysis stops (a generated 50,000-line kernel
must not hold a worker for minutes); what was not reached is reported as not modelled."""
_WARP = 32
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


@dataclass(frozen=True)
class _Pointer:
    """A pointer value: ``base`` array plus an element offset."""

    base: str
    space: str
    offset: Poly
    elem_type: str
    field: str | None = None
    """The member path it points to inside its element (``&p[i].count``), None for a whole element."""
    volatile: bool = False
    """It points to ``volatile`` data (declared so, or reached through a volatile pointer, cast or helper
    parameter): each access through it is meant to reach memory."""


@dataclass(frozen=True)
class _Place:
    """A location an lvalue names: an element of an array and a member path in it."""

    pointer: _Pointer
    index: Poly
    field: str | None
    wide: bool
    node: Node
    """The node the access is recorded at (the subscript of ``p[i].x``, the whole ``*q``)."""


_UNRESOLVED = object()
"""What :meth:`_Walker.place` answers for an lvalue it evaluated but could not resolve to memory."""


@dataclass(frozen=True)
class _Group:
    """A cooperative-groups object: ``block`` (``this_thread_block()``), ``tile`` of ``size`` threads
    (``tiled_partition<32>(…)``), ``coalesced`` or ``grid``."""

    kind: str
    size: int | None = None


_VOTES = ("__ballot_sync", "__any_sync", "__all_sync", "__uni_sync", "__activemask", "__match_any_sync",
          "__match_all_sync", "__ballot", "__any", "__all")
_BARRIER_SCOPE = {"__syncthreads": "block", "__syncthreads_count": "block", "__syncthreads_and": "block",
                  "__syncthreads_or": "block", "__syncwarp": "warp"}
_GROUP_MAKERS = {"this_thread_block": "block", "this_grid": "grid", "coalesced_threads": "coalesced",
                 "tiled_partition": "tile"}
_CG_REDUCE_OPS = {"plus": "+", "greater": "max", "less": "min", "bit_and": "&", "bit_or": "|", "bit_xor": "^"}
_VECTOR_COMPONENTS = {"x": 0, "y": 1, "z": 2, "w": 3}
_COMPARISON_OPS = ("<", "<=", ">", ">=", "==", "!=")


@dataclass(frozen=True)
class _Array:
    name: str
    space: str
    elem_type: str
    dims: tuple[int | None, ...]
    """Extents of a shared or local array, outermost first; () for a pointer parameter."""
    volatile: bool = False


_Value = Poly | _Pointer
_NOT_A_GROUP_CALL = object()


def _sides(test: Test) -> list[Poly] | None:
    """Both sides of every comparison of ``test``; None when a part of it is not a comparison."""
    if test[0] == "cmp":
        return [test[1].left, test[1].right]
    if test[0] in ("and", "or"):
        parts = [_sides(t) for t in test[1]]
        return None if any(p is None for p in parts) else [x for p in parts for x in p]
    if test[0] == "not":
        return _sides(test[1])
    return None


def _warp_uniform(poly: Poly, opaque: Mapping[str, Opaque], depth: int = 0) -> bool:
    """``poly`` is the same for the 32 lanes of a warp, as far as the analysis tells without a launch: it
    reads ``threadIdx.x`` only divided by a multiple of 32 (``tid / 32``, ``tid >> 5``), and no other
    thread index."""
    if depth > 32:
        return False
    for s in poly.symbols:
        if s.startswith("tid."):
            return False
        entry = opaque.get(s)
        if entry is None or not entry.deps:
            continue
        recipe = entry.recipe
        if recipe is not None and recipe[0] in ("/", ">>") and isinstance(recipe[2], Poly) and recipe[2].constant:
            k = recipe[2].constant
            if (k % _WARP == 0 if recipe[0] == "/" else k >= 5) and entry.deps <= {"tid.x"}:
                continue
        if recipe is None or not all(_warp_uniform(x, opaque, depth + 1) for x in recipe if isinstance(x, Poly)):
            return False
    return True


_INDEX_ARITHMETIC = ("+", "-", "*")


def _index_arithmetic(node: Node, src: bytes) -> bool:
    """``node`` is an operand of ``+``, ``-``, ``*``, a cast, a sign or parentheses: the expression
    combining a thread index goes on above it."""
    parent = node.parent
    if parent is None:
        return False
    if parent.type == "parenthesized_expression":
        return True
    if parent.type == "cast_expression":
        # An integer cast keeps the index; a conversion to floating point ends it.
        type_node = parent.child_by_field_name("type")
        return type_node is None or not any(w in node_text(src, type_node) for w in ("float", "double", "half"))
    op = parent.child_by_field_name("operator")
    if parent.type == "binary_expression" and op is not None:
        return node_text(src, op) in _INDEX_ARITHMETIC
    if parent.type == "unary_expression" and op is not None:
        return node_text(src, op) in ("+", "-")
    return False


def _ends_in_exit(node: Node | None) -> bool:
    """The statement always ends by leaving its block: a ``return``, ``continue`` or ``break``, or a
    block whose last statement is one."""
    while node is not None and node.type == "compound_statement":
        inner = [c for c in node.named_children if c.type != "comment"]
        node = inner[-1] if inner else None
    return node is not None and node.type in ("return_statement", "continue_statement", "break_statement")


def _param_shapes(fn: Node, src: bytes) -> list[tuple[bool, bool, bool]]:
    """(is a reference, points to or names const data, volatile data) for each parameter of ``fn``."""
    declarator = fn.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    params = declarator.child_by_field_name("parameters") if declarator is not None else None
    out = []
    for p in params.named_children if params is not None else []:
        if p.type not in ("parameter_declaration", "optional_parameter_declaration"):
            continue
        decl = p.child_by_field_name("declarator")
        is_ref = decl is not None and decl.type == "reference_declarator"
        out.append((is_ref, _data_const(p, src), _data_volatile(p, src)))
    return out


def _data_const(declaration: Node, src: bytes) -> bool:
    """The data a declared pointer or reference points to is const (``const float* p``, ``float const& r``),
    or its type is deduced (``auto p = in + k;`` keeps ``in``'s constness)."""
    for c in declaration.children:
        if c.type == "type_qualifier" and node_text(src, c) == "const":
            return True
        if c.type == "placeholder_type_specifier":
            return True
    return False


def _data_volatile(declaration: Node, src: bytes) -> bool:
    """The declared array, pointer or reference is to ``volatile`` data (``volatile float* v``)."""
    return any(c.type == "type_qualifier" and node_text(src, c) == "volatile" for c in declaration.children)


def _volatile(value, volatile: bool):
    """``value`` seen through a declaration to volatile data when ``volatile`` (a pointer or a place)."""
    if not volatile:
        return value
    if isinstance(value, _Pointer):
        return replace(value, volatile=True)
    if isinstance(value, _Place):
        return replace(value, pointer=replace(value.pointer, volatile=True))
    return value


def _join(path: str | None, name: str | None) -> str | None:
    """A member path extended by ``name`` (``pos`` + ``x`` → ``pos.x``)."""
    if name is None:
        return path
    return f"{path}.{name}" if path else name


class _Guard:
    """The code walked inside runs under one more condition (see :meth:`_Walker.guarded`)."""

    def __init__(self, walker: _Walker, cid: int, value: bool):
        self.walker, self.entry = walker, (cid, value)

    def __enter__(self) -> None:
        self.walker.guards.append(self.entry)

    def __exit__(self, *exc: object) -> None:
        self.walker.guards.pop()


#: CUDA's atomic functions (and their ``_block``/``_system`` scopes): a helper the file defines under
#: another name that starts with ``atomic`` (``atomic_add``, ``atomicMaxFloat``) is walked as a helper.
_ATOMIC_INTRINSICS = frozenset(f"atomic{op}{scope}" for op in ("Add", "Sub", "Exch", "Min", "Max", "Inc", "Dec", "CAS",
                                                               "And", "Or", "Xor")
                               for scope in ("", "_block", "_system"))


class _Budget(Exception):
    pass


class _Walker:
    def __init__(self, src: bytes, pre: Preprocessed | None, helpers: Mapping[str, Node],
                 structs: Mapping[str, _Struct], constants: Mapping[str, str],
                 overloads: Mapping[str, tuple[Node, ...]] | None = None) -> None:
        self.src = src
        self.pre = pre
        self.helpers = helpers
        self.overloads = overloads or {}
        """Every ``__device__`` definition of a name (overloads, a template and its explicit
        specializations): a call takes the one its arguments' types select (:meth:`chosen_helper`)."""
        self.scalar_types: dict[str, str] = {}
        """Declared types of the scalar parameters and locals in scope (aliases and template types resolved)."""
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
        self.code_escapes = 0
        """Pointers handed to code the analysis does not see (a cast only adds to ``escaped``: what is written
        through it is still seen)."""
        self.overrides: dict[int, _Value | None] = {}
        self.depth = 0
        self.unknown_calls = 0
        self.types: dict[str, str] = {}
        """Template type parameters bound by the instantiation (``T`` → ``float``)."""
        self.functors: Mapping[str, Functor] = {}
        """Structs of the file with a ``__device__ operator()``, by name: their objects are called inline."""
        self.objects: dict[str, tuple[Functor, dict[str, _Value | None]]] = {}
        """Local function objects (``texReader r = {vec};``): their struct and their members' values."""
        self.aliases: Mapping[str, Alias] = {}
        """``typedef`` and ``using`` names of the file: ``(floatX)(x)`` with one of them is a cast, and a
        parameter ``Data_ptr p`` with ``typedef float* Data_ptr;`` is a pointer to float."""
        self.conditions: list[Condition] = []
        self.guards: list[tuple[int, bool]] = []
        """The conditions deciding whether the code being walked runs, outermost first (see :attr:`Access.guards`)."""
        self.barriers: list[Barrier] = []
        self.warp_ops: list[WarpOperation] = []
        self.refs: dict[str, _Place] = {}
        """References (``float& r = out[i];``, a helper's ``float& x`` bound to ``out[i]``): the location each names."""
        self.groups: dict[str, _Group] = {}
        """Cooperative-groups objects in scope, by name."""
        self.nonconst: set[str] = set()
        self.nonconst_locals: set[str] = set()
        """Local pointers declared to non-const data: a parameter assigned to one is copied to non-const."""
        self.value_types: set[str] = set()
        self.implicit: list[str] = []
        self.group_values: dict[str, Poly] = {}
        self.index_uses: list[IndexUse] = []
        self.index_seen = 0
        """Builtins read since the innermost expression being walked began (see :class:`IndexUse`)."""
        """Thread and block indices read through cooperative groups (``cta.thread_rank()``)."""
        self.complete = True
        self.nodes = 0

    @property
    def type_names(self) -> frozenset[str]:
        return frozenset(self.aliases)

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
        path = _join(pointer.field, field_name)
        member = self.member(pointer.elem_type, path) if path is not None else None
        self.accesses.append(Access(
            array=pointer.base, space=pointer.space, kind=kind, op=op, index=pointer.offset + index,
            elem_type=pointer.elem_type, elem_bytes=self.elem_bytes(pointer.elem_type), field=path,
            line=line, user_line=self.user_line(line), text=node_text(self.src, node)[:120],
            loops=tuple(self.loop_stack), via=tuple(self.via), wide=wide,
            field_offset_bytes=member[0] if member else None, field_bytes=member[1] if member else None,
            span=(node.start_byte, node.end_byte), guards=tuple(self.guards), volatile=pointer.volatile,
        ))

    def member(self, elem_type: str, path: str) -> tuple[int, int] | None:
        """(byte offset, byte size) of the member ``path`` (``pos.x``) in ``elem_type``, through nested
        structs and CUDA's vector types; None when a layout is not known."""
        offset, size, type_ = 0, None, elem_type
        for name in path.split("."):
            layout = self.structs.get(type_)
            if layout is not None and name in layout.fields:
                at, size = layout.fields[name]
                offset += at
                type_ = layout.types.get(name, "")
                continue
            vector = re.fullmatch(r"(u?(?:char|short|int|long|longlong)|float|double)([1-4])", type_)
            if vector is not None and name in _VECTOR_COMPONENTS and _VECTOR_COMPONENTS[name] < int(vector.group(2)):
                scalar = {"uchar": "unsigned char", "ushort": "unsigned short", "uint": "unsigned int",
                          "ulong": "unsigned long", "longlong": "long long", "ulonglong": "unsigned long long"}.get(
                    vector.group(1), vector.group(1))
                size = TYPE_SIZES_BYTES.get(scalar)
                if size is None:
                    return None
                offset += size * _VECTOR_COMPONENTS[name]
                type_ = scalar
                continue
            return None
        return (offset, size) if size is not None else None

    def place(self, node: Node | None) -> _Place | object | None:
        """The memory location the expression ``node`` names: an element of an array (``a[i]``, ``*p``,
        ``q->m``, ``p[i].pos.x``, a reference) with its member path. None when ``node`` is no such
        expression (nothing was evaluated), :data:`_UNRESOLVED` when it is one whose array could not be
        resolved (its parts were evaluated)."""
        if node is None:
            return None
        kind = node.type
        if kind == "parenthesized_expression" and node.named_children:
            return self.place(node.named_children[-1])
        if kind == "subscript_expression":
            found = self.element(node)
            if found is None:
                return _UNRESOLVED
            pointer, index, wide = found
            return _Place(pointer, index, None, wide, node)
        if kind == "pointer_expression":
            op = node.child_by_field_name("operator")
            if op is None or node_text(self.src, op) != "*":
                return None
            pointer = self.expr(node.child_by_field_name("argument"))
            return _Place(pointer, ZERO, None, False, node) if isinstance(pointer, _Pointer) else _UNRESOLVED
        if kind == "identifier":
            name = node_text(self.src, node)
            if name in self.refs:
                return self.refs[name]
            if name in self.arrays and not self.arrays[name].dims and name not in self.env:
                a = self.arrays[name]
                return _Place(_Pointer(a.name, a.space, ZERO, a.elem_type, volatile=a.volatile), ZERO, None, False, node)
            return None
        if kind == "field_expression":
            arg, fld = node.child_by_field_name("argument"), node.child_by_field_name("field")
            if arg is None or fld is None:
                return None
            name = node_text(self.src, fld)
            operator = next((c for c in node.children if c.type in ("->", ".")), None)
            if operator is not None and operator.type == "->":
                if arg.type == "identifier" and node_text(self.src, arg) in _BUILTINS:
                    return None
                pointer = self.expr(arg)
                return _Place(pointer, ZERO, _join(pointer.field, name), False, arg) if isinstance(pointer, _Pointer) \
                    else _UNRESOLVED
            if arg.type == "identifier" and node_text(self.src, arg) in _BUILTINS and node_text(self.src, arg) not in self.env:
                return None
            inner = self.place(arg)
            if isinstance(inner, _Place):
                return _Place(inner.pointer, inner.index, _join(inner.field, name), inner.wide, inner.node)
            return inner
        return None

    def at(self, place: _Place, kind: str, op: str | None) -> None:
        """Record an access of ``kind`` at ``place``."""
        self.record(place.pointer, place.index, kind, op, place.node, place.field, place.wide)

    def condition(self, kind: str, node: Node | None, statement: Node, value: _Value | None) -> int:
        """A :class:`Condition` for the test ``node``, whose ``value`` the caller evaluated; its id."""
        test = self.test(node)
        text = node_text(self.src, node) if node is not None else ""
        poly = value if isinstance(value, Poly) else value.offset if isinstance(value, _Pointer) else None
        deps = thread_dependence(poly, self.opaque) if poly is not None else frozenset()
        sides = _sides(test)
        uniform = not deps or (all(_warp_uniform(x, self.opaque) for x in sides) if sides is not None
                               else poly is not None and _warp_uniform(poly, self.opaque))
        cid = len(self.conditions)
        line = (node or statement).start_point[0]
        self.conditions.append(Condition(
            cid, kind, test, text[:160], bool(deps), not uniform and self.splits_warp(node), line, self.user_line(line),
            tuple(self.loop_stack), tuple(self.via),
            (node.start_byte, node.end_byte) if node is not None else (statement.start_byte, statement.start_byte),
            (statement.start_byte, statement.end_byte), uniform))
        return cid

    def quietly(self, node: Node | None) -> _Value | None:
        """The value of ``node`` without recording its accesses again (it was evaluated already)."""
        saved = (len(self.accesses), len(self.reductions), len(self.conditions), len(self.barriers), len(self.index_uses),
                 len(self.implicit), len(self.warp_ops), self.syncs, self.shuffles, self.unknown_calls, set(self.escaped),
                 self.code_escapes, set(self.nonconst), dict(self.env), self.index_seen)
        try:
            return self.expr(node)
        finally:
            (accesses, reductions, conditions, barriers, uses, implicit, warp_ops, self.syncs, self.shuffles,
             self.unknown_calls, self.escaped, self.code_escapes, self.nonconst, self.env, self.index_seen) = saved
            del self.accesses[accesses:], self.reductions[reductions:], self.conditions[conditions:]
            del self.barriers[barriers:], self.index_uses[uses:], self.implicit[implicit:], self.warp_ops[warp_ops:]

    def test(self, node: Node | None) -> Test:
        """The condition ``node`` as a :data:`~kernel_lsp.core.analysis.facts.Test`, its comparisons
        on polynomials where the values are ones."""
        while node is not None and node.type in ("parenthesized_expression", "condition_clause") and node.named_children:
            node = node.named_children[-1]
        if node is None:
            return ("opaque",)
        if node.type == "unary_expression":
            op = node.child_by_field_name("operator")
            if op is not None and node_text(self.src, op) == "!":
                return ("not", self.test(node.child_by_field_name("argument")))
        if node.type == "binary_expression":
            op_node = node.child_by_field_name("operator")
            op = node_text(self.src, op_node) if op_node is not None else ""
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if op in ("&&", "||"):
                parts: list[Test] = []
                for side in (left, right):
                    t = self.test(side)
                    parts.extend(t[1] if t[0] == ("and" if op == "&&" else "or") else (t,))
                return ("and" if op == "&&" else "or", tuple(parts))
            if op in _COMPARISON_OPS:
                lv, rv = self.quietly(left), self.quietly(right)
                if isinstance(lv, Poly) and isinstance(rv, Poly):
                    return ("cmp", Comparison(lv, op, rv))
        return ("opaque",)

    def splits_warp(self, node: Node | None) -> bool:
        """A thread-dependent test in ``node`` that part of a warp passes: ``==``/``!=`` against a
        constant, an order comparison with a constant that is not a multiple of 32, or a ``%``/``&``
        of a thread-dependent value."""
        stack = [node] if node is not None else []
        while stack:
            n = stack.pop()
            if n.type == "binary_expression":
                op_node = n.child_by_field_name("operator")
                left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
                op = node_text(self.src, op_node) if op_node is not None else ""
                if left is not None and right is not None:
                    lv, rv = self.quietly(left), self.quietly(right)
                    ld = isinstance(lv, Poly) and bool(thread_dependence(lv, self.opaque))
                    rd = isinstance(rv, Poly) and bool(thread_dependence(rv, self.opaque))
                    if op in ("%", "&") and (ld or rd):
                        return True
                    if op in _COMPARISON_OPS:
                        for dependent, other in ((ld, rv), (rd, lv)):
                            value = other.constant if isinstance(other, Poly) else None
                            if dependent and value is not None and (op in ("==", "!=") or value % _WARP != 0):
                                return True
                        continue  # its operands were judged as values
            stack.extend(n.named_children)
        return False

    def guarded(self, cid: int, value: bool):
        """A context in which the code walked runs under condition ``cid`` having ``value``."""
        return _Guard(self, cid, value)

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
        seen = self.index_seen
        try:
            if handler is not None:
                value = handler(node)
            else:
                value = self.fresh(node_text(self.src, node), [self.expr(c) for c in node.named_children])
        finally:
            self.depth -= 1
        if self.index_seen != seen and not _index_arithmetic(node, self.src):
            # The largest expression of + - * around a builtin: how the thread's indices are combined.
            self.index_seen = seen
            line = node.start_point[0]
            # Pointer arithmetic (``*(a + Size * gid + t)``) combines the indices in the pointer's element offset.
            combined = value if isinstance(value, Poly) else value.offset if isinstance(value, _Pointer) else None
            self.index_uses.append(IndexUse(node_text(self.src, node)[:120], combined, line, self.user_line(line),
                                            tuple(self.via), (node.start_byte, node.end_byte)))
        return value

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
        if name in self.refs:
            place = self.refs[name]
            self.at(place, "read", None)
            return self.fresh(name, [place.index])
        if name in self.env:
            return self.env[name]
        if name in self.arrays:
            a = self.arrays[name]
            return _Pointer(a.name, a.space, ZERO, a.elem_type, volatile=a.volatile)
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
        self.value_types.add(self.resolve_type(type_text)[0])
        if isinstance(value, Poly) and any(w in type_text for w in ("float", "double", "half")):
            return self.fresh(node_text(self.src, node), [value])
        if isinstance(value, _Pointer) and "*" in type_text:
            return _volatile(self.retype(value, self.ty(_strip_qualifiers(type_text)), node, "const" in type_text.split("*")[0]),
                             "volatile" in type_text.split("*")[0].split())
        return value

    def ty(self, name: str) -> str:
        return self.types.get(name, name)

    def params_of(self, fn: Node) -> list[tuple[str, str, bool]]:
        """(name, element or scalar type, is pointer) of ``fn``'s parameters, template parameters and
        ``typedef``/``using`` aliases resolved (``Data_ptr p`` is a pointer to float)."""
        out = []
        for name, type_, is_pointer in _param_list(fn, self.src):
            base, depth, _ = self.resolve_type(type_)
            out.append((name, base, is_pointer or depth > 0))
        return out

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
        offset is re-expressed in the new elements, exactly or not at all. The cast pointer is the same
        array's: its loads and stores are recorded as the array's (a wide element each), and where it goes
        further (an unknown call, a store of the pointer) it escapes there. A cast to a pointer to non-const
        data keeps ``const`` off the parameter (the cast would cast it away)."""
        if not to_const:
            self.copied_to_nonconst(pointer)
        if elem_type in ("void", pointer.elem_type):
            return pointer
        old, new = self.elem_bytes(pointer.elem_type), self.elem_bytes(elem_type)
        if old is None or new is None:
            return self.fresh(node_text(self.src, node), [pointer])
        scaled = pointer.offset.scale(old).exact_div(new)
        if scaled is None:
            return self.fresh(node_text(self.src, node), [pointer])
        return _Pointer(pointer.base, pointer.space, scaled, elem_type, volatile=pointer.volatile)

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
            return _Pointer(base.base, base.space, base.offset + (rest if sign == "+" else -rest), base.elem_type, volatile=base.volatile)
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
        left = self.env[name] if name in self.env else _Pointer(name, self.arrays[name].space, ZERO, self.arrays[name].elem_type,
                                                                     volatile=self.arrays[name].volatile)
        right = self.expr(value_node.child_by_field_name("argument"))
        if isinstance(left, _Pointer) and isinstance(right, Poly) and op in "+-":
            return _Pointer(left.base, left.space, left.offset + (right if op == "+" else -right), left.elem_type, volatile=left.volatile)
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
                self.index_seen += 1
                return Poly.sym(symbol)
        if arg is not None and fld is not None and arg.type == "call_expression":
            dim = self.group_dim3(arg, node_text(self.src, fld))
            if dim is not None:
                return dim
        place = self.place(node)
        if isinstance(place, _Place):
            self.at(place, "read", None)
            return self.fresh(node_text(self.src, node), [place.index])
        if place is _UNRESOLVED:
            return self.fresh(node_text(self.src, node))
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
        op_node = node.child_by_field_name("operator")
        op = node_text(self.src, op_node) if op_node is not None else ""
        left = self.expr(node.child_by_field_name("left"))
        if op in ("&&", "||"):
            # The right operand runs only where the left one decided it must.
            cid = self.condition(op.replace("&&", "and").replace("||", "or"), node.child_by_field_name("left"), node, left)
            with self.guarded(cid, op == "&&"):
                right = self.expr(node.child_by_field_name("right"))
            return self.fresh(node_text(self.src, node), [left, right])
        right = self.expr(node.child_by_field_name("right"))
        if isinstance(left, _Pointer) and isinstance(right, Poly) and op in "+-":
            return _Pointer(left.base, left.space, left.offset + (right if op == "+" else -right), left.elem_type, volatile=left.volatile)
        if isinstance(right, _Pointer) and isinstance(left, Poly) and op == "+":
            return _Pointer(right.base, right.space, right.offset + left, right.elem_type, volatile=right.volatile)
        if isinstance(left, Poly) and isinstance(right, Poly):
            combined = _arith(op, left, right)
            if combined is not None:
                return combined
            if op in _COMPUTABLE:
                return self.fresh(node_text(self.src, node), [left, right], (op, left, right))
        return self.fresh(node_text(self.src, node), [left, right])

    def e_conditional_expression(self, node: Node) -> _Value | None:
        cond = self.expr(node.child_by_field_name("condition"))
        cid = self.condition("select", node.child_by_field_name("condition"), node, cond)
        with self.guarded(cid, True):
            a = self.expr(node.child_by_field_name("consequence"))
        with self.guarded(cid, False):
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
        left, right = self.quietly(cond.child_by_field_name("left")), self.quietly(cond.child_by_field_name("right"))
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

    def group_dim3(self, call: Node, component: str) -> Poly | None:
        """``g.thread_index().x``, ``g.group_index().y``, ``g.group_dim().z`` … of a thread block."""
        fn = call.child_by_field_name("function")
        if fn is None or fn.type != "field_expression":
            return None
        group = self.group_of(fn.child_by_field_name("argument"))
        method = fn.child_by_field_name("field")
        if group is None or group.kind != "block" or method is None or component not in ("x", "y", "z"):
            return None
        prefix = {"thread_index": "tid", "group_index": "bid", "group_dim": "bdim", "dim_threads": "bdim"}.get(
            node_text(self.src, method))
        if prefix is None:
            return None
        self.builtins.add(f"{prefix}.{component}")
        self.implicit.append(node_text(self.src, call)[:80])
        self.group_values["".join(f"{node_text(self.src, call)}.{component}".split())] = Poly.sym(f"{prefix}.{component}")
        return Poly.sym(f"{prefix}.{component}")

    def e_subscript_expression(self, node: Node) -> _Value | None:
        return self.subscript(node, "read", None)

    def e_assignment_expression(self, node: Node) -> _Value | None:
        return self.assign(node)

    def e_update_expression(self, node: Node) -> _Value | None:
        arg = node.child_by_field_name("argument")
        op = node.child_by_field_name("operator")
        op_text = node_text(self.src, op) if op is not None else "++"
        if arg is not None and arg.type == "identifier" and node_text(self.src, arg) in self.refs:
            self.at(self.refs[node_text(self.src, arg)], "update", op_text[0])
            return self.fresh(node_text(self.src, node))
        if arg is not None and arg.type == "identifier":
            name = node_text(self.src, arg)
            old = self.env.get(name)
            if isinstance(old, Poly):
                self.env[name] = old + (ONE if op_text == "++" else -ONE)
            elif isinstance(old, _Pointer):
                self.env[name] = _Pointer(old.base, old.space, old.offset + (ONE if op_text == "++" else -ONE), old.elem_type, volatile=old.volatile)
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
        place = self.place(node)
        if isinstance(place, _Place):
            self.at(place, kind, op)
        elif place is None and node.type == "field_expression":
            # A member of a local value (``s.x = …``): the object is no memory the analysis tracks, but the
            # local changes, and a member a loop updates (``f.x += …``) is an accumulator of that loop.
            self.expr(node.child_by_field_name("argument"))
            path = member_path(node, self.src)
            if path is not None:
                base = path.split(".", 1)[0]
                if base in self.env:
                    self.env[base] = self.fresh(base, [self.env[base]])
                if kind == "update" and op is not None:
                    self.note_accumulator(path, op, node, base)
        elif place is None and node.type != "identifier":
            self.expr(node)

    def address(self, node: Node | None) -> _Value | None:
        """``&a[i]`` as a pointer value (no access: the callee or the store decides)."""
        if node is None:
            return None
        if node.type == "parenthesized_expression" and node.named_children:
            return self.address(node.named_children[-1])
        if node.type == "identifier":
            name = node_text(self.src, node)
            if name in self.arrays and name not in self.refs:
                a = self.arrays[name]
                return _Pointer(a.name, a.space, ZERO, a.elem_type, volatile=a.volatile)
        place = self.place(node)
        if isinstance(place, _Place):
            p = place.pointer
            return _Pointer(p.base, p.space, p.offset + place.index, p.elem_type, place.field, volatile=p.volatile)
        if place is _UNRESOLVED:
            return self.fresh(node_text(self.src, node))
        return self.fresh(node_text(self.src, node), [self.expr(node)])

    def assign(self, node: Node) -> _Value | None:
        left = node.child_by_field_name("left")
        op_node = node.child_by_field_name("operator")
        op = node_text(self.src, op_node) if op_node is not None else "="
        right_node = node.child_by_field_name("right")
        right = self.expr(right_node)
        if left is not None and left.type == "identifier" and node_text(self.src, left) in self.refs:
            self.at(self.refs[node_text(self.src, left)], "write" if op == "=" else "update", _COMPOUND.get(op))
            return right
        if left is not None and left.type == "identifier":
            name = node_text(self.src, left)
            group = self.group_of(right_node) if op == "=" else None
            if group is not None:
                self.groups[name] = group
            if name in self.nonconst_locals and isinstance(right, _Pointer):
                self.copied_to_nonconst(right)
            if name in self.arrays and not self.arrays[name].dims and name not in self.env:
                self.lvalue(left, "write" if op == "=" else "update", _COMPOUND.get(op))
                return right
            old = self.env.get(name)
            if op == "=":
                self.env[name] = right if right is not None else self.fresh(name)
                self.accumulator_by_call(name, right_node, node)
            else:
                if not isinstance(old, _Pointer):
                    self.note_accumulator(name, _COMPOUND.get(op, op), node)
                combined = _arith(_COMPOUND.get(op, ""), old, right) if isinstance(old, Poly) and isinstance(right, Poly) else None
                if isinstance(old, _Pointer) and isinstance(right, Poly) and op in ("+=", "-="):
                    self.env[name] = _Pointer(old.base, old.space, old.offset + (right if op == "+=" else -right), old.elem_type, volatile=old.volatile)
                else:
                    self.env[name] = combined if combined is not None else self.fresh(name, [old, right])
            return self.env[name]
        self.lvalue(left, "write" if op == "=" else "update", _COMPOUND.get(op))
        self.escape([right])
        return right

    def note_accumulator(self, name: str, op: str, node: Node, base: str | None = None) -> None:
        """``name`` (a local, or ``base``'s member ``base.x``) updated by ``op`` in the innermost loop."""
        if not self.loop_stack or (base or name) in self.declared_in_loop[-1] or op not in ("+", "*", "|", "&", "^", "max", "min"):
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
        group_call = self.group_call(node, fn, args, short)
        if group_call is not _NOT_A_GROUP_CALL:
            return group_call
        if short.startswith("atomic") and args and (short in _ATOMIC_INTRINSICS or short not in self.helpers):
            if args[0].type == "pointer_expression" and node_text(self.src, args[0]).startswith("&"):
                target = self.address(args[0].child_by_field_name("argument"))
            else:
                target = self.expr(args[0])
            values = [self.expr(a) for a in args[1:]]
            if isinstance(target, _Pointer):
                self.record(target, ZERO, "atomic", short, node)
                index = target.offset
                line = node.start_point[0]
                loop = self.loop_stack[-1] if self.loop_stack else None
                if not thread_dependence(index, self.opaque):
                    self.reductions.append(Reduction("atomic", target.base, short, line, self.user_line(line), loop))
                elif _data_dependent(index, self.opaque):
                    self.reductions.append(Reduction("atomic_scatter", target.base, short, line, self.user_line(line), loop))
            else:
                self.unknowns.append(f"line {self.user_line_text(node)}: {short} on `{node_text(self.src, args[0])}`, "
                                     "whose target array could not be resolved")
            return self.fresh(node_text(self.src, node), values)
        if short in _SYNCS:
            values = [self.expr(a) for a in args]
            self.barrier(_BARRIER_SCOPE.get(short, "block"), node)
            return self.fresh(node_text(self.src, node), values) if args else None
        if short in _VOTES:
            self.warp_operation(node)
            return self.fresh(node_text(self.src, node), [self.expr(a) for a in args])
        if short in _SHUFFLES:
            self.warp_operation(node)
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
        helper = self.chosen_helper(short, args)
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

    def chosen_helper(self, name: str, args: list[Node]) -> Node | None:
        """The definition of helper ``name`` a call with ``args`` reaches: of several (overloads, a
        template's explicit specializations ``template <> float f(const float v, float* p)``), the one
        whose parameter types agree with the arguments' known types and match most of them; a
        template's own type parameters match any type."""
        found = self.overloads.get(name, ())
        if len(found) <= 1:
            return self.helpers.get(name)
        arg_types = [self.static_type(a) for a in args]
        best, best_score = None, -1
        for definition in found:
            params = _param_list(definition, self.src)
            if len(params) != len(args):
                continue
            free = {n for n, is_type in _template_params(definition, self.src) if is_type}
            score = 0
            for (_, ptype, is_pointer), known in zip(params, arg_types):
                if known is None or _strip_qualifiers(ptype) in free:
                    continue
                base, depth, _ = self.resolve_type(ptype)
                if (base, is_pointer or depth > 0) != known:
                    score = -1
                    break
                score += 1
            if score >= best_score:
                best, best_score = definition, score
        return best if best is not None else self.helpers.get(name)

    def static_type(self, node: Node) -> tuple[str, bool] | None:
        """(base type, is a pointer) of an argument as far as declarations tell, without walking it (so
        nothing is recorded twice): a literal, a variable, an element of a known array, pointer
        arithmetic, a cast; None when unknown."""
        while node.type == "parenthesized_expression" and node.named_children:
            node = node.named_children[-1]
        text = node_text(self.src, node)
        if node.type == "number_literal":
            floating = "." in text or ("e" in text.lower() and not text.lower().startswith("0x"))
            if text.lower().endswith("f") and not text.lower().startswith("0x"):
                return "float", False
            return ("double" if floating else "int"), False
        if node.type == "identifier":
            value = self.env.get(text)
            if isinstance(value, _Pointer):
                return self.ty(value.elem_type), True
            if text in self.arrays and not self.arrays[text].dims:
                return self.ty(self.arrays[text].elem_type), True
            return (self.scalar_types[text], False) if text in self.scalar_types else None
        if node.type == "subscript_expression":
            inner = self.static_type(node.child_by_field_name("argument"))
            return (inner[0], False) if inner is not None and inner[1] else None
        if node.type == "pointer_expression":
            inner = self.static_type(node.child_by_field_name("argument"))
            address = text.startswith("&")
            # ``&x[i]`` points to an element; ``*p`` is one.
            if inner is None or inner[1] == address:
                return None
            return inner[0], address
        if node.type == "binary_expression" and node_text(self.src, node.child_by_field_name("operator")) in ("+", "-"):
            sides = [self.static_type(node.child_by_field_name(f)) for f in ("left", "right")]
            pointers = [t for t in sides if t is not None and t[1]]
            return pointers[0] if len(pointers) == 1 else None
        if node.type == "cast_expression":
            type_node = node.child_by_field_name("type")
            if type_node is not None:
                written = node_text(self.src, type_node)
                base, depth, _ = self.resolve_type(written.replace("*", " "))
                return base, "*" in written or depth > 0
        return None

    def warp_operation(self, node: Node) -> None:
        self.shuffles += 1
        line = node.start_point[0]
        self.warp_ops.append(WarpOperation(node_text(self.src, node)[:80], line, self.user_line(line), tuple(self.loop_stack),
                                           tuple(self.via), (node.start_byte, node.end_byte)))

    def barrier(self, scope: str, node: Node) -> None:
        self.syncs += 1
        line = node.start_point[0]
        self.barriers.append(Barrier(scope, node_text(self.src, node)[:80], line, self.user_line(line),
                                     tuple(self.loop_stack), tuple(self.via), tuple(self.guards),
                                     (node.start_byte, node.end_byte)))

    def group_of(self, node: Node | None) -> _Group | None:
        """The cooperative group an expression denotes: a name bound to one, or a call that makes one
        (``cg::this_thread_block()``, ``cg::tiled_partition<32>(block)``, ``tiled_partition(block, 16)``)."""
        while node is not None and node.type == "parenthesized_expression" and node.named_children:
            node = node.named_children[-1]
        if node is None:
            return None
        if node.type == "identifier":
            return self.groups.get(node_text(self.src, node))
        if node.type != "call_expression":
            return None
        fn = node.child_by_field_name("function")
        name = node_text(self.src, fn) if fn is not None else ""
        short = name.split("<", 1)[0].rsplit("::", 1)[-1].strip()
        kind = _GROUP_MAKERS.get(short)
        if kind is None:
            return None
        if kind != "tile":
            return _Group(kind)
        size = None
        template = re.search(r"<\s*([^<>]+?)\s*>", name)
        args = node.child_by_field_name("arguments")
        if template is not None:
            size = evaluate_int(template.group(1), self.constants)
        elif args is not None and args.named_child_count == 2:
            size = evaluate_int(node_text(self.src, args.named_children[1]), self.constants)
        return _Group("tile", size)

    def group_call(self, node: Node, fn: Node | None, args: list[Node], short: str) -> object:
        """A cooperative-groups call (a method of a group object, ``cg::sync``, ``cg::reduce``): its
        value, or :data:`_NOT_A_GROUP_CALL`. Barriers, shuffles, votes and reductions are recorded as
        their intrinsic forms are; ranks and sizes are the thread-index polynomials they stand for."""
        if fn is not None and fn.type == "field_expression":
            group = self.group_of(fn.child_by_field_name("argument"))
            method = fn.child_by_field_name("field")
            if group is None or method is None:
                return _NOT_A_GROUP_CALL
            return self.group_method(group, node_text(self.src, method), node, args)
        if short in _GROUP_MAKERS and self.group_of(node) is not None:
            for a in args:
                if self.group_of(a) is None:
                    self.expr(a)
            return self.fresh(node_text(self.src, node))
        if short == "sync" and len(args) == 1 and self.group_of(args[0]) is not None:
            group = self.group_of(args[0])
            self.barrier({"block": "block", "grid": "grid"}.get(group.kind, "warp"), node)
            return None
        if short in ("reduce", "inclusive_scan", "exclusive_scan") and args and self.group_of(args[0]) is not None:
            values = [self.expr(a) for a in args[1:2]]
            op_name = node_text(self.src, args[2]).split("<", 1)[0].rsplit("::", 1)[-1].strip() if len(args) > 2 else "plus"
            self.warp_operation(node)
            line = node.start_point[0]
            self.reductions.append(Reduction("warp_shuffle", f"cg::{short}", _CG_REDUCE_OPS.get(op_name, op_name), line,
                                             self.user_line(line), self.loop_stack[-1] if self.loop_stack else None))
            return self.fresh(node_text(self.src, node), values)
        return _NOT_A_GROUP_CALL

    def group_method(self, group: _Group, method: str, node: Node, args: list[Node]) -> _Value | None:
        linear = Poly.sym("tid.x") + Poly.sym("bdim.x") * (Poly.sym("tid.y") + Poly.sym("bdim.y") * Poly.sym("tid.z"))
        threads = Poly.sym("bdim.x") * Poly.sym("bdim.y") * Poly.sym("bdim.z")
        text = node_text(self.src, node)
        if method == "sync":
            self.barrier({"block": "block", "grid": "grid"}.get(group.kind, "warp"), node)
            return None
        if group.kind == "tile" and group.size and method in ("size", "num_threads"):
            # A tile's size is its template argument: a constant, no thread index read.
            return Poly.const(group.size)
        if method in ("thread_rank", "size", "num_threads", "meta_group_rank", "meta_group_size"):
            self.builtins.update({"tid.x", "tid.y", "tid.z", "bdim.x", "bdim.y", "bdim.z"} & linear.symbols)
            self.implicit.append(text[:80])
        if group.kind == "block":
            if method == "thread_rank":
                self.group_values["".join(text.split())] = linear
                return linear
            if method in ("size", "num_threads"):
                self.group_values["".join(text.split())] = threads
                return threads
        if group.kind == "tile" and group.size:
            size = Poly.const(group.size)
            if method == "thread_rank":
                return self.fresh(text, [linear], ("%", linear, size))
            if method == "meta_group_rank":
                return self.fresh(text, [linear], ("/", linear, size))
            if method == "meta_group_size":
                return self.fresh(text, [threads], ("/", threads, size))
        values = [self.expr(a) for a in args]
        if method.startswith("shfl") or method in ("any", "all", "ballot", "match_any", "match_all"):
            self.warp_operation(node)
            if method.startswith("shfl"):
                line = node.start_point[0]
                self.reductions.append(Reduction("warp_shuffle", method, method, line, self.user_line(line),
                                                 self.loop_stack[-1] if self.loop_stack else None))
            return self.fresh(text, values)
        # Other members (``is_valid``, ``block_rank`` of a grid …): a value the analysis does not compute, not
        # code that touches memory.
        return self.fresh(text, values)

    def copied_to_nonconst(self, pointer: _Pointer) -> None:
        """A pointer into ``pointer.base`` stored where it may write (a pointer or reference to non-const
        data): a parameter made ``const`` would no longer convert."""
        if pointer.space == "global":
            self.nonconst.add(pointer.base)

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
                self.code_escapes += 1

    def user_line_text(self, node: Node) -> str:
        line = self.user_line(node.start_point[0])
        return str(line + 1) if line is not None else "?"

    def inline(self, name: str, helper: Node, args: list[Node], node: Node,
               members: Mapping[str, _Value | None] | None = None) -> _Value | None:
        """The helper's body walked with its parameters bound to the arguments (and, for a function
        object's ``operator()``, its members bound to the values the object was made with)."""
        params = [(n, self.ty(t), p) for n, t, p in self.params_of(helper)]
        shapes = _param_shapes(helper, self.src)
        values: list[_Value | _Place | _Group | None] = []
        for k, a in enumerate(args):
            is_ref, data_const, data_volatile = shapes[k] if k < len(shapes) else (False, True, False)
            group = self.group_of(a)
            if group is not None:
                values.append(group)
                continue
            place = self.place(a) if is_ref else None
            if isinstance(place, _Place):
                if not data_const:
                    self.copied_to_nonconst(place.pointer)
                values.append(_volatile(place, data_volatile))
                continue
            value = self.expr(a) if place is None else None
            if isinstance(value, _Pointer) and k < len(params) and params[k][2] and not data_const:
                self.copied_to_nonconst(value)
            values.append(_volatile(value, data_volatile))
        saved_env, saved_returns, saved_arrays = self.env, self.returns, dict(self.arrays)
        saved_scalar_types = self.scalar_types
        saved_types, saved_constants = self.types, self.constants
        saved_refs, saved_groups = self.refs, self.groups
        fn = node.child_by_field_name("function")
        type_args = fn.child_by_field_name("arguments") if fn is not None and fn.type == "template_function" else None
        if type_args is not None:
            types, consts = self.bind_template(helper, [node_text(self.src, a) for a in type_args.named_children])
            self.types = {**self.types, **types}
            self.constants = {**self.constants, **consts}
        env: dict[str, _Value] = {k: v if v is not None else self.fresh(k) for k, v in (members or {}).items()}
        refs: dict[str, _Place] = {}
        groups: dict[str, _Group] = {}
        for (pname, ptype, is_pointer), value, arg in zip(params, values, args):
            if isinstance(value, _Place):
                refs[pname] = value
                continue
            if isinstance(value, _Group):
                groups[pname] = value
                continue
            if is_pointer and not isinstance(value, _Pointer):
                value = self.unresolved(pname, ptype, arg)
            elif value is None:
                value = self.fresh(pname)
            env[pname] = value
        self.env, self.returns = env, []
        self.refs, self.groups = refs, groups
        self.scalar_types = {pname: ptype for pname, ptype, is_pointer in params if not is_pointer}
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
            self.scalar_types = saved_scalar_types
            self.types, self.constants = saved_types, saved_constants
            self.refs, self.groups = saved_refs, saved_groups
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
            scoped = (dict(self.refs), dict(self.groups), set(self.nonconst_locals))
            exits = 0
            for child in node.named_children:
                if child.type == "declaration":
                    for name in _declared_names(child, self.src):
                        if name in self.env and name not in shadowed:
                            shadowed[name] = self.env[name]
                if child.type == "if_statement":
                    cid = self.if_statement(child)
                    if self.conditions[cid].kind == "exit":
                        # What follows in this block runs where the exit's condition is false.
                        self.guards.append((cid, False))
                        exits += 1
                else:
                    self.statement(child)
            if exits:
                del self.guards[-exits:]
            for name in list(self.env):
                if name not in declared_before:
                    del self.env[name]
            self.env.update(shadowed)
            self.refs, self.groups, self.nonconst_locals = scoped
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
            value = self.expr(node.child_by_field_name("condition"))
            self.condition("switch", node.child_by_field_name("condition"), node, value)
            before = dict(self.env)
            self.statement(node.child_by_field_name("body"))
            self.merge(before, [self.env])
        else:
            for c in node.named_children:
                if c.type.endswith("statement") or c.type in ("declaration", "case_statement"):
                    self.statement(c)
                elif c.type not in ("comment",):
                    self.expr(c)

    def resolve_type(self, type_text: str) -> tuple[str, int, bool]:
        """(base type, pointer levels, const) of a type as written, through template bindings and the
        file's ``typedef``/``using`` aliases (``Data_ptr`` → ``float``, 1)."""
        base = self.ty(_strip_qualifiers(type_text))
        alias = self.aliases.get(base)
        if alias is not None:
            return self.ty(alias.base), alias.pointer_depth, alias.const
        return base, 0, False

    def declaration(self, node: Node) -> None:
        text = node_text(self.src, node)
        type_node = node.child_by_field_name("type")
        base_type, alias_depth, alias_const = self.resolve_type(node_text(self.src, type_node)) if type_node is not None \
            else ("int", 0, False)
        self.value_types.add(base_type)
        shared = "__shared__" in text.split("=")[0]
        wide = any(w == base_type or base_type.startswith(w) for w in _WIDE_TYPES)
        data_const = alias_const or _data_const(node, self.src)
        data_volatile = _data_volatile(node, self.src)
        for decl in node.children_by_field_name("declarator"):
            target = decl.child_by_field_name("declarator") if decl.type == "init_declarator" else decl
            value_node = decl.child_by_field_name("value") if decl.type == "init_declarator" else None
            is_pointer = target is not None and target.type == "pointer_declarator" or (
                alias_depth > 0 and target is not None and target.type == "identifier")
            if target is not None and target.type == "reference_declarator" and value_node is not None:
                name = _declarator_name(target, self.src)
                place = self.place(value_node)
                if name and isinstance(place, _Place):
                    # ``float& r = out[i];``: what is done to ``r`` is done to the element.
                    self.refs[name] = _volatile(place, data_volatile)
                    self.env.pop(name, None)
                    if not data_const:
                        self.copied_to_nonconst(place.pointer)
                    continue
                if place is not None:
                    continue
            if target is not None and target.type != "array_declarator" and value_node is not None:
                group = self.group_of(value_node)
                name = _declarator_name(target, self.src)
                if group is not None and name:
                    for a in (value_node.child_by_field_name("arguments").named_children
                              if value_node.type == "call_expression" and value_node.child_by_field_name("arguments") else ()):
                        if self.group_of(a) is None:
                            self.expr(a)
                    self.groups[name] = group
                    self.env[name] = self.fresh(name)
                    continue
            if target is not None and target.type == "array_declarator":
                name, dims = self.array_dims(target)
                if name:
                    self.arrays[name] = _Array(name, "shared" if shared else "local", base_type, dims, data_volatile)
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
                self.arrays[name] = _Array(name, "shared", base_type, (), data_volatile)
                continue
            if is_pointer:
                if data_const:
                    self.nonconst_locals.discard(name)
                else:
                    self.nonconst_locals.add(name)
                    if isinstance(value, _Pointer):
                        self.copied_to_nonconst(value)
            if is_pointer:
                self.scalar_types.pop(name, None)
            else:
                self.scalar_types[name] = base_type
            if is_pointer and isinstance(value, _Pointer):
                self.env[name] = _Pointer(value.base, value.space, value.offset, base_type if base_type != "void" else value.elem_type,
                                          volatile=value.volatile or data_volatile)
            elif is_pointer and value_node is not None:
                self.env[name] = self.unresolved(name, base_type, value_node)
            elif value is None:
                self.env[name] = self.fresh(name)
            elif isinstance(value, Poly) and any(w in base_type for w in ("float", "double", "half", "bfloat")):
                self.env[name] = self.fresh(name, [value])
            else:
                self.env[name] = value

    def constant_arrays(self, root: Node) -> None:
        """The file's ``__constant__`` arrays (``__constant__ int starts[4096];``): memory the kernel reads, in
        the constant space, whose reads are served per distinct address of a warp."""
        for child in root.children:
            if child.type != "declaration" or not in_constant_space(child, self.src):
                continue
            type_node = child.child_by_field_name("type")
            elem_type = node_text(self.src, type_node) if type_node is not None else ""
            for target in child.children_by_field_name("declarator"):
                if target.type == "init_declarator":
                    target = target.child_by_field_name("declarator")
                if target is not None and target.type == "array_declarator":
                    name, dims = self.array_dims(target)
                    if name:
                        self.arrays[name] = _Array(name, "constant", elem_type, dims)

    def array_dims(self, node: Node) -> tuple[str | None, tuple[int | None, ...]]:
        dims: list[int | None] = []
        while node is not None and node.type == "array_declarator":
            size = node.child_by_field_name("size")
            dims.append(evaluate_int(node_text(self.src, size), self.constants) if size is not None else None)
            node = node.child_by_field_name("declarator")
        name = _declarator_name(node, self.src) if node is not None else None
        return name, tuple(reversed(dims))

    def if_statement(self, node: Node) -> int:
        """Walks the ``if``; its :class:`Condition`'s id (kind ``exit`` when its only branch leaves the
        block: a ``return``, ``continue`` or ``break`` at its end)."""
        found = conditional_update(node, self.src)
        if found is not None:
            self.note_accumulator(found[0], found[1], node)
        cond = node.child_by_field_name("condition")
        test = cond.named_children[-1] if cond is not None and cond.named_children else cond
        value = self.expr(test)
        alt = node.child_by_field_name("alternative")
        consequence = node.child_by_field_name("consequence")
        cid = self.condition("exit" if alt is None and _ends_in_exit(consequence) else "if", test, node, value)
        before = dict(self.env)
        with self.guarded(cid, True):
            self.statement(consequence)
        after_then = self.env
        self.env = dict(before)
        if alt is not None:
            with self.guarded(cid, False):
                self.statement(alt.named_children[-1] if alt.type == "else_clause" and alt.named_children else alt)
        self.merge(before, [after_then, self.env])
        return cid

    def merge(self, before: Mapping[str, _Value], branches: list[dict[str, _Value]]) -> None:
        merged = dict(before)
        for name in before:
            values = [b.get(name) for b in branches]
            if all(v == before[name] for v in values):
                continue
            first = values[0]
            if all(v == first for v in values) and first is not None:
                merged[name] = first
                continue
            pointers = [v for v in (before[name], *values) if isinstance(v, _Pointer)]
            if pointers:
                # A pointer set differently on each path (``if (c) q = out; else q = out + n;``): into the same
                # array at an offset the analysis does not know, or, between arrays, into memory it cannot name;
                # either way what is done through it stays recorded.
                p = pointers[0]
                if all((q.base, q.space, q.elem_type) == (p.base, p.space, p.elem_type) for q in pointers):
                    merged[name] = _Pointer(p.base, p.space, self.fresh(name, [q.offset for q in pointers]), p.elem_type,
                                            volatile=any(q.volatile for q in pointers))
                else:
                    # What is written through it may land in any of them.
                    self.escape(pointers)
                    merged[name] = self.unresolved(name, p.elem_type, None)
                continue
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
                                  else _Pointer(first.base, first.space, first.offset + increment * Poly.sym(trip_symbol), first.elem_type, volatile=first.volatile))
            elif isinstance(old, _Pointer):
                self.env[name] = _Pointer(old.base, old.space, self.fresh(name, [old.offset]), old.elem_type, volatile=old.volatile)
            elif name in self.env:
                extra = []
                if name == var:
                    extra = [old]
                self.env[name] = self.fresh(name, [old, *extra])
        upper = _upper_bound(cond, var, self.src) if var is not None else None
        bound = self.bound(upper, before)
        stepped = update if update is not None else (_body_step(body, var, self.src) if kind == "while" and var else None)
        added = _added_step(stepped, var, self.src) if stepped is not None and var is not None else False
        line = node.start_point[0]
        self.loops.append(LoopFact(loop_id, line, self.user_line(line), kind, var, start_poly if var else None,
                                   step, bound, geometric, self.loop_stack[-1] if self.loop_stack else None, trip_symbol,
                                   span=(node.start_byte, node.end_byte),
                                   bound_span=(upper[0].start_byte, upper[0].end_byte) if upper and bound is not None else None,
                                   bound_inclusive=bool(upper and upper[1]),
                                   step_span=(added.start_byte, added.end_byte) if isinstance(added, Node) else None,
                                   increments=added is None,
                                   update_span=(stepped.start_byte, stepped.end_byte) if stepped is not None and var else None))
        escapes_before = self.code_escapes
        unknown_calls_before = self.unknown_calls
        self.loop_stack.append(loop_id)
        self.loop_vars.append(set(inductions) | ({var} if var else set()))
        try:
            test = cond.named_children[-1] if cond is not None and cond.type == "condition_clause" and cond.named_children \
                else cond
            value = self.expr(test) if cond is not None else None
            if kind in ("while", "do") and test is not None:
                # A ``while`` body runs where its test holds; a ``do`` body runs once before it is tested.
                cid = self.condition(kind, test, node, value)
                if kind == "while":
                    self.guards.append((cid, True))
            try:
                self.statement(body)
            finally:
                if kind == "while" and test is not None:
                    self.guards.pop()
            if update is not None:
                self.expr(update)
        finally:
            self.loop_stack.pop()
            self.loop_vars.pop()
            self.declared_in_loop.pop()
        if self.unknown_calls != unknown_calls_before or self.code_escapes != escapes_before:
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
                                  else _Pointer(first.base, first.space, first.offset + increment * trips, first.elem_type, volatile=first.volatile))
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
        elif body is not None and not _continues(body):
            # A ``continue`` would skip the step: the counter would not advance once per iteration.
            statements = body.named_children if body.type == "compound_statement" else [body]
            cond_names = identifiers_in(cond, self.src) if cond is not None else set()
            # Only a name the body assigns once: a second assignment would step it by more than the one seen.
            once = {name for name, count in _assignment_counts(body, self.src).items() if count == 1}
            for st in statements:
                if st.type == "expression_statement" and st.named_children:
                    e = st.named_children[0]
                    if e.type in ("assignment_expression", "update_expression") and (assigned_names(e, self.src) & cond_names & once):
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
            r_right = right.child_by_field_name("right")
            if r_right is not None and r_right.type == "identifier" and node_text(self.src, r_right) == name and \
                    r_op is not None and node_text(self.src, r_op) == "+" and r_left is not None:
                # ``i = step + i``: the step written first.
                value = self.expr(r_left)
                return name, value if isinstance(value, Poly) else None, None
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

    def bound(self, upper: tuple[Node, bool] | None, env: Mapping[str, _Value]) -> Poly | None:
        """The exclusive bound of the counter from :func:`_upper_bound`'s reading of the test."""
        if upper is None:
            return None
        saved = self.env
        self.env = dict(env)
        try:
            value = self.expr(upper[0])
        finally:
            self.env = saved
        if not isinstance(value, Poly):
            return None
        return value + ONE if upper[1] else value

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


def _upper_bound(cond: Node | None, var: str, src: bytes) -> tuple[Node, bool] | None:
    """The bound of a test ``var < b``, ``var <= b``, ``b > var`` or ``b >= var`` (parentheses around it
    dropped) and whether the counter may reach it; None for any other test."""
    if cond is None:
        return None
    node = cond.named_children[-1] if cond.type == "condition_clause" and cond.named_children else cond
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    if node.type != "binary_expression":
        return None
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    op_node = node.child_by_field_name("operator")
    op = node_text(src, op_node) if op_node is not None else ""
    if left is None or right is None:
        return None

    def counter(n: Node) -> bool:
        return n.type == "identifier" and node_text(src, n) == var

    if op in ("<", "<=") and counter(left):
        return right, op == "<="
    # ``n > i`` bounds ``i`` as ``i < n`` does.
    if op in (">", ">=") and counter(right):
        return left, op == ">="
    return None


def _continues(body: Node) -> bool:
    """A ``continue`` that belongs to the loop of ``body`` (not to a loop inside it)."""
    stack = [body]
    while stack:
        n = stack.pop()
        if n.type == "continue_statement":
            return True
        if n is not body and n.type in ("for_statement", "while_statement", "do_statement", "for_range_loop"):
            continue
        stack.extend(n.children)
    return False


def _body_step(body: Node | None, var: str, src: bytes) -> Node | None:
    """The expression of the one statement at the top level of a ``while`` body that steps ``var``
    (``var += s;``, ``var++;``), when the body assigns ``var`` nowhere else."""
    if body is None or _assignment_counts(body, src).get(var) != 1:
        return None
    statements = body.named_children if body.type == "compound_statement" else [body]
    for st in statements:
        if st.type == "expression_statement" and st.named_children and var in assigned_names(st, src):
            e = st.named_children[0]
            return e if e.type in ("assignment_expression", "update_expression") else None
    return None


def _added_step(update: Node, var: str, src: bytes) -> Node | None | bool:
    """The step expression of the update ``var += step`` or ``var = var + step`` (``step + var``); None
    for ``++var``/``var++``; False for anything else."""
    if update.type == "update_expression":
        arg = update.child_by_field_name("argument")
        op = node_text(src, update.child_by_field_name("operator"))
        return None if arg is not None and node_text(src, arg) == var and op == "++" else False
    if update.type != "assignment_expression":
        return False
    left, value = update.child_by_field_name("left"), update.child_by_field_name("right")
    if left is None or left.type != "identifier" or node_text(src, left) != var or value is None:
        return False
    op = node_text(src, update.child_by_field_name("operator"))
    if op == "+=":
        return value
    if op == "=" and value.type == "binary_expression" and node_text(src, value.child_by_field_name("operator")) == "+":
        a, b = value.child_by_field_name("left"), value.child_by_field_name("right")
        for mine, other in ((a, b), (b, a)):
            if mine is not None and other is not None and mine.type == "identifier" and node_text(src, mine) == var:
                return other
    return False


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


def analyze(pre: Preprocessed | str, constants: Mapping[str, str] | None = None) -> dict[str, KernelFacts]:
    """Facts for every ``__global__`` function of the (preprocessed) file, by kernel name."""
    if isinstance(pre, str):
        text, view = pre, None
    else:
        text, view = pre.text, pre
    src, root = parse_text(text)
    functions = list(function_definitions(root, src))
    helpers = {name: node for name, node, head in functions if "__global__" not in head and "__device__" in head}
    overloads: dict[str, tuple[Node, ...]] = {}
    for name, node, head in functions:
        if "__global__" not in head and "__device__" in head:
            overloads[name] = (*overloads.get(name, ()), node)
    structs = _struct_layouts(root, src)
    instances = _instantiations(root, src)
    functors = call_operators(root, src)
    aliases = alias_table(root, src)
    consts = dict(view.object_macros()) if view is not None else {}
    consts.update(constants or {})
    consts.update(_file_constants(root, src))
    out: dict[str, KernelFacts] = {}
    for name, node, head in functions:
        if "__global__" not in head or name in out:
            continue
        out[name] = _analyze_kernel(name, node, src, view, helpers, structs, consts, instances.get(name), functors, aliases,
                                    overloads)
    return out


def _analyze_kernel(name: str, node: Node, src: bytes, pre: Preprocessed | None, helpers: Mapping[str, Node],
                    structs: Mapping[str, _Struct], constants: Mapping[str, str],
                    instance: tuple[str, ...] | None = None, functors: Mapping[str, Functor] | None = None,
                    aliases: Mapping[str, Alias] | None = None,
                    overloads: Mapping[str, tuple[Node, ...]] | None = None) -> KernelFacts:
    walker = _Walker(src, pre, helpers, structs, constants, overloads)
    walker.functors = functors or {}
    walker.aliases = aliases or {}
    top = node
    while top.parent is not None:
        top = top.parent
    own_constants = set(_file_constants(top, src))
    if instance is not None:
        types, consts = walker.bind_template(node, list(instance))
        walker.types = types
        walker.constants = {**walker.constants, **consts}
        own_constants |= set(consts)
    walker.constant_arrays(top)
    params = walker.params_of(node)
    walker.value_types.update(t for _, t, _ in params)
    shapes = _param_shapes(node, src)
    for k, (pname, ptype, is_pointer) in enumerate(params):
        if is_pointer:
            walker.arrays[pname] = _Array(pname, "global", ptype, (), k < len(shapes) and shapes[k][2])
            # A pointer parameter is a local like any other: ``A += BK`` in a loop moves it (its later
            # subscripts move with the loop), it stores nothing.
            walker.env[pname] = _Pointer(pname, "global", ZERO, ptype, volatile=walker.arrays[pname].volatile)
        else:
            walker.env[pname] = Poly.sym(pname)
            walker.scalar_types[pname] = ptype
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
        conditions=tuple(walker.conditions),
        barriers=tuple(walker.barriers),
        warp_operations=tuple(walker.warp_ops),
        nonconst_copies=tuple(sorted(walker.nonconst & {n for n, _, p in params if p})),
        value_types=tuple(sorted(walker.value_types)),
        implicit_indices=tuple(dict.fromkeys(walker.implicit)),
        group_values=dict(walker.group_values),
        index_uses=tuple({(u.span, u.value): u for u in walker.index_uses}.values()),
        constants=_integer_constants(walker.constants, own_constants),
    )


def _integer_constants(constants: Mapping[str, str], names: Iterable[str]) -> dict[str, int]:
    """The integer values of ``names`` (template constants, file constants) under ``constants``."""
    out = {}
    for name in names:
        value = evaluate_int(constants[name], constants) if name in constants else None
        if value is not None:
            out[name] = value
    return out


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
