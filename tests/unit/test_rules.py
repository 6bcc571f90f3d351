"""Rewrite rules: the transformations behind each example's honest rewrite fire on it, every rewrite
compiles and keeps the kernel's signature, and each rule refuses what it cannot prove."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_lsp.core.candidates import OptimizeRequest, TechniqueHint
from kernel_lsp.core.index import build_index
from kernel_lsp.core.rules import RULES, RuleGenerator, evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec, with_candidate_launch
from kernel_lsp.core.static_check import check, check_signature

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HAS_NVCC = shutil.which("nvcc") is not None
TECHNIQUES = {t["name"] for t in json.loads((Path(__file__).resolve().parents[2] / "kernel_lsp/data/techniques.json").read_text())["techniques"]}

#: The transformation each example's original must trigger (the honest rewrite's idea).
EXPECTED_TEMPLATE = {
    "transpose": "shared-tile-transpose",
    "streaming": "vectorize-float4",
    "reduction": "tree-to-registers",
    "matmul": "tile-contraction",
    "histogram": "shared-privatize",
    "softmax": "block-per-row",
    "spmv": "warp-per-row",
}


def _example(name: str):
    source = (EXAMPLES / name / "original.cu").read_text()
    spec = parse_spec(json.loads((EXAMPLES / name / "spec.json").read_text()))
    return source, spec


def _outcomes(name: str):
    source, spec = _example(name)
    return source, spec, {o.rule: o for o in evaluate(source, spec.kernel, spec)}


def _compile(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    path = tmp_path / "candidate.cu"
    path.write_text(source)
    return subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "c.cubin"), str(path)],
                          capture_output=True, text=True, timeout=300)


def test_every_rule_names_a_known_technique() -> None:
    assert {r.technique for r in RULES} <= TECHNIQUES
    assert len({r.name for r in RULES}) == len(RULES)


@pytest.mark.parametrize("example", sorted(EXPECTED_TEMPLATE))
def test_template_fires_on_example_and_keeps_the_signature(example: str) -> None:
    source, spec, outcomes = _outcomes(example)
    outcome = outcomes[EXPECTED_TEMPLATE[example]]
    assert outcome.applicable, outcome.why
    assert outcome.rewrites
    original = build_index(source).function(spec.kernel)
    for rewrite in outcome.rewrites:
        assert rewrite.source != source
        fn = build_index(rewrite.source).function(spec.kernel)
        assert fn is not None and fn.is_kernel
        assert [(p.name, p.base_type, p.pointer_depth) for p in fn.params] == [(p.name, p.base_type, p.pointer_depth) for p in original.params]
        candidate_spec = with_candidate_launch(spec, rewrite.launch_override)
        assert check_signature(source, rewrite.source, candidate_spec).changed == ()
        assert check(source, rewrite.source, candidate_spec).errors == ()
        # The launch override evaluates at every size of the spec.
        for variant in [None, *range(len(spec.variants))]:
            launch = candidate_spec.resolve(variant).candidate
            assert all(g >= 1 for g in launch.grid) and 1 <= launch.block[0] * launch.block[1] * launch.block[2] <= 1024


def _all_rewrites():
    for example in sorted(EXPECTED_TEMPLATE):
        source, spec, outcomes = _outcomes(example)
        for outcome in outcomes.values():
            for rewrite in outcome.rewrites:
                if rewrite.source != source:
                    yield pytest.param(example, outcome.rule, rewrite.variant, id=f"{example}-{outcome.rule}-{rewrite.variant}")


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
@pytest.mark.parametrize("example,rule,variant", list(_all_rewrites()))
def test_every_rewrite_of_the_examples_compiles(tmp_path: Path, example: str, rule: str, variant: str) -> None:
    _, _, outcomes = _outcomes(example)
    rewrite = next(r for r in outcomes[rule].rewrites if r.variant == variant)
    result = _compile(tmp_path, rewrite.source)
    assert result.returncode == 0, result.stderr


def test_streaming_float4_launch_and_tail() -> None:
    _, _, outcomes = _outcomes("streaming")
    rewrite = outcomes["vectorize-float4"].rewrites[0]
    assert "reinterpret_cast<const float4*>(x)" in rewrite.source
    assert "kl_i < n; kl_i += kl_stride" in rewrite.source  # the scalar tail
    assert rewrite.launch_override["block"] == [256, 1, 1]


def test_block_size_sweep_recomputes_the_grid_to_cover_the_same_threads() -> None:
    source, spec, outcomes = _outcomes("spmv")
    rewrites = outcomes["block-size"].rewrites
    assert sorted(r.launch_override["block"][0] for r in rewrites) == [128, 512, 1024]
    for rewrite in rewrites:
        assert rewrite.source == source
        for variant in [None, *range(len(spec.variants))]:
            resolved = with_candidate_launch(spec, rewrite.launch_override).resolve(variant)
            original_threads = resolved.original.grid[0] * resolved.original.block[0]
            new_threads = resolved.candidate.grid[0] * resolved.candidate.block[0]
            assert original_threads <= new_threads < original_threads + resolved.candidate.block[0]


# ----------------------------------------------------------------------------------------- negative cases

SPEC_1D = {
    "kernel": "k",
    "params": [
        {"name": "n", "scalar": "int32", "value": 100000},
        {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
        {"name": "y", "array": "float32", "size": "n", "init": "zeros", "role": "out"},
    ],
    "grid": ["(n+255)/256", "1", "1"],
    "block": [256, 1, 1],
    "variants": [{"n": 1001}],
}


def _rule(name: str, source: str, spec: dict | None = SPEC_1D, kernel: str = "k"):
    return next(o for o in evaluate(source, kernel, parse_spec(spec) if spec else None) if o.rule == name)


def _kernel(body: str, params: str = "int n, const float* x, float* y") -> str:
    return f'extern "C" __global__ void k({params})\n{{\n{body}\n}}\n'


ELEMENTWISE = _kernel("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) {\n        y[i] = 2.0f * x[i];\n    }")


def test_elementwise_kernel_gets_float4_grid_stride_and_sweep() -> None:
    assert _rule("vectorize-float4", ELEMENTWISE).applicable
    assert _rule("grid-stride", ELEMENTWISE).applicable
    assert _rule("block-size", ELEMENTWISE).applicable
    assert _rule("ldg", ELEMENTWISE).applicable


@pytest.mark.parametrize("source,why", [
    (ELEMENTWISE.replace("x[i]", "x[i + 1]"), "is not at the index of the store"),
    (ELEMENTWISE.replace("2.0f * x[i]", "2.0f * x[i] + (float)i"), "neither a scalar parameter"),
])
def test_vectorize_refuses_unproven_elementwise(source: str, why: str) -> None:
    outcome = _rule("vectorize-float4", source)
    assert not outcome.applicable and why in outcome.why


def test_vectorize_refuses_without_spec_or_when_launch_does_not_cover_n() -> None:
    assert not _rule("vectorize-float4", ELEMENTWISE, spec=None).applicable
    short = dict(SPEC_1D, grid=["n/512", "1", "1"])
    outcome = _rule("vectorize-float4", ELEMENTWISE, spec=short)
    assert not outcome.applicable and "covers" in outcome.why


def test_vectorize_refuses_double_arrays() -> None:
    source = ELEMENTWISE.replace("const float* x, float* y", "const double* x, double* y")
    spec = json.loads(json.dumps(SPEC_1D).replace("float32", "float64"))
    assert not _rule("vectorize-float4", source, spec).applicable


def test_block_size_refuses_block_cooperation() -> None:
    shared = _kernel("    __shared__ float s[256];\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                     "    s[threadIdx.x] = i < n ? x[i] : 0.0f;\n    __syncthreads();\n    if (i < n) y[i] = s[255 - threadIdx.x];")
    outcome = _rule("block-size", shared)
    assert not outcome.applicable
    assert not _rule("block-size", ELEMENTWISE, dict(SPEC_1D, block=[16, 16, 1])).applicable


def test_restrict_const_needs_proof() -> None:
    writes_x = _kernel("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) { x[i] = 1.0f; y[i] = x[i]; }",
                       "int n, float* x, float* y")
    # Without a spec: const only where never written, and no __restrict__ at all.
    assert not _rule("restrict-const", writes_x, spec=None).applicable
    reads_x = writes_x.replace("x[i] = 1.0f; ", "")
    outcome = _rule("restrict-const", reads_x, spec=None)
    assert outcome.applicable
    rewritten = outcome.rewrites[0].source
    assert "const float* x" in rewritten and "__restrict__" not in rewritten and "const float* y" not in rewritten
    # With a spec (distinct arrays): __restrict__ everywhere, const still only on x.
    with_spec = _rule("restrict-const", reads_x).rewrites[0].source
    assert "const float* __restrict__ x" in with_spec and "float* __restrict__ y" in with_spec


def test_ldg_refuses_a_written_pointer_and_wraps_reads_through_a_local_pointer() -> None:
    assert not _rule("ldg", _kernel("    int i = threadIdx.x;\n    if (i < n) y[i] = y[i] + 1.0f;", "int n, const float* x, float* y")).applicable
    alias = _kernel("    const float* p = x + 1;\n    int i = threadIdx.x;\n    if (i < n) y[i] = p[i];")
    outcome = _rule("ldg", alias)
    assert outcome.applicable and "y[i] = __ldg(&p[i]);" in outcome.rewrites[0].source
    nested = _kernel("    int i = threadIdx.x;\n    if (i < n) y[i] = x[(int)x[i]];")
    assert "__ldg(&x[(int)__ldg(&x[i])])" in _rule("ldg", nested).rewrites[0].source


def test_ldg_and_the_launch_rules_read_a_dereference_as_a_subscript(tmp_path) -> None:
    """Rodinia gaussian's Fan1 reads ``*(a + Size * gid + t)``: the same element read as ``a[Size * gid + t]``, so
    ``__ldg`` wraps its address and the global index is seen through the pointer's offset."""
    source = _kernel("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) *(y + i) = *(x + i) * 2.0f + *x;")
    outcome = _rule("ldg", source)
    assert outcome.applicable, outcome.why
    assert "*(y + i) = __ldg(x + i) * 2.0f + __ldg(x);" in outcome.rewrites[0].source
    assert _rule("block-size", source).applicable
    if shutil.which("nvcc"):
        from nvcc_check import compiles

        compiles(outcome.rewrites[0].source, tmp_path)


def test_ldg_keeps_a_macro_expanded_on_both_sides_of_the_read() -> None:
    """``NY`` expands before and after ``x[i * NY + j]`` on its line: the insertions are placed by the
    tokens around them, so the candidate keeps ``NY`` as written (a literal 64 would be a problem size the
    original does not hold)."""
    source = "#define NY 64\n" + _kernel("    int i = threadIdx.y, j = threadIdx.x;\n"
                                       "    if (i < n) y[i * NY + j] = x[i * NY + j] - x[(i + 1) * NY + j] + (float)NY;")
    outcome = _rule("ldg", source)
    assert outcome.applicable, outcome.why
    rewritten = outcome.rewrites[0].source
    assert "y[i * NY + j] = __ldg(&x[i * NY + j]) - __ldg(&x[(i + 1) * NY + j]) + (float)NY;" in rewritten, rewritten
    assert "64 +" not in rewritten and "expanded" not in outcome.rewrites[0].description


def test_register_accumulate_keeps_a_macro_inside_the_element_it_keeps() -> None:
    """The element ``y[i * NY + j]`` is replaced in the loop and loaded and stored around it: both in
    the user's text, so the candidate keeps ``NY`` (PolyBench's gramschmidt writes ``r[k*NJ + j]``)."""
    source = "#define NY 64\n" + _kernel("    int i = threadIdx.y, j = threadIdx.x;\n"
                                       "    for (int k = 0; k < n; ++k) {\n"
                                       "        y[i * NY + j] += x[k * NY + j];\n"
                                       "    }")
    outcome = _rule("register-accumulate", source)
    assert outcome.applicable, outcome.why
    rewritten = outcome.rewrites[0].source
    assert "{ float kl_acc0 = y[i * NY + j];" in rewritten, rewritten
    assert "kl_acc0 += x[k * NY + j];" in rewritten and "y[i * NY + j] = kl_acc0; }" in rewritten, rewritten
    assert "64 +" not in rewritten and "expanded" not in outcome.rewrites[0].description
    typed = _rule("register-accumulate", "#define real float\n" + source.replace("float* y", "real* y"))
    assert "{ real kl_acc0 = y[i * NY + j];" in typed.rewrites[0].source, typed.rewrites[0].source


def test_unroll_only_fixed_trip_loops() -> None:
    fixed = _kernel("    float a = 0.0f;\n    for (int k = 0; k < 8; ++k) {\n        a += x[k];\n    }\n    y[0] = a;")
    outcome = _rule("pragma-unroll", fixed)
    assert outcome.applicable and "#pragma unroll\n    for (int k = 0; k < 8; ++k)" in outcome.rewrites[0].source
    assert not _rule("pragma-unroll", fixed.replace("k < 8", "k < n")).applicable
    already = fixed.replace("    for (int k", "    #pragma unroll\n    for (int k")
    assert not _rule("pragma-unroll", already).applicable


def test_launch_bounds_needs_a_known_block_and_none_present() -> None:
    outcome = _rule("launch-bounds", ELEMENTWISE)
    assert outcome.applicable and "__launch_bounds__(256) k(" in outcome.rewrites[0].source
    assert not _rule("launch-bounds", ELEMENTWISE, spec=None).applicable
    with_launch = ELEMENTWISE + "void run(int n, const float* x, float* y) { k<<<(n + 127) / 128, 128>>>(n, x, y); }\n"
    assert "__launch_bounds__(128)" in _rule("launch-bounds", with_launch, spec=None).rewrites[0].source
    assert not _rule("launch-bounds", ELEMENTWISE.replace("__global__ void", "__global__ void __launch_bounds__(256)")).applicable


def test_grid_stride_ends_one_element_where_the_original_returned() -> None:
    returns = _kernel("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) {\n        if (x[i] < 0.0f) return;\n        y[i] = x[i];\n    }")
    outcome = _rule("grid-stride", returns)
    assert outcome.applicable, outcome.why
    body = outcome.rewrites[0].source
    assert "for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int)blockDim.x * gridDim.x)" in body
    assert "if (x[i] < 0.0f) continue;" in body and "return" not in body
    in_loop = returns.replace("if (x[i] < 0.0f) return;", "for (int k = 0; k < 2; ++k) if (x[i] < k) return;")
    outcome = _rule("grid-stride", in_loop)
    assert not outcome.applicable and "sits in a loop" in outcome.why


def test_grid_stride_gives_a_body_that_changes_the_index_a_loop_variable_of_its_own() -> None:
    changes = _kernel("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) {\n        y[i] = x[i];\n        i += 1;\n    }")
    outcome = _rule("grid-stride", changes)
    assert outcome.applicable, outcome.why
    body = outcome.rewrites[0].source
    assert "kl_e < n; kl_e +=" in body and "int i = kl_e;" in body and "i += 1;" in body


def test_grid_stride_refuses_what_the_threads_do_differently() -> None:
    lane = _kernel("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = x[i] + threadIdx.x;")
    outcome = _rule("grid-stride", lane)
    assert not outcome.applicable and "`x[i] + threadIdx.x` at line 4 reads the thread or block index other than as the " \
        "global index" in outcome.why
    unguarded = _kernel("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    y[i] = x[i];")
    assert "no guard `i < N`" in _rule("grid-stride", unguarded).why
    width = _kernel("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = x[i] * (blockDim.x * gridDim.x);")
    assert not _rule("grid-stride", width).applicable


SPEC_2D = {
    "kernel": "k",
    "params": [
        {"name": "out", "array": "float32", "size": "rows*cols", "init": "zeros", "role": "out"},
        {"name": "in", "array": "float32", "size": "rows*cols", "init": "uniform(-1,1)", "role": "in"},
        {"name": "rows", "scalar": "int32", "value": 512},
        {"name": "cols", "scalar": "int32", "value": 256},
    ],
    "grid": ["(cols+31)/32", "(rows+7)/8", "1"],
    "block": [32, 8, 1],
}
COPY_2D = _kernel("    int c = blockIdx.x * blockDim.x + threadIdx.x;\n    int r = blockIdx.y * blockDim.y + threadIdx.y;\n"
                  "    if (r < rows && c < cols) {\n        out[r * cols + c] = in[r * cols + c];\n    }",
                  "float* out, const float* in, int rows, int cols")


def test_transpose_and_index_swap_refuse_a_coalesced_copy() -> None:
    assert not _rule("shared-tile-transpose", COPY_2D, SPEC_2D).applicable
    assert not _rule("index-swap", COPY_2D, SPEC_2D).applicable
    transpose = COPY_2D.replace("out[r * cols + c]", "out[c * rows + r]")
    assert _rule("shared-tile-transpose", transpose, SPEC_2D).applicable
    assert _rule("index-swap", transpose, SPEC_2D).applicable
    # Any unit stride along y: the rows written backwards (`rows - 1 - r`) are still consecutive elements.
    backwards = COPY_2D.replace("out[r * cols + c]", "out[c * rows + (rows - 1 - r)]")
    outcome = _rule("shared-tile-transpose", backwards, SPEC_2D)
    assert outcome.applicable, outcome.why
    assert "out[32 * blockIdx.x * rows - 32 * blockIdx.y + rows * (threadIdx.y + kl_j) + rows - threadIdx.x - 1]" in \
        outcome.rewrites[0].source


SPEC_SUM = {
    "kernel": "k",
    "params": [
        {"name": "n", "scalar": "int32", "value": 100000},
        {"name": "x", "array": "float32", "size": "n", "init": "uniform(0,1)", "role": "in"},
        {"name": "y", "array": "float32", "size": "1", "init": "zeros", "role": "out"},
    ],
    "grid": ["(n+255)/256", "1", "1"],
    "block": [256, 1, 1],
    "tolerance": {"rtol": 1e-4, "atol": 1e-3},
}
ATOMIC_SUM = _kernel("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) {\n        atomicAdd(&y[0], x[i]);\n    }")


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
def test_atomic_sum_becomes_one_atomic_per_block(tmp_path: Path) -> None:
    outcome = _rule("atomic-to-block-reduce", ATOMIC_SUM, SPEC_SUM)
    assert outcome.applicable, outcome.why
    source = outcome.rewrites[0].source
    assert source.count("atomicAdd(") == 1 and "__shfl_xor_sync" in source
    assert _compile(tmp_path, source).returncode == 0


def test_one_atomic_per_block_refuses_thread_dependent_addresses_and_odd_blocks() -> None:
    assert not _rule("atomic-to-block-reduce", ATOMIC_SUM.replace("&y[0]", "&y[i % 4]"), SPEC_SUM).applicable
    assert not _rule("atomic-to-block-reduce", ATOMIC_SUM, dict(SPEC_SUM, block=[48, 1, 1])).applicable


HIST = _kernel("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) {\n        atomicAdd(&h[d[i] & 63], 1u);\n    }",
               "int n, const int* d, unsigned int* h")


SPEC_HIST = {
    "kernel": "k",
    "params": [
        {"name": "n", "scalar": "int32", "value": 100000},
        {"name": "d", "array": "int32", "size": "n", "init": "randint(0,1000)", "role": "in"},
        {"name": "h", "array": "uint32", "size": "64", "init": "zeros", "role": "inout"},
    ],
    "grid": ["(n+255)/256", "1", "1"],
    "block": [256, 1, 1],
}


def test_histogram_needs_a_bounded_bin_index() -> None:
    outcome = _rule("shared-privatize", HIST, SPEC_HIST)
    assert outcome.applicable and "at most 64 targets per block" in outcome.why
    # No bound from the analysis: the spec's size of the bins sizes the copy (an in-bounds original reaches no other).
    outcome = _rule("shared-privatize", HIST.replace("d[i] & 63", "d[i]"), SPEC_HIST)
    assert outcome.applicable and "at most 64 targets per block" in outcome.why
    # A block's own window of the bins: the spec bounds the whole array, not the window.
    outcome = _rule("shared-privatize", HIST.replace("d[i] & 63", "64 * blockIdx.x + d[i]"), SPEC_HIST)
    assert not outcome.applicable and "has no bound" in outcome.why
    # Any mask bounds the bins (not only a power of two minus one); an early return leaves the body for the merge.
    assert "at most 63 targets" in _rule("shared-privatize", HIST.replace("d[i] & 63", "d[i] & 62"), SPEC_HIST).why
    early = HIST.replace("    if (i < n) {\n", "    if (i >= n) return;\n    {\n")
    assert _rule("shared-privatize", early, SPEC_HIST).applicable


def test_a_block_per_row_refuses_what_a_warp_per_row_refuses() -> None:
    source, spec = _example("softmax")
    carried = source.replace("float m = -INFINITY;", "float m = -INFINITY;\n    float prev = 0.0f;").replace(
        "m = fmaxf(m, x[c]);", "m = fmaxf(m, x[c] - prev);\n        prev = x[c];")
    outcome = next(o for o in evaluate(carried, spec.kernel, spec) if o.rule == "block-per-row")
    assert not outcome.applicable and "carries prev" in outcome.why
    data = spec.to_json()
    data["block"] = [96, 1, 1]
    outcome = next(o for o in evaluate(source, spec.kernel, parse_spec(data)) if o.rule == "block-per-row")
    assert not outcome.applicable and "power of two" in outcome.why


def test_matmul_threads_walk_the_rows_of_c() -> None:
    _, _, outcomes = _outcomes("matmul")
    assert outcomes["index-swap"].applicable


def test_the_tree_per_tile_refuses_an_odd_block() -> None:
    source, spec = _example("reduction")
    data = spec.to_json()
    data["block"] = [100, 1, 1]
    outcome = next(o for o in evaluate(source, spec.kernel, parse_spec(data)) if o.rule == "tree-to-registers")
    assert not outcome.applicable and "power of two" in outcome.why


def test_rules_refuse_on_syntax_errors() -> None:
    broken = ELEMENTWISE.replace("if (i < n) {", "if (i < n {")
    assert not any(o.applicable for o in evaluate(broken, "k", parse_spec(SPEC_1D)))


def test_generator_follows_the_knowledge_base_order() -> None:
    source, spec = _example("streaming")
    hints = tuple(TechniqueHint(name, "", 1.0, 0.5) for name in ("launch-bounds", "restrict-const"))
    request = OptimizeRequest(source, "s.cu", spec.kernel, spec.to_json(), techniques=hints)
    candidates = list(RuleGenerator().generate(request))
    assert [c.technique for c in candidates[:2]] == ["launch-bounds", "restrict-const"]
    assert all(c.generator.startswith("rule:") and c.kernel == spec.kernel for c in candidates)
    assert len({(c.source, str(c.launch_override)) for c in candidates}) == len(candidates)


def test_apply_raises_when_preconditions_fail() -> None:
    from kernel_lsp.core.rules.base import RuleContext

    index = build_index(COPY_2D)
    ctx = RuleContext(COPY_2D, index, index.function("k"), parse_spec(SPEC_2D))
    with pytest.raises(ValueError, match="preconditions"):
        rule_by_name("shared-tile-transpose").apply(ctx)


def _block_sizes(source: str, spec: dict) -> list[int]:
    return sorted(r.launch_override["block"][0] for r in _rule("block-size", source, spec).rewrites)


def test_block_size_never_adds_threads_that_pass_the_guard() -> None:
    """PolyBench adi: one block of 256 threads over n = 1024 rows. Rounding the grid up to one block of
    512 threads would make rows 256..511 computed too (the harness saw 221738 wrong elements): only
    sizes that divide the 256 threads exactly stay."""
    fixed = dict(SPEC_1D, grid=[1, 1, 1], variants=[{"n": 4096}])
    assert _block_sizes(ELEMENTWISE, fixed) == [128]


def test_block_size_without_a_guard_keeps_the_thread_count_exact() -> None:
    """SHOC md: no bounds check at all, the grid is n / 256 blocks: a larger block rounds up past the
    arrays' end at some size (the harness saw an illegal address with 1024, and with 512 at n = 12287, a
    size the spec does not name: 47 blocks of 256), so only blocks that divide 256 are offered, even
    where the spec's own sizes divide evenly."""
    unguarded = _kernel("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    float v = x[i];\n    if (v < 0.0f) v = -v;\n    y[i] = v;")
    spec = dict(SPEC_1D, grid=["n/256", "1", "1"], params=[dict(SPEC_1D["params"][0], value=256 * 600), *SPEC_1D["params"][1:]],
                variants=[{"n": 256 * 1002}])
    assert _block_sizes(unguarded, spec) == [128]


def test_block_size_rounds_up_where_the_original_threads_reach_the_guard() -> None:
    assert _block_sizes(ELEMENTWISE, SPEC_1D) == [128, 512, 1024]


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
def test_restrict_const_keeps_a_parameter_copied_to_a_non_const_pointer_non_const(tmp_path: Path) -> None:
    """`float *p = in + base;` would not compile with `in` const: it stays non-const, the rest is qualified."""
    source = _kernel("    float *p = x + 1;\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = p[i];",
                     "int n, float* x, float* y")
    outcome = _rule("restrict-const", source)
    assert outcome.applicable and "x copied to non-const pointers, kept non-const" in outcome.why
    rewritten = outcome.rewrites[0].source
    assert "float* __restrict__ x" in rewritten and "const float" not in rewritten
    assert _compile(tmp_path, rewritten).returncode == 0


TEMPLATED = """template <typename T>
__global__ void k(int n, T* x, T* y);

template <typename T>
__global__ void k(int n, T* x, T* y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2 * x[i];
}

template __global__ void k<float>(int n, float* x, float* y);
"""


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
def test_restrict_const_changes_the_declarations_and_instantiations_with_the_definition(tmp_path: Path) -> None:
    """``const`` is part of a parameter's type: the forward declaration and the explicit instantiation get it
    too (without it the instantiation would name another function); ``__restrict__`` only on the definition."""
    outcome = _rule("restrict-const", TEMPLATED)
    assert outcome.applicable, outcome.why
    rewritten = outcome.rewrites[0].source
    assert "__global__ void k(int n, const T* x, T* y);" in rewritten
    assert "__global__ void k(int n, const T* __restrict__ x, T* __restrict__ y)" in rewritten
    assert "template __global__ void k<float>(int n, const float* x, float* y);" in rewritten
    assert _compile(tmp_path, rewritten).returncode == 0
    assert _compile(tmp_path, rewritten.replace("<float>(int n, const float* x", "<float>(int n, float* x")).returncode != 0


def test_restrict_const_leaves_const_off_where_a_macro_instantiates_the_kernel() -> None:
    by_macro = TEMPLATED.replace("template __global__ void k<float>(int n, float* x, float* y);",
                                 "#define INSTANTIATE(T) template __global__ void k<T>(int n, T* x, T* y)\nINSTANTIATE(float);")
    outcome = _rule("restrict-const", by_macro)
    assert outcome.applicable and "x declared again in a header or by a macro" in outcome.why
    rewritten = outcome.rewrites[0].source
    assert "const" not in rewritten
    assert "void k(int n, T* __restrict__ x, T* __restrict__ y)" in rewritten


def test_block_sizes_change_launch_bounds_with_the_block() -> None:
    bounded = ELEMENTWISE.replace("__global__ void k(", "__global__ void __launch_bounds__(256) k(")
    rewrites = _rule("block-size", bounded).rewrites
    assert sorted(r.launch_override["block"][0] for r in rewrites) == [128, 512, 1024]
    for r in rewrites:
        assert f"__launch_bounds__({r.launch_override['block'][0]}) k(" in r.source


def test_applying_a_block_size_edits_the_host_launch_and_rounds_its_grid_up() -> None:
    """"Apply" launches the verified block from the host too. 1,300 elements run on 6 blocks of 256 threads
    (1,536); in blocks of 1,024 the grid must round up to 2 (2,048 threads, the guard stops the extra ones),
    as in the launch the harness verified: 1,536 / 1,024 = 1 block would leave elements 1,024..1,299 alone."""
    from kernel_lsp.core.candidates import Candidate
    from kernel_lsp.core.transforms.launch_edit import applied_source

    source = ELEMENTWISE + "void host(int n, const float* x, float* y) { k<<<(n + 255) / 256, 256>>>(n, x, y); }\n"
    spec = dict(SPEC_1D, grid=["ceil_div(n,256)", 1, 1], variants=[{"n": 1300}])
    rewrites = {r.block: r for r in _rule("block-size", source, spec).rewrites}
    assert sorted(rewrites) == [(128, 1, 1), (512, 1, 1), (1024, 1, 1)]
    rewrite = rewrites[(1024, 1, 1)]
    candidate = Candidate("k", rewrite.source, "block-size-tuning", "rule:block-size[block=1024]", rewrite.description,
                          rewrite.launch_override, block=rewrite.block)
    host = applied_source(candidate, source)
    assert host.instruction is None and len(host.lines) == 1
    assert ("k<<<dim3((dim3((n + 255) / 256).x * dim3(256).x + 1023) / 1024, dim3((n + 255) / 256).y * dim3(256).y, "
            "dim3((n + 255) / 256).z * dim3(256).z), dim3(1024, 1, 1)>>>(n, x, y);") in host.source
    resolved = with_candidate_launch(parse_spec(spec), rewrite.launch_override).resolve(0)
    assert resolved.candidate.grid[0] == (6 * 256 + 1023) // 1024 == 2


def test_index_swap_refuses_a_helper_that_reads_the_thread_index() -> None:
    helper = "__device__ int col_of() { return blockIdx.x * blockDim.x + threadIdx.x; }\n" + COPY_2D.replace(
        "int c = blockIdx.x * blockDim.x + threadIdx.x;", "int c = col_of();").replace("out[r * cols + c]", "out[c * rows + r]")
    outcome = _rule("index-swap", helper, SPEC_2D)
    assert not outcome.applicable and "the helper `col_of` reads the thread or block index" in outcome.why


def test_the_transposing_tile_raises_the_launch_bounds_to_its_block() -> None:
    transpose = COPY_2D.replace("out[r * cols + c]", "out[c * rows + r]").replace(
        "__global__ void k(", "__global__ void __launch_bounds__(128) k(")
    spec = dict(SPEC_2D, block=[16, 8, 1], grid=["(cols+15)/16", "(rows+7)/8", "1"])
    (rewrite,) = _rule("shared-tile-transpose", transpose, spec).rewrites
    assert "__launch_bounds__(256) k(" in rewrite.source and rewrite.launch_override["block"] == [32, 8, 1]


def test_grid_stride_keeps_per_element_state_inside_the_loop() -> None:
    """A local declared before the index and assigned after it belongs to each element: the whole body goes
    inside the loop (it would otherwise carry over from one element to the next)."""
    source = _kernel("    float acc = 0.0f;\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                     "    if (i < n) {\n        acc += x[i];\n        y[i] = acc;\n    }")
    outcome = _rule("grid-stride", source)
    assert outcome.applicable, outcome.why
    body = outcome.rewrites[0].source.split("{", 1)[1]
    assert body.index("for (") < body.index("float acc = 0.0f;")


# A causal row: the first loop runs a thread's own prefix (its store by every lane of a group when the
# loop is not split), the second normalises the whole row.
CAUSAL = """
__global__ void causal(float* out, const float* in, int rows, int T) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) {
        int t = r % T;
        const float* a = in + r * T;
        float* o = out + r * T;
        float s = 0.0f;
        for (int j = 0; j <= t; j++) { float e = expf(a[j]); s += e; o[j] = e; }
        float inv = 1.0f / s;
        for (int j = 0; j < T; j++) { if (j <= t) o[j] *= inv; else o[j] = 0.0f; }
    }
}
"""
SPEC_CAUSAL = {
    "kernel": "causal",
    "params": [
        {"name": "out", "array": "float32", "size": "rows*T", "init": "zeros", "role": "out"},
        {"name": "in", "array": "float32", "size": "rows*T", "init": "uniform(-1,1)", "role": "in"},
        {"name": "rows", "scalar": "int32", "value": 2048},
        {"name": "T", "scalar": "int32", "value": 2048},
    ],
    "grid": ["(rows+255)/256", "1", "1"],
    "block": [256, 1, 1],
}


def test_a_store_by_every_lane_and_a_split_loops_store_need_a_reduction_between() -> None:
    # Block per row splits only the long normalising loop: the prefix loop's stores, made by every thread
    # of the block, could land after a faster warp normalised the element (seen on the GPU as two runs
    # disagreeing). A warp per row splits both, and the sum's shuffles order them.
    block = _rule("block-per-row", CAUSAL, SPEC_CAUSAL, "causal")
    assert not block.applicable and "`o[j]` stored at line 9 by every lane and `o[j]` stored at line 11 in a split loop" in block.why
    assert _rule("warp-per-row", CAUSAL, SPEC_CAUSAL, "causal").applicable


def test_a_macro_for_restrict_in_the_signature_leaves_the_rules_working():
    """SHOC s3d writes ``#define RESTRICT __restrict__`` and ``const float* RESTRICT T``: the raw text does not parse
    there, its expansion does, and the rules read the expansion."""
    source = """#define RESTRICT __restrict__
__global__ void scale(const float* RESTRICT t, float* RESTRICT out, float c) {
    out[threadIdx.x + blockIdx.x * blockDim.x] = t[threadIdx.x + blockIdx.x * blockDim.x] * c;
}
"""
    spec = {"kernel": "scale", "params": [{"name": "t", "array": "float32", "size": "65536", "init": "uniform(0,1)", "role": "in"},
                                          {"name": "out", "array": "float32", "size": "65536", "init": "zeros", "role": "out"},
                                          {"name": "c", "scalar": "float32", "value": 1.0}],
            "grid": [512, 1, 1], "block": [128, 1, 1]}
    outcomes = {o.rule: o for o in evaluate(source, "scale", spec)}
    assert not any("syntax errors" in o.why for o in outcomes.values())
    assert outcomes["ldg"].applicable, outcomes["ldg"].why
    assert "RESTRICT" in outcomes["ldg"].rewrites[0].source


def test_a_parsed_spec_in_the_request_serves_sequences_that_relaunch():
    """The generator takes the request's spec parsed as well as in its JSON form (a relaunching first step's
    sequences rebuild it with the new launch)."""
    folder = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus" / "rodinia_lud_internal"
    source, data = (folder / "kernel.cu").read_text(), json.loads((folder / "spec.json").read_text())
    path = str(folder / "kernel.cu")
    as_json = [c.generator for c in RuleGenerator().generate(OptimizeRequest(source=source, path=path, kernel=data["kernel"], spec=data))]
    parsed = [c.generator for c in RuleGenerator().generate(OptimizeRequest(source=source, path=path, kernel=data["kernel"],
                                                                            spec=parse_spec(data)))]
    assert parsed == as_json and parsed


COPY_2D_MAIN = r"""
int main() {
  const int rows = 45, cols = 70;
  std::vector<float> in(rows * cols), out(rows * cols, 9.0f);
  for (int i = 0; i < rows * cols; i++) in[i] = (float)((i * 29) % 31) - 15.0f;
  kl_launch({GX, GY, 1}, {BX, BY, 1}, [&] { k(out.data(), in.data(), rows, cols); });
  for (float v : out) printf("%a\n", v);
}
"""


def test_block_shapes_of_a_two_dimensional_kernel_cover_the_same_elements(tmp_path) -> None:
    """A 2-D kernel tries other block shapes, the grid rounded up per axis (the guard stops the extra threads):
    at 45 x 70 elements each shape's launch computes exactly what 32 x 8 blocks did."""
    spec = dict(SPEC_2D, variants=[{"rows": 45, "cols": 70}])
    outcome = _rule("block-size", COPY_2D, spec)
    assert outcome.applicable, outcome.why
    assert "guard on the global y index `< rows`" in outcome.why
    assert [r.block for r in outcome.rewrites] == [(64, 4, 1), (128, 2, 1), (32, 4, 1)]
    for rewrite in outcome.rewrites:
        assert rewrite.launch_override["grid"][:2] == [f"(((cols+31)/32)*32+{rewrite.block[0] - 1})/{rewrite.block[0]}",
                                                       f"(((rows+7)/8)*8+{rewrite.block[1] - 1})/{rewrite.block[1]}"]
    # "Apply" reshapes the host's launch the same way, per axis in its own terms.
    from kernel_lsp.core.candidates import Candidate
    from kernel_lsp.core.transforms.launch_edit import applied_source

    host = COPY_2D + "void run(float* o, const float* i, int rows, int cols) {\n  dim3 grid((cols + 31) / 32, (rows + 7) / 8);\n" \
                     "  k<<<grid, dim3(32, 8)>>>(o, i, rows, cols);\n}\n"
    wide = next(r for r in _rule("block-size", host, spec).rewrites if r.block == (64, 4, 1))
    edit = applied_source(Candidate("k", wide.source, "block-size-tuning", "rule:block-size[block=64x4]", wide.description,
                                    wide.launch_override, block=wide.block), host)
    assert edit.instruction is None and len(edit.lines) == 1
    assert ("k<<<dim3((dim3(grid).x * dim3(dim3(32, 8)).x + 63) / 64, (dim3(grid).y * dim3(dim3(32, 8)).y + 3) / 4, "
            "dim3(grid).z * dim3(dim3(32, 8)).z), dim3(64, 4, 1)>>>(o, i, rows, cols);") in edit.source
    if shutil.which("nvcc"):
        from nvcc_check import compiles
        compiles(edit.source, tmp_path / "host")
    if shutil.which("g++"):
        from cpu_cuda import run_on_cpu

        def run(source: str, block: tuple[int, int, int], name: str) -> str:
            bx, by = block[:2]
            main = COPY_2D_MAIN.replace("GX", str((((70 + 31) // 32) * 32 + bx - 1) // bx)).replace(
                "GY", str((((45 + 7) // 8) * 8 + by - 1) // by)).replace("BX", str(bx)).replace("BY", str(by))
            return run_on_cpu(source, main, tmp_path, name)

        before = run(COPY_2D, (32, 8, 1), "copy")
        for rewrite in outcome.rewrites:
            assert run(rewrite.source, rewrite.block, f"copy{rewrite.variant.replace('=', '')}") == before


def test_block_shapes_of_a_two_dimensional_kernel_refusals() -> None:
    # No guard along y: only shapes whose rows divide the original's 4 keep the threads per column.
    unguarded = COPY_2D.replace("r < rows && c < cols", "c < cols")
    short = dict(SPEC_2D, grid=["(cols+31)/32", "(rows+3)/4", "1"], block=[32, 4, 1])
    assert [r.block for r in _rule("block-size", COPY_2D, short).rewrites] == [(64, 4, 1), (128, 2, 1), (32, 8, 1)]
    assert [r.block for r in _rule("block-size", unguarded, short).rewrites] == [(64, 4, 1), (128, 2, 1)]
    ignores_y = COPY_2D.replace("int r = blockIdx.y * blockDim.y + threadIdx.y;", "int r = 0;")
    outcome = _rule("block-size", ignores_y, SPEC_2D)
    assert not outcome.applicable and "does not read its y index" in outcome.why
    three_d = dict(SPEC_2D, grid=["(cols+31)/32", "(rows+7)/8", "2"])
    outcome = _rule("block-size", COPY_2D, three_d)
    assert not outcome.applicable and "neither 1-D nor 2-D" in outcome.why
