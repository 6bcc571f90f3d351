"""Stencil and filter inputs staged through a shared-memory window (stencil-shared-window): where it
applies (1-D, 2-D and 3-D blocks, planes no thread moves along, tap loops of constant or spec-known
trips, straight-line taps), each refusal's reason, the rewrite run against the original on the CPU
(cpu_cuda.py: real barriers) at ragged sizes where the border blocks take the original path, and nvcc
on every candidate."""

from __future__ import annotations

import shutil

import pytest

from cpu_cuda import run_on_cpu
from nvcc_check import compiles
from rule_specs import arr, outcome, scalar, spec_of

RULE = "stencil-shared-window"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

CONV2D = """
#define R 2
#define IDX(r, c, w) ((r) * (w) + (c))
__global__ void __launch_bounds__(128) conv2d(const float* in, const float* __restrict__ mask, float* out, int h, int w) {
  const long col = blockIdx.x * (long)blockDim.x + threadIdx.x;
  const long row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row < R || row >= h - R || col < R || col >= w - R) return;
  float sum = 0.0f;
  #pragma unroll
  for (int dy = -R; dy <= R; ++dy)
    for (int dx = -R; dx <= R; ++dx)
      sum += in[IDX(row + dy, col + dx, w)] * mask[(dy + R) * (2 * R + 1) + dx + R];
  out[IDX(row, col, w)] = sum;
}
"""
CONV2D_SPEC = spec_of("conv2d", [arr("in", "h*w"), arr("mask", "25"), arr("out", "h*w", "out"), scalar("h", 1024),
                                 scalar("w", 1024)], ["ceil_div(w,32)", "ceil_div(h,4)", 1], [32, 4, 1], [{"h": 37, "w": 45}])
CONV2D_MAIN = r"""
int main() {
  const int h = 37, w = 70;
  std::vector<float> in(h * w), mask(25), out(h * w, -3.0f);
  for (int i = 0; i < h * w; i++) in[i] = (float)((i * 37) % 101) / 8.0f - 6.0f;
  for (int i = 0; i < 25; i++) mask[i] = (float)(i % 7) - 2.5f;
  kl_launch({(w + 31) / 32, (h + 3) / 4, 1}, {32, 4, 1}, [&] { conv2d(in.data(), mask.data(), out.data(), h, w); });
  for (float v : out) printf("%a\n", v);
}
"""


def _applied(source: str, spec: dict):
    found = outcome(RULE, source, spec)
    assert found.applicable, found.why
    (rewrite,) = found.rewrites
    assert rewrite.launch_override is None and rewrite.grid_scale is None
    return found, rewrite


def test_a_2d_filter_with_tap_loops_reads_its_window(tmp_path):
    found, rw = _applied(CONV2D, CONV2D_SPEC)
    assert "`in` (25 taps, a window of 8 x 36)" in found.why
    src = rw.source
    # The user's macros stay; the taps read the window at the thread's position plus the loop's offset.
    assert "__shared__ float kl_w0[8][36];" in src
    assert "kl_w0[(int)threadIdx.y + (int)(dy - (-2LL))][(int)threadIdx.x + (int)(dx - (-2LL))]" in src
    assert "if (kl_on && (row < R || row >= h - R || col < R || col >= w - R)) kl_on = false;" in src
    assert "const int kl_all = __syncthreads_and(kl_on);" in src
    # The full box of taps reaches every element of the window: no coverage test.
    assert "kl_i0 >=" not in src
    # The original code stays for the border blocks, the pragma with its loop in both paths.
    assert src.count("in[IDX(row + dy, col + dx, w)]") == 1
    assert src.count("#pragma unroll\n  for (int dy = -R") == 2 or src.count("#pragma unroll") == 2
    if shutil.which("g++"):
        before = run_on_cpu(CONV2D, CONV2D_MAIN, tmp_path, "conv2d")
        assert run_on_cpu(src, CONV2D_MAIN, tmp_path, "conv2d_window") == before
        # Launched in blocks of another shape than the window was sized for: the original path.
        other = CONV2D_MAIN.replace("{(w + 31) / 32, (h + 3) / 4, 1}, {32, 4, 1}", "{(w + 15) / 16, (h + 7) / 8, 1}, {16, 8, 1}")
        assert run_on_cpu(src, other, tmp_path, "conv2d_window_other") == before
    if shutil.which("nvcc"):
        compiles(src, tmp_path)


CONV1D = """
typedef float real;
__global__ void conv1d(const real* __restrict__ x, const real* __restrict__ taps, real* __restrict__ y, int n, int r) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= r && i < n - r) {
    real acc = 0;
    for (int k = -r; k <= r; k++) acc += taps[k + r] * x[i + k];
    y[i] = acc;
  }
}
"""
CONV1D_SPEC = spec_of("conv1d", [arr("x", "n"), arr("taps", "2*r+1"), arr("y", "n", "out"), scalar("n", 1 << 20),
                                 scalar("r", 4)], ["ceil_div(n,128)", 1, 1], [128, 1, 1], [{"n": 1000}])
CONV1D_MAIN = r"""
int main() {
  const int n = 1001;
  std::vector<float> x(n), taps(2 * R_ + 1), y(n, 5.0f);
  for (int i = 0; i < n; i++) x[i] = (float)((i * 13) % 29) - 14.0f;
  for (int i = 0; i < 2 * R_ + 1; i++) taps[i] = 0.25f * (i + 1);
  kl_launch({(n + 127) / 128, 1, 1}, {128, 1, 1}, [&] { conv1d(x.data(), taps.data(), y.data(), n, R_); });
  for (float v : y) printf("%a\n", v);
}
"""


@pytest.mark.parametrize("radius", [4, 3])
def test_a_1d_filter_whose_radius_is_a_parameter_takes_the_window_at_the_spec_radius(radius, tmp_path):
    found, rw = _applied(CONV1D, CONV1D_SPEC)
    assert "the fast path needs r == 4" in found.why
    src = rw.source
    assert "__shared__ real kl_w0[136];" in src or "__shared__ float kl_w0[136];" in src
    assert "if (kl_all && blockDim.x == 128u && blockDim.y == 1u && blockDim.z == 1u && r == 4)" in src
    if shutil.which("g++"):
        # At another radius the original path runs: the same results either way.
        main = CONV1D_MAIN.replace("R_", str(radius))
        assert run_on_cpu(src, main, tmp_path, f"conv1d_window{radius}") == run_on_cpu(CONV1D, main, tmp_path,
                                                                                       f"conv1d{radius}")
    if shutil.which("nvcc"):
        compiles(src, tmp_path)


JACOBI = """
__global__ void jacobi(int n, float* A, float* B) {
  int i = blockIdx.y * blockDim.y + threadIdx.y;
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 1 && i < n - 1 && j >= 1 && j < n - 1) {
    B[i*n + j] = 0.2f * (A[i*n + j] + A[i*n + (j-1)] + A[i*n + (1 + j)] + A[(1 + i)*n + j] + A[(i-1)*n + j]);
  }
}
"""
JACOBI_SPEC = spec_of("jacobi", [scalar("n", 1024), arr("A", "n*n"), arr("B", "n*n", "out")],
                      ["ceil_div(n,32)", "ceil_div(n,8)", 1], [32, 8, 1], [{"n": 500}])
JACOBI_MAIN = r"""
int main() {
  const int n = 45;
  std::vector<float> A(n * n), B(n * n, 0.5f);
  for (int i = 0; i < n * n; i++) A[i] = (float)((i * 7) % 23) - 11.0f;
  kl_launch({(n + 31) / 32, (n + 7) / 8, 1}, {32, 8, 1}, [&] { jacobi(n, A.data(), B.data()); });
  for (float v : B) printf("%a\n", v);
}
"""


def test_a_cross_shaped_stencil_loads_no_corner_of_its_window(tmp_path):
    found, rw = _applied(JACOBI, JACOBI_SPEC)
    src = rw.source
    assert "__shared__ float kl_w0[10][34];" in src
    # The corners of the 10 x 34 window are read by no tap: the load skips them.
    assert "if ((kl_i0 >= 1 && kl_i0 < 9) || (kl_i1 >= 1 && kl_i1 < 33)) kl_w0[kl_i0][kl_i1]" in src \
        or "if ((kl_i1 >= 1 && kl_i1 < 33) || (kl_i0 >= 1 && kl_i0 < 9)) kl_w0[kl_i0][kl_i1]" in src
    # The guard is the fast path's condition: its body runs without it.
    assert "kl_on = kl_on && (i >= 1 && i < n - 1 && j >= 1 && j < n - 1);" in src
    if shutil.which("g++"):
        assert run_on_cpu(src, JACOBI_MAIN, tmp_path, "jacobi_window") == run_on_cpu(JACOBI, JACOBI_MAIN, tmp_path, "jacobi")
    if shutil.which("nvcc"):
        compiles(src, tmp_path)


HEAT3D = """
#define AT(x, y, z) ((z) * (size_t)nx * ny + (y) * (size_t)nx + (x))
__global__ void heat(const double* __restrict__ u, double* __restrict__ v, int nx, int ny, int nz, double c) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  int z = blockIdx.z * blockDim.z + threadIdx.z;
  if (x < 1 || y < 1 || z < 1) return;
  if (x >= nx - 1 || y >= ny - 1 || z >= nz - 1) return;
  v[AT(x, y, z)] = u[AT(x, y, z)] + c * (u[AT(x - 1, y, z)] + u[AT(x + 1, y, z)] + u[AT(x, y - 1, z)]
                   + u[AT(x, y + 1, z)] + u[AT(x, y, z - 1)] + u[AT(x, y, z + 1)] - 6.0 * u[AT(x, y, z)]);
}
"""
HEAT3D_SPEC = {**spec_of("heat", [{"name": "u", "array": "float64", "size": "nx*ny*nz", "init": "uniform(0,1)", "role": "in"},
                                  {"name": "v", "array": "float64", "size": "nx*ny*nz", "init": "zeros", "role": "out"},
                                  scalar("nx", 256), scalar("ny", 256), scalar("nz", 64),
                                  {"name": "c", "scalar": "float64", "value": 0.1}],
                         ["ceil_div(nx,16)", "ceil_div(ny,4)", "ceil_div(nz,4)"], [16, 4, 4], [{"nx": 30, "ny": 19, "nz": 11}])}
HEAT3D_MAIN = r"""
int main() {
  const int nx = 30, ny = 11, nz = 9;
  std::vector<double> u(nx * ny * nz), v(nx * ny * nz, -1.0);
  for (int i = 0; i < nx * ny * nz; i++) u[i] = (double)((i * 31) % 17) / 4.0;
  kl_launch({(nx + 15) / 16, (ny + 3) / 4, (nz + 3) / 4}, {16, 4, 4}, [&] { heat(u.data(), v.data(), nx, ny, nz, 0.1); });
  for (double d : v) printf("%a\n", d);
}
"""


def test_a_3d_stencil_on_a_3d_block_reads_a_3d_window(tmp_path):
    found, rw = _applied(HEAT3D, HEAT3D_SPEC)
    src = rw.source
    assert "__shared__ double kl_w0[6][6][18];" in src
    assert "kl_w0[(int)threadIdx.z + 1][(int)threadIdx.y + 1][(int)threadIdx.x]" in src  # u[AT(x - 1, y, z)]
    # Two exits, both turned into the flag.
    assert src.count("kl_on = false;") == 2
    if shutil.which("g++"):
        assert run_on_cpu(src, HEAT3D_MAIN, tmp_path, "heat_window") == run_on_cpu(HEAT3D, HEAT3D_MAIN, tmp_path, "heat")
    if shutil.which("nvcc"):
        compiles(src, tmp_path)


PLANES = """
#define NJ 64
#define NK 96
__global__ void conv3(int ni, int nj, int nk, float* A, float* B, int i) {
  int k = blockIdx.x * blockDim.x + threadIdx.x;
  int j = blockIdx.y * blockDim.y + threadIdx.y;
  if ((i < ni - 1) && (j < nj - 1) && (k < nk - 1) && (i > 0) && (j > 0) && (k > 0)) {
    B[i*(NK * NJ) + j*NK + k] = 2 * A[(i - 1)*(NK * NJ) + (j - 1)*NK + (k - 1)] + 4 * A[(i + 1)*(NK * NJ) + (j - 1)*NK + (k - 1)]
        - 3 * A[(i + 0)*(NK * NJ) + (j - 1)*NK + (k + 0)] + 6 * A[(i + 0)*(NK * NJ) + (j + 0)*NK + (k + 0)]
        - 9 * A[(i + 0)*(NK * NJ) + (j + 1)*NK + (k + 0)] + 7 * A[(i + 1)*(NK * NJ) + (j + 0)*NK + (k + 1)]
        + 10 * A[(i + 1)*(NK * NJ) + (j + 1)*NK + (k + 1)] - 8 * A[(i - 1)*(NK * NJ) + (j + 1)*NK + (k + 1)];
  }
}
"""
PLANES_SPEC = spec_of("conv3", [scalar("ni", 32), scalar("nj", 64), scalar("nk", 96), arr("A", "32*64*96"),
                                arr("B", "32*64*96", "out"), scalar("i", 16)], [3, 8, 1], [32, 8, 1], [{"i": 1}])
PLANES_MAIN = r"""
int main() {
  const int ni = 32, nj = 61, nk = 90;
  std::vector<float> A(32 * 64 * 96), B(32 * 64 * 96, 0.0f);
  for (int e = 0; e < 32 * 64 * 96; e++) A[e] = (float)((e * 11) % 19) - 9.0f;
  for (int i = 1; i < 4; i++)
    kl_launch({3, 8, 1}, {32, 8, 1}, [&] { conv3(ni, nj, nk, A.data(), B.data(), i); });
  for (int e = 0; e < 4 * 64 * 96; e++) printf("%a\n", B[e]);
}
"""


def test_planes_no_thread_moves_along_are_axes_of_the_window(tmp_path):
    found, rw = _applied(PLANES, PLANES_SPEC)
    src = rw.source
    # Planes i-1, i, i+1 (the parameter i's stride), rows j-1..j+1, columns k-1..k+1.
    assert "__shared__ float kl_w0[3][10][34];" in src
    assert "(long long)kl_i0 * (6144LL)" in src
    if shutil.which("g++"):
        assert run_on_cpu(src, PLANES_MAIN, tmp_path, "conv3_window") == run_on_cpu(PLANES, PLANES_MAIN, tmp_path, "conv3")
    if shutil.which("nvcc"):
        compiles(src, tmp_path)


def _with_bound_from_memory(source: str) -> str:
    return source.replace("int n, int r)", "int n, int r, const int* m)").replace("k <= r;", "k <= m[0];")


@pytest.mark.parametrize("edit, reason", [
    # The input written by the kernel itself: the window could be stale.
    (lambda s: s.replace("y[i] = acc;", "y[i] = acc; x[i] = acc;"), "no array the kernel only reads"),
    # A tap skipped by some threads: an element of the window might be read by nobody.
    (lambda s: s.replace("acc += taps", "if (k != 0) acc += taps"),
     "runs under a condition other than the kernel's leading exits and guard"),
    # A loop bound read from memory.
    (_with_bound_from_memory, "has a bound (`m[0]`) that is neither a constant nor an integer parameter"),
    # A tap loop starting where the thread is: the start, not the bound, is what the refusal names.
    (lambda s: s.replace("for (int k = -r;", "for (int k = -r + n % 2;"), "has a start (`n % 2`)"),
    # Taps two elements apart along threadIdx.x: not a row of the window.
    (lambda s: s.replace("x[i + k]", "x[2 * i + k]"), "not read at unit stride along threadIdx.x"),
    # A tap loop that may stop early.
    (lambda s: s.replace("acc += taps[k + r] * x[i + k];", "{ acc += taps[k + r] * x[i + k]; if (acc > 9) break; }"),
     "can leave an iteration early"),
])
def test_refusals_name_the_missing_fact(edit, reason):
    spec = CONV1D_SPEC
    if edit is _with_bound_from_memory:
        spec = {**spec, "params": [*spec["params"], {"name": "m", "array": "int32", "size": "1", "init": "zeros", "role": "in"}]}
    found = outcome(RULE, edit(CONV1D), spec)
    assert not found.applicable
    assert reason in found.why, found.why


def test_memory_read_after_an_exit_is_refused():
    source = CONV1D.replace("  if (i >= r && i < n - r) {\n", "  if (i >= n) return;\n  float t0 = taps[0];\n"
                            "  if (i >= r && i < n - r) {\n").replace("acc += taps[k + r]", "acc += t0 * taps[k + r]")
    found = outcome(RULE, source, CONV1D_SPEC)
    assert not found.applicable
    assert "accesses memory" in found.why


def test_small_reuse_is_not_worth_a_barrier():
    source = """
__global__ void diff(const float* a, float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i + 64 < n) b[i] = a[i + 64] - a[i];
}
"""
    spec = spec_of("diff", [arr("a", "n"), arr("b", "n", "out"), scalar("n", 4096)], ["ceil_div(n,32)", 1, 1], [32, 1, 1])
    found = outcome(RULE, source, spec)
    assert not found.applicable
    # 64 elements apart is more than a stencil's reach.
    assert "more than 16" in found.why or "not worth a barrier" in found.why


def test_a_problem_size_the_analysis_saw_expanded_is_written_as_the_users_macro():
    """The harness's static check rejects a literal equal to a problem size that the original file does not hold:
    a pitch the analysis saw as 2048 (a header's macro, expanded) is written with the macro, or the rule refuses."""
    from kernel_lsp.core.rules import evaluate, rule_by_name
    from kernel_lsp.core.source import preprocess
    from kernel_lsp.core.spec import parse_spec
    from kernel_lsp.core.static_check import check

    spec = parse_spec({**JACOBI_SPEC, "params": [scalar("n", 2048), *JACOBI_SPEC["params"][1:]]})
    body = JACOBI.replace("i*n", "i*N").replace("(1 + i)*n", "(1 + i)*N").replace("(i-1)*n", "(i-1)*N")

    def run(header: str):
        source = '#include "sizes.h"\n' + body
        pre = preprocess(source, "/w/k.cu", lambda path: header if path.endswith("sizes.h") else None)
        return source, evaluate(source, "jacobi", spec, [rule_by_name(RULE)], preprocessed=pre)[0]

    source, found = run("#define N 2048\n")
    assert found.applicable, found.why
    (rw,) = found.rewrites
    assert "(long long)kl_i0 * (((long long)N))" in rw.source
    assert not check(source, rw.source, spec).errors
    # A value the header spells only as a product, with no macro of its own: the literal would be new, refused.
    source, found = run("#define M 1024\n#define N (2 * M)\n")
    assert not found.applicable and "literal 2048" in found.why, found.why


@needs_gxx
def test_a_tap_loop_written_as_a_while_loop_reads_the_window_too(tmp_path):
    source = CONV1D.replace("for (int k = -r; k <= r; k++) acc += taps[k + r] * x[i + k];",
                            "int k = -r;\n    while (k <= r) { acc += taps[k + r] * x[i + k]; k += 1; }")
    assert source != CONV1D
    found, rw = _applied(source, CONV1D_SPEC)
    assert "the fast path needs r == 4" in found.why
    main = CONV1D_MAIN.replace("R_", "4")
    assert run_on_cpu(rw.source, main, tmp_path, "conv1d_while_window") == run_on_cpu(source, main, tmp_path, "conv1d_while")
    # Its counter assigned besides the step: not a tap loop the analysis follows.
    twice = source.replace("k += 1; }", "k += 1; k += 0; }")
    assert "no counter the analysis follows" in outcome(RULE, twice, CONV1D_SPEC).why
