"""More parallelism for under-filled grids (split-loop, smaller-blocks), and the legality checks the
split shares with the warp per row: where each applies, each refusal's reason, the emitted code
compiled by nvcc, and the corpus kernels they target."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from kernel_lsp.core.candidates import OptimizeRequest
from kernel_lsp.core.rules import RuleGenerator, evaluate, rule_by_name
from kernel_lsp.core.source import preprocess
from kernel_lsp.core.spec import parse_spec, with_candidate_launch
from kernel_lsp.services.source_view import header_reader
from nvcc_check import compiles
from rule_specs import arr, outcome, scalar, spec_of

CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus"


def corpus(name: str):
    """(source, spec, preprocessed view with the entry's headers, reprocess) of a corpus kernel."""
    path = str(CORPUS / name / "kernel.cu")
    reader = header_reader((os.path.dirname(path), str(CORPUS)))
    source = Path(path).read_text()
    spec = json.loads((CORPUS / name / "spec.json").read_text())
    return source, spec, preprocess(source, path, reader), (lambda text: preprocess(text, path, reader)), path


COLSUM = """
__global__ void colsum(int n, const float* a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float s = 0.0f;
    for (int j = 0; j < n; j++)
      s += a[j * n + i] * x[j];
    y[i] = s;
  }
}
void host(int n, const float* a, const float* x, float* y) { colsum<<<(n + 31) / 32, 32>>>(n, a, x, y); }
"""
COLSUM_SPEC = spec_of("colsum", [scalar("n", 4096), arr("a", "n*n"), arr("x", "n"), arr("y", "n", "out")],
                      ["ceil_div(n,32)", 1, 1], [32, 1, 1], [{"n": 1001}])


def test_split_loop_applies_to_an_underfilled_column_loop(tmp_path):
    found = outcome("split-loop", COLSUM, COLSUM_SPEC)
    assert found.applicable, found.why
    assert "128 warps" in found.why
    rewrite = found.rewrites[0]
    # float elements: 4 lanes keep 8 neighbouring threads (32 bytes, one sector) per row of the warp.
    assert rewrite.grid_scale == (4, 1, 1)
    assert rewrite.launch_override["grid"][0] == "(ceil_div(n,32)) * 4"
    body = rewrite.source
    assert "j = (0) + kl_lane; j < n; j += 4" in body and "s = kl_init0_0 + kl_warp_sum4(s);" in body
    assert "15u << (threadIdx.x & 28u)" in body  # the shuffle names its own group of lanes only
    if shutil.which("nvcc"):
        compiles(body, tmp_path)


def test_split_loop_grows_the_group_for_doubles():
    doubles = COLSUM.replace("float", "double")
    spec = json.loads(json.dumps(COLSUM_SPEC).replace("float32", "float64"))
    spec["grid"], spec["block"] = ["ceil_div(n,256)", 1, 1], [256, 1, 1]
    found = outcome("split-loop", doubles, spec)
    assert found.applicable, found.why
    assert found.rewrites[0].grid_scale == (8, 1, 1)


@pytest.mark.parametrize(("change", "spec_change", "why"), [
    (None, {"grid": ["ceil_div(n,32)", 1, 1], "block": [32, 1, 1], "params_n": 65536}, "enough for 132 SMs"),
    (lambda s: s.replace("s += a[j * n + i] * x[j];", "s = s * 0.5f + a[j * n + i];"), None, "carries s"),
    (lambda s: s.replace("for (int j = 0; j < n; j++)", "int j; for (j = 0; j < n; j++)").replace("y[i] = s;", "y[i] = s + j;"),
     None, "counter `j` is read after it"),
    (lambda s: s.replace("if (i < n) {", "__shared__ float t[32]; t[threadIdx.x] = 0; __syncthreads(); if (i < n) {"),
     None, "barriers"),
])
def test_split_loop_refusals(change, spec_change, why):
    source = change(COLSUM) if change else COLSUM
    spec = json.loads(json.dumps(COLSUM_SPEC))
    if spec_change:
        spec["grid"], spec["block"] = spec_change["grid"], spec_change["block"]
        spec["params"][0]["value"] = spec_change["params_n"]
    found = outcome("split-loop", source, spec)
    assert not found.applicable and why in found.why, found.why


@pytest.mark.parametrize("tail", ["y[i] += s;", "y[i] = s; y[i] = y[i] * 2.0f;"])
def test_a_tail_that_reads_back_the_output_runs_on_the_groups_first_lane(tail):
    """Every lane applying ``y[i] += s`` would add the sum once per lane, and a lane reading ``y[i]`` back could
    see another's store: after the last shuffle the group's first lane runs what follows, once."""
    found = outcome("split-loop", COLSUM.replace("y[i] = s;", tail), COLSUM_SPEC)
    assert found.applicable, found.why
    assert f"if (kl_lane == 0u) {{ {tail} }}" in found.rewrites[0].source


def test_a_reused_counter_assigned_again_after_its_loop_is_fine():
    source = COLSUM.replace("for (int j = 0; j < n; j++)", "int j; for (j = 0; j < n; j++)").replace(
        "y[i] = s;", "for (j = 0; j < 1; j++) s += 0.0f; y[i] = s;")
    found = outcome("split-loop", source, COLSUM_SPEC)
    assert found.applicable, found.why


def test_warp_per_row_runs_a_read_modify_write_after_the_row_loop_on_one_lane():
    """Every lane runs the code before the split loop: ``y[r] += s`` after it would add the row 32 times, so
    the first lane runs it alone; round an outer loop it would run again beside the next split, refused."""
    rows = """
__global__ void rows(int n, const float* a, float* y) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < n) {
    float s = 0.0f;
    for (int j = 0; j < n; j++) s += a[r * n + j];
    y[r] = s;
  }
}
"""
    spec = spec_of("rows", [scalar("n", 2048), arr("a", "n*n"), arr("y", "n", "inout")], ["ceil_div(n,256)", 1, 1], [256, 1, 1])
    assert outcome("warp-per-row", rows, spec).applicable
    found = outcome("warp-per-row", rows.replace("y[r] = s;", "y[r] += s;"), spec)
    assert found.applicable, found.why
    assert "if (kl_lane == 0u) { y[r] += s; }" in found.rewrites[0].source
    looped = rows.replace("    float s = 0.0f;", "    for (int t = 0; t < 2; t++) {\n    float s = 0.0f;").replace(
        "y[r] = s;", "y[r] += s;\n    }")
    found = outcome("warp-per-row", looped, spec)
    assert not found.applicable and "share a loop that every lane runs" in found.why and "lies in another loop" in found.why, found.why


def test_mvt_kernel2_gets_register_accumulate_then_split_loop(tmp_path):
    source, spec, pre, reprocess, path = corpus("polybench_mvt_kernel2")
    generator = RuleGenerator(preprocessed=pre, reprocess=reprocess)
    candidates = list(generator.generate(OptimizeRequest(source=source, path=path, kernel=spec["kernel"], spec=spec)))
    composed = next(c for c in candidates if c.generator == "rule:register-accumulate+split-loop")
    assert composed.after == "rule:register-accumulate" and composed.grid_scale == (4, 1, 1)
    split = next(o for o in generator.outcomes if o.rule == "split-loop")
    assert not split.applicable and "writes `x2` at an index that does not move" in split.why
    if shutil.which("nvcc"):
        compiles(composed.source, tmp_path, str(Path(path).parent))


def test_adi_kernel1_smaller_blocks_and_no_illegal_block_size():
    """adi: one block of 256 threads for 1024 rows, each row a chain carried through X and B. The
    split is refused (carried), smaller blocks spread the 256 threads over 8 SMs, and no block size
    rounds the grid up to threads the original never ran."""
    source, spec, pre, _, _ = corpus("polybench_adi_kernel1")
    outcomes = {o.rule: o for o in evaluate(source, spec["kernel"], parse_spec(spec), preprocessed=pre)}
    assert not outcomes["split-loop"].applicable and "another index than it writes" in outcomes["split-loop"].why
    smaller = outcomes["smaller-blocks"]
    assert smaller.applicable, smaller.why
    assert [(r.launch_override["grid"][0], r.launch_override["block"][0]) for r in smaller.rewrites] == [("(1) * 8", 32)]
    parsed = parse_spec(spec)
    for rewrite in [*smaller.rewrites, *outcomes["block-size"].rewrites]:
        resolved = with_candidate_launch(parsed, rewrite.launch_override).resolve()
        assert resolved.candidate.grid[0] * resolved.candidate.block[0] == 256


@pytest.mark.parametrize(("spec_change", "why"), [
    ({"grid": [512, 1, 1]}, "at least one per SM already"),
    ({"block": [32, 1, 1]}, "as small as this rule makes it"),
    ({"block": [48, 1, 1]}, "no smaller block divides"),
])
def test_smaller_blocks_refusals(spec_change, why):
    elementwise = """
extern "C" __global__ void k(int n, const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { y[i] = 2.0f * x[i]; }
}
"""
    spec = spec_of("k", [scalar("n", 4096), arr("x", "n"), arr("y", "n", "out")], [4, 1, 1], [256, 1, 1])
    spec.update(spec_change)
    found = outcome("smaller-blocks", elementwise, spec)
    assert not found.applicable and why in found.why, found.why


def test_smaller_blocks_edit_the_host_launch_in_its_own_terms():
    from kernel_lsp.core.candidates import Candidate
    from kernel_lsp.core.transforms.launch_edit import applied_source

    source = """
extern "C" __global__ void k(int n, const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { y[i] = 2.0f * x[i]; }
}
void host(int n, const float* x, float* y) { int threads = 256; k<<<(n + threads - 1) / threads, threads>>>(n, x, y); }
"""
    spec = spec_of("k", [scalar("n", 1024), arr("x", "n"), arr("y", "n", "out")], ["ceil_div(n,256)", 1, 1], [256, 1, 1])
    found = outcome("smaller-blocks", source, spec)
    assert found.applicable, found.why
    rewrite = found.rewrites[0]
    assert rewrite.block == (32, 1, 1) and rewrite.launch_override["grid"][0] == "(ceil_div(n,256)) * 8"
    candidate = Candidate("k", rewrite.source, found.technique, "rule:smaller-blocks", rewrite.description,
                          rewrite.launch_override, block=rewrite.block)
    host = applied_source(candidate, source)
    assert host.instruction is None and host.lines == (6,)
    assert ("k<<<dim3((dim3((n + threads - 1) / threads).x * dim3(threads).x + 31) / 32, "
            "dim3((n + threads - 1) / threads).y * dim3(threads).y, dim3((n + threads - 1) / threads).z * dim3(threads).z), "
            "dim3(32, 1, 1)>>>") in host.source
    unlaunched = applied_source(Candidate("k", source.split("void host")[0], found.technique, "rule:smaller-blocks", "",
                                          rewrite.launch_override, block=rewrite.block))
    assert "blocks of 32 x 1 x 1 threads" in unlaunched.instruction


def test_fan2_gets_fuller_blocks_along_y():
    """Rodinia gaussian Fan2: 4 x 4 blocks (half of each warp idle, a quarter of an SM's threads).
    4 x 16 keeps the threads per axis at Size 1024 and at Size 333 (336 threads: 4 x 32 does not divide)."""
    source, spec, pre, _, _ = corpus("rodinia_gaussian_fan2")
    found = evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name("fuller-blocks")], preprocessed=pre)[0]
    assert found.applicable, found.why
    (rewrite,) = found.rewrites
    assert rewrite.block == (4, 16, 1) and rewrite.source == source
    parsed = parse_spec(spec)
    for variant in [None, *range(len(parsed.variants))]:
        resolved = with_candidate_launch(parsed, rewrite.launch_override).resolve(variant)
        assert [g * b for g, b in zip(resolved.candidate.grid, resolved.candidate.block)] == \
               [g * b for g, b in zip(resolved.original.grid, resolved.original.block)]


TINY_2D = """
__global__ void k(int n, const float* x, float* y) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < n && col < n) y[row * n + col] = 2.0f * x[row * n + col];
}
"""
TINY_SPEC = spec_of("k", [scalar("n", 1024), arr("x", "n*n"), arr("y", "n*n", "out")],
                    ["ceil_div(n,8)", "ceil_div(n,4)", 1], [8, 4, 1], [{"n": 200}])


def test_fuller_blocks_applies_and_keeps_threads_per_axis():
    found = outcome("fuller-blocks", TINY_2D, TINY_SPEC)
    assert found.applicable, found.why
    # 8 x 16 would be 128 threads, but 200 rows run on 200 threads along y: 16 does not divide them, 8 does.
    assert found.rewrites[0].block == (8, 8, 1)
    assert found.rewrites[0].launch_override["grid"][1] == "((ceil_div(n,4))*4)/8"
    taller = outcome("fuller-blocks", TINY_2D, dict(TINY_SPEC, variants=[{"n": 256}]))
    assert taller.rewrites[0].block == (8, 16, 1)


@pytest.mark.parametrize(("change", "spec_change", "why"), [
    (None, {"block": [16, 8, 1]}, "can fill an SM already"),
    (lambda s: s.replace("2.0f * x", "(float)threadIdx.y * x"), None,
     "`threadIdx.y` at line 5 reads the thread or block index other than as the global index"),
    (lambda s: s.replace("if (row", "__syncthreads(); if (row"), None, "barriers"),
    (None, {"variants": [{"n": 203}]}, "no taller block divides"),
    (None, {"block": [32, 1, 1]}, "not 2-D"),
])
def test_fuller_blocks_refusals(change, spec_change, why):
    spec = dict(TINY_SPEC, **(spec_change or {}))
    found = outcome("fuller-blocks", change(TINY_2D) if change else TINY_2D, spec)
    assert not found.applicable and why in found.why, found.why


def test_sector_per_row_splits_attentions_short_head_rows(tmp_path):
    source, spec, view, _reprocess, path = corpus("llmc_attention_query_key_kernel1")
    found = evaluate(source, spec["kernel"], parse_spec(spec, str(CORPUS / "llmc_attention_query_key_kernel1")),
                     [rule_by_name("sector-per-row")], preprocessed=view)[0]
    assert found.applicable, found.why
    rewrite = found.rewrites[0]
    # 64-float head rows: 8 lanes per row, one 32-byte sector of the key row per step.
    assert rewrite.grid_scale == (8, 1, 1)
    assert "i = (0) + kl_lane; i < hs; i += 8" in rewrite.source and "kl_warp_sum8(val)" in rewrite.source
    if shutil.which("nvcc"):
        compiles(rewrite.source, tmp_path, include=str(CORPUS / "llmc_attention_query_key_kernel1"))


ROWSUM = """
__global__ void rowsum(int n, int m, const float* a, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float s = 0.0f;
    for (int j = 0; j < m; j++)
      s += a[i * m + j];
    y[i] = s;
  }
}
"""


@pytest.mark.parametrize("m, applies", [(64, True), (4096, False), (6, False)])
def test_sector_per_row_only_for_rows_shorter_than_a_warp_needs(m, applies):
    spec = spec_of("rowsum", [scalar("n", 1 << 20), scalar("m", m), arr("a", "n*m"), arr("y", "n", "out")],
                   ["ceil_div(n,256)", 1, 1], [256, 1, 1])
    found = outcome("sector-per-row", ROWSUM, spec)
    assert found.applicable == applies, found.why
    if not applies:
        assert "shorter than 128" in found.why


CSR_ROWS = """
__global__ void csr(int rows, const int* rowptr, const int* colidx, const float* vals, const float* x, float* y) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) {
    float acc = 0.0f;
    for (int j = rowptr[r]; j < rowptr[r + 1]; ++j) acc += vals[j] * x[colidx[j]];
    y[r] = acc;
  }
}
"""


def test_sector_per_row_is_offered_for_rows_whose_length_is_in_the_data(tmp_path):
    csr_array = lambda name, size, init: {"name": name, "array": "int32", "size": size, "init": init, "role": "in"}
    spec = spec_of("csr", [scalar("rows", 1 << 20), csr_array("rowptr", "rows+1", "csr_rowptr(rows,40)"),
                           csr_array("colidx", "rows*40", "csr_colidx(rows,rows,40)"), arr("vals", "rows*40"),
                           arr("x", "rows"), arr("y", "rows", "out")], ["ceil_div(rows,256)", 1, 1], [256, 1, 1])
    found = outcome("sector-per-row", CSR_ROWS, spec)
    assert found.applicable, found.why
    rewrite = found.rewrites[0]
    assert rewrite.grid_scale == (8, 1, 1) and "j += 8" in rewrite.source
    # A row of known length is still judged by its length: 4096 floats is a warp's work.
    spec_long = spec_of("rowsum", [scalar("n", 1 << 20), scalar("m", 4096), arr("a", "n*m"), arr("y", "n", "out")],
                        ["ceil_div(n,256)", 1, 1], [256, 1, 1])
    assert not outcome("sector-per-row", ROWSUM, spec_long).applicable
    if shutil.which("nvcc"):
        from kernel_lsp.services.harness.compile import compile_cubin
        from kernel_lsp.services.toolchain import BuildFlags

        assert compile_cubin(rewrite.source, str(tmp_path), "cand", BuildFlags().for_arch("sm_90")).ok


PIVOT = """
__global__ void scale_rows(float* a, int n) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < n) {
    for (int j = r + 1; j < n; j++) a[r * n + j] = a[r * n + j] / a[r * n + r];
  }
}
"""
PIVOT_MAIN = r"""
int main() {
  const int n = 45;
  std::vector<float> a(n * n);
  for (int i = 0; i < n * n; i++) a[i] = (float)((i * 7) % 19) + 1.0f;
  kl_launch({GRID, 1, 1}, {64, 1, 1}, [&] { scale_rows(a.data(), n); });
  for (float v : a) printf("%a\n", v);
}
"""


def test_a_pivot_the_loop_never_stores_is_read_by_every_lane(tmp_path):
    """An under-filled launch whose threads each scale a row by its diagonal: the diagonal is read at another
    index than the row is written, but one the store never reaches (it starts one past it)."""
    spec = spec_of("scale_rows", [arr("a", "n*n", "inout"), scalar("n", 1024)], ["ceil_div(n,64)", 1, 1], [64, 1, 1],
                   [{"n": 45}])
    found = outcome("split-loop", PIVOT, spec)
    assert found.applicable, found.why
    if shutil.which("g++"):
        from cpu_cuda import run_on_cpu

        before = run_on_cpu(PIVOT, PIVOT_MAIN.replace("GRID", "1"), tmp_path, "pivot")
        for n, rw in enumerate(found.rewrites):
            lanes = rw.grid_scale[0]
            assert run_on_cpu(rw.source, PIVOT_MAIN.replace("GRID", str(lanes)), tmp_path, f"pivot{n}") == before
        if shutil.which("nvcc"):
            compiles(found.rewrites[0].source, tmp_path)
    # The diagonal stored by the loop itself (j from r): a real dependence between iterations.
    found = outcome("split-loop", PIVOT.replace("j = r + 1", "j = r"), spec)
    assert not found.applicable and "may be an element" in found.why, found.why


BLEND = """
__global__ void blend_rows(const float* a, const float* b, const float* x, float* s, float* out, int n, int m) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float p = 0.0f, q = -1.0f;
  for (int j = 0; j < m; j++) {
    p += a[i * m + j] * x[j];
    q = fmaxf(q, b[i * m + j]);
  }
  s[i] = p;
  out[i] = out[i] * 0.5f + s[i] * q;
}
"""
BLEND_MAIN = r"""
int main() {
  const int n = 45, m = 77;
  std::vector<float> a(n * m), b(n * m), x(m), s(n, 3.0f), out(n);
  for (int i = 0; i < n * m; i++) { a[i] = (float)((i * 7) % 19) / 8.0f; b[i] = (float)((i * 5) % 23) / 4.0f; }
  for (int j = 0; j < m; j++) x[j] = (float)(j % 5) - 2.0f;
  for (int i = 0; i < n; i++) out[i] = (float)(i % 9);
  kl_launch({GRID, 1, 1}, {64, 1, 1}, [&] { blend_rows(a.data(), b.data(), x.data(), s.data(), out.data(), n, m); });
  for (int i = 0; i < n; i++) printf("%a %a\n", s[i], out[i]);
}
"""


def _blend_spec() -> dict:
    data = spec_of("blend_rows", [arr("a", "n*m"), arr("b", "n*m"), arr("x", "m"), arr("s", "n", "out"),
                                  arr("out", "n", "inout"), scalar("n", 4096), scalar("m", 4096)],
                   ["ceil_div(n,64)", 1, 1], [64, 1, 1], [{"n": 45, "m": 77}])
    # A row's 4096 products summed by 32 lanes, then a butterfly: another order of terms of both signs, whose
    # sum may cancel to near 0. On the H100 the rows differed by up to 1.5e-4 in absolute terms (4 of 4096
    # outside atol 1e-5), where a race in the tail would be off by the output's own size.
    data["tolerance"] = {"rtol": 1e-4, "atol": 1e-3}
    return data


def test_the_code_after_the_last_split_loop_that_reads_back_its_stores_runs_on_one_lane(tmp_path):
    """Two reductions of a row, the first stored and read back by the statement after it with the output's
    old value: every lane running that tail would race (a slower lane reads ``out[i]`` after a faster one
    stored the blend), so the group's first lane runs it alone, after the last shuffle."""
    found = outcome("warp-per-row", BLEND, _blend_spec())
    assert found.applicable, found.why
    assert "one lane runs it" in found.why
    source = found.rewrites[0].source
    assert "if (kl_lane == 0u) { s[i] = p;" in source
    if shutil.which("g++"):
        from cpu_cuda import run_on_cpu

        before = [float.fromhex(v) for v in run_on_cpu(BLEND, BLEND_MAIN.replace("GRID", "1"), tmp_path, "blend").split()]
        for n, rw in enumerate(found.rewrites):
            after = [float.fromhex(v) for v in
                     run_on_cpu(rw.source, BLEND_MAIN.replace("GRID", "32"), tmp_path, f"blend{n}").split()]
            assert len(after) == len(before) and all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(after, before))
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


def test_code_beside_the_loop_is_not_taken_for_its_tail():
    """An ``else`` after the loop's branch runs on every lane though it comes later in the text: its update in
    place still races and is refused, while the statement after the loop in its own branch runs on one lane."""
    source = BLEND.replace("  for (int j = 0; j < m; j++) {", "  if (m > 0) {\n  for (int j = 0; j < m; j++) {").replace(
        "  out[i] = out[i] * 0.5f + s[i] * q;\n}", "  out[i] = out[i] * 0.5f + s[i] * q;\n  } else {\n  out[i] += 1.0f;\n  }\n}")
    assert "} else {" in source
    found = outcome("warp-per-row", source, _blend_spec())
    assert not found.applicable and "`out[i]`" in found.why, found.why
    found = outcome("warp-per-row", source.replace("  out[i] += 1.0f;\n", "  s[i] = 0.0f;\n"), _blend_spec())
    assert found.applicable, found.why


@pytest.mark.parametrize("change,why", [
    # Round an outer loop the tail runs again, beside the next split: one lane cannot take it alone.
    (("  for (int j = 0; j < m; j++) {", "  for (int t = 0; t < 2; t++) {\n  for (int j = 0; j < m; j++) {"),
     "lies in another loop"),
    # The tail's own read of what the lanes store must stay behind the last shuffle: a loop without an
    # accumulator has none.
    (("    p += a[i * m + j] * x[j];\n    q = fmaxf(q, b[i * m + j]);\n", "    out[n + i * m + j] = a[i * m + j] * x[j];\n"),
     "combines no accumulator"),
])
def test_a_tail_that_cannot_run_on_one_lane_keeps_the_race_refusal(change, why):
    source = BLEND.replace(*change)
    if "for (int t" in source:
        source = source.replace("  out[i] = out[i] * 0.5f + s[i] * q;\n}", "  out[i] = out[i] * 0.5f + s[i] * q;\n  }\n}")
    found = outcome("warp-per-row", source, _blend_spec())
    assert not found.applicable
    assert why in found.why, found.why


FORCES = """
struct vec3 { float x, y, z; };
__global__ void forces(const float* pos, const int* neighbours, vec3* out, int n, int count) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  vec3 f = {0.0f, 0.0f, 0.0f};
  int j = 0;
  while (j < count) {
    int k = neighbours[j * n + i];
    float d = pos[k] - pos[i];
    if (d * d < 4.0f) {
      f.x += d;
      f.y += d * d;
      f.z += 1.0f;
    }
    j++;
  }
  out[i] = f;
}
"""
FORCES_MAIN = r"""
int main() {
  const int n = 45, count = 37;
  std::vector<float> pos(n);
  std::vector<int> nb(n * count);
  std::vector<vec3> out(n);
  for (int i = 0; i < n; i++) pos[i] = (float)((i * 17) % 23) / 5.0f;
  for (int i = 0; i < n * count; i++) nb[i] = (i * 31 + 7) % n;
  kl_launch({GX, 1, 1}, {BX, 1, 1}, [&] { forces(pos.data(), nb.data(), out.data(), n, count); });
  for (const vec3& v : out) printf("%a %a %a\n", v.x, v.y, v.z);
}
"""


def _forces_spec(n: int) -> dict:
    return spec_of("forces", [arr("pos", "n"), {"name": "neighbours", "array": "int32", "size": "n*count", "init": "zeros",
                                                "role": "in"},
                              {"name": "out", "array": "float32", "size": "3*n", "init": "zeros", "role": "out"},
                              scalar("n", n), scalar("count", 128)], ["ceil_div(n,64)", 1, 1], [64, 1, 1],
                   [{"n": 45, "count": 37}])


@pytest.mark.parametrize("rule,n", [("split-loop", 512), ("split-reduction", 8192)])
def test_a_structs_members_accumulated_by_a_while_loop_are_combined_across_the_split(rule, n, tmp_path):
    """Forces summed into a local struct's members over a neighbour list walked by a ``while`` loop: each
    member is an accumulator of the loop, combined across the lanes or threads that share the row."""
    # A brace-initialised struct cannot be split from its initialiser by split-reduction's predicates.
    source = FORCES.replace("vec3 f = {0.0f, 0.0f, 0.0f};", "vec3 f; f.x = 0.0f; f.y = 0.0f; f.z = 0.0f;")
    found = outcome(rule, source, _forces_spec(n))
    assert found.applicable, found.why
    assert "f.x" in found.rewrites[0].source and "f.z" in found.rewrites[0].source
    if shutil.which("g++"):
        from cpu_cuda import run_on_cpu

        spec = parse_spec(_forces_spec(n))
        original = spec.resolve(0).original
        main = FORCES_MAIN.replace("GX", str(original.grid[0])).replace("BX", str(original.block[0]))
        before = [float.fromhex(v) for v in run_on_cpu(source, main, tmp_path, "forces").split()]
        for k, rw in enumerate(found.rewrites):
            launch = with_candidate_launch(spec, rw.launch_override).resolve(0).candidate
            main = FORCES_MAIN.replace("GX", str(launch.grid[0])).replace("BX", str(launch.block[0]))
            if launch.block[1] != 1:
                main = main.replace("{BY}", "").replace(f"{{{launch.block[0]}, 1, 1}}",
                                                         f"{{{launch.block[0]}, {launch.block[1]}, 1}}")
            after = [float.fromhex(v) for v in run_on_cpu(rw.source, main, tmp_path, f"forces{k}").split()]
            assert len(after) == len(before) and all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(after, before))


@pytest.mark.parametrize("change,why", [
    (("out[i] = f;", "out[i] = f;"), None),
    (("f.z += 1.0f;", "f.z += 1.0f; f = f;"), "otherwise than through the members it accumulates"),
    (("f.z += 1.0f;", "f.z += f.x;"), "reads the accumulator `f.x` for something else than updating it"),
])
def test_a_struct_used_whole_in_the_loop_is_not_split(change, why):
    found = outcome("split-loop", FORCES.replace(*change), _forces_spec(512))
    assert found.applicable if why is None else (not found.applicable and why in found.why), found.why
