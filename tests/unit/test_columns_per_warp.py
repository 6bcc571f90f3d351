"""Columns per warp: a block-per-output reduction of a column regrouped so the lanes of a warp take
neighbouring outputs; where it applies, each refusal's missing fact, the candidates compiled by nvcc
and checked by the harness's static check, the host launch divided."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp.core.candidates import Candidate, OptimizeRequest
from kernel_lsp.core.index import build_index
from kernel_lsp.core.rules import RULES, RuleGenerator, evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec, with_candidate_launch
from kernel_lsp.core.static_check import check
from kernel_lsp.core.transforms.launch_edit import applied_source, divided_grid, scale_launches
from nvcc_check import compiles

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "benchmarks" / "corpus"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

COLSUM = """
__global__ void colsum(const float* x, float* out, int rows, int cols) {
    __shared__ float s[256];
    int c = blockIdx.x;
    float sum = 0.0f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        sum += x[r * cols + c];
    }
    s[threadIdx.x] = sum;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st) s[threadIdx.x] += s[threadIdx.x + st];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[c] = s[0];
}
"""


def spec_of(block=(256, 1, 1), grid="cols", variants=({"rows": 77, "cols": 100},), out_role="out") -> dict:
    return {"kernel": "colsum", "params": [
        {"name": "x", "array": "float32", "size": "rows*cols", "init": "uniform(-1,1)", "role": "in"},
        {"name": "out", "array": "float32", "size": "cols", "init": "uniform(-1,1)", "role": out_role},
        {"name": "rows", "scalar": "int32", "value": 4096}, {"name": "cols", "scalar": "int32", "value": 2048}],
        "grid": [grid, 1, 1], "block": list(block), "tolerance": {"rtol": 1e-4, "atol": 1e-4}, "variants": list(variants)}


def outcome(source: str, spec: dict, preprocessed=None):
    return evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name("columns-per-warp")], preprocessed=preprocessed)[0]


def test_a_column_sum_is_regrouped_with_its_tail_guarded():
    spec = spec_of()
    found = outcome(COLSUM, spec)
    assert found.applicable, found.why
    assert [rw.variant for rw in found.rewrites] == ["16x64", "32x32"]
    for rw in found.rewrites:
        columns, rows = map(int, rw.variant.split("x"))
        assert rw.block == (columns, rows, 1) and rw.grid_divide == (columns, 1, 1) and rw.grid_scale is None
        assert rw.launch_override["grid"] == [f"((cols) + {columns - 1}) / {columns}", 1, 1]
        # The launch evaluates at every size, the ragged variant (100 columns) included.
        resolved = with_candidate_launch(parse_spec(spec), rw.launch_override).resolve(0)
        assert resolved.candidate.grid[0] == -(-100 // columns) and resolved.candidate.block == (columns, rows, 1)
        src = rw.source
        assert f"const unsigned kl_vbid = blockIdx.x * {columns}u + threadIdx.x;" in src
        assert "const bool kl_live = kl_vbid < (unsigned)(cols);" in src
        # The virtual thread and width: the rows loop as written, on threadIdx.y and blockDim.y.
        assert "for (int r = threadIdx.y; kl_live && (r < rows); r += blockDim.y)" in src
        assert "int c = kl_vbid;" in src
        assert "kl_cols[threadIdx.y][threadIdx.x] = sum;" in src
        assert f"for (int kl_r = 1; kl_r < {rows}; ++kl_r) kl_total = kl_total + kl_cols[kl_r][threadIdx.x];" in src
        assert "if (kl_live && (threadIdx.y == 0)) out[c] = kl_total;" in src
        assert "st >>= 1" not in src and " s[0]" not in src


def test_a_read_modify_write_output_is_kept_once_per_column():
    source = COLSUM.replace("if (threadIdx.x == 0) out[c] = s[0];", "if (threadIdx.x == 0) { out[c] = out[c] * 0.5f + s[0]; }")
    found = outcome(source, spec_of(out_role="inout"))
    assert found.applicable, found.why
    assert "if (kl_live && (threadIdx.y == 0)) { out[c] = out[c] * 0.5f + kl_total; }" in found.rewrites[0].source


def test_a_pragma_of_the_users_on_the_rows_loop_is_kept_alone():
    source = COLSUM.replace("    for (int r = threadIdx.x;", "    #pragma unroll 4\n    // rows\n    for (int r = threadIdx.x;")
    found = outcome(source, spec_of())
    assert found.applicable, found.why
    src = found.rewrites[0].source
    assert "#pragma unroll 4\n    // rows\n    for (int r = threadIdx.y; kl_live && (r < rows); r += blockDim.y)" in src
    assert "_Pragma" not in src


def test_a_max_reduction_combines_with_max():
    source = COLSUM.replace("float sum = 0.0f;", "float sum = -1e30f;").replace(
        "sum += x[r * cols + c];", "sum = fmaxf(sum, x[r * cols + c]);").replace(
        "s[threadIdx.x] += s[threadIdx.x + st];", "s[threadIdx.x] = fmaxf(s[threadIdx.x], s[threadIdx.x + st]);")
    found = outcome(source, spec_of())
    assert found.applicable, found.why
    assert "kl_total = max(kl_total, kl_cols[kl_r][threadIdx.x]);" in found.rewrites[0].source


@needs_nvcc
def test_snippet_candidates_compile(tmp_path):
    found = outcome(COLSUM, spec_of())
    for n, rw in enumerate(found.rewrites):
        (tmp_path / str(n)).mkdir()
        compiles(rw.source, tmp_path / str(n))


@pytest.mark.parametrize("source,spec,why", [
    # The block reduces along a row: its loads are coalesced already.
    (COLSUM.replace("x[r * cols + c]", "x[c * rows + r]"), spec_of(), "already coalesced across the warp"),
    # Neighbouring blocks do not read neighbouring elements: the new lanes would be 2 apart.
    (COLSUM.replace("x[r * cols + c]", "x[r * cols + 2 * c]"), spec_of(), "2 elements apart across the lanes"),
    # A 2-D block.
    (COLSUM, spec_of(block=(32, 8, 1)), "not one-dimensional"),
    # Every thread stores the block's output: no one thread per output.
    (COLSUM.replace("if (threadIdx.x == 0) out[c] = s[0];", "out[c] = s[0];"), spec_of(), "from thread 0"),
    # The block has one output per thread, not one per block.
    (COLSUM.replace("if (threadIdx.x == 0) out[c] = s[0];", "out[c * 256 + threadIdx.x] = s[0];"), spec_of(),
     "no per-block output"),
    (COLSUM.replace("if (threadIdx.x == 0) out[c] = s[0];", "if (threadIdx.x == 0) out[c] = s[0]; x2[threadIdx.x] = 0.0f;")
     .replace("float* out,", "float* out, float* x2,"), spec_of(), "depends on the thread"),
    # A sum that starts elsewhere than 0: each of the block's threads adds its start.
    (COLSUM.replace("float sum = 0.0f;", "float sum = 1.0f;"), spec_of(), "does not start at 0"),
    # The value depends on the thread otherwise than through the row.
    (COLSUM.replace("sum += x[r * cols + c];", "sum += x[r * cols + c] * threadIdx.x;"), spec_of(), "uses the thread"),
    (COLSUM.replace("sum += x[r * cols + c];", "sum += x[r * cols + c + threadIdx.x];"), spec_of(),
     "depends on the thread otherwise than through the loop's `r`"),
    # The block's offset moves with its width (the rewrite changes the width).
    (COLSUM.replace("int c = blockIdx.x;", "int c = blockIdx.x * blockDim.x;"), spec_of(), "moves with the block's width"),
    # The sum and the tree disagree on the operator.
    (COLSUM.replace("s[threadIdx.x] += s[threadIdx.x + st];", "s[threadIdx.x] = fmaxf(s[threadIdx.x], s[threadIdx.x + st]);"),
     spec_of(), "accumulates with `+` but the tree combines with `max`"),
    # A data-dependent break: which rows a thread takes depends on how the block splits them.
    (COLSUM.replace("sum += x[r * cols + c];", "sum += x[r * cols + c]; if (sum > 4.0f) break;"), spec_of(), "a break"),
    # The kernel reads the grid's size (the new grid is smaller).
    (COLSUM.replace("int c = blockIdx.x;", "int c = blockIdx.x % gridDim.x;"), spec_of(), "gdim.x"),
    # No tree: the block's threads each store a partial result.
    (COLSUM.split("    s[threadIdx.x] = sum;")[0] + "    out[c] = sum;\n}\n", spec_of(), "not combined by exactly one looped"),
    # A load before the rows loop.
    (COLSUM.replace("float sum = 0.0f;", "float sum = 0.0f; float first = x[c];"), spec_of(), "before the rows loop"),
    # A statement after the final store.
    (COLSUM.replace("if (threadIdx.x == 0) out[c] = s[0];", "if (threadIdx.x == 0) out[c] = s[0];\n    __syncthreads();\n"
                    "    if (threadIdx.x == 1) out[c] = 2.0f;"), spec_of(), "more than store the result from thread 0"),
    # The sum's start is assigned again before the loop.
    (COLSUM.replace("float sum = 0.0f;", "float sum = 0.0f; sum = 1.0f;"), spec_of(), "assigned again"),
    # A parameter that changes in the kernel (here by the thread).
    (COLSUM.replace("int c = blockIdx.x;", "int c = blockIdx.x; rows -= 1;"), spec_of(), "assigns its parameter `rows`"),
    # A helper reading the block's width, which the rewrite does not rename.
    ("__device__ float scale() { return 1.0f / blockDim.x; }\n"
     + COLSUM.replace("sum += x[r * cols + c];", "sum += x[r * cols + c] * scale();"), spec_of(), "the function `scale`"),
    # The tree's partial sums read elsewhere than at its root.
    (COLSUM.replace("out[c] = s[0];", "out[c] = s[1];"), spec_of(), "reads a slot other than the root"),
])
def test_refusals_name_the_missing_fact(source, spec, why):
    found = outcome(source, spec)
    assert not found.applicable and why in found.why, found.why


def test_the_grid_must_be_written_in_the_kernels_parameters():
    # The grid is the spec's `cols`, but the kernel assigns that parameter: its value is no longer the grid's.
    source = COLSUM.replace("int c = blockIdx.x;", "int c = blockIdx.x; cols = cols + 0;")
    found = outcome(source, spec_of())
    assert not found.applicable and "assigns its parameter `cols`" in found.why, found.why
    # A grid written as a literal that is also a problem size: the harness's static check would reject it.
    found = outcome(COLSUM, spec_of(grid="2048", variants=({"rows": 77},)))
    assert not found.applicable and "literal 2048" in found.why, found.why
    found = outcome(COLSUM, spec_of(grid="1024", variants=({"rows": 77},)))
    assert found.applicable and "kl_vbid < (unsigned)(1024);" in found.rewrites[0].source, found.why
    found = outcome(COLSUM, spec_of(grid="ceil_div(cols*4,4)"))
    assert found.applicable, found.why
    assert "kl_vbid < (unsigned)((((cols * 4) + 4 - 1) / 4));" in found.rewrites[0].source


def corpus(name: str):
    from kernel_lsp.core.source import preprocess

    folder = CORPUS / name
    path = folder / "kernel.cu"
    source = path.read_text()

    def read(p):
        try:
            return open(p).read()
        except OSError:
            return None
    return source, json.loads((folder / "spec.json").read_text()), folder, preprocess(source, str(path.resolve()), read)


def test_corpus_matmul_backward_bias_is_regrouped():
    source, spec, _, pre = corpus("llmc_matmul_backward_bias_kernel1")
    found = outcome(source, spec, pre)
    assert found.applicable, found.why
    assert len(found.rewrites) == 2
    for rw in found.rewrites:
        assert "expanded" not in rw.description  # the user's own text, the header's macros kept
        # The original's read-modify-write of the output, once per column, on the combined total.
        assert "dbias[o] = (floatX)((float)dbias[o] + kl_total);" in rw.source
        assert "if (kl_live && (tid == 0))" in rw.source and "int tid = threadIdx.y;" in rw.source
        assert "int block_size = blockDim.y;" in rw.source and "int o = kl_vbid;" in rw.source
        assert '_Pragma("unroll 8") for (int i = tid; kl_live && (i < B * T); i += block_size)' in rw.source
        report = check(source, rw.source, parse_spec(spec))
        assert report.ok, [f"line {e.line}: {e.rule}: {e.message}" for e in report.errors]


@needs_nvcc
def test_corpus_candidates_compile(tmp_path):
    source, spec, folder, pre = corpus("llmc_matmul_backward_bias_kernel1")
    for n, rw in enumerate(outcome(source, spec, pre).rewrites):
        (tmp_path / str(n)).mkdir()
        compiles(rw.source, tmp_path / str(n), folder)


@pytest.mark.parametrize("name,why", [
    # A block reduction of consecutive elements: no loop shares out rows.
    ("howto_reduce_v0", "no top-level loop whose block's threads share out a range"),
    # A grid-stride loop with an unrolled tree.
    ("shoc_reduction", "gdim.x"),
    # A thread per column: no per-block output.
    ("polybench_correlation_std", "no per-block output"),
    # A scan: an output per thread.
    ("parboil_scan_l1", "depends on the thread"),
])
def test_corpus_refusals(name, why):
    source, spec, _, pre = corpus(name)
    found = outcome(source, spec, pre)
    assert not found.applicable and why in found.why, found.why


def test_the_search_tries_it_before_the_tree_rewrite():
    names = [r.name for r in RULES]
    assert names.index("columns-per-warp") < names.index("tree-to-shuffle")
    source, spec, _, _ = corpus("llmc_matmul_backward_bias_kernel1")
    path = str(CORPUS / "llmc_matmul_backward_bias_kernel1" / "kernel.cu")
    candidates = list(RuleGenerator().generate(OptimizeRequest(source=source, path=path, kernel=spec["kernel"], spec=spec)))
    assert [c.generator for c in candidates[:2]] == ["rule:columns-per-warp[16x64]", "rule:columns-per-warp[32x32]"]
    assert candidates[0].grid_divide == (16, 1, 1) and candidates[0].block == (16, 64, 1)


HOST = COLSUM + """
void run(const float* x, float* out, int rows, int cols) {
    colsum<<<cols, 256>>>(x, out, rows, cols);
}
"""


def test_the_host_launch_is_divided_and_reshaped():
    assert divided_grid("OC", (32, 1, 1)) == "dim3((dim3(OC).x + 31) / 32, dim3(OC).y, dim3(OC).z)"
    edit = scale_launches(HOST, "colsum", (1, 1, 1), (32, 32, 1), (32, 1, 1))
    assert edit.instruction is None and len(edit.lines) == 1
    assert "colsum<<<dim3((dim3(cols).x + 31) / 32, dim3(cols).y, dim3(cols).z), dim3(32, 32, 1)>>>(x, out, rows, cols);" \
        in edit.source
    assert len(build_index(edit.source).launches_of("colsum")) == 1


def test_a_verified_candidate_applies_with_its_launch():
    found = outcome(HOST, spec_of())
    assert found.applicable, found.why
    rw = found.rewrites[0]
    candidate = Candidate("colsum", rw.source, "columns-per-warp", "rule:columns-per-warp[16x64]", rw.description,
                          rw.launch_override, block=rw.block, grid_divide=rw.grid_divide)
    host = applied_source(candidate, HOST)
    assert "colsum<<<dim3((dim3(cols).x + 15) / 16, dim3(cols).y, dim3(cols).z), dim3(16, 64, 1)>>>" in host.source
    assert "kl_vbid" in host.source
    unlaunched = applied_source(Candidate("colsum", COLSUM, "columns-per-warp", "rule:columns-per-warp[16x64]", "",
                                          rw.launch_override, block=rw.block, grid_divide=rw.grid_divide))
    assert unlaunched.lines == () and "one block for every 16 x 1 x 1 blocks" in unlaunched.instruction


@pytest.mark.parametrize("header,strided", [
    ("for (int r = threadIdx.x; r < rows; r += blockDim.x)", True),
    ("for (int r = threadIdx.x + 2 * cols; r < rows; r += blockDim.x)", True),
    # The range moves with the block's width: a narrower block would take other rows.
    ("for (int r = threadIdx.x + blockDim.x; r < rows; r += blockDim.x)", False),
    ("for (int r = threadIdx.x; r < rows; r += 32)", False),
    ("for (int r = 0; r < rows; r += blockDim.x)", False),
    ("for (int r = threadIdx.x; r < rows + threadIdx.x; r += blockDim.x)", False),
])
def test_block_strided_loops_are_the_ranges_a_block_shares_out(header, strided):
    from kernel_lsp.core.analysis import analyze, block_strided_loops

    source = COLSUM.replace("for (int r = threadIdx.x; r < rows; r += blockDim.x)", header)
    facts = analyze(source)["colsum"]
    found = block_strided_loops(facts)
    assert (len(found) == 1 and found[0].var == "r") == strided
