"""Static pre-check of a candidate rewrite: cheats that pass every run but show in the code.

``check(original_src, candidate_src, spec) -> StaticReport`` reads both files with
tree-sitter-cuda and applies the rules in :data:`RULES`. ``error`` findings reject
the candidate (reason ``static_check``) before any GPU time; ``warning`` findings
are recorded in the verdict. A finding the original shares (same rule and
subject) is demoted to a warning: the rewrite did not introduce it.

Pure: strings in, a frozen report out. Learned from KernelBench's
``kernel_static_checker`` (a rationale per rule, adversarial kernels as tests).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from tree_sitter import Node, Parser

from kernel_lsp.core.index import Function, build_index
from kernel_lsp.core.parse import CUDA_LANGUAGE, parser_input
from kernel_lsp.core.spec import FLOAT_TYPES, Spec
from kernel_lsp.core.verdict import Finding


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    rationale: str


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "noncoherent-read-of-written-memory",
            "error",
            "__ldg and const __restrict__ promise the data is read-only for the whole kernel; reading memory the same "
            "kernel writes through them is undefined behaviour that only happens to work on today's caches.",
        ),
        Rule(
            "problem-size-literal",
            "error",
            "a literal equal to the benchmark's problem size that the original lacks special-cases that size: the "
            "speedup would hold for the benchmark only.",
        ),
        Rule(
            "device-global-state",
            "warning",
            "a __device__ global written by the kernel and read again survives across launches, so later launches can "
            "replay earlier results instead of computing them.",
        ),
        Rule(
            "extra-stream",
            "warning",
            "work on another stream or a device-side launch can escape the harness's timing events.",
        ),
        Rule(
            "printf",
            "warning",
            "printf in device code serializes output through a host buffer and distorts timing.",
        ),
    )
}

#: Literals at or below this are ordinary tile, block and warp constants; only larger ones are taken for sizes.
SIZE_LITERAL_MIN = 1025

_STORE_CALL = re.compile(r"^(atomic\w+|__st(cg|cs|wt|wb|_\w+)?)$")
_STREAM_WORDS = re.compile(r"\b(cudaStream_t|cudaStreamCreate\w*|cudaStreamPerThread|cudaLaunchHostFunc|cudaGraph\w*|cudaLaunchKernel\w*)\b")
_INT_IN_TEXT = re.compile(r"(?<![\w.])(0[xX][0-9a-fA-F]+|\d+)([uUlL]*)(?![\w.])")


@dataclass(frozen=True)
class StaticReport:
    errors: tuple[Finding, ...]
    warnings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not self.errors


def _parse(source: str) -> Node:
    return Parser(CUDA_LANGUAGE).parse(parser_input(source.encode("utf-8", errors="replace"))).root_node


def _walk(node: Node) -> Iterator[Node]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def _text(node: Node) -> str:
    return node.text.decode("utf-8", errors="replace") if node.text is not None else ""


def _line(node: Node) -> int:
    return node.start_point[0] + 1


def _function_name(fn: Node) -> str | None:
    declarator = fn.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    if declarator is None:
        return None
    name = declarator.child_by_field_name("declarator")
    return _text(name) if name is not None else None


def _is_kernel(fn: Node) -> bool:
    return any(child.type == "__global__" or _text(child) == "__global__" for child in fn.children)


def kernel_definitions(root: Node) -> dict[str, Node]:
    """``__global__`` function definitions by name (the last one wins on overloads)."""
    return {_function_name(n) or "": n for n in _walk(root) if n.type == "function_definition" and _is_kernel(n)}


@dataclass(frozen=True)
class _ParamInfo:
    name: str
    pointer: bool
    const: bool
    restrict: bool


def _params(fn: Node) -> list[_ParamInfo]:
    declarator = fn.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    if declarator is None:
        return []
    plist = declarator.child_by_field_name("parameters")
    out = []
    for p in plist.named_children if plist else []:
        if p.type != "parameter_declaration":
            continue
        names = [n for n in _walk(p) if n.type == "identifier"]
        qualifiers = {_text(n) for n in _walk(p) if n.type == "type_qualifier"}
        pointer = any(n.type == "pointer_declarator" for n in _walk(p))
        # A const pointee: `const float*` or `float const*`, i.e. a const qualifier outside the pointer declarator.
        const_pointee = any(c.type == "type_qualifier" and _text(c) == "const" for c in p.children)
        if names:
            out.append(_ParamInfo(_text(names[-1]), pointer, const_pointee, bool(qualifiers & {"__restrict__", "__restrict", "restrict"})))
    return out


def _aliases(body: Node, pointers: set[str]) -> dict[str, set[str]]:
    """name -> the pointer parameters it may point into (params map to themselves)."""
    alias = {p: {p} for p in pointers}
    pairs: list[tuple[str, Node]] = []
    for n in _walk(body):
        if n.type == "init_declarator":
            target, value = n.child_by_field_name("declarator"), n.child_by_field_name("value")
            if target is not None and value is not None and any(x.type == "pointer_declarator" for x in _walk(target)):
                names = [x for x in _walk(target) if x.type == "identifier"]
                if names:
                    pairs.append((_text(names[-1]), value))
        elif n.type == "assignment_expression":
            left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
            if left is not None and left.type == "identifier" and right is not None:
                pairs.append((_text(left), right))
    changed = True
    while changed:
        changed = False
        for name, value in pairs:
            sources = _address_bases(value, alias)
            if sources - alias.get(name, set()):
                alias.setdefault(name, set()).update(sources)
                changed = True
    return alias


def _address_bases(node: Node, alias: dict[str, set[str]]) -> set[str]:
    """The pointer parameters an address expression points into.

    ``y + idx[i]`` points into ``y`` only: a subscript or a dereference inside an
    address is a loaded value (an offset), not a base; ``&x[i]`` points into ``x``;
    casts (C style or ``reinterpret_cast``) keep the base.
    """
    kind = node.type
    if kind == "identifier":
        return set(alias.get(_text(node), ()))
    if kind in ("subscript_expression", "field_expression"):
        return set()
    if kind == "pointer_expression":
        operand = node.child_by_field_name("argument")
        if operand is None or _text(node.children[0]) != "&":
            return set()
        if operand.type == "subscript_expression":
            operand = operand.child_by_field_name("argument") or operand.children[0]
        return _address_bases(operand, alias)
    if kind == "call_expression":
        callee = node.child_by_field_name("function")
        args = node.child_by_field_name("arguments")
        if callee is None or args is None or "cast" not in _text(callee):
            return set()
        node = args
    return set().union(*(_address_bases(c, alias) for c in node.named_children))


def _writes(body: Node, alias: dict[str, set[str]]) -> dict[str, Node]:
    """Pointer parameter -> the first node that writes memory through it."""
    written: dict[str, Node] = {}

    def record(target: Node, at: Node) -> None:
        # Only memory writes count: `p[i] = …`, `*p = …`, not rebinding the pointer `p = …`.
        if target.type in ("subscript_expression",):
            address = target.child_by_field_name("argument") or target.children[0]
        elif target.type == "pointer_expression" and target.children and _text(target.children[0]) == "*":
            address = target.child_by_field_name("argument") or target.children[-1]
        elif target.type == "field_expression" and "->" in _text(target):
            address = target.child_by_field_name("argument") or target.children[0]
        else:
            return
        for base in _address_bases(address, alias):
            written.setdefault(base, at)

    for n in _walk(body):
        if n.type == "assignment_expression":
            left = n.child_by_field_name("left")
            if left is not None:
                record(left, n)
        elif n.type == "update_expression":
            arg = n.child_by_field_name("argument")
            if arg is not None:
                record(arg, n)
        elif n.type == "call_expression":
            fn = n.child_by_field_name("function")
            args = n.child_by_field_name("arguments")
            if fn is not None and args is not None and _STORE_CALL.match(_text(fn)) and args.named_children:
                for base in _address_bases(args.named_children[0], alias):
                    written.setdefault(base, n)
    return written


def _noncoherent_findings(fn: Node) -> list[tuple[str, str, int]]:
    """(subject, message, line) for reads through __ldg / const __restrict__ of memory the kernel writes."""
    body = fn.child_by_field_name("body")
    if body is None:
        return []
    params = _params(fn)
    pointers = {p.name for p in params if p.pointer}
    alias = _aliases(body, pointers)
    written = _writes(body, alias)
    found: list[tuple[str, str, int]] = []
    for p in params:
        if p.pointer and p.const and p.restrict and p.name in written:
            found.append((p.name, f"'{p.name}' is declared const __restrict__ but the kernel writes through it (line {_line(written[p.name])})", _line(written[p.name])))
    for n in _walk(body):
        if n.type != "call_expression":
            continue
        fn_name = n.child_by_field_name("function")
        args = n.child_by_field_name("arguments")
        if fn_name is None or args is None or not _text(fn_name).startswith("__ldg") or not args.named_children:
            continue
        for base in sorted(_address_bases(args.named_children[0], alias)):
            if base in written:
                found.append((base, f"__ldg reads '{base}', which the kernel also writes (line {_line(written[base])})", _line(n)))
    return found


def _int_literal(text: str) -> int | None:
    t = text.rstrip("uUlL")
    try:
        if t[:2].lower() == "0x":
            return int(t, 16)
        if re.fullmatch(r"\d+", t):
            return int(t)
        value = float(t.rstrip("fF"))
    except ValueError:
        return None
    return int(value) if value.is_integer() else None


def _literals(root: Node) -> list[tuple[int, int]]:
    """(value, line) of every integer-valued literal, including those in #define bodies."""
    out: list[tuple[int, int]] = []
    for n in _walk(root):
        if n.type == "number_literal":
            value = _int_literal(_text(n))
            if value is not None:
                out.append((value, _line(n)))
        elif n.type == "preproc_arg":
            for m in _INT_IN_TEXT.finditer(_text(n)):
                out.append((_int_literal(m.group(0)) or 0, _line(n)))
    return out


def problem_sizes(spec: Spec) -> dict[int, str]:
    """Value -> what it is (``n``, ``size of x``) for every integer size the spec names, main and variants."""
    sizes: dict[int, str] = {}
    for variant in [None, *range(len(spec.variants))]:
        resolved = spec.resolve(variant)
        where = "" if variant is None else f" in variants[{variant}]"
        for p in spec.scalars:
            if p.type not in FLOAT_TYPES:
                sizes.setdefault(int(resolved.values[p.name]), f"the value of '{p.name}'{where}")
        for name, size in resolved.sizes.items():
            sizes.setdefault(size, f"the size of '{name}'{where}")
    return {v: what for v, what in sizes.items() if abs(v) >= SIZE_LITERAL_MIN}


def _device_globals(root: Node) -> dict[str, Node]:
    """File-scope, non-const ``__device__`` variables (``__constant__`` cannot be written by kernels)."""
    found: dict[str, Node] = {}
    for decl in root.children:
        if decl.type != "declaration":
            continue
        words = {_text(c) for c in decl.children}
        if "__device__" not in words or any(c.type == "type_qualifier" and _text(c) == "const" for c in decl.children):
            continue
        for child in decl.children:
            if child.type in ("identifier", "init_declarator", "array_declarator", "pointer_declarator"):
                names = [x for x in _walk(child) if x.type == "identifier"]
                if names:
                    found[_text(names[0])] = decl
    return found


def _base_identifier(node: Node) -> Node | None:
    """The identifier a write target is rooted at: ``g`` in ``g``, ``g[i]``, ``g[i][j]``."""
    while node is not None and node.type in ("subscript_expression", "parenthesized_expression"):
        node = node.child_by_field_name("argument") or (node.named_children[0] if node.named_children else None)
    return node if node is not None and node.type == "identifier" else None


def _global_state_findings(root: Node) -> list[tuple[str, str, int]]:
    globals_ = _device_globals(root)
    if not globals_:
        return []
    alias = {g: {g} for g in globals_}
    written: dict[str, Node] = {}
    read: set[str] = set()
    # Identifiers that are only stored to (`g = v`, `g[i] = v`): every other occurrence of a global is a read.
    store_only: set[int] = set()
    functions = [n for n in _walk(root) if n.type == "function_definition"]
    for fn in functions:
        for n in _walk(fn):
            if n.type in ("assignment_expression", "update_expression"):
                target = n.child_by_field_name("left") or n.child_by_field_name("argument")
                base = _base_identifier(target) if target is not None else None
                if base is not None and _text(base) in globals_:
                    written.setdefault(_text(base), n)
                    operator = n.child_by_field_name("operator")
                    if n.type == "assignment_expression" and operator is not None and _text(operator) == "=":
                        store_only.add(base.start_byte)
            elif n.type == "call_expression":
                callee = n.child_by_field_name("function")
                args = n.child_by_field_name("arguments")
                if callee is not None and args is not None and _STORE_CALL.match(_text(callee)) and args.named_children:
                    for g in _address_bases(args.named_children[0], alias):
                        written.setdefault(g, n)
        for n in _walk(fn):
            if n.type == "identifier" and _text(n) in globals_ and n.start_byte not in store_only:
                read.add(_text(n))
    return [
        (g, f"__device__ global '{g}' is written (line {_line(at)}) and read: its value survives to the next launch", _line(at))
        for g, at in sorted(written.items())
        if g in read
    ]


def _stream_findings(source: str, root: Node) -> list[tuple[str, str, int]]:
    found = []
    for i, line in enumerate(source.splitlines(), start=1):
        code = line.split("//", 1)[0]
        for m in _STREAM_WORDS.finditer(code):
            found.append((m.group(1), f"uses {m.group(1)}", i))
    for fn in _walk(root):
        if fn.type == "function_definition" and _is_kernel(fn):
            for n in _walk(fn):
                if n.type == "call_expression" and any(c.type == "kernel_call_syntax" or _text(c).startswith("<<<") for c in n.children):
                    found.append(("device-launch", f"launches a kernel from device code in '{_function_name(fn)}'", _line(n)))
    return found


def _printf_findings(root: Node) -> list[tuple[str, str, int]]:
    found = []
    for fn in _walk(root):
        if fn.type != "function_definition" or not any(_text(c) in ("__global__", "__device__") for c in fn.children):
            continue
        for n in _walk(fn):
            if n.type == "call_expression":
                callee = n.child_by_field_name("function")
                if callee is not None and _text(callee) == "printf":
                    found.append((f"printf@{_function_name(fn)}", f"printf in device function '{_function_name(fn)}'", _line(n)))
    return found


def _finding(rule_id: str, message: str, line: int, demoted: bool) -> Finding:
    rule = RULES[rule_id]
    severity = "warning" if demoted else rule.severity
    suffix = " (the original does this too)" if demoted and rule.severity == "error" else ""
    return Finding(rule_id, message + suffix, line, severity, rule.rationale)


def check(original_src: str, candidate_src: str, spec: Spec) -> StaticReport:
    """Apply every rule to the candidate; findings the original shares are only warnings."""
    orig_root, cand_root = _parse(original_src), _parse(candidate_src)
    orig_kernel = kernel_definitions(orig_root).get(spec.kernel)
    cand_kernel = kernel_definitions(cand_root).get(spec.kernel)
    findings: list[Finding] = []

    def add(rule_id: str, cand: list[tuple[str, str, int]], orig: list[tuple[str, str, int]]) -> None:
        orig_subjects = {subject for subject, _, _ in orig}
        for subject, message, line in cand:
            findings.append(_finding(rule_id, message, line, subject in orig_subjects))

    if cand_kernel is not None:
        add("noncoherent-read-of-written-memory", _noncoherent_findings(cand_kernel), _noncoherent_findings(orig_kernel) if orig_kernel else [])

    sizes = problem_sizes(spec)
    original_values = {v for v, _ in _literals(orig_root)}
    seen: set[int] = set()
    for value, line in _literals(cand_root):
        if value in sizes and value not in original_values and value not in seen:
            seen.add(value)
            findings.append(_finding("problem-size-literal", f"literal {value} equals {sizes[value]} and is not in the original", line, False))

    add("device-global-state", _global_state_findings(cand_root), _global_state_findings(orig_root))
    add("extra-stream", _stream_findings(candidate_src, cand_root), _stream_findings(original_src, orig_root))
    add("printf", _printf_findings(cand_root), [])

    findings.sort(key=lambda f: (f.line, f.rule))
    return StaticReport(
        tuple(f for f in findings if f.severity == "error"),
        tuple(f for f in findings if f.severity == "warning"),
    )


# --- signature check --------------------------------------------------------------------------

#: C spellings of each spec type (after dropping cv-qualifiers and extra whitespace).
_C_TYPES: dict[str, frozenset[str]] = {
    "int8": frozenset(("char", "signed char", "int8_t", "int8")),
    # C++'s bool is one byte on every CUDA target (Rodinia's BFS masks are ``bool*``).
    "uint8": frozenset(("unsigned char", "uint8_t", "uchar", "uint8", "bool")),
    "int32": frozenset(("int", "signed", "signed int", "int32_t", "int32")),
    "uint32": frozenset(("unsigned", "unsigned int", "uint32_t", "uint", "uint32")),
    "int64": frozenset(("long long", "long long int", "long", "int64_t", "ptrdiff_t", "int64")),
    "uint64": frozenset(("unsigned long long", "unsigned long long int", "unsigned long", "uint64_t", "size_t", "uint64")),
    "float16": frozenset(("half", "__half", "float16")),
    "bfloat16": frozenset(("__nv_bfloat16", "nv_bfloat16", "bfloat16")),
    "float32": frozenset(("float", "float32")),
    "float64": frozenset(("double", "float64")),
}
_VECTOR_PREFIXES = {"float": "float32", "double": "float64", "int": "int32", "uint": "uint32", "half": "float16"}


def _canonical_type(base_type: str) -> str:
    words = [w for w in base_type.replace("*", " ").split() if w not in ("const", "volatile", "__restrict__", "__restrict", "restrict", "struct")]
    return " ".join(words)


def spec_type_matches(spec_type: str, base_type: str, struct: str | None = None) -> bool:
    """Whether a C parameter type can hold the spec's element type (vector types like float4 count as their element).

    ``struct``: the spec's ``struct`` field; an array of structs matches the struct's name only.
    """
    canonical = _canonical_type(base_type)
    if struct is not None:
        return canonical == struct
    if canonical in _C_TYPES.get(spec_type, frozenset()):
        return True
    match = re.fullmatch(r"(float|double|int|uint|half)[1-4]", canonical)
    return bool(match) and _VECTOR_PREFIXES[match.group(1)] == spec_type


@dataclass(frozen=True)
class SignatureReport:
    spec_errors: tuple[str, ...]
    """The spec does not describe the original kernel (a bad spec, not a bad candidate)."""
    changed: tuple[str, ...]
    """How the candidate's kernel differs from the original's (reason ``signature_changed``)."""
    warnings: tuple[str, ...]


def alias_resolver(src: str, macros: Mapping[str, str] | None = None):
    """(base type, pointer depth) of a parameter with the file's ``typedef``/``using`` aliases resolved:
    ``Data_ptr p`` with ``typedef float* Data_ptr;`` is ``("float", 1)``, as the compiler sees it; with
    ``macros`` (the file's object-like macros), a type a macro names too (lavaMD's ``#define fp double``)."""
    from kernel_lsp.core.analysis import alias_table, parse_text

    data, root = parse_text(src)
    aliases = alias_table(root, data)

    def resolve(p) -> tuple[str, int]:  # noqa: ANN001 - core.index.Param
        base, depth = _canonical_type(p.base_type), p.pointer_depth
        for _ in range(8):  # a macro may name another (bounded: a cycle ends here)
            body = (macros or {}).get(base)
            if body is None:
                break
            stars = body.count("*")
            base, depth = _canonical_type(body.replace("*", " ")), depth + stars
        alias = aliases.get(base)
        if alias is not None:
            return alias.base, depth + alias.pointer_depth
        return base, depth

    return resolve


def spec_mismatch(spec: Spec, kernel: Function, resolve) -> tuple[list[str], list[str]]:  # noqa: ANN001
    """(errors, warnings): how ``spec`` fails to describe ``kernel``'s parameters, their types read through
    ``resolve`` (:func:`alias_resolver` of the kernel's file). An error is a spec that cannot launch the
    kernel (another parameter count, an array for a scalar or the reverse); a warning an element type the
    kernel's C type may not hold. Every command that reads a spec asks this first."""
    errors: list[str] = []
    warnings: list[str] = []
    if len(kernel.params) != len(spec.params):
        errors.append(f"params: the spec lists {len(spec.params)} parameters, '{spec.kernel}' takes {len(kernel.params)}")
        return errors, warnings
    for i, (sp, p) in enumerate(zip(spec.params, kernel.params)):
        is_array = not hasattr(sp, "value")
        base, depth = resolve(p)
        if is_array != (depth > 0):
            kind = "an array" if is_array else "a scalar"
            errors.append(f"params[{i}]: the spec says {kind}, the kernel's parameter '{p.name}' is '{p.type_text}'")
        elif not spec_type_matches(sp.type, base, getattr(sp, "struct", None)):
            warnings.append(f"params[{i}]: spec type {sp.type} vs the kernel's '{p.base_type}' for '{p.name}'")
    return errors, warnings


def check_signature(original_src: str, candidate_src: str, spec: Spec) -> SignatureReport:
    """Compare the kernel's name and parameter list: spec vs original, then candidate vs original.

    Parameter names and const/__restrict__ qualifiers may change (that is an
    optimization); the number of parameters, their order, their base types and
    pointer depths may not. Types are compared through the file's ``typedef`` and
    ``using`` aliases (a spec's array matches a ``Data_ptr`` parameter that is a
    ``float*``), so a kernel and spec that agree but for an alias are not refused.
    """
    def kernel(src: str):
        return next((f for f in build_index(src).functions if f.is_kernel and f.name == spec.kernel), None)

    original, candidate = kernel(original_src), kernel(candidate_src)
    if original is None:
        return SignatureReport((f"kernel: the original has no __global__ function named '{spec.kernel}'",), (), ())
    resolve_original = alias_resolver(original_src)
    spec_errors, warnings = spec_mismatch(spec, original, resolve_original)
    if candidate is None:
        names = ", ".join(f.name for f in build_index(candidate_src).functions if f.is_kernel) or "none"
        return SignatureReport(tuple(spec_errors), (f"the candidate has no __global__ function named '{spec.kernel}' (its kernels: {names})",), tuple(warnings))
    changed: list[str] = []
    resolve_candidate = alias_resolver(candidate_src)
    if len(candidate.params) != len(original.params):
        changed.append(f"'{spec.kernel}' takes {len(candidate.params)} parameters in the candidate, {len(original.params)} in the original")
    else:
        for i, (o, c) in enumerate(zip(original.params, candidate.params)):
            if resolve_original(o) != resolve_candidate(c):
                changed.append(f"parameter {i + 1} ('{o.name}'): '{o.type_text}' became '{c.type_text}'")
    if original.is_template != candidate.is_template:
        changed.append("the kernel became a template" if candidate.is_template else "the kernel is no longer a template")
    return SignatureReport(tuple(spec_errors), tuple(changed), tuple(warnings))
