"""Drafting launch specs from a kernel's signature and its launch site."""

from __future__ import annotations

import json

import pytest

from kernel_lsp.core.index import build_index
from kernel_lsp.core.spec import SpecError, parse_spec
from kernel_lsp.core.spec_draft import PLACEHOLDER, draft_spec, placeholder_count

SAXPY = """
#define N (1 << 20)
__global__ void saxpy(int n, float a, const float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
int main() {
  const int n = N;
  float *d_x, *d_y;
  cudaMalloc(&d_x, n * sizeof(float));
  cudaMalloc((void **)&d_y, sizeof(float) * n);
  saxpy<<<(n + 255) / 256, 256>>>(n, 2.0f, d_x, d_y);
}
"""


def draft(source: str, kernel: str):
    return draft_spec(build_index(source), source, kernel)


def test_saxpy_is_complete_and_valid():
    d = draft(SAXPY, "saxpy")
    assert d.complete and d.todo == ()
    spec = parse_spec(d.spec)
    assert [p.name for p in spec.params] == ["n", "a", "x", "y"]
    assert d.spec["params"][0] == {"name": "n", "scalar": "int32", "value": 1 << 20}
    assert d.spec["params"][1] == {"name": "a", "scalar": "float32", "value": 2.0}
    x, y = d.spec["params"][2], d.spec["params"][3]
    assert (x["array"], x["size"], x["role"]) == ("float32", "n", "in")
    # y is read and written (y[i] = ... + y[i]): inout, not out
    assert (y["size"], y["role"]) == ("n", "inout")
    assert d.spec["grid"] == ["(n + 255) / 256", 1, 1] and d.spec["block"] == [256, 1, 1]
    assert spec.resolve().original.grid == ((1 << 20) // 256, 1, 1)


def test_write_only_pointer_is_out_and_starts_zeroed():
    src = """
__global__ void fill(float *out, int n) { int i = threadIdx.x; if (i < n) out[i] = 1.0f; }
int main() { float *o; cudaMalloc(&o, 1024 * sizeof(float)); fill<<<1, 1024>>>(o, 1024); }
"""
    d = draft(src, "fill")
    out = d.spec["params"][0]
    assert out["role"] == "out" and out["init"] == "zeros" and out["size"] == 1024
    parse_spec(d.spec)


def test_dim3_variables_and_size_variable():
    src = """
__global__ void tr(float *o, const float *i, int w) { o[threadIdx.x] = i[threadIdx.x]; }
int main() {
  int w = 4096;
  size_t bytes = (size_t)w * w * sizeof(float);
  float *a, *b;
  cudaMalloc(&a, bytes); cudaMalloc(&b, bytes);
  dim3 block(32, 8), grid(w / 32, w / 32);
  tr<<<grid, block>>>(a, b, w);
}
"""
    d = draft(src, "tr")
    assert d.spec["grid"] == ["w / 32", "w / 32", 1]
    assert d.spec["block"] == [32, 8, 1]
    assert d.spec["params"][0]["size"] == "w * w"
    assert parse_spec(d.spec).resolve().sizes["o"] == 4096 * 4096


def test_unknown_values_become_placeholders_with_todo():
    src = """
__global__ void k(float *p, int n) { p[threadIdx.x] += n; }
void run(float *p, int n) { k<<<blocks(n), 128>>>(p, n); }
"""
    d = draft(src, "k")
    assert not d.complete
    assert d.spec["params"][0]["size"] == PLACEHOLDER
    assert d.spec["params"][1]["value"] == PLACEHOLDER
    assert d.spec["grid"][0] == PLACEHOLDER and d.spec["block"] == [128, 1, 1]
    text = " ".join(d.todo)
    assert "p: element count unknown" in text and "n: value unknown" in text and "grid" in text
    with pytest.raises(SpecError):
        parse_spec(d.spec)


def test_kernel_without_launch_lists_everything_to_fill():
    src = "__global__ void lonely(double *x, long long m) { x[0] = m; }"
    d = draft(src, "lonely")
    assert d.launch_line is None
    assert d.spec["params"][0]["array"] == "float64" and d.spec["params"][1]["scalar"] == "int64"
    assert any("no launch" in t for t in d.todo)


def test_integer_arrays_warn_about_indices_and_dynamic_smem_is_read():
    src = """
__global__ void g(float *o, const int *idx, int n) { extern __shared__ float s[]; o[threadIdx.x] = idx[0]; }
int main() {
  const int n = 4096;
  float *o; int *idx;
  cudaMalloc(&o, n * sizeof(float)); cudaMalloc(&idx, n * sizeof(int));
  g<<<n / 256, 256, 256 * sizeof(float)>>>(o, idx, n);
}
"""
    d = draft(src, "g")
    assert d.spec["params"][1]["init"] == "zeros"
    assert any("idx" in t and "indices" in t for t in d.todo)
    assert d.spec["dynamic_smem"] == 1024
    assert d.spec["grid"] == ["n / 256", 1, 1]


def test_not_a_kernel_is_refused():
    with pytest.raises(ValueError, match="no __global__"):
        draft("__device__ int f(int x) { return x; }", "f")


def test_placeholders_are_counted_and_no_internal_value_is_shown():
    text = "__global__ void k(float* p, int n, int* idx) { p[idx[0]] = n; }\n"
    draft = draft_spec(build_index(text), text, "k")
    written = json.dumps(draft.spec)
    assert placeholder_count(draft.spec) == written.count(f'"{PLACEHOLDER}"') > 0
    assert not any("None" in item for item in draft.todo)
    assert any("no launch is visible" in item for item in draft.todo)
    assert placeholder_count({"a": [1, "x"], "b": {"c": PLACEHOLDER}}) == 1
