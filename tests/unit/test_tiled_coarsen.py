"""Register blocking inside a kernel's own tiling (tiled-register-block): each thread runs the same thread
of R neighbouring blocks in lockstep, the shared tile they have in common loaded once. Where it applies,
each refusal's reason, the rewrite run against the original on the CPU (cpu_cuda.py: real barriers) at
ragged grids (copies past the grid store nothing), and nvcc on every candidate."""

from __future__ import annotations

import shutil

import pytest

from cpu_cuda import run_on_cpu
from nvcc_check import compiles
from rule_specs import arr, outcome, scalar, spec_of

RULE = "tiled-register-block"

MATMUL = """
#define TILE 16
__global__ void __launch_bounds__(256) matmul(const float* A, const float* B, float* C, int n) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE];
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * TILE + ty;
  int col = blockIdx.x * TILE + tx;
  float sum = 0.0f;
  for (int t = 0; t < (n + TILE - 1) / TILE; ++t) {
    As[ty][tx] = (row < n && t * TILE + tx < n) ? A[row * n + t * TILE + tx] : 0.0f;
    Bs[ty][tx] = (col < n && t * TILE + ty < n) ? B[(t * TILE + ty) * n + col] : 0.0f;
    __syncthreads();
    #pragma unroll
    for (int k = 0; k < TILE; ++k) sum += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  if (row < n && col < n) C[row * n + col] = sum;
}
"""
MATMUL_SPEC = spec_of("matmul", [arr("A", "n*n"), arr("B", "n*n"), arr("C", "n*n", "out"), scalar("n", 1024)],
                      ["ceil_div(n,16)", "ceil_div(n,16)", 1], [16, 16, 1], [{"n": 200}])
MATMUL_MAIN = r"""
int main() {
  const int n = 37;
  std::vector<float> A(n * n), B(n * n), C(n * n, -1.0f);
  for (int i = 0; i < n * n; i++) { A[i] = (float)((i * 7) % 13) - 6.0f; B[i] = (float)((i * 5) % 11) - 5.0f; }
  kl_launch({(n + 15) / 16, GY, 1}, {16, 16, 1}, [&] { matmul(A.data(), B.data(), C.data(), n); });
  for (float v : C) printf("%a\n", v);
}
"""


def _rewrites(source, spec):
    found = outcome(RULE, source, spec)
    assert found.applicable, found.why
    return found, found.rewrites


def test_a_tiled_matmul_shares_the_b_tile_between_the_copies(tmp_path):
    found, rewrites = _rewrites(MATMUL, MATMUL_SPEC)
    assert "`Bs` the same for neighbouring blocks along y" in found.why
    assert [r.variant for r in rewrites] == ["4y", "2y"]
    before = run_on_cpu(MATMUL, MATMUL_MAIN.replace("GY", "(n + 15) / 16"), tmp_path, "mm") if shutil.which("g++") else None
    for rw in rewrites:
        r = int(rw.variant[0])
        assert rw.grid_divide == (1, r, 1) and rw.launch_override["grid"][1] == f"ceil_div(ceil_div(n,16), {r})"
        src = rw.source
        # One B tile for all the copies, an A tile and an accumulator each; one pair of barriers per tile.
        assert src.count("__shared__ float Bs[TILE][TILE];") == 1
        assert all(f"__shared__ float As_kl{q}[TILE][TILE];" in src for q in range(r))
        assert f"sum_kl{r - 1} += As_kl{r - 1}[ty][k] * Bs[k][tx];" in src
        assert src.count("__syncthreads();") == 2
        # A copy past the grid stores nothing.
        assert "if (kl_live1) { if (row_kl1 < n && col < n) C[row_kl1 * n + col] = sum_kl1; }" in src
        if before is not None:
            # 37 x 37: 3 blocks along y, so the last block's copies past the grid are dead.
            assert run_on_cpu(src, MATMUL_MAIN.replace("GY", f"(3 + {r - 1}) / {r}"), tmp_path, f"mm{r}") == before
        if shutil.which("nvcc"):
            compiles(src, tmp_path)


LU = """
#define BS 16
__global__ void lu_update(float* m, int dim, int offset) {
  __shared__ float row_panel[BS][BS];
  __shared__ float col_panel[BS][BS];
  int i;
  float sum;
  int grow = offset + (blockIdx.y + 1) * BS;
  int gcol = offset + (blockIdx.x + 1) * BS;
  row_panel[threadIdx.y][threadIdx.x] = m[(offset + threadIdx.y) * dim + gcol + threadIdx.x];
  col_panel[threadIdx.y][threadIdx.x] = m[(grow + threadIdx.y) * dim + offset + threadIdx.x];
  __syncthreads();
  sum = 0;
  for (i = 0; i < BS; i++)
    sum += col_panel[threadIdx.y][i] * row_panel[i][threadIdx.x];
  m[(grow + threadIdx.y) * dim + gcol + threadIdx.x] -= sum;
}
"""
LU_SPEC = spec_of("lu_update", [arr("m", "dim*dim", "inout"), scalar("dim", 2048), scalar("offset", 0)],
                  ["(dim-offset)/16-1", "(dim-offset)/16-1", 1], [16, 16, 1], [{"offset": 1024}, {"dim": 256}])
LU_MAIN = r"""
int main() {
  const int dim = 96, offset = 16;
  std::vector<float> m(dim * dim);
  for (int i = 0; i < dim * dim; i++) m[i] = (float)((i * 3) % 17) - 8.0f;
  const unsigned g = (dim - offset) / 16 - 1;
  kl_launch({g, GY, 1}, {16, 16, 1}, [&] { lu_update(m.data(), dim, offset); });
  for (float v : m) printf("%a\n", v);
}
"""


def test_an_lu_update_in_place_shares_its_row_panel_and_subtracts_once_per_element(tmp_path):
    found, rewrites = _rewrites(LU, LU_SPEC)
    assert "`row_panel`" in found.why
    for rw in rewrites:
        r = int(rw.variant[0])
        src = rw.source
        assert src.count("__shared__ float row_panel[BS][BS];") == 1
        # The loop counter is the copies' common one; the read-modify-write store is each copy's, guarded.
        assert src.count("for (i = 0; i < BS; i++)") == 1
        assert "if (kl_live0) { m[(grow_kl0 + threadIdx.y) * dim + gcol + threadIdx.x] -= sum_kl0; }" in src
        if shutil.which("g++"):
            # 5 blocks along y: ragged for both 4 and 2 copies.
            before = run_on_cpu(LU, LU_MAIN.replace("GY", "g"), tmp_path, "lu")
            assert run_on_cpu(src, LU_MAIN.replace("GY", f"(g + {r - 1}) / {r}"), tmp_path, f"lu{r}") == before
        if shutil.which("nvcc"):
            compiles(src, tmp_path)


@pytest.mark.parametrize("edit, reason", [
    (lambda s: s.replace("  if (row < n && col < n) C", "  if (row >= n) return;\n  if (col < n) C"), "`return` or `goto`"),
    # Each edit reads both block indices, so neither axis has copies that agree.
    (lambda s: s.replace("    __syncthreads();\n  }", "    if (row < n && col < n) __syncthreads();\n  }"),
     "under a condition that differs between the copies"),
    (lambda s: s.replace("t < (n + TILE - 1) / TILE", "t < (n + TILE - 1) / TILE && row + col < n + t"),
     "holds a barrier and its header differs between the copies"),
    (lambda s: s.replace("B[(t * TILE + ty) * n + col]", "B[(t * TILE + ty) * n + col + row * 0]").replace(
        "A[row * n + t * TILE + tx]", "A[row * n + t * TILE + tx + col * 0]"),
     "no shared array is the same for neighbouring blocks"),
    (lambda s: "__device__ int tile_row() { return blockIdx.y * TILE; }\n" + s.replace("int row = blockIdx.y * TILE", "int row = tile_row()"),
     "the helper `tile_row` reads the block index"),
    (lambda s: "__device__ int tile_row(int);\n" + s.replace("int row = blockIdx.y * TILE", "int row = tile_row(blockIdx.y)"),
     "calls `tile_row`, which the analysis does not see"),
    (lambda s: s.replace("__syncthreads();", "").replace("__shared__ float As[TILE][TILE];", ""),
     "does not tile through shared memory with barriers"),
])
def test_refusals_name_the_missing_fact(edit, reason):
    found = outcome(RULE, edit(MATMUL), MATMUL_SPEC)
    assert not found.applicable
    assert reason in found.why, found.why


def test_a_grid_the_kernel_cannot_compute_is_refused():
    spec = dict(MATMUL_SPEC, grid=["ceil_div(n,16)", 64, 1], variants=[])
    found = outcome(RULE, MATMUL, spec)
    # Along y the grid is a literal 64 the kernel could compute, but it is also no problem size: it applies;
    # with the grid from a parameter the kernel does not take, it does not.
    assert found.applicable, found.why
    spec = dict(MATMUL_SPEC, params=[*MATMUL_SPEC["params"], scalar("rows", 64)], grid=["rows", "rows", 1],
                variants=[])
    found = outcome(RULE, MATMUL, spec)
    assert not found.applicable and "not an expression of the kernel's integer parameters" in found.why, found.why


def test_a_helper_of_its_arguments_only_is_copied_with_the_statement_that_calls_it(tmp_path):
    source = "__device__ __forceinline__ int tile_origin(int b, int t) { return b * TILE + t; }\n" + MATMUL.replace(
        "int row = blockIdx.y * TILE + ty;", "int row = tile_origin(blockIdx.y, ty);")
    source = source.replace("#define TILE 16\n", "")
    source = "#define TILE 16\n" + source
    found, rewrites = _rewrites(source, MATMUL_SPEC)
    assert "int row_kl1 = tile_origin(kl_b1, ty);" in rewrites[0].source
    if shutil.which("g++"):
        before = run_on_cpu(source, MATMUL_MAIN.replace("GY", "(n + 15) / 16"), tmp_path, "mmh")
        assert run_on_cpu(rewrites[1].source, MATMUL_MAIN.replace("GY", "2"), tmp_path, "mmh2") == before


def test_a_refusal_names_the_line_of_the_users_file():
    """Ten macro definitions above the kernel: the preprocessed view's lines are not the file's."""
    source = "".join(f"#define D{n} {n}\n" for n in range(10)) + """
__global__ void k(const float* in, float* out, int nb) {
    __shared__ float s[256];
    int bx = blockIdx.x;
    if (bx < nb) {
        s[threadIdx.x] = in[threadIdx.x];
        __syncthreads();
        out[bx * 256 + threadIdx.x] = s[255 - threadIdx.x] * 2.0f;
    }
}
"""
    assert source.split("\n")[14].strip() == "if (bx < nb) {"
    spec = spec_of("k", [arr("in", "256"), arr("out", "nb*256", "out"), scalar("nb", 4096)], ["nb", 1, 1], [256, 1, 1])
    found = outcome("tiled-register-block", source, spec)
    assert "a barrier is under a condition that differs between the copies (line 15)" in found.why, found.why


def test_an_atomic_is_not_taken_for_an_unseen_call():
    source = """
__global__ void hist(const int* keys, unsigned* bins, int n) {
    __shared__ int tile[256];
    int i = blockIdx.x * 256 + threadIdx.x;
    tile[threadIdx.x] = i < n ? keys[i] : 0;
    __syncthreads();
    if (i < n) atomicAdd(&bins[tile[255 - threadIdx.x] & 63], 1u);
}
"""
    spec = spec_of("hist", [{"name": "keys", "array": "int32", "size": "n", "init": "randint(0,63)", "role": "in"},
                            {"name": "bins", "array": "uint32", "size": "64", "init": "zeros", "role": "inout"},
                            scalar("n", 1 << 20)], ["ceil_div(n,256)", 1, 1], [256, 1, 1])
    found = outcome("tiled-register-block", source, spec)
    assert "atomicAdd" not in found.why, found.why
