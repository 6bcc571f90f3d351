"""Draft a launch spec (v1, ``shared/spec/LAUNCH_SPEC.md``) from a kernel and its launch site.

Nothing can run a kernel without its launch spec, and nobody wants to write one
by hand for every kernel, so "Create launch spec for <kernel>" drafts it:

* pointers become arrays; ``const`` data is ``in``; data the kernel only ever
  writes (the access analysis' write and read sets, through macros and helpers:
  :mod:`kernel_lsp.core.analysis`) is ``out``; everything else ``inout``;
* a template kernel's types come from the launch's template arguments
  (``scale<float><<<...>>>`` makes ``T *x`` a ``float32`` array);
* scalars take the value passed at the launch site when it is a literal or a
  constant visible in the launching function or at file scope;
* array sizes come from a visible ``cudaMalloc(&d_x, n * sizeof(float))``
  (size ``n`` when ``n`` is passed to a scalar parameter, else its value);
* grid and block come from the launch expression (scalars, ``dim3(...)`` or a
  ``dim3`` variable declared in the launching function), rewritten in the
  kernel's scalar parameter names where the host passes those values.

Constants are the file's, its macros as the preprocessed view ends with them
(``#define M 512`` in a local header), and the launching function's locals as
:mod:`kernel_lsp.core.host_code` reads them from the tree (comma declarations
included; a local assigned again before the launch is not a constant).

What cannot be read is left as :data:`PLACEHOLDER` and listed in ``todo`` so
the editor can say what to fill in. Pure: text, index and preprocessed view in,
a draft out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernel_lsp.core.analysis import KernelFacts, analyze
from kernel_lsp.core.consteval import evaluate_int
from kernel_lsp.core.host_code import host_scope
from kernel_lsp.core.index import KernelIndex, LaunchSite
from kernel_lsp.core.launch_dims import file_constants
from kernel_lsp.core.source import Preprocessed

PLACEHOLDER = "FILL_ME"

#: C element types -> spec array types.
ARRAY_TYPES: dict[str, str] = {
    "float": "float32", "double": "float64",
    "half": "float16", "__half": "float16", "__nv_bfloat16": "bfloat16", "nv_bfloat16": "bfloat16",
    "int": "int32", "int32_t": "int32", "unsigned": "uint32", "unsigned int": "uint32", "uint32_t": "uint32",
    "long long": "int64", "long long int": "int64", "int64_t": "int64", "long": "int64",
    "unsigned long long": "uint64", "uint64_t": "uint64", "size_t": "uint64", "unsigned long": "uint64",
    "char": "int8", "signed char": "int8", "int8_t": "int8", "unsigned char": "uint8", "uint8_t": "uint8",
}
#: C scalar types -> spec scalar types.
SCALAR_TYPES: dict[str, str] = {
    "float": "float32", "double": "float64",
    "int": "int32", "int32_t": "int32", "short": "int32", "char": "int32", "bool": "int32",
    "unsigned": "uint32", "unsigned int": "uint32", "uint32_t": "uint32",
    "long long": "int64", "long long int": "int64", "int64_t": "int64", "long": "int64",
    "unsigned long long": "uint64", "uint64_t": "uint64", "size_t": "uint64", "unsigned long": "uint64",
}

_SIZEOF = re.compile(r"sizeof\s*\(\s*(?P<type>[^()]+?)\s*\)")
_FLOAT_LIT = re.compile(r"^[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?[fF]?$")
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


@dataclass(frozen=True)
class SpecDraft:
    kernel: str
    spec: dict[str, Any]
    """A launch spec v1 object; unreadable values are :data:`PLACEHOLDER`."""
    todo: tuple[str, ...]
    """What the user must fill in or check, one sentence each."""
    launch_line: int | None
    """0-based line of the launch the draft was read from; None when there was none."""

    @property
    def complete(self) -> bool:
        return PLACEHOLDER not in _flatten(self.spec)


def _flatten(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(_flatten(v) for v in value.values())
    if isinstance(value, list):
        return " ".join(_flatten(v) for v in value)
    return str(value)


def _split_top(text: str) -> list[str]:
    """Split ``a, f(b, c), d`` at top-level commas."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    tail = "".join(current).strip()
    if tail:
        parts.append(tail)
    return parts


def _balanced(text: str, open_index: int) -> str | None:
    """Text inside the parenthesis that opens at ``open_index``."""
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
    return None


def _strip_casts(expr: str) -> str:
    """``(void **)&d_x`` -> ``d_x``; ``static_cast<int>(n)`` -> ``n``; ``(int)n`` -> ``n``."""
    e = expr.strip()
    e = re.sub(r"^\(\s*[A-Za-z_][\w\s]*\**\s*\)\s*", "", e)
    e = re.sub(r"^(?:static|reinterpret)_cast\s*<[^>]*>\s*\((.*)\)$", r"\1", e)
    e = e.lstrip("&").strip()
    while e.startswith("(") and e.endswith(")") and _balanced(e, 0) == e[1:-1]:
        e = e[1:-1].strip()
    return e


@dataclass
class _Scope:
    """What the host code around the launch makes visible."""

    exprs: dict[str, str]
    """Variable -> its initializer text (local declarations override file constants)."""
    dim3: dict[str, list[str]]
    malloc_bytes: dict[str, str]
    """Device pointer variable -> the byte-count expression of its cudaMalloc."""

    def value(self, text: str) -> int | float | None:
        text = _strip_casts(text)
        if _FLOAT_LIT.match(text) and not re.fullmatch(r"[-+]?\d+", text):
            return float(text.rstrip("fF"))
        as_int = evaluate_int(text, self.exprs)
        if as_int is not None:
            return as_int
        if re.fullmatch(r"[A-Za-z_]\w*", text) and text in self.exprs:
            inner = self.exprs[text]
            if _FLOAT_LIT.match(inner.strip()):
                return float(inner.strip().rstrip("fF"))
        return None


def _scope(source: str, index: KernelIndex, launch: LaunchSite | None, pre: Preprocessed | None) -> _Scope:
    exprs = file_constants(index, pre)
    dim3: dict[str, list[str]] = {}
    mallocs: dict[str, str] = {}
    if launch is None:
        return _Scope(exprs, dim3, mallocs)
    host = host_scope(source, launch)
    exprs.update(host.defines)
    for local in host.locals:
        # A later declaration of the name shadows an earlier one, whatever its kind.
        exprs.pop(local.name, None)
        dim3.pop(local.name, None)
        if host.reassigned(local):
            continue
        if local.type_text.split()[-1] == "dim3":
            dim3[local.name] = list(local.args) if local.args is not None else [local.value or "1"]
        elif local.value is not None:
            exprs[local.name] = local.value
        elif local.args is not None and len(local.args) == 1:
            exprs[local.name] = local.args[0]
    mallocs.update(host.mallocs)
    return _Scope(exprs, dim3, mallocs)


def _elements(bytes_expr: str, element_type: str, scope: _Scope, depth: int = 0) -> str | None:
    """The element count of a byte-count expression: ``n * sizeof(float)`` -> ``n``."""
    text = _strip_casts(bytes_expr)
    sizeof = _SIZEOF.search(text)
    if sizeof is None:
        if depth < 3 and re.fullmatch(r"[A-Za-z_]\w*", text) and text in scope.exprs:
            return _elements(scope.exprs[text], element_type, scope, depth + 1)
        return None
    rest = (text[: sizeof.start()] + text[sizeof.end() :]).strip()
    rest = re.sub(r"^\*\s*|\s*\*$", "", rest).strip()
    rest = re.sub(r"\*\s*\*", "*", rest)
    if not rest:
        return "1"
    return _strip_casts(rest)


def _in_param_names(expr: str, host_to_param: Mapping[str, str], scope: _Scope) -> str | None:
    """Rewrite a host expression in the kernel's scalar names, or as a number; None if impossible."""
    expr = " ".join(_strip_casts(expr).split())
    names = set(_IDENT.findall(expr)) - {"min", "max", "ceil_div"}
    if names and names <= set(host_to_param):
        return _IDENT.sub(lambda m: host_to_param.get(m.group(0), m.group(0)), expr)
    value = evaluate_int(expr, scope.exprs)
    if value is not None:
        return str(value)
    # Substitute what maps to parameters, evaluate the rest where constants allow.
    pieces = []
    for token in re.split(r"(\b[A-Za-z_]\w*\b)", expr):
        if re.fullmatch(r"[A-Za-z_]\w*", token) and token not in ("min", "max", "ceil_div"):
            if token in host_to_param:
                pieces.append(host_to_param[token])
                continue
            known = evaluate_int(token, scope.exprs)
            if known is None:
                return None
            pieces.append(str(known))
        else:
            pieces.append(token)
    return "".join(pieces)


def _dims(text: str | None, host_to_param: Mapping[str, str], scope: _Scope) -> tuple[list[Any], bool]:
    """Launch dimensions as three spec entries; the flag says whether all were read."""
    if text is None:
        return [PLACEHOLDER, 1, 1], False
    text = _strip_casts(text)
    m = re.fullmatch(r"dim3\s*\((.*)\)", text, flags=re.S)
    if m:
        parts = _split_top(m.group(1))
    elif re.fullmatch(r"[A-Za-z_]\w*", text) and text in scope.dim3:
        parts = scope.dim3[text]
    else:
        parts = [text]
    parts = (parts + ["1", "1", "1"])[:3]
    out: list[Any] = []
    ok = True
    for part in parts:
        converted = _in_param_names(part, host_to_param, scope)
        if converted is None:
            out.append(PLACEHOLDER)
            ok = False
        elif re.fullmatch(r"\d+", converted):
            out.append(int(converted))
        else:
            out.append(converted)
    return out, ok


def _role(param, facts: KernelFacts | None) -> str:
    """``in`` for const data, ``out`` when the analysis proves the kernel writes the array and never reads it."""
    if param.is_const:
        return "in"
    if (facts is not None and facts.complete and param.name in facts.written and param.name not in facts.read
            and param.name not in facts.escaped):
        return "out"
    return "inout"


def draft_spec(index: KernelIndex, source: str, kernel: str, pre: Preprocessed | None = None,
               facts: KernelFacts | None = None) -> SpecDraft:
    """Draft the launch spec of ``kernel`` (a ``__global__`` function of ``index``).

    ``pre`` is the file's preprocessed view (macros of local headers), ``facts`` the
    kernel's access analysis on it; without them the file is read on its own.
    """
    function = next((f for f in index.kernels if f.name == kernel), None)
    if function is None:
        raise ValueError(f"no __global__ function named '{kernel}' in this file")
    launches = index.launches_of(kernel)
    launch = launches[0] if launches else None
    scope = _scope(source, index, launch, pre)
    if facts is None:
        facts = analyze(pre if pre is not None else source).get(kernel)
    # A template kernel's types as this launch instantiates it: ``scale<float>`` makes ``T`` float.
    types = dict(zip(function.template_params, launch.template_args)) if launch is not None else {}
    todo: list[str] = []
    if launch is None:
        todo.append(f"no launch of {kernel} is visible in this file: fill in the scalar values, array sizes, grid and block")
    args = list(launch.args) if launch is not None else []
    host_to_param: dict[str, str] = {}
    for param, arg in zip(function.params, args):
        if param.pointer_depth == 0 and re.fullmatch(r"[A-Za-z_]\w*", _strip_casts(arg)):
            host_to_param[_strip_casts(arg)] = param.name
    params: list[dict[str, Any]] = []
    for i, param in enumerate(function.params):
        arg = args[i] if i < len(args) else None
        if param.pointer_depth >= 1:
            params.append(_array_param(param, arg, scope, host_to_param, facts, types, todo))
        else:
            params.append(_scalar_param(param, arg, scope, types, todo))
    grid, grid_ok = _dims(launch.grid if launch else None, host_to_param, scope)
    block, block_ok = _dims(launch.block if launch else None, host_to_param, scope)
    if launch is not None and not grid_ok:
        todo.append(f"grid: '{launch.grid}' could not be read; write it in the scalar parameters' names or as numbers")
    if launch is not None and not block_ok:
        todo.append(f"block: '{launch.block}' could not be read; write it as numbers")
    spec: dict[str, Any] = {"kernel": kernel, "params": params, "grid": grid, "block": block}
    if launch is not None and launch.shared_mem:
        smem = _in_param_names(launch.shared_mem, host_to_param, scope)
        if smem is None:
            todo.append(f"dynamic_smem: '{launch.shared_mem}' could not be read")
        spec["dynamic_smem"] = PLACEHOLDER if smem is None else (int(smem) if smem.isdigit() else smem)
    return SpecDraft(kernel, spec, tuple(todo), launch.span.start.line if launch else None)


def _scalar_param(param, arg: str | None, scope: _Scope, types: Mapping[str, str], todo: list[str]) -> dict[str, Any]:
    spec_type = SCALAR_TYPES.get(types.get(param.base_type, param.base_type))
    entry: dict[str, Any] = {"name": param.name, "scalar": spec_type or PLACEHOLDER}
    if spec_type is None:
        todo.append(f"{param.name}: type '{param.type_text}' has no launch-spec scalar type")
    value = scope.value(arg) if arg is not None else None
    if value is not None and spec_type is not None and not spec_type.startswith("float"):
        value = int(value) if float(value).is_integer() else None
    if value is None:
        entry["value"] = PLACEHOLDER
        where = f"the launch passes '{arg}'" if arg is not None else "no launch is visible"
        todo.append(f"{param.name}: value unknown ({where}); give a number")
    else:
        entry["value"] = float(value) if spec_type and spec_type.startswith("float") else value
    return entry


def _array_param(param, arg, scope, host_to_param, facts, types: Mapping[str, str], todo) -> dict[str, Any]:
    element = types.get(param.base_type, param.base_type)
    spec_type = ARRAY_TYPES.get(element) if param.pointer_depth == 1 else None
    if spec_type is None:
        todo.append(f"{param.name}: element type '{param.type_text}' has no launch-spec array type")
    role = _role(param, facts)
    size: Any = PLACEHOLDER
    if arg is not None:
        base = re.split(r"\s*[+-]\s*", _strip_casts(arg))[0]
        bytes_expr = scope.malloc_bytes.get(base)
        elements = _elements(bytes_expr, element, scope) if bytes_expr else None
        if elements is not None:
            converted = _in_param_names(elements, host_to_param, scope)
            if converted is not None:
                size = int(converted) if converted.isdigit() else converted
    if size == PLACEHOLDER:
        why = f"no readable cudaMalloc for '{arg}'" if arg is not None else "no launch is visible"
        todo.append(f"{param.name}: element count unknown ({why}); give an expression in the scalar names")
    integer = spec_type is not None and not spec_type.startswith(("float", "bfloat"))
    if role == "out":
        init = "zeros"
    elif integer:
        init = "zeros"
        todo.append(f"{param.name}: integer array starts as zeros; if it holds indices or offsets, give a fitting init (e.g. perm(n), randint(0,9))")
    else:
        init = "uniform(-1,1)"
    return {"name": param.name, "array": spec_type or PLACEHOLDER, "size": size, "init": init, "role": role}


def placeholder_count(value: Any) -> int:
    """How many values of a drafted spec are still :data:`PLACEHOLDER` (what a title counts)."""
    if isinstance(value, dict):
        return sum(placeholder_count(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(placeholder_count(v) for v in value)
    return int(isinstance(value, str) and PLACEHOLDER in value)
