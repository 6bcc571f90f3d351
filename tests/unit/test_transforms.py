"""Transformations from the access analysis: where each applies, each refusal with its missing
fact, the emitted code compiled by nvcc, sequences, and the host launch edit."""

from __future__ import annotations

import json
import shutil

import pytest

from kernel_lsp.core.candidates import OptimizeRequest
from kernel_lsp.core.index import build_index
from kernel_lsp.core.rules import RuleGenerator, evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec
from kernel_lsp.core.transforms.launch_edit import scale_launches, scaled_grid
from nvcc_check import compiles
from rule_specs import arr, outcome, scalar, spec_of

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


GEMV = """
__global__ void gemv(int n, const float* A, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    y[i] = 0;
    for (int j = 0; j < n; j++)
      y[i] += A[i * n + j] * x[j];
  }
}
"""
GEMV_SPEC = spec_of("gemv", [scalar("n", 1024), arr("A", "n*n"), arr("x", "n"), arr("y", "n", "out")],
                    ["ceil_div(n,256)", 1, 1], [256, 1, 1], [{"n": 100}])


def test_register_accumulate_applies_and_compiles(tmp_path):
    found = outcome("register-accumulate", GEMV, GEMV_SPEC)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "float kl_acc0 = y[i];" in source and "kl_acc0 += A[i * n + j] * x[j];" in source
    assert "y[i] = kl_acc0; }" in source
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


@pytest.mark.parametrize(("change", "why"), [
    (lambda s: s.replace("y[i] += A[i * n + j]", "y[j % n] += A[i * n + j]"), "changes inside the loop"),
    (lambda s: s.replace("      y[i] += A", "      if (x[j] > 0) y[i] += A"), "under a condition"),
    (lambda s: s.replace("y[i] += A[i * n + j] * x[j];", "{ y[i] += A[i * n + j] * x[j]; x[0] = y[i + 1]; }"),
     "different indices"),
])
def test_register_accumulate_refusals(change, why):
    found = outcome("register-accumulate", change(GEMV), GEMV_SPEC)
    assert not found.applicable and why in found.why


def test_register_accumulate_needs_a_loop_that_runs_at_every_size():
    source = GEMV.replace("int n, const", "int n, int k, const").replace("j < n; j++", "j < k; j++")
    params = [scalar("n", 1024), scalar("k", 1024), arr("A", "n*n"), arr("x", "n"), arr("y", "n", "out")]
    assert outcome("register-accumulate", source, dict(GEMV_SPEC, params=params, variants=[{"k": 3}])).applicable
    found = outcome("register-accumulate", source, dict(GEMV_SPEC, params=params, variants=[{"k": 0}]))
    assert not found.applicable and "zero times" in found.why


def test_register_accumulate_leaves_a_moving_pointer_parameter_alone():
    """``A += n`` walks the pointer (SGEMM's tiles along K); it stores no element. Taking it for one put the
    pointer in a register the loop's loads never read (every element wrong on the GPU)."""
    source = GEMV.replace("y[i] += A[i * n + j] * x[j];", "{ y[i] += A[i * n + j] * x[0]; x += 1; }").replace(
        "const float* x", "float* x")
    found = outcome("register-accumulate", source, GEMV_SPEC)
    assert found.applicable, found.why
    rewritten = found.rewrites[0].source
    assert "float kl_acc0 = y[i];" in rewritten and "x += 1;" in rewritten and "kl_acc1" not in rewritten


# Each thread adds its inputs into its own shared slot before the tree, under the user's pragma.
SHARED_SUM = """
#define BS 128
__global__ void partial_sums(const float* in, float* out, int n) {
  __shared__ float acc[BS];
  unsigned tid = threadIdx.x;
  unsigned base = blockIdx.x * (BS * 4) + tid;
  acc[tid] = 0.0f;
  #pragma unroll
  for (int k = 0; k < 4; k++)
    acc[tid] += (base + k * BS < n) ? in[base + k * BS] : 0.0f;
  __syncthreads();
  for (unsigned s = BS / 2; s > 0; s >>= 1) {
    if (tid < s) acc[tid] += acc[tid + s];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = acc[0];
}
"""
SHARED_SUM_SPEC = spec_of("partial_sums", [arr("in", "n"), arr("out", "ceil_div(n,512)", "out"), scalar("n", 1 << 20)],
                          ["ceil_div(n,512)", 1, 1], [128, 1, 1], [{"n": 1000}])
SHARED_SUM_MAIN = r"""
int main() {
  const int n = N;
  const unsigned blocks = (n + 511) / 512;
  std::vector<float> in(n), out(blocks, -7.0f);
  for (int i = 0; i < n; i++) in[i] = (float)((i * 7919) % 2003) / 1001.0f - 1.0f;
  kl_launch({blocks, 1, 1}, {128, 1, 1}, [&] { partial_sums(in.data(), out.data(), n); });
  for (unsigned b = 0; b < blocks; b++) printf("%.7e\n", out[b]);
}
"""


def test_register_accumulate_keeps_a_threads_shared_slot_in_a_register_before_the_pragma():
    found = outcome("register-accumulate", SHARED_SUM, SHARED_SUM_SPEC)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert ("  { float kl_acc0 = acc[tid];\n  #pragma unroll\n  for (int k = 0; k < 4; k++)\n"
            "    kl_acc0 += (base + k * BS < n) ? in[base + k * BS] : 0.0f;\n  acc[tid] = kl_acc0; }") in source
    # The tree after the barrier reads other threads' slots: it is not touched.
    assert "if (tid < s) acc[tid] += acc[tid + s];" in source


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
@pytest.mark.parametrize("n", [1000, 512, 77])
def test_the_shared_slot_in_a_register_gives_the_originals_sums(n, tmp_path):
    from cpu_cuda import run_on_cpu

    main = SHARED_SUM_MAIN.replace("N;", f"{n};")
    original = [float(v) for v in run_on_cpu(SHARED_SUM, main, tmp_path, "original").split()]
    assert original and all(v != -7.0 for v in original)
    rewritten = outcome("register-accumulate", SHARED_SUM, SHARED_SUM_SPEC).rewrites[0].source
    assert [float(v) for v in run_on_cpu(rewritten, main, tmp_path, "rewritten").split()] == original


@needs_nvcc
def test_the_shared_slot_rewrite_compiles(tmp_path):
    compiles(outcome("register-accumulate", SHARED_SUM, SHARED_SUM_SPEC).rewrites[0].source, tmp_path)


# The same sums in a template over the element type, its slots ``volatile`` as warp-synchronous trees declare
# them: the slot is still the thread's own while the loop runs.
VOLATILE_SUM = SHARED_SUM.replace("__global__ void partial_sums(const float* in, float* out, int n) {\n  __shared__ float acc[BS];",
                                  "template <typename T>\n__global__ void partial_sums(const T* in, T* out, int n) {\n"
                                  "  __shared__ volatile T acc[BS];").replace(
    "  if (tid == 0) out[blockIdx.x] = acc[0];\n}\n", "  if (tid == 0) out[blockIdx.x] = acc[0];\n}\n"
    "template __global__ void partial_sums<float>(const float*, float*, int);\n")


def test_a_volatile_slot_in_a_template_is_kept_in_a_register_of_the_instances_type(tmp_path):
    assert "volatile T acc" in VOLATILE_SUM and "template __global__" in VOLATILE_SUM
    found = outcome("register-accumulate", VOLATILE_SUM, SHARED_SUM_SPEC)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "{ auto kl_acc0 = acc[tid];" in source and "acc[tid] = kl_acc0; }" in source
    if shutil.which("g++"):
        from cpu_cuda import run_on_cpu

        for n in (1000, 77):
            main = SHARED_SUM_MAIN.replace("N;", f"{n};")
            assert run_on_cpu(source, main, tmp_path, f"volatile{n}") == run_on_cpu(VOLATILE_SUM, main, tmp_path, f"orig{n}")
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


@pytest.mark.parametrize(("change", "why"), [
    (("    acc[tid] += (base", "    { __syncthreads(); acc[tid] += (base"), "a barrier or a warp operation"),
    (("    acc[tid] += (base", "    { __syncwarp(); acc[tid] += (base"), "a barrier or a warp operation"),
    (("acc[tid] += (base", "acc[(tid + k) % BS] += (base"), "changes inside the loop"),
])
def test_register_accumulate_refuses_shared_slots_other_threads_may_reach(change, why):
    source = SHARED_SUM.replace(*change)
    if "{ __sync" in source:
        source = source.replace(": 0.0f;\n  __syncthreads();", ": 0.0f; }\n  __syncthreads();", 1)
    found = outcome("register-accumulate", source, SHARED_SUM_SPEC)
    assert not found.applicable and why in found.why, found.why


SOFTMAX = """
__global__ void rows(float* out, const float* in, int N, int C) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < N) {
    float m = -1e30f;
    for (int j = 0; j < C; j++) if (in[r * C + j] > m) m = in[r * C + j];
    float s = 0.f;
    for (int j = 0; j < C; j++) s += expf(in[r * C + j] - m);
    for (int j = 0; j < C; j++) out[r * C + j] = expf(in[r * C + j] - m) / s;
  }
}
void host(float* o, const float* i, int N, int C) { rows<<<(N + 255) / 256, 256>>>(o, i, N, C); }
"""
SOFTMAX_SPEC = spec_of("rows", [arr("out", "N*C", "out"), arr("in", "N*C"), scalar("N", 4096), scalar("C", 1000)],
                       ["ceil_div(N,256)", 1, 1], [256, 1, 1], [{"N": 77, "C": 33}])


def test_warp_per_row_applies_with_a_scaled_launch(tmp_path):
    found = outcome("warp-per-row", SOFTMAX, SOFTMAX_SPEC)
    assert found.applicable, found.why
    rewrite = found.rewrites[0]
    assert rewrite.grid_scale == (32, 1, 1)
    assert rewrite.launch_override["grid"][0] == "(ceil_div(N,256)) * 32"
    body = rewrite.source
    assert body.count("j += 32") == 3 and "m = kl_warp_max(m);" in body and "s = kl_init1_0 + kl_warp_sum(s);" in body
    assert "int r = kl_vbid * blockDim.x + kl_vtid;" in body
    if shutil.which("nvcc"):
        compiles(body, tmp_path)


@pytest.mark.parametrize(("change", "why"), [
    (lambda s: s.replace("if (r < N) {", "if (r < N) { __syncthreads();"), "barriers"),
    (lambda s: s.replace("for (int j = 0; j < C; j++) s +=", "for (int j = 0; j < C; j++) s = s * 0.5f +"),
     "carries s from one iteration"),
    (lambda s: s.replace("s += expf(in[r * C + j] - m);", "{ s += expf(in[r * C + j] - m); out[r * C + j] = s; }"),
     "reads the accumulator `s`"),
    (lambda s: s.replace("out[r * C + j] = expf(in[r * C + j] - m) / s;", "out[r * C + j] = out[r * C + j - 1] + 1;"),
     "another index"),
])
def test_warp_per_row_refusals(change, why):
    found = outcome("warp-per-row", change(SOFTMAX), SOFTMAX_SPEC)
    assert not found.applicable and why in found.why


def test_a_loop_holding_a_loop_runs_whole_on_every_lane_and_only_innermost_loops_split():
    found = outcome("warp-per-row", SOFTMAX.replace(
        "s += expf(in[r * C + j] - m);", "{ s += expf(in[r * C + j] - m); for (int k = 0; k < 2; k++) m += 0; }"), SOFTMAX_SPEC)
    assert found.applicable, found.why
    body = found.rewrites[0].source
    assert body.count("j += 32") == 2 and "k += 32" not in body and "for (int j = 0; j < C; j++) {" in body


def test_long_split_loops_get_an_unrolled_variant_short_ones_none_and_the_users_pragmas_stay():
    # C = 1000 at the spec's size: 31 iterations per lane, so the variant unrolls each split loop.
    plain, unrolled = outcome("warp-per-row", SOFTMAX, SOFTMAX_SPEC).rewrites
    assert "#pragma unroll" not in plain.source and plain.variant == ""
    assert unrolled.variant == "unroll" and unrolled.source.count("#pragma unroll 4") == 3
    assert unrolled.source.replace("#pragma unroll 4\n", "").split() == plain.source.split()
    short = dict(SOFTMAX_SPEC, params=[p if p["name"] != "C" else scalar("C", 200) for p in SOFTMAX_SPEC["params"]])
    assert len(outcome("warp-per-row", SOFTMAX, short).rewrites) == 1
    own = SOFTMAX.replace("    float s = 0.f;\n", "    float s = 0.f;\n#pragma unroll 2\n")
    body = outcome("warp-per-row", own, SOFTMAX_SPEC).rewrites[1].source
    assert body.count("#pragma unroll 4") == 2 and body.count("#pragma unroll 2") == 1


# Each thread accumulates a row of outputs over an outer loop (llm.c's attention-value shape): the
# loops over the row split across the lanes inside the outer loop, which every lane runs whole.
ROW_OUTER = """
__global__ void av(float* out, const float* w, const float* v, int R, int T, int H) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < R) {
    float* o = out + r * H;
    for (int i = 0; i < H; i++) o[i] = 0.0f;
    for (int t = 0; t < T; t++) {
      float a = w[r * T + t];
      for (int i = 0; i < H; i++) o[i] += a * v[t * H + i];
    }
  }
}
"""
ROW_OUTER_SPEC = spec_of("av", [arr("out", "R*H", "out"), arr("w", "R*T"), arr("v", "T*H"), scalar("R", 4096),
                                scalar("T", 64), scalar("H", 64)], ["ceil_div(R,256)", 1, 1], [256, 1, 1],
                         [{"R": 77, "T": 5, "H": 33}])


def test_warp_per_row_splits_row_loops_nested_in_a_loop_every_lane_runs(tmp_path):
    found = outcome("warp-per-row", ROW_OUTER, ROW_OUTER_SPEC)
    assert found.applicable, found.why
    body = found.rewrites[0].source
    assert body.count("i += 32") == 2 and "for (int t = 0; t < T; t++) {" in body
    if shutil.which("nvcc"):
        compiles(body, tmp_path)


@pytest.mark.parametrize(("change", "why"), [
    # The second loop reads the element the first stored one to the left: another lane's.
    (lambda s: s.replace("o[i] += a * v[t * H + i];", "o[i + 1] += a * v[t * H + i];"), "may read `out` after another lane"),
    # The outer loop reads what the split loop stored: a lane reads every element.
    (lambda s: s.replace("float a = w[r * T + t];", "float a = w[r * T + t] + o[t];"), "`o[t]`"),
])
def test_nested_row_loops_refused_when_a_lane_reads_another_lanes_store(change, why):
    found = outcome("warp-per-row", change(ROW_OUTER), ROW_OUTER_SPEC)
    assert not found.applicable and why in found.why, found.why


def test_warp_per_row_refused_when_it_would_uncoalesce_as_much_as_it_coalesces():
    transpose_like = """
    __global__ void inv(const float* in, float* out, int n, int f) {
      int p = threadIdx.x + blockDim.x * blockIdx.x;
      if (p < n) for (int i = 0; i < f; i++) out[p + n * i] = in[p * f + i];
    }"""
    spec = spec_of("inv", [arr("in", "n*f"), arr("out", "n*f", "out"), scalar("n", 4096), scalar("f", 34)],
                   ["ceil_div(n,256)", 1, 1], [256, 1, 1])
    found = outcome("warp-per-row", transpose_like, spec)
    assert not found.applicable and "would become a row apart" in found.why


def test_a_sequence_follows_its_first_step_and_waits_for_it():
    request = OptimizeRequest(source=GEMV, path="/w/gemv.cu", kernel="gemv", spec=GEMV_SPEC)
    candidates = list(RuleGenerator().generate(request))
    names = [c.generator for c in candidates]
    first = names.index("rule:register-accumulate")
    assert names[first + 1] == "rule:register-accumulate+warp-per-row"
    composed = candidates[first + 1]
    assert composed.after == "rule:register-accumulate" and composed.grid_scale == (32, 1, 1)
    assert "kl_warp_sum(kl_acc0)" in composed.source
    # warp-per-row refuses the original (its store in the loop): the first step made it possible, so it follows
    # that step once it verified correct, even when not faster. A step the original allowed anyway waits for an
    # accepted first step.
    assert outcome("warp-per-row", GEMV, GEMV_SPEC).applicable is False and composed.after_correct
    plain = [c for c in candidates if c.after == "rule:register-accumulate"
             and outcome(c.generator.split("+")[-1].split("[")[0], GEMV, GEMV_SPEC).applicable]
    assert plain and not any(c.after_correct for c in plain)


def test_a_sequence_after_a_relaunching_step_sees_its_launch():
    """The matmul example's threads walk C's rows; index-swap swaps them (a launch of its own, grid and
    block swapped), and tile-contraction then tiles the swapped kernel as launched that way: a step with
    no launch of its own keeps index-swap's, one with its own (the coarsened block) replaces it."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples" / "matmul"
    source = (root / "original.cu").read_text()
    spec = json.loads((root / "spec.json").read_text())
    request = OptimizeRequest(source=source, path=str(root / "original.cu"), kernel="matmul", spec=spec)
    candidates = {c.generator: c for c in RuleGenerator().generate(request)}
    swap = candidates["rule:index-swap"]
    tiled = candidates["rule:index-swap+tile-contraction"]
    assert tiled.after == "rule:index-swap" and tiled.launch_override == swap.launch_override
    # The swapped kernel's rows come from threadIdx.y: A's tile now moves with y, B's with x.
    assert "kl_s0[threadIdx.y][" in tiled.source and "][threadIdx.x]" in tiled.source
    coarse = candidates["rule:index-swap+tile-contraction[2x2-in-block]"]
    assert coarse.launch_override["grid"] == swap.launch_override["grid"]
    assert list(coarse.launch_override["block"]) == [16, 16, 1]
    # A rewrite that scales the host's launch cannot follow a launch of its own.
    assert not any(c.after == "rule:index-swap" and (c.grid_scale or c.block or c.grid_divide) for c in candidates.values())


def test_launch_sites_are_rescaled_however_the_grid_is_written():
    source = SOFTMAX + "void two(dim3 g, float* o, const float* i) { rows<<<g, 256, 0>>>(o, i, 1, 1); }\n"
    edit = scale_launches(source, "rows", (32, 1, 1))
    assert len(edit.lines) == 2 and edit.instruction is None
    assert "rows<<<dim3(dim3((N + 255) / 256).x * 32, dim3((N + 255) / 256).y, dim3((N + 255) / 256).z), 256>>>" in edit.source
    assert "rows<<<dim3(dim3(g).x * 32, dim3(g).y, dim3(g).z), 256, 0>>>" in edit.source
    assert len(build_index(edit.source).launches_of("rows")) == 2
    assert scaled_grid("blocks", (1, 2, 1)) == "dim3(dim3(blocks).x, dim3(blocks).y * 2, dim3(blocks).z)"


def test_without_a_launch_in_the_file_the_host_change_is_stated():
    edit = scale_launches(GEMV, "gemv", (32, 1, 1))
    assert edit.source == GEMV and edit.lines == ()
    assert "launch it with 32 x 1 x 1 times the blocks" in edit.instruction


CSR_FUNCTOR = """
struct Reader {
    const float* __restrict__ vec;
    __device__ __forceinline__ float operator()(const int idx) const { return vec[idx]; }
};
template <typename R>
__global__ void csr(const float* val, const int* cols, const int* rows, const int dim, float* out, const float* vec)
{
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    R read = {vec};
    if (row < dim) {
        float t = 0.0f;
        for (int j = rows[row]; j < rows[row + 1]; j++) t += val[j] * read(cols[j]);
        out[row] = t;
    }
}
template __global__ void csr<Reader>(const float* val, const int* cols, const int* rows, const int dim, float* out, const float* vec);
"""
CSR_SPEC = spec_of("csr", [arr("val", "dim*16"), {"name": "cols", "array": "int32", "size": "dim*16", "init": "csr_colidx(dim,dim,16)", "role": "in"},
                           {"name": "rows", "array": "int32", "size": "dim+1", "init": "csr_rowptr(dim,16)", "role": "in"},
                           scalar("dim", 4096), arr("out", "dim", "out"), arr("vec", "dim")],
                   ["ceil_div(dim,128)", 1, 1], [128, 1, 1], [{"dim": 1000}])


def test_a_function_object_is_analysed_through_its_call_operator():
    """SHOC's texture readers (``texReader r = {vec}; r(col)``): the call is the struct's
    ``operator()`` with its member bound to ``vec``, not unknown code, so the CSR row loop is a
    thread-per-row loop and a warp per row applies (it was refused: "calls code the analysis does not see")."""
    from kernel_lsp.core.analysis import analyze

    facts = analyze(CSR_FUNCTOR)["csr"]
    assert not any(loop.calls_unknown for loop in facts.loops)
    assert [a.via for a in facts.accesses if a.array == "vec"] == [("operator()",)]
    assert "vec" not in facts.escaped


def test_warp_per_row_applies_to_csr_through_a_function_object(tmp_path):
    found = outcome("warp-per-row", CSR_FUNCTOR, CSR_SPEC)
    assert found.applicable, found.why
    assert "j += 32" in found.rewrites[0].source and "kl_warp_sum(t)" in found.rewrites[0].source
    if shutil.which("nvcc"):
        compiles(found.rewrites[0].source, tmp_path)


def test_warp_per_row_still_refuses_a_call_operator_that_reads_the_thread_index():
    reads_tid = CSR_FUNCTOR.replace("return vec[idx];", "return vec[idx] + threadIdx.x;")
    found = outcome("warp-per-row", reads_tid, CSR_SPEC)
    assert not found.applicable and "reads the thread or block index" in found.why


def test_warp_per_row_applies_to_the_shoc_csr_kernel(tmp_path):
    import json
    from pathlib import Path

    from kernel_lsp.core.source import preprocess

    entry = Path(__file__).resolve().parents[2] / "benchmarks/corpus/shoc_spmv_csr_scalar"
    source = (entry / "kernel.cu").read_text()
    spec = json.loads((entry / "spec.json").read_text())
    pre = preprocess(source, path=str(entry / "kernel.cu"))
    found = evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name("warp-per-row")], preprocessed=pre)[0]
    assert found.applicable, found.why
    assert found.rewrites[0].grid_scale == (32, 1, 1)
    if shutil.which("nvcc"):
        compiles(found.rewrites[0].source, tmp_path)
