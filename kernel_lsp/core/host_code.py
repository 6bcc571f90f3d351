"""What the host code before a launch states, read from its tree: locals, ``dim3`` shapes, ``cudaMalloc`` sizes.

Launch sizes (:mod:`kernel_lsp.core.launch_dims`) and the launch-spec draft
(:mod:`kernel_lsp.core.spec_draft`) both need the values the launching function
gives its locals before the launch. Both read them here, from tree-sitter's tree
of the enclosing function (the span the kernel index records for the launch), so
comments and strings never match, comma declarations
(``const int M = 512, N = 384;``) give every name, and ``dim3 grid(n)`` (which
C++ parses as a function declaration) is still a shape. Macros are not expanded
here: callers evaluate the texts with the preprocessed view's macro table
(:meth:`kernel_lsp.core.source.Preprocessed.object_macros`).

Pure: bytes and a launch in, a frozen :class:`HostScope` out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tree_sitter import Node, Parser

from kernel_lsp.core.index import LaunchSite
from kernel_lsp.core.parse import CUDA_LANGUAGE, parser_input

#: Functions whose second argument is the byte count of the allocation their first argument receives.
MALLOC_FUNCTIONS = frozenset({"cudaMalloc", "cudaMallocManaged", "cudaMallocAsync"})


@dataclass(frozen=True)
class Local:
    name: str
    type_text: str
    """The declared type with its qualifiers, spaces squeezed (``const int``, ``dim3``, ``unsigned long long``)."""
    value: str | None
    """The initializer's text (``512``; the inside of ``{5}``); None for a constructor form or no initializer."""
    args: tuple[str, ...] | None
    """Constructor or brace arguments (``dim3 b(32, 8)`` -> ``("32", "8")``; ``dim3 b = dim3(4)`` -> ``("4",)``)."""
    end_byte: int
    """Where the declaration ends, as a byte offset into the whole source."""


@dataclass(frozen=True)
class HostScope:
    locals: tuple[Local, ...] = ()
    """Declarations before the launch, in order (a later one of the same name shadows an earlier one)."""
    defines: tuple[tuple[str, str], ...] = ()
    """``#define NAME value`` lines inside the function before the launch."""
    mallocs: tuple[tuple[str, str], ...] = ()
    """(the pointer as written, cast and ``&`` removed; the byte-count expression) of each ``cudaMalloc``."""
    assignments: tuple[tuple[str, int], ...] = ()
    """(name, byte offset) of every assignment, ``x.y =`` and ``++``/``--`` of a plain name before the launch."""

    def reassigned(self, local: Local) -> bool:
        """True when ``local`` is assigned after its declaration (before the launch): not a constant there."""
        return any(name == local.name and at >= local.end_byte for name, at in self.assignments)


def _squeeze(text: str) -> str:
    return " ".join(text.split())


@functools.lru_cache(maxsize=32)
def _tree(region: bytes) -> Node:
    # Hover, code lens and inlay hints ask for every launch of a function with the same text. A parser per
    # call: they ask from several threads, and one function's text parses in well under a millisecond.
    return Parser(CUDA_LANGUAGE).parse(parser_input(region)).root_node


def host_scope(source: str | bytes, launch: LaunchSite) -> HostScope:
    """The enclosing function's declarations, defines, allocations and assignments before ``launch``."""
    span = launch.enclosing_span
    if span is None:
        return HostScope()
    data = source if isinstance(source, bytes) else source.encode("utf-8", errors="replace")
    base = span.start_byte
    stop = launch.span.start_byte - base
    src = data[base : span.end_byte]
    locals_: list[Local] = []
    defines: list[tuple[str, str]] = []
    mallocs: list[tuple[str, str]] = []
    assignments: list[tuple[str, int]] = []

    def text(node: Node) -> str:
        return src[node.start_byte : node.end_byte].decode("utf-8", errors="replace")

    stack = [_tree(src)]
    while stack:
        node = stack.pop()
        if node.start_byte >= stop:
            continue
        kind = node.type
        if kind == "declaration" and node.end_byte <= stop:
            locals_ += _declaration(node, text, base)
        elif kind == "preproc_def":
            name, value = node.child_by_field_name("name"), node.child_by_field_name("value")
            if name is not None and value is not None:
                defines.append((text(name), _squeeze(text(value))))
        elif kind == "call_expression" and node.end_byte <= stop:
            fn = node.child_by_field_name("function")
            arguments = node.child_by_field_name("arguments")
            if fn is not None and arguments is not None and text(fn) in MALLOC_FUNCTIONS:
                args = [a for a in arguments.named_children if a.type != "comment"]
                if len(args) >= 2:
                    mallocs.append((_pointer_name(args[0], text), _squeeze(text(args[1]))))
        elif kind in ("assignment_expression", "update_expression"):
            target = node.child_by_field_name("left" if kind == "assignment_expression" else "argument")
            if target is not None and target.type == "field_expression":
                target = target.child_by_field_name("argument")
            if target is not None and target.type == "identifier":
                assignments.append((text(target), base + node.start_byte))
        stack.extend(reversed(node.children))
    return HostScope(tuple(locals_), tuple(defines), tuple(mallocs), tuple(assignments))


def _declaration(node: Node, text, base: int) -> list[Local]:
    type_node = node.child_by_field_name("type")
    if type_node is None:
        return []
    qualifiers = [text(c) for c in node.children if c.type in ("type_qualifier", "storage_class_specifier")]
    type_text = _squeeze(" ".join((*qualifiers, text(type_node))))
    out = []
    for declarator in node.children_by_field_name("declarator"):
        name, value, args = _declarator(declarator, text)
        if name is not None:
            out.append(Local(name, type_text, value, args, base + node.end_byte))
    return out


def _declarator(node: Node, text) -> tuple[str | None, str | None, tuple[str, ...] | None]:
    if node.type == "identifier":
        return text(node), None, None
    if node.type == "function_declarator":
        # ``dim3 grid(n);`` parses as a function declaration; inside a function body it constructs ``grid``.
        name, params = node.child_by_field_name("declarator"), node.child_by_field_name("parameters")
        if name is None or name.type != "identifier" or params is None:
            return None, None, None
        return text(name), None, tuple(_squeeze(text(p)) for p in params.named_children if p.type != "comment")
    if node.type != "init_declarator":
        return None, None, None
    name, value = node.child_by_field_name("declarator"), node.child_by_field_name("value")
    if name is None or name.type != "identifier" or value is None:
        return None, None, None
    if value.type in ("argument_list", "initializer_list"):
        args = tuple(_squeeze(text(a)) for a in value.named_children if a.type != "comment")
        return text(name), (args[0] if value.type == "initializer_list" and len(args) == 1 else None), args
    if value.type == "call_expression":
        fn, arguments = value.child_by_field_name("function"), value.child_by_field_name("arguments")
        if fn is not None and text(fn) == "dim3" and arguments is not None:
            return text(name), None, tuple(_squeeze(text(a)) for a in arguments.named_children if a.type != "comment")
    return text(name), _squeeze(text(value)), None


def _pointer_name(node: Node, text) -> str:
    """``(void **)&d_x`` -> ``d_x``: casts, parentheses and ``&`` removed."""
    while True:
        inner = None
        if node.type == "cast_expression":
            inner = node.child_by_field_name("value")
        elif node.type == "parenthesized_expression" and node.named_children:
            inner = node.named_children[0]
        elif node.type == "pointer_expression" and text(node).startswith("&"):
            inner = node.child_by_field_name("argument")
        if inner is None:
            return _squeeze(text(node))
        node = inner
