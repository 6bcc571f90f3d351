"""The shared-tile store transformation: where it applies, each refusal with its missing fact,
the ragged-edge guard kept as the store's guard, and the candidates compiled by nvcc."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.source import preprocess
from kernel_lsp.core.spec import parse_spec
from nvcc_check import compiles

CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus"


def spec_of(kernel: str, params: list[dict], grid, block, variants=None) -> dict:
    data = {"kernel": kernel, "params": params, "grid": grid, "block": block}
    if variants:
        data["variants"] = variants
    return data


def arr(name, size, role="in"):
    return {"name": name, "array": "float32", "size": size, "init": "uniform(-1,1)" if role != "out" else "zeros", "role": role}


def scalar(name, value):
    return {"name": name, "scalar": "int32", "value": value}


def outcome(source: str, spec: dict):
    return evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name("shared-tile-store")])[0]


TRANSPOSE = """
__global__ void transpose(const float* in, float* out, int n, int m) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < n && y < m)
    out[x * m + y] = in[y * n + x];
}
"""
# Ragged at both sizes: 1000 x 999 and 37 x 45 are not multiples of the 32 x 8 block.
TRANSPOSE_SPEC = spec_of("transpose", [arr("in", "n*m"), arr("out", "n*m", "out"), scalar("n", 1000), scalar("m", 999)],
                         ["ceil_div(n,32)", "ceil_div(m,8)", 1], [32, 8, 1], [{"n": 37, "m": 45}])


def test_a_guarded_transpose_store_is_staged_and_the_guard_kept(tmp_path):
    found = outcome(TRANSPOSE, TRANSPOSE_SPEC)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    # The guard decides what is staged; the barriers are outside it, reached by every thread.
    guarded, flush = source.split("if (x < n && y < m)", 1)[1].split("__syncthreads();", 1)
    assert "kl_stage_set[kl_stage_mine] = 1;" in guarded and "out[kl_stage_index[kl_stage_slot]] = kl_stage_value[kl_stage_slot];" in flush
    body = source.split("{", 1)[1]
    assert body.index("kl_stage_set[kl_stage_mine] = 0;") < body.index("if (x < n && y < m)") < body.index("__syncthreads();")
    # The tile: the spec's 32 x 8 block, each row padded by one slot.
    assert "kl_stage_value[288]" in source and "<= 288u" in source
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


@pytest.mark.parametrize(("change", "why"), [
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "out[x * m + y] = in[y * n + x] + out[0];"),
     "accessed elsewhere"),
    (lambda s: s.replace("  if (x < n && y < m)\n", "  if (x >= n || y >= m) return;\n"), "a return before the kernel's end"),
    (lambda s: s.replace("  if (x < n && y < m)\n", "  for (int k = 0; k < x; k++) if (x < n && y < m)\n"),
     "depends on the thread"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "for (int k = 0; k < 2; k++) out[x * m + y] = in[y * n + x];"),
     "another loop"),
    (lambda s: s.replace("  if (x < n && y < m)\n    out[x * m + y] = in[y * n + x];",
                         "  for (int k = 0; k < 4; k++) { if (x < n && y < m) out[x * m + y] = in[y * n + k]; k += x & 1; }"),
     "its body assigns"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "{ int k = 0; while (k < 2) { out[x * m + y] = in[y * n + k]; k++; } }"),
     "another loop"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "out[x * m + y] += in[y * n + x];"),
     "no uncoalesced global store"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "out[y * n + x] = in[x * m + y];"),
     "no uncoalesced global store"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "out[x * m + 2 * y] = in[y * n + x];"),
     "no unit stride along threadIdx.y"),
    (lambda s: s.replace("out[x * m + y] = in[y * n + x];", "out[x * m + y] = in[y * n + x]++;"),
     "side effects"),
    (lambda s: s.replace("  if (x < n && y < m)", "  float acc = 0;\n  for (int k = 0; k < n; k++) acc += in[k];\n  if (x < n && y < m)")
     .replace("= in[y * n + x];", "= acc;"), "the store is a small part of the kernel's traffic"),
])
def test_refusals_name_the_missing_fact(change, why):
    found = outcome(change(TRANSPOSE), TRANSPOSE_SPEC)
    assert not found.applicable and why in found.why, found.why


def test_the_kernels_own_barriers_and_shared_arrays_stay(tmp_path):
    """A kernel that already cooperates (a shared array filled before a barrier) keeps doing so: the
    store is staged beside it, the tile fits beside its shared memory."""
    tiled = TRANSPOSE.replace("  if (x < n && y < m)\n", "  __shared__ float bias[32];\n  if (threadIdx.y == 0) bias[threadIdx.x] = 1.0f;\n"
                              "  __syncthreads();\n  if (x < n && y < m)\n").replace("= in[y * n + x];", "= in[y * n + x] + bias[threadIdx.x];")
    found = outcome(tiled, TRANSPOSE_SPEC)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "__shared__ float bias[32];" in source and source.count("__syncthreads();") == 3
    if shutil.which("nvcc"):
        compiles(source, tmp_path)



def test_refused_when_the_rows_written_back_are_too_short():
    spec = {**TRANSPOSE_SPEC, "block": [128, 2, 1], "grid": ["ceil_div(n,128)", "ceil_div(m,2)", 1]}
    found = outcome(TRANSPOSE, spec)
    assert not found.applicable and "blockDim.y is below" in found.why


@pytest.mark.parametrize("name", ["nvblog_transpose_naive"])
def test_corpus_kernels(name, tmp_path):
    folder = CORPUS / name
    spec = json.loads((folder / "spec.json").read_text())
    found = evaluate((folder / "kernel.cu").read_text(), spec["kernel"], parse_spec(spec),
                     [rule_by_name("shared-tile-store")])[0]
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert source.count("__syncthreads();") == 2
    if shutil.which("nvcc"):
        # The corpus's kernels include ../_common/: the same layout in the scratch folder.
        shutil.copytree(CORPUS / "_common", tmp_path / "_common")
        compiles(source, tmp_path / name)


@pytest.mark.parametrize("name", ["llmc_permute_kernel", "sgemmcuda_naive", "llmc_matmul_forward_kernel1"])
def test_corpus_kernels_refused_with_a_reason(name):
    folder = CORPUS / name
    spec = json.loads((folder / "spec.json").read_text())
    found = evaluate((folder / "kernel.cu").read_text(), spec["kernel"], parse_spec(spec),
                     [rule_by_name("shared-tile-store")])[0]
    assert not found.applicable and found.why


ROWS = """
__global__ void columns(const float* in, float* out, int n, int f) {
  int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p < n) {
    for (int i = 0; i < f; i++)
      out[p + n * i] = in[p * f + i];
  }
}
"""
# 1000 and 37 points: the last block is ragged; 34 and 3 features: the last chunk of 8 iterations too.
ROWS_SPEC = spec_of("columns", [arr("in", "n*f"), arr("out", "n*f", "out"), scalar("n", 1000), scalar("f", 34)],
                    ["ceil_div(n,256)", 1, 1], [256, 1, 1], [{"n": 37, "f": 3}])


def load_outcome(source: str, spec: dict):
    return evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name("shared-tile-load")])[0]


def test_a_row_read_is_staged_with_the_guard_split(tmp_path):
    found = load_outcome(ROWS, ROWS_SPEC)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    # The guard is evaluated once, as before, and no longer keeps threads from the loop and its barriers:
    # it decides what each thread stages (the load guard) and whether it runs the body (the store guard).
    assert "const bool kl_rg = ((p < n));" in source and "if (p < n)" not in source
    assert "if (kl_rg && (kl_ri < f)) kl_rn = kl_rj + 1;" in source and "kl_rtile_from[kl_rme] = &in[p * f + i];" in source
    assert "if (kl_rg) out[p + n * i] = (kl_rtiled ? kl_rtile_value[kl_rme * 33 + kl_rk] : in[p * f + i]);" in source
    # 32 floats (a 128-byte line) per thread and chunk, rows of 32 + 1 slots for the spec's 256 threads.
    assert "kl_rtile_value[8448]" in source and source.count("__syncthreads();") == 3
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


@pytest.mark.parametrize(("change", "why"), [
    (lambda s: s.replace("out[p + n * i] = in[p * f + i];", "if (i % 2) out[p + n * i] = in[p * f + i];"), "conditional"),
    (lambda s: s.replace("out[p + n * i] = in[p * f + i];", "out[p + n * i] = i > 0 ? in[p * f + i] : 0;"),
     "conditional"),
    (lambda s: s.replace("const float* in", "float* in").replace("out[p + n * i] = in[p * f + i];",
                                                                 "{ out[p + n * i] = in[p * f + i]; in[p] = 0; }"),
     "is written"),
    (lambda s: s.replace("i < f;", "i < p % 7;"), "depends on the thread"),
    (lambda s: s.replace("i < f;", "i != f;"), "has no counter the analysis follows"),
    (lambda s: s.replace("out[p + n * i] = in[p * f + i];", "{ const float* q = &in[p * f + i]; out[p + n * i] = *q; }"),
     "not a subscript or a load intrinsic"),
    (lambda s: s.replace("i++)", "i += 2)"), "no uncoalesced global read with unit stride along its loop"),
    (lambda s: s.replace("if (p < n) {", "if (p < n) {\n    int g = f;").replace("i < f;", "i < g;"),
     "the loop's header uses g, declared under the guard"),
    (lambda s: s.replace("if (p < n) {", "if (p < n) {\n    auto g = f;"), "cannot be named before its initialiser"),
    (lambda s: s.replace("if (p < n) {", "if (p < n) {\n    float g[2] = {0, 1};"), "an array"),
    (lambda s: s.replace("if (p < n) {", "if (p < n) {\n    if (f > 1)"), "every thread would not reach"),
    (lambda s: s.replace("  if (p < n) {", "  if (p >= n) return;\n  {"), "a return before the kernel's end"),
    (lambda s: s.replace("in[p * f + i]", "in[p * f + i + k]").replace("out[p + n * i] =", "{ int k = i & 1; out[p + n * i] =").replace("+ k];\n", "+ k]; }\n"),
     "not the loop's iteration plus a part the loop does not change"),
    (lambda s: s.replace("out[p + n * i] = in[p * f + i];", "{ const float* q = in + p * f; out[p + n * i] = q[i]; }"),
     "names made inside the loop"),
    (lambda s: s.replace("int p =", "int i; int p =").replace("for (int i = 0;", "for (i = 0;")
     .replace("  }\n}", "  }\n  out[0] = i;\n}"), "used outside the loop"),
])
def test_load_refusals_name_the_missing_fact(change, why):
    found = load_outcome(change(ROWS), ROWS_SPEC)
    assert not found.applicable and why in found.why, found.why


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_a_counter_declared_under_the_guard_and_set_by_the_header(tmp_path):
    """PolyBench-ACC's ``int k; for (k = 0; …)`` inside the guard: every thread's loop starts the same whatever the
    guard, so the rule applies; run on the CPU beside the original at a ragged size, the outputs are the same."""
    from cpu_cuda import run_on_cpu

    source = ROWS.replace("  if (p < n) {\n    for (int i = 0;", "  if (p < n) {\n    int i;\n    for (i = 0;")
    assert "int i;\n    for (i = 0;" in source
    found = load_outcome(source, ROWS_SPEC)
    assert found.applicable, found.why
    main = r"""
int main() {
  const int n = 300, f = 5;
  std::vector<float> in(n * f), out(n * f, -1.0f);
  for (int t = 0; t < n * f; t++) in[t] = (float)((t * 7) % 23);
  kl_launch({(n + 255) / 256, 1, 1}, {256, 1, 1}, [&] { columns(in.data(), out.data(), n, f); });
  for (int t = 0; t < n * f; t++) printf("%a\n", out[t]);
}
"""
    assert run_on_cpu(found.rewrites[0].source, main, tmp_path, "staged") == run_on_cpu(source, main, tmp_path, "original")
    if shutil.which("nvcc"):
        compiles(found.rewrites[0].source, tmp_path)


def test_load_refused_when_the_loop_bound_is_loaded_from_memory():
    src = ROWS.replace("const float* in,", "const float* in, const int* len,").replace("i < f;", "i < len[0];")
    spec = {**ROWS_SPEC, "params": [ROWS_SPEC["params"][0], {**arr("len", "1"), "array": "int32", "init": "zeros"},
                                    *ROWS_SPEC["params"][1:]]}
    found = load_outcome(src, spec)
    assert not found.applicable and "not made of the kernel's scalars" in found.why, found.why


def test_load_chunk_shrinks_to_fit_and_is_refused_when_nothing_fits():
    spec = {**ROWS_SPEC, "block": [1024, 1, 1], "grid": ["ceil_div(n,1024)", 1, 1]}
    found = load_outcome(ROWS, spec)
    # 1024 threads: 8 floats (one sector) per thread is what fits in 48 KB.
    assert found.applicable and "kl_rtile_value[9216]" in found.rewrites[0].source, found.why
    doubles = {**spec, "params": [{**p, "array": "float64"} if "array" in p else p for p in spec["params"]]}
    found = load_outcome(ROWS.replace("float", "double"), doubles)
    assert not found.applicable and "does not fit the static shared memory" in found.why


DOT = """
__global__ void dots(const float* in, const float* w, float* out, int n, int f) {
  int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p < n) {
    float acc = 0.0f;
    const float* row = in + p * f;
    for (int i = 0; i < f; i++)
      acc += row[i] * w[i];
    out[p] = acc;
  }
}
"""


def test_the_other_statements_of_the_guard_run_under_its_value(tmp_path):
    spec = spec_of("dots", [arr("in", "n*f"), arr("w", "f"), arr("out", "n", "out"), scalar("n", 1000), scalar("f", 34)],
                   ["ceil_div(n,256)", 1, 1], [256, 1, 1], [{"n": 37, "f": 3}])
    found = load_outcome(DOT, spec)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    # Declarations keep their scope and are initialised only under the guard; other statements run only under it.
    assert "float acc = kl_rg ? (0.0f) : decltype(acc)();" in source
    assert "const float* row = kl_rg ? (in + p * f) : decltype(row)();" in source
    assert "if (kl_rg) { out[p] = acc; }" in source and "kl_rtile_from[kl_rme] = &row[i];" in source
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


def test_a_guard_without_braces_is_split_too(tmp_path):
    src = ROWS.replace("  if (p < n) {\n", "  if (p < n)\n").replace("  }\n}", "}")
    found = load_outcome(src, ROWS_SPEC)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "const bool kl_rg = ((p < n));" in source and "if (kl_rg) { for" not in source
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


def test_load_through_ldg_is_staged(tmp_path):
    found = load_outcome(ROWS.replace("in[p * f + i]", "__ldg(&in[p * f + i])"), ROWS_SPEC)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "kl_rtile_from[kl_rme] = &in[p * f + i];" in source and ": __ldg(&in[p * f + i]))" in source
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


def test_load_without_a_guard_wraps_the_loop(tmp_path):
    src = ROWS.replace("  if (p < n) {\n", "  {\n").replace("n * i]", "n * i] ")
    spec = {**ROWS_SPEC, "grid": ["n / 256 + 1", 1, 1]}
    found = load_outcome(src.replace("int p = blockIdx.x * blockDim.x + threadIdx.x;",
                                     "int p = min(blockIdx.x * blockDim.x + threadIdx.x, n - 1);"), spec)
    assert found.applicable, found.why
    assert "const bool kl_rg = true;" in found.rewrites[0].source
    if shutil.which("nvcc"):
        compiles(found.rewrites[0].source, tmp_path)


@pytest.mark.parametrize("name", ["rodinia_kmeans_invert_mapping", "polybench_atax_kernel1", "polybench_gesummv"])
def test_corpus_row_reads_are_staged_on_the_load_side(name, tmp_path):
    folder = CORPUS / name
    spec = json.loads((folder / "spec.json").read_text())
    src = (folder / "kernel.cu").read_text()
    pre = preprocess(src, str(folder / "kernel.cu"), read_file=lambda p: Path(p).read_text() if Path(p).exists() else None)
    load = evaluate(src, spec["kernel"], parse_spec(spec), [rule_by_name("shared-tile-load")], preprocessed=pre)[0]
    assert load.applicable, load.why
    assert load.rewrites[0].source.count("__syncthreads();") == 3
    if shutil.which("nvcc"):
        compiles(load.rewrites[0].source, tmp_path / name, include=folder)


@pytest.mark.parametrize("name", ["sgemmcuda_naive", "llmc_matmul_forward_kernel1", "polybench_syrk"])
def test_a_read_tile_contraction_shares_across_the_block_is_left_to_it(name):
    """Measured on the H200 (corpus_suite.json): staging sgemm's and llm.c's row reads gave 1.61x and 1.27x where
    tile-contraction, sharing the same operands across the block, gave 25.6x and 20.5x."""
    folder = CORPUS / name
    spec = json.loads((folder / "spec.json").read_text())
    src = (folder / "kernel.cu").read_text()
    pre = preprocess(src, str(folder / "kernel.cu"), read_file=lambda p: Path(p).read_text() if Path(p).exists() else None)
    load, tiles = evaluate(src, spec["kernel"], parse_spec(spec), [rule_by_name("shared-tile-load"),
                                                                   rule_by_name("tile-contraction")], preprocessed=pre)
    assert tiles.applicable, tiles.why
    assert not load.applicable and "is an operand tile-contraction shares through shared memory" in load.why, load.why


def test_a_store_running_backwards_along_y_is_staged_too(tmp_path):
    """``dst[x * m + (m - 1 - y)]``: a coefficient of -1 along threadIdx.y, still neighbouring elements."""
    backwards = TRANSPOSE.replace("out[x * m + y]", "out[x * m + (m - 1 - y)]")
    found = outcome(backwards, TRANSPOSE_SPEC)
    assert found.applicable, found.why
    if shutil.which("nvcc"):
        compiles(found.rewrites[0].source, tmp_path)
