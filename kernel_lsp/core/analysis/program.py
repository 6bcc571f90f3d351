"""What the file around a kernel defines: struct layouts, function objects, type aliases, templates, constants."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tree_sitter import Node

from kernel_lsp.core.analysis.syntax import _declarator_name, _descendants, _function_name, _strip_qualifiers, node_text, parse_text
from kernel_lsp.core.consteval import TYPE_SIZES_BYTES, evaluate_int


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
