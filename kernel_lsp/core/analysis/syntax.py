"""Reading tree-sitter's tree of CUDA: node text, names declared and assigned, parameters, definitions."""

from __future__ import annotations

import re
from collections.abc import Iterator

from tree_sitter import Node, Parser

from kernel_lsp.core.parse import CUDA_LANGUAGE, parser_input


def node_text(src: bytes, node: Node) -> str:
    """The source text of a syntax node."""
    return src[node.start_byte : node.end_byte].decode("utf-8", errors="replace")


def in_constant_space(declaration: Node, src: bytes) -> bool:
    """A declaration qualified ``__constant__``: device memory the host fills (cudaMemcpyToSymbol) and the
    kernel only reads."""
    return any(c.type == "type_qualifier" and node_text(src, c) == "__constant__" for c in declaration.children)


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


_MATH_PREFIXES = ("__f", "__d", "__int2", "__float2", "__half2", "__expf", "__exp10f", "__logf", "__log2f", "__log10f",
                  "__powf", "__sinf", "__cosf", "__tanf", "__sincosf", "__ll2", "__ull2", "__uint2", "__hadd", "__hmul",
                  "__hsub", "__hfma", "__popc", "__clz", "__ffs", "__brev")
#: Intrinsics of the CUDA programming guide that reinterpret or combine integers: functions of their arguments.
_BIT_INTRINSICS = frozenset({
    "__saturatef", "__int_as_float", "__uint_as_float", "__longlong_as_double", "__mulhi", "__umulhi", "__mul64hi",
    "__umul64hi", "__sad", "__usad", "__byte_perm", "__funnelshift_l", "__funnelshift_r", "__funnelshift_lc",
    "__funnelshift_rc", "__rhadd", "__urhadd", "__uhadd",
})


def _is_pure_math(name: str) -> bool:
    """Functions of values only (no memory side effects): the CUDA math library and intrinsics."""
    if name.startswith(_MATH_PREFIXES) or name in _BIT_INTRINSICS:
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
    """Local names assigned anywhere under ``node`` (``x = …``, ``x += …``, ``x++``, and ``s`` of a member
    ``s.x = …`` of a local value)."""
    if node is None:
        return set()
    found: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        target = None
        if n.type == "assignment_expression":
            target = n.child_by_field_name("left")
        elif n.type == "update_expression":
            target = n.child_by_field_name("argument")
        if target is not None and target.type == "identifier":
            found.add(node_text(src, target))
        elif target is not None and (path := member_path(target, src)) is not None:
            found.add(path.split(".", 1)[0])
        stack.extend(n.children)
    return found


def member_path(node: Node, src: bytes) -> str | None:
    """A member of a named value, as ``s.x`` or ``s.a.b`` without spaces; None for anything else (``p->x``,
    ``a[i].x``: members of memory)."""
    fields: list[str] = []
    while node.type == "field_expression":
        op, field = node.child_by_field_name("operator"), node.child_by_field_name("field")
        if op is None or field is None or node_text(src, op) != ".":
            return None
        fields.append(node_text(src, field))
        node = node.child_by_field_name("argument")
        if node is None:
            return None
    if node.type != "identifier" or not fields:
        return None
    return ".".join([node_text(src, node), *reversed(fields)])


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


_PARSER_CACHE: list[Parser] = []


def parse_text(text: str) -> tuple[bytes, Node]:
    """(UTF-8 bytes, tree root) of ``text``, with a parser reused across calls."""
    parser = _PARSER_CACHE.pop() if _PARSER_CACHE else Parser(CUDA_LANGUAGE)
    try:
        src = text.encode("utf-8", errors="replace")
        return src, parser.parse(parser_input(src)).root_node
    finally:
        _PARSER_CACHE.append(parser)


def _descendants(node: Node, depth: int) -> Iterator[Node]:
    frontier = [node]
    for _ in range(depth):
        frontier = [c for n in frontier for c in n.named_children]
        yield from frontier


_INTEGER_TYPE = re.compile(r"^(?:(?:const|unsigned|signed|long|short|int|char)\s*)+$|^(?:const\s+)?(?:u?int(?:8|16|32|64)?_t|"
                           r"size_t|ssize_t|ptrdiff_t|uint|ushort|ulong|index_t|Index)$")


def is_integer_type(name: str) -> bool:
    """``name`` (a type as declared, qualifiers and all) is one of C's or CUDA's integer types."""
    return bool(_INTEGER_TYPE.match(" ".join(name.split())))


def has_effects(node: Node, src: bytes) -> bool:
    """``node`` assigns (a name or memory), increments, or calls a function other than pure math."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type in ("assignment_expression", "update_expression"):
            return True
        if n.type == "call_expression":
            fn = n.child_by_field_name("function")
            if fn is None or not is_pure_math(node_text(src, fn)):
                return True
        stack.extend(n.children)
    return False


def is_pure_math(name: str) -> bool:
    """``name`` is a CUDA math function or intrinsic: a function of its arguments only (it reads
    no thread or block index and touches no memory)."""
    return _is_pure_math(name)
