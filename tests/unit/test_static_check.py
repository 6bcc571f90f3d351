"""Static pre-check: one test per rule (fires on the cheat, quiet on honest code), plus the signature check."""

import pytest

from kernel_lsp.core.spec import parse_spec
from kernel_lsp.core.static_check import RULES, check, check_signature, spec_type_matches

SPEC = parse_spec({
    "kernel": "scale",
    "params": [
        {"name": "n", "scalar": "int32", "value": 1048576},
        {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
        {"name": "y", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "inout"},
    ],
    "grid": ["(n+255)/256", 1, 1],
    "block": [256, 1, 1],
    "variants": [{"n": 5000}, {"n": 77}],
})

ORIGINAL = """
extern "C" __global__ void scale(int n, const float* x, float* y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i] + y[i];
}
"""


def rules(report, severity="error"):
    findings = report.errors if severity == "error" else report.warnings
    return [f.rule for f in findings]


def test_every_rule_has_a_rationale():
    assert all(r.rationale and r.severity in ("error", "warning") for r in RULES.values())


def test_the_original_itself_is_clean():
    report = check(ORIGINAL, ORIGINAL, SPEC)
    assert report.ok and not report.warnings


def test_honest_restrict_and_ldg_pass():
    honest = ORIGINAL.replace("const float* x, float* y", "const float* __restrict__ x, float* __restrict__ y").replace("2.0f * x[i]", "2.0f * __ldg(&x[i])")
    assert check(ORIGINAL, honest, SPEC).ok


def test_ldg_of_memory_the_kernel_writes():
    cheat = ORIGINAL.replace("y[i] = 2.0f * x[i] + y[i];", "y[i] = 2.0f * x[i] + __ldg(&y[i]);")
    report = check(ORIGINAL, cheat, SPEC)
    assert rules(report) == ["noncoherent-read-of-written-memory"]
    assert report.errors[0].line == 5 and "'y'" in report.errors[0].message


def test_const_restrict_pointer_written_through_a_cast_alias():
    cheat = """
extern "C" __global__ void scale(int n, const float* __restrict__ x, float* y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float* scratch = (float*)x;
    if (i < n) { scratch[i] = 2.0f * x[i]; y[i] += scratch[i]; }
}
"""
    report = check(ORIGINAL, cheat, SPEC)
    assert rules(report) == ["noncoherent-read-of-written-memory"]
    assert report.errors[0].line == 6


def test_problem_size_literal():
    cheat = ORIGINAL.replace("if (i < n)", "if (n == 1048576 || i < n)")
    report = check(ORIGINAL, cheat, SPEC)
    assert rules(report) == ["problem-size-literal"] and report.errors[0].line == 5
    assert "'n'" in report.errors[0].message


def test_problem_size_literal_in_a_define_and_in_a_variant():
    cheat = "#define SPECIAL 5000\n" + ORIGINAL
    report = check(ORIGINAL, cheat, SPEC)
    assert rules(report) == ["problem-size-literal"] and "variants[0]" in report.errors[0].message


def test_size_literal_the_original_has_is_fine_and_small_constants_are_ignored():
    original = ORIGINAL.replace("if (i < n)", "if (n != 1048576 && i < n)")
    assert check(original, original, SPEC).ok
    # 77 is variants[1]'s n, but small constants are tile/block sizes far more often than special cases.
    assert check(ORIGINAL, ORIGINAL.replace("2.0f", "(float)77"), SPEC).ok


def test_size_literal_in_a_comment_is_not_code():
    assert check(ORIGINAL, "// tuned for n = 1048576\n" + ORIGINAL, SPEC).ok


def test_device_global_state_is_a_warning():
    cheat = """
__device__ int launches = 0;
extern "C" __global__ void scale(int n, const float* x, float* y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (atomicAdd(&launches, 1) > 1000000) return;
    if (i < n) y[i] = 2.0f * x[i] + y[i];
}
"""
    report = check(ORIGINAL, cheat, SPEC)
    assert report.ok and rules(report, "warning") == ["device-global-state"]
    assert report.warnings[0].line == 6


def test_device_global_only_written_is_not_state():
    code = "__device__ float last;\n" + ORIGINAL.replace("y[i] = 2.0f * x[i] + y[i];", "{ y[i] = 2.0f * x[i] + y[i]; last = y[i]; }")
    assert not check(ORIGINAL, code, SPEC).warnings


def test_extra_stream_is_a_warning():
    cheat = ORIGINAL + "\nvoid run(int n, const float* x, float* y) { cudaStream_t s; cudaStreamCreate(&s); scale<<<1, 256, 0, s>>>(n, x, y); }\n"
    report = check(ORIGINAL, cheat, SPEC)
    assert report.ok and set(rules(report, "warning")) == {"extra-stream"}


def test_printf_is_a_warning():
    cheat = ORIGINAL.replace("if (i < n)", 'if (i == 0) printf("n=%d\\n", n);\n    if (i < n)')
    report = check(ORIGINAL, cheat, SPEC)
    assert report.ok and rules(report, "warning") == ["printf"]


def test_findings_shared_with_the_original_are_only_warnings():
    both = ORIGINAL.replace("y[i] = 2.0f * x[i] + y[i];", "y[i] = 2.0f * x[i] + __ldg(&y[i]);")
    report = check(both, both, SPEC)
    assert report.ok and rules(report, "warning") == ["noncoherent-read-of-written-memory"]


def test_signature_unchanged_when_only_qualifiers_and_names_change():
    candidate = ORIGINAL.replace("const float* x, float* y", "const float* __restrict__ in, float* __restrict__ out").replace("x[i]", "in[i]").replace("y[i]", "out[i]")
    report = check_signature(ORIGINAL, candidate, SPEC)
    assert report.changed == () and report.spec_errors == ()


@pytest.mark.parametrize(
    "edit, expected",
    [
        (("int n, const float* x, float* y", "int n, const double* x, float* y"), "parameter 2 ('x')"),
        (("int n, const float* x, float* y", "int n, float* y"), "takes 2 parameters in the candidate, 3 in the original"),
        (("int n, const float* x, float* y", "long long n, const float* x, float* y"), "parameter 1 ('n')"),
        (("void scale(", "void scale_fast("), "no __global__ function named 'scale'"),
    ],
)
def test_signature_changes_are_reported(edit, expected):
    report = check_signature(ORIGINAL, ORIGINAL.replace(*edit), SPEC)
    assert any(expected in c for c in report.changed), report


def test_spec_that_does_not_describe_the_original():
    wrong = ORIGINAL.replace("int n, const float* x, float* y", "const float* x, float* y, int n")
    report = check_signature(wrong, wrong, SPEC)
    assert report.spec_errors and "params[0]" in report.spec_errors[0]


def test_a_kernel_and_spec_that_differ_only_through_a_type_alias_agree():
    aliased = "typedef float* Data_ptr;\nusing real = float;\ntypedef const real* CPtr;\n" + ORIGINAL.replace(
        "int n, const float* x, float* y", "int n, CPtr x, Data_ptr y")
    report = check_signature(aliased, aliased, SPEC)
    assert report.spec_errors == () and report.warnings == () and report.changed == ()
    # The candidate may spell the type out: the same parameter as the compiler sees it.
    spelled = aliased.replace("int n, CPtr x, Data_ptr y", "int n, const float* __restrict__ x, float* __restrict__ y")
    assert check_signature(aliased, spelled, SPEC).changed == ()
    # A real mismatch is still one: an alias of a scalar where the spec has an array.
    scalar = "typedef float real_t;\n" + ORIGINAL.replace("int n, const float* x, float* y", "int n, const float* x, real_t y")
    assert check_signature(scalar, scalar, SPEC).spec_errors


def test_index_arrays_inside_an_address_are_not_written():
    # idx is read to compute where y is written; it is not written itself.
    gather = """
extern "C" __global__ void scale(int n, const int* __restrict__ idx, float* y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { *(y + __ldg(&idx[i])) = 1.0f; float* p = y + idx[i]; p[0] += 1.0f; }
}
"""
    assert check(gather, gather, SPEC).ok and not check(gather, gather, SPEC).warnings


def test_reinterpret_cast_keeps_the_base():
    cheat = """
extern "C" __global__ void scale(int n, const float* __restrict__ x, float* y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n / 4) { reinterpret_cast<float4*>(const_cast<float*>(x))[i] = make_float4(0, 0, 0, 0); }
    if (i < n) y[i] = x[i];
}
"""
    report = check(ORIGINAL, cheat, SPEC)
    assert rules(report) == ["noncoherent-read-of-written-memory"] and report.errors[0].line == 5


def test_a_one_byte_spec_type_holds_a_bool_array():
    """Rodinia's BFS masks are ``bool*``: a ``uint8`` spec describes them (one byte per element on CUDA)."""
    assert spec_type_matches("uint8", "bool") and spec_type_matches("uint8", "const bool")
    assert not spec_type_matches("int32", "bool") and not spec_type_matches("float32", "bool")
