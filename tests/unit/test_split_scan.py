"""A running sum split across the lanes of a group: where it applies, each refusal's missing fact, the
rewritten kernels run on the CPU beside their originals (real shuffles, ragged last rounds), and the
candidates compiled by nvcc."""

from __future__ import annotations

import shutil

import pytest

from nvcc_check import compiles
from rule_specs import outcome, scalar, spec_of

# Rodinia hybridsort's bucket offsets: one thread per column, an exclusive scan of the column in place
# and the column's total after the loop.
OFFSETS = """
#define DIVISIONS 64
__global__ void offsets(unsigned int* d, unsigned int* totals, int blocks) {
  int tid = blockIdx.x * blockDim.x + threadIdx.x;
  int size = blocks * DIVISIONS;
  int sum = 0;
  for (int i = tid; i < size; i += DIVISIONS) {
    int x = d[i];
    d[i] = sum;
    sum += x;
  }
  totals[tid] = sum;
}
"""
OFFSETS_MAIN = r"""
int main() {
  const int blocks = BLOCKS;
  std::vector<unsigned int> d(blocks * 64), totals(64);
  for (int i = 0; i < blocks * 64; i++) d[i] = (unsigned)((i * 7) % 13);
  kl_launch({GRID, 1, 1}, {32, 1, 1}, [&] { offsets(d.data(), totals.data(), blocks); });
  for (int i = 0; i < blocks * 64; i++) printf("%u ", d[i]);
  for (int i = 0; i < 64; i++) printf("%u\n", totals[i]);
}
"""

# An inclusive float scan read after the update, a while loop counted by its last statement, a term computed
# from two loads through a pure math call, and a total added into the output in place after the loop (every
# lane doing that would add it once per lane: the group's first lane does it).
RUNNING = """
__global__ void running(const float* a, const float* b, float* out, float* totals, int n, int cols) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  float s = 0.0f;
  int r = c;
  while (r < n * cols) {
    float p = a[r];
    float q = fabsf(b[r]);
    s = s + p * q;
    out[r] = s * 0.5f;
    r += cols;
  }
  totals[c] += s;
}
"""
RUNNING_MAIN = r"""
int main() {
  const int n = ROWS, cols = 64;
  std::vector<float> a(n * cols), b(n * cols), out(n * cols), totals(cols);
  for (int i = 0; i < n * cols; i++) { a[i] = (float)((i * 5) % 11) / 4.0f; b[i] = (float)((i * 3) % 7) - 3.0f; }
  for (int i = 0; i < cols; i++) totals[i] = (float)i;
  kl_launch({GRID, 1, 1}, {32, 1, 1}, [&] { running(a.data(), b.data(), out.data(), totals.data(), n, cols); });
  for (int i = 0; i < n * cols; i++) printf("%a ", out[i]);
  for (int i = 0; i < cols; i++) printf("%a\n", totals[i]);
}
"""


def _offsets_spec(blocks: int = 1024) -> dict:
    uint = {"array": "uint32", "init": "randint(0,8)"}
    return spec_of("offsets", [{"name": "d", **uint, "size": "blocks*64", "role": "inout"},
                               {"name": "totals", **uint, "size": "64", "role": "out"}, scalar("blocks", blocks)],
                   [2, 1, 1], [32, 1, 1], [{"blocks": 7}])


def _running_spec() -> dict:
    # Positive terms: every running sum is far from zero, so the reassociated sums stay within the tolerance.
    arr = {"array": "float32", "init": "uniform(0,1)"}
    return spec_of("running", [{"name": "a", **arr, "size": "n*cols", "role": "in"},
                               {"name": "b", **arr, "size": "n*cols", "role": "in"},
                               {"name": "out", **arr, "size": "n*cols", "role": "out"},
                               {"name": "totals", **arr, "size": "cols", "role": "inout"},
                               scalar("n", 4096), scalar("cols", 64)],
                   [2, 1, 1], [32, 1, 1], [{"n": 9}])


def test_the_bucket_offsets_scan_is_split_across_a_group():
    found = outcome("split-scan", OFFSETS, _offsets_spec())
    assert found.applicable, found.why
    rewrite = found.rewrites[0]
    source = rewrite.source
    # Four lanes keep eight neighbouring columns (32 bytes of uint32) together in each warp.
    assert rewrite.launch_override["grid"] == ["(2) * 4", "1", "1"] and rewrite.grid_scale == (4, 1, 1)
    assert "for (int i = tid; i < size; i += 4 * (DIVISIONS))" in source
    assert "if (i < size) { int x = d[i]; kl_e = (x); }" in source
    assert "sum = kl_carry + kl_before;" in source and "kl_group_scan_add4(kl_e, kl_total)" in source
    assert "sum = kl_carry; __syncwarp(" in source
    # Every lane stores the same total: no lane needs to run the tail alone.
    assert "kl_lane == 0u" not in source


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
@pytest.mark.parametrize("blocks", [7, 8, 1])
def test_split_offsets_come_out_the_same(tmp_path, blocks):
    """Seven rows per column: a round of four and a ragged round of three; eight: two whole rounds; one: a
    round with a single lane at work."""
    from cpu_cuda import run_on_cpu

    found = outcome("split-scan", OFFSETS, _offsets_spec())
    assert found.applicable, found.why
    main = OFFSETS_MAIN.replace("BLOCKS", str(blocks))
    before = run_on_cpu(OFFSETS, main.replace("GRID", "2"), tmp_path, "before")
    after = run_on_cpu(found.rewrites[0].source, main.replace("GRID", "8"), tmp_path, "after")
    assert after == before


def test_a_total_added_in_place_after_the_loop_is_added_by_one_lane():
    found = outcome("split-scan", RUNNING, _running_spec())
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "if (kl_lane == 0u) { totals[c] += s; }" in source
    # The while loop's step moves to the end of the round; the term's inputs are copied ahead of the scan.
    assert "r += 4 * (cols);" in source
    assert "{ float p = a[r]; float q = fabsf(b[r]); kl_e = (p * q); }" in source


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
@pytest.mark.parametrize("rows", [9, 4, 2])
def test_split_running_sum_comes_out_the_same(tmp_path, rows):
    """Float sums reassociate, but these values (multiples of 1/4 far below 2^24) add exactly in any order."""
    from cpu_cuda import run_on_cpu

    found = outcome("split-scan", RUNNING, _running_spec())
    assert found.applicable, found.why
    main = RUNNING_MAIN.replace("ROWS", str(rows))
    before = run_on_cpu(RUNNING, main.replace("GRID", "2"), tmp_path, "before")
    after = run_on_cpu(found.rewrites[0].source, main.replace("GRID", "8"), tmp_path, "after")
    assert after == before


@pytest.mark.parametrize("change, spec_change, why", [
    (("    int x = d[i];\n    d[i] = sum;", "    d[i] = sum;\n    int x = d[i];"), None,
     "the term's inputs read `d` (`d[i]`) after the body stores it (`d[i]`)"),
    (("    sum += x;\n", "    sum += x;\n    cnt += 1;\n"), None, "it carries cnt from one iteration to the next"),
    (("    d[i] = sum;\n", "    d[i] = sum;\n    if (x > 6) break;\n"), None, "it can leave early"),
    (("    d[i] = sum;\n", "    d[i] = sum;\n    if (x > 6) sum = 0;\n"), None, "it assigns `sum` elsewhere than in `sum += x;`"),
    (("    sum += x;", "    sum += x + (sum >> 4);"), None, "the term added to `sum` reads `sum`"),
    (("    int x = d[i];", "    int x = d[i + DIVISIONS];"), None, "it reads `d` at another index than it writes"),
    (("    int x = d[i];", "    int x = totals[0]++;"), None, "computes the term's input with side effects"),
    (("    int x = d[i];", "    float x = d[i] * 0.5f;"), None, "`sum` is an integer and the term `x` is not shown to be one"),
    (("    sum += x;", "    sum += x * 0.5;"), None, "the term `x * 0.5` is not shown to be one"),
    (("    d[i] = sum;\n", ""), None, "no loop stores or reads the running value of a sum it carries"),
    (("i += DIVISIONS) {", "i += cnt) {\n    cnt = DIVISIONS;"), None, "it assigns a name its step reads"),
    (("i += DIVISIONS", "i += totals[0]++"), None, "its step has side effects or calls a function"),
    (None, {"grid": [1024, 1, 1]}, "the launch has 1024 warps, enough for 132 SMs"),
])
def test_split_scan_refusals(change, spec_change, why):
    source = OFFSETS.replace(*change) if change else OFFSETS
    assert change is None or source != OFFSETS
    spec = _offsets_spec()
    if spec_change:
        spec.update(spec_change)
    source = source.replace("int sum = 0;", "int sum = 0; int cnt = 0;")
    found = outcome("split-scan", source, spec)
    assert not found.applicable
    assert why in found.why, found.why


@pytest.mark.parametrize("term", ["(x > 3)", "(int)(x * 0.5f)", "x << 1", "-x + 'a'", "x ? x : 0x1E", "x + i"])
def test_an_integer_sum_takes_terms_shown_to_be_integers(term):
    found = outcome("split-scan", OFFSETS.replace("sum += x;", f"sum += {term};"), _offsets_spec())
    assert found.applicable, found.why
    assert f"kl_e = ({term});" in found.rewrites[0].source


# A cumulative sum along each row, one thread per row: the threads of a warp read a row apart.
CUMSUM = """
__global__ void row_cumsum(const float* x, float* y, int rows, int cols) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) {
    float s = 0.0f;
    for (int j = 0; j < cols; j++) {
      s += x[r * cols + j];
      y[r * cols + j] = s;
    }
  }
}
"""
CUMSUM_MAIN = r"""
int main() {
  const int rows = 5, cols = COLS;
  std::vector<float> x(rows * cols), y(rows * cols);
  for (int i = 0; i < rows * cols; i++) x[i] = (float)((i * 5) % 11) / 4.0f - 1.0f;
  kl_launch({GRID, 1, 1}, {32, 1, 1}, [&] { row_cumsum(x.data(), y.data(), rows, cols); });
  for (int i = 0; i < rows * cols; i++) printf("%a\n", y[i]);
}
"""


def _cumsum_spec(rows: int = 65536) -> dict:
    arr = {"array": "float32", "init": "uniform(0,1)"}
    return spec_of("row_cumsum", [{"name": "x", **arr, "size": "rows*cols", "role": "in"},
                                  {"name": "y", **arr, "size": "rows*cols", "role": "out"},
                                  scalar("rows", rows), scalar("cols", 512)],
                   ["ceil_div(rows,128)", 1, 1], [128, 1, 1], [{"rows": 5, "cols": 37}])


def test_a_row_cumsum_gets_a_warp_per_row_whatever_the_launch():
    found = outcome("warp-per-row-scan", CUMSUM, _cumsum_spec())
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "kl_group_scan_add32(kl_e, kl_total)" in source
    assert "for (int j = 0; j < cols; j += 32 * (1))" in source
    assert found.rewrites[0].grid_scale == (32, 1, 1)
    # 2048 warps fill the GPU: the under-filled split is not offered.
    assert "the launch has 2048 warps" in outcome("split-scan", CUMSUM, _cumsum_spec()).why


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
@pytest.mark.parametrize("cols", [37, 64, 3])
def test_warp_per_row_cumsum_comes_out_the_same(tmp_path, cols):
    """Values in quarters: the regrouped float sums are exact, so the rows compare bit for bit."""
    from cpu_cuda import run_on_cpu

    found = outcome("warp-per-row-scan", CUMSUM, _cumsum_spec())
    assert found.applicable, found.why
    main = CUMSUM_MAIN.replace("COLS", str(cols))
    before = run_on_cpu(CUMSUM, main.replace("GRID", "1"), tmp_path, "before")
    after = run_on_cpu(found.rewrites[0].source, main.replace("GRID", "32"), tmp_path, "after")
    assert after == before


def test_warp_per_row_scan_wants_a_row_walk():
    """Threads next to each other in the row (the loop walks down a column): nothing becomes coalesced."""
    columns = CUMSUM.replace("x[r * cols + j]", "x[j * rows + r]").replace("y[r * cols + j]", "y[j * rows + r]")
    found = outcome("warp-per-row-scan", columns, _cumsum_spec())
    assert not found.applicable
    assert "no loop walks a row per thread while storing or reading the running value" in found.why


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_split_scan_candidates_compile(tmp_path):
    cases = [("split-scan", OFFSETS, _offsets_spec()), ("split-scan", RUNNING, _running_spec()),
             ("warp-per-row-scan", CUMSUM, _cumsum_spec())]
    for n, (rule, source, spec) in enumerate(cases):
        found = outcome(rule, source, spec)
        assert found.applicable, found.why
        compiles(found.rewrites[0].source, tmp_path / f"c{n}")
