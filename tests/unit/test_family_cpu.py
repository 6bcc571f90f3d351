"""The transformations that replaced the text-shape templates, run on the CPU against the original
(cpu_cuda.py: real barriers and warp shuffles) at ragged sizes: the block per row, the tree per tile
summed in registers, the 32 x 32 transposing tile, the grid-stride loop and the float4 vectors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cpu_cuda import run_on_cpu
from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")


def _example(name: str):
    return (EXAMPLES / name / "original.cu").read_text(), json.loads((EXAMPLES / name / "spec.json").read_text())


def _rewrites(rule: str, source: str, spec: dict):
    outcome = evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name(rule)])[0]
    assert outcome.applicable, outcome.why
    return outcome.rewrites


def _floats(out: str) -> list[float]:
    return [float.fromhex(v) for v in out.split()]


SOFTMAX_MAIN = r"""
int main() {
  const int rows = 5, cols = 300;
  std::vector<float> in(rows * cols), out(rows * cols);
  for (int i = 0; i < rows * cols; i++) in[i] = (i * 37 % 101) / 10.0f - 5;
  kl_launch({GRID, 1, 1}, {64, 1, 1}, [&] { softmax_rows(in.data(), out.data(), rows, cols); });
  for (float v : out) printf("%a\n", v);
}
"""


def test_a_block_per_row_computes_the_softmax_of_each_row(tmp_path):
    source, spec = _example("softmax")
    spec = dict(spec, block=[64, 1, 1], grid=["(rows+63)/64", "1", "1"], params=[
        *spec["params"][:2], dict(spec["params"][2], value=5), dict(spec["params"][3], value=300)], variants=[])
    spec.pop("candidate", None)
    before = _floats(run_on_cpu(source, SOFTMAX_MAIN.replace("GRID", "1"), tmp_path, "softmax"))
    for n, rewrite in enumerate(_rewrites("block-per-row", source, spec)):
        assert rewrite.grid_scale == (64, 1, 1)
        after = _floats(run_on_cpu(rewrite.source, SOFTMAX_MAIN.replace("GRID", "64"), tmp_path, f"softmax{n}"))
        # The row sums add in another order: within float rounding of the original.
        assert len(after) == len(before) and all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in zip(after, before))


REDUCTION_MAIN = r"""
int main() {
  const int n = 5003, chunk = 777;
  std::vector<float> in(n), out((n + chunk - 1) / chunk);
  for (int i = 0; i < n; i++) in[i] = (float)(i % 7);
  kl_launch({(n + chunk - 1) / chunk, 1, 1}, {64, 1, 1}, [&] { chunk_sum(in.data(), out.data(), n, chunk); });
  for (float v : out) printf("%a\n", v);
}
"""


def test_the_tree_per_tile_summed_in_registers_gives_each_chunks_sum(tmp_path):
    source, spec = _example("reduction")
    spec = dict(spec, block=[64, 1, 1], dynamic_smem=256)
    (rewrite,) = _rewrites("tree-to-registers", source, spec)
    fixed = lambda s: s.replace("extern __shared__ float buf[];", "__shared__ float buf[64];")  # noqa: E731
    before = run_on_cpu(fixed(source), REDUCTION_MAIN, tmp_path, "reduce")
    # Small integers: every order of the sums is exact.
    assert run_on_cpu(fixed(rewrite.source), REDUCTION_MAIN, tmp_path, "reduce_registers") == before
    assert len(before.split()) == 7


TRANSPOSE_MAIN = r"""
int main() {
  const int rows = 45, cols = 70;
  std::vector<float> in(rows * cols), out(rows * cols, -1.0f);
  for (int i = 0; i < rows * cols; i++) in[i] = (float)i;
  kl_launch({GRID}, {BLOCK}, [&] { transpose(out.data(), in.data(), rows, cols); });
  for (float v : out) printf("%a\n", v);
}
"""


@pytest.mark.parametrize("store", ["out[c * rows + r]", "out[c * rows + (rows - 1 - r)]"])
def test_the_transposing_tile_writes_every_element_once(store, tmp_path):
    source, spec = _example("transpose")
    source = source.replace("out[c * rows + r]", store)
    spec.pop("candidate", None)
    spec["params"][2]["value"], spec["params"][3]["value"] = 45, 70
    spec["variants"] = []
    (rewrite,) = _rewrites("shared-tile-transpose", source, spec)
    assert rewrite.launch_override["block"] == [32, 8, 1]
    main = TRANSPOSE_MAIN.replace("GRID", "(cols + 31) / 32, (rows + 7) / 8, 1").replace("BLOCK", "32, 8, 1")
    before = run_on_cpu(source, main, tmp_path, "transpose")
    main = TRANSPOSE_MAIN.replace("GRID", "(cols + 31) / 32, (rows + 31) / 32, 1").replace("BLOCK", "32, 8, 1")
    assert run_on_cpu(rewrite.source, main, tmp_path, "transpose_tiled") == before


ELEMENTS = """
__global__ void k(int n, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (x[i] < 0.0f) { y[i] = 0.0f; return; }
  y[i] = 2.0f * x[i] + 1.0f;
}
"""
ELEMENTS_MAIN = r"""
int main() {
  const int n = 1003;
  std::vector<float> x(n), y(n, -7.0f);
  for (int i = 0; i < n; i++) x[i] = (i % 5) - 1.0f;
  kl_launch({GRID, 1, 1}, {64, 1, 1}, [&] { k(n, x.data(), y.data()); });
  for (float v : y) printf("%a\n", v);
}
"""
ELEMENTS_SPEC = {"kernel": "k", "params": [{"name": "n", "scalar": "int32", "value": 1003},
                                           {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
                                           {"name": "y", "array": "float32", "size": "n", "init": "zeros", "role": "out"}],
                 "grid": ["(n+63)/64", "1", "1"], "block": [64, 1, 1]}


def test_the_grid_stride_loop_computes_every_element_with_fewer_blocks(tmp_path):
    (rewrite,) = _rewrites("grid-stride", ELEMENTS, ELEMENTS_SPEC)
    before = run_on_cpu(ELEMENTS, ELEMENTS_MAIN.replace("GRID", "16"), tmp_path, "elements")
    assert run_on_cpu(rewrite.source, ELEMENTS_MAIN.replace("GRID", "3"), tmp_path, "elements_stride") == before


def test_float4_vectors_compute_every_element_and_the_tail(tmp_path):
    source = ELEMENTS.replace("  if (x[i] < 0.0f) { y[i] = 0.0f; return; }\n", "")
    (rewrite,) = _rewrites("vectorize-float4", source, ELEMENTS_SPEC)
    main = ELEMENTS_MAIN.replace("std::vector<float> x(n), y(n, -7.0f);",
                                 "std::vector<float4> x4(n / 4 + 1), y4(n / 4 + 1); float* x = (float*)x4.data(); "
                                 "float* y = (float*)y4.data(); for (int i = 0; i < n; i++) y[i] = -7.0f;")
    main = main.replace("x.data(), y.data()", "x, y").replace("for (float v : y)", "for (int i = 0; i < n; i++) { float v = y[i];")
    main = main.replace('printf("%a\\n", v);\n}', 'printf("%a\\n", v); }\n}')
    prelude = "struct float4 { float x, y, z, w; };\n"
    before = run_on_cpu(prelude + source, main.replace("GRID", "16"), tmp_path, "vec")
    assert run_on_cpu(prelude + rewrite.source, main.replace("GRID", "2"), tmp_path, "vec4") == before
