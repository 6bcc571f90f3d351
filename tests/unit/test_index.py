"""The kernel index builder: data-driven snippets with the records they must yield."""

from __future__ import annotations

import random

import pytest

from kernel_lsp.core.index import KernelIndex, build_index

SAXPY = """\
#define BLOCK 256
constexpr int TILE = 32;
namespace ns {
template <typename T>
__global__ void __launch_bounds__(BLOCK, 2) kern(const float* __restrict__ a, T *b, int n, float * const c) {
  __shared__ float tile[TILE][TILE + 1];
  __shared__ double acc, other[4];
  extern __shared__ float dyn[];
  #pragma unroll
  for (int i = 0; i < 4; i++) {
    for (int j = 8; j > 0; j -= 2) { b[i] = a[threadIdx.x + blockIdx.y * blockDim.x]; }
  }
  while (n > 0) { n--; }
  __syncthreads();
  atomicAdd(&b[0], 1.0f);
  __syncwarp();
}
}
extern "C" {
__device__ __host__ float dev(float x) { return x; }
__global__ void k2(int *p) {}
}
__global__ void k3(int *p);
__global__ void k2_proto(int *p);
__global__ void k2_proto(int *p) { p[0] = 0; }
void host(int n, float* a, float* b, cudaStream_t s) {
  dim3 block(32, 8);
  ns::kern<float><<<(n + 255) / 256, block, 0, s>>>(a, b, n, 0);
  k2<<<1, BLOCK>>>(p);
}
"""


@pytest.fixture(scope="module")
def saxpy() -> KernelIndex:
    return build_index(SAXPY)


def test_functions_found_with_qualifiers(saxpy: KernelIndex) -> None:
    summary = [(f.qualified_name, f.qualifier, f.is_template, f.is_extern_c, f.body_span is not None) for f in saxpy.functions]
    assert summary == [
        ("ns::kern", "__global__", True, False, True),
        ("dev", "__host__ __device__", False, True, True),
        ("k2", "__global__", False, True, True),
        ("k3", "__global__", False, False, False),
        ("k2_proto", "__global__", False, False, True),
    ]
    assert [k.name for k in saxpy.kernels] == ["kern", "k2", "k3", "k2_proto"]
    assert saxpy.function("host") is None  # host-only functions are not indexed


def test_params(saxpy: KernelIndex) -> None:
    kern = saxpy.function("kern")
    assert kern is not None
    got = [(p.name, p.type_text, p.base_type, p.pointer_depth, p.is_const, p.is_restrict) for p in kern.params]
    assert got == [
        ("a", "const float* __restrict__", "float", 1, True, True),
        ("b", "T*", "T", 1, False, False),
        ("n", "int", "int", 0, False, False),
        # A const pointer to mutable data: the data is not const.
        ("c", "float* const", "float", 1, False, False),
    ]
    assert kern.launch_bounds == ("BLOCK", "2")
    assert kern.return_type == "void"
    line = SAXPY.splitlines()[kern.name_span.start.line]
    assert line[kern.name_span.start.column_byte : kern.name_span.end.column_byte] == "kern"


def test_shared(saxpy: KernelIndex) -> None:
    kern = saxpy.function("kern")
    assert kern is not None
    got = [(d.name, d.type_text, d.dims, d.is_extern, d.size_bytes) for d in kern.shared]
    assert got == [
        ("tile", "float", ("TILE", "TILE + 1"), False, 32 * 33 * 4),
        ("acc", "double", (), False, 8),
        ("other", "double", ("4",), False, 32),
        ("dyn", "float", ("",), True, None),
    ]


def test_loops_syncs_atomics_index_uses(saxpy: KernelIndex) -> None:
    kern = saxpy.function("kern")
    assert kern is not None
    assert [(lp.kind, lp.depth, lp.trip_count, lp.has_pragma_unroll) for lp in kern.loops] == [
        ("for", 1, 4, True),
        ("for", 2, 4, False),
        ("while", 1, None, False),
    ]
    assert [c.name for c in kern.syncs] == ["__syncthreads", "__syncwarp"]
    assert [(c.name, c.args) for c in kern.atomics] == [("atomicAdd", ("&b[0]", "1.0f"))]
    assert kern.thread_index_uses == ("blockDim.x", "blockIdx.y", "threadIdx.x")
    assert [c.name for c in kern.calls] == ["__syncthreads", "atomicAdd", "__syncwarp"]


def test_launches(saxpy: KernelIndex) -> None:
    first, second = saxpy.launches
    assert (first.kernel, first.grid, first.block, first.shared_mem, first.stream, first.args) == (
        "ns::kern", "(n + 255) / 256", "block", "0", "s", ("a", "b", "n", "0"),
    )
    assert first.enclosing_function == "host"
    assert first.enclosing_span is not None and first.enclosing_span.start.line == 25
    assert SAXPY.encode()[first.kernel_span.start_byte : first.kernel_span.end_byte] == b"kern"
    assert (second.kernel, second.grid, second.block, second.shared_mem, second.stream) == ("k2", "1", "BLOCK", None, None)
    assert saxpy.launches_of("kern") == (first,)
    assert saxpy.launches_of("k2") == (second,)
    assert ("BLOCK", "256") in saxpy.constants and ("TILE", "32") in saxpy.constants


def test_positions_lookup(saxpy: KernelIndex) -> None:
    fn = saxpy.function_at(10, 5)
    assert fn is not None and fn.name == "kern"
    launch = saxpy.launch_at(27, 10)
    assert launch is not None and launch.kernel == "ns::kern"


@pytest.mark.parametrize(
    ("loop", "trips"),
    [
        ("for (int i = 0; i < 10; ++i)", 10),
        ("for (int i = 0; i <= 10; i += 3)", 4),
        ("for (int i = 10; i > 0; i--)", 10),
        ("for (int s = 1; s < 256; s *= 2)", 8),
        ("for (int s = 128; s > 0; s >>= 1)", 8),
        ("for (unsigned i = 0; i != 8; i += 2)", 4),
        ("for (int i = 0; i < N; ++i)", 64),
        ("for (int i = 5; i < 5; ++i)", 0),
        ("for (int i = 0; i < n; ++i)", None),
        ("for (int i = threadIdx.x; i < 64; i += blockDim.x)", None),
        ("for (;;)", None),
    ],
)
def test_trip_counts(loop: str, trips: int | None) -> None:
    index = build_index(f"#define N 64\n__global__ void k(int n) {{ {loop} {{ }} }}")
    (kernel,) = index.kernels
    assert kernel.loops[0].trip_count == trips


@pytest.mark.parametrize(
    "source",
    [
        "",
        "int main() { return 0; }",
        "__global__ void k(int *p) { /* unterminated",
        '__global__ void k() { const char* s = "abc\n}',
        "{" * 3000,
        "__global__ void k(){" + "for(;;){" * 500 + "}" * 500 + "}",
        "void h(){ k<<<>>>(); k<<<1>>>(); k<<<a,b,c,d,e>>>(x); }",
        "__global__ void k\udc80(){}",
        "def f(x):\n    return x<<<2>>>(3)\n" * 200,
        "#if 1\n__global__ void k(",
    ],
)
def test_never_raises(source: str) -> None:
    index = build_index(source)
    assert isinstance(index, KernelIndex)


def test_binary_input_is_reported_not_parsed() -> None:
    rng = random.Random(7)
    data = bytes(rng.getrandbits(8) for _ in range(50_000))
    index = build_index(data)
    assert index.functions == ()
    assert "binary" in index.syntax_errors[0].message


def test_syntax_errors_located() -> None:
    source = "__global__ void ok(int* p) { p[0] = 1; }\n__global__ void bad(int* p) { p[0] = ; }\n"
    index = build_index(source)
    assert [k.name for k in index.kernels] == ["ok", "bad"]
    assert index.syntax_errors
    assert all(e.span.start.line == 1 for e in index.syntax_errors)


def test_missing_token_reported() -> None:
    index = build_index("__global__ void k(int* p) { p[0] = 1 }\n")
    assert any(e.message.startswith("missing") for e in index.syntax_errors)


def test_functions_inside_preprocessor_blocks() -> None:
    source = "#ifdef USE_A\n__global__ void a() {}\n#else\n__global__ void b() {}\n#endif\n"
    assert [k.name for k in build_index(source).kernels] == ["a", "b"]


def test_device_launch_and_method_calls() -> None:
    source = "__global__ void child(int* p) {}\n__global__ void parent(int* p) { child<<<1, 32>>>(p); cg::this_thread_block().sync(); }\n"
    index = build_index(source)
    assert index.launches[0].enclosing_function == "parent"
    parent = index.function("parent")
    assert parent is not None
    assert [c.name for c in parent.syncs] == ["cg::this_thread_block().sync"]
    assert all(c.name != "child" for c in parent.calls)


def test_members_static_and_linkage_forms() -> None:
    source = """
static __global__ void s1(int* p) {}
extern "C" __global__ void c1(float* x) {}
template <> __global__ void tk<float>(float* x) {}
__forceinline__ __device__ float fi(float x) { return x; }
struct Runner {
  __device__ float m(float x) { return x; }
  static void go(float* x) { c1<<<1, 128>>>(x); }
};
template <typename T> struct TS { __device__ void f() {} };
auto lam = [](float* x) { c1<<<3, 32>>>(x); };
__global__ void
__launch_bounds__(128)
multi_line(const int* __restrict__ a,
           int* b) {}
"""
    index = build_index(source)
    got = [(f.qualified_name, f.qualifier, f.is_extern_c, f.is_template) for f in index.functions]
    assert got == [
        ("s1", "__global__", False, False),
        ("c1", "__global__", True, False),
        ("tk", "__global__", False, True),
        ("fi", "__device__", False, False),
        ("Runner::m", "__device__", False, False),
        ("TS::f", "__device__", False, True),
        ("multi_line", "__global__", False, False),
    ]
    assert [(launch.grid, launch.enclosing_function) for launch in index.launches] == [("1", "go"), ("3", None)]
    multi = index.function("multi_line")
    assert multi is not None and multi.launch_bounds == ("128",) and multi.name_span.start.line == 13


@pytest.mark.parametrize(
    ("decl", "name", "type_text", "pointer_depth", "is_const"),
    [
        ("float (*p)[4]", "p", "float (*)[4]", 2, False),
        ("int& r", "r", "int&", 0, False),
        ("const Foo& f", "f", "const Foo&", 0, True),
        ("const double c[]", "c", "const double []", 1, True),
        ("float** pp", "pp", "float**", 2, False),
        ("int n = 5", "n", "int", 0, False),
        ("unsigned long long count", "count", "unsigned long long", 0, False),
    ],
)
def test_param_forms(decl: str, name: str, type_text: str, pointer_depth: int, is_const: bool) -> None:
    (fn,) = build_index(f"__global__ void k({decl}) {{}}").functions
    (param,) = fn.params
    assert (param.name, param.type_text, param.pointer_depth, param.is_const) == (name, type_text, pointer_depth, is_const)


def test_signature_and_return_types() -> None:
    index = build_index(
        "__device__ const float* ptr(const float* p) { return p; }\n"
        "__device__ float& at(float* p, int i) { return p[i]; }\n"
        "namespace ns { __global__ void __launch_bounds__(128, 4) k(int n) {} }\n"
    )
    assert [f.signature for f in index.functions] == [
        "__device__ const float* ptr(const float* p)",
        "__device__ float& at(float* p, int i)",
        "__global__ __launch_bounds__(128, 4) void ns::k(int n)",
    ]
