"""Row caching: a row several loops of a thread read element by element, loaded once into registers.
Where it applies, each refusal's missing fact, the candidate compiled by nvcc, and the rewrite run on the
CPU beside the original at row lengths inside and outside the cached share: the same bits out."""

from __future__ import annotations

import shutil

import pytest

from cpu_cuda import run_on_cpu
from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec
from nvcc_check import compiles

needs_gpp = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler (g++) on PATH")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

# A warp per row: the mean, the variance and the output each walk the row's lane-strided share.
NORM = """
#define EPS 1e-5f
__global__ void norm(const float* x, float* y, int rows, int C) {
    int lane = threadIdx.x & 31;
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (row >= rows) return;
    const float* r = x + row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) s += r[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float m = s / C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = r[i] - m;
        v += d * d;
    }
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    float inv = 1.0f / sqrtf(v / C + EPS);
    for (int j = lane; j < C; j += 32) y[row * C + j] = (r[j] - m) * inv;
}
"""
SPEC = {
    "kernel": "norm",
    "params": [
        {"name": "x", "array": "float32", "size": "rows*C", "init": "uniform(-1,1)", "role": "in"},
        {"name": "y", "array": "float32", "size": "rows*C", "init": "zeros", "role": "out"},
        {"name": "rows", "scalar": "int32", "value": 4096},
        {"name": "C", "scalar": "int32", "value": 256},
    ],
    "grid": ["(rows*32+255)/256", "1", "1"],
    "block": [256, 1, 1],
    "variants": [{"rows": 100, "C": 200}],
}
MAIN = r"""
int main() {
  const int rows = 9, C = COLS;
  std::vector<float> x(rows * C), y(rows * C, -7.0f);
  for (int k = 0; k < rows * C; k++) x[k] = (float)((k * 7919) % 2003) / 1001.0f - 1.0f;
  kl_launch({(rows * 32 + 255) / 256, 1, 1}, {256, 1, 1}, [&] { norm(x.data(), y.data(), rows, C); });
  for (int k = 0; k < rows * C; k++) printf("%a\n", y[k]);
}
"""


def outcome(source: str, spec: dict | None = SPEC, kernel: str = "norm"):
    return evaluate(source, kernel, parse_spec(spec) if spec else None, [rule_by_name("row-cache")])[0]


@needs_gpp
def test_three_passes_read_the_row_once_and_give_the_same_bits(tmp_path):
    found = outcome(NORM)
    assert found.applicable, found.why
    (rw,) = found.rewrites
    # 256 columns over 32 lanes: 8 elements per thread at the spec's size.
    assert "float kl_row[8];" in rw.source and rw.source.count("kl_row[kl_k] = r[i];") == 1
    assert rw.source.count("#pragma unroll") == 3 and "sqrtf(v / C + EPS)" in rw.source
    # Inside the cached share, at its edge, and past it (lanes whose share is larger run the original loops).
    for cols in (37, 256, 257, 300):
        main = MAIN.replace("COLS", str(cols))
        assert run_on_cpu(rw.source, main, tmp_path, f"cached{cols}") == run_on_cpu(NORM, main, tmp_path, f"orig{cols}")


@needs_nvcc
def test_the_cached_passes_compile(tmp_path):
    (rw,) = outcome(NORM).rewrites
    compiles(rw.source, tmp_path)


# The norm as a template over its element type, reading its parameter directly (as templated norms do).
TEMPLATE = NORM.replace("__global__ void norm(const float* x, float* y,",
                        "template <typename T>\n__global__ void norm(const T* x, T* y,") \
    .replace("    const float* r = x + row * C;\n", "").replace("r[i]", "x[row * C + i]").replace("r[j]", "x[row * C + j]")


@needs_gpp
def test_a_template_caches_its_row_in_registers_of_its_own_element_type(tmp_path):
    found = outcome(TEMPLATE)
    assert found.applicable, found.why
    (rw,) = found.rewrites
    assert "T kl_row[8];" in rw.source and "float kl_row" not in rw.source
    for cols in (37, 300):
        main = MAIN.replace("COLS", str(cols))
        assert run_on_cpu(rw.source, main, tmp_path, f"tcached{cols}") == run_on_cpu(TEMPLATE, main, tmp_path, f"torig{cols}")
    if shutil.which("nvcc"):
        compiles(rw.source + "template __global__ void norm<float>(const float*, float*, int, int);\n", tmp_path)


# The norm's passes written as while loops, each counter set just before its loop and stepped at its end.
WHILE = NORM.replace("    for (int i = lane; i < C; i += 32) s += r[i];",
                     "    int i = lane;\n    while (i < C) { s += r[i]; i += 32; }") \
    .replace("    for (int i = lane; i < C; i += 32) {\n        float d = r[i] - m;\n        v += d * d;\n    }",
             "    i = lane;\n    while (i < C) {\n        float d = r[i] - m;\n        v += d * d;\n        i += 32;\n    }") \
    .replace("    for (int j = lane; j < C; j += 32) y[row * C + j] = (r[j] - m) * inv;",
             "    int j = lane;\n    while (j < C) { y[row * C + j] = (r[j] - m) * inv; j += 32; }")


@needs_gpp
def test_while_loop_passes_read_the_row_once_and_give_the_same_bits(tmp_path):
    assert WHILE.count("while") == 3
    found = outcome(WHILE)
    assert found.applicable, found.why
    (rw,) = found.rewrites
    assert rw.source.count("const int kl_from = i;") == 2 and "const int kl_from = j;" in rw.source
    assert "float kl_row[8];" in rw.source and rw.source.count("kl_row[kl_k] = r[i];") == 1
    for cols in (37, 256, 300):
        main = MAIN.replace("COLS", str(cols))
        assert run_on_cpu(rw.source, main, tmp_path, f"wcached{cols}") == run_on_cpu(WHILE, main, tmp_path, f"worig{cols}")
    if shutil.which("nvcc"):
        compiles(rw.source, tmp_path / "nvcc")
    # The second pass starting elsewhere: the last two share the row, and the bits still agree.
    shifted = WHILE.replace("    i = lane;\n    while", "    lane = lane ^ 1;\n    i = lane;\n    while")
    (rw,) = outcome(shifted).rewrites
    main = MAIN.replace("COLS", "37")
    assert run_on_cpu(rw.source, main, tmp_path, "scached") == run_on_cpu(shifted, main, tmp_path, "sorig")


def test_while_loop_refusals_name_the_missing_fact():
    apart = WHILE.replace("    int i = lane;\n    while", "    int i = lane;\n    s = 0.0f;\n    while")
    assert "the statement before it does not set its counter `i`" in outcome(apart).why
    # A counter the second loop does not set again: it goes on from where the first left it.
    unset = WHILE.replace("    i = lane;\n    while", "    while")
    assert "its counter `i` is read after it" in outcome(unset).why
    moved = WHILE.replace("float v = 0.0f;", "float v = 0.0f;\n    C = C - 0;")
    assert "C, read by the loops' headers, is assigned between" in outcome(moved).why
    # The second pass starts elsewhere: the analysis' starts differ, so only the last two passes share the row.
    shifted = WHILE.replace("    i = lane;\n    while", "    lane = lane ^ 1;\n    i = lane;\n    while")
    assert "by the loops at line 16, 24 " in outcome(shifted).why


def test_a_read_a_condition_decides_in_the_first_pass_is_not_loaded_ahead():
    guarded = NORM.replace("for (int i = lane; i < C; i += 32) s += r[i];",
                           "for (int i = lane; i < C; i += 32) if (i % 3 == 0) s += r[i];")
    found = outcome(guarded)
    assert not found.applicable and "a condition inside the loop decides whether `r[i]` is read" in found.why


def test_a_first_pass_some_threads_skip_does_not_load_for_the_others():
    skipped = NORM.replace("for (int i = lane; i < C; i += 32) s += r[i];",
                           "if (lane < 16) for (int i = lane; i < C; i += 32) s += r[i];")
    found = outcome(skipped)
    assert not found.applicable and "runs under a statement the later loops are not in" in found.why
    blocked = NORM.replace("for (int i = lane; i < C; i += 32) s += r[i];",
                           "{ for (int i = lane; i < C; i += 32) s += r[i]; }")
    assert outcome(blocked).applicable


def test_refusals_name_the_missing_fact():
    written = NORM.replace("const float* x", "float* x").replace("y[row * C + j] = (r[j] - m) * inv;",
                                                                  "x[row * C + j] = (r[j] - m) * inv;")
    assert "no array the kernel never writes" in outcome(written).why
    early = NORM.replace("float d = r[i] - m;", "float d = r[i] - m;\n        if (d > 100.0f) break;")
    assert "can leave an iteration or the loop early" in outcome(early).why
    moved = NORM.replace("float v = 0.0f;", "float v = 0.0f;\n    C = C - 0;")
    assert "C, read by the loops' headers, is assigned between" in outcome(moved).why
    long_rows = dict(SPEC, params=[*SPEC["params"][:3], dict(SPEC["params"][3], value=4096)])
    assert "a thread runs up to 128 iterations at the spec's sizes" in outcome(NORM, long_rows).why
    template = NORM.replace("__global__ void norm(const float* x, float* y,",
                            "template <typename T>\n__global__ void norm(const T* x, T* y,")
    assert "the kernel is a template and `r[i]` does not subscript one of its pointer parameters" in outcome(template).why
    single = NORM.split("    float v = 0.0f;")[0] + "    y[row] = m;\n}\n"
    assert "no two loops at one level run the same iterations" in outcome(single).why


# A thread per row: a warp per row first (32 times the blocks), then the row cached in each lane's registers.
ROWS = """
__global__ void rownorm(const float* x, float* y, int rows, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* r = x + row * C;
    float s = 0.0f;
    for (int i = 0; i < C; i++) s += r[i];
    float m = s / C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) v += (r[i] - m) * (r[i] - m);
    float inv = 1.0f / sqrtf(v / C + 1e-5f);
    for (int i = 0; i < C; i++) y[row * C + i] = (r[i] - m) * inv;
}
"""
ROWS_SPEC = dict(SPEC, kernel="rownorm", grid=["(rows+127)/128", "1", "1"], block=[128, 1, 1])
ROWS_MAIN = r"""
int main() {
  const int rows = 9, C = COLS;
  std::vector<float> x(rows * C), y(rows * C, -7.0f);
  for (int k = 0; k < rows * C; k++) x[k] = (float)((k * 7919) % 2003) / 1001.0f - 1.0f;
  kl_launch({GRID, 1, 1}, {128, 1, 1}, [&] { rownorm(x.data(), y.data(), rows, C); });
  for (int k = 0; k < rows * C; k++) printf("%a\n", y[k]);
}
"""


def test_a_warp_per_row_is_followed_by_the_row_cache_with_its_launch(tmp_path):
    from kernel_lsp.core.candidates import OptimizeRequest
    from kernel_lsp.core.rules import RuleGenerator

    request = OptimizeRequest(source=ROWS, path="rows.cu", kernel="rownorm", spec=ROWS_SPEC)
    candidates = {c.generator: c for c in RuleGenerator().generate(request)}
    base, cached = candidates["rule:warp-per-row"], candidates["rule:warp-per-row+row-cache"]
    # Tried once the warp per row was accepted, on its launch, and the host's launch edited as for it.
    assert cached.after == "rule:warp-per-row"
    assert cached.launch_override == base.launch_override and cached.grid_scale == base.grid_scale == (32, 1, 1)
    assert "kl_row[" in cached.source and "kl_warp_sum" in cached.source
    # A later step that would change the launch again does not follow a relative launch change.
    assert not any(name.startswith("rule:warp-per-row+") and c.launch_override != base.launch_override
                   for name, c in candidates.items() if c.after == "rule:warp-per-row")
    if shutil.which("g++"):
        for cols in (37, 256, 1100):
            main = ROWS_MAIN.replace("COLS", str(cols))
            before = run_on_cpu(ROWS, main.replace("GRID", "1"), tmp_path, f"rows{cols}")
            after = run_on_cpu(cached.source, main.replace("GRID", "32"), tmp_path, f"rows_cached{cols}")
            assert _close(after, before)


def _close(after: str, before: str) -> bool:
    """The lanes' partial sums add in another order than the thread's loop: within float rounding."""
    a, b = [float.fromhex(v) for v in after.split()], [float.fromhex(v) for v in before.split()]
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(a, b))
