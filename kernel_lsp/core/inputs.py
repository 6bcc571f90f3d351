"""Deterministic input arrays for a launch spec.

:func:`make_inputs` draws every array from ``numpy.random.default_rng(seed)``
in parameter order, one child generator per array (``SeedSequence.spawn``), so
the same seed gives the same inputs for the original and the rewrite, and an
array's values do not depend on the sizes of the arrays before it.

numpy has no bfloat16: bfloat16 arrays are ``uint16`` bit patterns (the upper
half of a float32, rounded to nearest even); :func:`bf16_to_float32` reads them.
Pure: ``file(NAME.npy)`` arrays are passed in by the caller, already loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kernel_lsp.core import expr
from kernel_lsp.core.spec import FLOAT_TYPES, ArrayParam, Spec, check_init_at

#: numpy dtype holding each spec element type (bfloat16 as its bit pattern).
NUMPY_DTYPES: dict[str, np.dtype] = {
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
    "int64": np.dtype(np.int64),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}


class InputError(ValueError):
    """An array cannot be made (a missing or mismatched ``file()`` array, an impossible initializer)."""


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest even), returned as uint16 bit patterns."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(values)
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bit patterns (uint16) to float32 exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _cast(values: np.ndarray, array_type: str) -> np.ndarray:
    if array_type == "bfloat16":
        return float32_to_bf16(values.astype(np.float32))
    return values.astype(NUMPY_DTYPES[array_type], copy=False)


def _draw_dtype(array_type: str) -> type:
    return np.float64 if array_type == "float64" else np.float32


#: Dense draws (a random key per column of every row) are done this many keys at a time.
_DENSE_CHUNK_KEYS = 1 << 24


#: Float draws are made and scaled this many elements at a time, so each chunk is scaled while in cache.
_DRAW_CHUNK = 1 << 16


def _draw(method, size: int, dtype: type, scale: float, offset: float) -> np.ndarray:
    """``method(size, dtype) * scale + offset`` drawn a chunk at a time into one buffer.

    The generator's stream does not depend on how the draws are split (its
    state carries over between calls), so the values are the same as one
    whole-array draw; the scaling is the same float operation per element.
    """
    values = np.empty(size, dtype=dtype)
    for start in range(0, size, _DRAW_CHUNK):
        chunk = values[start : start + _DRAW_CHUNK]
        method(chunk.size, dtype=dtype, out=chunk)
        chunk *= scale
        chunk += offset
    return values


def _csr_colidx(rng: np.random.Generator, rows: int, cols: int, k: int) -> np.ndarray:
    """k distinct sorted column indices per row, each row drawn independently."""
    if rows == 0 or k == 0:
        return np.zeros(0, dtype=np.int64)
    if k * k <= 4 * cols:
        # Sparse rows (the usual case, e.g. 40 of 1M columns): draw k columns and redraw the few rows
        # that got a duplicate; with k*k <= 4*cols at least ~13% of rows succeed per round.
        # int32 draws and sorts take half the time of int64 ones for 40M-element matrices.
        dtype = np.int32 if cols <= np.iinfo(np.int32).max else np.int64
        chosen = np.sort(rng.integers(0, cols, (rows, k), dtype=dtype), axis=1)
        redo = np.flatnonzero((np.diff(chosen, axis=1) == 0).any(axis=1))
        while redo.size:
            chosen[redo] = np.sort(rng.integers(0, cols, (redo.size, k), dtype=dtype), axis=1)
            redo = redo[(np.diff(chosen[redo], axis=1) == 0).any(axis=1)]
        return chosen.reshape(-1)
    if k == cols:
        return np.tile(np.arange(cols, dtype=np.int64), rows)
    # Dense rows: the k smallest of cols random keys, a chunk of rows at a time to bound memory.
    out = np.empty((rows, k), dtype=np.int64)
    step = max(1, _DENSE_CHUNK_KEYS // cols)
    for first in range(0, rows, step):
        keys = rng.random((min(step, rows - first), cols))
        out[first : first + keys.shape[0]] = np.sort(np.argpartition(keys, k - 1, axis=1)[:, :k], axis=1)
    return out.reshape(-1)


def make_array(param: ArrayParam, size: int, env: Mapping[str, int], rng: np.random.Generator, files: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
    """One array of ``size`` elements as ``param.init`` says."""
    problem = check_init_at(param.init, param.type, size, env)
    if problem:
        raise InputError(f"{param.name}: {problem}")
    kind, args = param.init.kind, param.init.args
    match kind:
        case "uniform":
            # Draw in the narrowest float that holds the target: float32 halves the cost for 64M-element arrays.
            low, high = float(args[0]), float(args[1])
            values = _draw(rng.random, size, _draw_dtype(param.type), high - low, low)
        case "normal":
            values = _draw(rng.standard_normal, size, _draw_dtype(param.type), float(args[1]), float(args[0]))
        case "randint":
            low, high = (expr.evaluate(a, env) for a in args)
            values = rng.integers(low, high, size, endpoint=True, dtype=np.int64 if param.type != "uint64" else np.uint64)
        case "zeros":
            # All-zero bits are 0 in every element type (bfloat16 included); calloc'd pages cost nothing until written.
            return np.zeros(size, dtype=NUMPY_DTYPES[param.type])
        case "ones":
            values = np.ones(size)
        case "fill":
            values = np.full(size, float(args[0]))
        case "arange":
            values = np.arange(size, dtype=np.int64)
        case "list":
            items = np.array([float(a) for a in args])
            values = np.resize(items, size)
        case "perm":
            values = rng.permutation(size).astype(np.int64)
        case "csr_rowptr":
            rows, k = (expr.evaluate(a, env) for a in args)
            values = np.arange(rows + 1, dtype=np.int64) * k
        case "csr_colidx":
            rows, cols, k = (expr.evaluate(a, env) for a in args)
            values = _csr_colidx(rng, rows, cols, k)
        case "file":
            if files is None or args[0] not in files:
                raise InputError(f"{param.name}: file({args[0]}) was not loaded")
            loaded = np.asarray(files[args[0]])
            expected = NUMPY_DTYPES[param.type]
            if loaded.dtype != expected:
                raise InputError(f"{param.name}: file({args[0]}) holds {loaded.dtype}, the spec says {param.type} ({expected})")
            if loaded.size != size:
                raise InputError(f"{param.name}: file({args[0]}) holds {loaded.size} elements, the spec's size is {size}")
            return np.ascontiguousarray(loaded.reshape(-1))
        case _:
            raise InputError(f"{param.name}: unknown initializer {kind}")
    if param.type not in FLOAT_TYPES and kind in ("fill", "list"):
        values = np.rint(values).astype(np.int64)
    return np.ascontiguousarray(_cast(np.asarray(values), param.type))


def make_inputs(spec: Spec, seed: int, variant: int | None = None, files: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every array of the spec at the main size (or ``variants[variant]``), drawn from ``seed``."""
    resolved = spec.resolve(variant)
    env = {k: int(v) for k, v in resolved.values.items() if isinstance(v, int)}
    arrays = spec.arrays
    children = np.random.SeedSequence(seed).spawn(len(arrays))
    return {
        p.name: make_array(p, resolved.sizes[p.name], env, np.random.default_rng(child), files)
        for p, child in zip(arrays, children)
    }


def scalar_args(spec: Spec, variant: int | None = None) -> dict[str, np.generic]:
    """The by-value arguments as numpy scalars of the right width."""
    values = spec.values(variant)
    return {p.name: NUMPY_DTYPES[p.type].type(values[p.name]) for p in spec.scalars}


def file_names(spec: Spec) -> tuple[str, ...]:
    """The ``file(NAME.npy)`` names the caller must load (relative to ``spec.base_dir``)."""
    return tuple(p.init.args[0] for p in spec.arrays if p.init.kind == "file")


# --- counter-based inputs, drawn on the device -----------------------------------------------------

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15

#: Kind codes of the harness's generator kernels (services/harness/device_kernels.py).
KIND_UNIFORM, KIND_NORMAL, KIND_FILL, KIND_ARANGE, KIND_RANDINT = range(5)

#: Generator kernel for each element type: one per storage width for integers (the bits of a
#: signed and an unsigned value are the same), one per float type.
GEN_KERNELS: dict[str, str] = {
    "float32": "klsp_gen_f32", "float16": "klsp_gen_f16", "bfloat16": "klsp_gen_bf16", "float64": "klsp_gen_f64",
    "int8": "klsp_gen_i8", "uint8": "klsp_gen_i8", "int32": "klsp_gen_i32", "uint32": "klsp_gen_i32",
    "int64": "klsp_gen_i64", "uint64": "klsp_gen_i64",
}


@dataclass(frozen=True)
class DevicePlan:
    """How the generator kernel draws one array: ``kernel(out, size, key, kind, a, b)``.

    Floats: ``value = draw * a + b`` (uniform: ``a = high - low``, ``b = low``; normal:
    ``a = std``, ``b = mean``; fill: ``a`` itself). Integers: ``a`` is the low bound (or the
    fill value) and ``b`` the span ``high - low + 1``, both as unsigned 64-bit words.
    """

    kernel: str
    size: int
    key: int
    kind: int
    a: float | int
    b: float | int


def _splitmix(z: int) -> int:
    z = (z + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def array_key(seed: int, index: int) -> int:
    """The generator key of the ``index``-th array for ``seed``: unrelated keys for unrelated pairs."""
    return _splitmix((_splitmix(seed & _M64) + index) & _M64)


def device_plan(param: ArrayParam, size: int, env: Mapping[str, int], seed: int, index: int) -> DevicePlan | None:
    """The device draw of ``param`` for ``seed`` (``index``: its position among the spec's arrays),
    or None when its initializer needs the host (``list``, ``perm``, the CSR structure, ``file``).

    The values differ from :func:`make_array`'s for the same seed (another generator); both
    kernels of a verification see the same ones, which is all a comparison needs.
    """
    problem = check_init_at(param.init, param.type, size, env)
    if problem:
        raise InputError(f"{param.name}: {problem}")
    kind, args = param.init.kind, param.init.args
    kernel, key = GEN_KERNELS[param.type], array_key(seed, index)
    if param.type in FLOAT_TYPES:
        match kind:
            case "uniform":
                low, high = float(args[0]), float(args[1])
                return DevicePlan(kernel, size, key, KIND_UNIFORM, high - low, low)
            case "normal":
                return DevicePlan(kernel, size, key, KIND_NORMAL, float(args[1]), float(args[0]))
            case "zeros" | "ones" | "fill":
                value = {"zeros": 0.0, "ones": 1.0}.get(kind) if kind != "fill" else float(args[0])
                return DevicePlan(kernel, size, key, KIND_FILL, value, 0.0)
            case "arange":
                return DevicePlan(kernel, size, key, KIND_ARANGE, 0.0, 0.0)
        return None
    match kind:
        case "randint":
            low, high = (expr.evaluate(a, env) for a in args)
            return DevicePlan(kernel, size, key, KIND_RANDINT, low & _M64, (high - low + 1) & _M64)
        case "zeros" | "ones" | "fill":
            value = {"zeros": 0, "ones": 1}.get(kind) if kind != "fill" else int(np.rint(float(args[0])))
            return DevicePlan(kernel, size, key, KIND_FILL, value & _M64, 0)
        case "arange":
            return DevicePlan(kernel, size, key, KIND_ARANGE, 0, 0)
    return None


def _mix_array(key: int, n: int) -> np.ndarray:
    """``klsp_mix(key, i)`` for i in 0..n-1 (uint64 arithmetic wraps like the device's)."""
    z = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_GOLDEN) + np.uint64(key)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def counter_values(plan: DevicePlan, array_type: str) -> np.ndarray:
    """The values the generator kernel writes for ``plan``, computed on the host (its numpy twin).

    Used by the CPU tests' stand-in for the device; the same formulas as the kernels, rounded the
    same way (every float step is one IEEE operation in the stated width).
    """
    n = plan.size
    index = np.arange(n, dtype=np.uint64)
    if array_type in FLOAT_TYPES:
        wide = array_type == "float64"
        work = np.float64 if wide else np.float32
        z = _mix_array(plan.key, n)
        if plan.kind == KIND_UNIFORM:
            u = (z >> np.uint64(11 if wide else 40)).astype(work) * work(2.0**-53 if wide else 2.0**-24)
            values = u * work(plan.a) + work(plan.b)
        elif plan.kind == KIND_NORMAL:
            if wide:
                u1 = ((z >> np.uint64(11)) + np.uint64(1)).astype(work) * work(2.0**-53)
                u2 = (_mix_array(plan.key ^ 0xD1B54A32D192ED03, n) >> np.uint64(11)).astype(work) * work(2.0**-53)
            else:
                u1 = ((z >> np.uint64(40)) + np.uint64(1)).astype(work) * work(2.0**-24)
                u2 = ((z >> np.uint64(16)) & np.uint64(0xFFFFFF)).astype(work) * work(2.0**-24)
            values = (np.sqrt(work(-2.0) * np.log(u1)) * np.cos(work(2 * np.pi) * u2)).astype(work) * work(plan.a) + work(plan.b)
        elif plan.kind == KIND_ARANGE:
            values = index.astype(work)
        else:
            values = np.full(n, plan.a, dtype=work)
        return _cast(values.astype(work, copy=False), array_type)
    if plan.kind == KIND_RANDINT:
        z = _mix_array(plan.key, n)
        bits = np.uint64(plan.a) + (z % np.uint64(plan.b) if plan.b else z)
    elif plan.kind == KIND_ARANGE:
        bits = index
    else:
        bits = np.full(n, plan.a, dtype=np.uint64)
    dtype = NUMPY_DTYPES[array_type]
    return bits.astype(np.dtype(f"u{dtype.itemsize}")).view(dtype)


def draw_arrays(spec: Spec, seed: int, variant: int | None, files: Mapping[str, np.ndarray] | None = None) -> dict[str, DevicePlan | np.ndarray]:
    """Every ``in``/``inout`` array of the spec for ``seed``: a :class:`DevicePlan` where the device
    can draw it, else the host array (drawn as :func:`make_inputs` would). ``out`` arrays are left out.
    """
    resolved = spec.resolve(variant)
    env = {k: int(v) for k, v in resolved.values.items() if isinstance(v, int)}
    children = np.random.SeedSequence(seed).spawn(len(spec.arrays))
    drawn: dict[str, DevicePlan | np.ndarray] = {}
    for index, (p, child) in enumerate(zip(spec.arrays, children)):
        if p.role == "out":
            continue
        size = resolved.sizes[p.name]
        plan = device_plan(p, size, env, seed, index)
        drawn[p.name] = plan if plan is not None else make_array(p, size, env, np.random.default_rng(child), files)
    return drawn
