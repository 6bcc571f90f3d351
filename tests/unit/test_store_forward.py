"""Store forwarding: a value a loop stores and loads back one iteration later kept in a register. Where it
applies, each refusal's missing fact, the rewritten kernel run on the CPU beside the original (alone, and
followed by the load batch it makes legal), and the candidates compiled by nvcc."""

from __future__ import annotations

import shutil

import pytest

from kernel_lsp.core.candidates import OptimizeRequest
from kernel_lsp.core.rules import RuleGenerator, rule_by_name
from kernel_lsp.core.spec import parse_spec
from nvcc_check import compiles
from rule_specs import arr, outcome, scalar, spec_of

# A first-order recursive filter along each row, one thread per row: y[j] depends on y[j - 1], stored by
# the iteration before; the gain g is read at the same element that the loop stores (before storing it).
FILTER = """
__global__ void smooth_rows(float* y, const float* x, float* g, int rows, int cols, float a) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) {
    for (int j = 1; j < cols; j++) {
      y[r * cols + j] = a * y[r * cols + (j - 1)] + x[r * cols + j] * g[r * cols + (j - 1)];
      g[r * cols + j] = g[r * cols + j] * 0.5f + g[r * cols + (j - 1)];
    }
  }
}
"""
FILTER_MAIN = r"""
int main() {
  const int rows = 45, cols = 37;
  std::vector<float> y(rows * cols), x(rows * cols), g(rows * cols);
  for (int i = 0; i < rows * cols; i++) {
    y[i] = (float)((i * 7) % 13) / 4.0f; x[i] = (float)((i * 5) % 11) - 5.0f; g[i] = (float)((i * 3) % 7) / 8.0f;
  }
  kl_launch({GRID, 1, 1}, {BLOCK, 1, 1}, [&] { smooth_rows(y.data(), x.data(), g.data(), rows, cols, 0.75f); });
  for (int i = 0; i < rows * cols; i++) printf("%a %a\n", y[i], g[i]);
}
"""


def _spec() -> dict:
    return spec_of("smooth_rows", [arr("y", "rows*cols", "inout"), arr("x", "rows*cols"), arr("g", "rows*cols", "inout"),
                                   scalar("rows", 1024), scalar("cols", 1024),
                                   {"name": "a", "scalar": "float32", "value": 0.75}],
                   ["ceil_div(rows,64)", 1, 1], [64, 1, 1], [{"rows": 45, "cols": 37}])


def test_the_previous_iterations_store_is_read_from_a_register():
    found = outcome("store-forward", FILTER, _spec())
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "{ float kl_fwd0; float kl_fwd1; bool kl_first0 = true;" in source
    assert "y[r * cols + j] = (kl_fwd0 = a * (kl_first0 ? y[r * cols + (j - 1)] : kl_fwd0)" in source
    # g's previous element is read twice before g's store: both from the register.
    assert source.count("(kl_first0 ? g[r * cols + (j - 1)] : kl_fwd1)") == 2
    assert "kl_first0 = false;" in source


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_forwarded_and_then_batched_the_rows_come_out_the_same(tmp_path):
    """The forwarded kernel, and its sequence with a load batch (the loop's remaining loads made four and eight
    iterations ahead), run on the CPU beside the original at a ragged size: every element bit for bit."""
    from cpu_cuda import run_on_cpu

    spec = _spec()
    generator = RuleGenerator([rule_by_name("store-forward"), rule_by_name("load-batch")])
    candidates = list(generator.generate(OptimizeRequest(source=FILTER, path="smooth.cu", kernel="smooth_rows",
                                                         spec=parse_spec(spec))))
    names = [c.generator for c in candidates]
    assert names == ["rule:store-forward", "rule:store-forward+load-batch[batch=4]",
                     "rule:store-forward+load-batch[batch=8]"], names
    main = FILTER_MAIN.replace("GRID", "1").replace("BLOCK", "64")
    before = run_on_cpu(FILTER, main, tmp_path, "filter")
    for n, candidate in enumerate(candidates):
        assert run_on_cpu(candidate.source, main, tmp_path, f"filter{n}") == before, candidate.generator
    if shutil.which("nvcc"):
        for n, candidate in enumerate(candidates):
            compiles(candidate.source, tmp_path / f"nvcc{n}")


# The filter without its gain: one recurrence, on y.
PLAIN = FILTER.replace(" * g[r * cols + (j - 1)];\n      g[r * cols + j] = g[r * cols + j] * 0.5f + g[r * cols + (j - 1)];\n",
                       ";\n")


@pytest.mark.parametrize("change,why", [
    (("= a * y[r * cols + (j - 1)]", "+= a * y[r * cols + (j - 1)]"), "`y[r * cols + j]` is a compound update"),
    (("for (int j = 1; j < cols; j++) {", "for (int j = 1; j < cols; j++) {\n      if (x[r * cols + j] > 4.0f) continue;"),
     "can leave an iteration early"),
    (("      y[r * cols + j] =", "      if (j % 2) y[r * cols + j] ="), "not stored by a statement directly in the loop's body"),
    (("for (int j = 1; j < cols; j++) {", "for (int j = 1; j < cols; j++) {\n      __syncthreads();"),
     "a barrier, a warp operation or a call"),
    (("for (int j = 1; j < cols; j++) {", "for (int j = 1; j < cols; j++) {\n      for (int k = 0; k < 2; k++) g[k] = 0.0f;"),
     "has a loop of its own"),
])
def test_refusals_name_the_missing_fact(change, why):
    assert "g[r * cols + j]" not in PLAIN and "y[r * cols + (j - 1)]" in PLAIN
    assert outcome("store-forward", PLAIN, _spec()).applicable
    source = PLAIN.replace(*change)
    assert source != PLAIN
    found = outcome("store-forward", source, _spec())
    assert not found.applicable and why in found.why, found.why


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_a_loop_of_one_statement_gets_braces_for_its_flag(tmp_path):
    """``for (…) y[…] = a * y[… - 1] + x[…];`` without braces: the rewrite adds them around the statement and
    the flag, and the rows come out the same on the CPU."""
    from cpu_cuda import run_on_cpu

    bare = PLAIN.replace("for (int j = 1; j < cols; j++) {\n", "for (int j = 1; j < cols; j++)\n").replace(
        "x[r * cols + j];\n    }\n", "x[r * cols + j];\n")
    assert "j++)\n      y[" in bare
    found = outcome("store-forward", bare, _spec())
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "{ y[r * cols + j] = (kl_fwd0 = " in source and " kl_first0 = false; } }" in source
    main = FILTER_MAIN.replace("GRID", "1").replace("BLOCK", "64")
    assert run_on_cpu(source, main, tmp_path, "bare") == run_on_cpu(bare, main, tmp_path, "bare0")


def test_a_load_after_the_store_stays_a_load():
    """Read after this iteration's store, the previous element is not what the register holds: such a read
    stays a load, and a loop whose every read of it comes after the store is refused."""
    spec = _spec()
    spec["params"][1] = arr("x", "rows*cols", "inout")
    both = PLAIN.replace("const float* x", "float* x").replace(
        "x[r * cols + j];\n", "x[r * cols + j];\n      x[r * cols + j] = y[r * cols + (j - 1)];\n")
    found = outcome("store-forward", both, spec)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "(kl_first0 ? y[r * cols + (j - 1)] : kl_fwd0)" in source and "x[r * cols + j] = y[r * cols + (j - 1)];" in source
    only_late = both.replace("a * y[r * cols + (j - 1)] + ", "a * ")
    found = outcome("store-forward", only_late, spec)
    assert not found.applicable and "comes after the store" in found.why, found.why


def test_arrays_the_spec_does_not_allocate_apart_are_refused():
    spec = _spec()
    spec["params"] = [p for p in spec["params"] if p["name"] != "g"]
    found = outcome("store-forward", FILTER, spec)
    assert not found.applicable and "does not allocate every pointer parameter on its own" in found.why, found.why
