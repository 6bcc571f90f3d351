"""Clones of the ``__device__`` helpers through which a kernel reaches an atomic, for a rewrite that
changes that atomic.

Real code often hides its atomics in helpers (``add_to_bin(hist, v)``, ``accumulate(&out[0], x)``).
A rewrite of the kernel may not edit such a helper (other code calls it), so it gets a copy of each
helper on the way to the atomic: named ``<helper>_kl_<kernel>``, with the rewrite's own parameters
appended (a register sum by reference, a shared copy's pointer), the atomic replaced, and the calls
of the other copies renamed with those arguments appended; the kernel's own calls are renamed the
same way. The copies are made from the preprocessed text of the helpers (their macros expanded)
and placed before the kernel.

What must hold (else the rewrite refuses, naming it): each helper on the way is defined once in the
file, before the kernel, with a body; it is a plain function (not a method or a function object's
``operator()``), reached by name; and every access the analysis records at the atomic's place is one
the rewrite changes (a helper whose atomic reaches another array through another call is left alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis import Access, KernelFacts, function_definitions
from kernel_lsp.core.analysis import node_text as _text
from kernel_lsp.core.transforms.emit import node_at


@dataclass(frozen=True)
class HelperEdits:
    helpers: str
    """The copies, in an order where each comes after the copies it calls."""
    calls: tuple[tuple[int, int, str], ...]
    """Edits of the kernel's body (preprocessed text): its calls of the helpers, renamed, with the
    arguments appended."""


def clone_name(helper: str, kernel: str) -> str:
    return f"{helper}_kl_{kernel}"


def _called_name(call: Node, src: bytes) -> tuple[str, Node] | None:
    """(the function's name, its identifier node) of a call by plain or qualified name, with or without
    template arguments."""
    fn = call.child_by_field_name("function")
    if fn is None:
        return None
    if fn.type == "template_function":
        fn = fn.child_by_field_name("name")
    while fn is not None and fn.type == "qualified_identifier":
        fn = fn.child_by_field_name("name")
    if fn is None or fn.type != "identifier":
        return None
    return _text(src, fn), fn


def _calls(node: Node) -> Iterable[Node]:
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "call_expression":
            yield n
        stack.extend(n.children)


def _append(list_node: Node, extra: str) -> list[tuple[int, int, str]]:
    """An insertion of ``extra`` as the last entry of a parameter or argument list (none when empty)."""
    if not extra:
        return []
    at = list_node.end_byte - 1
    return [(at, at, (", " if list_node.named_child_count else "") + extra)]


def _apply(src: bytes, lo: int, hi: int, edits: list[tuple[int, int, str]]) -> str:
    out, at = [], lo
    for s, e, new in sorted(edits):
        if s < at:
            raise ValueError("overlapping edits in a helper's copy")
        out += [src[at:s].decode("utf-8"), new]
        at = e
    out.append(src[at:hi].decode("utf-8"))
    return "".join(out)


def clone_helpers(facts: KernelFacts, src: bytes, root: Node, atomics: list[Access],
                  replace: Callable[[Access, Node], str], params: str, args: str) -> HelperEdits | str:
    """Copies of the helpers ``atomics`` are reached through (``Access.via``), each atomic call in them
    replaced by ``replace(access, call node)``, ``params`` appended to each copy's parameters and
    ``args`` to each call of a copy; or why they cannot be made."""
    chains = {a.via for a in atomics if a.via}
    needed = {name for chain in chains for name in chain}
    if not needed:
        return HelperEdits("", ())
    if any("operator" in name for name in needed):
        return "an atomic is reached through a function object's operator(), not a function called by name"
    definitions: dict[str, list[Node]] = {}
    for name, node, _ in function_definitions(root, src):
        definitions.setdefault(name, []).append(node)
    mine = {a.span for a in atomics if a.via}
    for a in facts.accesses:
        if a.span in mine and all(a is not b for b in atomics):
            return f"`{a.text}` in the helper `{a.via[-1] if a.via else '?'}` also reaches another target"
    depth: dict[str, int] = {}
    for chain in chains:
        for k, name in enumerate(chain):
            depth[name] = max(depth.get(name, 0), k)
    texts = []
    for name in sorted(needed, key=lambda n: (-depth[n], n)):
        found = definitions.get(name, [])
        if len(found) != 1 or found[0].child_by_field_name("body") is None:
            return f"the helper `{name}` is not defined once, with a body, in the file"
        node = found[0]
        if node.start_byte > facts.span[0]:
            return f"the helper `{name}` is defined after the kernel"
        outer = node.parent if node.parent is not None and node.parent.type == "template_declaration" else node
        declarator = node.child_by_field_name("declarator")
        while declarator is not None and declarator.type != "function_declarator":
            declarator = declarator.child_by_field_name("declarator")
        ident = declarator.child_by_field_name("declarator") if declarator is not None else None
        plist = declarator.child_by_field_name("parameters") if declarator is not None else None
        if ident is None or ident.type != "identifier" or plist is None:
            return f"the helper `{name}` is not a plain function"
        edits = [(ident.start_byte, ident.end_byte, clone_name(name, facts.kernel)), *_append(plist, params)]
        body = node.child_by_field_name("body")
        # A helper the kernel calls several times has its atomic recorded once per call: one edit each.
        replaced: dict[tuple[int, int], str] = {}
        for a in atomics:
            if a.via and a.via[-1] == name and body.start_byte <= a.span[0] < body.end_byte:
                call = node_at(src, root, a.span)
                if call is None:
                    return f"the atomic `{a.text}` was not found in `{name}`"
                new = replace(a, call)
                if replaced.setdefault((call.start_byte, call.end_byte), new) != new:
                    return f"the atomic `{a.text}` in `{name}` would be rewritten differently for different calls"
        edits += [(start, end, new) for (start, end), new in replaced.items()]
        edits += _call_edits(body, src, needed, facts.kernel, args)
        try:
            texts.append(_apply(src, outer.start_byte, outer.end_byte, edits) + "\n")
        except ValueError as exc:
            return str(exc)
    kernel_body = node_at(src, root, facts.body_span)
    if kernel_body is None:
        return "the kernel's body was not found"
    return HelperEdits("".join(texts), tuple(_call_edits(kernel_body, src, needed, facts.kernel, args)))


def _call_edits(node: Node, src: bytes, needed: set[str], kernel: str, args: str) -> list[tuple[int, int, str]]:
    edits = []
    for call in _calls(node):
        named = _called_name(call, src)
        arguments = call.child_by_field_name("arguments")
        if named is None or named[0] not in needed or arguments is None:
            continue
        ident = named[1]
        edits += [(ident.start_byte, ident.end_byte, clone_name(named[0], kernel)), *_append(arguments, args)]
    return edits
