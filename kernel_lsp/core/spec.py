"""Launch spec v1 (``LAUNCH_SPEC.md`` at the repository root): parse, validate, resolve.

:func:`parse_spec` takes the JSON object (or its text) and returns a frozen
:class:`Spec`, or raises :class:`SpecError` listing every problem, each naming
its field (``params[2].size: unknown name 'm'``). Validation evaluates every
expression at the main values and at every variant, so a spec that is accepted
here can be resolved (:meth:`Spec.resolve`) without surprises.

The in-source form is a comment block directly above the kernel::

    // kernel-lsp: spec {"params": [...], "grid": [...], "block": [256, 1, 1]}
    // (the JSON may continue on further // lines)
    __global__ void saxpy(...)

It holds the same fields as the JSON file; ``kernel`` may be left out (it is the
next ``__global__`` function's name). :func:`find_inline_specs` finds them.

Pure: no file IO (``file(NAME.npy)`` paths are resolved by the caller against
``Spec.base_dir``).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
import re
import reprlib
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel_lsp.core import expr

SCALAR_TYPES = ("int32", "uint32", "int64", "uint64", "float32", "float64")
ARRAY_TYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64")
FLOAT_TYPES = frozenset(("float16", "bfloat16", "float32", "float64"))
ROLES = ("in", "out", "inout")

#: Inclusive value ranges of the integer types.
INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}

#: Default (rtol, atol) by element type, from the spec.
DEFAULT_TOLERANCE = {
    "float32": (1e-5, 1e-6),
    "float64": (1e-10, 1e-12),
    "float16": (1e-2, 1e-3),
    "bfloat16": (1e-2, 1e-3),
}

#: Initializer -> (min args, max args); None for "any number >= min".
INITIALIZERS: dict[str, tuple[int, int | None]] = {
    "uniform": (2, 2),
    "normal": (2, 2),
    "randint": (2, 2),
    "zeros": (0, 0),
    "ones": (0, 0),
    "fill": (1, 1),
    "arange": (0, 0),
    "list": (1, None),
    "perm": (1, 1),
    "csr_rowptr": (2, 2),
    "csr_colidx": (3, 3),
    "file": (1, 1),
}
#: Initializers whose arguments are integer expressions in the scalar names.
_INT_ARG_INITS = frozenset(("randint", "perm", "csr_rowptr", "csr_colidx"))

_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_TOP_KEYS = frozenset(("kernel", "params", "grid", "block", "dynamic_smem", "tolerance", "variants", "candidate", "notes", "fixed"))
#: Keys tolerated for documentation; they carry no meaning.
_DOC_KEYS = frozenset(("version", "description", "comment", "$schema"))
_MAX_THREADS_PER_BLOCK = 1024
#: Limits on the work one spec can ask of the validator (specs come from files anyone can write).
MAX_PARAMS = 1024
MAX_VARIANTS = 64
MAX_INIT_CHARS = 100_000
#: Most expression nodes checking one spec may evaluate (all expressions, main values and variants):
#: about a tenth of a second.
MAX_EVALUATION_STEPS = 200_000
#: Bytes per element of each array type.
ELEMENT_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "float16": 2,
                 "bfloat16": 2, "float32": 4, "float64": 8}


class SpecError(ValueError):
    """A spec that cannot be used; ``errors`` lists every problem, each naming its field."""

    def __init__(self, errors: Sequence[str]):
        self.errors = tuple(errors)
        super().__init__("invalid launch spec: " + "; ".join(self.errors))


@dataclass(frozen=True)
class Init:
    kind: str
    args: tuple[str, ...]
    """Arguments as written: numbers, integer expressions, or (``file``) a path."""
    text: str


@dataclass(frozen=True)
class ScalarParam:
    name: str
    type: str
    value: int | float


@dataclass(frozen=True)
class ArrayParam:
    name: str
    type: str
    size: str
    """Element count: an integer expression in the scalar names."""
    init: Init
    role: str
    struct: str | None = None
    """The C struct the kernel's pointer points to (an array of structs), described as ``size`` elements of ``type``."""


Param = ScalarParam | ArrayParam


@dataclass(frozen=True)
class LaunchConfig:
    grid: tuple[str, str, str]
    block: tuple[str, str, str]
    dynamic_smem: str = "0"


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


@dataclass(frozen=True)
class Launch:
    """A launch configuration evaluated at one set of scalar values."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem_bytes: int


@dataclass(frozen=True)
class Resolved:
    """Everything a runner needs at one set of scalar values."""

    values: Mapping[str, int | float]
    sizes: Mapping[str, int]
    """Array name -> element count."""
    original: Launch
    candidate: Launch


@dataclass(frozen=True)
class Spec:
    kernel: str
    params: tuple[Param, ...]
    launch: LaunchConfig
    candidate_launch: LaunchConfig
    """The rewrite's launch: the ``candidate`` field over the original's."""
    tolerance: tuple[float | None, float | None]
    """(rtol, atol) as given; None where the spec left it to the per-type default."""
    variants: tuple[tuple[tuple[str, int | float], ...], ...] = ()
    base_dir: str | None = None
    """Folder ``file(NAME.npy)`` paths are relative to (the spec file's folder)."""
    notes: Mapping[str, Any] | None = field(default=None, compare=False)
    """The free-form ``notes`` object (category, bytes moved, measured times); the harness ignores it."""
    fixed: tuple[str, ...] = ()
    """Integer scalars the harness does not vary when it tries sizes the spec does not name (``"fixed": ["width"]``):
    a rewrite is verified at their spec values only, and says so."""

    @property
    def scalars(self) -> tuple[ScalarParam, ...]:
        return tuple(p for p in self.params if isinstance(p, ScalarParam))

    @property
    def arrays(self) -> tuple[ArrayParam, ...]:
        return tuple(p for p in self.params if isinstance(p, ArrayParam))

    def values(self, variant: int | None = None) -> dict[str, int | float]:
        """Scalar values at the main size (``variant=None``) or at ``variants[variant]``."""
        values: dict[str, int | float] = {p.name: p.value for p in self.scalars}
        if variant is not None:
            values.update(dict(self.variants[variant]))
        return values

    def tolerance_for(self, array_type: str) -> Tolerance:
        default_rtol, default_atol = DEFAULT_TOLERANCE.get(array_type, (0.0, 0.0))
        rtol, atol = self.tolerance
        return Tolerance(default_rtol if rtol is None else rtol, default_atol if atol is None else atol)

    def resolve(self, variant: int | None = None) -> Resolved:
        values = self.values(variant)
        env = _int_env(self, values)
        sizes = {a.name: expr.evaluate(a.size, env) for a in self.arrays}
        return Resolved(values, sizes, _launch(self.launch, env), _launch(self.candidate_launch, env))

    def array_bytes(self, variant: int | None = None) -> int:
        """Bytes of all arrays at the main size or at ``variants[variant]`` (one copy of each)."""
        sizes = self.resolve(variant).sizes
        return sum(sizes[a.name] * ELEMENT_BYTES[a.type] for a in self.arrays)

    def to_json(self) -> dict[str, Any]:
        """The spec as a v1 JSON object (``parse_spec(spec.to_json())`` gives it back)."""

        def param(p: Param) -> dict[str, Any]:
            if isinstance(p, ScalarParam):
                return {"name": p.name, "scalar": p.type, "value": p.value}
            out = {"name": p.name, "array": p.type, "size": p.size, "init": p.init.text, "role": p.role}
            return {**out, "struct": p.struct} if p.struct else out

        def launch(c: LaunchConfig) -> dict[str, Any]:
            return {"grid": list(c.grid), "block": list(c.block), "dynamic_smem": c.dynamic_smem}

        out: dict[str, Any] = {"kernel": self.kernel, "params": [param(p) for p in self.params], **launch(self.launch)}
        rtol, atol = self.tolerance
        if rtol is not None or atol is not None:
            out["tolerance"] = {k: v for k, v in (("rtol", rtol), ("atol", atol)) if v is not None}
        if self.variants:
            out["variants"] = [dict(v) for v in self.variants]
        if self.candidate_launch != self.launch:
            out["candidate"] = launch(self.candidate_launch)
        if self.notes is not None:
            out["notes"] = dict(self.notes)
        if self.fixed:
            out["fixed"] = list(self.fixed)
        return out


def _int_env(spec: Spec, values: Mapping[str, int | float]) -> dict[str, int]:
    return {p.name: int(values[p.name]) for p in spec.scalars if p.type not in FLOAT_TYPES}


def _launch(config: LaunchConfig, env: Mapping[str, int]) -> Launch:
    grid = tuple(expr.evaluate(e, env) for e in config.grid)
    block = tuple(expr.evaluate(e, env) for e in config.block)
    return Launch(grid, block, expr.evaluate(config.dynamic_smem, env))  # type: ignore[arg-type]


class _Errors:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}" if where else message)


_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlong = 3, 60, 60, 40


def _show(value: Any) -> str:
    """A short, bounded ``repr`` for messages: a 5,000-digit number or a list nested 10,000 deep stays short."""
    try:
        return _SHOW.repr(value)
    except (ValueError, RecursionError):  # an int beyond Python's digit limit for str()
        return f"<{type(value).__name__} too large to show>"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int too large for a double
        return False


def _check_scalar_value(type_: str, value: Any) -> str | None:
    if type_ in FLOAT_TYPES:
        return None if _is_number(value) else f"expected a finite number for {type_}, got {_show(value)}"
    if not _is_int(value):
        return f"expected an integer for {type_}, got {_show(value)}"
    low, high = INT_RANGES[type_]
    return None if low <= value <= high else f"{_show(value)} is outside the range of {type_} [{low}, {high}]"


def _expr_text(value: Any) -> str:
    if _is_int(value):
        return str(value)
    if isinstance(value, str):
        return value.strip()
    raise expr.ExprError(f"expected an integer or an expression string, got {_show(value)}")


def _check_expr(value: Any, where: str, int_names: frozenset[str], float_names: frozenset[str], errors: _Errors) -> str | None:
    try:
        text = _expr_text(value)
        node = expr.parse(text)
    except expr.ExprError as exc:
        errors.add(where, str(exc))
        return None
    for name in sorted(expr.names(node)):
        if name in float_names:
            errors.add(where, f"'{name}' is a floating-point scalar; expressions take integer scalars only")
        elif name not in int_names:
            errors.add(where, f"unknown name '{name}'")
    return text


def _split_args(text: str) -> list[str]:
    args, depth, current = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        current += ch
    args.append(current.strip())
    return args


def parse_init(text: str) -> Init:
    """Parse an initializer such as ``uniform(-1,1)`` or ``perm(n)``; raises ValueError."""
    if not isinstance(text, str):
        raise ValueError(f"expected a string such as 'uniform(-1,1)', got {_show(text)}")
    if len(text) > MAX_INIT_CHARS:
        raise ValueError(f"initializer is {len(text)} characters long (limit {MAX_INIT_CHARS})")
    text = text.strip()
    match = re.fullmatch(r"([A-Za-z_]\w*)\s*(?:\((.*)\))?", text, re.S)
    if match is None:
        raise ValueError(f"cannot read initializer {_show(text)}")
    kind, inner = match.group(1), match.group(2)
    if kind not in INITIALIZERS:
        raise ValueError(f"unknown initializer '{kind}' (known: {', '.join(INITIALIZERS)})")
    if kind == "file":
        args = [inner.strip()] if inner is not None and inner.strip() else []
    else:
        args = [] if inner is None or not inner.strip() else _split_args(inner)
    low, high = INITIALIZERS[kind]
    if len(args) < low or (high is not None and len(args) > high):
        wanted = str(low) if low == high else f"at least {low}"
        raise ValueError(f"{kind} takes {wanted} argument(s), got {len(args)}")
    if any(a == "" for a in args):
        raise ValueError(f"empty argument in {_show(text)}")
    return Init(kind, tuple(args), text)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {_show(text)}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {_show(text)}")
    return value


def _check_init_static(init: Init, array_type: str, where: str, int_names, float_names, errors: _Errors) -> None:
    """Checks that do not depend on the scalar values."""
    if init.kind in ("uniform", "normal") and array_type not in FLOAT_TYPES:
        errors.add(where, f"{init.kind} needs a floating-point array, not {array_type}")
    if init.kind in ("uniform", "normal", "fill", "list"):
        for arg in init.args:
            try:
                value = _number(arg)
            except ValueError as exc:
                errors.add(where, str(exc))
                continue
            if array_type not in FLOAT_TYPES and init.kind in ("fill", "list"):
                if value != int(value):
                    errors.add(where, f"{arg} is not an integer, but the array is {array_type}")
                elif not INT_RANGES[array_type][0] <= int(value) <= INT_RANGES[array_type][1]:
                    errors.add(where, f"{arg} does not fit in {array_type}")
        if init.kind == "normal" and len(init.args) == 2:
            try:
                if _number(init.args[1]) < 0:
                    errors.add(where, "normal(mean,std) needs std >= 0")
            except ValueError:
                pass
        if init.kind == "uniform" and len(init.args) == 2:
            try:
                if _number(init.args[0]) > _number(init.args[1]):
                    errors.add(where, "uniform(a,b) needs a <= b")
            except ValueError:
                pass
    if init.kind in _INT_ARG_INITS:
        for arg in init.args:
            _check_expr(arg, where, int_names, float_names, errors)
    if init.kind in ("perm", "csr_rowptr", "csr_colidx") and array_type in FLOAT_TYPES:
        errors.add(where, f"{init.kind} fills indices; use an integer array, not {array_type}")
    if init.kind == "file" and not init.args[0].endswith(".npy"):
        errors.add(where, f"file() takes a .npy file name, got {_show(init.args[0])}")
    elif init.kind == "file" and _outside_folder(init.args[0]):
        errors.add(where, f"file({init.args[0]}) must name a file in the spec's own folder or below it "
                          "(a relative path without '..'): a cloned spec must not read files elsewhere")


def _outside_folder(name: str) -> bool:
    """Whether a ``file()`` name can reach outside the folder it is resolved in (absolute, ``..``, ``~``)."""
    parts = name.replace("\\", "/").split("/")
    return name.startswith(("/", "~")) or ":" in parts[0] or ".." in parts


def check_init_at(init: Init, array_type: str, size: int, env: Mapping[str, int]) -> str | None:
    """Checks that depend on the scalar values; returns a message or None."""
    args = [expr.evaluate(a, env) for a in init.args] if init.kind in _INT_ARG_INITS else []
    int_range = INT_RANGES.get(array_type)
    if init.kind == "randint":
        low, high = args
        if low > high:
            return f"randint({low},{high}) needs a <= b"
        if int_range and (low < int_range[0] or high > int_range[1]):
            return f"randint({low},{high}) does not fit in {array_type}"
    elif init.kind == "perm":
        (n,) = args
        if n != size:
            return f"perm({n}) makes {n} elements but size is {size}"
        if int_range and n - 1 > int_range[1]:
            return f"perm({n}) does not fit in {array_type}"
    elif init.kind == "csr_rowptr":
        rows, k = args
        if rows < 0 or k < 0:
            return "csr_rowptr(rows,k) needs rows >= 0 and k >= 0"
        if size != rows + 1:
            return f"csr_rowptr({rows},{k}) makes {rows + 1} elements but size is {size}"
        if int_range and rows * k > int_range[1]:
            return f"csr_rowptr({rows},{k}) values do not fit in {array_type}"
    elif init.kind == "csr_colidx":
        rows, cols, k = args
        if rows < 0 or cols < 0 or k < 0:
            return "csr_colidx(rows,cols,k) needs non-negative arguments"
        if k > cols:
            return f"csr_colidx needs k <= cols (k={k}, cols={cols})"
        if size != rows * k:
            return f"csr_colidx({rows},{cols},{k}) makes {rows * k} elements but size is {size}"
        if int_range and cols - 1 > int_range[1]:
            return f"column indices up to {cols - 1} do not fit in {array_type}"
    elif init.kind == "arange" and int_range and size - 1 > int_range[1]:
        return f"arange up to {size - 1} does not fit in {array_type}"
    return None


def _launch_config(data: Mapping[str, Any], where: str, int_names, float_names, errors: _Errors, base: LaunchConfig | None) -> LaunchConfig | None:
    dims: dict[str, tuple[str, str, str] | None] = {}
    for key in ("grid", "block"):
        if key not in data:
            if base is None:
                errors.add(f"{where}{key}", "missing (three entries, e.g. [\"(n+255)/256\", 1, 1])")
                dims[key] = None
            else:
                dims[key] = getattr(base, key)
            continue
        value = data[key]
        if not isinstance(value, list) or len(value) != 3:
            errors.add(f"{where}{key}", f"expected a list of three entries, got {_show(value)}")
            dims[key] = None
            continue
        texts = [_check_expr(v, f"{where}{key}[{i}]", int_names, float_names, errors) for i, v in enumerate(value)]
        dims[key] = tuple(texts) if all(t is not None for t in texts) else None  # type: ignore[assignment]
    smem = data.get("dynamic_smem", base.dynamic_smem if base else 0)
    smem_text = smem if base is not None and "dynamic_smem" not in data else _check_expr(smem, f"{where}dynamic_smem", int_names, float_names, errors)
    if dims["grid"] is None or dims["block"] is None or smem_text is None:
        return None
    return LaunchConfig(dims["grid"], dims["block"], smem_text)  # type: ignore[arg-type]


def _check_launch_values(launch: Launch, where: str, errors: _Errors) -> None:
    for key, dims in (("grid", launch.grid), ("block", launch.block)):
        for i, value in enumerate(dims):
            if value < 1:
                errors.add(f"{where}{key}[{i}]", f"evaluates to {value}; launch dimensions must be >= 1")
    if all(v >= 1 for v in launch.block) and math.prod(launch.block) > _MAX_THREADS_PER_BLOCK:
        errors.add(f"{where}block", f"{math.prod(launch.block)} threads per block exceeds {_MAX_THREADS_PER_BLOCK}")
    if launch.dynamic_smem_bytes < 0:
        errors.add(f"{where}dynamic_smem", f"evaluates to {launch.dynamic_smem_bytes}; must be >= 0")


def parse_spec(data: Mapping[str, Any] | str, base_dir: str | None = None) -> Spec:
    """Validate a launch spec v1 (a JSON object or its text). Raises :class:`SpecError`."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except RecursionError:
            raise SpecError(["not usable JSON: nested too deeply"]) from None
        except ValueError as exc:  # JSONDecodeError, and integers beyond Python's digit limit
            raise SpecError([f"not valid JSON: {exc}"]) from None
    if not isinstance(data, Mapping):
        raise SpecError([f"a launch spec is a JSON object, got {type(data).__name__}"])
    errors = _Errors()
    for key in data:
        if key not in _TOP_KEYS and key not in _DOC_KEYS:
            errors.add(str(key), f"unknown field (known: {', '.join(sorted(_TOP_KEYS))})")
    kernel = data.get("kernel")
    if not isinstance(kernel, str) or not _IDENT.match(kernel):
        errors.add("kernel", f"expected the kernel's name (an identifier), got {_show(kernel)}")

    params_data = data.get("params")
    if not isinstance(params_data, list):
        errors.add("params", "missing or not a list (one entry per kernel parameter, in order)")
        params_data = []
    if len(params_data) > MAX_PARAMS:
        raise SpecError([f"params: {len(params_data)} parameters (limit {MAX_PARAMS})"])
    scalar_types: dict[str, str] = {}
    for i, p in enumerate(params_data):
        if isinstance(p, Mapping) and isinstance(p.get("name"), str) and isinstance(p.get("scalar"), str):
            scalar_types[p["name"]] = p["scalar"]
    int_names = frozenset(n for n, t in scalar_types.items() if t in SCALAR_TYPES and t not in FLOAT_TYPES)
    float_names = frozenset(n for n, t in scalar_types.items() if t in FLOAT_TYPES)

    params: list[Param] = []
    seen: set[str] = set()
    for i, p in enumerate(params_data):
        where = f"params[{i}]"
        if not isinstance(p, Mapping):
            errors.add(where, f"expected an object, got {_show(p)}")
            continue
        name = p.get("name")
        if not isinstance(name, str) or not _IDENT.match(name):
            errors.add(f"{where}.name", f"expected an identifier, got {_show(name)}")
            continue
        if name in seen:
            errors.add(f"{where}.name", f"duplicate parameter name '{name}'")
        seen.add(name)
        if ("scalar" in p) == ("array" in p):
            errors.add(where, "give exactly one of 'scalar' (a by-value argument) or 'array' (a device pointer)")
            continue
        if "scalar" in p:
            for key in p:
                if key not in ("name", "scalar", "value"):
                    errors.add(f"{where}.{key}", "unknown field for a scalar (known: name, scalar, value)")
            type_ = p["scalar"]
            if type_ not in SCALAR_TYPES:
                errors.add(f"{where}.scalar", f"unknown scalar type {_show(type_)} (known: {', '.join(SCALAR_TYPES)})")
                continue
            if "value" not in p:
                errors.add(f"{where}.value", "missing")
                continue
            problem = _check_scalar_value(type_, p["value"])
            if problem:
                errors.add(f"{where}.value", problem)
                continue
            value = p["value"] if type_ not in FLOAT_TYPES else float(p["value"])
            params.append(ScalarParam(name, type_, value))
            continue
        for key in p:
            if key not in ("name", "array", "size", "init", "role", "struct"):
                errors.add(f"{where}.{key}", "unknown field for an array (known: name, array, size, init, role, struct)")
        struct = p.get("struct")
        if struct is not None and (not isinstance(struct, str) or not _IDENT.match(struct)):
            errors.add(f"{where}.struct", f"expected the C struct's name (an identifier), got {struct!r}")
            continue
        type_ = p["array"]
        if type_ not in ARRAY_TYPES:
            errors.add(f"{where}.array", f"unknown element type {_show(type_)} (known: {', '.join(ARRAY_TYPES)})")
            continue
        if "size" not in p:
            errors.add(f"{where}.size", "missing (the element count, an integer expression in the scalar names)")
            continue
        size = _check_expr(p["size"], f"{where}.size", int_names, float_names, errors)
        role = p.get("role")
        if role not in ROLES:
            errors.add(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {_show(role)}")
            continue
        # An out array's start value must not matter (the harness poisons it), so its init may be left out.
        init_text = p.get("init", "zeros" if role == "out" else None)
        if init_text is None:
            errors.add(f"{where}.init", "missing (e.g. \"uniform(-1,1)\")")
            continue
        try:
            init = parse_init(init_text)
        except ValueError as exc:
            errors.add(f"{where}.init", str(exc))
            continue
        _check_init_static(init, type_, f"{where}.init", int_names, float_names, errors)
        if size is not None:
            params.append(ArrayParam(name, type_, size, init, role, struct))

    launch = _launch_config(data, "", int_names, float_names, errors, None)
    candidate_data = data.get("candidate", {})
    candidate_launch = None
    if not isinstance(candidate_data, Mapping):
        errors.add("candidate", f"expected an object with grid/block/dynamic_smem, got {_show(candidate_data)}")
    else:
        for key in candidate_data:
            if key not in ("grid", "block", "dynamic_smem"):
                errors.add(f"candidate.{key}", "unknown field (a rewrite may change grid, block and dynamic_smem only)")
        if launch is not None:
            candidate_launch = _launch_config(candidate_data, "candidate.", int_names, float_names, errors, launch)

    tolerance: tuple[float | None, float | None] = (None, None)
    tol_data = data.get("tolerance")
    if tol_data is not None:
        if not isinstance(tol_data, Mapping):
            errors.add("tolerance", f"expected an object {{\"rtol\": …, \"atol\": …}}, got {_show(tol_data)}")
        else:
            found: dict[str, float] = {}
            for key, value in tol_data.items():
                if key not in ("rtol", "atol"):
                    errors.add(f"tolerance.{key}", "unknown field (known: rtol, atol)")
                elif not _is_number(value) or value < 0:
                    errors.add(f"tolerance.{key}", f"expected a number >= 0, got {_show(value)}")
                else:
                    found[key] = float(value)
            tolerance = (found.get("rtol"), found.get("atol"))

    notes = data.get("notes")
    if notes is not None and not isinstance(notes, Mapping):
        errors.add("notes", f"expected an object, got {notes!r}")

    variants: list[tuple[tuple[str, int | float], ...]] = []
    variants_data = data.get("variants", [])
    if not isinstance(variants_data, list):
        errors.add("variants", f"expected a list of objects, got {_show(variants_data)}")
        variants_data = []
    if len(variants_data) > MAX_VARIANTS:
        errors.add("variants", f"{len(variants_data)} variants (limit {MAX_VARIANTS})")
        variants_data = []
    for i, v in enumerate(variants_data):
        if not isinstance(v, Mapping) or not v:
            errors.add(f"variants[{i}]", f"expected a non-empty object of scalar values, got {_show(v)}")
            continue
        items: list[tuple[str, int | float]] = []
        for key, value in v.items():
            if key not in scalar_types:
                errors.add(f"variants[{i}].{key}", "not a scalar parameter")
                continue
            problem = _check_scalar_value(scalar_types[key], value) if scalar_types[key] in SCALAR_TYPES else None
            if problem:
                errors.add(f"variants[{i}].{key}", problem)
                continue
            items.append((key, float(value) if scalar_types[key] in FLOAT_TYPES else value))
        variants.append(tuple(items))

    fixed = _fixed_names(data.get("fixed", []), int_names, errors)

    if errors.items or not isinstance(kernel, str) or launch is None or candidate_launch is None:
        if not errors.items:
            errors.add("", "incomplete spec")
        raise SpecError(errors.items)

    spec = Spec(kernel, tuple(params), launch, candidate_launch, tolerance, tuple(variants), base_dir, dict(notes) if notes is not None else None, fixed)
    steps = _evaluation_steps(spec)
    if steps > MAX_EVALUATION_STEPS:
        raise SpecError([f"checking this spec takes {steps} evaluation steps (limit {MAX_EVALUATION_STEPS}): "
                         "fewer variants, parameters or shorter expressions"])
    _check_values(spec, errors)
    if errors.items:
        raise SpecError(errors.items)
    return spec


def _fixed_names(value: Any, int_names: frozenset[str], errors: _Errors) -> tuple[str, ...]:
    """The ``fixed`` list: names of integer scalar parameters, each once."""
    if not isinstance(value, list):
        errors.add("fixed", f"expected a list of integer scalar names such as [\"width\"], got {_show(value)}")
        return ()
    names: list[str] = []
    for i, name in enumerate(value):
        if not isinstance(name, str) or name not in int_names:
            errors.add(f"fixed[{i}]", f"{_show(name)} is not an integer scalar parameter")
        elif name in names:
            errors.add(f"fixed[{i}]", f"'{name}' is listed twice")
        else:
            names.append(name)
    return tuple(names)


def _evaluation_steps(spec: Spec) -> int:
    """Expression nodes :func:`_check_values` evaluates: every expression at the main values and each variant."""
    texts = [a.size for a in spec.arrays]
    texts += [arg for a in spec.arrays if a.init.kind in _INT_ARG_INITS for arg in a.init.args]
    for config in (spec.launch, spec.candidate_launch):
        texts += [*config.grid, *config.block, config.dynamic_smem]
    per_values = sum(expr.node_count(expr.parse(t)) for t in texts)
    return per_values * (len(spec.variants) + 1)


def _check_values(spec: Spec, errors: _Errors) -> None:
    """Evaluate every expression at the main values and at each variant."""
    for variant in [None, *range(len(spec.variants))]:
        prefix = "" if variant is None else f"variants[{variant}]: "
        values = spec.values(variant)
        env = _int_env(spec, values)
        for i, p in enumerate(spec.params):
            if not isinstance(p, ArrayParam):
                continue
            try:
                size = expr.evaluate(p.size, env)
            except expr.ExprError as exc:
                errors.add(f"{prefix}params[{i}].size", str(exc))
                continue
            if size < 0:
                errors.add(f"{prefix}params[{i}].size", f"evaluates to {size}; must be >= 0")
                continue
            try:
                problem = check_init_at(p.init, p.type, size, env)
            except expr.ExprError as exc:
                problem = str(exc)
            if problem:
                errors.add(f"{prefix}params[{i}].init", problem)
        for where, config in (("", spec.launch), ("candidate.", spec.candidate_launch)):
            try:
                _check_launch_values(_launch(config, env), prefix + where, errors)
            except expr.ExprError as exc:
                errors.add(f"{prefix}{where}launch", str(exc))


def memory_problem(spec: Spec, limit_bytes: int, what: str = "the GPU's memory", copies: int = 2) -> str | None:
    """A message when the arrays at any size need more than ``limit_bytes``; None when they fit.

    ``copies``: how many times the harness holds each array at once (the original's and the
    candidate's buffers). Checked before anything is allocated, so a 10 GB spec is refused, not tried.
    """
    for variant in [None, *range(len(spec.variants))]:
        need = spec.array_bytes(variant) * copies
        if need > limit_bytes:
            at = "" if variant is None else f" at variants[{variant}]"
            return (f"the arrays{at} need {need / 2**30:.1f} GiB ({copies} copies), more than {what} "
                    f"({limit_bytes / 2**30:.1f} GiB)")
    return None


def relaunched(data: Mapping[str, Any] | Spec, launch: Mapping[str, Any]) -> dict[str, Any]:
    """A spec's JSON form (or the parsed spec) with ``launch`` (a ``candidate`` field: grid, block, dynamic_smem)
    as its own launch and no candidate launch: the kernel as a rewrite that needs that launch runs it."""
    out = {k: v for k, v in (data.to_json() if isinstance(data, Spec) else dict(data)).items() if k != "candidate"}
    out.update({k: v for k, v in launch.items() if k in ("grid", "block", "dynamic_smem")})
    return out


def with_candidate_launch(spec: Spec, candidate: Mapping[str, Any] | None) -> Spec:
    """``spec`` with its ``candidate`` field replaced (a rewrite's own launch settings). Raises :class:`SpecError`."""
    data = spec.to_json()
    data.pop("candidate", None)
    if candidate:
        data["candidate"] = dict(candidate)
    return parse_spec(data, spec.base_dir)


# --- in-source form -------------------------------------------------------------------------

_MARKER = re.compile(r"^\s*//\s*kernel-lsp:\s*spec\b(.*)$")
_LINE_COMMENT = re.compile(r"^\s*//(.*)$")
#: ``__global__`` and the characters that end the search for its name (the name is the identifier right
#: before the first ``(`` after it, with no ``;`` or ``{`` in between).
_GLOBAL_OR_STOP = re.compile(r"__global__|[;{(]")
_GLOBAL = "__global__"
_IDENT_FIRST = frozenset(string.ascii_letters + "_")
#: Largest in-source spec block read, in characters (a longer block is an error, not parsed).
MAX_INLINE_SPEC_CHARS = 64 * 1024


@dataclass(frozen=True)
class InlineSpec:
    line: int
    """0-based line of the ``// kernel-lsp: spec`` marker."""
    kernel: str | None
    """The kernel the block sits above (the next ``__global__`` function)."""
    data: Mapping[str, Any] | None
    """The JSON object with ``kernel`` filled in; None when ``error`` is set. Shared between callers
    (results are cached per source text): read it, never change it."""
    error: str | None


def _name_before(source: str, paren: int) -> tuple[int, str] | None:
    """The identifier that ends right before ``source[paren]`` (spaces allowed between), with its start."""
    end = paren
    while end > 0 and source[end - 1].isspace():
        end -= 1
    start = end
    while start > 0 and (source[start - 1].isalnum() or source[start - 1] == "_"):
        start -= 1
    if start == end or source[start] not in _IDENT_FIRST:
        return None
    return start, source[start:end]


def kernel_names(source: str) -> list[tuple[int, str]]:
    """``(offset of __global__, kernel name)`` for every ``__global__`` followed by a name and ``(``.

    One pass over the text (the former regex search from every marker was quadratic: an 88 KB file of
    ``__global__`` tokens took 32 s). The name is the identifier right before the first ``(`` after
    ``__global__`` when no ``;`` or ``{`` comes first, and it must start after ``__global__`` ends.
    """
    found: list[tuple[int, str]] = []
    pending: list[int] = []
    for match in _GLOBAL_OR_STOP.finditer(source):
        token = match.group()
        if token == _GLOBAL:
            pending.append(match.start())
            continue
        if pending and token == "(":
            named = _name_before(source, match.start())
            if named is not None:
                start, name = named
                found += [(p, name) for p in pending if start >= p + len(_GLOBAL)]
        pending.clear()
    return found


def _spec_data(text: str, start: int, kernel: str | None) -> InlineSpec:
    where = f"line {start + 1}: in-source spec"
    if len(text) > MAX_INLINE_SPEC_CHARS:
        return InlineSpec(start, kernel, None, f"{where} is longer than {MAX_INLINE_SPEC_CHARS} characters")
    try:
        data = json.loads(text)
    except RecursionError:
        return InlineSpec(start, kernel, None, f"{where} is nested too deeply")
    except ValueError as exc:  # JSONDecodeError, and integers longer than Python's digit limit
        return InlineSpec(start, kernel, None, f"{where} is not a JSON object: {exc}")
    if not isinstance(data, dict):
        return InlineSpec(start, kernel, None, f"{where} is not a JSON object: the in-source spec must be a JSON object")
    data.setdefault("kernel", kernel)
    return InlineSpec(start, kernel, data, None)


@functools.lru_cache(maxsize=8)
def find_inline_specs(source: str) -> tuple[InlineSpec, ...]:
    """Every ``// kernel-lsp: spec {...}`` block in ``source``, with its kernel.

    Linear in the size of ``source``, and cached per text (the server asks once per kernel per
    publication; a document's text object is the same between edits, so the look-up is a hash hit).
    """
    lines = source.splitlines()
    offsets = list(itertools.accumulate((len(line) for line in source.splitlines(keepends=True)), initial=0))
    names = kernel_names(source)
    name_starts = [offset for offset, _ in names]
    found: list[InlineSpec] = []
    i = 0
    while i < len(lines):
        marker = _MARKER.match(lines[i])
        if marker is None:
            i += 1
            continue
        start = i
        parts = [marker.group(1)]
        i += 1
        while i < len(lines):
            line = lines[i]
            comment = _LINE_COMMENT.match(line)
            if comment is None or _MARKER.match(line):
                break
            parts.append(comment.group(1))
            i += 1
        at = bisect.bisect_left(name_starts, offsets[i])
        kernel = names[at][1] if at < len(names) else None
        found.append(_spec_data("\n".join(parts).strip(), start, kernel))
    return tuple(found)


@functools.lru_cache(maxsize=8)
def _inline_specs_by_kernel(source: str) -> Mapping[str, InlineSpec]:
    by_kernel: dict[str, InlineSpec] = {}
    for found in find_inline_specs(source):
        named = found.data.get("kernel") if found.data else None
        for key in (found.kernel, named):
            if isinstance(key, str):
                by_kernel.setdefault(key, found)
    return by_kernel


def inline_spec_for(source: str, kernel: str) -> InlineSpec | None:
    """The first in-source block that belongs to ``kernel`` (sits above it or names it), or None."""
    return _inline_specs_by_kernel(source).get(kernel)


def inline_spec(source: str, kernel: str, base_dir: str | None = None) -> Spec | None:
    """The in-source spec of ``kernel``, or None when it has none. Raises :class:`SpecError`."""
    found = inline_spec_for(source, kernel)
    if found is None:
        return None
    if found.error:
        raise SpecError([found.error])
    return parse_spec(found.data, base_dir)  # type: ignore[arg-type]
