"""The analysis' results: accesses, loops, reductions and the facts of a kernel."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from kernel_lsp.core.poly import Poly, is_opaque


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    array: str
    """The base array: a pointer parameter, a ``__shared__`` array or a local array."""
    space: str
    """``global``, ``shared``, ``local`` or ``constant`` (a file's ``__constant__`` array)."""
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
    guards: tuple[tuple[int, bool], ...] = ()
    """The conditions (:attr:`KernelFacts.conditions` ids) that decide whether it runs, outermost
    first, each with the value it must have: ``if (i < n) a[i] = 0;`` runs under ``(id, True)``,
    whatever follows ``if (i >= n) return;`` under ``(id, False)``."""
    volatile: bool = False
    """It goes through ``volatile`` data: an array declared so, a volatile pointer, cast or reference, or a
    helper's volatile parameter (it is meant to reach memory; warp-synchronous code relies on that)."""

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
    bound_span: tuple[int, int] | None = None
    """Where the bound is written, when the whole test bounds the counter from above (``n`` of
    ``i < n``, ``i <= n``, ``n > i``) and :attr:`bound` is known."""
    bound_inclusive: bool = False
    """The test lets the counter reach the written bound (``i <= n``)."""
    step_span: tuple[int, int] | None = None
    """Where the update's added step is written (``s`` of ``i += s``, ``i = i + s``, ``i = s + i``)."""
    increments: bool = False
    """The update is ``++i`` or ``i++``."""
    update_span: tuple[int, int] | None = None
    """Where the counter's update is written: the ``for`` header's update, or the expression of the one
    statement at the top level of a ``while`` body that steps the counter (assigned nowhere else in it)."""


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
class Comparison:
    """``left op right`` on polynomials (``op``: ``< <= > >= == !=``)."""

    left: Poly
    op: str
    right: Poly

    _NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}

    def negated(self) -> Comparison:
        return Comparison(self.left, self._NEGATED[self.op], self.right)

    def upper_bound(self, poly: Poly) -> Poly | None:
        """The exclusive bound this comparison puts on ``poly`` (``poly < b`` → ``b``, ``poly <= b`` → ``b + 1``,
        ``b > poly`` likewise), or None when it bounds something else."""
        if self.left == poly and self.op in ("<", "<="):
            return self.right + (Poly.const(1) if self.op == "<=" else Poly())
        if self.right == poly and self.op in (">", ">="):
            return self.left + (Poly.const(1) if self.op == ">=" else Poly())
        return None

    def __str__(self) -> str:
        return f"{self.left} {self.op} {self.right}"


Test = tuple
"""A condition as the analysis reads it: ``("cmp", Comparison)``, ``("and", (Test, ...))``,
``("or", (Test, ...))``, ``("not", Test)``, or ``("opaque",)`` for anything it does not model."""


def implied(test: Test, value: bool) -> tuple[Comparison, ...]:
    """The comparisons that hold whenever ``test`` has ``value``: a conjunction taken true, a
    disjunction taken false (each term negated), a negation flipped; nothing from the other cases."""
    kind = test[0]
    if kind == "cmp":
        return (test[1],) if value else (test[1].negated(),)
    if kind == "not":
        return implied(test[1], not value)
    if kind == ("and" if value else "or"):
        return tuple(c for t in test[1] for c in implied(t, value))
    return ()


@dataclass(frozen=True)
class Condition:
    """A condition deciding which threads run some code: an ``if``, an early exit, ``?:``, the
    right operand of ``&&`` / ``||``, a ``while``/``do``/``switch`` test."""

    id: int
    kind: str
    """``if``, ``exit`` (``if (c) return;`` / ``continue;`` / ``break;``: what follows in its block runs
    where ``c`` is false), ``select`` (``?:``), ``and``/``or`` (the left operand, deciding the right),
    ``while``, ``do`` or ``switch``."""
    test: Test
    text: str
    """The condition as written (after expansion)."""
    thread_dependent: bool
    """It depends on the thread index (directly, through locals, loaded data or helpers)."""
    splits_warp: bool
    """A thread-dependent test that part of a warp can pass: a comparison of a thread-dependent value
    with a constant for (in)equality or not a multiple of 32, or a test of its bits (``tid % K``,
    ``tid & K``)."""
    line: int
    user_line: int | None
    loops: tuple[int, ...] = ()
    via: tuple[str, ...] = ()
    span: tuple[int, int] = (0, 0)
    """Byte range of the condition's expression in the preprocessed text."""
    statement_span: tuple[int, int] = (0, 0)
    """Byte range of the statement (or expression) it controls, the condition included."""
    warp_uniform: bool = True
    """It has one value for the 32 lanes of a warp as far as the analysis tells without a launch (no
    thread index, or ``threadIdx.x`` only divided by a multiple of 32)."""


@dataclass(frozen=True)
class Barrier:
    """A barrier: ``__syncthreads()`` and its counting forms, ``__syncwarp()``, a cooperative group's
    ``g.sync()`` or ``cg::sync(g)``."""

    scope: str
    """``block``, ``warp`` (a warp or a tile of one) or ``grid``."""
    text: str
    line: int
    user_line: int | None
    loops: tuple[int, ...] = ()
    via: tuple[str, ...] = ()
    guards: tuple[tuple[int, bool], ...] = ()
    span: tuple[int, int] = (0, 0)
    """Byte range of the call in the preprocessed text."""


@dataclass(frozen=True)
class WarpOperation:
    """A warp-level operation: a shuffle, a vote, a warp reduction (intrinsic or cooperative groups)."""

    text: str
    line: int
    user_line: int | None
    loops: tuple[int, ...] = ()
    via: tuple[str, ...] = ()
    span: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class IndexUse:
    """Where the kernel reads its thread, block or grid indices: the largest expression of ``+ - *``,
    casts and parentheses around a builtin (``blockIdx.x * blockDim.x + threadIdx.x``), as a
    polynomial (None when it is not one)."""

    text: str
    value: Poly | None
    line: int
    user_line: int | None
    via: tuple[str, ...] = ()
    span: tuple[int, int] = (0, 0)


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
    """Barrier calls (:attr:`barriers`: ``__syncthreads``, ``__syncwarp``, cooperative groups' ``sync``)."""
    shuffles: int
    """Warp-level operations: shuffles, votes and warp reductions (intrinsics or cooperative groups)."""
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
    conditions: tuple[Condition, ...] = ()
    """Every condition deciding what runs (:class:`Condition`), by id."""
    barriers: tuple[Barrier, ...] = ()
    warp_operations: tuple[WarpOperation, ...] = ()
    """Every warp-level operation (:attr:`shuffles` counts them)."""
    nonconst_copies: tuple[str, ...] = ()
    """Pointer parameters the kernel copies into a pointer or reference to non-const data (``float *p =
    in + base;``, a helper's ``float*`` parameter): ``const`` on them would not compile."""
    value_types: tuple[str, ...] = ()
    """The types of the kernel's parameters, locals and casts (qualifiers dropped, aliases and template
    parameters resolved)."""
    index_uses: tuple[IndexUse, ...] = ()
    """Every place the kernel (or a helper it calls) reads a builtin index (:class:`IndexUse`)."""
    group_values: Mapping[str, Poly] = field(default_factory=dict)
    """What the cooperative-group calls among :attr:`implicit_indices` stand for as thread-index
    polynomials (``cta.thread_rank()`` → the block's linear thread index), where they are ones."""
    implicit_indices: tuple[str, ...] = ()
    """Calls that read the thread or block index through a cooperative group (``cta.thread_rank()``,
    ``block.group_index().x``): a rewrite that renames ``threadIdx``/``blockIdx`` does not reach them."""
    constants: Mapping[str, int] = field(default_factory=dict)
    """Integer names the kernel's code reads as constants: the non-type template parameters of the
    instance analysed (``blockSize`` of ``reduce<float, 256>``) and the file's ``const``/``constexpr``
    integers."""

    def made_inside(self, poly: Poly, loops: Iterable[int]) -> bool:
        """A term of ``poly`` is a value made inside one of ``loops`` (a load at the counter, a variable the loop
        sets): it may change from one iteration to the next though no counter appears in it."""
        ids = set(loops)
        return any(ids & set(self.opaque[s].created_in) for s in poly.symbols if s in self.opaque)

    def constraints(self, access: Access | Barrier) -> tuple[Comparison, ...]:
        """The comparisons known to hold whenever ``access`` runs, from its guards."""
        return tuple(c for cid, value in access.guards for c in implied(self.conditions[cid].test, value))

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
