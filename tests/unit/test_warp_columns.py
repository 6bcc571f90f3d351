"""warp-columns: a warp-per-output column reduction run with a warp's lanes across neighbouring outputs.
Each rewrite runs on the CPU (cpu_cuda.py) beside the original at ragged sizes and compiles with nvcc;
each refusal names the missing fact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cpu_cuda import run_on_cpu
from nvcc_check import compiles
from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
needs_gpp = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

# Sums and maxima of a matrix's columns, one warp per column: the warp's index from the raw thread index,
# its tile from the block made in place, a macro for the lanes, __launch_bounds__ on the kernel.
COLUMNS = """
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
#define LANES 32

__global__ void __launch_bounds__(256) column_stats(const float* __restrict__ x, float* sums, float* peaks,
                                                    int rows, int cols) {
    cg::thread_block_tile<LANES> tile = cg::tiled_partition<LANES>(cg::this_thread_block());
    int col = (blockIdx.x * blockDim.x + threadIdx.x) / LANES;
    if (col >= cols) return;
    float s = 0.0f, m = -1e30f;
    for (int r = threadIdx.x % LANES; r < rows; r += tile.size()) {
        float v = x[(size_t)r * cols + col];
        s += v;
        m = fmaxf(m, v);
    }
    s = cg::reduce(tile, s, cg::plus<float>());
    m = cg::reduce(tile, m, cg::greater<float>{});
    if (tile.thread_rank() == 0) {
        sums[col] = s;
        peaks[col] = m;
    }
}
"""
# The same with raw indices: bit operations for the lane and the warp, butterflies of shuffles, a guard
# instead of an early return (the last warps' lanes take part in the shuffles).
SHUFFLES = """
#define FULL 0xffffffffu
__global__ void column_stats(const float* x, float* sums, float* peaks, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int col = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    float s = 0.0f, m = -1e30f;
    if (col < cols) {
        for (int r = lane; r < rows; r += 32) {
            float v = x[r * cols + col];
            s += v;
            m = fmaxf(m, v);
        }
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
    for (int o = 16; o > 0; o /= 2)
        m = fmaxf(m, __shfl_xor_sync(FULL, m, o));
    if (lane == 0 && col < cols) {
        sums[col] = s;
        peaks[col] = m;
    }
}
"""
SPEC = {"kernel": "column_stats", "params": [
    {"name": "x", "array": "float32", "size": "rows*cols", "init": "uniform(-1,1)", "role": "in"},
    {"name": "sums", "array": "float32", "size": "cols", "init": "zeros", "role": "out"},
    {"name": "peaks", "array": "float32", "size": "cols", "init": "zeros", "role": "out"},
    {"name": "rows", "scalar": "int32", "value": 4096},
    {"name": "cols", "scalar": "int32", "value": 1000}],
    "grid": ["ceil_div(cols*32,256)", 1, 1], "block": [256, 1, 1],
    "variants": [{"rows": 33, "cols": 7}, {"rows": 1, "cols": 100}],
    "tolerance": {"rtol": 1e-4, "atol": 1e-4}}

MAIN = r"""
int main() {
  const int rows = ROWS, cols = COLS;
  std::vector<float> x((size_t)rows * cols), sums(cols, -7.0f), peaks(cols, -7.0f);
  for (size_t i = 0; i < x.size(); i++) x[i] = (float)((i * 7919) % 2003) / 1001.0f - 1.0f;
  kl_launch({GRID, 1, 1}, {BX, BY, 1}, [&] { column_stats(x.data(), sums.data(), peaks.data(), rows, cols); });
  for (int c = 0; c < cols; c++) printf("%.7e %.7e\n", sums[c], peaks[c]);
}
"""


def outcome(source: str = COLUMNS, spec: dict | None = None):
    return evaluate(source, "column_stats", parse_spec(spec or SPEC), [rule_by_name("warp-columns")])[0]


def _run(source: str, tmp_path: Path, name: str, rows: int, cols: int, block: tuple[int, int], grid: int) -> list[float]:
    main = (MAIN.replace("ROWS", str(rows)).replace("COLS", str(cols)).replace("GRID", str(grid))
            .replace("BX", str(block[0])).replace("BY", str(block[1])))
    return [float(v) for v in run_on_cpu(source, main, tmp_path, name).split()]


@needs_gpp
@pytest.mark.parametrize("source", [COLUMNS, SHUFFLES], ids=["cooperative-groups", "shuffles"])
@pytest.mark.parametrize("rows,cols", [(77, 100), (5, 13), (40, 1)])
def test_the_regrouped_warps_give_the_originals_results(source, rows, cols, tmp_path):
    found = outcome(source)
    assert found.applicable, found.why
    assert [rw.variant for rw in found.rewrites] == ["16x32", "32x32"]
    original = _run(source, tmp_path, "original", rows, cols, (256, 1), -(-cols * 32 // 256))
    assert all(v != -7.0 for v in original)
    for rw in found.rewrites:
        columns = rw.block[0]
        divide = rw.grid_divide[0]
        got = _run(rw.source, tmp_path, f"cols{columns}", rows, cols, (columns, 32), -(-(-(-cols * 32 // 256)) // divide))
        assert got == pytest.approx(original, rel=1e-5, abs=1e-5)


def test_the_rewrite_renames_indices_and_keeps_the_launch_bound_with_the_block():
    found = outcome()
    assert found.applicable, found.why
    wide = next(rw for rw in found.rewrites if rw.variant == "32x32")
    assert wide.launch_override["block"] == [32, 32, 1] and wide.grid_divide == (4, 1, 1)
    assert wide.launch_override["grid"][0] == "((ceil_div(cols*32,256)) + 3) / 4"
    source = wide.source
    assert "__launch_bounds__(1024)" in source and "__launch_bounds__(256)" not in source
    assert "int col = (kl_vbid * kl_bdim + kl_vtid) / LANES;" in source
    assert "for (int r = kl_vtid % LANES; r < rows; r += tile.size())" in source
    assert "s = kl_lanes_sum_32(s);" in source and "m = kl_lanes_max_32(m);" in source
    assert "if ((kl_vtid % 32u) == 0)" in source
    assert "const unsigned kl_gdim = (unsigned)((((cols * 32) + 256 - 1) / 256));" in source
    assert "if (kl_vwarp >= kl_gdim * 8u) return;" in source
    # The kernel's own text (its macro) is kept where the edits map onto it.
    assert "#define LANES 32" in source and "cg::tiled_partition<LANES>" in source


def test_shuffle_butterflies_become_the_lanes_reduction():
    found = outcome(SHUFFLES)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "s = kl_lanes_sum_16(s);" in source and "m = kl_lanes_max_16(m);" in source
    assert "__shfl_xor_sync" not in source
    assert "const int lane = kl_vtid & 31;" in source


@needs_nvcc
@pytest.mark.parametrize("source", [COLUMNS, SHUFFLES], ids=["cooperative-groups", "shuffles"])
def test_candidates_compile(source, tmp_path):
    for k, rw in enumerate(outcome(source).rewrites):
        compiles(rw.source, tmp_path / str(k))


@needs_nvcc
def test_the_corpus_bias_gradient_kernel_is_regrouped_and_compiles(tmp_path):
    from kernel_lsp.core.index import build_index
    from kernel_lsp.core.rules.base import RuleContext
    from kernel_lsp.core.source import preprocess

    folder = ROOT / "benchmarks" / "corpus" / "llmc_matmul_backward_bias_kernel2"
    source = (folder / "kernel.cu").read_text()
    spec = parse_spec(json.loads((folder / "spec.json").read_text()))
    index = build_index(source)
    kernel = next(k for k in index.kernels if k.name == spec.kernel)
    ctx = RuleContext(source, index, kernel, spec, preprocess(source, path=str(folder / "kernel.cu")))
    rule = rule_by_name("warp-columns")
    ok, why = rule.preconditions(ctx)
    assert ok, why
    rewrites = rule.apply(ctx)
    assert [rw.variant for rw in rewrites] == ["16x32", "32x32"]
    for k, rw in enumerate(rewrites):
        assert "int idx = kl_vbid * (16u) + (kl_vtid / 32u);" in rw.source
        compiles(rw.source, tmp_path / str(k), include=folder)


@pytest.mark.parametrize("change,why", [
    (("s = cg::reduce(tile, s, cg::plus<float>());",
      "for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);"), "nor a __shfl_xor_sync butterfly"),
    (("s = cg::reduce(tile, s, cg::plus<float>());", "if (rows > 1) s = cg::reduce(tile, s, cg::plus<float>());"),
     "not a statement at the kernel's top level"),
    (("s = cg::reduce(tile, s, cg::plus<float>());", "s = cg::reduce(tile, s, cg::bit_xor<float>());"),
     "is not cg::plus, cg::greater or cg::less"),
    (("cg::thread_block_tile<LANES> tile = cg::tiled_partition<LANES>(cg::this_thread_block());",
      "cg::thread_block_tile<16> tile = cg::tiled_partition<16>(cg::this_thread_block());"),
     "is not a 32-thread tile of the block"),
    (("if (col >= cols) return;", "if (col >= cols) return;\n    __syncthreads();"), "is a barrier"),
    (("float s = 0.0f,", "__shared__ float pad[8]; pad[threadIdx.x % 8] = 0.0f; float s = 0.0f,"), "shared memory"),
    (("if (tile.thread_rank() == 0) {", "if (tile.meta_group_rank() + tile.thread_rank() + tile.is_valid() == 0) {"),
     "a group member other than its ranks and sizes"),
    (("float s = 0.0f,", "kl_touch(tile); float s = 0.0f,"), "is handed to `kl_touch`"),
    (("int col = (blockIdx.x * blockDim.x + threadIdx.x) / LANES;",
      "int col = (blockIdx.x * blockDim.x + threadIdx.x) / LANES + threadIdx.y;"), "other than the x thread and block index"),
    (("x[(size_t)r * cols + col]", "x[(size_t)col * rows + r]"), "no global load in a loop is uncoalesced"),
    (("float v = x[(size_t)r * cols + col];", "float v = x[(size_t)r * cols + col];\n        asm volatile(\"\");"),
     "inline assembly"),
])
def test_refusals_name_the_missing_fact(change, why):
    source = COLUMNS.replace(*change)
    if "kl_touch" in source:
        source = source.replace("#define LANES 32", "#define LANES 32\n__device__ void kl_touch(cg::thread_block_tile<32> t) {}")
    found = outcome(source)
    assert not found.applicable and why in found.why, found.why


@pytest.mark.parametrize("change,why", [
    (("for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);",
      "for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(FULL, s, o);"), "nor a __shfl_xor_sync butterfly"),
    (("for (int o = 16; o > 0; o >>= 1) s +=", "for (int o = 8; o > 0; o >>= 1) s +="), "does not halve an offset from 16"),
    (("s += __shfl_xor_sync(FULL, s, o);", "s += __shfl_xor_sync(0xffffu, s, o);"), "not over the full warp"),
    (("s += __shfl_xor_sync(FULL, s, o);", "s *= __shfl_xor_sync(FULL, s, o);"), "otherwise than by +, max or min"),
    (("s += __shfl_xor_sync(FULL, s, o);", "{ s += __shfl_xor_sync(FULL, s, o); m += 1.0f; }"),
     "does more than combine one value"),
    (("    for (int o = 16; o > 0; o >>= 1) s +=", "    if (rows > 0) for (int o = 16; o > 0; o >>= 1) s +="),
     "not in a loop at the kernel's top level"),
])
def test_butterfly_refusals_name_the_missing_fact(change, why):
    found = outcome(SHUFFLES.replace(*change))
    assert not found.applicable and why in found.why, found.why


@pytest.mark.parametrize("spec_change,why", [
    ({"block": [256, 2, 1]}, "B x 1 x 1 threads"),
    ({"block": [48, 1, 1], "grid": ["ceil_div(cols*32,48)", 1, 1]}, "B x 1 x 1 threads, B a multiple of 32"),
    ({"grid": ["ceil_div(cols*32,256)", 2, 1]}, "the grid is not one-dimensional"),
    ({"grid": [4096, 1, 1]}, "the grid is written with the literal 4096"),
])
def test_launch_refusals_name_the_missing_fact(spec_change, why):
    found = outcome(spec={**SPEC, **spec_change})
    assert not found.applicable and why in found.why, found.why
