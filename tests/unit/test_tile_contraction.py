"""tile-contraction: dot-product loops staged through shared-memory tiles. Where it applies, each
refusal with its missing fact, the guard split around the barriers, and every candidate for the
corpus's contraction kernels compiled by nvcc."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from kernel_lsp.core.rules import COMPOSABLE, RULES, evaluate, rule_by_name
from kernel_lsp.core.source import preprocess
from kernel_lsp.core.spec import parse_spec
from cpu_cuda import run_on_cpu
from nvcc_check import compiles

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "corpus")


def arr(name, size, role="in"):
    return {"name": name, "array": "float32", "size": size, "init": "uniform(-1,1)" if role != "out" else "zeros", "role": role}


def scalar(name, value, kind="int32"):
    return {"name": name, "scalar": kind, "value": value}


GEMM = """
__global__ void gemm(int M, int N, int K, float alpha, float beta, const float* A, const float* B, float* C) {
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row < M && col < N) {
    float acc = 0.0f;
    for (int k = 0; k < K; k++) {
      acc += A[row * K + k] * B[k * N + col];
    }
    C[row * N + col] = alpha * acc + beta * C[row * N + col];
  }
}
"""
GEMM_SPEC = {"kernel": "gemm", "params": [scalar("M", 512), scalar("N", 512), scalar("K", 512), scalar("alpha", 1.5, "float32"),
                                          scalar("beta", 0.5, "float32"), arr("A", "M*K"), arr("B", "K*N"), arr("C", "M*N", "inout")],
             "grid": ["ceil_div(N,32)", "ceil_div(M,8)", 1], "block": [32, 8, 1],
             "tolerance": {"rtol": 1e-4, "atol": 1e-4}, "variants": [{"M": 100, "N": 77, "K": 33}]}

NBODY = """
struct P { float x, y, vx; };
__global__ void pairs(P* p, float dt, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float f = 0.0f;
  for (int j = 0; j < n; j++) {
    float dx = p[j].x - p[i].x;
    f += dx * rsqrtf(dx * dx + p[j].y * p[j].y + 1e-9f);
  }
  p[i].vx += dt * f;
}
"""
NBODY_SPEC = {"kernel": "pairs", "params": [{"name": "p", "array": "float32", "size": "n*3", "init": "uniform(-1,1)", "role": "inout"},
                                           scalar("dt", 0.01, "float32"), scalar("n", 4096)],
              "grid": ["ceil_div(n,128)", 1, 1], "block": [128, 1, 1], "tolerance": {"rtol": 1e-4, "atol": 1e-4},
              "variants": [{"n": 1000}]}


def outcome(source: str, spec: dict, rule: str = "tile-contraction"):
    return evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name(rule)])[0]


def test_registered_and_composable():
    assert rule_by_name("tile-contraction") in RULES
    assert "tile-contraction" in COMPOSABLE


def test_gemm_tiles_both_operands_and_splits_the_guard(tmp_path):
    found = outcome(GEMM, GEMM_SPEC)
    assert found.applicable, found.why
    assert [rw.variant for rw in found.rewrites] == ["", "4x4", "4x1", "1x4"]
    source = found.rewrites[0].source
    # A moves with threadIdx.y only, B with threadIdx.x only: a tile of each, padded.
    assert "__shared__ float kl_s0[8][33];" in source and "__shared__ float kl_s1[32][33];" in source
    assert "acc += kl_s0[threadIdx.y][(int)(k - kl_kb)] * kl_s1[(int)(k - kl_kb)][threadIdx.x];" in source
    # The guard became a predicate: the barriers are outside every condition, the computation under it.
    assert "const bool kl_on1 = (row < M && col < N);" in source
    assert "float acc; if (kl_on1) { acc = 0.0f; }" in source
    body = source[source.index("{ const bool kl_on1"):]
    first_barrier = body.index("__syncthreads()")
    assert "if (kl_on1) {" not in body[:first_barrier].replace("if (kl_on1) { acc = 0.0f; }", "").replace(
        "if (kl_on1) { kl_rows[threadIdx.y] = 1; kl_cols[threadIdx.x] = 1; }", "")
    # The epilogue is kept as written, under the predicate.
    assert "if (kl_on1) { C[row * N + col] = alpha * acc + beta * C[row * N + col]; }" in source
    # Ragged edges: loads guarded by the iteration range and by a row/column that has an active thread.
    assert "kl_t0 + kl_k < kl_trips && kl_rows[kl_r]" in source and "kl_t0 + kl_k < kl_trips && kl_cols[kl_r]" in source
    # Coalesced loads: A's unit stride is along k (k fastest), B's along its column (column fastest).
    assert re.search(r"kl_r = kl_e / 32; const int kl_k = kl_e % 32; kl_s0", source)
    assert re.search(r"kl_r = kl_e % 32; const int kl_k = kl_e / 32; kl_s1", source)
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


def test_all_pairs_uniform_operand_with_a_leading_exit(tmp_path):
    found = outcome(NBODY, NBODY_SPEC)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "const bool kl_on1 = !(i >= n);" in source
    assert "return" not in source[source.index("kl_on1"):]
    # p[j].x and p[j].y are the same for the whole block: one tile each, 128 iterations (one per thread);
    # p[i].x moves with the thread and stays a global read.
    assert "__shared__ decltype(p->x) kl_s0[128];" in source and "__shared__ decltype(p->y) kl_s1[128];" in source
    assert "float dx = kl_s0[(int)(j - kl_kb)] - p[i].x;" in source
    assert "kl_any = __syncthreads_or(kl_on1)" in source
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


def test_tile_length_follows_the_trip_count():
    short = GEMM.replace("k < K", "k < 16")
    found = outcome(short, GEMM_SPEC)
    assert found.applicable and "tiles of 16 iterations" in found.why


@pytest.mark.parametrize(("change", "why"), [
    (lambda s: s.replace("const float* A, const float* B", "float* A, float* B").replace(
        "C[row * N + col] = alpha", "A[row] = 0; B[col] = 0; C[row * N + col] = alpha"),
     "the kernel writes it"),
    (lambda s: s.replace("k < K", "k < row"), "differ between the threads"),
    (lambda s: s.replace("      acc += A", "      if (k > 3) acc += A"), "under a condition"),
    (lambda s: s.replace("acc += A[row * K + k] * B[k * N + col];", "acc += A[row * K + k] * B[k * N + col]; if (acc > 9) break;"),
     "early exit"),
    (lambda s: s.replace("    C[row * N + col] = alpha * acc + beta * C[row * N + col];\n  }",
                         "    C[row * N + col] = alpha * acc + beta * C[row * N + col];\n  } else { C[0] = 1; }"), "with an `else`"),
    (lambda s: s.replace("float acc = 0.0f;", "float acc = 0.0f; if (acc > 1) { C[0] = 0; return; }"), "`return` before it"),
    (lambda s: s.replace("float acc = 0.0f;", "float acc = 0.0f; __syncthreads();"), "is in the statement that holds the loop"),
    (lambda s: s.replace("for (int k = 0; k < K; k++)", "for (int k = 0; k < K; k += 2)"), "step is not 1"),
    (lambda s: s.replace("if (row < M && col < N) {", "if (bool ok = row < M && col < N) {"), "declares a variable"),
    (lambda s: s.replace("A[row * K + k]", "A[row * col + k]").replace("B[k * N + col]", "B[k * N + col * row]"),
     "no operand it reads is shared"),
])
def test_refusals(change, why):
    found = outcome(change(GEMM), GEMM_SPEC)
    assert not found.applicable and why in found.why, found.why


def test_aliasing_arrays_refused():
    spec = dict(GEMM_SPEC, params=[p for p in GEMM_SPEC["params"]])
    spec["params"] = [*spec["params"][:-1], scalar("C", 0)]
    assert not outcome(GEMM, spec).applicable


def _corpus(name):
    folder = os.path.join(CORPUS, name)
    path = os.path.abspath(os.path.join(folder, "kernel.cu"))
    source = open(path).read()
    spec = json.load(open(os.path.join(folder, "spec.json")))

    def read(p):
        try:
            return open(p).read()
        except OSError:
            return None
    return folder, source, spec, preprocess(source, path, read)


APPLIES = ["llmc_matmul_forward_kernel1", "polybench_gemm", "polybench_syrk", "sgemmcuda_naive", "polybench_doitgen_kernel1",
           "mininbody_bodyforce", "polybench_gramschmidt_kernel1"]
REFUSED = {"llmc_attention_query_key_kernel1": "`return` before it", "llmc_attention_value_kernel1": "nested in or contains",
           "rodinia_lud_internal": "no operand it reads is shared"}


BLOCKED = {"llmc_matmul_forward_kernel1", "polybench_gemm", "polybench_syrk", "polybench_doitgen_kernel1"}
#: Kernels with 1024-thread blocks: their own threads coarsened instead.
COARSENED = {"sgemmcuda_naive"}


@pytest.mark.parametrize("name", APPLIES)
def test_corpus_contractions_apply_and_compile(name, tmp_path):
    folder, source, spec, pre = _corpus(name)
    found = evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name("tile-contraction")], preprocessed=pre)[0]
    assert found.applicable, found.why
    expected = ["", "4x4", "4x1", "1x4"] if name in BLOCKED else ["", "4x4-in-block", "2x2-in-block"] if name in COARSENED else [""]
    assert [rw.variant for rw in found.rewrites] == expected
    for n, rewrite in enumerate(found.rewrites):
        assert "__syncthreads();" in rewrite.source
        if shutil.which("nvcc"):
            (tmp_path / str(n)).mkdir()
            compiles(rewrite.source, tmp_path / str(n), folder)


@pytest.mark.parametrize(("name", "why"), sorted(REFUSED.items()))
def test_corpus_refusals(name, why):
    _, source, spec, pre = _corpus(name)
    found = evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name("tile-contraction")], preprocessed=pre)[0]
    assert not found.applicable and why in found.why, found.why


@needs_nvcc
def test_after_register_accumulate(tmp_path):
    folder, source, spec, pre = _corpus("polybench_gemm")
    first = evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name("register-accumulate")], preprocessed=pre)[0]
    assert first.applicable
    path = os.path.abspath(os.path.join(folder, "kernel.cu"))
    view = preprocess(first.rewrites[0].source, path, lambda p: open(p).read() if os.path.exists(p) else None)
    second = evaluate(first.rewrites[0].source, spec["kernel"], parse_spec(spec), [rule_by_name("tile-contraction")],
                      preprocessed=view)[0]
    assert second.applicable, second.why
    assert "kl_acc0 += alpha * kl_s0[threadIdx.y][(int)(k - kl_kb)] * kl_s1[(int)(k - kl_kb)][threadIdx.x];" in second.rewrites[0].source
    # 4x4: copy 15 is (qy, qx) = (3, 3), reading the A tile of blocks 4y+3 and the B tile of blocks 4x+3.
    assert "kl_acc0_kl15 += alpha * kl_s0_y3[threadIdx.y][kl_kk] * kl_s1_x3[kl_kk][threadIdx.x];" in second.rewrites[1].source
    assert "kl_acc0_kl3 += alpha * kl_s0_y3[threadIdx.y][kl_kk] * kl_s1[kl_kk][threadIdx.x];" in second.rewrites[2].source
    for n, rewrite in enumerate(second.rewrites):
        (tmp_path / str(n)).mkdir()
        compiles(rewrite.source, tmp_path / str(n), folder)


def test_pragma_before_the_loop_stays_with_the_loop(tmp_path):
    source = GEMM.replace("    for (int k = 0; k < K; k++) {", "    #pragma unroll 4\n    for (int k = 0; k < K; k++) {")
    found = outcome(source, GEMM_SPEC)
    assert found.applicable, found.why
    out = found.rewrites[0].source
    assert re.search(r"\n#pragma unroll 4\n for \(int k = [^;]*; k < kl_kb \+ 32; ", out)
    if shutil.which("nvcc"):
        compiles(out, tmp_path)


def test_a_loop_variable_read_after_the_loop_is_refused():
    source = GEMM.replace("int k = 0; k < K", "k = 0; k < K").replace("float acc = 0.0f;", "float acc = 0.0f; int k;")
    assert outcome(source, GEMM_SPEC).applicable
    used = source.replace("C[row * N + col] = alpha", "C[row * N + col + k - K] = alpha")
    found = outcome(used, GEMM_SPEC)
    assert not found.applicable and "counter `k` is read after it" in found.why, found.why


def test_a_declaration_that_cannot_be_split_is_refused_before_rewriting():
    found = outcome(GEMM.replace("float acc = 0.0f;", "float acc = 0.0f; float v[2] = {1, 2};"), GEMM_SPEC)
    assert not found.applicable and "cannot be split from its initialiser" in found.why


def test_refused_when_the_loop_streams_a_per_thread_row_too():
    # A matrix-vector product: x is shared by the block, but A's rows are each thread's own and
    # carry the loop's traffic; a warp per row is the transformation for it.
    gemv = """
__global__ void gemv(int n, const float* A, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float acc = 0;
    for (int j = 0; j < n; j++) acc += A[i * n + j] * x[j];
    y[i] = acc;
  }
}
"""
    spec = {"kernel": "gemv", "params": [scalar("n", 1024), arr("A", "n*n"), arr("x", "n"), arr("y", "n", "out")],
            "grid": ["ceil_div(n,256)", 1, 1], "block": [256, 1, 1], "tolerance": {"rtol": 1e-4, "atol": 1e-5}}
    found = outcome(gemv, spec)
    assert not found.applicable and "`A[i * n + j]` moves with the loop and is not shared" in found.why


def test_a_goto_anywhere_is_refused():
    source = GEMM.replace("float acc = 0.0f;", "float acc = 0.0f; if (acc > 1) goto done;").replace(
        "    C[row * N + col] = alpha * acc + beta * C[row * N + col];", "    done: C[row * N + col] = alpha * acc + beta * C[row * N + col];")
    found = outcome(source, GEMM_SPEC)
    assert not found.applicable and "`goto`" in found.why


def test_without_a_guard_no_flags_are_needed(tmp_path):
    source = GEMM.replace("  if (row < M && col < N) {\n", "  {\n")
    found = outcome(source, GEMM_SPEC)
    assert found.applicable, found.why
    out = found.rewrites[0].source
    assert "kl_on" not in out and "kl_rows" not in out and "kl_t0 + kl_k < kl_trips) ?" in out
    if shutil.which("nvcc"):
        compiles(out, tmp_path)


# ---- the rewrite run on the CPU (cpu_cuda.py: every CUDA thread of a block a std::thread, barriers real) ----

GEMM_MAIN = r"""
int main() {
  const int M = 37, N = 45, K = 77;
  std::vector<float> A(M * K), B(K * N), C(M * N);
  for (int i = 0; i < M * K; i++) A[i] = (i * 37 % 101) / 50.0f - 1;
  for (int i = 0; i < K * N; i++) B[i] = (i * 53 % 97) / 40.0f - 1;
  for (int i = 0; i < M * N; i++) C[i] = (i % 13) / 7.0f;
  kl_launch({(N + 7) / 8, (M + 3) / 4, 1}, {8, 4, 1}, [&] { gemm(M, N, K, 1.5f, 0.5f, A.data(), B.data(), C.data()); });
  for (float v : C) printf("%a\n", v);
}
"""
GEMM_SMALL_SPEC = dict(GEMM_SPEC, grid=["ceil_div(N,8)", "ceil_div(M,4)", 1], block=[8, 4, 1],
                       variants=[{"M": 37, "N": 45, "K": 77}])


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
@pytest.mark.parametrize("variant", ["guarded", "leading-exit", "accumulate-in-memory", "after-register-accumulate"])
def test_rewrite_computes_what_the_original_does_on_ragged_sizes(variant, tmp_path):
    source = GEMM
    if variant == "leading-exit":
        source = GEMM.replace("  if (row < M && col < N) {\n", "  if (row >= M || col >= N) return;\n  {\n")
    if variant == "accumulate-in-memory":
        source = GEMM.replace("float* C) {", "float* C) {\n  (void)alpha;").replace(
            "    float acc = 0.0f;\n", "    C[row * N + col] *= beta;\n").replace(
            "acc += A[row * K + k] * B[k * N + col];", "C[row * N + col] += alpha * A[row * K + k] * B[k * N + col];").replace(
            "    C[row * N + col] = alpha * acc + beta * C[row * N + col];\n", "")
    original = source
    if variant == "after-register-accumulate":
        source = GEMM.replace("float acc = 0.0f;\n    for", "C[row * N + col] *= beta;\n    for").replace(
            "acc += A[row * K + k] * B[k * N + col];", "C[row * N + col] += alpha * A[row * K + k] * B[k * N + col];").replace(
            "    C[row * N + col] = alpha * acc + beta * C[row * N + col];\n", "")
        original = source
        first = outcome(source, GEMM_SMALL_SPEC, "register-accumulate")
        assert first.applicable, first.why
        source = first.rewrites[0].source
    found = outcome(source, GEMM_SMALL_SPEC)
    assert found.applicable, found.why
    # 77 iterations: two whole tiles of 32 and a ragged one; 37 x 45 outputs: partial blocks on both axes.
    assert "tiles of 32 iterations" in found.why
    # The tiles alone, then with 4x4, 4x1 and 1x4 micro-tiles per thread (10 blocks along y, 6 along
    # x: the last physical row and column of blocks have copies past the grid).
    assert [rw.variant for rw in found.rewrites] == ["", "4x4", "4x1", "1x4"]
    before = run_on_cpu(original, GEMM_MAIN, tmp_path, "original")
    assert len(before.split()) == 37 * 45
    for n, rewrite in enumerate(found.rewrites):
        assert run_on_cpu(rewrite.source, GEMM_MAIN, tmp_path, f"rewritten{n}") == before, rewrite.variant


GEMM_WIDE_SPEC = dict(GEMM_SPEC, grid=["ceil_div(N,32)", "ceil_div(M,32)", 1], block=[32, 32, 1],
                      variants=[{"M": 37, "N": 45, "K": 77}])


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
@pytest.mark.parametrize("variant", ["guarded", "leading-exit"])
def test_coarsened_block_computes_what_the_original_does(variant, tmp_path):
    """A 32x32 block is too large to block across blocks; its own threads are coarsened instead: 4x4
    (8x8 threads, 16 outputs each) and 2x2 (16x16 threads), launched with the same grid."""
    source = GEMM
    if variant == "leading-exit":
        source = GEMM.replace("  if (row < M && col < N) {\n", "  if (row >= M || col >= N) return;\n  {\n")
    found = outcome(source, GEMM_WIDE_SPEC)
    assert found.applicable, found.why
    assert [rw.variant for rw in found.rewrites] == ["", "4x4-in-block", "2x2-in-block"]
    before = run_on_cpu(source, GEMM_MAIN, tmp_path, "original")
    for n, rewrite in enumerate(found.rewrites[1:]):
        block = rewrite.launch_override["block"]
        assert rewrite.launch_override["grid"] == ["ceil_div(N,32)", "ceil_div(M,32)", "1"]
        # Each copy reads the original block's size and its own thread's index.
        step = block[0]
        assert f"col_kl1 = blockIdx.x * 32 + (threadIdx.x + {step});" in rewrite.source.replace("\n", " ")
        main = GEMM_MAIN.replace("kl_launch({(N + 7) / 8, (M + 3) / 4, 1}, {8, 4, 1}",
                                 f"kl_launch({{(N + 31) / 32, (M + 31) / 32, 1}}, {{{block[0]}, {block[1]}, 1}}")
        assert run_on_cpu(rewrite.source, main, tmp_path, f"coarsened{n}") == before, rewrite.variant


def test_coarsening_refusals():
    from kernel_lsp.core.transforms.emit import node_at, parse
    from kernel_lsp.core.transforms.tile_contraction import BlockShape, TileContraction, blocking_refusal
    from kernel_lsp.core.rules.base import RuleContext
    from kernel_lsp.core.index import build_index

    def refusal(source, spec, shape):
        index = build_index(source)
        ctx = RuleContext(source, index, next(f for f in index.kernels if f.name == "gemm"), parse_spec(spec))
        plan, reason = TileContraction().plan(ctx)
        assert plan is not None, reason
        src, root = parse(ctx.preprocessed)
        return blocking_refusal(plan, ctx.facts, src, node_at(src, root, ctx.facts.span), (2, 2), shape)

    # A block of 256 threads is blocked across blocks, not coarsened; 32x16 coarsened 4x4 keeps 32 threads.
    assert "more than 256 threads" in refusal(GEMM, GEMM_SPEC, BlockShape(4, 4, True))
    narrow = dict(GEMM_WIDE_SPEC, block=[32, 16, 1], grid=["ceil_div(N,32)", "ceil_div(M,16)", 1])
    assert "keep 32 threads" in refusal(GEMM, narrow, BlockShape(4, 4, True))
    assert refusal(GEMM, narrow, BlockShape(2, 2, True)) is None
    # The copies rewrite threadIdx field by field: a use of the whole of it is refused.
    whole = GEMM.replace("float acc = 0.0f;", "float acc = 0.0f; uint3 t = threadIdx; (void)t;")
    assert "threadIdx or blockDim as a whole" in refusal(whole, GEMM_WIDE_SPEC, BlockShape(2, 2, True))
    # A 1024-thread block is not blocked across blocks (at 64 registers a thread, a 4x1 micro-tile
    # did not launch on the H200).
    assert "at most 256 threads" in refusal(GEMM, GEMM_WIDE_SPEC, BlockShape(4, 1))


NBODY_MAIN = r"""
int main() {
  const int n = 50;
  std::vector<P> p(n);
  for (int i = 0; i < n; i++) p[i] = {(i * 7 % 11) / 3.0f, (i * 5 % 13) / 4.0f, 0.25f * i};
  kl_launch({(n + 15) / 16, 1, 1}, {16, 1, 1}, [&] { pairs(p.data(), 0.01f, n); });
  for (auto& b : p) printf("%a %a %a\n", b.x, b.y, b.vx);
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_all_pairs_rewrite_computes_what_the_original_does(tmp_path):
    spec = dict(NBODY_SPEC, grid=["ceil_div(n,16)", 1, 1], block=[16, 1, 1], variants=[{"n": 50}])
    found = outcome(NBODY, spec)
    assert found.applicable, found.why
    before = run_on_cpu(NBODY, NBODY_MAIN, tmp_path, "original")
    after = run_on_cpu(found.rewrites[0].source, NBODY_MAIN, tmp_path, "rewritten")
    assert after == before and len(before.split()) == 150


@pytest.mark.parametrize(("change", "why"), [
    (lambda s: "__device__ int first_row() { return blockIdx.y * blockDim.y; }\n" + s.replace(
        "int row = blockIdx.y * blockDim.y + threadIdx.y;", "int row = first_row() + threadIdx.y;"), "calls `first_row`"),
    (lambda s: s.replace("for (int k = 0; k < K; k++)", "for (int k = 0; k < K; k++, (void)0)"), "update does more"),
    (lambda s: s.replace("float acc = 0.0f;", "float acc = 0.0f; { int col = 0; (void)col; }"), "declared twice"),
    (lambda s: s.replace("    C[row * N + col] = alpha", "    if (acc == 0) return;\n    C[row * N + col] = alpha"),
     "`return` after the loop"),
])
def test_register_blocking_refusals_keep_the_plain_tiles(change, why):
    from kernel_lsp.core.transforms.emit import node_at, parse
    from kernel_lsp.core.transforms.tile_contraction import BlockShape, TileContraction, blocking_refusal
    from kernel_lsp.core.rules.base import RuleContext
    from kernel_lsp.core.index import build_index

    source = change(GEMM)
    index = build_index(source)
    fn = next(f for f in index.kernels if f.name == "gemm")
    ctx = RuleContext(source, index, fn, parse_spec(GEMM_SPEC))
    plan, reason = TileContraction().plan(ctx)
    assert plan is not None, reason
    src, root = parse(ctx.preprocessed)
    refusal = blocking_refusal(plan, ctx.facts, src, node_at(src, root, ctx.facts.span), (64, 64), BlockShape(4, 1))
    assert refusal is not None and why in refusal
    assert [rw.variant for rw in outcome(source, GEMM_SPEC).rewrites] == [""]


def test_loads_through_ldg_are_replaced_whole(tmp_path):
    source = GEMM.replace("acc += A[row * K + k] * B[k * N + col];", "acc += __ldg(&A[row * K + k]) * __ldg(&B[k * N + col]);")
    found = outcome(source, GEMM_SPEC)
    assert found.applicable, found.why
    out = found.rewrites[0].source
    assert "acc += kl_s0[threadIdx.y][(int)(k - kl_kb)] * kl_s1[(int)(k - kl_kb)][threadIdx.x];" in out
    assert "__ldg(&kl_s" not in out
    if shutil.which("nvcc"):
        compiles(out, tmp_path)


def test_corpus_candidate_keeps_the_users_macros(tmp_path):
    """The statements around the loop and the tile's loads are written from the user's text, so the
    harness's static check finds no problem size written as a literal (``NJ`` kept)."""
    from kernel_lsp.core.static_check import check

    folder, source, spec, pre = _corpus("polybench_gramschmidt_kernel1")
    found = evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name("tile-contraction")], preprocessed=pre)[0]
    assert found.applicable and found.rewrites, found.why
    for n, rewrite in enumerate(found.rewrites):
        report = check(source, rewrite.source, parse_spec(spec))
        assert report.ok, [f"line {e.line}: {e.rule}: {e.message}" for e in report.errors]
        assert "macros expanded" not in rewrite.description
        assert re.search(r"kl_g0\[kl_i\] = .*\(a\[\(\(decltype\(i\)\)\(0 \+ kl_t0 \+ kl_k\)\) \* NJ \+ k\]\)", rewrite.source)
        assert "r[k * NJ + k] = sqrt(nrm);" in rewrite.source
        if shutil.which("nvcc"):
            (tmp_path / str(n)).mkdir()
            compiles(rewrite.source, tmp_path / str(n), folder)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_a_kernel_with_shared_memory_and_barriers_of_its_own_is_tiled_too(tmp_path):
    """The kernel already stages a per-column scale in shared memory behind a barrier: the tiles go beside
    it, the kernel's barrier stays where it was (outside the statement the rewrite predicates), and the
    register-blocked rewrites, whose threads would run several original threads, are not offered."""
    source = GEMM.replace("  if (row < M && col < N) {\n",
                          "  __shared__ float scale[8];\n  if (threadIdx.y == 0) scale[threadIdx.x] = 1.0f + 0.25f * threadIdx.x;\n"
                          "  __syncthreads();\n  if (row < M && col < N) {\n").replace(
        "alpha * acc", "alpha * scale[threadIdx.x] * acc")
    found = outcome(source, GEMM_SMALL_SPEC)
    assert found.applicable, found.why
    assert [rw.variant for rw in found.rewrites] == [""]
    rewritten = found.rewrites[0].source
    assert "__shared__ float scale[8];" in rewritten
    before = run_on_cpu(source, GEMM_MAIN, tmp_path, "own_shared")
    assert run_on_cpu(rewritten, GEMM_MAIN, tmp_path, "own_shared_tiled") == before


def test_members_read_while_other_members_of_the_same_array_are_written(tmp_path):
    """`p[j].pos.x` read in the loop while `p[i].acc.x` (nested members, a float3 in a struct) is
    written after it: the operand is the member read, which the kernel never writes."""
    source = """
struct Body { float3 pos; float3 acc; };
__global__ void pairs(Body* p, float dt, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float f = 0.0f;
  for (int j = 0; j < n; j++) {
    float dx = p[j].pos.x - p[i].pos.x;
    f += dx * rsqrtf(dx * dx + 1e-9f);
  }
  p[i].acc.x += dt * f;
}
"""
    spec = dict(NBODY_SPEC, params=[{"name": "p", "array": "float32", "size": "n*6", "init": "uniform(-1,1)",
                                     "role": "inout"}, *NBODY_SPEC["params"][1:]])
    found = outcome(source, spec)
    assert found.applicable, found.why
    assert "decltype(p->pos.x)" in found.rewrites[0].source
    if shutil.which("nvcc"):
        compiles(found.rewrites[0].source, tmp_path)


WHILE_GEMM = GEMM.replace("for (int k = 0; k < K; k++) {\n      acc += A[row * K + k] * B[k * N + col];\n    }",
                          "int k = 0;\n    while (k < K) {\n      acc += A[row * K + k] * B[k * N + col];\n      ++k;\n    }")
NO_INIT_GEMM = GEMM.replace("for (int k = 0; k < K; k++) {", "int k = 0;\n    for (; k < K; k++) {")


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
@pytest.mark.parametrize("source", [WHILE_GEMM, NO_INIT_GEMM], ids=["while", "for without an initializer"])
def test_a_counted_loop_written_otherwise_is_tiled_too(source, tmp_path):
    """The same dot product as a ``while`` loop stepped at the end of its body, and as a ``for`` whose
    counter is set before it: tiled, register-blocked and computing what the original does."""
    assert source != GEMM
    found = outcome(source, GEMM_SMALL_SPEC)
    assert found.applicable, found.why
    assert [rw.variant for rw in found.rewrites] == ["", "4x4", "4x1", "1x4"]
    before = run_on_cpu(source, GEMM_MAIN, tmp_path, "original")
    for n, rewrite in enumerate(found.rewrites):
        assert run_on_cpu(rewrite.source, GEMM_MAIN, tmp_path, f"rewritten{n}") == before, rewrite.variant
    # The counter read after the loop: each tile's copy would end it elsewhere.
    used = source.replace("C[row * N + col] = alpha", "C[row * N + col + k - K] = alpha")
    assert "counter `k` is read after it" in outcome(used, GEMM_SMALL_SPEC).why
