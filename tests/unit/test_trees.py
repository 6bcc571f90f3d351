"""Shared-memory trees in the forms real code writes them (unrolled with template guards, volatile
warp-synchronous tails in the kernel or in a helper, several values side by side, two values in one
array), proven by simulation and rewritten as warp shuffles; thread coarsening of a block
reduction. Each rewrite runs on the CPU (cpu_cuda.py: real barriers and warp shuffles) against a
reference computed on the host at ragged sizes, and compiles with nvcc; each refusal names the
missing fact."""

from __future__ import annotations

import shutil

import pytest

from cpu_cuda import run_on_cpu
from nvcc_check import compiles
from rule_specs import outcome

needs_gpp = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

#: What the emulator lacks for these kernels.
PRELUDE = """
#define __launch_bounds__(...)
static const int warpSize = 32;
"""


def spec(kernel: str, block: int = 256, outputs: int = 1, variants=({"n": 1001},)) -> dict:
    return {"kernel": kernel, "params": [
        {"name": "in", "array": "float32", "size": "n", "init": "uniform(0,1)", "role": "in"},
        {"name": "partial", "array": "float32", "size": f"{outputs}*ceil_div(n,{block})", "init": "zeros", "role": "out"},
        {"name": "n", "scalar": "int64", "value": 1 << 20}],
        "grid": [f"ceil_div(n,{block})", 1, 1], "block": [block, 1, 1], "variants": list(variants),
        "tolerance": {"rtol": 1e-4, "atol": 1e-4}}


def run(source: str, call: str, n: int, block: int, outputs: int, tmp_path, name: str) -> list[float]:
    """The kernel on the CPU over ``n`` small integers (sums exact in any order), in blocks of ``block``
    threads, one block per 256 inputs; every output printed."""
    grid = (n + 255) // 256
    main = f"""
int main() {{
  const long n = {n};
  std::vector<float> in(n), partial({outputs} * {grid}, -1.0f);
  for (long i = 0; i < n; i++) in[i] = (float)((i * 7919) % 13) - 6.0f;
  kl_launch({{{grid}, 1, 1}}, {{{block}, 1, 1}}, [&] {{ {call}; }});
  for (float v : partial) printf("%a\\n", v);
}}
"""
    return [float.fromhex(v) for v in run_on_cpu(PRELUDE + source, main, tmp_path, name).split()]


def reference(n: int, ops: tuple[str, ...]) -> list[float]:
    """Per 256 inputs, each op's total (out of range inputs count 0 for a sum, nothing for min/max)."""
    values = [float((i * 7919) % 13) - 6.0 for i in range(n)]
    out = []
    for op in ops:
        for b in range(0, n, 256):
            chunk = values[b:b + 256]
            pad = [0.0] * (256 - len(chunk))
            out.append({"+": sum(chunk), "max": max(chunk + pad), "min": min(chunk + pad)}[op])
    return out


UNROLLED = """
#define BLOCK 256
typedef float real;
template <unsigned int blockSize>
__global__ void __launch_bounds__(BLOCK) block_sums(const real* __restrict__ in, real* __restrict__ partial, long n) {
    __shared__ real sdata[BLOCK];
    const unsigned int tid = threadIdx.x;
    const long i = (long)blockIdx.x * blockSize + tid;
    sdata[tid] = i < n ? in[i] : (real)0;
    __syncthreads();
    if (blockSize >= 512) { if (tid < 256) { sdata[tid] += sdata[tid + 256]; } __syncthreads(); }
    if (blockSize >= 256) { if (tid < 128) { sdata[tid] += sdata[tid + 128]; } __syncthreads(); }
    if (blockSize >= 128) { if (tid < 64) { sdata[tid] += sdata[tid + 64]; } __syncthreads(); }
    if (tid < warpSize) {
        // warp-synchronous: racy on Volta and later without __syncwarp
        volatile real* smem = sdata;
        if (blockSize >= 64) smem[tid] += smem[tid + 32];
        smem[tid] += smem[tid + 16];
        smem[tid] += smem[tid + 8];
        smem[tid] += smem[tid + 4];
        smem[tid] += smem[tid + 2];
        smem[tid] += smem[tid + 1];
    }
    if (tid == 0) partial[blockIdx.x] = sdata[0];
}
template __global__ void block_sums<256>(const real* __restrict__, real* __restrict__, long);
"""

HELPER_TAIL = """
template <unsigned int blockSize>
__device__ void warp_reduce(volatile float* s, unsigned int tid) {
    if (blockSize >= 64) s[tid] += s[tid + 32];
    if (blockSize >= 32) s[tid] += s[tid + 16];
    s[tid] += s[tid + 8];
    s[tid] += s[tid + 4];
    s[tid] += s[tid + 2];
    s[tid] += s[tid + 1];
}
template <unsigned int blockSize>
__global__ void block_sums(const float* in, float* partial, long n) {
    __shared__ float s[blockSize];
    unsigned int tid = threadIdx.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    s[tid] = i < n ? in[i] : 0.0f;
    __syncthreads();
    for (unsigned int st = blockDim.x / 2; st > 32; st >>= 1) {
        if (tid < st) s[tid] += s[tid + st];
        __syncthreads();
    }
    if (tid < 32) warp_reduce<blockSize>(s, tid);
    if (tid == 0) partial[blockIdx.x] = s[0];
}
template __global__ void block_sums<256>(const float*, float*, long);
"""

# Sum, minimum and maximum side by side: one loop, three arrays.
SIDE_BY_SIDE = """
__global__ void stats(const float* in, float* partial, long n) {
    __shared__ float s_sum[256], s_min[256], s_max[256];
    const int tid = threadIdx.x;
    const long i = blockIdx.x * (long)blockDim.x + tid;
    const float v = i < n ? in[i] : 0.0f;
    s_sum[tid] = v; s_min[tid] = v; s_max[tid] = v;
    __syncthreads();
    for (int st = blockDim.x >> 1; st > 0; st >>= 1) {
        if (tid < st) {
            s_sum[tid] += s_sum[tid + st];
            s_min[tid] = fminf(s_min[tid], s_min[tid + st]);
            s_max[tid] = fmaxf(s_max[tid], s_max[tid + st]);
        }
        __syncthreads();
    }
    if (tid == 0) {
        partial[blockIdx.x] = s_sum[0];
        partial[gridDim.x + blockIdx.x] = s_min[0];
        partial[2 * gridDim.x + blockIdx.x] = s_max[0];
    }
}
"""

# Two values in one array: the sums in its first half, the maxima in its second.
ONE_ARRAY = """
__global__ void stats(const float* in, float* partial, long n) {
    extern __shared__ float s[];
    const unsigned tid = threadIdx.x;
    const long i = blockIdx.x * (long)blockDim.x + tid;
    s[tid] = i < n ? in[i] : 0.0f;
    s[blockDim.x + tid] = i < n ? in[i] : 0.0f;
    __syncthreads();
    for (unsigned st = blockDim.x / 2; st > 0; st /= 2) {
        if (tid < st) {
            s[tid] += s[tid + st];
            s[blockDim.x + tid] = max(s[blockDim.x + tid], s[blockDim.x + tid + st]);
        }
        __syncthreads();
    }
    if (tid == 0) {
        partial[blockIdx.x] = s[0];
        partial[gridDim.x + blockIdx.x] = s[blockDim.x];
    }
}
"""


@needs_gpp
@pytest.mark.parametrize("source,call,ops", [
    (UNROLLED, "block_sums<256>(in.data(), partial.data(), n)", ("+",)),
    (HELPER_TAIL, "block_sums<256>(in.data(), partial.data(), n)", ("+",)),
    (SIDE_BY_SIDE, "stats(in.data(), partial.data(), n)", ("+", "min", "max")),
])
def test_trees_become_shuffles_that_compute_every_total(source, call, ops, tmp_path):
    found = outcome("tree-to-shuffle", source, spec("block_sums" if "block_sums" in call else "stats", outputs=len(ops)))
    assert found.applicable, found.why
    (rw,) = found.rewrites
    assert rw.launch_override is None and "__shfl_xor_sync" in rw.source
    assert "smem[tid + 16]" not in rw.source and "s[tid + st]" not in rw.source.split("__global__")[-1]
    for n in (2 * 256, 1001, 3 * 256 - 7):
        got = run(rw.source, call, n, 256, len(ops), tmp_path, f"tree{n}")
        assert got == reference(n, ops), n


@needs_gpp
def test_two_values_in_one_array_are_reduced_into_their_roots(tmp_path):
    data = spec("stats", outputs=2)
    data["dynamic_smem"] = "2*256*4"
    found = outcome("tree-to-shuffle", ONE_ARRAY, data)
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "s[blockDim.x] = kl_total1;" in source
    cpu = source.replace("extern __shared__ float s[];", "__shared__ float s[512];")
    for n in (1001, 512):
        ref = reference(n, ("+", "max"))
        # A missing input counts 0 in this kernel's maximum too.
        assert run(cpu, "stats(in.data(), partial.data(), n)", n, 256, 2, tmp_path, f"one{n}") == ref


@needs_nvcc
@pytest.mark.parametrize("source,kernel,outputs", [(UNROLLED, "block_sums", 1), (HELPER_TAIL, "block_sums", 1),
                                                   (SIDE_BY_SIDE, "stats", 3)])
def test_tree_rewrites_compile(source, kernel, outputs, tmp_path):
    found = outcome("tree-to-shuffle", source, spec(kernel, outputs=outputs))
    assert found.applicable, found.why
    compiles(found.rewrites[0].source, tmp_path)


@pytest.mark.parametrize("source,why", [
    # A warp-synchronous tail that reaches into the second warp: threads 32..63 write slots warp 0 reads.
    (UNROLLED.replace("if (tid < warpSize) {", "if (tid < 64) {"), "different warps with no barrier between (a race)"),
    # A barrier only some threads reach.
    (UNROLLED.replace("{ if (tid < 64) { sdata[tid] += sdata[tid + 64]; } __syncthreads(); }",
                      "{ if (tid < 64) { sdata[tid] += sdata[tid + 64]; __syncthreads(); } }"), "reached by some threads only"),
    # The tail stops one step short: slot 0 misses slot 1.
    (UNROLLED.replace("        smem[tid] += smem[tid + 1];\n", ""), "slot 0 does not end with every slot's value exactly once"),
    # A partial sum read after the tree.
    (UNROLLED.replace("partial[blockIdx.x] = sdata[0];", "partial[blockIdx.x] = sdata[0] + sdata[tid + 1];"),
     "reads a slot other than the root after the tree"),
    # The helper is called twice: which call an access belongs to is not known, so the tree stops before it.
    (HELPER_TAIL.replace("if (tid < 32) warp_reduce<blockSize>(s, tid);",
                         "if (tid < 32) warp_reduce<blockSize>(s, tid);\n    if (tid < 32) warp_reduce<blockSize>(s, tid);"),
     "in the helper `warp_reduce` reads `s` outside the tree"),
])
def test_tree_refusals_name_the_missing_fact(source, why):
    found = outcome("tree-to-shuffle", source, spec("block_sums"))
    assert not found.applicable and why in found.why, found.why


def test_a_two_dimensional_block_names_what_is_read_not_a_tree_it_did_not_find():
    """Only trees over threadIdx.x are read: a 2-D block is refused saying so, not claiming a tree over
    threadIdx.y (Rodinia hotspot, whose shared copy loop is no tree at all, was told it had one)."""
    found = outcome("tree-to-shuffle", UNROLLED, {**spec("block_sums"), "block": [128, 2, 1]})
    assert not found.applicable
    assert found.why == "the block is not one-dimensional at every size (trees are read over threadIdx.x only)"


def test_a_root_whose_segment_is_not_reduced_is_refused():
    """A slot read after the tree is a root only when it ends with its ``n`` slots' values."""
    # The maxima are read one slot past their root, which holds no total.
    source = ONE_ARRAY.replace("= s[blockDim.x];", "= s[blockDim.x + 1];")
    data = spec("stats", outputs=2)
    data["dynamic_smem"] = "2*256*4"
    found = outcome("tree-to-shuffle", source, data)
    assert not found.applicable and "reads a slot other than the root" in found.why, found.why


# Interleaved trees that gather into the last slot, read there by the last thread; two values side by
# side; the tree only in the blocks of one block-uniform branch, the other branch adding the slots in
# one thread (its reads are of that branch, never after the tree).
LAST_SLOT = """
#define THREADS 256
__global__ void block_sums_last(const float* in, float* partial, long n) {
    __shared__ float s[THREADS];
    __shared__ float q[THREADS];
    int tx = threadIdx.x;
    long i = (long)blockIdx.x * THREADS + tx;
    s[tx] = i < n ? in[i] : 0.0f;
    q[tx] = i < n ? in[i] * in[i] : 0.0f;
    __syncthreads();
    if (blockIdx.x + 1 < gridDim.x) {
        for (int w = 2; w <= THREADS; w *= 2) {
            if ((tx + 1) % w == 0) {
                s[tx] = s[tx] + s[tx - w / 2];
                q[tx] += q[tx - w / 2];
            }
            __syncthreads();
        }
        if (tx == THREADS - 1) {
            partial[blockIdx.x] = s[tx];
            partial[gridDim.x + blockIdx.x] = q[tx];
        }
    } else if (tx == 0) {
        float a = 0.0f, b = 0.0f;
        for (int k = 0; k < THREADS; k++) { a += s[k]; b += q[k]; }
        partial[blockIdx.x] = a;
        partial[gridDim.x + blockIdx.x] = b;
    }
}
"""


def _sums_and_squares(n: int) -> list[float]:
    values = [float((i * 7919) % 13) - 6.0 for i in range(n)]
    blocks = [values[b:b + 256] for b in range(0, n, 256)]
    return [sum(c) for c in blocks] + [sum(v * v for v in c) for c in blocks]


@needs_gpp
def test_a_tree_gathering_into_its_last_slot_becomes_shuffles(tmp_path):
    found = outcome("tree-to-shuffle", LAST_SLOT, spec("block_sums_last", outputs=2))
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "kl_warp_sum((float)(s[threadIdx.x]))" in source and "kl_warp_sum((float)(q[threadIdx.x]))" in source
    assert "{ s[255] = kl_total0; q[255] = kl_total1; }" in source
    assert "s[tx - w / 2]" not in source
    for n in (4 * 256, 1001, 3 * 256 - 7):
        got = run(source, "block_sums_last(in.data(), partial.data(), n)", n, 256, 2, tmp_path, f"last{n}")
        assert got == _sums_and_squares(n), n


@needs_nvcc
def test_the_last_slot_rewrite_compiles(tmp_path):
    compiles(outcome("tree-to-shuffle", LAST_SLOT, spec("block_sums_last", outputs=2)).rewrites[0].source, tmp_path)


@pytest.mark.parametrize("change,why", [
    # The first thread reads the last slot's tree: slot 0 holds no total.
    (("if (tx == THREADS - 1) {", "if (tx == 0) {"), "slot 0 does not end with every slot's value exactly once"),
    # A read after the whole if/else, in a thread whose slot holds a partial sum.
    (("        partial[gridDim.x + blockIdx.x] = b;\n    }\n", "        partial[gridDim.x + blockIdx.x] = b;\n    }\n"
      "    if (tx == 7) partial[0] = s[tx];\n"), "reads a slot other than the root after the tree"),
    # A branch each thread decides for itself: the other branch's reads may run beside the tree.
    (("if (blockIdx.x + 1 < gridDim.x) {", "if (tx < 128) {"), "it sits under a condition"),
])
def test_last_slot_refusals_name_the_missing_fact(change, why):
    source = LAST_SLOT.replace(*change)
    assert source != LAST_SLOT
    found = outcome("tree-to-shuffle", source, spec("block_sums_last", outputs=2))
    assert not found.applicable and why in found.why, found.why


# ---------------------------------------------------------------------------------------------- coarsening

COARSEN = """
#define THREADS 256
#define LOAD(p, k) (p)[k]
__global__ void __launch_bounds__(THREADS) block_sums(const float* __restrict__ in, float* __restrict__ partial, long n) {
    __shared__ float sdata[THREADS];
    unsigned int tid = threadIdx.x;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    float v = 0.0f;
    if (i < n) v = LOAD(in, i) * 2.0f;
    sdata[tid] = v;
    __syncthreads();
    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        if (tid % (2 * s) == 0) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) partial[blockIdx.x] = sdata[0];
}
"""


def coarsened(source: str = COARSEN, data: dict | None = None):
    return outcome("tree-coarsen", source, data or spec("block_sums"))


@needs_gpp
def test_coarsened_threads_each_fill_several_slots(tmp_path):
    found = coarsened()
    assert found.applicable, found.why
    blocks = {rw.variant: rw for rw in found.rewrites}
    assert set(blocks) == {"x4", "x8"}
    for c, rw in ((4, blocks["x4"]), (8, blocks["x8"])):
        assert rw.block == (256 // c, 1, 1) and rw.grid_divide == (1, 1, 1)
        assert rw.launch_override["block"] == [256 // c, 1, 1] and rw.launch_override["grid"][0] == "ceil_div(n,256)"
        assert f"__launch_bounds__({256 // c})" in rw.source and "LOAD(in, i)" in rw.source  # the user's macro kept
        for n in (1001, 256 * 3):
            doubled = [2 * v for v in reference(n, ("+",))]
            assert run(rw.source, "block_sums(in.data(), partial.data(), n)", n, 256 // c, 1, tmp_path, f"c{c}_{n}") == doubled


@needs_nvcc
def test_coarsened_rewrites_compile(tmp_path):
    for rw in coarsened().rewrites:
        compiles(rw.source, tmp_path / rw.variant)
    found = coarsened(UNROLLED)
    assert found.applicable, found.why
    compiles(found.rewrites[0].source, tmp_path / "unrolled")


@pytest.mark.parametrize("source,why", [
    (COARSEN.replace("if (tid == 0) partial[blockIdx.x] = sdata[0];", "partial[i] = sdata[0];"),
     "runs in threads other than thread 0"),
    (COARSEN.replace("float v = 0.0f;", "float v = 0.0f; for (int k = 0; k < 2; ++k) v += 1.0f;"),
     "the code before the tree loops"),
    (COARSEN.replace("sdata[tid] = v;", "sdata[tid] = v; sdata[(tid + 1) % THREADS] += 0.0f;"),
     "shared memory other than the thread's own slot"),
    (COARSEN.replace("float v = 0.0f;", "float v = 0.0f; n -= 0;"), "assigns `n`, declared outside it"),
    ("__device__ float scale() { return 1.0f / blockDim.x; }\n" + COARSEN.replace("* 2.0f", "* scale()"),
     "the function `scale` reads the thread index or the block's size itself"),
])
def test_coarsening_refusals_name_the_missing_fact(source, why):
    found = coarsened(source)
    assert not found.applicable and why in found.why, found.why



CG_TREE = """
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
__global__ void block_sums(const float* in, float* partial, long n) {
    cg::thread_block cta = cg::this_thread_block();
    __shared__ float s[256];
    unsigned int tid = cta.thread_rank();
    long i = blockIdx.x * (long)cta.size() + tid;
    s[tid] = i < n ? in[i] : 0.0f;
    cg::sync(cta);
    for (unsigned int st = cta.size() / 2; st > 0; st >>= 1) {
        if (tid < st) s[tid] += s[tid + st];
        cta.sync();
    }
    if (tid == 0) partial[blockIdx.x] = s[0];
}
"""


@needs_nvcc
def test_a_cooperative_groups_reduction_is_coarsened_through_the_groups_rank_and_size(tmp_path):
    found = coarsened(CG_TREE)
    assert found.applicable, found.why
    rw = next(r for r in found.rewrites if r.variant == "x4")
    assert "unsigned int tid = (cta.thread_rank() + kl_k * blockDim.x);" in rw.source
    assert "blockIdx.x * (long)(cta.size() * 4u) + tid;" in rw.source
    compiles(rw.source, tmp_path)


def test_a_tile_rank_before_the_tree_is_refused():
    source = CG_TREE.replace("    unsigned int tid = cta.thread_rank();",
                             "    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cta);\n"
                             "    unsigned int tid = cta.thread_rank();\n    float lane = (float)warp.thread_rank();")
    source = source.replace("s[tid] = i < n ? in[i] : 0.0f;", "s[tid] = i < n ? in[i] + lane : 0.0f;")
    found = coarsened(source)
    assert not found.applicable and "through a cooperative group" in found.why, found.why


# A dot product as textbooks write it: a grid-stride accumulation, then a tree in a `while` loop whose counter
# is set before it and halved by its last statement.
WHILE_TREE = """
const int threadsPerBlock = 256;
__global__ void block_sums(const float* in, float* partial, long n) {
    __shared__ float cache[threadsPerBlock];
    long tid = threadIdx.x + blockIdx.x * blockDim.x;
    int cacheIndex = threadIdx.x;
    float temp = 0;
    while (tid < n) {
        temp += in[tid];
        tid += blockDim.x * gridDim.x;
    }
    cache[cacheIndex] = temp;
    __syncthreads();
    int i = blockDim.x / 2;
    while (i != 0) {
        if (cacheIndex < i)
            cache[cacheIndex] += cache[cacheIndex + i];
        __syncthreads();
        i /= 2;
    }
    if (cacheIndex == 0)
        partial[blockIdx.x] = cache[0];
}
"""


@needs_gpp
def test_a_tree_in_a_while_loop_becomes_shuffles(tmp_path):
    found = outcome("tree-to-shuffle", WHILE_TREE, spec("block_sums"))
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "i /= 2;" not in source and "__shfl_xor_sync" in source
    for n in (1001, 512):
        assert run(source, "block_sums(in.data(), partial.data(), n)", n, 256, 1, tmp_path, f"w{n}") == reference(n, ("+",))
    if shutil.which("nvcc"):
        compiles(source, tmp_path / "nvcc")


def test_a_while_loop_stepped_before_its_last_statement_is_refused():
    source = WHILE_TREE.replace("        __syncthreads();\n        i /= 2;\n", "        i /= 2;\n        __syncthreads();\n")
    found = outcome("tree-to-shuffle", source, spec("block_sums"))
    assert not found.applicable and "stepped by the last statement of its body" in found.why, found.why
