"""The memory-access analysis on snippets: one kernel, a launch, the expected facts.

``check(src, expect, ...)`` analyses ``src`` under a launch and compares the accesses, written
as ``"<kind> <array>: <pattern> [<warp stride>]"`` (e.g. ``"write out: strided 4096"``), with
``expect`` as a multiset, so an extra or a missing access fails the test.
"""

from __future__ import annotations

from collections import Counter

import pytest

from kernel_lsp.core.analysis import (
    Binding,
    analyze,
    bind,
    describe,
    per_block_outputs,
    stencil_offsets,
    summary,
    thread_mapping,
    trip_count,
)
from kernel_lsp.core.poly import Poly
from kernel_lsp.core.source import preprocess


def facts_of(src: str, kernel: str | None = None, headers: dict[str, str] | None = None):
    pre = preprocess(src, "/w/k.cu", (headers or {}).get)
    found = analyze(pre)
    return found[kernel] if kernel else next(iter(found.values()))


def check(src: str, expect: list[str], block=(256, 1, 1), values=None, kernel=None, headers=None):
    facts = facts_of(src, kernel, headers)
    patterns = bind(facts, Binding(values or {}, block))
    got = []
    for p in patterns:
        text = f"{p.access.kind} {p.access.array}: {p.pattern}"
        if p.pattern == "strided" and p.access.space == "global":
            text += f" {p.warp_stride_elems}"
        got.append(text)
    assert Counter(got) == Counter(expect), "\n".join(got)
    return facts, patterns


def test_constant_arrays_are_read_in_their_own_space():
    """A file's ``__constant__`` tables are memory the kernel reads: one address for a warp is a broadcast,
    several are served one after another (a hint, as an uncoalesced global access is)."""
    src = """
    __constant__ int starts[4096];
    __constant__ float taps[2][16] = {{0}};
    __global__ void k(const float* x, float* out, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      float acc = 0.0f;
      for (int q = 0; q < starts[i / 32]; q++) acc += x[starts[q] + i] * taps[1][threadIdx.x % 16];
      out[i] = acc;
    }"""
    # The loop's test reads its bound before the first iteration and in every one.
    facts, patterns = check(src, ["read starts: broadcast"] * 3 + ["read x: coalesced",
                                  "read taps: serialized", "write out: coalesced"], values={"n": 1 << 20})
    assert {a.array: a.space for a in facts.accesses} == {"starts": "constant", "x": "global", "taps": "constant", "out": "global"}
    taps = next(p for p in patterns if p.access.array == "taps")
    assert describe(taps) == ("load of `taps` (constant): 16 different elements across a warp, which the constant "
                              "cache serves one after another")
    # A parameter of the same name is the parameter.
    shadowed = facts_of(src.replace("const float* x,", "const float* x, const int* starts,"))
    assert {a.space for a in shadowed.accesses if a.array == "starts"} == {"global"}


def test_a_constant_variables_initializer_is_not_a_compile_time_constant():
    """The host may copy another value into a ``__constant__`` variable (cudaMemcpyToSymbol); a ``const``
    one is fixed."""
    src = """
    __constant__ int ROWS = 8;
    const int COLS = 4;
    __global__ void k(float* a) {
      for (int r = 0; r < ROWS; r++) a[r * COLS + threadIdx.x] = 0.0f;
    }"""
    facts = facts_of(src)
    assert facts.constants == {"COLS": 4}
    assert trip_count(facts, facts.loops[0], Binding({}, (32, 1, 1))) is None


def test_moving_a_pointer_parameter_stores_nothing_and_moves_its_loads():
    """``A += BK`` (SGEMM's tiles walking along K) is pointer arithmetic on a local: no store to ``A``, and a
    load of ``A`` after it, in the loop, moves with the loop (it is not the same element every iteration)."""
    src = """
    __global__ void k(const float* A, float* out, int K) {
      float acc = 0.0f;
      for (int t = 0; t < K; t += 16) {
        acc += A[threadIdx.x];
        A += 16;
      }
      out[threadIdx.x] = acc;
    }"""
    facts, _ = check(src, ["read A: coalesced", "write out: coalesced"], block=(32, 1, 1), values={"K": 256})
    read = next(a for a in facts.accesses if a.array == "A")
    assert read.index.symbols == {"tid.x", facts.loops[0].trip_symbol}, read.index


def test_naive_transpose_with_its_own_names():
    src = """
    __global__ void tr(const float* src, float* dst, int rows, int cols) {
      int c = blockIdx.x * blockDim.x + threadIdx.x;
      int r = blockIdx.y * blockDim.y + threadIdx.y;
      if (c < cols && r < rows) dst[c * rows + r] = src[r * cols + c];
    }"""
    check(src, ["read src: coalesced", "write dst: strided 4096"], block=(32, 8, 1), values={"rows": 4096, "cols": 2048})


def test_macro_body_and_size_t_block_size():
    src = """
    #define block_size ((size_t)256)
    #define BODY a[i] = b[i] + s * c[i];
    __global__ void __launch_bounds__(block_size) triad(float* a, float* b, float* c, float s, long n) {
      long i = blockIdx.x * block_size + threadIdx.x;
      if (i < n) { BODY; }
    }"""
    facts, _ = check(src, ["read b: coalesced", "read c: coalesced", "write a: coalesced"], values={"n": 1 << 20})
    assert facts.written == ("a",)
    assert set(facts.read_only) == {"b", "c"}
    assert thread_mapping(facts) == "element"


def test_csr_gather():
    src = """
    __global__ void spmv(int rows, const int* ptr, const int* cols, const float* val, const float* x, float* y) {
      int row = blockIdx.x * blockDim.x + threadIdx.x;
      if (row < rows) {
        float dot = 0;
        for (int j = ptr[row]; j < ptr[row + 1]; j++) dot += val[j] * x[cols[j]];
        y[row] = dot;
      }
    }"""
    facts, patterns = check(src, ["read ptr: coalesced", "read ptr: coalesced", "read ptr: coalesced",
                                  "read val: gather", "read cols: gather", "read x: gather", "write y: coalesced"])
    assert [r.kind for r in facts.reductions] == ["accumulator"]
    assert "ptr[row]" in describe(next(p for p in patterns if p.access.array == "val"))


def test_thread_per_row_softmax():
    src = """
    __global__ void softmax(const float* in, float* out, int N, int C) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < N) {
        const float* row = in + i * C;
        float m = -1e30f;
        for (int j = 0; j < C; j++) m = fmaxf(m, row[j]);
        double s = 0.0;
        for (int j = 0; j < C; j++) s += expf(row[j] - m);
        for (int j = 0; j < C; j++) out[i * C + j] = expf(row[j] - m) / s;
      }
    }"""
    facts, patterns = check(src, ["read in: strided 50257", "read in: strided 50257", "read in: strided 50257",
                                  "write out: strided 50257"], values={"N": 8192, "C": 50257})
    assert thread_mapping(facts) == "row-per-thread"
    assert {(r.target, r.op) for r in facts.reductions} == {("m", "max"), ("s", "+")}
    assert all(p.loop_stride_elems == 1 for p in patterns)


def test_shared_tree_of_modulo_form_and_per_block_output():
    src = """
    __global__ void reduce(const float* g_in, float* g_out, unsigned int n) {
      extern __shared__ float sdata[];
      unsigned int tid = threadIdx.x;
      unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
      sdata[tid] = (i < n) ? g_in[i] : 0;
      __syncthreads();
      for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        if (tid % (2 * s) == 0) sdata[tid] += sdata[tid + s];
        __syncthreads();
      }
      if (tid == 0) g_out[blockIdx.x] = sdata[0];
    }"""
    facts, _ = check(src, ["read g_in: coalesced", "write sdata: coalesced", "read sdata: coalesced",
                           "update sdata: coalesced", "read sdata: broadcast", "write g_out: broadcast"])
    assert [r.kind for r in facts.reductions] == ["shared_tree"]
    assert per_block_outputs(facts) == ("g_out",)
    assert facts.loops[0].geometric == "doubling"


def test_unrolled_warp_tail_is_a_tree():
    src = """
    __global__ void tail(float* out, const float* in) {
      __shared__ float s[64];
      int t = threadIdx.x;
      s[t] = in[t];
      if (t < 32) {
        volatile float* v = s;
        v[t] += v[t + 32]; v[t] += v[t + 16]; v[t] += v[t + 8];
      }
      if (t == 0) out[blockIdx.x] = s[0];
    }"""
    facts = facts_of(src)
    assert [r.kind for r in facts.reductions] == ["shared_tree"]


def test_atomics_to_one_address_and_histogram_scatter():
    src = """
    __global__ void sum(const float* x, float* total, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) atomicAdd(total, x[i]);
    }
    __global__ void histo(const unsigned char* img, unsigned int* bins, int n) {
      for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        atomicAdd(&bins[img[i]], 1);
    }"""
    total = facts_of(src, "sum")
    assert [(r.kind, r.target) for r in total.reductions] == [("atomic", "total")]
    histo = facts_of(src, "histo")
    assert [(r.kind, r.target) for r in histo.reductions] == [("atomic_scatter", "bins")]
    assert thread_mapping(histo) == "grid-stride"
    assert histo.written == ("bins",)


def test_helper_function_writes_are_seen():
    src = """
    __device__ void store(float* dst, int k, float v) { dst[k] = v; }
    __device__ float twice(const float* p, int k) { return 2.0f * p[k]; }
    __global__ void k(float* out, float* in, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      store(out, i, twice(in, i));
    }"""
    facts, patterns = check(src, ["read in: coalesced", "write out: coalesced"])
    assert facts.written == ("out",)
    assert facts.read_only == ("in",)
    assert {p.access.via for p in patterns} == {("store",), ("twice",)}


def test_unknown_call_keeps_pointer_writable():
    src = """
    __device__ void opaque_fn(float* p);
    __global__ void k(float* a, float* b) { opaque_fn(a); b[threadIdx.x] = 1.0f; }"""
    facts = facts_of(src)
    assert facts.read_only == ()
    assert "a" in facts.escaped


def test_two_dimensional_block_and_local_header_macros():
    headers = {"/w/common.cuh": "#define BX 16\n#define BY 16\n#define IDX(r, c, w) ((r) * (w) + (c))\n"}
    src = """
    #include "common.cuh"
    __global__ void add(const float* a, float* b, int w) {
      int x = blockIdx.x * BX + threadIdx.x, y = blockIdx.y * BY + threadIdx.y;
      b[IDX(y, x, w)] = a[IDX(x, y, w)];
    }"""
    check(src, ["read a: strided 1024", "write b: coalesced"], block=(16, 16, 1), values={"w": 1024}, headers=headers)


def test_wide_index_and_grid_stride_trip_count():
    src = """
    __global__ void scale(float* y, const float* x, size_t n) {
      for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x)
        y[i] = 3.0f * x[i];
    }"""
    facts = facts_of(src)
    assert all(a.wide for a in facts.accesses)
    binding = Binding({"n": 1 << 20}, (256, 1, 1), (1024, 1, 1))
    assert trip_count(facts, facts.loops[0], binding) == 4
    assert thread_mapping(facts) == "grid-stride"


@pytest.mark.parametrize("header", [
    "for (int i = threadIdx.x; n > i; i = 32 + i)",
    "for (int i = threadIdx.x; (n >= i + 0) && (i < n); i += 32)",
    "for (int i = threadIdx.x; (i <= n - 1); i = i + 32)",
    "for (int i = threadIdx.x; (n - 1 >= i); i += 32)",
])
def test_loop_bound_and_step_in_other_spellings(header):
    """A bound named first (``n > i``) or in parentheses, and a step written before the counter
    (``i = 32 + i``), are the same loop as ``i < n; i += 32``; a test of two comparisons is not a bound."""
    src = "__global__ void k(float* y, const float* x, int n) {\n  " + header + "\n    y[i] = x[i];\n}"
    loop = facts_of(src).loops[0]
    assert loop.var == "i" and loop.step == Poly.const(32)
    binding = Binding({"n": 1000}, (32, 1, 1))
    if "&&" in header:
        assert loop.bound is None
    else:
        assert trip_count(facts_of(src), loop, binding) == 32


def test_array_of_structs_is_strided():
    src = """
    typedef struct { float x, y, z, vx, vy, vz; } Body;
    __global__ void drift(Body* p, float dt, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) { p[i].x += p[i].vx * dt; }
    }"""
    facts, patterns = check(src, ["read p: strided 1", "update p: strided 1"])
    assert {(p.access.field, p.access.field_offset_bytes) for p in patterns} == {("x", 0), ("vx", 12)}
    assert all(p.sectors_per_request == 24 and p.ideal_sectors == 4 for p in patterns)


def test_five_point_stencil_offsets():
    src = """
    __global__ void jacobi(const float* A, float* B, int n) {
      int i = blockIdx.y * blockDim.y + threadIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
      if (i > 0 && j > 0 && i < n - 1 && j < n - 1)
        B[i*n + j] = 0.2f * (A[i*n + j] + A[i*n + j-1] + A[i*n + j+1] + A[(i+1)*n + j] + A[(i-1)*n + j]);
    }"""
    facts = facts_of(src)
    assert stencil_offsets(facts) == {}  # offsets in n are symbolic: not constant without a size
    concrete = facts_of(src.replace("int n)", "int m)").replace("n", "1024").replace("int m)", "int n)"))
    assert stencil_offsets(concrete) == {"A": (-1024, -1, 0, 1, 1024)}


def test_tiled_kernel_shared_bank_conflicts():
    src = """
    #define T 32
    __global__ void tile(const float* in, float* out, int n) {
      __shared__ float t[T][T];
      __shared__ float p[T][T + 1];
      int x = blockIdx.x * T + threadIdx.x, y = blockIdx.y * T + threadIdx.y;
      t[threadIdx.y][threadIdx.x] = in[y * n + x];
      p[threadIdx.x][threadIdx.y] = in[y * n + x];
      __syncthreads();
      out[y * n + x] = t[threadIdx.x][threadIdx.y] + p[threadIdx.y][threadIdx.x];
    }"""
    facts, patterns = check(src, ["read in: coalesced", "read in: coalesced", "write t: coalesced", "write p: coalesced",
                                  "read t: strided", "read p: coalesced", "write out: coalesced"],
                            block=(32, 8, 1), values={"n": 4096})
    conflicted = next(p for p in patterns if p.access.array == "t" and p.access.kind == "read")
    assert conflicted.sectors_per_request == 32
    assert thread_mapping(facts) == "tile"


def test_loaded_index_is_a_gather_and_arithmetic_is_computed_under_the_launch():
    src = """
    __global__ void perm(const float* a, float* b, const int* idx, int k) {
      int i = threadIdx.x;
      b[i] = a[idx[i] * k];
      b[i / k] = a[i % k == 0 ? i : i * k];
    }"""
    facts, patterns = check(src, ["read idx: coalesced", "read a: gather", "write b: coalesced", "write b: coalesced",
                                  "read a: strided None"], values={"k": 3})
    gather = next(p for p in patterns if p.pattern == "gather")
    assert "idx[i]" in gather.why
    # i / 3 over 32 lanes: 11 elements, 2 sectors; the select visits i or 3*i: not evenly spaced.
    by_text = {p.access.text: p for p in patterns}
    assert by_text["b[i / k]"].sectors_per_request == 2
    assert describe(by_text["a[i % k == 0 ? i : i * k]"]).startswith("load of `a`: lanes not evenly spaced")


def test_summary_is_json_ready_and_names_lines():
    src = "__global__ void k(float* y, const float* x, int n) {\n  int i = threadIdx.x;\n  y[i * n] = x[i];\n}\n"
    facts = facts_of(src)
    out = summary(facts, Binding({"n": 64}, (128, 1, 1)))
    assert out["written"] == ["y"] and out["read_only"] == ["x"]
    lines = {a["array"]: a["line"] for a in out["accesses"]}
    assert lines == {"x": 3, "y": 3}
    store = next(a for a in out["accesses"] if a["array"] == "y")
    assert store["describe"] == "store to `y`: 64 elements apart across a warp, 32 sectors per request — uncoalesced"


@pytest.mark.parametrize("src", ["", "garbage ((( [[[ {{{", "__global__ void k(", "\x00\x01\x02"])
def test_broken_input_gives_no_crash(src):
    analyze(preprocess(src))
