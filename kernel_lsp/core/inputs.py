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
