"""An under-filled launch's loop split across a new block axis (split-reduction): where it applies, each
refusal's reason, the rewrite run against the original on the CPU (cpu_cuda.py: real barriers) at ragged
sizes (inactive columns still reach the barrier), and nvcc on the candidate."""

from __future__ import annotations

import shutil

import pytest

from cpu_cuda import run_on_cpu
from nvcc_check import compiles
from rule_specs import arr, outcome, scalar, spec_of

RULE = "split-reduction"

STATS = """
#define COL(i, j) ((long)(i) * m + (j))
__global__ void __launch_bounds__(64) col_stats(const float* __restrict__ data, float* mean, float* top, int m, int n) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= m) return;
  float s = 1.5f;
  float hi = -1e30f;
  for (int i = 0; i < n; i++) {
    const float v = data[COL(i, j)];
    s += v;
    hi = fmaxf(hi, v);
  }
  mean[j] = s / n;
  top[j] += hi;
}
"""
STATS_SPEC = spec_of("col_stats", [arr("data", "n*m"), arr("mean", "m", "out"), arr("top", "m", "inout"),
                                   scalar("m", 2048), scalar("n", 2048)], ["ceil_div(m,64)", 1, 1], [64, 1, 1],
                     [{"m": 300, "n": 77}])
STATS_MAIN = r"""
int main() {
  const int m = 100, n = 77;
  std::vector<float> data(n * m), mean(m, -2.0f), top(m, 0.5f);
  // Small integers: every order of the sums is exact.
  for (int i = 0; i < n * m; i++) data[i] = (float)((i * 7) % 23) - 11.0f;
  kl_launch({(m + 63) / 64, 1, 1}, {64, PARTS, 1}, [&] { col_stats(data.data(), mean.data(), top.data(), m, n); });
  for (int j = 0; j < m; j++) printf("%a %a\n", mean[j], top[j]);
}
"""


def test_a_column_reduction_is_split_over_a_taller_block(tmp_path):
    found = outcome(RULE, STATS, STATS_SPEC)
    assert found.applicable, found.why
    (rw,) = found.rewrites
    parts = rw.block[1]
    # 64 warps at the main size: 16 parts bring them to 1024, above four per SM.
    assert parts == 16 and rw.block == (64, 16, 1) and rw.grid_divide == (1, 1, 1)
    src = rw.source
    assert "__launch_bounds__(1024)" in src
    assert "for (int i = (0) + (int)threadIdx.y; i < n; i += 16)" in src
    # The start value added once, by the part that runs the code after the loop (the read-modify-write once).
    assert "s = kl_init0 + s;" in src
    assert "threadIdx.y == 0) { top[j] += hi; }" in src
    assert src.count("__syncthreads();") == 1
    if shutil.which("g++"):
        before = run_on_cpu(STATS, STATS_MAIN.replace("PARTS", "1"), tmp_path, "stats")
        assert run_on_cpu(src, STATS_MAIN.replace("PARTS", str(parts)), tmp_path, "stats_split") == before
    if shutil.which("nvcc"):
        compiles(src, tmp_path)


@pytest.mark.parametrize("edit, reason", [
    (lambda s: s.replace("  float s = 1.5f;", "  top[j] += 1.0f;\n  float s = 1.5f;"), "before it would race"),
    (lambda s: s.replace("  float s = 1.5f;", "  const float d0 = data[j];\n  float s = 1.5f;").replace(
        "s += v;", "s += v; data[i * m + j] = v;"), "before it would race"),
    (lambda s: s.replace("s += v;", "s += v; mean[j] = v;"), "does not move with the iteration"),
    (lambda s: s.replace("s += v;", "s += v; top[0] = s;"), "for something else than updating it"),
    (lambda s: s.replace("hi = fmaxf(hi, v);", "hi = fmaxf(hi, v) + s;"), "carries hi from one iteration"),
    (lambda s: s.replace("  float s = 1.5f;", "  __shared__ float t[64]; t[threadIdx.x] = 1.0f;\n  float s = 1.5f;"),
     "barriers, shared memory"),
    (lambda s: s.replace("int j = blockIdx.x * blockDim.x + threadIdx.x;", "int j = blockIdx.x * blockDim.x + threadIdx.x + threadIdx.y;"),
     "not one-dimensional"),
])
def test_refusals_name_the_missing_fact(edit, reason):
    found = outcome(RULE, edit(STATS), STATS_SPEC)
    assert not found.applicable
    assert reason in found.why, found.why


def test_a_store_before_the_loop_is_made_by_every_part_with_the_same_value(tmp_path):
    source = STATS.replace("  float s = 1.5f;", "  mean[j] = 3.0f;\n  float s = mean[j];")
    found = outcome(RULE, source, STATS_SPEC)
    assert found.applicable, found.why
    if shutil.which("g++"):
        parts = found.rewrites[0].block[1]
        before = run_on_cpu(source, STATS_MAIN.replace("PARTS", "1"), tmp_path, "store")
        assert run_on_cpu(found.rewrites[0].source, STATS_MAIN.replace("PARTS", str(parts)), tmp_path, "store_split") == before


def test_a_launch_that_fills_the_gpu_is_left_alone():
    spec = dict(STATS_SPEC, params=[*STATS_SPEC["params"][:3], scalar("m", 1 << 20), scalar("n", 64)], variants=[])
    found = outcome(RULE, STATS, spec)
    assert not found.applicable and "enough for" in found.why
