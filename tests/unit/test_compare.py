"""Comparison rules: tolerance, norm guard, NaN/Inf, poison, integers, bit-exact input checks."""

import numpy as np
import pytest

from kernel_lsp.core.compare import arrays_equal, compare, poison, poison_mask
from kernel_lsp.core.inputs import NUMPY_DTYPES, float32_to_bf16
from kernel_lsp.core.spec import Tolerance

TOL = Tolerance(1e-5, 1e-6)


def test_equal_arrays_pass_with_zero_error():
    r = np.linspace(-1, 1, 1000, dtype=np.float32)
    result = compare("y", "float32", r, r.copy(), TOL)
    assert result.ok and result.max_abs_error == 0 and result.rel_norm_error == 0


def test_rounding_differences_pass():
    rng = np.random.default_rng(0)
    r = rng.uniform(-1, 1, 10000).astype(np.float32)
    c = (r.astype(np.float64) * (1 + rng.uniform(-2e-7, 2e-7, r.size))).astype(np.float32)
    result = compare("y", "float32", r, c, TOL)
    assert result.ok and 0 < result.max_rel_error < 1e-6


def test_elementwise_tolerance_rejects_and_reports_the_first_bad_index():
    r = np.ones(100, dtype=np.float32)
    c = r.copy()
    c[37] = 1.001
    result = compare("y", "float32", r, c, TOL)
    assert not result.ok and result.reason == "mismatch" and "index 37" in result.message and result.bad_elements == 1
    assert result.max_abs_error == pytest.approx(1e-3, rel=1e-3)


def test_zeros_for_tiny_values_are_rejected_by_the_norm_guard():
    # True values ~1e-8: all-zeros is within atol=1e-6 element by element (KernelBench issue #165).
    rng = np.random.default_rng(1)
    r = rng.uniform(-1e-8, 1e-8, 4096).astype(np.float32)
    c = np.zeros_like(r)
    assert (np.abs(c - r) <= TOL.atol + TOL.rtol * np.abs(r)).all()
    result = compare("y", "float32", r, c, TOL)
    assert not result.ok and result.reason == "mismatch" and "relative error norm" in result.message
    assert result.rel_norm_error == pytest.approx(1.0)


def test_norm_guard_allows_honest_noise_in_tiny_values():
    rng = np.random.default_rng(2)
    r = rng.uniform(-1e-8, 1e-8, 4096).astype(np.float32)
    c = (r * (1 + rng.uniform(-1e-6, 1e-6, r.size))).astype(np.float32)
    assert compare("y", "float32", r, c, TOL).ok


def test_all_zero_reference_skips_the_guard():
    r = np.zeros(10, dtype=np.float32)
    c = np.full(10, 5e-7, dtype=np.float32)
    result = compare("y", "float32", r, c, TOL)
    assert result.ok and result.rel_norm_error is None


def test_nan_or_inf_where_the_reference_is_finite():
    r = np.ones(10, dtype=np.float32)
    for bad in (np.nan, np.inf, -np.inf):
        c = r.copy()
        c[4] = bad
        result = compare("y", "float32", r, c, TOL)
        assert not result.ok and result.reason == "nan_or_inf" and "index 4" in result.message


def test_nan_in_the_reference_must_be_matched():
    r = np.array([1, np.nan, np.inf], dtype=np.float32)
    assert compare("y", "float32", r, r.copy(), TOL).ok
    c = np.array([1, 0, np.inf], dtype=np.float32)
    assert compare("y", "float32", r, c, TOL).reason == "mismatch"
    c = np.array([1, np.nan, -np.inf], dtype=np.float32)
    assert compare("y", "float32", r, c, TOL).reason == "mismatch"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64"])
def test_unwritten_poison_is_a_mismatch_not_a_nan(dtype):
    values = np.arange(50) % 7
    reference = float32_to_bf16(values.astype(np.float32)) if dtype == "bfloat16" else values.astype(NUMPY_DTYPES[dtype])
    candidate = reference.copy()
    candidate[40:] = poison(dtype, 10)
    assert poison_mask(candidate, dtype)[40:].all() and not poison_mask(candidate, dtype)[:40].any()
    result = compare("y", dtype, reference, candidate, Tolerance(1e-2, 1e-3), poisoned=True)
    assert not result.ok and result.reason == "mismatch" and "10 of 50 elements never written" in result.message


def test_poison_floats_are_nan_and_ints_are_sentinels():
    assert np.isnan(poison("float32", 3)).all() and np.isnan(poison("float16", 3)).all() and np.isnan(poison("float64", 3)).all()
    assert poison("int32", 2).tolist() == [np.uint32(0xA5A5A5A5).view(np.int32)] * 2


def test_integers_compare_exactly():
    r = np.arange(10, dtype=np.int32)
    c = r.copy()
    assert compare("h", "int32", r, c, Tolerance(1, 1)).ok
    c[3] += 1
    result = compare("h", "int32", r, c, Tolerance(1, 1))  # a float tolerance does not apply to integers
    assert not result.ok and "index 3" in result.message and result.max_abs_error == 1


def test_float16_uses_its_own_tolerance():
    r = np.linspace(1, 2, 100).astype(np.float16)
    c = (r.astype(np.float32) * 1.004).astype(np.float16)
    assert compare("y", "float16", r, c, Tolerance(1e-2, 1e-3)).ok
    assert not compare("y", "float16", r, c, Tolerance(1e-5, 1e-6)).ok


def test_bfloat16_compares_as_numbers():
    r = float32_to_bf16(np.linspace(1, 2, 64, dtype=np.float32))
    c = float32_to_bf16(np.linspace(1, 2, 64, dtype=np.float32) * 1.5)
    assert compare("y", "bfloat16", r, r.copy(), Tolerance(1e-2, 1e-3)).ok
    assert compare("y", "bfloat16", r, c, Tolerance(1e-2, 1e-3)).reason == "mismatch"


def test_shape_mismatch():
    assert compare("y", "float32", np.zeros(3, np.float32), np.zeros(4, np.float32), TOL).reason == "mismatch"


def test_arrays_equal_is_bit_exact():
    a = np.array([1.0, np.nan, -0.0], dtype=np.float32)
    assert arrays_equal(a, a.copy())
    b = a.copy()
    b[2] = 0.0  # -0.0 == 0.0 numerically, but the bits changed
    assert not arrays_equal(a, b)


def test_chunked_statistics_match_whole_array_ones(monkeypatch):
    # compare() works a chunk at a time; counts, the first bad index and the maxima must not depend on the chunking.
    import kernel_lsp.core.compare as compare_module

    monkeypatch.setattr(compare_module, "_CHUNK", 1000)
    rng = np.random.default_rng(3)
    r = rng.uniform(-1, 1, 10_500).astype(np.float32)
    r[[5, 2500]] = 0.0
    c = (r.astype(np.float64) * (1 + rng.uniform(-3e-6, 3e-6, r.size))).astype(np.float32)
    c[[1999, 2000, 10_499]] += np.float32(0.01)
    result = compare("y", "float32", r, c, TOL)
    abs_err = np.abs(c - r)
    bad = abs_err > TOL.atol + TOL.rtol * np.abs(r)
    nz = r != 0
    assert not result.ok and result.bad_elements == int(bad.sum()) >= 3
    assert f"first at finite index {int(np.flatnonzero(bad)[0])}:" in result.message
    assert result.max_abs_error == float(abs_err.max())
    assert result.max_rel_error == float((abs_err[nz] / np.abs(r[nz])).max())
    exact = np.linalg.norm(abs_err.astype(np.float64)) / np.linalg.norm(r.astype(np.float64))
    assert result.rel_norm_error == pytest.approx(exact, rel=1e-12)


def test_norm_guard_on_float32_values_whose_squares_overflow_float32():
    r = np.full(1000, 3e38, dtype=np.float32)
    c = r * np.float32(0.999)
    result = compare("y", "float32", r, c, Tolerance(1e-2, 0.0))
    assert result.ok and result.rel_norm_error == pytest.approx(1e-3, rel=1e-3)


def test_unwritten_elements_are_found_when_the_reference_itself_holds_poison():
    r = np.arange(10, dtype=np.float32)
    r[3] = poison("float32", 1)[0]
    c = poison("float32", 10)
    result = compare("y", "float32", r, c, TOL, poisoned=True)
    assert not result.ok and result.bad_elements == 9 and "first at index 0" in result.message


def test_a_value_written_where_the_reference_left_poison_is_a_mismatch_even_a_nan():
    r = np.arange(10, dtype=np.float32)
    r[7:] = poison("float32", 3)
    for written in (0.0, np.nan):
        c = r.copy()
        c[8] = written
        result = compare("y", "float32", r, c, TOL, poisoned=True)
        assert not result.ok and "1 of 10 elements written where the original writes none (first at index 8)" in result.message


# --- the device's summary ---------------------------------------------------------------------------

from kernel_lsp.core.compare import tolerance_summary  # noqa: E402


def _case(rng, array_type, n=257):
    """A reference and a candidate of ``array_type``: rounding noise, with some cases of every rule broken."""
    scale = rng.choice([1e-6, 1.0, 1e3])
    r64 = rng.uniform(-1, 1, n) * scale
    c64 = r64 * (1 + rng.uniform(-1, 1, n) * rng.choice([1e-8, 1e-6, 1e-4, 1e-2]))
    if rng.random() < 0.3:
        c64[rng.integers(n)] += rng.choice([1e-3, 1.0])
    if array_type == "bfloat16":
        r, c = float32_to_bf16(r64.astype(np.float32)), float32_to_bf16(c64.astype(np.float32))
    else:
        r, c = r64.astype(NUMPY_DTYPES[array_type]), c64.astype(NUMPY_DTYPES[array_type])
    for _ in range(rng.integers(0, 3)):
        kind, i = rng.integers(4), rng.integers(n)
        if kind == 0:
            r[i:i + 3], c[i:i + 3] = poison(array_type, r[i:i + 3].size), poison(array_type, c[i:i + 3].size)
        elif kind == 1:
            c[i] = poison(array_type, 1)[0]
        elif kind == 2:
            bad = np.array([rng.choice([np.nan, np.inf, -np.inf])])
            c[i] = float32_to_bf16(bad.astype(np.float32))[0] if array_type == "bfloat16" else bad.astype(NUMPY_DTYPES[array_type])[0]
        else:
            r[i] = c[i] = (float32_to_bf16(np.array([np.inf], np.float32)) if array_type == "bfloat16" else np.array([np.inf]).astype(NUMPY_DTYPES[array_type]))[0]
    return r, c


@pytest.mark.parametrize("array_type", ["float32", "float16", "bfloat16", "float64"])
def test_a_summary_that_proves_a_match_agrees_with_the_host_rules(array_type):
    rng = np.random.default_rng(7)
    proved = 0
    for _ in range(300):
        r, c = _case(rng, array_type)
        tolerance = Tolerance(*[(1e-5, 1e-6), (1e-2, 1e-3), (1e-10, 1e-12)][rng.integers(3)])
        result = compare("y", array_type, r, c, tolerance, poisoned=True)
        summary = tolerance_summary(r, c, array_type, tolerance, poisoned=True)
        if summary.proves_match(array_type, tolerance):
            proved += 1
            assert result.ok
            assert summary.max_abs_error == result.max_abs_error and summary.max_rel_error == result.max_rel_error
        elif summary.special == 0 and summary.bad == 0 and result.rel_norm_error is not None:
            # Not proved although no element broke a rule: only the norm guard can have failed.
            bound = max(tolerance.rtol, 4 * {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}[array_type])
            assert result.rel_norm_error > bound * (1 - 1e-6)
        if not result.ok:
            assert not summary.proves_match(array_type, tolerance)
    assert 30 < proved < 300


def test_a_summary_sends_every_unjudgeable_element_to_the_host():
    r = np.array([1, 2, np.nan, np.inf, 5], dtype=np.float32)
    assert tolerance_summary(r, r.copy(), "float32", TOL, True).special == 0
    c = r.copy()
    c[2], c[3] = 0, -np.inf
    assert tolerance_summary(r, c, "float32", TOL, True).special == 2
    c = r.copy()
    c[0] = poison("float32", 1)[0]
    assert tolerance_summary(r, c, "float32", TOL, True).special == 1 and tolerance_summary(r, c, "float32", TOL, False).special == 1
    summary = tolerance_summary(np.ones(4, np.float32), np.full(4, 1.5, np.float32), "float32", TOL, False)
    assert summary.bad == 4 and summary.max_abs_error == 0.5 and summary.max_rel_error == 0.5 and summary.err_sq == 1.0


# --- red zones ---------------------------------------------------------------------------------

from kernel_lsp.core.compare import GUARD_BYTES, check_guards, guard_expected  # noqa: E402


@pytest.mark.parametrize("array_type", ["float16", "bfloat16", "float32", "float64"])
def test_float_input_red_zones_read_as_nan_in_every_width(array_type):
    from kernel_lsp.core.inputs import NUMPY_DTYPES, bf16_to_float32

    zone = guard_expected(array_type, "in", 64).view(NUMPY_DTYPES[array_type])
    values = bf16_to_float32(zone) if array_type == "bfloat16" else zone.astype(np.float64)
    assert np.isnan(values).all()


def test_integer_and_output_red_zones_are_byte_patterns():
    assert (guard_expected("int32", "in", 8) == 0xA5).all()
    assert (guard_expected("float32", "out", 8) == 0x5A).all() and (guard_expected("int8", "inout", 3) == 0x5A).all()
    assert GUARD_BYTES % 256 == 0  # arrays stay at cudaMalloc's alignment


def test_untouched_red_zones_pass():
    zone = guard_expected("float32", "out", 1024)
    assert check_guards("z", "float32", "out", 100, zone, zone.copy()) is None


def test_a_store_after_the_end_names_the_element():
    front, back = guard_expected("float32", "out", 1024), guard_expected("float32", "out", 1024).copy()
    back[8:12] = 0
    message = check_guards("z", "float32", "out", 100, front, back)
    assert "'z' (100 elements)" in message and "4 bytes of the red zone after it" in message and "z[102]" in message and "byte offset 408" in message


def test_a_store_before_the_start_names_the_nearest_element():
    front, back = guard_expected("int32", "in", 1024).copy(), guard_expected("int32", "in", 1024)
    front[-8:-4] = 0
    front[100] = 1
    message = check_guards("idx", "int32", "in", 10, front, back)
    assert "before it" in message and "idx[-2]" in message and "5 bytes" in message
