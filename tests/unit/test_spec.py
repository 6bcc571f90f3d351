"""Launch spec v1: every field of shared/spec/LAUNCH_SPEC.md, and errors that name the field."""

import copy
import json

import pytest

from kernel_lsp.core.spec import (
    ArrayParam,
    ScalarParam,
    SpecError,
    Tolerance,
    find_inline_specs,
    inline_spec,
    parse_spec,
    with_candidate_launch,
)

SAXPY = {
    "kernel": "saxpy",
    "params": [
        {"name": "n", "scalar": "int32", "value": 16777216},
        {"name": "a", "scalar": "float32", "value": 2.0},
        {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
        {"name": "y", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "inout"},
    ],
    "grid": ["(n+255)/256", "1", "1"],
    "block": [256, 1, 1],
    "dynamic_smem": 0,
    "tolerance": {"rtol": 1e-5, "atol": 1e-6},
}


def with_changes(**changes):
    data = copy.deepcopy(SAXPY)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def errors_of(data):
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return info.value.errors


def test_the_documented_example_parses():
    spec = parse_spec(SAXPY)
    assert spec.kernel == "saxpy"
    assert spec.params[0] == ScalarParam("n", "int32", 16777216)
    assert spec.params[1] == ScalarParam("a", "float32", 2.0)
    x = spec.params[2]
    assert isinstance(x, ArrayParam) and x.size == "n" and x.role == "in" and x.init.kind == "uniform" and x.init.args == ("-1", "1")
    resolved = spec.resolve()
    assert resolved.sizes == {"x": 16777216, "y": 16777216}
    assert resolved.original.grid == (65536, 1, 1) and resolved.original.block == (256, 1, 1)
    assert resolved.original.dynamic_smem_bytes == 0
    assert resolved.candidate == resolved.original
    assert spec.tolerance_for("float32") == Tolerance(1e-5, 1e-6)


def test_json_text_is_accepted_and_round_trips():
    spec = parse_spec(json.dumps(SAXPY))
    assert parse_spec(spec.to_json()) == spec


def test_defaults_by_type_when_tolerance_is_absent():
    spec = parse_spec(with_changes(tolerance=None, dynamic_smem=None))
    assert spec.tolerance_for("float32") == Tolerance(1e-5, 1e-6)
    assert spec.tolerance_for("float64") == Tolerance(1e-10, 1e-12)
    assert spec.tolerance_for("float16") == Tolerance(1e-2, 1e-3)
    assert spec.tolerance_for("bfloat16") == Tolerance(1e-2, 1e-3)
    assert spec.resolve().original.dynamic_smem_bytes == 0


def test_partial_tolerance_keeps_the_type_default_for_the_rest():
    spec = parse_spec(with_changes(tolerance={"rtol": 1e-3}))
    assert spec.tolerance_for("float32") == Tolerance(1e-3, 1e-6)


def test_variants_recompute_sizes_and_grids():
    spec = parse_spec(with_changes(variants=[{"n": 1000003}, {"n": 4096}]))
    assert spec.resolve(0).sizes["x"] == 1000003
    assert spec.resolve(0).original.grid == (3907, 1, 1)
    assert spec.resolve(1).original.grid == (16, 1, 1)
    assert spec.values(1)["a"] == 2.0


def test_candidate_overrides_only_what_it_names():
    spec = parse_spec(with_changes(candidate={"grid": ["min(ceil_div(n, 1024), 8192)", 1, 1], "dynamic_smem": "1024"}))
    resolved = spec.resolve()
    assert resolved.candidate.grid == (8192, 1, 1)
    assert resolved.candidate.block == (256, 1, 1)
    assert resolved.candidate.dynamic_smem_bytes == 1024
    assert resolved.original.grid == (65536, 1, 1)
    assert with_candidate_launch(spec, None).resolve().candidate == resolved.original


def test_every_initializer_parses():
    params = [
        {"name": "n", "scalar": "int32", "value": 12},
        {"name": "rows", "scalar": "int32", "value": 4},
        {"name": "k", "scalar": "int32", "value": 3},
    ]
    inits = {
        "float32": ["uniform(-1,1)", "normal(0, 2)", "zeros", "ones", "fill(3.5)", "list(1,2,3)"],
        "int32": ["randint(0, n-1)", "arange", "perm(n)", "fill(7)", "list(1, -2)"],
    }
    for dtype, texts in inits.items():
        for i, text in enumerate(texts):
            params.append({"name": f"{dtype}_{i}", "array": dtype, "size": "n", "init": text, "role": "in"})
    params.append({"name": "rowptr", "array": "int32", "size": "rows+1", "init": "csr_rowptr(rows,k)", "role": "in"})
    params.append({"name": "colidx", "array": "int32", "size": "rows*k", "init": "csr_colidx(rows, n, k)", "role": "in"})
    params.append({"name": "f", "array": "float16", "size": "n", "init": "file(weights.npy)", "role": "in"})
    params.append({"name": "o", "array": "bfloat16", "size": "n", "role": "out"})
    spec = parse_spec({"kernel": "k", "params": params, "grid": [1, 1, 1], "block": [32, 1, 1]})
    kinds = [p.init.kind for p in spec.arrays]
    assert kinds[-4:] == ["csr_rowptr", "csr_colidx", "file", "zeros"]
    assert spec.arrays[-2].init.args == ("weights.npy",)


def test_expressions_in_every_launch_field():
    spec = parse_spec(with_changes(grid=["ceil_div(n, 256)", "n/n", 1], block=["max(128, 256)", 1, 1], dynamic_smem="4*256"))
    assert spec.resolve().original == spec.resolve().candidate
    assert spec.resolve().original.dynamic_smem_bytes == 1024


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"params": [{"name": "x", "array": "float32", "size": "m", "init": "zeros", "role": "in"}]}, "params[0].size: unknown name 'm'"),
        ({"kernel": 3}, "kernel: expected the kernel's name"),
        ({"kernel": None}, "kernel: expected the kernel's name"),
        ({"grid": ["n/256", 1]}, "grid: expected a list of three entries"),
        ({"block": [256, 1, "q"]}, "block[2]: unknown name 'q'"),
        ({"grid": ["n/(", 1, 1]}, "grid[0]: unexpected end"),
        ({"grid": ["n/256", 1, 1.5]}, "grid[2]: expected an integer or an expression string"),
        ({"grid": ["a", 1, 1]}, "grid[0]: 'a' is a floating-point scalar"),
        ({"block": [2048, 1, 1]}, "block: 2048 threads per block exceeds 1024"),
        ({"block": [0, 1, 1]}, "block[0]: evaluates to 0"),
        ({"dynamic_smem": "-n"}, "dynamic_smem: evaluates to -16777216"),
        ({"tolerance": {"rtol": -1}}, "tolerance.rtol: expected a number >= 0"),
        ({"tolerance": {"rtol": 1e-5, "abs": 1}}, "tolerance.abs: unknown field"),
        ({"tolerance": 0.1}, "tolerance: expected an object"),
        ({"variants": [{"m": 5}]}, "variants[0].m: not a scalar parameter"),
        ({"variants": [{"n": 1.5}]}, "variants[0].n: expected an integer for int32"),
        ({"variants": [{"n": -300}]}, "variants[0]: grid[0]: evaluates to 0"),
        ({"variants": {"n": 5}}, "variants: expected a list"),
        ({"candidate": {"stream": 1}}, "candidate.stream: unknown field"),
        ({"candidate": {"block": [4096, 1, 1]}}, "candidate.block: 4096 threads per block exceeds 1024"),
        ({"grdi": [1, 1, 1]}, "grdi: unknown field"),
        ({"notes": ["fast"]}, "notes: expected an object"),
        ({"params": "x"}, "params: missing or not a list"),
    ],
)
def test_bad_specs_name_the_field(change, expected):
    data = with_changes(**change)
    if "params" in change and isinstance(change["params"], list):
        data["params"] = SAXPY["params"][:2] + change["params"]
        expected = expected.replace("params[0]", "params[2]")
    errors = errors_of(data)
    assert any(e.startswith(expected) for e in errors), errors


@pytest.mark.parametrize(
    "param, expected",
    [
        ({"name": "x", "scalar": "int16", "value": 1}, "params[2].scalar: unknown scalar type 'int16'"),
        ({"name": "x", "scalar": "int32"}, "params[2].value: missing"),
        ({"name": "x", "scalar": "int32", "value": 2**31}, "params[2].value: 2147483648 is outside the range of int32"),
        ({"name": "x", "scalar": "uint32", "value": -1}, "params[2].value: -1 is outside the range of uint32"),
        ({"name": "x", "scalar": "int32", "value": 1.5}, "params[2].value: expected an integer for int32"),
        ({"name": "x", "scalar": "int32", "value": True}, "params[2].value: expected an integer"),
        ({"name": "x", "scalar": "float32", "value": "big"}, "params[2].value: expected a finite number"),
        ({"name": "x", "array": "complex64", "size": "n", "init": "zeros", "role": "in"}, "params[2].array: unknown element type"),
        ({"name": "x", "array": "float32", "init": "zeros", "role": "in"}, "params[2].size: missing"),
        ({"name": "x", "array": "float32", "size": "n", "init": "zeros", "role": "input"}, "params[2].role: expected one of in, out, inout"),
        ({"name": "x", "array": "float32", "size": "n", "role": "in"}, "params[2].init: missing"),
        ({"name": "x", "array": "float32", "size": "n", "init": "gauss(0,1)", "role": "in"}, "params[2].init: unknown initializer 'gauss'"),
        ({"name": "x", "array": "float32", "size": "n", "init": "uniform(1)", "role": "in"}, "params[2].init: uniform takes 2 argument(s)"),
        ({"name": "x", "array": "float32", "size": "n", "init": "uniform(1,0)", "role": "in"}, "params[2].init: uniform(a,b) needs a <= b"),
        ({"name": "x", "array": "int32", "size": "n", "init": "uniform(0,1)", "role": "in"}, "params[2].init: uniform needs a floating-point array"),
        ({"name": "x", "array": "int8", "size": "n", "init": "randint(0,300)", "role": "in"}, "params[2].init: randint(0,300) does not fit in int8"),
        ({"name": "x", "array": "int32", "size": "n", "init": "perm(5)", "role": "in"}, "params[2].init: perm(5) makes 5 elements but size is 16777216"),
        ({"name": "x", "array": "int32", "size": "n", "init": "csr_rowptr(n,2)", "role": "in"}, "params[2].init: csr_rowptr(16777216,2) makes 16777217 elements"),
        ({"name": "x", "array": "int32", "size": "n", "init": "csr_colidx(1,3,4)", "role": "in"}, "params[2].init: csr_colidx needs k <= cols"),
        ({"name": "x", "array": "float32", "size": "n", "init": "perm(n)", "role": "in"}, "params[2].init: perm fills indices"),
        ({"name": "x", "array": "int32", "size": "n", "init": "fill(2.5)", "role": "in"}, "params[2].init: 2.5 is not an integer"),
        ({"name": "x", "array": "float32", "size": "n", "init": "file(x.txt)", "role": "in"}, "params[2].init: file() takes a .npy file name"),
        ({"name": "x", "array": "float32", "size": "n", "init": "zeros", "role": "in", "stride": 2}, "params[2].stride: unknown field"),
        ({"name": "x", "array": "float32", "scalar": "int32", "size": "n"}, "params[2]: give exactly one of"),
        ({"name": "a", "scalar": "int32", "value": 1}, "params[2].name: duplicate parameter name 'a'"),
        ({"name": "2x", "scalar": "int32", "value": 1}, "params[2].name: expected an identifier"),
        ({"name": "x", "array": "float32", "size": "n-n-1", "init": "zeros", "role": "in"}, "params[2].size: evaluates to -1"),
        ({"name": "x", "array": "float32", "size": "n", "init": "zeros", "role": "in", "struct": "struct Body"}, "params[2].struct: expected the C struct's name"),
        ("not an object", "params[2]: expected an object"),
    ],
)
def test_bad_params_name_the_field(param, expected):
    data = with_changes()
    data["params"] = SAXPY["params"][:2] + [param]
    errors = errors_of(data)
    assert any(e.startswith(expected) for e in errors), errors


def test_all_errors_are_reported_at_once():
    data = with_changes(kernel=5, grid=[1, 1])
    data["params"] = SAXPY["params"] + [{"name": "z", "array": "float32", "size": "q", "init": "zeros", "role": "in"}]
    errors = errors_of(data)
    assert len(errors) == 3
    assert "params[4].size: unknown name 'q'" in errors


def test_variant_errors_say_which_variant():
    data = with_changes(variants=[{"n": 100}, {"n": 0}])
    data["params"] = SAXPY["params"] + [{"name": "p", "array": "int32", "size": "n", "init": "perm(100)", "role": "in"}]
    errors = errors_of(data)
    assert any(e.startswith("variants[1]: params[4].init: perm(100) makes 100 elements but size is 0") for e in errors), errors
    assert any(e.startswith("variants[1]: grid[0]: evaluates to 0") for e in errors), errors
    assert not any(e.startswith("variants[0]") for e in errors)


def test_not_json():
    assert errors_of("{not json")[0].startswith("not valid JSON")
    assert errors_of("[1, 2]")[0].startswith("a launch spec is a JSON object")


def test_out_arrays_may_omit_init():
    data = with_changes()
    data["params"] = SAXPY["params"] + [{"name": "z", "array": "float32", "size": "n", "role": "out"}]
    assert parse_spec(data).arrays[-1].init.kind == "zeros"


SOURCE = """#include <cuda_runtime.h>
// kernel-lsp: spec {"params": [{"name": "n", "scalar": "int32", "value": 1024},
//   {"name": "x", "array": "float32", "size": "n", "init": "ones", "role": "inout"}],
//   "grid": ["ceil_div(n,256)", 1, 1], "block": [256, 1, 1]}
extern "C" __global__ void twice(int n, float* x) { int i = threadIdx.x; if (i < n) x[i] *= 2; }

// kernel-lsp: spec {"params": [oops]}
__global__ void broken(float* y) {}
"""


def test_inline_spec_maps_onto_the_same_fields():
    spec = inline_spec(SOURCE, "twice")
    assert spec is not None and spec.kernel == "twice"
    assert spec.resolve().original.grid == (4, 1, 1)
    assert spec.arrays[0].role == "inout"
    assert inline_spec(SOURCE, "other") is None


def test_inline_spec_errors_carry_the_line():
    found = find_inline_specs(SOURCE)
    assert [(f.line, f.kernel) for f in found] == [(1, "twice"), (6, "broken")]
    assert found[1].error is not None and found[1].error.startswith("line 7:")
    with pytest.raises(SpecError, match="line 7"):
        inline_spec(SOURCE, "broken")


def test_examples_specs_parse():
    import glob
    import os

    root = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    paths = glob.glob(os.path.join(root, "*", "spec*.json"))
    for path in paths:
        with open(path) as f:
            parse_spec(json.load(f))


def test_notes_are_kept_and_carry_no_meaning():
    notes = {"category": "streaming", "control": True, "bytes_min": "12*n"}
    spec = parse_spec(with_changes(notes=notes))
    assert spec.notes == notes
    assert spec == parse_spec(SAXPY)  # notes do not make a different launch
    assert parse_spec(spec.to_json()).notes == notes
    assert with_candidate_launch(spec, {"block": [128, 1, 1]}).notes == notes
    assert parse_spec(SAXPY).notes is None and "notes" not in parse_spec(SAXPY).to_json()


def test_an_array_of_structs_names_its_struct():
    data = with_changes()
    data["params"] = [
        {"name": "p", "array": "float32", "size": "n*6", "init": "uniform(-1,1)", "role": "inout", "struct": "Body"},
        {"name": "dt", "scalar": "float32", "value": 0.01},
        {"name": "n", "scalar": "int32", "value": 1000},
    ]
    spec = parse_spec(data)
    body = spec.params[0]
    assert isinstance(body, ArrayParam) and body.struct == "Body" and spec.resolve().sizes == {"p": 6000}
    assert parse_spec(spec.to_json()).params[0] == body
    assert "struct" not in parse_spec(SAXPY).to_json()["params"][2]


def test_struct_arrays_match_the_struct_type_only():
    from kernel_lsp.core.static_check import spec_type_matches

    assert spec_type_matches("float32", "Body", struct="Body")
    assert spec_type_matches("float32", "struct Body", struct="Body")
    assert not spec_type_matches("float32", "float", struct="Body")
    assert not spec_type_matches("float32", "Body")
    assert spec_type_matches("float32", "float4")
