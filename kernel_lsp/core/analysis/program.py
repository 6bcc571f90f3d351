"""What the file around a kernel defines: struct layouts, function objects, type aliases, templates, constants."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from tree_sitter import Node

from kernel_lsp.core.analysis.syntax import (
    _declarator_name, _descendants, _function_name, _strip_qualifiers, in_constant_space, node_text, parse_text,
)
from kernel_lsp.core.consteval import TYPE_SIZES_BYTES, evaluate_int


@dataclass(frozen=True)
class _Struct:
    size_bytes: int
    fields: Mapping[str, tuple[int, int]]
    """Member name -> (byte offset, byte size)."""
    types: Mapping[str, str] = field(default_factory=dict)
    """Member name -> its type (qualifiers dropped): a member's own members are found through it."""


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
    types: dict[str, str] = {}
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
                types[node_text(src, target)] = type_name
            offset += size * count
        align = max(align, a)
    return _Struct((offset + align - 1) // align * align, fields, types)


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


@dataclass(frozen=True)
class Alias:
    """What a ``typedef`` or ``using`` name stands for, resolved through the aliases before it."""

    base: str
    """The element or scalar type, qualifiers dropped (``float`` for ``typedef const float* CP;``)."""
    pointer_depth: int
    """Pointer levels (``typedef float* P;``: 1; an alias of ``P*``: 2)."""
    const: bool
    """The base type is const (``typedef const float* CP;``, ``using C = const float;``)."""


def alias_table(root: Node, src: bytes) -> dict[str, Alias]:
    """Every name the file's ``typedef`` and ``using X = …;`` declarations give to a type, at any
    scope, resolved through the aliases declared before it; array typedefs are left out (neither a
    pointer nor a scalar)."""
    order: list[Node] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type in ("type_definition", "alias_declaration"):
            order.append(node)
        elif node.type != "function_definition":
            stack.extend(reversed(node.children))
    found: dict[str, Alias] = {}
    for node in order:
        if node.type == "alias_declaration":
            name, descriptor = node.child_by_field_name("name"), node.child_by_field_name("type")
            type_node = descriptor.child_by_field_name("type") if descriptor is not None else None
            if name is None or type_node is None:
                continue
            targets = [(node_text(src, name), descriptor.child_by_field_name("declarator"))]
            qualified = descriptor
        else:
            type_node = node.child_by_field_name("type")
            if type_node is None:
                continue
            targets = []
            for d in node.children_by_field_name("declarator"):
                inner = d
                while inner is not None and inner.type != "type_identifier":
                    inner = inner.child_by_field_name("declarator")
                if inner is not None:
                    targets.append((node_text(src, inner), d))
            qualified = node
        const = any(c.type == "type_qualifier" and node_text(src, c) == "const" for c in qualified.children)
        if type_node.type in ("struct_specifier", "class_specifier", "union_specifier"):
            tag = type_node.child_by_field_name("name")
            base = node_text(src, tag) if tag is not None else None
        else:
            base = _strip_qualifiers(node_text(src, type_node))
            if "unsigned" in node_text(src, type_node).split() and base in ("char", "short", "long", "long long"):
                base = "unsigned " + base
        if base is None:
            # An anonymous struct is known by the typedef's plain name (``typedef struct {…} S, *SP;``).
            base = next((alias for alias, d in targets if _declarator_shape(d) == (0, False)), None)
        for alias, declarator in targets:
            depth, array = _declarator_shape(declarator)
            if array:
                continue
            target = base or alias
            outer = found.get(target) if target != alias else None
            if outer is not None:
                found[alias] = Alias(outer.base, outer.pointer_depth + depth, outer.const or const)
            else:
                found[alias] = Alias(target, depth, const)
    return found


def _declarator_shape(declarator: Node | None) -> tuple[int, bool]:
    """(pointer levels, whether an array is declared) of a typedef's declarator (``**P`` → 2)."""
    depth, array = 0, False
    node = declarator
    while node is not None and node.type not in ("type_identifier", "identifier"):
        if node.type in ("pointer_declarator", "abstract_pointer_declarator"):
            depth += 1
        elif node.type in ("array_declarator", "abstract_array_declarator"):
            array = True
        node = node.child_by_field_name("declarator")
    return depth, array


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


def redeclared_parameters(text: str, name: str) -> tuple[tuple[tuple[int, int, bool], ...], ...]:
    """The parameter lists of every declaration of function ``name`` in ``text`` other than its
    definition: forward declarations (``template <typename T> __global__ void k(T* p);``) and explicit
    instantiations (``template __global__ void k<float>(float* p);``). Each parameter as (start byte,
    end byte, whether the data it points to is ``const``): a rewrite that changes the definition's
    parameter types must change them alike, or they name another function."""
    src, root = parse_text(text)
    found = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            continue
        if node.type in ("template_instantiation", "declaration", "field_declaration"):
            declarator = next((d for d in _descendants(node, 3) if d.type == "function_declarator"), None)
            fn = declarator.child_by_field_name("declarator") if declarator is not None else None
            if fn is not None and fn.type == "template_function":
                fn = fn.child_by_field_name("name")
            plist = declarator.child_by_field_name("parameters") if declarator is not None else None
            if fn is not None and plist is not None and node_text(src, fn).rsplit("::", 1)[-1] == name:
                params = [p for p in plist.named_children if p.type in ("parameter_declaration", "optional_parameter_declaration")]
                found.append(tuple((p.start_byte, p.end_byte, _points_to_const(p, src)) for p in params))
                continue
        stack.extend(reversed(node.children))
    return tuple(found)


def _points_to_const(param: Node, src: bytes) -> bool:
    """The parameter's declared type (before its pointer declarator) is ``const``."""
    return any(c.type == "type_qualifier" and node_text(src, c) == "const" for c in param.children)


def _enumerators(root: Node, src: bytes) -> dict[str, str]:
    """The values of the enumerators declared outside functions (``enum { X1 = 1, NE };``, LBM's cell entries), each
    its written value or one more than the previous one's, where they evaluate."""
    from kernel_lsp.core.consteval import evaluate_int

    found: dict[str, str] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            continue
        if node.type == "enumerator_list":
            following: int | None = 0
            for item in node.named_children:
                if item.type != "enumerator":
                    continue
                name, value = item.child_by_field_name("name"), item.child_by_field_name("value")
                current = evaluate_int(node_text(src, value), found) if value is not None else following
                if name is not None and current is not None:
                    found[node_text(src, name)] = str(current)
                following = current + 1 if current is not None else None
            continue
        stack.extend(reversed(node.children))
    return found


def _file_constants(root: Node, src: bytes) -> dict[str, str]:
    """``const int N = 512, M = 4;``, ``constexpr`` integers and enumerators at file scope."""
    found: dict[str, str] = _enumerators(root, src)
    for child in root.children:
        if child.type != "declaration":
            continue
        head = node_text(src, child).split("=")[0]
        # A ``__constant__`` variable's initializer is only its value until the host copies another in
        # (cudaMemcpyToSymbol): not a compile-time constant.
        if not re.search(r"\b(const|constexpr)\b", head) or in_constant_space(child, src):
            continue
        for decl in child.children_by_field_name("declarator"):
            if decl.type == "init_declarator":
                name = decl.child_by_field_name("declarator")
                value = decl.child_by_field_name("value")
                if name is not None and name.type == "identifier" and value is not None:
                    found[node_text(src, name)] = node_text(src, value)
    return found
