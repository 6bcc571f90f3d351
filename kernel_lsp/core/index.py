"""The kernel index: what the rest of kernel-lsp knows about a CUDA file.

These immutable records (frozen dataclasses; NamedTuples for the positions
and launches, which edits rebuild most) are the API boundary of the analysis
core. Every position is a :class:`Span` of (line, UTF-8 byte column) points and
byte offsets into the source as UTF-8; the server converts to UTF-16.

Builders: ``build_index(text_or_ParsedDocument)`` for one-off use and
``IncrementalIndexer().index(parsed_document)`` for a document that is edited
(it re-analyses only the functions whose text changed). Parsing never fails:
a broken file yields a partial index plus ``syntax_errors``; binary data yields
an empty index with one syntax error.

What is indexed: ``__global__``/``__device__``/``__host__ __device__``
functions (definitions; prototypes only when the file has no definition) at
file scope, in namespaces, ``extern "C"`` blocks, ``#if`` blocks and class
bodies, templates included; launches ``k<<<...>>>(...)`` anywhere (host
functions, methods, lambdas in initializers, device code). Host function
definitions (``main``, launch wrappers) are recorded by name, signature and
position only (:class:`HostFunction`): outlines list them, nothing analyses them.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
from dataclasses import FrozenInstanceError, dataclass
from collections.abc import Iterable
from typing import Any, NamedTuple


class Point(NamedTuple):
    """A NamedTuple, like :class:`Span`, not a frozen dataclass: an edit moves the spans after it,
    and a tuple is built several times faster, just as immutable and compared by value."""

    line: int
    """0-based line."""
    column_byte: int
    """0-based column in UTF-8 bytes."""


class Span(NamedTuple):
    start: Point
    end: Point
    start_byte: int
    end_byte: int

    def contains(self, line: int, column_byte: int) -> bool:
        return self.start <= (line, column_byte) <= self.end


@dataclass(frozen=True)
class Param:
    name: str
    type_text: str
    """The declared type as written, without the name (e.g. ``const float *__restrict__``)."""
    base_type: str
    """Element or scalar type without qualifiers and pointers (e.g. ``float``)."""
    pointer_depth: int
    is_const: bool
    """True when the pointed-to data (or the scalar) is const."""
    is_restrict: bool
    span: Span


@dataclass(frozen=True)
class SharedDecl:
    name: str
    type_text: str
    dims: tuple[str, ...]
    """Array extents as written (``("32", "33")``); empty for a scalar."""
    is_extern: bool
    """``extern __shared__`` (dynamic shared memory)."""
    size_bytes: int | None
    """Static size when every extent and the element type are known, else None."""
    span: Span


@dataclass(frozen=True)
class Loop:
    kind: str
    """``for``, ``while`` or ``do``."""
    span: Span
    depth: int
    """1 for an outermost loop in the function."""
    trip_count: int | None
    """Known when a ``for`` loop runs from a literal to a literal with a literal step."""
    has_pragma_unroll: bool


@dataclass(frozen=True)
class Call:
    """A call inside a function body, such as ``__syncthreads()`` or ``atomicAdd(...)``."""

    name: str
    args: tuple[str, ...]
    span: Span


@dataclass(frozen=True)
class Function:
    name: str
    qualifier: str
    """``__global__``, ``__device__`` or ``__host__ __device__``."""
    return_type: str
    span: Span
    """The whole definition."""
    is_template: bool
    is_extern_c: bool
    launch_bounds: tuple[str, ...]
    """Arguments of ``__launch_bounds__`` as written; empty when absent."""
    thread_index_uses: tuple[str, ...]
    """Distinct ``threadIdx.x``-style fields used (``threadIdx.x``, ``blockIdx.y``, ``blockDim.x``, ``gridDim.x``)."""
    qualified_name: str
    """The name with its namespaces and classes (``ns::kern``); equals ``name`` at file scope."""
    _layout: _Layout
    """Where the positions below come from (see :class:`_Layout`)."""
    template_params: tuple[str, ...] = ()
    """Names of the function's own template parameters, in order (``template <typename T, int B>`` -> ``("T", "B")``)."""

    # The positions below are read through the layout, once per Function: after an edit every
    # function below it moves, and only those someone looks into pay for it.
    @functools.cached_property
    def name_span(self) -> Span:
        return self._layout.placed("name_span")

    @functools.cached_property
    def body_span(self) -> Span | None:
        return self._layout.placed("body_span")

    @functools.cached_property
    def params(self) -> tuple[Param, ...]:
        return self._layout.placed("params")

    @functools.cached_property
    def shared(self) -> tuple[SharedDecl, ...]:
        return self._layout.placed("shared")

    @functools.cached_property
    def loops(self) -> tuple[Loop, ...]:
        return self._layout.placed("loops")

    @functools.cached_property
    def syncs(self) -> tuple[Call, ...]:
        """``__syncthreads`` and friends."""
        return self._layout.placed("syncs")

    @functools.cached_property
    def atomics(self) -> tuple[Call, ...]:
        return self._layout.placed("atomics")

    @functools.cached_property
    def calls(self) -> tuple[Call, ...]:
        """Every call in the body (including syncs and atomics)."""
        return self._layout.placed("calls")

    @functools.cached_property
    def _fixed(self) -> dict[str, Any]:
        """The fields that a unit keeps when it moves (all but ``span`` and ``_layout``): see _Shift.function."""
        return {name: self.__dict__[name] for name in _FIXED_FIELDS}

    @property
    def is_kernel(self) -> bool:
        return "__global__" in self.qualifier

    @property
    def signature(self) -> str:
        """``__global__ void saxpy(int n, const float* __restrict__ x)``: types as written, one space before names."""
        # Names and types do not move: the parameters as found serve, and a moved function stays unplaced.
        params = ", ".join(f"{p.type_text} {p.name}".strip() for p in self._layout.found.params)
        bounds = f"__launch_bounds__({', '.join(self.launch_bounds)}) " if self.launch_bounds else ""
        return f"{self.qualifier} {bounds}{self.return_type} {self.qualified_name or self.name}({params})".strip()


_FIXED_FIELDS = tuple(name for name in Function.__dataclass_fields__ if name not in ("span", "_layout"))


class _Found(NamedTuple):
    """A function's positions in the coordinates of the analysis that found them."""

    name_span: Span
    body_span: Span | None
    params: tuple[Param, ...]
    shared: tuple[SharedDecl, ...]
    loops: tuple[Loop, ...]
    syncs: tuple[Call, ...]
    atomics: tuple[Call, ...]
    calls: tuple[Call, ...]


class _Layout:
    """A function's positions as found, plus how far the function has moved since (None: not at all).

    Equal layouts have equal positions where the function is now, however they were found, so
    that an incrementally built index compares equal to a fresh one.
    """

    __slots__ = ("found", "origin", "shift")

    def __init__(self, found: _Found, origin: tuple[int, int, int], shift: _Shift | None) -> None:
        self.found = found
        self.origin = origin
        """(byte, line, byte column) of the unit's start when ``found`` was analysed."""
        self.shift = shift

    def placed(self, name: str) -> Any:
        found = getattr(self.found, name)
        shift = self.shift
        if shift is None or found is None:
            return found
        if isinstance(found, Span):
            return shift.span(found)
        move = getattr(shift, _MOVERS[name])
        return tuple(move(item) for item in found)

    def moved_to(self, start: tuple[int, int, int]) -> _Layout:
        return _Layout(self.found, self.origin, _Shift.between(self.origin, start))

    def _placed_all(self) -> tuple[Any, ...]:
        return tuple(self.placed(name) for name in _Found._fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Layout) and self._placed_all() == other._placed_all()

    def __hash__(self) -> int:
        return hash(self._placed_all())

    def __repr__(self) -> str:
        return repr(_Found(*self._placed_all()))


class HostFunction(NamedTuple):
    """A host function definition (no ``__global__``/``__device__``): where it is and what it is called."""

    name: str
    qualified_name: str
    signature: str
    """``int main(int argc, char** argv)``, as written (whitespace runs folded)."""
    span: Span
    name_span: Span


class LaunchSite(NamedTuple):
    """A NamedTuple like :class:`Span`: an edit moves every launch after it, and a tuple is built fastest."""

    kernel: str
    """The callee as written (template arguments removed)."""
    grid: str
    block: str
    shared_mem: str | None
    stream: str | None
    args: tuple[str, ...]
    span: Span
    """The whole launch expression."""
    kernel_span: Span
    """Just the callee name."""
    enclosing_function: str | None
    enclosing_span: Span | None = None
    """The whole definition of the enclosing function (host or device), for looking up local constants."""
    template_args: tuple[str, ...] = ()
    """Template arguments written at the launch (``scale<float, 4><<<...>>>`` -> ``("float", "4")``)."""


@dataclass(frozen=True)
class SyntaxError_:
    message: str
    span: Span


class KernelIndex:
    """The index of one document version. Immutable; compared, hashed and shown by its four fields.

    Not a dataclass only so that ``launches`` can be built on first use: after an edit most launches
    merely moved, and a keystroke's documentSymbol needs only those of the edited function
    (:meth:`launches_within`).
    """

    __slots__ = ("functions", "syntax_errors", "constants", "host_functions", "_launches", "_launch_parts",
                 "_launch_starts", "_parts_by_name", "pending", "notes", "__weakref__")
    functions: tuple[Function, ...]
    syntax_errors: tuple[SyntaxError_, ...]
    constants: tuple[tuple[str, str], ...]
    """File-scope integer constants as (name, expression text): ``#define N 256``, ``const int N = 256;``,
    ``constexpr int N = 256;``. Evaluate them with :func:`kernel_lsp.core.consteval.evaluate_int`."""
    host_functions: tuple[HostFunction, ...]
    """Host function definitions, in document order."""
    pending: bool
    """Units that use code macros were left as tree-sitter reads the raw text, their syntax errors held
    back, because their expansion was not allowed where this index was built (the server's event loop)
    or the macro table was not known yet: build again where it is. Not compared."""
    notes: tuple[SyntaxError_, ...]
    """What the macro pass could not do, where (a unit's expansion over its budget: that unit is read as
    written). Not compared."""

    def __init__(
        self,
        functions: tuple[Function, ...],
        launches: tuple[LaunchSite, ...],
        syntax_errors: tuple[SyntaxError_, ...] = (),
        constants: tuple[tuple[str, str], ...] = (),
        host_functions: tuple[HostFunction, ...] = (),
    ) -> None:
        self._init(functions, tuple(launches), (), syntax_errors, constants, host_functions)

    @classmethod
    def _lazy(
        cls,
        functions: tuple[Function, ...],
        launch_parts: list[_LaunchPart],
        syntax_errors: tuple[SyntaxError_, ...],
        constants: tuple[tuple[str, str], ...],
        host_functions: tuple[HostFunction, ...] = (),
    ) -> KernelIndex:
        index = cls.__new__(cls)
        index._init(functions, None, launch_parts, syntax_errors, constants, host_functions)
        return index

    def _init(
        self,
        functions: tuple[Function, ...],
        launches: tuple[LaunchSite, ...] | None,
        launch_parts: Any,
        syntax_errors: tuple[SyntaxError_, ...],
        constants: tuple[tuple[str, str], ...],
        host_functions: tuple[HostFunction, ...],
    ) -> None:
        put = object.__setattr__
        put(self, "functions", functions)
        put(self, "syntax_errors", syntax_errors)
        put(self, "constants", constants)
        put(self, "host_functions", host_functions)
        put(self, "_launches", launches)
        put(self, "_launch_parts", launch_parts)
        put(self, "_launch_starts", [part.start_byte for part in launch_parts])
        put(self, "_parts_by_name", None)
        put(self, "pending", False)
        put(self, "notes", ())

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    @property
    def launches(self) -> tuple[LaunchSite, ...]:
        launches = self._launches
        if launches is None:
            # Racing threads build equal tuples; the parts are kept, so either may finish first.
            launches = tuple(launch for part in self._launch_parts for launch in part.placed())
            object.__setattr__(self, "_launches", launches)
        return launches

    def launches_within(self, start_byte: int, end_byte: int) -> tuple[LaunchSite, ...]:
        """Launches whose expression starts in [start_byte, end_byte), in document order."""
        if self._launches is not None:
            return tuple(launch for launch in self._launches if start_byte <= launch.span.start_byte < end_byte)
        parts, starts = self._launch_parts, self._launch_starts
        # Units do not overlap: only one that starts before end_byte and ends after start_byte holds any.
        first = max(bisect.bisect_right(starts, start_byte) - 1, 0)
        found: list[LaunchSite] = []
        for part in parts[first : bisect.bisect_left(starts, end_byte)]:
            found += (launch for launch in part.placed() if start_byte <= launch.span.start_byte < end_byte)
        return tuple(found)

    def _fields(self) -> tuple[Any, ...]:
        return (self.functions, self.launches, self.syntax_errors, self.constants, self.host_functions)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"KernelIndex(functions={self.functions!r}, launches={self.launches!r}, "
            f"syntax_errors={self.syntax_errors!r}, constants={self.constants!r}, "
            f"host_functions={self.host_functions!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (KernelIndex, self._fields())

    @property
    def kernels(self) -> tuple[Function, ...]:
        return tuple(f for f in self.functions if f.is_kernel)

    def function(self, name: str) -> Function | None:
        return next((f for f in self.functions if f.name == name), None)

    def launches_of(self, kernel: str) -> tuple[LaunchSite, ...]:
        """Launches whose callee is ``kernel``, written plainly or qualified (``ns::kernel``)."""
        return tuple(
            launch
            for launch in self.launches
            if launch.kernel == kernel or launch.kernel.rsplit("::", 1)[-1] == kernel
        )

    def function_at(self, line: int, column_byte: int) -> Function | None:
        """The innermost indexed function whose definition contains the position."""
        hits = [f for f in self.functions if f.span.contains(line, column_byte)]
        return min(hits, key=lambda f: f.span.end_byte - f.span.start_byte) if hits else None

    def launch_at(self, line: int, column_byte: int) -> LaunchSite | None:
        return next((launch for launch in self.launches if launch.span.contains(line, column_byte)), None)

    def launch_holding(self, offset: int) -> LaunchSite | None:
        """The launch expression that holds byte ``offset`` (ends included), the one that starts last where
        launches nest (a launch in a lambda argument). Only the launches of the unit there are placed."""
        parts = self._launch_parts
        if not parts:
            candidates: Iterable[LaunchSite] = reversed(self.launches)
        else:
            i = bisect.bisect_right(self._launch_starts, offset) - 1
            candidates = reversed(parts[i].placed()) if i >= 0 else ()
        return next((launch for launch in candidates if launch.span.start_byte <= offset <= launch.span.end_byte), None)

    def launches_named(self, name: str) -> tuple[LaunchSite, ...]:
        """Launches whose callee's unqualified name is ``name`` (``ns::k`` and ``k`` both for ``k``), in
        document order; only those are placed (a hover on one kernel reads its launches alone)."""
        if not self._launch_parts:
            return tuple(launch for launch in self.launches if launch.kernel.rsplit("::", 1)[-1] == name)
        found: list[LaunchSite] = []
        for part in self.parts_by_name().get(name, ()):
            mine = tuple(launch for launch in part.launches if launch.kernel.rsplit("::", 1)[-1] == name)
            found += mine if part.shift is None else part.shift.launches(mine, part.unit_span)
        return tuple(found)

    def parts_by_name(self) -> dict[str, tuple[_LaunchPart, ...]]:
        """The units that launch each kernel (by unqualified name), in document order; built once per
        index, on first use (the server builds it with the index, off the event loop)."""
        by_name = self._parts_by_name
        if by_name is None:
            # Racing threads build equal tables; either may be kept.
            grouped: dict[str, list[_LaunchPart]] = {}
            for part in self._launch_parts:
                for name in {launch.kernel.rsplit("::", 1)[-1] for launch in part.launches}:
                    grouped.setdefault(name, []).append(part)
            by_name = {name: tuple(parts) for name, parts in grouped.items()}
            object.__setattr__(self, "_parts_by_name", by_name)
        return by_name


class _LaunchPart(NamedTuple):
    """One unit's launches as analysed, and how far the unit has moved since (None: not at all)."""

    start_byte: int
    """Where the unit starts now."""
    launches: tuple[LaunchSite, ...]
    shift: _Shift | None
    unit_span: Span

    def placed(self) -> tuple[LaunchSite, ...]:
        shift = self.shift
        return self.launches if shift is None else shift.launches(self.launches, self.unit_span)


# ---------------------------------------------------------------------------
# The builder.
#
# Speed: a 10,000-line file has ~100k syntax nodes, too many to visit one by one
# in Python within the documentSymbol budget (20 ms). So:
#   * Python visits only the top-level items (children of the translation unit,
#     descending into namespaces, extern "C" blocks, #if blocks and ERROR nodes);
#     each function definition there is a *unit*.
#   * Everything inside units (calls, loops, __shared__ declarations, index
#     fields, launches) is found by one tree-sitter Query executed in C.
#   * IncrementalIndexer keeps each unit's results keyed by the unit's exact
#     text and context; after an edit only units whose text changed are
#     re-queried, the others are reused as analysed. A unit that moved (every
#     unit below the edit) gets one new object, its Function, with its span
#     placed; the function's other positions are placed only when read
#     (Function's cached properties) and its launches only when the index's
#     ``launches`` are first asked for (documentSymbol asks for one function's,
#     :meth:`KernelIndex.launches_within`), so typing in a 10,000-line file
#     does not rebuild ~10k spans and ~600 launches per keystroke.
# ---------------------------------------------------------------------------

import re
from collections.abc import Callable, Iterator, Mapping

from tree_sitter import Node, Query, QueryCursor

from kernel_lsp.core.consteval import TYPE_SIZES_BYTES, evaluate_int
from kernel_lsp.core.parse import CUDA_LANGUAGE, ParsedDocument, common_prefix, common_suffix, to_source_bytes
from kernel_lsp.core.source import Budget, Preprocessed, expand_snippet

_INNER_QUERY = Query(
    CUDA_LANGUAGE,
    """
    (call_expression) @call
    (for_statement) @loop
    (while_statement) @loop
    (do_statement) @loop
    (declaration (type_qualifier "__shared__")) @shared
    ((field_expression argument: (identifier) @idx_obj field: (field_identifier) @idx_field)
      (#any-of? @idx_obj "threadIdx" "blockIdx" "blockDim" "gridDim"))
    """,
)
_CONTAINER_TYPES = frozenset(
    {
        "namespace_definition", "linkage_specification", "declaration_list", "preproc_if",
        "preproc_ifdef", "preproc_else", "preproc_elif", "preproc_elifdef", "ERROR", "field_declaration_list",
    }
)
_SYNC_NAMES = frozenset(
    {
        "__syncthreads", "__syncthreads_count", "__syncthreads_and", "__syncthreads_or", "__syncwarp",
        "__barrier_sync", "cg::sync", "cooperative_groups::sync", "sync",
    }
)
_MAX_SYNTAX_ERRORS = 100
#: Captures (or calls) analysed between two of the indexer's yield points.
_YIELD_EVERY = 128
_TEMPLATE_ARGS = re.compile(r"<[^<>]*>")
_SPACES = re.compile(r"\s+")
_Eval = Callable[[str], "int | None"]


def _text(src: bytes, node: Node) -> str:
    return src[node.start_byte : node.end_byte].decode("utf-8", errors="replace")


def _span(node: Node) -> Span:
    (sl, sc), (el, ec) = node.start_point, node.end_point
    return Span(Point(sl, sc), Point(el, ec), node.start_byte, node.end_byte)


def _strip_template_args(name: str) -> str:
    previous = None
    while previous != name:
        previous, name = name, _TEMPLATE_ARGS.sub("", name)
    return _SPACES.sub("", name)


def _start_byte(node: Node) -> int:
    return node.start_byte


def _normalize(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


class _Context(NamedTuple):
    scope: tuple[str, ...]
    """Enclosing namespaces and classes, outermost first."""
    is_extern_c: bool
    in_template: bool = False
    """Inside a class template: its member functions are templates too."""


class _Unit(NamedTuple):
    """One top-level function definition or declaration (with its template header, if any)."""

    node: Node
    function_node: Node
    context: _Context
    is_template: bool


class _UnitResult(NamedTuple):
    # Tuples, not dataclasses: ~1,000 of each are made per re-index of a 10,000-line file.
    span: Span
    """The unit's span: the very object that is its function's ``span`` and its launches' ``enclosing_span``."""
    function: Function | None
    launches: tuple[LaunchSite, ...]
    is_definition: bool
    part: _LaunchPart | None = None
    """The launches where they were found, as the index takes them (None: no launches)."""
    host: HostFunction | None = None
    """The unit is a host function definition."""


def _unit_result(span: Span, function: Function | None, launches: list[LaunchSite], is_definition: bool,
                 host: HostFunction | None = None) -> _UnitResult:
    found = tuple(launches)
    part = _LaunchPart(span.start_byte, found, None, span) if found else None
    return _UnitResult(span, function, found, is_definition, part, host)


# tuple.__new__ directly: a NamedTuple's own __new__ costs a Python frame per unit, ~1,200 per re-index.
_new_unit = tuple.__new__


def _iter_units(root: Node, src: bytes, constants: dict[str, str], base: _Context = _Context((), False)) -> Iterator[_Unit]:
    """Top-level function units in document order; collects file-scope constants on the way.
    ``base``: the context of ``root`` (a macro's expansion is read in the context of its use)."""
    stack: list[tuple[Iterator[Node], _Context]] = [(iter(root.children), base)]
    while stack:
        children, ctx = stack[-1]
        node = next(children, None)
        if node is None:
            stack.pop()
            continue
        kind = node.type
        if kind == "function_definition":
            yield _new_unit(_Unit, (node, node, ctx, ctx.in_template))
        elif kind == "template_declaration":
            inner = next(
                (c for c in node.named_children if c.type in ("function_definition", "declaration", *_CLASS_TYPES)),
                None,
            )
            if inner is None:
                continue
            if inner.type in _CLASS_TYPES:
                _push_class(stack, inner, src, _Context(ctx.scope, ctx.is_extern_c, True))
            elif inner.type == "function_definition" or _is_function_declaration(inner):
                yield _new_unit(_Unit, (node, inner, ctx, True))
        elif kind in _CLASS_TYPES:
            _push_class(stack, node, src, ctx)
        elif kind == "declaration":
            if _is_function_declaration(node):
                yield _new_unit(_Unit, (node, node, ctx, ctx.in_template))
            elif b"<<<" in src[node.start_byte : node.end_byte]:
                # A launch in an initializer (a lambda stored in a global): only its launches are indexed.
                yield _new_unit(_Unit, (node, node, ctx, ctx.in_template))
            else:
                _collect_const_declaration(node, src, constants)
        elif kind == "preproc_def":
            name, value = node.child_by_field_name("name"), node.child_by_field_name("value")
            if name is not None and value is not None:
                constants[_text(src, name)] = _normalize(_text(src, value))
        elif kind in _CONTAINER_TYPES:
            inner_ctx = ctx
            if kind == "namespace_definition":
                name = node.child_by_field_name("name")
                scope = tuple(_text(src, name).split("::")) if name is not None else ()
                inner_ctx = _Context(ctx.scope + scope, ctx.is_extern_c, ctx.in_template)
                body = node.child_by_field_name("body")
                stack.append((iter(body.children if body is not None else ()), inner_ctx))
                continue
            if kind == "linkage_specification":
                value = node.child_by_field_name("value")
                is_c = value is not None and b'"C"' in src[value.start_byte : value.end_byte]
                inner_ctx = _Context(ctx.scope, is_c, ctx.in_template)
                body = node.child_by_field_name("body")
                if body is not None and (body.type == "function_definition" or
                                         body.type == "declaration" and _is_function_declaration(body)):
                    # ``extern "C" __global__ void k(...)``: the definition, and so its span, starts at ``extern``.
                    yield _new_unit(_Unit, (node, body, inner_ctx, ctx.in_template))
                    continue
                if body is not None and body.type != "declaration_list":
                    stack.append((iter((body,)), inner_ctx))
                    continue
                stack.append((iter(body.children if body is not None else ()), inner_ctx))
                continue
            stack.append((iter(node.children), inner_ctx))


_CLASS_TYPES = ("struct_specifier", "class_specifier", "union_specifier")


def _push_class(stack: list[tuple[Iterator[Node], _Context]], node: Node, src: bytes, ctx: _Context) -> None:
    """Visit a class body next: member functions become units scoped by the class name."""
    body = node.child_by_field_name("body")
    if body is None:
        return
    name = node.child_by_field_name("name")
    scope = (_strip_template_args(_text(src, name)),) if name is not None else ()
    stack.append((iter(body.children), _Context(ctx.scope + scope, ctx.is_extern_c, ctx.in_template)))


def _inner_declarator(node: Node) -> Node | None:
    """The declarator inside a pointer/reference declarator (references have no ``declarator`` field)."""
    inner = node.child_by_field_name("declarator")
    return inner if inner is not None else next(iter(node.named_children), None)


def _is_function_declaration(node: Node) -> bool:
    declarator = node.child_by_field_name("declarator")
    while declarator is not None and declarator.type in ("pointer_declarator", "reference_declarator"):
        declarator = _inner_declarator(declarator)
    return declarator is not None and declarator.type == "function_declarator"


def _collect_const_declaration(node: Node, src: bytes, constants: dict[str, str]) -> None:
    """``const int N = 64;`` / ``constexpr unsigned N = 64;`` / ``static const int N{64};`` at file scope."""
    qualifiers = {_text(src, c) for c in node.children if c.type == "type_qualifier"}
    if not qualifiers & {"const", "constexpr"}:
        return
    for declarator in node.children_by_field_name("declarator"):
        if declarator.type != "init_declarator":
            continue
        name = declarator.child_by_field_name("declarator")
        value = declarator.child_by_field_name("value")
        if name is None or value is None or name.type != "identifier":
            continue
        value_text = _text(src, value)
        if value.type == "initializer_list":
            value_text = value_text.strip("{} \t\n")
        constants[_text(src, name)] = _normalize(value_text)


def _function_header(unit: _Unit, src: bytes) -> tuple[str, str, str, Node | None, Node | None, tuple[str, ...]]:
    """(qualifier, return type, name-as-written, name node, function_declarator, launch bounds)."""
    fn = unit.function_node
    marks: set[str] = set()
    bounds: tuple[str, ...] = ()
    for child in fn.children:
        kind = child.type
        if kind in ("__global__", "__device__", "__host__"):
            marks.add(kind)
        elif kind == "launch_bounds":
            bounds = tuple(_normalize(_text(src, c)) for c in child.named_children if c.type != "comment")
        elif kind in ("attribute_specifier", "type_qualifier", "storage_class_specifier"):
            text = _text(src, child)
            for mark in ("__global__", "__device__", "__host__"):
                if mark in text:
                    marks.add(mark)
    if "__global__" in marks:
        qualifier = "__global__"
    elif "__device__" in marks:
        qualifier = "__host__ __device__" if "__host__" in marks else "__device__"
    else:
        qualifier = "__host__" if "__host__" in marks else ""
    type_node = fn.child_by_field_name("type")
    return_type = _normalize(_text(src, type_node)) if type_node is not None else ""
    cv = [t for c in fn.children if c.type == "type_qualifier" and (t := _text(src, c)) in ("const", "volatile")]
    if cv:
        return_type = " ".join((*cv, return_type))
    declarator = fn.child_by_field_name("declarator")
    while declarator is not None and declarator.type in ("pointer_declarator", "reference_declarator"):
        return_type += "*" if declarator.type == "pointer_declarator" else "&"
        declarator = _inner_declarator(declarator)
    if declarator is None or declarator.type != "function_declarator":
        return qualifier, return_type, "", None, None, bounds
    name_node = declarator.child_by_field_name("declarator")
    name_text = _strip_template_args(_text(src, name_node)) if name_node is not None else ""
    # Point the name span at the last identifier of a qualified or templated name.
    while name_node is not None and name_node.type in ("qualified_identifier", "template_function"):
        name_node = name_node.child_by_field_name("name")
    return qualifier, return_type, name_text, name_node, declarator, bounds


def _param(node: Node, src: bytes) -> Param | None:
    if node.type not in ("parameter_declaration", "optional_parameter_declaration"):
        return None
    is_const = any(c.type == "type_qualifier" and _text(src, c) == "const" for c in node.children)
    type_node = node.child_by_field_name("type")
    base_type = _normalize(_text(src, type_node)) if type_node is not None else ""
    pointer_depth = 0
    is_restrict = False
    name_node = None
    declarator = node.child_by_field_name("declarator")
    while declarator is not None:
        kind = declarator.type
        if kind in ("pointer_declarator", "abstract_pointer_declarator"):
            pointer_depth += 1
            for child in declarator.children:
                if child.type == "type_qualifier" and "restrict" in _text(src, child):
                    is_restrict = True
        elif kind in ("array_declarator", "abstract_array_declarator"):
            pointer_depth += 1
        elif kind in ("identifier", "field_identifier"):
            name_node = declarator
            break
        elif kind in ("parenthesized_declarator", "abstract_parenthesized_declarator", "reference_declarator"):
            # float (*p)[4] and int& r: the inner declarator is an unnamed child.
            declarator = next(iter(declarator.named_children), None)
            continue
        declarator = declarator.child_by_field_name("declarator")
    if any(c.type == "type_qualifier" and "restrict" in _text(src, c) for c in node.children):
        is_restrict = True
    end = node.end_byte
    default = node.child_by_field_name("default_value")
    if default is not None:
        end = default.start_byte
    if name_node is not None:
        type_bytes = src[node.start_byte : name_node.start_byte] + src[name_node.end_byte : end]
        name = _text(src, name_node)
    else:
        type_bytes = src[node.start_byte : end]
        name = ""
    type_text = _normalize(type_bytes.decode("utf-8", errors="replace").rstrip().rstrip("=")).replace(" *", "*")
    return Param(name, type_text, base_type, pointer_depth, is_const, is_restrict, _span(node))


def _shared_decls(node: Node, src: bytes, ev: _Eval) -> list[SharedDecl]:
    is_extern = any(c.type == "storage_class_specifier" and _text(src, c) == "extern" for c in node.children)
    type_node = node.child_by_field_name("type")
    type_text = _normalize(_text(src, type_node)) if type_node is not None else ""
    element_bytes = TYPE_SIZES_BYTES.get(type_text)
    decls = []
    for declarator in node.children_by_field_name("declarator"):
        dims: list[str] = []
        pointer = False
        current: Node | None = declarator
        name = ""
        while current is not None:
            kind = current.type
            if kind == "array_declarator":
                size = current.child_by_field_name("size")
                dims.append(_normalize(_text(src, size)) if size is not None else "")
            elif kind == "pointer_declarator":
                pointer = True
            elif kind == "identifier":
                name = _text(src, current)
                break
            current = current.child_by_field_name("declarator")
        dims.reverse()
        size_bytes: int | None = None
        if not is_extern and not pointer and element_bytes is not None:
            size_bytes = element_bytes
            for dim in dims:
                value = ev(dim) if dim else None
                if value is None or value < 0:
                    size_bytes = None
                    break
                size_bytes *= value
        decls.append(SharedDecl(name, type_text + ("*" if pointer else ""), tuple(dims), is_extern, size_bytes, _span(node)))
    return decls


_FOR_INIT = re.compile(r"^(?:[\w:<>\s]+?\s+)?(\w+)\s*(?:=\s*(.+)|\{(.+)\})$", re.S)
_FOR_COND = re.compile(r"^(\w+)\s*(<=|>=|<|>|!=)\s*(.+)$", re.S)
_FOR_UPDATE = re.compile(r"^(?:(\+\+|--)\s*(\w+)|(\w+)\s*(\+\+|--)|(\w+)\s*(\+=|-=|\*=|/=|<<=|>>=)\s*(.+))$", re.S)
_MAX_SIMULATED_TRIPS = 10_000


def _trip_count(node: Node, src: bytes, ev: _Eval) -> int | None:
    """Iterations of ``for (v = A; v OP B; v STEP)`` when A, B and STEP are constants."""
    init = node.child_by_field_name("initializer")
    cond = node.child_by_field_name("condition")
    update = node.child_by_field_name("update")
    if init is None or cond is None or update is None:
        return None
    mi = _FOR_INIT.match(_text(src, init).strip().rstrip(";").strip())
    mc = _FOR_COND.match(_text(src, cond).strip())
    mu = _FOR_UPDATE.match(_text(src, update).strip())
    if mi is None or mc is None or mu is None:
        return None
    var = mi.group(1)
    start = ev(mi.group(2) or mi.group(3) or "")
    bound = ev(mc.group(3))
    if mc.group(1) != var or start is None or bound is None:
        return None
    if mu.group(1):
        upd_var, op, step = mu.group(2), ("+=" if mu.group(1) == "++" else "-="), 1
    elif mu.group(3):
        upd_var, op, step = mu.group(3), ("+=" if mu.group(4) == "++" else "-="), 1
    else:
        upd_var, op, step_value = mu.group(5), mu.group(6), ev(mu.group(7))
        if step_value is None:
            return None
        step = step_value
    if upd_var != var:
        return None
    cmp = mc.group(2)

    def holds(v: int) -> bool:
        return {"<": v < bound, "<=": v <= bound, ">": v > bound, ">=": v >= bound, "!=": v != bound}[cmp]

    if op in ("+=", "-="):
        delta = step if op == "+=" else -step
        if not holds(start):
            return 0
        if delta == 0:
            return None
        if cmp in ("<", "<=") and delta > 0:
            last = bound - 1 if cmp == "<" else bound
            return (last - start) // delta + 1
        if cmp in (">", ">=") and delta < 0:
            last = bound + 1 if cmp == ">" else bound
            return (start - last) // -delta + 1
        if cmp == "!=" and (bound - start) % delta == 0 and (bound - start) // delta > 0:
            return (bound - start) // delta
        return None
    # Geometric steps (s *= 2, s >>= 1): simulate; they finish in few iterations.
    value, trips = start, 0
    while holds(value):
        trips += 1
        if trips > _MAX_SIMULATED_TRIPS:
            return None
        new = {"*=": value * step, "<<=": value << step if 0 <= step < 64 else value,
               "/=": int(value / step) if step else value, ">>=": value >> step if 0 <= step < 64 else value}[op]
        if new == value:
            return None
        value = new
    return trips


def _has_pragma_unroll(node: Node, src: bytes) -> bool:
    prev = node.prev_named_sibling
    # A label or attribute never sits between the pragma and the loop in practice.
    if prev is None or prev.type != "preproc_call":
        return False
    text = _text(src, prev)
    return text.lstrip().startswith("#") and "pragma" in text and "unroll" in text and "nounroll" not in text


def _call_name(call: Node, src: bytes) -> str:
    fn = call.child_by_field_name("function")
    return _strip_template_args(_text(src, fn)) if fn is not None else ""


def _args(arguments: Node | None, src: bytes) -> tuple[str, ...]:
    if arguments is None:
        return ()
    return tuple(_normalize(_text(src, a)) for a in arguments.named_children if a.type != "comment")


def _launch(call: Node, src: bytes, enclosing: str | None, enclosing_span: Span | None) -> LaunchSite | None:
    config = next((c for c in call.children if c.type == "kernel_call_syntax"), None)
    if config is None:
        return None
    fn = call.child_by_field_name("function")
    if fn is None:
        return None
    name_node = fn
    template_args: tuple[str, ...] = ()
    while name_node is not None and name_node.type in ("qualified_identifier", "template_function"):
        if name_node.type == "template_function":
            template_args = _args(name_node.child_by_field_name("arguments"), src)
        name_node = name_node.child_by_field_name("name")
    parts = [_normalize(_text(src, c)) for c in config.named_children if c.type != "comment"]
    parts += [""] * (2 - len(parts))
    return LaunchSite(
        kernel=_strip_template_args(_text(src, fn)),
        grid=parts[0],
        block=parts[1],
        shared_mem=parts[2] if len(parts) > 2 else None,
        stream=parts[3] if len(parts) > 3 else None,
        args=_args(call.child_by_field_name("arguments"), src),
        span=_span(call),
        kernel_span=_span(name_node if name_node is not None else fn),
        enclosing_function=enclosing,
        enclosing_span=enclosing_span,
        template_args=template_args,
    )


def _analyze_unit(unit: _Unit, captures: dict[str, list[Node]], src: bytes, ev: _Eval,
                  give_way: Callable[[], None] = lambda: None) -> _UnitResult:
    qualifier, return_type, name_text, name_node, declarator, bounds = _function_header(unit, src)
    fn_node = unit.function_node
    body = fn_node.child_by_field_name("body") if fn_node.type == "function_definition" else None
    unit_span = _span(unit.node)
    base_name = name_text.rsplit("::", 1)[-1]
    qualified = "::".join(unit.context.scope + (name_text,)) if name_text else ""

    launches: list[LaunchSite] = []
    calls: list[Call] = []
    for count, call in enumerate(captures.get("call", ()), 1):
        if count % _YIELD_EVERY == 0:
            give_way()
        launch = _launch(call, src, base_name or None, unit_span)
        if launch is not None:
            launches.append(launch)
        elif body is not None:
            calls.append(Call(_call_name(call, src), _args(call.child_by_field_name("arguments"), src), _span(call)))
    if not qualifier or "__host__" == qualifier or name_node is None:
        # Host code: its launches, and for a definition where it is.
        host = None
        if body is not None and name_node is not None and declarator is not None:
            params = declarator.child_by_field_name("parameters")
            signature = f"{return_type} {qualified}{_text(src, params) if params is not None else '()'}"
            host = HostFunction(base_name, qualified, " ".join(signature.split()), unit_span, _span(name_node))
        return _unit_result(unit_span, None, launches, body is not None, host)

    params = []
    param_list = declarator.child_by_field_name("parameters") if declarator is not None else None
    for child in param_list.named_children if param_list is not None else ():
        param = _param(child, src)
        if param is not None:
            params.append(param)

    loops = []
    open_ends: list[int] = []
    for loop in captures.get("loop", ()):
        while open_ends and open_ends[-1] <= loop.start_byte:
            open_ends.pop()
        kind = {"for_statement": "for", "while_statement": "while", "do_statement": "do"}[loop.type]
        trips = _trip_count(loop, src, ev) if kind == "for" else None
        loops.append(Loop(kind, _span(loop), len(open_ends) + 1, trips, _has_pragma_unroll(loop, src)))
        open_ends.append(loop.end_byte)

    shared = [decl for node in captures.get("shared", ()) for decl in _shared_decls(node, src, ev)]
    objs, fields_ = captures.get("idx_obj", ()), captures.get("idx_field", ())
    index_uses = sorted(
        {src[o.start_byte : o.end_byte] + b"." + src[f.start_byte : f.end_byte] for o, f in zip(objs, fields_)}
    )
    syncs = tuple(c for c in calls if c.name in _SYNC_NAMES or c.name.endswith(".sync"))
    atomics = tuple(c for c in calls if c.name.rsplit("::", 1)[-1].startswith("atomic"))
    found = _Found(
        _span(name_node),
        _span(body) if body is not None else None,
        tuple(params),
        tuple(shared),
        tuple(loops),
        syncs,
        atomics,
        tuple(calls),
    )
    function = Function(
        name=base_name,
        qualifier=qualifier,
        return_type=return_type,
        span=unit_span,
        is_template=unit.is_template,
        is_extern_c=unit.context.is_extern_c,
        launch_bounds=bounds,
        thread_index_uses=tuple(use.decode("utf-8", errors="replace") for use in index_uses),
        qualified_name=qualified,
        _layout=_Layout(found, (unit_span.start_byte, *unit_span.start), None),
        template_params=_template_params(unit.node, src),
    )
    return _unit_result(unit_span, function, launches, body is not None)


def _template_params(node: Node, src: bytes) -> tuple[str, ...]:
    if node.type != "template_declaration":
        return ()
    params = node.child_by_field_name("parameters")
    names = []
    for param in params.named_children if params is not None else ():
        name = next((c for c in param.children if c.type in ("type_identifier", "identifier")), None)
        if name is None:
            name = param.child_by_field_name("declarator") or param.child_by_field_name("name")
        if name is not None:
            names.append(_text(src, name))
    return tuple(names)


# The _Shift method that moves each item of a function's position tuples (see _Layout.placed).
_MOVERS = {"params": "param", "shared": "shared", "loops": "loop", "syncs": "call", "atomics": "call", "calls": "call"}


class _Shift(NamedTuple):
    """How a unit whose text is unchanged moved: every byte by ``d_byte``, every line by ``d_line``.

    Points on the unit's first line also move by the column delta (a unit can
    start mid-line); every other point keeps its column, and when no line moved
    the points are shared.
    """

    d_byte: int
    d_line: int
    first_line: int
    d_column: int

    @staticmethod
    def between(origin: tuple[int, int, int], start: tuple[int, int, int]) -> _Shift | None:
        """The shift of a unit from ``origin`` to ``start``, both (byte, line, byte column); None if it did not move."""
        if origin == start:
            return None
        return _tuple_new(_Shift, (start[0] - origin[0], start[1] - origin[1], origin[1], start[2] - origin[2]))

    # Built with tuple.__new__, not Point(...)/Span(...): a NamedTuple's __new__ is a Python frame,
    # and every moved span makes three tuples.
    def point(self, p: Point) -> Point:
        if p[0] == self.first_line:
            if self.d_line == 0 and self.d_column == 0:
                return p
            return _tuple_new(Point, (p[0] + self.d_line, p[1] + self.d_column))
        return _tuple_new(Point, (p[0] + self.d_line, p[1])) if self.d_line else p

    def span(self, s: Span) -> Span:
        d_byte = self.d_byte
        if self.d_line == 0 and self.d_column == 0:
            return _tuple_new(Span, (s[0], s[1], s[2] + d_byte, s[3] + d_byte))
        return _tuple_new(Span, (self.point(s[0]), self.point(s[1]), s[2] + d_byte, s[3] + d_byte))

    # Positional constructors, not instance-dict copies: an instance built by __init__ keeps its
    # attributes inline (one GC-tracked object instead of two). test_index_incremental compares
    # against a fresh build, so a field forgotten here fails there.
    def param(self, p: Param) -> Param:
        return Param(p.name, p.type_text, p.base_type, p.pointer_depth, p.is_const, p.is_restrict, self.span(p.span))

    def shared(self, d: SharedDecl) -> SharedDecl:
        return SharedDecl(d.name, d.type_text, d.dims, d.is_extern, d.size_bytes, self.span(d.span))

    def loop(self, lp: Loop) -> Loop:
        return Loop(lp.kind, self.span(lp.span), lp.depth, lp.trip_count, lp.has_pragma_unroll)

    def call(self, c: Call) -> Call:
        return Call(c.name, c.args, self.span(c.span))

    def function(self, f: Function, unit_span: Span, layout: _Layout) -> Function:
        """``f`` moved: its span now ``unit_span``, its other positions placed when read (see :class:`_Layout`)."""
        moved = _new_function(Function)
        # Straight into the instance dict: the frozen dataclass __init__ sets each field through
        # object.__setattr__, several times slower, and ~1,000 functions move per keystroke.
        moved.__dict__.update(f._fixed, span=unit_span, _layout=layout)
        return moved

    def launches(self, launches: tuple[LaunchSite, ...], unit_span: Span) -> tuple[LaunchSite, ...]:
        span = self.span
        return tuple(
            LaunchSite(
                launch.kernel,
                launch.grid,
                launch.block,
                launch.shared_mem,
                launch.stream,
                launch.args,
                span(launch.span),
                span(launch.kernel_span),
                launch.enclosing_function,
                unit_span,
                launch.template_args,
            )
            for launch in launches
        )


_new_function = object.__new__
_tuple_new = tuple.__new__


def _syntax_errors(root: Node, src: bytes) -> tuple[SyntaxError_, ...]:
    """ERROR and MISSING nodes, outermost first, at most ``_MAX_SYNTAX_ERRORS``; visits only subtrees with errors."""
    if not root.has_error:
        return ()
    errors: list[SyntaxError_] = []
    stack = [root]
    while stack and len(errors) < _MAX_SYNTAX_ERRORS:
        node = stack.pop()
        if node.is_missing:
            errors.append(SyntaxError_(f"missing '{node.type}'", _span(node)))
            continue
        if node.is_error:
            snippet = _normalize(src[node.start_byte : min(node.end_byte, node.start_byte + 40)].decode("utf-8", "replace"))
            errors.append(SyntaxError_(f"syntax error near '{snippet}'" if snippet else "syntax error", _span(node)))
            # MISSING nodes below an ERROR are reported too: they say what the parser expected.
        stack.extend(reversed([c for c in node.children if c.has_error]))
    errors.sort(key=lambda e: e.span.start_byte)
    return tuple(errors)


class IncrementalIndexer:
    """Builds :class:`KernelIndex` for successive versions of one document, reusing unchanged work.

    Usage (one instance per open document)::

        doc = ParsedDocument(text)
        indexer = IncrementalIndexer()
        index = indexer.index(doc)
        doc.apply_edit(...)            # incremental reparse
        index = indexer.index(doc)     # re-analyses only changed functions

    A function unit (a top-level definition or declaration, with its template
    header) is reused when its bytes, its namespace/extern "C" context and the
    file's constants are all unchanged; a unit that only moved keeps its analysis, and an offset
    from where it was analysed places its positions when they are read (see :class:`_Layout`
    and :class:`_LaunchPart`). The cache holds the latest version's units, plus at most as many
    units that recent versions no longer have (``_spare``, oldest dropped first), so memory stays
    proportional to the document. The spares are for typing: an unclosed ``{`` makes tree-sitter
    read every later function differently until the ``}`` is typed, and the version that closes
    it finds the functions it had before in the spares instead of analysing them all again.
    """

    def __init__(self, give_way: Callable[[], None] | None = None) -> None:
        self._give_way = give_way or (lambda: None)
        """Called at the analysis' yield points: before each changed unit, and every :data:`_YIELD_EVERY`
        captures or calls within one (an unclosed ``{`` makes half a file one unit); see
        :mod:`kernel_lsp.server.foreground`."""
        # Keyed by the unit's text alone, its context checked on a hit: a bytes object hashes once
        # and keeps its hash, a tuple key would be hashed again for every look-up and insertion.
        # The result is the unit as analysed (never a moved copy), so shifts do not compound.
        self._cache: dict[bytes, tuple[tuple[object, ...], _UnitResult]] = {}
        self._spare: dict[bytes, tuple[tuple[object, ...], _UnitResult]] = {}
        self._macros = _MacroPass(self._give_way)

    def index(self, doc: ParsedDocument, macros: Preprocessed | None = None, *, may_expand: bool = True,
              budget: Budget | None = None, macros_pending: bool = False) -> KernelIndex:
        """The index of ``doc``'s current text.

        ``macros``: the file's macro view (its macro table at the end of the file); units that use a
        macro holding code, and units with a syntax error next to a macro, are read from their expansion
        (see :class:`_MacroPass`). ``may_expand``: whether pcpp may run now; when it may not and an
        expansion is not known from an earlier build, the index is :attr:`~KernelIndex.pending`.
        ``budget``: what each expansion may spend. ``macros_pending``: the file has directives whose
        macro table is not known yet: every syntax error is held back and the index is pending.
        """
        src, tree = doc.snapshot()
        root = tree.root_node
        constants: dict[str, str] = {}
        units = list(_iter_units(root, src, constants))
        constants_key = hash(tuple(sorted(constants.items())))
        cache = self._cache
        new_cache: dict[bytes, tuple[tuple[object, ...], _UnitResult]] = {}
        # Per unit: (the unit as analysed, its function where it is now, its launch part).
        results: list[tuple[_UnitResult, Function | None, _LaunchPart | None, HostFunction | None] | None] = []
        dirty: list[int] = []
        dirty_keys: list[tuple[bytes, tuple[object, ...]]] = []
        for i, unit in enumerate(units):
            node = unit.node
            start_byte = node.start_byte
            text = src[start_byte : node.end_byte]
            context = (unit.context, unit.is_template, constants_key)
            cached = cache.get(text)
            if cached is None:
                cached = self._spare.get(text)
            if cached is None or cached[0] != context:
                results.append(None)
                dirty.append(i)
                dirty_keys.append((text, context))
                continue
            new_cache[text] = cached
            base = cached[1]
            base_span = base.span
            if base_span.start_byte == start_byte and base_span.start == node.start_point:
                results.append((base, base.function, base.part, base.host))
                continue
            f = base.function
            origin = (base_span.start_byte, *base_span.start)
            shift = _Shift.between(origin, (start_byte, *node.start_point))
            unit_span = shift.span(base_span)
            moved = shift.function(f, unit_span, _Layout(f._layout.found, origin, shift)) if f is not None else None
            part = _tuple_new(_LaunchPart, (start_byte, base.launches, shift, unit_span)) if base.launches else None
            host = base.host
            if host is not None:
                # tuple.__new__, not _replace: ~200 host functions move per keystroke in a 10,000-line file.
                host = _tuple_new(HostFunction, (host.name, host.qualified_name, host.signature, unit_span,
                                                 shift.span(host.name_span)))
            results.append((base, moved, part, host))
        if dirty:
            analysed = self._analyze_dirty(units, dirty, root, src, constants, self._give_way)
            for i, (text, context), result in zip(dirty, dirty_keys, analysed):
                new_cache[text] = (context, result)
                results[i] = (result, result.function, result.part, result.host)
        if len(new_cache) < len(cache) or any(text not in new_cache for text in cache):
            self._retire(cache, new_cache)
        self._cache = new_cache
        errors = _syntax_errors(root, src)
        if doc.is_binary:
            end = (src.count(b"\n"), len(src) - src.rfind(b"\n") - 1)
            errors = (SyntaxError_("binary data, not CUDA source: not analysed", Span(Point(0, 0), Point(*end), 0, len(src))),)
            return _assemble(results, errors, constants)
        if macros_pending:
            index = _assemble(results, (), constants)
            object.__setattr__(index, "pending", True)
            return index
        if macros is None:
            self._macros.clear()
            return _assemble(results, errors, constants)
        done = self._macros.run(units, results, root, src, errors, constants, macros, may_expand, budget)
        index = _assemble(done.results, done.errors, constants)
        object.__setattr__(index, "pending", done.pending)
        object.__setattr__(index, "notes", done.notes)
        return index

    def _retire(self, old: dict[bytes, Any], new: dict[bytes, Any]) -> None:
        """Keep the units of ``old`` that ``new`` lacks as spares, at most ``len(new)`` of them."""
        spare = self._spare
        for text, entry in old.items():
            if text not in new:
                spare.pop(text, None)
                spare[text] = entry  # re-inserted: the newest spares are last
        for text in new:
            spare.pop(text, None)
        excess = len(spare) - max(len(new), 1)
        if excess > 0:
            for text in list(itertools.islice(spare, excess)):
                del spare[text]

    @staticmethod
    def _analyze_dirty(
        units: list[_Unit],
        dirty: list[int],
        root: Node,
        src: bytes,
        constants: Mapping[str, str],
        give_way: Callable[[], None],
    ) -> list[_UnitResult]:
        """Run the inner query once over the byte range covering all dirty units, then bucket captures by unit."""
        first, last = units[dirty[0]].node, units[dirty[-1]].node
        cursor = QueryCursor(_INNER_QUERY)
        cursor.set_byte_range(first.start_byte, last.end_byte)
        captured = cursor.captures(root)
        starts = [units[i].node.start_byte for i in dirty]
        ends = [units[i].node.end_byte for i in dirty]
        buckets: list[dict[str, list[Node]]] = [{} for _ in dirty]
        # Many loops share bounds and sizes (TILE, 4, BLOCK): evaluate each text once per build.
        ev: _Eval = functools.lru_cache(maxsize=None)(lambda text: evaluate_int(text, constants))
        for name, nodes in captured.items():
            for count, node in enumerate(nodes, 1):
                if count % _YIELD_EVERY == 0:
                    give_way()
                pos = bisect.bisect_right(starts, node.start_byte) - 1
                if pos >= 0 and node.end_byte <= ends[pos]:
                    buckets[pos].setdefault(name, []).append(node)
        results = []
        for pos, i in enumerate(dirty):
            # Captures of one name come grouped by pattern, not in document order.
            for nodes in buckets[pos].values():
                nodes.sort(key=_start_byte)
            give_way()
            results.append(_analyze_unit(units[i], buckets[pos], src, ev, give_way))
        return results

# ---------------------------------------------------------------------------
# The macro pass: units that macros define or fill, read from their expansion.
#
# tree-sitter reads the raw text. Where a macro holds code (``STRIDED(z_stride2, 2)`` defining a
# kernel at file scope, ``if (i < n) { BODY }`` with ``BODY`` a statement, ``KERNEL void k()`` with
# ``KERNEL`` standing for ``__global__``), the raw text is not what nvcc compiles: kernels go missing
# and tree-sitter's errors there are false. Such a top-level *item* (the unit a macro use sits in, or
# a file-scope invocation that is no unit at all) is expanded with the file's macro table (pcpp,
# :func:`~kernel_lsp.core.source.expand_snippet`), the expansion parsed and analysed like any unit,
# and every position mapped back onto the user's text: lines through the expansion's line map, and
# within a line, a point inside the expanded part onto the macro use it came from (so a kernel that a
# macro invocation defines is at the invocation, its name where the invocation names it). Its syntax
# errors are those of the expansion: an error on raw text stays only where the expanded text is
# wrong too. Items are found from the tree (identifiers that name a code macro; a syntax error on a
# line that names any macro), expansions cached by the item's text, and reused moved like units.
# ---------------------------------------------------------------------------

#: Items larger than this are left as tree-sitter reads them (an unclosed brace while typing can
#: make half a file one item; pcpp would take seconds over it).
_MAX_MACRO_ITEM_BYTES = 64 * 1024
_NESTING_TYPES = frozenset({
    "namespace_definition", "declaration_list", "field_declaration_list", "preproc_if", "preproc_ifdef",
    "preproc_else", "preproc_elif", "preproc_elifdef", *_CLASS_TYPES,
})
_ITEM_TYPES = frozenset({
    "function_definition", "template_declaration", "declaration", "linkage_specification", "field_declaration",
    "expression_statement", "type_definition", "template_instantiation", "ERROR",
})
_IDENTIFIERS_QUERY = Query(CUDA_LANGUAGE, "(identifier) @id (type_identifier) @id")
#: Lines whose "names a macro" answer is kept, at most (per document).
_NAMED_LINES_KEPT = 4096
_USE_QUERIES: dict[frozenset[str], Query] = {}
_USE_QUERIES_KEPT = 16


def _uses_query(names: frozenset[str]) -> Query:
    """A query for the identifiers that are one of ``names`` (compiled once per set of names)."""
    query = _USE_QUERIES.get(names)
    if query is None:
        quoted = " ".join(f'"{name}"' for name in sorted(names))
        query = Query(CUDA_LANGUAGE, f"((identifier) @m (#any-of? @m {quoted})) "
                                     f"((type_identifier) @m (#any-of? @m {quoted}))")
        if len(_USE_QUERIES) >= _USE_QUERIES_KEPT:
            _USE_QUERIES.clear()
        _USE_QUERIES[names] = query
    return query


class _JoinedItem(NamedTuple):
    """Two top-level items read as one (the byte and point fields of a node that spans both)."""

    start_byte: int
    end_byte: int
    start_point: tuple[int, int]
    end_point: tuple[int, int]


def _joined(item: Node) -> Node | _JoinedItem:
    """``item``, or ``item`` with the function definition after it: a declaration the parser closed with a
    missing ``;`` just before a definition is a macro between a function's type and its name (SHOC's
    ``__global__ void LAUNCH_BOUNDS(128, 4) kernel(…) {…}``), which only the two together expand into."""
    following = item.next_named_sibling
    # In a template the declaration closed early is the template's own (``template <class real> __global__ void M(…)``).
    closed = item.named_children[-1] if item.type == "template_declaration" and item.named_children else item
    if closed.type == "declaration" and any(c.is_missing for c in closed.children) and following is not None \
            and following.type == "function_definition":
        return _JoinedItem(item.start_byte, following.end_byte, item.start_point, following.end_point)
    return item


def _item_of(node: Node, root: Node, src: bytes) -> tuple[Node, _Context] | None:
    """The top-level item holding ``node`` (what :func:`_iter_units` would take as a unit, or a file-scope
    statement) and its context; None inside a directive or outside any item."""
    chain: list[Node] = []
    current: Node | None = node
    while current is not None and current.parent is not None:
        chain.append(current)
        current = current.parent
    chain.reverse()
    ctx = _Context((), False)
    for i, item in enumerate(chain):
        kind = item.type
        nested = chain[i + 1] if i + 1 < len(chain) else None
        if nested is not None:
            if kind == "namespace_definition":
                name = item.child_by_field_name("name")
                scope = tuple(_text(src, name).split("::")) if name is not None else ()
                ctx = _Context(ctx.scope + scope, ctx.is_extern_c, ctx.in_template)
                continue
            if kind in _CLASS_TYPES:
                name = item.child_by_field_name("name")
                scope = (_strip_template_args(_text(src, name)),) if name is not None else ()
                ctx = _Context(ctx.scope + scope, ctx.is_extern_c, ctx.in_template)
                continue
            if kind in _NESTING_TYPES:
                continue
            body = item.child_by_field_name("body") if kind == "linkage_specification" else None
            if body is not None and body.type == "declaration_list":
                value = item.child_by_field_name("value")
                ctx = _Context(ctx.scope, value is not None and b'"C"' in src[value.start_byte : value.end_byte],
                               ctx.in_template)
                continue
            if kind == "template_declaration" and nested.type in _CLASS_TYPES:
                ctx = _Context(ctx.scope, ctx.is_extern_c, True)
                continue
            if kind == "ERROR" and nested.type in _ITEM_TYPES:
                continue
        return (item, ctx) if kind in _ITEM_TYPES else None
    return None


class _Mapper:
    """Positions in an item's expansion -> positions in the user's text (see the section comment)."""

    def __init__(self, raw_lines: list[bytes], expanded_lines: list[bytes], origins: tuple[Any, ...],
                 first: tuple[int, int, int]) -> None:
        self._raw = raw_lines
        self._expanded = expanded_lines
        self._origins = origins
        self._line0 = first[1]
        self._column0 = first[2]
        starts = [first[0] - first[2]]
        for line in raw_lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        self._starts = starts
        self._edges: dict[int, tuple[int, int]] = {}

    def _raw_line(self, line: int) -> int:
        """The item's line (0-based) that expanded ``line`` came from (a marker line: the next line's)."""
        origins = self._origins
        for candidate in range(line, len(origins)):
            if origins[candidate] is not None:
                return min(origins[candidate][1], len(self._raw) - 1)
        return len(self._raw) - 1

    def point(self, line: int, column: int, end: bool) -> tuple[int, int, int]:
        """(user line, byte column, byte offset) of the expansion's (line, byte column)."""
        own = self._raw_line(line)
        raw = self._raw[own]
        expanded = self._expanded[line] if line < len(self._expanded) else b""
        if raw != expanded:
            edges = self._edges.get(line)
            if edges is None:
                prefix = common_prefix(raw, expanded)
                edges = self._edges[line] = (prefix, common_suffix(raw, expanded, min(len(raw), len(expanded)) - prefix))
            prefix, suffix = edges
            if column <= prefix:
                pass
            elif column >= len(expanded) - suffix:
                column += len(raw) - len(expanded)
            else:
                # Inside what a macro use became: the use itself.
                column = len(raw) - suffix if end else prefix
        column = min(max(column, self._column0 if own == 0 else 0), len(raw))
        return self._line0 + own, column, self._starts[own] + column

    def span(self, span: Span) -> Span:
        sl, sc, sb = self.point(span.start.line, span.start.column_byte, False)
        el, ec, eb = self.point(span.end.line, span.end.column_byte, True)
        if eb < sb:
            el, ec, eb = sl, sc, sb
        return Span(Point(sl, sc), Point(el, ec), sb, eb)


def _mapped_result(result: _UnitResult, m: _Mapper, name_span: Callable[[str, Span], Span]) -> _UnitResult:
    """``result`` (of a unit in an expansion) with every position on the user's text."""
    span = m.span(result.span)
    function = result.function
    if function is not None:
        found = function._layout.found
        mapped = _Found(
            name_span(function.name, m.span(found.name_span)),
            m.span(found.body_span) if found.body_span is not None else None,
            tuple(dataclasses.replace(p, span=m.span(p.span)) for p in found.params),
            tuple(dataclasses.replace(d, span=m.span(d.span)) for d in found.shared),
            tuple(dataclasses.replace(lp, span=m.span(lp.span)) for lp in found.loops),
            tuple(dataclasses.replace(c, span=m.span(c.span)) for c in found.syncs),
            tuple(dataclasses.replace(c, span=m.span(c.span)) for c in found.atomics),
            tuple(dataclasses.replace(c, span=m.span(c.span)) for c in found.calls),
        )
        function = dataclasses.replace(function, span=span, _layout=_Layout(mapped, (span.start_byte, *span.start), None))
    launches = [launch._replace(span=m.span(launch.span), kernel_span=m.span(launch.kernel_span), enclosing_span=span)
                for launch in result.launches]
    host = result.host
    if host is not None:
        host = host._replace(span=span, name_span=name_span(host.name, m.span(host.name_span)))
    return _unit_result(span, function, launches, result.is_definition, host)


def _shifted_result(result: _UnitResult, shift: _Shift | None) -> _UnitResult:
    if shift is None:
        return result
    span = shift.span(result.span)
    function = result.function
    if function is not None:
        layout = function._layout
        function = shift.function(function, span, _Layout(layout.found, layout.origin, shift))
    host = result.host
    if host is not None:
        host = host._replace(span=span, name_span=shift.span(host.name_span))
    return _unit_result(span, function, list(shift.launches(result.launches, span)), result.is_definition, host)


def _within(span: Span, start: int, end: int) -> bool:
    """``span`` starts in [start, end), or is empty at ``end`` (a ``MISSING ';'`` closing the item)."""
    return start <= span.start_byte < end or span.start_byte == span.end_byte == end


class _Expanded(NamedTuple):
    """One item's expansion, analysed, in the user's coordinates where the item was."""

    origin: tuple[int, int, int]
    """(byte, line, byte column) of the item's start then."""
    results: tuple[_UnitResult, ...] | None
    """None: not expanded (over its budget); the item is read raw."""
    errors: tuple[SyntaxError_, ...]
    note: SyntaxError_ | None
    """Why it was not expanded, on the item."""


class _MacroDone(NamedTuple):
    results: list[tuple[_UnitResult, Function | None, _LaunchPart | None, HostFunction | None]]
    errors: tuple[SyntaxError_, ...]
    pending: bool
    notes: tuple[SyntaxError_, ...]


class _MacroPass:
    """The macro pass of one document's :class:`IncrementalIndexer` (its cache of expansions)."""

    def __init__(self, give_way: Callable[[], None]) -> None:
        self._give_way = give_way
        self._view: Preprocessed | None = None
        self._cache: dict[tuple[bytes, int, _Context], _Expanded] = {}
        self._code: frozenset[str] = frozenset()
        """The view's code macros that can be queried (identifiers)."""
        self._named_lines: dict[bytes, bool] = {}
        """Whether a line's text names a macro of the view: an unclosed brace keeps the same lines in error
        over many keystrokes."""

    def clear(self) -> None:
        self._view = None
        self._cache = {}
        self._code = frozenset()
        self._named_lines = {}

    def run(self, units: list[_Unit], results: list[Any], root: Node, src: bytes,
            errors: tuple[SyntaxError_, ...], constants: Mapping[str, str], view: Preprocessed, may_expand: bool,
            budget: Budget | None) -> _MacroDone:
        if view is not self._view:
            # Another macro table: every expansion may differ.
            self.clear()
            self._view = view
            self._code = frozenset(name for name in view.code_macros if name.replace("$", "_").isidentifier())
        items = self._items(root, src, errors, view)
        if not items:
            self._cache = {}
            return _MacroDone(results, errors, False, ())
        cache, new_cache = self._cache, {}
        pending = False
        notes: list[SyntaxError_] = []
        done: dict[int, _Expanded] = {}
        for item, ctx in items:
            start = (item.start_byte, *item.start_point)
            key = (src[item.start_byte : item.end_byte], item.start_point[1], ctx)
            hit = cache.get(key)
            if hit is None:
                if not may_expand:
                    pending = True
                    continue
                self._give_way()
                hit = self._expand(item, ctx, root, src, constants, view, budget)
            new_cache[key] = hit
            shift = _Shift.between(hit.origin, start)
            if hit.results is None:
                if hit.note is not None:
                    notes.append(SyntaxError_(hit.note.message, shift.span(hit.note.span)) if shift else hit.note)
                continue
            done[item.start_byte] = _Expanded(start, tuple(_shifted_result(r, shift) for r in hit.results),
                                              tuple(SyntaxError_(e.message, shift.span(e.span)) if shift else e
                                                    for e in hit.errors), hit.note)
        self._cache = new_cache
        # Expanded items replace the units within them; errors within them are the expansion's, and
        # within items still to expand, held back.
        ranges = [(item.start_byte, item.end_byte, done.get(item.start_byte)) for item, _ in items
                  if item.start_byte in done or pending]
        merged: list[Any] = []
        kept_errors = [e for e in errors if not any(_within(e.span, a, b) for a, b, _ in ranges)]
        r = 0
        for unit, entry in zip(units, results):
            start_byte = unit.node.start_byte
            while r < len(ranges) and ranges[r][1] <= start_byte:
                merged += self._entries(ranges[r][2])
                r += 1
            if r < len(ranges) and ranges[r][0] <= start_byte < ranges[r][1] and ranges[r][2] is not None:
                continue
            merged.append(entry)
        for _, _, expanded in ranges[r:]:
            merged += self._entries(expanded)
        for expanded in done.values():
            kept_errors += expanded.errors
        kept_errors.sort(key=lambda e: e.span.start_byte)
        return _MacroDone(merged, tuple(kept_errors[:_MAX_SYNTAX_ERRORS]), pending, tuple(notes))

    @staticmethod
    def _entries(expanded: _Expanded | None) -> list[Any]:
        if expanded is None or expanded.results is None:
            return []
        return [(r, r.function, r.part, r.host) for r in expanded.results]

    def _items(self, root: Node, src: bytes, errors: tuple[SyntaxError_, ...], view: Preprocessed) -> list[tuple[Node, _Context]]:
        """The items to read from their expansion, in document order, none inside another."""
        found: dict[int, tuple[Node, _Context]] = {}

        def add(node: Node) -> None:
            held = _item_of(node, root, src)
            if held is not None:
                held = (_joined(held[0]), held[1])
            if held is not None and held[0].end_byte - held[0].start_byte <= _MAX_MACRO_ITEM_BYTES:
                found.setdefault(held[0].start_byte, held)

        if self._code:
            for nodes in QueryCursor(_uses_query(self._code)).captures(root).values():
                for node in nodes:
                    add(node)
        names = view.macros
        if errors and names:
            # A syntax error on a line that names a macro (``float * RESTRICT x``): what nvcc reads there
            # is the expansion. Each line is read once (errors cluster), and its answer kept by its text.
            cursor = QueryCursor(_IDENTIFIERS_QUERY)
            seen: set[int] = set()
            known = self._named_lines
            if len(known) > _NAMED_LINES_KEPT:
                known.clear()
            for error in errors:
                start = src.rfind(b"\n", 0, error.span.start_byte) + 1
                if start in seen:
                    continue
                seen.add(start)
                stop = src.find(b"\n", error.span.start_byte)
                stop = len(src) if stop < 0 else stop
                line = src[start:stop]
                if known.get(line) is False:
                    continue
                cursor.set_byte_range(start, stop)
                named = [n for nodes in cursor.captures(root).values() for n in nodes if _text(src, n) in names]
                known[line] = bool(named)
                if named:
                    add(named[0])
        items = sorted(found.values(), key=lambda held: held[0].start_byte)
        # An item inside another (an ERROR holding a unit) gives way to the outer one.
        outer: list[tuple[Node, _Context]] = []
        for held in items:
            if outer and held[0].start_byte < outer[-1][0].end_byte:
                continue
            outer.append(held)
        return outer

    def _expand(self, item: Node, ctx: _Context, root: Node, src: bytes, constants: Mapping[str, str],
                view: Preprocessed, budget: Budget | None) -> _Expanded:
        line0, column0 = item.start_point
        origin = (item.start_byte, line0, column0)
        raw = b" " * column0 + src[item.start_byte : item.end_byte]
        expansion = expand_snippet(view, raw.decode("utf-8", errors="replace"), budget)
        if expansion.over_budget is not None:
            return _Expanded(origin, None, (), SyntaxError_(f"{expansion.over_budget}: this code is read as written",
                                                            _span(item)))
        expanded = expansion.text.encode("utf-8")
        tree = ParsedDocument(expanded).snapshot()[1]
        inner_root = tree.root_node
        local = dict(constants)
        inner_units = list(_iter_units(inner_root, expanded, local, ctx))
        analysed = (IncrementalIndexer._analyze_dirty(inner_units, list(range(len(inner_units))), inner_root, expanded,
                                                      local, self._give_way) if inner_units else [])
        mapper = _Mapper(raw.split(b"\n"), expanded.split(b"\n"), expansion.origins, origin)

        def name_span(name: str, mapped: Span) -> Span:
            # A name a macro argument gave (``STRIDED(z_stride2, 2)``) is where the invocation writes it.
            if src[mapped.start_byte : mapped.end_byte] == name.encode():
                return mapped
            cursor = QueryCursor(_IDENTIFIERS_QUERY)
            line_start = src.rfind(b"\n", 0, mapped.start_byte) + 1
            cursor.set_byte_range(max(line_start, item.start_byte), max(mapped.end_byte, mapped.start_byte + 1))
            for node in sorted((n for ns in cursor.captures(root).values() for n in ns), key=_start_byte):
                if _text(src, node) == name and item.start_byte <= node.start_byte:
                    return _span(node)
            return mapped

        mapped = tuple(_mapped_result(result, mapper, name_span) for result in analysed)
        inner_errors = tuple(SyntaxError_(e.message, mapper.span(e.span)) for e in _syntax_errors(inner_root, expanded))
        return _Expanded(origin, mapped, inner_errors, None)


def _assemble(
    results: list[tuple[_UnitResult, Function | None, _LaunchPart | None, HostFunction | None]],
    errors: tuple[SyntaxError_, ...],
    constants: dict[str, str],
) -> KernelIndex:
    defined = {
        function.qualified_name
        for base, function, _, _ in results
        if function is not None and base.is_definition
    }
    # A prototype adds nothing when the same function is defined in the file.
    functions = tuple(
        function
        for base, function, _, _ in results
        if function is not None and (base.is_definition or function.qualified_name not in defined)
    )
    parts = [part for _, _, part, _ in results if part is not None]
    hosts = tuple(host for _, _, _, host in results if host is not None)
    return KernelIndex._lazy(functions, parts, errors, tuple(sorted(constants.items())), hosts)


def build_index(doc_or_text: ParsedDocument | str | bytes, macros: Preprocessed | None = None,
                budget: Budget | None = None) -> KernelIndex:
    """The kernel index of a document or of source text. Never raises on any input.

    ``macros``: the file's macro view, so kernels that macros define or fill are read from their
    expansion (see :meth:`IncrementalIndexer.index`). For repeated indexing of an edited document use
    :class:`IncrementalIndexer`.
    """
    doc = doc_or_text if isinstance(doc_or_text, ParsedDocument) else ParsedDocument(to_source_bytes(doc_or_text))
    return IncrementalIndexer().index(doc, macros, budget=budget)
