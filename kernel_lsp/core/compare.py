"""Comparing a rewrite's outputs with the original kernel's.

Rules, in the order they are applied to one output array:

1. **Unwritten elements.** ``out`` buffers start as a poison pattern (:func:`poison`):
   a quiet NaN with a payload no arithmetic produces, or a byte sentinel for
   integers. An element the reference wrote but the candidate left as poison is a
   mismatch ("never written"), so a kernel that skips work cannot hide behind NaN
   rules; so is an element the candidate wrote where the reference left poison
   (whatever the value, a NaN included).
2. **NaN/Inf** in the candidate where the reference has a finite value → ``nan_or_inf``.
   Where the reference itself is NaN/Inf the candidate must match it in kind.
3. **Element-wise tolerance** (the spec's rule): ``|c - r| <= atol + rtol * |r|``.
   Integer outputs compare exactly.
4. **Relative-norm guard**: ``||c - r||_2 <= bound * ||r||_2`` with
   ``bound = max(rtol, 4 * eps(dtype))``. There is deliberately no ``atol`` term:
   when every true value is tiny, an all-zeros output passes rule 3 through
   ``atol`` but has ``||c - r|| / ||r|| = 1`` and fails here. Honest rewrites that
   only reorder float arithmetic sit far below ``rtol`` in norm (rounding errors
   are relative), so the guard costs nothing to them. The ``4 * eps`` floor keeps
   a spec with ``rtol=0`` from demanding more than rounding allows. When
   ``||r|| == 0`` the guard is skipped (rule 3 already bounds ``|c| <= atol``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernel_lsp.core.inputs import NUMPY_DTYPES, bf16_to_float32
from kernel_lsp.core.spec import FLOAT_TYPES, Tolerance

#: Poison bit patterns, one per element type: NaN payloads for floats, byte sentinels for integers.
POISON_BITS: dict[str, int] = {
    "float16": 0x7E5A,
    "bfloat16": 0x7FE5,
    "float32": 0x7FC5A5A5,
    "float64": 0x7FF8A5A5A5A5A5A5,
    "int8": 0xA5,
    "uint8": 0xA5,
    "int32": 0xA5A5A5A5,
    "uint32": 0xA5A5A5A5,
    "int64": 0xA5A5A5A5A5A5A5A5,
    "uint64": 0xA5A5A5A5A5A5A5A5,
}

_UINT_OF_WIDTH = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def poison(array_type: str, size: int) -> np.ndarray:
    """An array of ``size`` poison elements of ``array_type``."""
    dtype = NUMPY_DTYPES[array_type]
    bits = np.full(size, POISON_BITS[array_type], dtype=_UINT_OF_WIDTH[dtype.itemsize])
    return bits.view(dtype)


def poison_mask(values: np.ndarray, array_type: str) -> np.ndarray:
    """True where ``values`` still hold the poison pattern bit for bit."""
    dtype = NUMPY_DTYPES[array_type]
    bits = np.ascontiguousarray(values).view(_UINT_OF_WIDTH[dtype.itemsize])
    return bits == POISON_BITS[array_type]


@dataclass(frozen=True)
class CompareResult:
    ok: bool
    reason: str | None
    """None when ok; else ``mismatch`` or ``nan_or_inf``."""
    message: str
    max_abs_error: float | None
    max_rel_error: float | None
    """Over elements whose reference is nonzero."""
    rel_norm_error: float | None
    """``||c - r||_2 / ||r||_2``; None when ``||r|| == 0`` or for integer outputs."""
    bad_elements: int


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def compare(name: str, array_type: str, reference: np.ndarray, candidate: np.ndarray, tolerance: Tolerance, poisoned: bool = False) -> CompareResult:
    """Compare one output array; ``poisoned`` says the buffer started as :func:`poison`."""
    if reference.shape != candidate.shape:
        return CompareResult(False, "mismatch", f"{name}: shape {candidate.shape} differs from {reference.shape}", None, None, None, reference.size)
    n = reference.size
    if n == 0:
        return CompareResult(True, None, "", 0.0, 0.0, None, 0)
    if arrays_equal(reference, candidate):
        # Bit-identical (the usual case for deterministic rewrites and for repeat runs): nothing to measure.
        return CompareResult(True, None, "", 0.0, 0.0, 0.0, 0)
    if poisoned:
        # Mask the reference only when the candidate holds poison at all (never, for a rewrite that writes everything).
        still_poison = poison_mask(candidate, array_type)
        unwritten = still_poison & ~poison_mask(reference, array_type) if still_poison.any() else still_poison
        if unwritten.any():
            count = int(unwritten.sum())
            return CompareResult(False, "mismatch", f"{name}: {count} of {n} elements never written (first at index {_first(unwritten)})", None, None, None, count)
        # The other way round, bit for bit: a NaN stored where the original stores nothing would pass the NaN rule.
        reference_poison = poison_mask(reference, array_type)
        extra = reference_poison & ~still_poison if reference_poison.any() else reference_poison
        if extra.any():
            count = int(extra.sum())
            return CompareResult(False, "mismatch", f"{name}: {count} of {n} elements written where the original writes none "
                                 f"(first at index {_first(extra)})", None, None, None, count)
    if array_type not in FLOAT_TYPES:
        diff_mask = reference != candidate
        r = reference.astype(np.float64)
        c = candidate.astype(np.float64)
        abs_err = np.abs(c - r)
        max_abs = float(abs_err.max())
        nz = r != 0
        max_rel = float((abs_err[nz] / np.abs(r[nz])).max()) if nz.any() else 0.0
        if diff_mask.any():
            i = _first(diff_mask)
            return CompareResult(False, "mismatch", f"{name}: {int(diff_mask.sum())} of {n} integer elements differ (first at index {i}: {candidate[i]} vs {reference[i]})", max_abs, max_rel, None, int(diff_mask.sum()))
        return CompareResult(True, None, "", max_abs, max_rel, None, 0)

    # float64 arrays compare in float64, the narrower types in float32 (exact for fp16/bf16, and half the
    # memory traffic of float64 for 64M-element float32 outputs).
    work = np.float64 if array_type == "float64" else np.float32
    r = _as_work(reference, array_type, work)
    c = _as_work(candidate, array_type, work)
    r_finite_all, c_finite_all = bool(np.isfinite(r).all()), bool(np.isfinite(c).all())
    if not (r_finite_all and c_finite_all):
        r_finite, c_finite = np.isfinite(r), np.isfinite(c)
        new_nonfinite = r_finite & ~c_finite
        if new_nonfinite.any():
            i = _first(new_nonfinite)
            return CompareResult(False, "nan_or_inf", f"{name}: {int(new_nonfinite.sum())} of {n} elements are NaN/Inf where the original's are finite (first at index {i}: {c[i]})", None, None, None, int(new_nonfinite.sum()))
        # Where the reference is NaN the candidate must be NaN; where it is +-Inf, the same Inf.
        r_nan, c_nan = np.isnan(r), np.isnan(c)
        kind_differs = (~r_finite) & ((r_nan != c_nan) | (~r_nan & (r != c)))
        if kind_differs.any():
            i = _first(kind_differs)
            return CompareResult(False, "mismatch", f"{name}: at index {i} the original gives {r[i]} and the rewrite {c[i]}", None, None, None, int(kind_differs.sum()))
        r, c = r[r_finite], c[r_finite]

    stats = _float_stats(r, c, tolerance.atol, tolerance.rtol)
    max_abs, max_rel = stats.max_abs, stats.max_rel
    rel_norm = stats.err_norm / stats.ref_norm if stats.ref_norm > 0 else None
    if stats.bad_count:
        i = stats.first_bad
        return CompareResult(
            False, "mismatch",
            f"{name}: {stats.bad_count} of {n} elements outside atol={tolerance.atol:g} + rtol={tolerance.rtol:g}*|ref| "
            f"(first at finite index {i}: {float(c[i])!r} vs {float(r[i])!r}; max abs error {max_abs:.3g})",
            max_abs, max_rel, rel_norm, stats.bad_count,
        )
    bound = max(tolerance.rtol, 4 * _EPS[array_type])
    if rel_norm is not None and rel_norm > bound:
        return CompareResult(
            False, "mismatch",
            f"{name}: relative error norm ||c-r||/||r|| = {rel_norm:.3g} exceeds {bound:.3g} "
            "(every element is within atol, but the values are wrong relative to their size)",
            max_abs, max_rel, rel_norm, 0,
        )
    return CompareResult(True, None, "", max_abs, max_rel, rel_norm, 0)


def _as_work(values: np.ndarray, array_type: str, work: type) -> np.ndarray:
    if array_type == "bfloat16":
        return bf16_to_float32(values)
    return np.asarray(values).astype(work, copy=False)


#: Float comparisons run this many elements at a time, so the temporaries of one chunk stay in cache
#: (64K elements measured fastest: 3x faster than whole-array passes on 64M float32 elements, 1M is no faster).
_CHUNK = 1 << 16


@dataclass(frozen=True)
class _FloatStats:
    max_abs: float
    max_rel: float
    bad_count: int
    first_bad: int
    """-1 when no element is outside the tolerance."""
    err_norm: float
    ref_norm: float


def _float_stats(r: np.ndarray, c: np.ndarray, atol: float, rtol: float) -> _FloatStats:
    """Error statistics of finite ``c`` against finite ``r``, a chunk at a time.

    Each chunk applies the same elementwise expressions in the working dtype
    that a whole-array computation would (so errors, ratios and the tolerance
    test give the same values); only the 2-norms differ, being accumulated in
    float64 (exact squares of float32 values, no overflow, no scaling pass).
    """
    max_abs = max_rel = 0.0
    bad_count, first_bad = 0, -1
    err_sq = ref_sq = 0.0
    exact_squares = r.dtype.itemsize <= 4
    # Preallocated per-chunk buffers: fresh 256 KB temporaries cost page faults on every chunk (3x slower).
    width = min(_CHUNK, r.size)
    abs_err_buf, abs_ref_buf = np.empty(width, r.dtype), np.empty(width, r.dtype)
    limit_buf, rel_buf = np.empty(width, r.dtype), np.empty(width, r.dtype)
    mask_buf = np.empty(width, bool)
    wide_buf = np.empty(width, np.float64)
    for start in range(0, r.size, _CHUNK):
        rc, cc = r[start : start + _CHUNK], c[start : start + _CHUNK]
        m = rc.size
        abs_err, abs_ref, limit, rel, mask, wide = abs_err_buf[:m], abs_ref_buf[:m], limit_buf[:m], rel_buf[:m], mask_buf[:m], wide_buf[:m]
        np.abs(np.subtract(cc, rc, out=abs_err), out=abs_err)
        np.abs(rc, out=abs_ref)
        max_abs = max(max_abs, float(abs_err.max()))
        rel.fill(0)
        np.divide(abs_err, abs_ref, out=rel, where=np.not_equal(abs_ref, 0, out=mask))
        max_rel = max(max_rel, float(rel.max()))
        # abs_err > atol + rtol * abs_ref, in the working dtype.
        np.multiply(abs_ref, rtol, out=limit)
        np.add(limit, atol, out=limit)
        bad = np.greater(abs_err, limit, out=mask)
        count = int(np.count_nonzero(bad))
        if count and first_bad < 0:
            first_bad = start + _first(bad)
        bad_count += count
        if exact_squares:
            # Not np.dot: BLAS hands each small chunk to its threads, and waiting for them costs seconds on a busy host.
            err_sq += float(np.square(abs_err, out=wide, dtype=np.float64).sum())
            ref_sq += float(np.square(abs_ref, out=wide, dtype=np.float64).sum())
    if exact_squares:
        err_norm, ref_norm = float(np.sqrt(err_sq)), float(np.sqrt(ref_sq))
    else:
        err_norm, ref_norm = _norm(np.abs(c - r)), _norm(r)
    return _FloatStats(max_abs, max_rel, bad_count, first_bad, err_norm, ref_norm)


def _norm(values: np.ndarray) -> float:
    """2-norm of a float64 array, scaled by the largest magnitude so the squares cannot overflow."""
    if values.size == 0:
        return 0.0
    scale = float(np.abs(values).max())
    if scale == 0.0 or not np.isfinite(scale):
        return scale
    scaled = values / values.dtype.type(scale)
    return scale * float(np.sqrt(np.dot(scaled, scaled)))


def arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equality (NaNs with equal bits are equal): the test that an ``in`` array is untouched."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    width = _UINT_OF_WIDTH[a.dtype.itemsize]
    return bool(np.array_equal(np.ascontiguousarray(a).view(width), np.ascontiguousarray(b).view(width)))


# --- the device's summary of a float comparison ---------------------------------------------------

#: How far inside the norm bound a device summary must be to stand for the host's comparison: the
#: device sums the squares in another order, which moves the norm in its last bits only.
_NORM_SLACK = 1e-9


@dataclass(frozen=True)
class ToleranceSummary:
    """What the harness's comparison kernel reports for two float arrays (its twin: :func:`tolerance_summary`).

    Only elements whose reference is finite are measured, as in :func:`compare`; elements where both
    are NaN, or both the same infinity, are skipped (the rules accept them).
    """

    bad: int
    """Elements outside ``atol + rtol * |r|`` (both finite)."""
    special: int
    """Elements the tolerance cannot judge: one side non-finite and the other not (or different
    infinities), or poison on one side only. Any of them sends the comparison to the host, which
    names the rule."""
    err_sq: float
    """Sum of ``(c - r)**2`` in float64 over measured elements."""
    ref_sq: float
    max_abs_error: float
    max_rel_error: float

    def proves_match(self, array_type: str, tolerance: Tolerance) -> bool:
        """Whether :func:`compare` on the same arrays would pass: no special or bad element and the
        relative norm inside its bound (by more than the device's rounding of the sums)."""
        if self.special or self.bad or not (np.isfinite(self.err_sq) and np.isfinite(self.ref_sq)):
            return False
        if array_type == "float64" and 0 < self.ref_sq < 1e-280:
            # The squares of tiny float64 values underflow on the device; the host scales them.
            return False
        if self.ref_sq == 0:
            # compare() skips the norm guard here: the elementwise rule already bounds |c| <= atol.
            return True
        bound = max(tolerance.rtol, 4 * _EPS[array_type])
        return float(np.sqrt(self.err_sq) / np.sqrt(self.ref_sq)) <= bound * (1 - _NORM_SLACK)


def tolerance_summary(reference: np.ndarray, candidate: np.ndarray, array_type: str, tolerance: Tolerance, poisoned: bool) -> ToleranceSummary:
    """The numpy twin of the device's comparison kernel (``klsp_close_*``): the same element rules in the
    same working precision as :func:`compare`, so the CPU tests and the fake device agree with the GPU."""
    work = np.float64 if array_type == "float64" else np.float32
    r = _as_work(reference, array_type, work)
    c = _as_work(candidate, array_type, work)
    r_finite, c_finite = np.isfinite(r), np.isfinite(c)
    both_skip = ~r_finite & ~c_finite & ((np.isnan(r) & np.isnan(c)) | (r == c))
    special = (r_finite != c_finite) | (~r_finite & ~c_finite & ~both_skip)
    if poisoned:
        special |= poison_mask(candidate, array_type) != poison_mask(reference, array_type)
    measured = r_finite & c_finite
    rm, cm = r[measured], c[measured]
    abs_err = np.abs(cm - rm)
    abs_ref = np.abs(rm)
    limit = abs_ref * work(tolerance.rtol) + work(tolerance.atol)
    rel = np.divide(abs_err, abs_ref, out=np.zeros_like(abs_err), where=abs_ref != 0)
    return ToleranceSummary(
        bad=int(np.count_nonzero(abs_err > limit)),
        special=int(np.count_nonzero(special)),
        err_sq=float(np.square(abs_err, dtype=np.float64).sum()),
        ref_sq=float(np.square(abs_ref, dtype=np.float64).sum()),
        max_abs_error=float(abs_err.max()) if abs_err.size else 0.0,
        max_rel_error=float(rel.max()) if rel.size else 0.0,
    )


# --- red zones ---------------------------------------------------------------------------------

#: Bytes of red zone before and after every array. A multiple of 256 keeps every array at the
#: alignment cudaMalloc gives (vector loads stay legal); 64 KiB reaches a row or more past the end
#: of the examples' matrices, so an off-by-one-row write lands in it rather than in another buffer.
GUARD_BYTES = 64 * 1024

#: Input red zones of floating-point arrays: 0x7FF8 in every 16-bit unit is a NaN read as float16,
#: bfloat16, float32 (0x7FF87FF8) and float64 (0x7FF87FF87FF87FF8), so a value read out of range
#: poisons whatever it is combined into: the output shows NaN where the original's has none.
INPUT_FLOAT_GUARD = (2, 0x7FF8)
#: Integer input red zones: 0xA5 bytes (int32 -1515870811): an index read out of range points far
#: outside every array, a count read out of range is absurd, either way the result changes.
INPUT_INT_GUARD = (1, 0xA5)
#: Output and in-out red zones: a pattern no honest store leaves; any change is a write out of range.
OUTPUT_GUARD = (1, 0x5A)


def guard_fill(array_type: str, role: str) -> tuple[int, int]:
    """(unit width in bytes, value) that fills the red zones of an array of this type and role."""
    if role != "in":
        return OUTPUT_GUARD
    return INPUT_FLOAT_GUARD if array_type in FLOAT_TYPES else INPUT_INT_GUARD


def guard_expected(array_type: str, role: str, nbytes: int) -> np.ndarray:
    """The bytes a red zone of ``nbytes`` holds while nothing wrote into it."""
    width, value = guard_fill(array_type, role)
    units = np.full(-(-nbytes // width), value, dtype=_UINT_OF_WIDTH[width])
    return units.view(np.uint8)[:nbytes]


def check_guards(name: str, array_type: str, role: str, size: int, front: np.ndarray, back: np.ndarray) -> str | None:
    """Why the red zones of array ``name`` (``size`` elements) show a write out of range, or None.

    ``front`` and ``back`` are the bytes just before and just after the array as read back after a
    launch. The message names the array, the side and the first changed element index relative to
    the array's start (negative before it), so the author can find the stray store.
    """
    itemsize = NUMPY_DTYPES[array_type].itemsize
    problems = []
    for side, zone in (("before", front), ("after", back)):
        changed = np.flatnonzero(np.asarray(zone, dtype=np.uint8) != guard_expected(array_type, role, zone.size))
        if not changed.size:
            continue
        if side == "before":
            # The byte nearest the array is the likeliest culprit (x[-1]); report the last changed one.
            offset = int(changed[-1]) - zone.size
        else:
            offset = size * itemsize + int(changed[0])
        index = offset // itemsize
        problems.append(f"{changed.size} bytes of the red zone {side} it changed (first at element {name}[{index}], byte offset {offset} from its start)")
    if not problems:
        return None
    return f"'{name}' ({size} elements) was written out of range: " + "; ".join(problems)
