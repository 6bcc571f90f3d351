"""Load batching: a strided load loop run ``U`` iterations at a time while ``U`` remain. Where it applies,
each refusal's missing fact, the candidates compiled by nvcc, and the rewritten loop run as C on the
host beside the original: the same iterations in the same order for every thread and count."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec
from nvcc_check import compiles

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "benchmarks" / "corpus"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


def outcome(source: str, kernel: str = "total", spec: dict | None = None):
    return evaluate(source, kernel, parse_spec(spec) if spec else None, [rule_by_name("load-batch")])[0]


#: The kernels' launch with each pointer its own allocation: a body that stores is batched only then.
SPEC = {"kernel": "total", "grid": [8, 1, 1], "block": [128, 1, 1],
        "params": [{"name": "x", "array": "int64", "size": "count", "init": "randint(0,9)", "role": "inout"},
                   {"name": "out", "array": "int64", "size": "1024", "init": "zeros", "role": "out"},
                   {"name": "count", "scalar": "int64", "value": 1 << 20}]}


GRID_STRIDE = """
__global__ void total(const long long* x, long long* out, size_t count) {
    size_t index = threadIdx.x + blockDim.x * blockIdx.x;
    size_t stride = blockDim.x * gridDim.x;
    long long acc = 0;
    for (size_t i = index; i < count; i += stride) {
        acc = acc * 31 + x[i];
    }
    out[index] = acc;
}
"""
# Two loops, a unit step, a macro in the body and a counter declared before its loop.
TWO_LOOPS = """
#define TAKE(a, k) (a)[k]
__global__ void total(const long long* x, long long* out, size_t count) {
    int t = threadIdx.x + blockDim.x * blockIdx.x;
    long long acc = 0, other = 7;
    int j;
    for (j = t; j < (int)count; ++j)
        acc = acc * 3 + TAKE(x, j);
    for (int k = threadIdx.x; k < (int)count; k += 32) {
        long long v = x[k] ^ (long long)k;
        other = other * 5 + v;
    }
    out[t] = acc + other + j;
}
"""
# Tests that let the counter reach the bound or name it first, and steps written out as sums.
BOUNDS = """
__global__ void total(const long long* x, long long* out, size_t count) {
    int index = threadIdx.x + blockDim.x * blockIdx.x;
    long long acc = 0, other = 1;
    for (int i = index; i <= (int)count - 1; i = i + 12)
        acc = acc * 31 + x[i];
    for (int k = index; ((int)count > k); k = 5 + k)
        other = other * 7 + x[k];
    out[index] = acc + other;
}
"""
# A search: the first element at least as large as the thread's key; the counter read after the loop.
SEARCH = """
__global__ void total(const long long* x, long long* out, size_t count) {
    int t = threadIdx.x + blockDim.x * blockIdx.x;
    long long want = (long long)(t * 37 % 1000) - 500;
    int found = -1;
    int k;
    for (k = 0; k < (int)count; ++k) {
        if (x[k] >= want) {
            found = k;
            break;
        }
    }
    out[t] = found * 100000LL + k + x[0];
}
"""
# The same search as a ``while`` loop whose body steps its counter after the test that may leave.
WHILE_SEARCH = SEARCH.replace("    int k;\n    for (k = 0; k < (int)count; ++k) {\n", "    int k = 0;\n    while (k < (int)count) {\n").replace(
    "            break;\n        }\n    }\n", "            break;\n        }\n        ++k;\n    }\n")
# A while loop whose body steps its counter between other statements, a second counter beside it.
WHILE = """
__global__ void total(const long long* x, long long* out, size_t count) {
    int index = threadIdx.x + blockDim.x * blockIdx.x;
    int i = index;
    long long acc = 0;
    unsigned n = 0;
    while (i < (int)count) {
        acc = acc * 31 + x[i];
        i += blockDim.x * gridDim.x;
        acc ^= (long long)i;
        n++;
    }
    out[index] = acc + n;
}
"""

#: The rewritten kernels compiled as C: the launch dimensions are globals the driver sets.
DRIVER = r"""
#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
struct kl_dim { unsigned x, y, z; };
static struct kl_dim threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define total total_original
#include "original.c"
#undef total
#define total total_batched
#include "batched.c"
#undef total
int main(void) {
    static long long x[1000], a[64], b[64];
    for (int i = 0; i < 1000; ++i) x[i] = (i * 7919) % 1009 - 500;
    const int counts[] = {0, 1, 3, 7, 8, 9, 31, 63, 64, 65, 127, 511, 1000};
    blockDim.x = 4; gridDim.x = 3; blockDim.y = blockDim.z = gridDim.y = gridDim.z = 1;
    for (unsigned c = 0; c < sizeof counts / sizeof counts[0]; ++c) {
        for (int t = 0; t < 64; ++t) a[t] = b[t] = -1;
        for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x)
            for (threadIdx.x = 0; threadIdx.x < blockDim.x; ++threadIdx.x) {
                total_original(x, a, (size_t)counts[c]);
                total_batched(x, b, (size_t)counts[c]);
            }
        for (int t = 0; t < 64; ++t)
            if (a[t] != b[t]) { printf("count %d thread %d: %lld != %lld\n", counts[c], t, a[t], b[t]); return 1; }
    }
    puts("same");
    return 0;
}
"""


def run_beside(original: str, batched: str, folder: Path, driver: str = DRIVER) -> None:
    """The original and the batched kernel run on the host for every thread of a 3 x 4 launch at counts
    around the batch sizes; they must leave the same output."""
    folder.mkdir(exist_ok=True)
    (folder / "original.c").write_text(original)
    (folder / "batched.c").write_text(batched)
    (folder / "driver.c").write_text(driver)
    build = subprocess.run(["cc", "-std=c99", "-o", str(folder / "driver"), str(folder / "driver.c")],
                           capture_output=True, text=True, cwd=folder, timeout=60)
    assert build.returncode == 0, build.stderr
    ran = subprocess.run([str(folder / "driver")], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.strip() == "same", ran.stdout


@needs_cc
@pytest.mark.parametrize("source", [GRID_STRIDE, TWO_LOOPS, BOUNDS, WHILE, SEARCH, WHILE_SEARCH],
                         ids=["grid-stride", "two-loops", "bounds", "while", "search", "while-search"])
def test_batched_loops_run_the_same_iterations_in_the_same_order(source, tmp_path):
    found = outcome(source)
    assert found.applicable, found.why
    assert [rw.variant for rw in found.rewrites] == ["batch=4", "batch=8"]
    for k, rw in enumerate(found.rewrites):
        assert "#pragma unroll" in rw.source and "kl_u <" in rw.source
        run_beside(source, rw.source, tmp_path / str(k))


# An exclusive scan along a strided loop, in place: each iteration loads its element, then stores over it.
SCAN = """
__global__ void total(long long* x, long long* out, size_t count) {
    size_t index = threadIdx.x + blockDim.x * blockIdx.x;
    size_t stride = blockDim.x * gridDim.x;
    long long sum = 0;
    for (size_t i = index; i < count; i += stride) {
        long long v = x[i];
        x[i] = sum;
        sum += v * 3 + (long long)i;
    }
    out[index] = sum;
}
"""
SCAN_DRIVER = DRIVER.replace("static long long x[1000], a[64], b[64];", "static long long x[1000], xa[1000], xb[1000], a[64], b[64];") \
    .replace("for (int t = 0; t < 64; ++t) a[t] = b[t] = -1;",
             "for (int t = 0; t < 64; ++t) a[t] = b[t] = -1;\n        for (int i = 0; i < 1000; ++i) xa[i] = xb[i] = x[i];") \
    .replace("total_original(x, a,", "total_original(xa, a,").replace("total_batched(x, b,", "total_batched(xb, b,") \
    .replace("    puts(\"same\");", "        for (int i = 0; i < 1000; ++i)\n"
             "            if (xa[i] != xb[i]) { printf(\"count %d element %d\\n\", counts[c], i); return 1; }\n    }\n    puts(\"same\");") \
    .replace("return 1; }\n    }\n        for (int i", "return 1; }\n        for (int i")


@needs_cc
def test_a_body_that_stores_over_what_it_loaded_has_its_loads_made_a_batch_ahead(tmp_path):
    """Each iteration's store lands on the element it loaded itself: no later iteration loads it, so the batch's
    loads move ahead of the earlier iterations' stores. Run on the host beside the original, the array and
    the sums come out the same."""
    assert "if (xa[i] != xb[i])" in SCAN_DRIVER and "total_batched(xb, b," in SCAN_DRIVER
    found = outcome(SCAN, spec=SPEC)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "kl_load0[kl_u] = x[(i + kl_u * (stride))];" in source and "long long v = kl_load0[kl_u];" in source
    assert "kl_left" not in source
    for k, rw in enumerate(found.rewrites):
        run_beside(SCAN, rw.source, tmp_path / str(k), SCAN_DRIVER)


@needs_cc
def test_a_while_body_that_stores_has_its_loads_made_a_batch_ahead(tmp_path):
    """The loop's own test guards its body's loads (lavaMD's ``while (wtx < N) { s[wtx] = in[wtx]; wtx += 128; }``);
    only a condition inside the loop keeps a load where it is."""
    looped = SCAN.replace("    for (size_t i = index; i < count; i += stride) {", "    size_t i = index;\n    while (i < count) {") \
        .replace("        sum += v * 3 + (long long)i;\n", "        sum += v * 3 + (long long)i;\n        i += stride;\n")
    assert "while (i < count)" in looped and "i += stride;" in looped
    found = outcome(looped, spec=SPEC)
    assert found.applicable, found.why
    assert "= x[(i + kl_u * (stride))];" in found.rewrites[0].source
    for k, rw in enumerate(found.rewrites):
        run_beside(looped, rw.source, tmp_path / str(k), SCAN_DRIVER)


UPDATE = SCAN.replace("long long v = x[i];\n        x[i] = sum;\n        sum += v * 3 + (long long)i;",
                      "x[i] += (long long)i * 7 + sum;\n        sum ^= (long long)i;")


@needs_cc
@pytest.mark.parametrize("source,update", [
    (UPDATE, "x[i] = kl_load0[kl_u] + ((long long)i * 7 + sum);"),
    (UPDATE.replace("x[i] += (long long)i * 7 + sum;", "x[i]++;"), "x[i] = kl_load0[kl_u] + 1;"),
    (UPDATE.replace("x[i] += (long long)i * 7 + sum;", "x[i] -= x[i] / 2 + sum;"), "x[i] = kl_load0[kl_u] - (kl_load0[kl_u] / 2 + sum);"),
], ids=["compound", "increment", "reads-itself"])
def test_an_element_updated_in_place_is_loaded_a_batch_ahead(source, update, tmp_path):
    """``x[i] += e``: the element is loaded ahead like any other and the update stores the loaded value combined
    with ``e``; run on the host beside the original, the array and the sums come out the same."""
    assert source != SCAN
    found = outcome(source, spec=SPEC)
    assert found.applicable, found.why
    assert update in found.rewrites[0].source, found.rewrites[0].source
    for k, rw in enumerate(found.rewrites):
        run_beside(source, rw.source, tmp_path / str(k), SCAN_DRIVER)


def test_an_update_whose_value_is_used_stays_in_order():
    used = UPDATE.replace("x[i] += (long long)i * 7 + sum;", "sum += (x[i] += (long long)i * 7);")
    found = outcome(used, spec=SPEC)
    assert not found.applicable and "none to make ahead" in found.why, found.why


def test_an_update_in_place_reads_its_element_before_it_stores(tmp_path):
    """``x[i] = x[i] * 3 + sum``: the store's left side comes first in the text, its right side runs first."""
    source = SCAN.replace("long long v = x[i];\n        x[i] = sum;", "long long v = x[i];\n        x[i] = x[i] * 3 + sum;")
    found = outcome(source, spec=SPEC)
    assert found.applicable, found.why
    assert "x[i] = kl_load0[kl_u] * 3 + sum;" in found.rewrites[0].source


@pytest.mark.parametrize("change,why", [
    # A recurrence: the next iteration loads what this one stored.
    (("i += stride", "i += 1", "x[i] = sum;", "x[i + 1] = sum;"), "`x[i + 1]` may store an element `x[i]` loads"),
    (("x[i] = sum;", "x[i] = sum + x[i - 1];"), "`x[i]` may store an element `x[i - 1]` loads"),
    # The store comes first: the load reads what its own iteration stored.
    (("long long v = x[i];\n        x[i] = sum;", "x[i] = sum;\n        long long v = x[i];"), "may store an element"),
    (("long long v = x[i];", "long long v = 0;\n        if (sum < 9) v = x[i];"), "runs on a condition inside the loop"),
    # A compound store reads first, then stores; the next statement reads what it stored.
    (("long long v = x[i];\n        x[i] = sum;", "x[i] += sum;\n        long long v = x[i];"), "may store an element"),
    (("x[i] = sum;", "x[i] = sum; atomicAdd(&out[0], 1LL);"), "it makes atomics"),
])
def test_refusals_of_a_body_that_stores(change, why):
    source = SCAN
    for old, new in zip(change[::2], change[1::2]):
        assert old in source
        source = source.replace(old, new)
    found = outcome(source, spec=SPEC)
    assert not found.applicable and why in found.why, found.why


def test_the_batch_test_is_in_long_long_and_macros_stay_as_written():
    found = outcome(TWO_LOOPS)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "(long long)((int)count) - (long long)(j) > 3 * (long long)(1)" in source
    assert "(long long)((int)count) - (long long)(k) > 3 * (long long)(32)" in source
    assert source.count("TAKE(x, j)") == 2 and "(x)[j]" not in source
    bounds = outcome(BOUNDS)
    assert bounds.applicable, bounds.why
    # The counter may reach an inclusive bound: U more steps may end on it.
    assert "(long long)((int)count - 1) - (long long)(i) >= 3 * (long long)(12)" in bounds.rewrites[0].source
    assert "(long long)((int)count) - (long long)(k) > 3 * (long long)(5)" in bounds.rewrites[0].source


@needs_nvcc
def test_candidates_compile(tmp_path):
    for k, rw in enumerate(outcome(GRID_STRIDE).rewrites):
        compiles(rw.source, tmp_path / str(k))


@pytest.mark.parametrize("change,why", [
    (("acc = acc * 31 + x[i];", "if (x[i] < 0) continue; acc += x[i];"), "leaves an iteration early"),
    (("acc = acc * 31 + x[i];", "if (acc > 100) break; acc += x[i];"), "is not decided by data the loop loads"),
    (("acc = acc * 31 + x[i];", "acc += x[i]; __syncthreads();"), "a barrier or a warp operation"),
    (("acc = acc * 31 + x[i];", "acc += x[i]; i += 1;"), "its body assigns i"),
    (("acc = acc * 31 + x[i];", "acc += x[i]; stride = 1;"), "its body assigns stride"),
    (("acc = acc * 31 + x[i];", "acc += x[0];"), "loads no global memory at an index that moves"),
    (("i < count;", "i != count;"), "no upper bound of its counter as its whole test"),
    (("i < count;", "i < count && x[i] > 0;"), "no upper bound of its counter as its whole test"),
    (("i += stride", "i = stride + 2 * i"), "its step is not a positive constant"),
    (("i += stride", "i += count"), "not a positive constant or a product of launch dimensions"),
    (("size_t i = index;", "float i = index;"), "its counter's type is float"),
    (("    for (size_t", "#pragma unroll 2\n    for (size_t"), "a pragma of its own"),
    (("acc = acc * 31 + x[i];", "for (int q = 0; q < 2; ++q) acc += x[i + q];"), "a loop of its own"),
    (("acc = acc * 31 + x[i];", "for (int q = 0; q < 2; ++q) acc += x[i + q];"), "its trip count is a constant"),
    (("i < count;", "i < count + x[0];"), "its bound or step has side effects or reads memory"),
])
def test_refusals_name_the_missing_fact(change, why):
    found = outcome(GRID_STRIDE.replace(*change))
    assert not found.applicable and why in found.why, found.why


# Parboil's JDS SpMV: each iteration reads its column's start from a __constant__ table at the counter, so
# the loads move with the counter through that value, not through the counter's own symbol.
TABLE = """
__constant__ int starts[4096];
__global__ void total(const long long* x, long long* out, size_t count) {
    int t = threadIdx.x + blockDim.x * blockIdx.x;
    long long acc = 0;
    int bound = starts[t / 32];
    for (int k = 0; k < bound; k++) {
        int j = starts[k] + t;
        acc += x[j];
    }
    out[t] = acc;
}
"""


def test_loads_that_move_through_a_value_made_in_the_loop_are_batched(tmp_path):
    found = outcome(TABLE)
    assert found.applicable, found.why
    assert [rw.variant for rw in found.rewrites] == ["batch=4", "batch=8"]
    # A value made before the loop: the same element on every iteration, nothing to batch.
    fixed = outcome(TABLE.replace("        int j = starts[k] + t;\n", "").replace("int bound", "int j = starts[0] + t;\n    int bound"))
    assert not fixed.applicable and "loads no global memory at an index that moves" in fixed.why, fixed.why
    if shutil.which("nvcc") is not None:
        for k, rw in enumerate(found.rewrites):
            compiles(rw.source, tmp_path / str(k))


def test_a_store_is_batched_past_only_where_the_spec_keeps_the_arrays_apart():
    source = GRID_STRIDE.replace("acc = acc * 31 + x[i];", "out[i] = acc; acc = acc * 31 + out[i];")
    found = outcome(source, spec=SPEC)
    assert not found.applicable and "`out[i]` may store an element `out[i]` loads in a later iteration" in found.why, found.why
    stores = GRID_STRIDE.replace("acc = acc * 31 + x[i];", "acc = acc * 31 + x[i]; out[i] = acc;")
    assert outcome(stores, spec=SPEC).applicable
    found = outcome(stores)
    assert not found.applicable and "does not allocate every pointer parameter on its own" in found.why, found.why


def test_a_while_body_copied_whole_with_its_step():
    found = outcome(WHILE)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "while (i < (int)count && (long long)((int)count) - (long long)(i) > 3 * (long long)(blockDim.x * gridDim.x))" \
        in source
    assert source.count("i += blockDim.x * gridDim.x;") == 2 and "for (;" not in source


def test_a_search_makes_its_batchs_loads_first():
    found = outcome(SEARCH)
    assert found.applicable, found.why
    source = found.rewrites[1].source
    assert "for (int kl_u = 0; kl_u < 8; ++kl_u) kl_load0[kl_u] = x[(k + kl_u * (1))];" in source
    assert "if (kl_load0[kl_u] >= want)" in source and "{ kl_left = true; break; }" in source
    assert "for (; !kl_left && k < (int)count; ++k)" in source
    # The load the counter does not move stays as written.
    assert "x[0]" in source and "kl_load1" not in source


def test_a_while_search_makes_its_batchs_loads_first_and_steps_in_its_body():
    assert "while (k < (int)count) {" in WHILE_SEARCH and "++k;" in WHILE_SEARCH
    found = outcome(WHILE_SEARCH)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "kl_load0[kl_u] = x[(k + kl_u * (1))];" in source and "while (!kl_left && k < (int)count)" in source
    # A load after the step would be made with the counter a step behind: refused.
    late = WHILE_SEARCH.replace("        ++k;\n    }\n", "        ++k;\n        found += (int)x[k % 2];\n    }\n")
    found = outcome(late)
    assert not found.applicable and "`x[k % 2]` is read after the statement that steps the counter" in found.why, found.why


@pytest.mark.parametrize("change,why", [
    (("if (x[k] >= want) {", "want ^= x[k];\n        if (k == 7) {"), "is not decided by data the loop loads"),
    (("found = k;", "found = k; out[k] = 1;"), "its body writes out"),
    (("out[t] = found", "((long long*)x)[t] = 0; out[t] = found"), "which the kernel may write"),
    (("if (x[k] >= want) {", "if (x[k + found + 1] >= want) {"), "depends on found, which the loop changes"),
])
def test_search_refusals_name_the_missing_fact(change, why):
    found = outcome(SEARCH.replace(*change))
    assert not found.applicable and why in found.why, found.why


@pytest.mark.parametrize("change,why", [
    (("i += blockDim.x * gridDim.x;", "if (acc > 0) i += blockDim.x * gridDim.x; else i += blockDim.x * gridDim.x;"),
     "the analysis finds no counter of the loop"),
    # Stepped twice, or skipped by a ``continue``: the counter does not move by one step per iteration.
    (("i += blockDim.x * gridDim.x;\n", "i += blockDim.x * gridDim.x;\n        i += 1;\n"),
     "the analysis finds no counter of the loop"),
    (("while (i < (int)count) {", "do {"), "it is a do loop"),
    (("n++;", "n++; count = 0;"), "its body assigns count"),
    (("n++;", "if (n > 9) continue; n++;"), "the analysis finds no counter of the loop"),
])
def test_while_refusals_name_the_missing_fact(change, why):
    source = WHILE.replace(*change)
    if "do {" in source and "} while" not in source:
        source = source.replace("n++;\n    }", "n++;\n    } while (i < (int)count);")
    found = outcome(source)
    assert not found.applicable and why in found.why, found.why


@needs_nvcc
@pytest.mark.parametrize("name", ["llmc_global_norm_kernel1", "llmc_matmul_backward_bias_kernel2", "parboil_histo_prescan",
                                  "rodinia_particlefilter_find_index"])
def test_corpus_strided_reductions_are_batched_and_compile(name, tmp_path):
    import json
    from kernel_lsp.core.source import preprocess
    from kernel_lsp.core.index import build_index
    from kernel_lsp.core.rules.base import RuleContext

    folder = CORPUS / name
    source = (folder / "kernel.cu").read_text()
    spec = parse_spec(json.loads((folder / "spec.json").read_text()))
    index = build_index(source)
    kernel = next(k for k in index.kernels if k.name == spec.kernel)
    ctx = RuleContext(source, index, kernel, spec, preprocess(source, path=str(folder / "kernel.cu")))
    rule = rule_by_name("load-batch")
    ok, why = rule.preconditions(ctx)
    assert ok, why
    for k, rw in enumerate(rule.apply(ctx)):
        compiles(rw.source, tmp_path / str(k), include=folder)


# The GPU test's kernel (tests/gpu/test_reduce_family_gpu.py): every thread's sum of squares over its
# grid-stride share, under an unsigned counter.
NORMS = """
__global__ void norms(const float* x, float* out, long long count) {
    size_t n = (size_t)count;
    size_t index = threadIdx.x + blockDim.x * blockIdx.x;
    float acc = 0.0f;
    for (size_t i = index; i < n; i += blockDim.x * gridDim.x)
        acc += x[i] * x[i];
    out[index] = acc;
}
"""
NORMS_SPEC = {"kernel": "norms", "params": [
    {"name": "x", "array": "float32", "size": "count", "init": "uniform(-1,1)", "role": "in"},
    {"name": "out", "array": "float32", "size": "8192", "init": "zeros", "role": "out"},
    {"name": "count", "scalar": "int64", "value": 1000000}],
    "grid": [64, 1, 1], "block": [128, 1, 1], "variants": [{"count": 8191}, {"count": 5}, {"count": 32771}],
    "tolerance": {"rtol": 1e-6, "atol": 1e-6}}

WHILE_SPEC = {"kernel": "total", "params": [
    {"name": "x", "array": "int64", "size": "count", "init": "randint(-500,500)", "role": "in"},
    {"name": "out", "array": "int64", "size": "8192", "init": "zeros", "role": "out"},
    {"name": "count", "scalar": "int64", "value": 1000000}],
    "grid": [64, 1, 1], "block": [128, 1, 1], "variants": [{"count": 8191}, {"count": 5}, {"count": 32771}],
    "tolerance": {"rtol": 0, "atol": 0}}


def test_the_gpu_tests_kernel_is_batched():
    found = outcome(NORMS, "norms", NORMS_SPEC)
    assert found.applicable, found.why
    assert "(long long)(n) - (long long)(i) > 7 * (long long)(blockDim.x * gridDim.x)" in found.rewrites[1].source
    for source in (WHILE, SEARCH):
        found = outcome(source, "total", WHILE_SPEC)
        assert found.applicable, found.why


def test_a_batch_in_an_underfilled_launch_is_paired_with_smaller_blocks_after_every_single_step():
    """Eight blocks of 128 threads: each thread's batch has loads in flight, and blocks of 32 spread the threads over
    four times the SMs. The pair comes after every candidate of one step, so it never crowds one out of the budget."""
    from kernel_lsp.core.candidates import OptimizeRequest
    from kernel_lsp.core.rules import RuleGenerator

    source = SCAN.replace("size_t stride = blockDim.x * gridDim.x;", "size_t stride = 1024;")
    candidates = list(RuleGenerator().generate(OptimizeRequest(source=source, path="scan.cu", kernel="total",
                                                               spec=parse_spec(SPEC))))
    names = [c.generator for c in candidates]
    pairs = [n for n in names if n.endswith("+smaller-blocks[block=32]")]
    assert "rule:load-batch[batch=4]+smaller-blocks[block=32]" in pairs, names
    assert "rule:load-batch[batch=4]" in names and "rule:smaller-blocks[block=32]" in names
    assert names[-len(pairs):] == pairs, names
    pair = next(c for c in candidates if c.generator == "rule:load-batch[batch=4]+smaller-blocks[block=32]")
    assert pair.after == "rule:load-batch[batch=4]" and pair.block == (32, 1, 1) and "kl_load0" in pair.source
