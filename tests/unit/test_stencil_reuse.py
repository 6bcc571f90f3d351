"""Neighbour rows reused across consecutive rows per thread (stencil-row-reuse): where it applies,
each refusal's reason, the emitted code compiled by nvcc, and the corpus stencils it takes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.source import preprocess
from kernel_lsp.core.spec import parse_spec
from nvcc_check import compiles

CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus"


def arr(name, size, role="in"):
    return {"name": name, "array": "float32", "size": size, "init": "uniform(-1,1)" if role == "in" else "zeros", "role": role}


def spec(kernel, block=(32, 8, 1), extra=()):
    return {"kernel": kernel, "params": [{"name": "n", "scalar": "int32", "value": 1024}, arr("A", "n*n"),
                                         arr("B", "n*n", "out"), *extra],
            "grid": ["ceil_div(n,32)", "ceil_div(n,8)", 1], "block": list(block),
            "tolerance": {"rtol": 1e-5, "atol": 1e-6}, "variants": [{"n": 500}]}


JACOBI = """
__global__ void jacobi(int n, float* A, float* B) {
  int i = blockIdx.y * blockDim.y + threadIdx.y;
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 1 && i < n - 1 && j >= 1 && j < n - 1) {
    B[i*n + j] = 0.2f * (A[i*n + j] + A[i*n + j - 1] + A[i*n + j + 1] + A[(i + 1)*n + j] + A[(i - 1)*n + j]);
  }
}
"""


def outcome(source, data):
    return evaluate(source, data["kernel"], parse_spec(data), [rule_by_name("stencil-row-reuse")])[0]


def test_applies_with_fast_and_general_paths(tmp_path):
    found = outcome(JACOBI, spec("jacobi"))
    assert found.applicable, found.why
    assert [r.variant for r in found.rewrites] == ["rows=8", "rows=4"]
    rw = found.rewrites[1]
    assert rw.launch_override["block"][1] == 2
    src = rw.source
    # Virtual rows: threadIdx.y is row 4*y + s of the original block, blockDim.y the old height.
    assert "const unsigned kl_vrow = threadIdx.y * 4u + kl_s;" in src
    assert "int i = blockIdx.y * (blockDim.y * 4u) + kl_vrow;" in src
    # The interior test carries the guard; the fast path defers the store; the general path keeps the guard.
    assert "kl_all = kl_all && (i >= 1 && i < n - 1 && j >= 1 && j < n - 1);" in src
    assert "kl_p0[kl_s] = &(B[i*n + j]); kl_v0[kl_s] = 0.2f * (A[i*n + j]" in src
    assert "*kl_p0[kl_s] = kl_v0[kl_s];" in src
    assert src.count("if (i >= 1 && i < n - 1 && j >= 1 && j < n - 1)") == 1
    assert "threadIdx.y" not in src.split("kl_vrow = threadIdx.y", 1)[1].split("kl_vrow = threadIdx.y", 1)[0].replace(
        "threadIdx.y * 4u", "")
    if shutil.which("nvcc"):
        for r in found.rewrites:
            compiles(r.source, tmp_path)


def test_early_return_ends_only_that_row(tmp_path):
    src = JACOBI.replace("  if (i >= 1 && i < n - 1 && j >= 1 && j < n - 1) {\n", "  if (i < 1 || i >= n - 1) return;\n"
                         "  if (j >= 1 && j < n - 1) {\n")
    found = outcome(src, spec("jacobi"))
    assert found.applicable, found.why
    out = found.rewrites[0].source
    assert "if (i < 1 || i >= n - 1) { kl_all = false; continue; }" in out
    assert "if (i < 1 || i >= n - 1) continue;" in out
    assert "return" not in out
    if shutil.which("nvcc"):
        compiles(out, tmp_path)


@pytest.mark.parametrize(("change", "why"), [
    (lambda s: s.replace("B[i*n + j] = 0.2f", "__shared__ float t[8]; t[0] = 1; B[i*n + j] = 0.2f"), "shared memory"),
    (lambda s: s.replace("B[i*n + j] = 0.2f * (", "for (int k = 0; k < 2; ++k) B[i*n + j] = 0.2f * ("),
     "stored inside a tap loop"),
    (lambda s: s.replace("B[i*n + j] = 0.2f * (", "float t = 0; for (int k = 0; k < n; ++k) t += A[k];\n B[i*n + j] = t * ("),
     "does not run a compile-time constant number of iterations"),
    (lambda s: s.replace("B[i*n + j] = 0.2f * (", "float t = 0; for (int k = 0; k < 3; ++k) { if (A[k] > 0) break; t += A[k]; }"
                         "\n B[i*n + j] = t * ("), "can leave an iteration early"),
    (lambda s: s.replace("A[(i + 1)*n + j] + A[(i - 1)*n + j]", "A[i*n + j + 2] + A[i*n + j - 2]"),
     "nothing to reuse"),
    (lambda s: s.replace("B[i*n + j] =", "B[j] ="), "does not move with threadIdx.y"),
    (lambda s: s.replace("A[i*n + j - 1]", "B[i*n + j - 1]"), "read at another index"),
    (lambda s: s.replace("B[i*n + j] = 0.2f", "B[i*n + j] += 0.2f"), "compound assignment or inside a larger expression"),
    (lambda s: s.replace("if (i >= 1", "if ((i = i + 0) >= 1"), "side effects"),
    (lambda s: s.replace("int j = blockIdx.x * blockDim.x + threadIdx.x;",
                         "int j = blockIdx.x * blockDim.x + threadIdx.x;\n  if (j > n) { B[0] = 1; }"),
     "branches other than one guard"),
    (lambda s: s.replace("threadIdx.y", "threadIdx.x % 4"), "along blockIdx.y (nothing to reuse)"),
    (lambda s: s.replace("threadIdx.y", "0").replace("blockIdx.y", "0").replace("blockIdx.x", "0"),
     "uses neither threadIdx.y"),
])
def test_refusals(change, why):
    found = outcome(change(JACOBI), spec("jacobi"))
    assert not found.applicable and why in found.why, found.why


def test_refuses_a_block_height_it_cannot_split():
    found = outcome(JACOBI, spec("jacobi", block=(32, 5, 1)))
    assert not found.applicable and "block's y extent is not a multiple of 2 or 3" in found.why, found.why
    found = outcome(JACOBI, spec("jacobi", block=(32, 3, 1)))
    assert [r.variant for r in found.rewrites] == ["rows=3"] and found.rewrites[0].launch_override["block"][1] == 1


def test_keeps_enough_threads():
    data = spec("jacobi")
    data["params"][0]["value"] = 128
    data["variants"] = []
    found = outcome(JACOBI, data)
    assert not found.applicable and "fewer than 65536 threads" in found.why, found.why
    data["params"][0]["value"] = 512
    assert [r.variant for r in outcome(JACOBI, data).rewrites] == ["rows=4", "rows=2"]


def test_refuses_arrays_the_spec_does_not_separate():
    data = spec("jacobi")
    data["params"][2] = {"name": "B", "scalar": "int32", "value": 0}
    found = outcome(JACOBI, data)
    assert not found.applicable and "allocate every pointer parameter" in found.why


def _corpus(name):
    path = CORPUS / name / "kernel.cu"
    text = path.read_text()
    pre = preprocess(text, str(path), lambda p: Path(p).read_text() if Path(p).is_file() else None)
    data = json.loads((CORPUS / name / "spec.json").read_text())
    return text, pre, data


@pytest.mark.parametrize(("name", "reason"), [
    ("polybench_conv2d", None), ("polybench_jacobi2d", None),
    ("polybench_fdtd2d_step3", None), ("polybench_conv3d", "fewer than 65536 threads"),
    ("nvblog_fd_derivative_x", "shared memory"), ("rodinia_hotspot", "shared memory"),
    ("rodinia_hotspot3d", "compile-time constant number of iterations"), ("parboil_stencil_naive", None),
    ("polybench_jacobi1d", "along blockIdx.x (nothing to reuse)"),
])
def test_corpus_stencils(name, reason, tmp_path):
    text, pre, data = _corpus(name)
    found = evaluate(text, data["kernel"], parse_spec(data), [rule_by_name("stencil-row-reuse")], preprocessed=pre)[0]
    if reason is not None:
        assert not found.applicable and reason in found.why, found.why
        return
    assert found.applicable, found.why
    for rw in found.rewrites:
        rows = int(rw.variant.split("=")[1])
        assert re.search(rf"kl_vrow = (threadIdx|blockIdx)\.[xy] \* {rows}u \+ kl_s;", rw.source)
        if shutil.which("nvcc"):
            work = tmp_path / rw.variant.replace("=", "")
            shutil.copytree(CORPUS / name, work / name)
            shutil.copytree(CORPUS / "_common", work / "_common")
            compiles(rw.source, work / name)


# --------------------------------------------------------------------------- fixed-trip-unroll

MARCH = """
__global__ void march(int n, int nz, const float* A, float* B) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float below = A[i], here = A[n + i];
  for (int k = 1; k < nz - 1; ++k) {
    float above = A[(k + 1) * n + i];
    B[k * n + i] = below + here + above;
    below = here; here = above;
  }
}
"""


def march_spec(nz=8):
    return {"kernel": "march", "params": [{"name": "n", "scalar": "int32", "value": 4096},
                                          {"name": "nz", "scalar": "int32", "value": nz},
                                          arr("A", "n*nz"), arr("B", "n*nz", "out")],
            "grid": ["ceil_div(n,256)", 1, 1], "block": [256, 1, 1],
            "tolerance": {"rtol": 1e-5, "atol": 1e-6}, "variants": [{"nz": 5}]}


def unroll_outcome(source, data):
    return evaluate(source, data["kernel"], parse_spec(data), [rule_by_name("fixed-trip-unroll")])[0]


def test_fixed_trip_unrolled_behind_a_guard(tmp_path):
    found = unroll_outcome(MARCH, march_spec())
    assert found.applicable, found.why
    assert "6 trips" in found.why
    plain, restricted = found.rewrites
    assert (plain.variant, restricted.variant) == ("unroll", "unroll+restrict")
    src = plain.source
    assert "if ((nz - 1) == 7) {\n#pragma unroll\n  for (int k = 1; k < 7; ++k) {" in src
    # The general loop is kept, as written, for every other size.
    assert "} else for (int k = 1; k < nz - 1; ++k) {" in src
    assert plain.launch_override is None
    assert "const float* __restrict__ A, float* __restrict__ B" in restricted.source
    if shutil.which("nvcc"):
        for r in found.rewrites:
            compiles(r.source, tmp_path)


def test_fixed_trip_with_inclusive_bound():
    found = unroll_outcome(MARCH.replace("k < nz - 1", "k <= nz - 2"), march_spec())
    assert found.applicable, found.why
    assert "if ((nz - 2) == 6) {" in found.rewrites[0].source and "k <= 6;" in found.rewrites[0].source


@pytest.mark.parametrize(("change", "nz", "why"), [
    (lambda s: s.replace("k < nz - 1", "k < nz - threadIdx.x"), 8, "differs between threads"),
    (lambda s: s.replace("++k", "k += 2"), 8, "step is not 1"),
    (lambda s: s.replace("int k = 1", "int k = i % 2"), 8, "start is not a constant of at least 0"),
    (lambda s: s.replace("below = here;", "below = here; nz = nz - 0;"), 8, "which its bound reads"),
    (lambda s: s.replace("k < nz - 1", "k < B[0]"), 8, "reads memory"),
    (lambda s: s, 100, "runs 98 times"),
    (lambda s: s.replace("for (int k = 1; k < nz - 1; ++k) {", "{ int k = 1;"), 8, "no loop"),
])
def test_fixed_trip_refusals(change, nz, why):
    found = unroll_outcome(change(MARCH), march_spec(nz))
    assert not found.applicable and why in found.why, found.why


@pytest.mark.parametrize("name", ["rodinia_hotspot3d", "shoc_stencil2d", "rodinia_pathfinder", "rodinia_hotspot"])
def test_fixed_trip_corpus(name, tmp_path):
    text, pre, data = _corpus(name)
    found = evaluate(text, data["kernel"], parse_spec(data), [rule_by_name("fixed-trip-unroll")], preprocessed=pre)[0]
    assert found.applicable, found.why
    for rw in found.rewrites:
        assert "#pragma unroll" in rw.source and "} else " in rw.source
        if shutil.which("nvcc"):
            work = tmp_path / rw.variant.replace("+", "_")
            shutil.copytree(CORPUS / name, work / name)
            shutil.copytree(CORPUS / "_common", work / "_common")
            compiles(rw.source, work / name)


def test_fixed_trip_leaves_a_constant_bound_to_the_compiler():
    found = unroll_outcome(MARCH.replace("k < nz - 1", "k < 7"), march_spec())
    assert not found.applicable and "already a constant" in found.why, found.why


def test_a_pure_math_call_in_the_bound_is_not_taken_for_a_side_effect():
    """Rodinia backprop's ``i <= __log2f(HEIGHT)``: the refusal is about the trip count, which the analysis cannot
    evaluate through the call, not about memory or side effects."""
    found = unroll_outcome(MARCH.replace("k < nz - 1", "k < max(nz, 3) - 1"), march_spec())
    assert not found.applicable and "its trip count is not known at the spec's size" in found.why, found.why
    effect = unroll_outcome(MARCH.replace("k < nz - 1", "k < nz - 1 + (int)printf(\"\")"), march_spec())
    assert not effect.applicable and "its bound reads memory or has side effects" in effect.why, effect.why


def test_fixed_trip_keeps_a_pragma_with_the_original_loop(tmp_path):
    src = MARCH.replace("  for (int k = 1;", "  #pragma unroll 2\n  for (int k = 1;")
    found = unroll_outcome(src, march_spec())
    assert found.applicable, found.why
    out = found.rewrites[0].source
    assert "} else \n#pragma unroll 2\n  for (int k = 1; k < nz - 1; ++k) {" in out, out
    assert out.count("#pragma unroll 2") == 1
    if shutil.which("nvcc"):
        compiles(out, tmp_path)


@pytest.mark.parametrize("name", ["polybench_conv2d", "polybench_fdtd2d_step3"])
def test_corpus_candidates_keep_the_users_macros(name, tmp_path):
    """The rewrite copies the statements from the user's text, so the harness's static check finds
    no problem size written as a literal (``NJ`` stays ``NJ``, not the ``4096`` it expands to)."""
    from kernel_lsp.core.static_check import check

    text, pre, data = _corpus(name)
    found = evaluate(text, data["kernel"], parse_spec(data), [rule_by_name("stencil-row-reuse")], preprocessed=pre)[0]
    assert found.applicable and found.rewrites, found.why
    for rw in found.rewrites:
        report = check(text, rw.source, parse_spec(data))
        assert report.ok, [f"line {e.line}: {e.rule}: {e.message}" for e in report.errors]
        assert "macros expanded" not in rw.description
        body = rw.source[rw.source.index(data["kernel"]):]
        used = [m for m in pre.macros if re.search(rf"\b{m}\b", text[text.index(data["kernel"]):])]
        assert used and all(re.search(rf"\b{m}\b", body) for m in used), used
        if shutil.which("nvcc"):
            work = tmp_path / rw.variant.replace("=", "")
            shutil.copytree(CORPUS / name, work / name)
            shutil.copytree(CORPUS / "_common", work / "_common")
            compiles(rw.source, work / name)


def test_a_statement_inside_a_macro_falls_back_to_the_expanded_body(tmp_path):
    """A guard written as a macro has no text of its own to copy: the body is written expanded."""
    source = "#define STORE B[i*n + j] = A[(i-1)*n + j] + A[(i+1)*n + j]\n" + JACOBI.replace(
        "B[i*n + j] = 0.2f * (A[i*n + j] + A[i*n + j - 1] + A[i*n + j + 1] + A[(i + 1)*n + j] + A[(i - 1)*n + j]);",
        "STORE;")
    found = evaluate(source, "jacobi", parse_spec(spec("jacobi")), [rule_by_name("stencil-row-reuse")],
                     preprocessed=preprocess(source))[0]
    assert found.applicable, found.why
    rw = found.rewrites[0]
    assert "macros expanded" in rw.description
    assert "kl_v0[kl_s] = A[(i-1)*n + j] + A[(i+1)*n + j];" in rw.source
    if shutil.which("nvcc"):
        compiles(rw.source, tmp_path)


TAPS = """
#define RADIUS 2
#define AT(r, c) ((r) * (long)w + (c))
__global__ void __launch_bounds__(256) blur(const float* __restrict__ in, float* __restrict__ out, int h, int w) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  int r = blockIdx.y * blockDim.y + threadIdx.y;
  if (r >= RADIUS && r < h - RADIUS && c >= RADIUS && c < w - RADIUS) {
    float acc = 0.0f;
    for (int dy = -RADIUS; dy <= RADIUS; ++dy) {
      #pragma unroll
      for (int dx = -RADIUS; dx <= RADIUS; ++dx) acc += in[AT(r + dy, c + dx)] * (1.0f + dx * dx + dy);
    }
    out[AT(r, c)] = acc * 0.04f;
  }
}
"""
TAPS_MAIN = r"""
int main() {
  const int h = 53, w = 37;
  std::vector<float> in(h * w), out(h * w, 9.0f);
  for (int i = 0; i < h * w; i++) in[i] = (float)((i * 29) % 31) - 15.0f;
  kl_launch({(w + 31) / 32, (h + 7) / 8, 1}, {32, BY, 1}, [&] { blur(in.data(), out.data(), h, w); });
  for (float v : out) printf("%a\n", v);
}
"""


def test_tap_loops_are_unrolled_into_each_row_and_compute_what_the_original_did(tmp_path):
    data = spec("blur")
    data["params"] = [arr("in", "h*w"), arr("out", "h*w", "out"), {"name": "h", "scalar": "int32", "value": 2048},
                      {"name": "w", "scalar": "int32", "value": 2048}]
    data["grid"], data["variants"] = ["ceil_div(w,32)", "ceil_div(h,8)", 1], [{"h": 53, "w": 37}]
    found = outcome(TAPS, data)
    assert found.applicable, found.why
    assert "tap loops of constant trips" in found.why
    assert [r.variant for r in found.rewrites] == ["rows=8", "rows=4"]
    for rw in found.rewrites:
        # The outer tap loop gets its unroll, the inner keeps the user's; the macros stay.
        assert "#pragma unroll\n            for (int dy = -RADIUS; dy <= RADIUS; ++dy)" in rw.source
        assert rw.source.count("#pragma unroll\n      for (int dx") == 2
        if shutil.which("g++"):
            from cpu_cuda import run_on_cpu
            rows = int(rw.variant.split("=")[1])
            before = run_on_cpu(TAPS, TAPS_MAIN.replace("BY", "8"), tmp_path, "blur")
            # The same grid, blocks of 8 / rows rows of threads, each thread `rows` rows.
            assert [int(v) for v in rw.launch_override["block"]] == [32, 8 // rows, 1]
            after = run_on_cpu(rw.source, TAPS_MAIN.replace("BY", str(8 // rows)), tmp_path, f"blur{rows}")
            assert after == before
        if shutil.which("nvcc"):
            compiles(rw.source, tmp_path)


# One row per block along y, the grid as tall as the interior (Parboil's naive stencil, in 2-D): the
# grid's extent `h - 2` is a multiple of the rows per thread at no size but the test's by chance.
GRID_ROWS = """
__global__ void rows(const float* A, float* B, int w, int h) {
  int c = threadIdx.x;
  int r = blockIdx.y + 1;
  if (c > 0 && c < w - 1)
    B[r * w + c] = 0.25f * (A[(r - 1) * w + c] + A[(r + 1) * w + c] + A[r * w + c - 1] + A[r * w + c + 1]);
}
"""
GRID_ROWS_MAIN = r"""
int main() {
  const int w = 40, h = 41;
  std::vector<float> in(h * w), out(h * w, 9.0f);
  for (int i = 0; i < h * w; i++) in[i] = (float)((i * 29) % 31) - 15.0f;
  kl_launch({1, GY, 1}, {w, 1, 1}, [&] { rows(in.data(), out.data(), w, h); });
  for (float v : out) printf("%a\n", v);
}
"""


def grid_rows_spec(grid_y="h-2"):
    return {"kernel": "rows", "params": [arr("A", "w*h"), arr("B", "w*h", "out"), {"name": "w", "scalar": "int32", "value": 1024},
                                        {"name": "h", "scalar": "int32", "value": 2048}],
            "grid": [1, grid_y, 1], "block": ["w", 1, 1], "tolerance": {"rtol": 1e-5, "atol": 1e-6},
            "variants": [{"w": 64, "h": 66}]}


def test_a_grid_extent_that_varies_is_rounded_up_and_its_missing_rows_skipped(tmp_path):
    found = outcome(GRID_ROWS, grid_rows_spec())
    assert found.applicable, found.why
    assert [r.variant for r in found.rewrites] == ["rows=8", "rows=6"]
    for rw in found.rewrites:
        rows = int(rw.variant.split("=")[1])
        assert rw.launch_override["grid"][1] == f"((h-2) + {rows - 1}) / {rows}"
        assert rw.source.count("if (kl_vrow >= ((unsigned)(h-2)))") == 2
        if shutil.which("g++"):
            from cpu_cuda import run_on_cpu
            # h - 2 = 39 rows: neither 8 nor 6 divides it, so the last thread of each column has rows that do not exist.
            before = run_on_cpu(GRID_ROWS, GRID_ROWS_MAIN.replace("GY", "h - 2"), tmp_path, "rows")
            after = run_on_cpu(rw.source, GRID_ROWS_MAIN.replace("GY", f"(h - 2 + {rows - 1}) / {rows}"), tmp_path, f"rows{rows}")
            assert after == before
        if shutil.which("nvcc"):
            compiles(rw.source, tmp_path)


@pytest.mark.parametrize(("grid_y", "why"), [
    ("ceil_div(h,1)", "is not integer arithmetic the kernel can evaluate"),
])
def test_a_grid_extent_the_kernel_cannot_compute_is_refused(grid_y, why):
    found = outcome(GRID_ROWS, grid_rows_spec(grid_y))
    assert not found.applicable and why in found.why, found.why


def test_a_grid_extent_over_a_parameter_the_kernel_assigns_is_refused():
    found = outcome(GRID_ROWS.replace("int c = threadIdx.x;", "int c = threadIdx.x; h = h + 0;"), grid_rows_spec())
    assert not found.applicable and "reads h, which the kernel assigns" in found.why, found.why


def _applied(source, found, rewrite):
    from kernel_lsp.core.candidates import Candidate
    from kernel_lsp.core.transforms.launch_edit import applied_source

    kernel = found.rewrites[0].source.split("__global__ void ", 1)[1].split("(", 1)[0]
    candidate = Candidate(kernel, rewrite.source, found.technique, f"rule:stencil-row-reuse[{rewrite.variant}]",
                          rewrite.description, rewrite.launch_override, block=rewrite.block, grid_divide=rewrite.grid_divide)
    return applied_source(candidate, source)


def test_apply_gives_the_host_launch_the_smaller_block_or_grid():
    """The host's own launch gets what the harness verified: a block of 8 / C rows (the grid kept), or
    the grid divided along the rows' axis, rounded up (the kernel skips the rows past the extent)."""
    host = "\nvoid run(int n, float* A, float* B) { dim3 block(32, 8); dim3 grid((n + 31) / 32, (n + 7) / 8); " \
           "jacobi<<<grid, block>>>(n, A, B); }\n"
    found = outcome(JACOBI + host, spec("jacobi"))
    rw = found.rewrites[1]
    assert rw.variant == "rows=4" and rw.block == (32, 2, 1)
    edited = _applied(JACOBI + host, found, rw)
    assert edited.instruction is None and "jacobi<<<dim3(dim3(grid).x, dim3(grid).y, dim3(grid).z), dim3(32, 2, 1)>>>" \
        in edited.source, edited.source
    host = "\nvoid run(float* A, float* B, int w, int h) { rows<<<dim3(1, h - 2), w>>>(A, B, w, h); }\n"
    found = outcome(GRID_ROWS + host, grid_rows_spec())
    rw = found.rewrites[0]
    assert rw.variant == "rows=8" and rw.block is None and rw.grid_divide == (1, 8, 1)
    edited = _applied(GRID_ROWS + host, found, rw)
    assert edited.instruction is None
    assert "rows<<<dim3(dim3(dim3(1, h - 2)).x, (dim3(dim3(1, h - 2)).y + 7) / 8, dim3(dim3(1, h - 2)).z), w>>>" \
        in edited.source, edited.source


def test_refuses_a_block_that_changes_with_the_sizes():
    data = spec("jacobi", block=(32, "n/128", 1))
    found = outcome(JACOBI, data)
    assert not found.applicable and "the block is not the same at every size" in found.why, found.why


WHILE_MARCH = MARCH.replace("for (int k = 1; k < nz - 1; ++k) {", "int k = 1;\n  while (k < nz - 1) {").replace(
    "below = here; here = above;\n  }", "below = here; here = above;\n    ++k;\n  }")
MARCH_MAIN = r"""
int main() {
  const int n = 300, nz = NZ;
  std::vector<float> A(n * nz), B(n * nz, -1.0f);
  for (int i = 0; i < n * nz; i++) A[i] = (float)((i * 29) % 31) - 15.0f;
  kl_launch({(n + 255) / 256, 1, 1}, {256, 1, 1}, [&] { march(n, nz, A.data(), B.data()); });
  for (float v : B) printf("%a\n", v);
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_fixed_trip_unrolls_a_while_loop_behind_the_same_guard(tmp_path):
    from cpu_cuda import run_on_cpu

    assert WHILE_MARCH != MARCH and "++k;" in WHILE_MARCH
    found = unroll_outcome(WHILE_MARCH, march_spec())
    assert found.applicable, found.why
    assert "if ((nz - 1) == 7) {\n#pragma unroll\n  while (k < 7) {" in found.rewrites[0].source
    # At the spec's size the unrolled copy runs, at another the loop as written: both as the original.
    for nz in (8, 5):
        main = MARCH_MAIN.replace("NZ", str(nz))
        before = run_on_cpu(WHILE_MARCH, main, tmp_path, f"march{nz}")
        for n, rw in enumerate(found.rewrites):
            assert run_on_cpu(rw.source, main, tmp_path, f"march{nz}_{n}") == before


# The border rows handled apart by a branch (PolyBench fdtd-2d's step 1 sets row 0 from a source term): the
# fast path is the interior arm, a thread whose rows include a border runs the original body for each.
BORDERS = """
__global__ void edge(int n, const float* A, const float* S, float* B) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  int i = blockIdx.y * blockDim.y + threadIdx.y;
  if (i < n && j < n) {
    float w = 0.5f;
    if (i == 0) {
      B[i*n + j] = S[j];
    } else if (i == n - 1) {
      B[i*n + j] = A[i*n + j];
    } else {
      B[i*n + j] = w * (A[(i - 1)*n + j] + A[(i + 1)*n + j]) - A[i*n + j];
    }
  }
}
"""
BORDERS_MAIN = r"""
int main() {
  const int n = 45;
  std::vector<float> a(n * n), s(n), b(n * n, 9.0f);
  for (int i = 0; i < n * n; i++) a[i] = (float)((i * 29) % 31) - 15.0f;
  for (int i = 0; i < n; i++) s[i] = 100.0f + i;
  kl_launch({(n + 31) / 32, (n + 7) / 8, 1}, {32, BY, 1}, [&] { edge(n, a.data(), s.data(), b.data()); });
  for (float v : b) printf("%a\n", v);
}
"""


def _borders_spec():
    return dict(spec("edge", extra=[arr("S", "n")]), params=[
        {"name": "n", "scalar": "int32", "value": 2048}, arr("A", "n*n"), arr("S", "n"), arr("B", "n*n", "out")])


def test_a_border_branch_leaves_the_interior_arm_to_the_fast_path(tmp_path):
    found = outcome(BORDERS, _borders_spec())
    assert found.applicable, found.why
    assert found.why.endswith("the fast path runs the arm of the branch at line 7 that reads the most, rows taking "
                              "another arm run the original body"), found.why
    for rw in found.rewrites:
        src = rw.source
        # A fast row passes the guard and takes neither border arm; only the interior's store is deferred.
        assert "kl_all = kl_all && (i < n && j < n) && !(i == 0) && !(i == n - 1);" in src
        fast = src.split("if (kl_all) {", 1)[1].split("} else {", 1)[0]
        assert "kl_v0[kl_s] = w * (A[(i - 1)*n + j] + A[(i + 1)*n + j]) - A[i*n + j];" in fast
        assert "S[j]" not in fast and "float w = 0.5f;" in fast
        assert src.count("B[i*n + j] = S[j];") == 1
        if shutil.which("g++"):
            from cpu_cuda import run_on_cpu
            rows = int(rw.variant.split("=")[1])
            before = run_on_cpu(BORDERS, BORDERS_MAIN.replace("BY", "8"), tmp_path, "edge")
            after = run_on_cpu(src, BORDERS_MAIN.replace("BY", str(8 // rows)), tmp_path, f"edge{rows}")
            assert after == before
        if shutil.which("nvcc"):
            compiles(src, tmp_path)


def test_a_border_branch_without_a_guard_around_it(tmp_path):
    unguarded = BORDERS.replace("  if (i < n && j < n) {\n    float w = 0.5f;\n", "  if (i >= n || j >= n) return;\n"
                                "  float w = 0.5f;\n").replace("    }\n  }\n}\n", "    }\n}\n")
    found = outcome(unguarded, _borders_spec())
    assert found.applicable, found.why
    rw = found.rewrites[0]
    assert "kl_all = kl_all && !(i == 0) && !(i == n - 1);" in rw.source
    if shutil.which("g++"):
        from cpu_cuda import run_on_cpu
        before = run_on_cpu(unguarded, BORDERS_MAIN.replace("BY", "8"), tmp_path, "edge_u")
        assert run_on_cpu(rw.source, BORDERS_MAIN.replace("BY", "1"), tmp_path, "edge_u8") == before


@pytest.mark.parametrize(("change", "why"), [
    (lambda s: s.replace("if (i == 0) {", "if (S[j] > 0) {"), "not integer arithmetic"),
    (lambda s: s.replace("float w = 0.5f;", "int w = i % 3;").replace("if (i == 0) {", "if (w == 0) {"),
     "the branch's condition reads w, which the guarded block computes before it"),
    (lambda s: s.replace("B[i*n + j] = A[i*n + j];", "if (j > 0) B[i*n + j] = A[i*n + j];"),
     "has statements other than declarations, expressions and tap loops"),
    (lambda s: s.replace("B[i*n + j] = w * (", "float w = 0.25f; B[i*n + j] = w * ("), "declares w again"),
    (lambda s: s.replace("float w = 0.5f;", "float w = 0.5f; if (j == 1) w = 0.25f;"), "other than one if/else"),
])
def test_border_branch_refusals(change, why):
    found = outcome(change(BORDERS), _borders_spec())
    assert not found.applicable and why in found.why, found.why
