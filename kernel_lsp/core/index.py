"""The kernel index: what the rest of kernel-lsp knows about a CUDA file.

These frozen dataclasses are the API boundary of the analysis core. Every
position is a :class:`Span` of (line, UTF-8 byte column) points and byte
offsets into the source as UTF-8; the server converts to UTF-16.

The builder (``build_index``) walks a tree-sitter-cuda tree; parsing never
fails: a broken file yields a partial index plus ``syntax_errors``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Point:
    line: int
    """0-based line."""
    column_byte: int
    """0-based column in UTF-8 bytes."""


@dataclass(frozen=True)
class Span:
    start: Point
    end: Point
    start_byte: int
    end_byte: int

    def contains(self, line: int, column_byte: int) -> bool:
        after_start = (line, column_byte) >= (self.start.line, self.start.column_byte)
        before_end = (line, column_byte) <= (self.end.line, self.end.column_byte)
        return after_start and before_end


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
    params: tuple[Param, ...]
    span: Span
    """The whole definition."""
    name_span: Span
    body_span: Span | None
    is_template: bool
    is_extern_c: bool
    launch_bounds: tuple[str, ...]
    """Arguments of ``__launch_bounds__`` as written; empty when absent."""
    shared: tuple[SharedDecl, ...] = ()
    loops: tuple[Loop, ...] = ()
    syncs: tuple[Call, ...] = ()
    """``__syncthreads`` and friends."""
    atomics: tuple[Call, ...] = ()
    calls: tuple[Call, ...] = ()
    """Every call in the body (including syncs and atomics)."""
    thread_index_uses: tuple[str, ...] = ()
    """Distinct ``threadIdx.x``-style fields used (``threadIdx.x``, ``blockIdx.y``, ``blockDim.x``, ``gridDim.x``)."""

    @property
    def is_kernel(self) -> bool:
        return "__global__" in self.qualifier

    @property
    def signature(self) -> str:
        params = ", ".join(f"{p.type_text} {p.name}".replace("* ", "*") for p in self.params)
        return f"{self.qualifier} {self.return_type} {self.name}({params})"


@dataclass(frozen=True)
class LaunchSite:
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


@dataclass(frozen=True)
class SyntaxError_:
    message: str
    span: Span


@dataclass(frozen=True)
class KernelIndex:
    functions: tuple[Function, ...]
    launches: tuple[LaunchSite, ...]
    syntax_errors: tuple[SyntaxError_, ...] = field(default=())

    @property
    def kernels(self) -> tuple[Function, ...]:
        return tuple(f for f in self.functions if f.is_kernel)

    def function(self, name: str) -> Function | None:
        return next((f for f in self.functions if f.name == name), None)

    def launches_of(self, kernel: str) -> tuple[LaunchSite, ...]:
        return tuple(launch for launch in self.launches if launch.kernel == kernel)
