"""Block reductions: shared-memory trees as warp shuffles (proven by simulating the tree at each
block size of the spec), per-element atomics onto one address as one atomic per block; where each
applies, each refusal's missing fact, the candidates compiled by nvcc."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp.core.rules import evaluate, rule_by_name
from kernel_lsp.core.spec import parse_spec
from nvcc_check import compiles

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "benchmarks" / "corpus"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def spec_of(kernel: str, block: int, variants=None, out_size="ceil_div(n,256)") -> dict:
    data = {"kernel": kernel, "params": [
        {"name": "x", "array": "float32", "size": "n", "init": "uniform(0,1)", "role": "in"},
        {"name": "out", "array": "float32", "size": out_size, "init": "zeros", "role": "out"},
        {"name": "n", "scalar": "int32", "value": 1 << 20}],
        "grid": [f"ceil_div(n,{block})", 1, 1], "block": [block, 1, 1], "tolerance": {"rtol": 1e-4, "atol": 1e-4}}
    if variants:
        data["variants"] = variants
    return data


def outcome(rule: str, source: str, spec: dict):
    return evaluate(source, spec["kernel"], parse_spec(spec), [rule_by_name(rule)])[0]


TREE = """
__global__ void partial(const float* x, float* out, int n) {
    __shared__ float s[BLOCK];
    unsigned int tid = threadIdx.x;
    INDEX i = (INDEX)blockIdx.x * blockDim.x + threadIdx.x;
    s[tid] = i < n ? x[i] : 0.0f;
    __syncthreads();
    LOOP
    if (tid == 0) out[blockIdx.x] = s[0];
}
"""
INTERLEAVED = """for (unsigned int st = 1; st < blockDim.x; st *= 2) {
        if (tid % (2 * st) == 0) s[tid] += s[tid + st];
        __syncthreads();
    }"""
STRIDED = """for (unsigned int st = 1; st < blockDim.x; st <<= 1) {
        int index = 2 * st * tid;
        if (index < blockDim.x) { s[index] = s[index] + s[index + st]; }
        __syncthreads();
    }"""
SEQUENTIAL = """for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (tid < st) s[tid] = fmaxf(s[tid], s[tid + st]);
        __syncthreads();
    }"""


def tree(loop: str, index: str = "int", block: int = 256) -> str:
    return TREE.replace("LOOP", loop).replace("INDEX", index).replace("BLOCK", str(block))


@needs_nvcc
@pytest.mark.parametrize("loop,index", [(INTERLEAVED, "int"), (STRIDED, "long long"), (SEQUENTIAL, "size_t")])
def test_trees_of_any_indexing_become_shuffles(loop, index, tmp_path):
    source = tree(loop, index)
    found = outcome("tree-to-shuffle", source, spec_of("partial", 256, [{"n": 1000}]))
    assert found.applicable, found.why
    (rw,) = found.rewrites
    assert rw.launch_override is None and rw.grid_scale is None  # a per-block output keeps its grid
    assert "__shfl_xor_sync" in rw.source and "st *= 2" not in rw.source and "st <<= 1" not in rw.source
    assert ("kl_warp_max" in rw.source) == (loop is SEQUENTIAL)
    compiles(rw.source, tmp_path)


@pytest.mark.parametrize("source,block,why", [
    (tree(INTERLEAVED, block=96), 96, "not a power of two from 32 to 1024"),
    (tree(INTERLEAVED, block=16), 16, "not a power of two from 32 to 1024"),
    # A guard one thread too wide: thread st writes the slot thread 0 reads in the same step.
    (tree("""for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (tid <= st && tid + st < blockDim.x) s[tid] += s[tid + st];
        __syncthreads();
    }"""), 256, "race"),
    (tree("""for (unsigned int st = 1; st < blockDim.x; st *= 2) {
        if (tid % (2 * st) == 0) s[tid] += s[tid + st];
    }"""), 256, "no barrier"),
    (tree("if (tid < n) { " + INTERLEAVED + " }"), 256, "sits under a condition"),
    (tree(INTERLEAVED).replace("if (tid == 0) out[blockIdx.x] = s[0];", "out[i] = s[tid];"), 256,
     "reads a slot other than the root"),
    (tree(INTERLEAVED).replace("unsigned int tid = threadIdx.x;", "unsigned int tid = threadIdx.x; if (n < 0) return;"),
     256, "return before the tree"),
    (tree(INTERLEAVED.replace("st < blockDim.x", "st < n")), 256, "`n`"),
    (tree("for (int r = 0; r < 4; ++r) { if (r == n) continue; " + INTERLEAVED + " }"), 256,
     "an enclosing loop holds a return, break or continue"),
    (tree("""for (unsigned int st = 1; st < blockDim.x; st *= 2) {
        if (tid % st == 0) s[tid] += s[tid + st];
        __syncthreads();
    }"""), 256, "outside the block's slots"),
    # `st - tid` is unsigned in C (tid is): it wraps instead of going negative, so the guard holds for
    # nearly every thread; the simulation refuses rather than evaluate it as a signed value.
    (tree("""for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (st - tid > 0) s[tid] += s[tid + st];
        __syncthreads();
    }"""), 256, "signedness is not modelled"),
])
def test_tree_refusals_name_the_missing_fact(source, block, why):
    found = outcome("tree-to-shuffle", source, spec_of("partial", block, [{"n": 5000}]))
    assert not found.applicable and why in found.why, found.why


def test_tree_written_for_one_block_size_is_refused_at_another():
    source = tree("""for (int st = 128; st > 0; st >>= 1) {
        if (tid < st) s[tid] += s[tid + st];
        __syncthreads();
    }""", block=512)
    assert outcome("tree-to-shuffle", source, spec_of("partial", 256)).applicable
    found = outcome("tree-to-shuffle", source, spec_of("partial", 512))
    assert not found.applicable and "at 512 threads per block" in found.why


def corpus(name: str) -> tuple[str, dict, Path]:
    folder = CORPUS / name
    return (folder / "kernel.cu").read_text(), json.loads((folder / "spec.json").read_text()), folder


@needs_nvcc
@pytest.mark.parametrize("name", ["howto_reduce_v0", "llmc_matmul_backward_bias_kernel1", "shoc_reduction"])
def test_corpus_trees_become_shuffles_and_compile(name, tmp_path):
    source, spec, folder = corpus(name)
    found = outcome("tree-to-shuffle", source, spec)
    assert found.applicable, found.why
    (rw,) = found.rewrites
    assert rw.launch_override is None
    assert "expanded" not in rw.description  # the tree's lines mapped onto the user's: macros kept
    compiles(rw.source, tmp_path, folder)


@pytest.mark.parametrize("name,rule,why", [
    # The coarsening loop before SHOC's unrolled tree: copies of it would run one after another.
    ("shoc_reduction", "tree-coarsen", "the code before the tree loops"),
    # A 16x16 block whose tree runs over threadIdx.y (its partial sums are also stored afterwards).
    ("rodinia_backprop_layerforward", "tree-to-shuffle", "not one-dimensional"),
    # A scan: the up-sweep computes its indices in locals of a guarded block.
    ("parboil_scan_l1", "tree-to-shuffle", "does more than combine two slots of `s_data`"),
    ("llmc_crossentropy_forward_kernel1", "tree-to-shuffle", "no shared-memory reduction tree"),
    ("llmc_encoder_backward_kernel1", "atomic-to-block-reduce", "no atomics onto an address that is the same"),
    ("llmc_crossentropy_forward_kernel1", "atomic-to-block-reduce", "no atomics"),
    ("howto_reduce_v0", "atomic-to-block-reduce", "no atomics"),
])
def test_corpus_refusals(name, rule, why):
    source, spec, _ = corpus(name)
    found = outcome(rule, source, spec)
    assert not found.applicable and why in found.why, found.why


@needs_nvcc
def test_the_reduction_example_tree_inside_a_uniform_tile_loop(tmp_path):
    folder = ROOT / "examples" / "reduction"
    source, spec = (folder / "original.cu").read_text(), json.loads((folder / "spec.json").read_text())
    found = outcome("tree-to-shuffle", source, spec)
    assert found.applicable, found.why
    compiles(found.rewrites[0].source, tmp_path)


ATOMIC = """
__global__ void total(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(&out[0], x[i] * 2.0f);
}
"""


@needs_nvcc
def test_atomics_onto_one_address_become_one_per_block(tmp_path):
    found = outcome("atomic-to-block-reduce", ATOMIC, spec_of("total", 256, [{"n": 1000}], out_size="1"))
    assert found.applicable, found.why
    same, last, *coarsened = found.rewrites
    assert same.launch_override is None and same.grid_divide is None
    assert last.variant == "last-block" and last.launch_override is None and "atomicInc(&kl_done_total" in last.source
    assert [rw.grid_divide for rw in coarsened] == [(8, 1, 1), (32, 1, 1)]
    for k, rw in enumerate(found.rewrites):
        # The last block's variant adds atomically only for a block past its slots, and counts hits.
        assert rw.source.count("atomicAdd(") == (2 if rw is last else 1) and "__syncthreads_or" in rw.source
        assert "break;" in rw.source
        compiles(rw.source, tmp_path / str(k))


@pytest.mark.parametrize("source,block,why", [
    (ATOMIC.replace("atomicAdd(&out[0], x[i] * 2.0f);", "float old = atomicAdd(&out[0], x[i]); if (old < 0) out[1] = 0;"),
     256, "other atomics than atomicAdd, atomicMin or atomicMax"),
    (ATOMIC.replace("atomicAdd(&out[0], x[i] * 2.0f);", "if (atomicAdd(&out[0], x[i]) > 1.0f) return;"),
     256, "uses the atomic's old value"),
    (ATOMIC.replace("int i =", "int k = n / 2; int i =").replace("&out[0]", "&out[k]"), 256, "names k"),
    (ATOMIC.replace("if (i >= n) return;", "for (int j = 0; j < 4; ++j) if (i + j >= n) return;"), 256,
     "inside a loop"),
    (ATOMIC, 48, "not whole warps"),
    (ATOMIC.replace("&out[0]", "(float*)&out[0]"), 256, "is cast"),
    (ATOMIC.replace("const float* x", "float* x").replace("&out[0]", "&out[(int)x[0]]")
     .replace("atomicAdd(", "x[1] = 0.0f; atomicAdd("), 256, "which the kernel may write"),
    (ATOMIC.replace("&out[0]", "&out[threadIdx.x % 4]"), 256, "no atomics onto an address that is the same"),
])
def test_atomic_refusals_name_the_missing_fact(source, block, why):
    found = outcome("atomic-to-block-reduce", source, spec_of("total", block, out_size="4"))
    assert not found.applicable and why in found.why, found.why


HIST = """
__global__ void hist(const int* data, unsigned int* bins, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(&bins[BIN], 1u);
}
"""


def hist_spec(block: int = 256, bins: str = "256") -> dict:
    return {"kernel": "hist", "params": [
        {"name": "data", "array": "int32", "size": "n", "init": "randint(0,100000)", "role": "in"},
        {"name": "bins", "array": "uint32", "size": bins, "init": "zeros", "role": "out"},
        {"name": "n", "scalar": "int32", "value": 1 << 20}],
        "grid": [f"ceil_div(n,{block})", 1, 1], "block": [block, 1, 1], "variants": [{"n": 999}]}


@needs_nvcc
@pytest.mark.parametrize("bin_expr,bins,count", [
    ("data[i] & 255", "256", 256), ("data[i] & 1023", "1024", 1024), ("(data[i] >> 4) & 63", "64", 64),
    # No bound from the analysis: the spec's own size of the bins (an in-bounds original reaches no other).
    ("data[i]", "256", 256),
    # A signed remainder may be negative for the analysis: the spec's size, a negative offset going to the
    # global array as before.
    ("data[i] % 1000", "1000", 1000),
    # The smaller of the analysis' bound and the spec's size.
    ("data[i] & 4095", "1000", 1000),
])
def test_histograms_are_privatised_in_shared_memory(bin_expr, bins, count, tmp_path):
    found = outcome("shared-privatize", HIST.replace("BIN", bin_expr), hist_spec(bins=bins))
    assert found.applicable, found.why
    (rw,) = found.rewrites
    assert f"kl_priv0[{count}]" in rw.source and "kl_private_add(" in rw.source and "break;" in rw.source
    compiles(rw.source, tmp_path)


@pytest.mark.parametrize("source,bins,why", [
    # A block's own window of bins: the spec's size bounds the whole array, not the window.
    (HIST.replace("BIN", "256 * blockIdx.x + data[i]"), "256*ceil_div(n,256)", "has no bound"),
    (HIST.replace("BIN", "data[i] & 65535"), "65536", "do not fit"),
    (HIST.replace("BIN", "data[i]"), "n", "do not fit"),
    (HIST.replace("BIN", "i % 256"), "256", "do not depend on loaded data"),
    (HIST.replace("BIN", "256 * blockIdx.x + (data[i] & 255) - (int)threadIdx.x"), "256*ceil_div(n,256)", "may be negative"),
    # A signed remainder of a loaded value may be negative in C.
    (HIST.replace("BIN", "1000 * blockIdx.x + data[i] % 1000"), "1000*ceil_div(n,256)", "may be negative"),
    (HIST.replace("&bins[BIN]", "(unsigned int*)&bins[data[i] & 255]"), "256", "is cast"),
    (HIST.replace("BIN", "data[i] & 255").replace("if (i >= n) return;", "if (i >= n) return; if (bins[0] > 5u) return;"),
     "256", "reads it"),
    (HIST.replace("BIN", "data[i] & 255").replace("int i =", "bins[0] = 0u; int i ="), "256", "without a barrier"),
])
def test_privatisation_refusals_name_the_missing_fact(source, bins, why):
    found = outcome("shared-privatize", source, hist_spec(bins=bins))
    assert not found.applicable and why in found.why, found.why


@needs_nvcc
def test_the_histogram_example_is_privatised(tmp_path):
    folder = ROOT / "examples" / "histogram"
    source, spec = (folder / "original.cu").read_text(), json.loads((folder / "spec.json").read_text())
    found = outcome("shared-privatize", source, spec)
    assert found.applicable, found.why
    compiles(found.rewrites[0].source, tmp_path)


def test_encoder_backward_targets_are_refused_with_their_facts():
    source, spec, _ = corpus("llmc_encoder_backward_kernel1")
    found = outcome("shared-privatize", source, spec)
    assert not found.applicable
    # The spec's size of the vocabulary's gradients bounds the targets, far beyond shared memory.
    assert "`dwte`" in found.why and "do not fit" in found.why
    assert "`dwpe`" in found.why and "do not depend on loaded data" in found.why


def test_value_range_bounds_masks_and_remainders():
    from kernel_lsp.core.analysis import Binding, analyze, split_block_base, value_range
    from kernel_lsp.core.source import preprocess

    facts = analyze(preprocess(HIST.replace("BIN", "256 * blockIdx.x + (data[i] % 100)")))["hist"]
    (atomic,) = [a for a in facts.accesses if a.kind == "atomic"]
    base, offset = split_block_base(atomic.index, facts)
    assert str(base) == "256*bid.x"
    binding = Binding.from_spec(parse_spec(hist_spec()))
    # The remainder of a loaded value that may be negative lies in (-100, 100).
    assert value_range(offset, facts, binding) == (-99, 99)


CG_TREE = """
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
__global__ void partial(const float* x, float* out, int n) {
    cg::thread_block cta = cg::this_thread_block();
    __shared__ float s[256];
    unsigned int tid = cta.thread_rank();
    unsigned int i = blockIdx.x * cta.size() + tid;
    s[tid] = i < n ? x[i] : 0.0f;
    cg::sync(cta);
    for (unsigned int st = cta.size() / 2; st > 0; st >>= 1) {
        if (tid < st) s[tid] += s[tid + st];
        cg::sync(cta);
    }
    if (tid == 0) out[blockIdx.x] = s[0];
}
"""


@needs_nvcc
def test_a_cooperative_groups_tree_is_a_tree(tmp_path):
    """cg::sync(cta) is a barrier and cta.thread_rank() the thread's slot: the tree is simulated as the
    __syncthreads one is, and rewritten the same way."""
    found = outcome("tree-to-shuffle", CG_TREE, spec_of("partial", 256, [{"n": 1000}]))
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "__shfl_xor_sync" in source and "cg::sync(cta);" in source
    compiles(source, tmp_path)


TILES = """
__global__ void chunks(const float* x, float* out, int n) {
    __shared__ float s[256];
    float total = 0.0f;
    for (int base = 0; base < n; base += blockDim.x) {
        int i = base + threadIdx.x;
        s[threadIdx.x] = i < n ? x[i] : 0.0f;
        __syncthreads();
        for (int st = blockDim.x / 2; st > 0; st >>= 1) {
            if (threadIdx.x < st) s[threadIdx.x] += s[threadIdx.x + st];
            __syncthreads();
        }
        if (threadIdx.x == 0) total += s[0];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = total;
}
"""


def test_a_tree_per_tile_is_summed_in_registers(tmp_path):
    found = outcome("tree-to-registers", TILES, spec_of("chunks", 256, [{"n": 1000}]))
    assert found.applicable, found.why
    source = found.rewrites[0].source
    assert "kl_a3 += (float)(i < n ? x[i] : 0.0f)" in source.replace("\n", " ")
    assert "if (threadIdx.x == 0) total += kl_total;" in source
    if shutil.which("nvcc"):
        compiles(source, tmp_path)


@pytest.mark.parametrize(("change", "why"), [
    (lambda s: s.replace("s[threadIdx.x] += s[threadIdx.x + st]", "s[threadIdx.x] = fmaxf(s[threadIdx.x], s[threadIdx.x + st])")
     .replace("total += s[0]", "total = fmaxf(total, s[0])"), "only sums are regrouped"),
    (lambda s: s.replace("if (threadIdx.x == 0) total += s[0];", "total += s[0];"), "other than thread 0"),
    (lambda s: s.replace("        if (threadIdx.x == 0) total += s[0];\n", "        if (threadIdx.x == 0) out[base] = s[0];\n"),
     "writes global memory"),
    (lambda s: s.replace("int i = base + threadIdx.x;", "int i = base + threadIdx.x; out[i] = 0.0f;"), "writes global memory"),
    (lambda s: s.replace("for (int base = 0; base < n; base += blockDim.x)", "for (int base = threadIdx.x; base < n; base += blockDim.x)"),
     "not proven the same for every thread"),
    # The rewritten loops step a counter of their own: the original's would be left unset.
    (lambda s: s.replace("    for (int base = 0;", "    int base;\n    for (base = 0;").replace(
        "out[blockIdx.x] = total;", "out[blockIdx.x] = total + base;"), "counter `base` is read after it"),
    (lambda s: s.replace("    for (int base = 0; base < n; base += blockDim.x) {", "    int base = 0;\n    for (; base < n; base += blockDim.x) {"),
     "counter `base` is set before the loop"),
])
def test_a_tree_per_tile_refuses_what_it_cannot_regroup(change, why):
    found = outcome("tree-to-registers", change(TILES), spec_of("chunks", 256, [{"n": 1000}]))
    assert not found.applicable and why in found.why, found.why


# A tree in shared memory down to a warp, then a cooperative-groups tile's shuffles and one atomic.
TREE_THEN_TILE = """
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
__global__ void total(const float* x, float* out, int n) {
    extern __shared__ float s[];
    const int t = threadIdx.x;
    const int i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int half = blockDim.x >> 1; half >= 32; half >>= 1) {
        if (t < half) s[t] += s[t + half];
        __syncthreads();
    }
    float v = s[t];
    cg::thread_block_tile<32> tile = cg::tiled_partition<32>(cg::this_thread_block());
    for (int d = tile.size() >> 1; d > 0; d >>= 1)
        v += tile.shfl_down(v, d);
    if (t == 0) atomicAdd(out, v);
}
"""


def tree_then_tile_spec(variants=({"n": 1000},)) -> dict:
    return {**spec_of("total", 256, list(variants), out_size="1"), "dynamic_smem": "1024"}


@needs_nvcc
def test_blocks_in_turn_keep_a_barrier_between_original_blocks_that_share_memory(tmp_path):
    """A tile's size() is its constant, not a thread index; each original block run in turn ends at a
    barrier, so the next one's stores into the shared tree wait for this one's reads."""
    found = outcome("atomic-to-block-reduce", TREE_THEN_TILE, tree_then_tile_spec())
    assert found.applicable, found.why
    coarsened = [rw for rw in found.rewrites if rw.grid_divide is not None]
    assert [rw.grid_divide for rw in coarsened] == [(8, 1, 1), (32, 1, 1)]
    for k, rw in enumerate(coarsened):
        assert rw.source.count("__syncthreads(); // the next original block reuses the shared arrays") == 1
        compiles(rw.source, tmp_path / str(k))


def test_blocks_in_turn_without_shared_memory_add_no_barrier():
    found = outcome("atomic-to-block-reduce", ATOMIC, spec_of("total", 256, [{"n": 1000}], out_size="1"))
    coarsened = [rw for rw in found.rewrites if rw.grid_divide is not None]
    assert [rw.grid_divide for rw in coarsened] == [(8, 1, 1), (32, 1, 1)]
    assert all("the next original block" not in rw.source for rw in coarsened)


def test_a_kernel_with_barriers_that_returns_is_refused():
    source = TREE_THEN_TILE.replace("    const int i =", "    if (blockIdx.x > 4096) return;\n    const int i =")
    found = outcome("atomic-to-block-reduce", source, tree_then_tile_spec())
    assert not found.applicable and "return" in found.why, found.why


UNDER_IF = """
__global__ void partial(const float* x, float* out, int n) {
    __shared__ float s[256];
    unsigned int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[tid] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (TEST) {
        for (unsigned int st = blockDim.x / 2; st > 0; st >>= 1) {
            if (tid < st) s[tid] += s[tid + st];
            __syncthreads();
        }
        if (tid == 0) out[blockIdx.x] = s[0];
    }
}
"""


@needs_nvcc
@pytest.mark.parametrize("test", ["n > 64", "blockIdx.x != gridDim.x - 1 || n % 256 == 0"])
def test_a_tree_under_a_test_every_thread_of_the_block_shares_is_rewritten(test, tmp_path):
    found = outcome("tree-to-shuffle", UNDER_IF.replace("TEST", test), spec_of("partial", 256, [{"n": 1000}]))
    assert found.applicable, found.why
    compiles(found.rewrites[0].source, tmp_path)


@pytest.mark.parametrize("test", ["tid < 200", "x[i] > 0.5f", "i < n"])
def test_a_tree_under_a_thread_dependent_test_is_refused(test):
    found = outcome("tree-to-shuffle", UNDER_IF.replace("TEST", test), spec_of("partial", 256, [{"n": 1000}]))
    assert not found.applicable and "sits under a condition" in found.why, found.why


# A warp (or a group of a warp's lanes) per row, its lanes' sums combined by a warp-synchronous tree on
# volatile shared memory, the group's first thread storing the row's total (the pre-Volta idiom, a race
# on Volta and later without __syncwarp).
GROUP_TREE = """
__global__ void rows(const float* a, float* y, int nrows, int cols) {
    __shared__ volatile float part[256];
    int t = threadIdx.x;
    int lane = t & (LANES - 1);
    int row = (blockIdx.x * blockDim.x + t) / LANES;
    if (GUARD) {
        float sum = 0.0f;
        for (int j = lane; j < cols; j += LANES) sum += a[row * cols + j];
        part[t] = sum;
        STEPS
        if (lane == 0) y[row] = part[t];
    }
}
"""
GROUP_MAIN = r"""
int main() {
  const int nrows = ROWS, cols = 45;
  std::vector<float> a(nrows * cols), y(nrows, -1.0f);
  for (int k = 0; k < nrows * cols; k++) a[k] = (float)((k * 7919) % 1009) / 97.0f - 5.0f;
  kl_launch({(nrows * LANES + 255) / 256, 1, 1}, {256, 1, 1}, [&] { rows(a.data(), y.data(), nrows, cols); });
  // The tree's own order on the host: each lane's sum, then slot l += slot l + o for o = LANES/2 .. 1.
  for (int r = 0; r < nrows; r++) {
    float v[LANES];
    for (int l = 0; l < LANES; l++) { v[l] = 0.0f; for (int j = l; j < cols; j += LANES) v[l] += a[r * cols + j]; }
    for (int o = LANES / 2; o > 0; o >>= 1) for (int l = 0; l < o; l++) v[l] += v[l + o];
    printf("%a %a\n", y[r], v[0]);
  }
}
"""


def group_tree(lanes: int) -> str:
    """The row test splits a warp between rows when a row has fewer lanes than a warp: then the rows are
    a whole number of blocks and the test is a block's (the shuffles need every lane of a warp)."""
    steps = "\n        ".join(f"if (lane < {s}) part[t] += part[t + {s}];" for s in (16, 8, 4, 2, 1) if s < lanes)
    guard = "row < nrows" if lanes == 32 else "blockIdx.x < (unsigned)(nrows * LANES / 256)"
    return GROUP_TREE.replace("GUARD", guard).replace("LANES", str(lanes)).replace("STEPS", steps)


def group_spec(lanes: int) -> dict:
    return {"kernel": "rows", "params": [
        {"name": "a", "array": "float32", "size": "nrows*cols", "init": "uniform(-1,1)", "role": "in"},
        {"name": "y", "array": "float32", "size": "nrows", "init": "zeros", "role": "out"},
        {"name": "nrows", "scalar": "int32", "value": 8192}, {"name": "cols", "scalar": "int32", "value": 100}],
        "grid": [f"(nrows*{lanes}+255)/256", 1, 1], "block": [256, 1, 1], "variants": [{"nrows": 512, "cols": 3}]}


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler (g++) on PATH")
@pytest.mark.parametrize("lanes", [32, 16, 4])
def test_a_tree_per_group_of_lanes_becomes_shuffles_within_the_group(lanes, tmp_path):
    from cpu_cuda import run_on_cpu
    source = group_tree(lanes)
    found = outcome("tree-to-shuffle", source, group_spec(lanes))
    assert found.applicable and f"each group of {lanes} lanes" in found.why, found.why
    (rw,) = found.rewrites
    assert f"kl_o = {lanes // 2}; kl_o > 0" in rw.source and f"(threadIdx.x & {lanes - 1}u) == 0u" in rw.source
    assert "__syncwarp();" in rw.source and "part[t] += part[t + 1]" not in rw.source
    main = GROUP_MAIN.replace("LANES", str(lanes)).replace("ROWS", "37" if lanes == 32 else str(3 * 256 // lanes))
    # The butterfly pairs the lanes as the tree pairs the slots: the same sums in the same order. (The
    # original is not run: its tree relies on a warp's lockstep, which neither Volta nor the emulator keeps.)
    printed = run_on_cpu(rw.source, main, tmp_path, f"group{lanes}").split("\n")[:-1]
    assert len(printed) == (37 if lanes == 32 else 3 * 256 // lanes)
    assert all(line.split()[0] == line.split()[1] for line in printed), printed
    # A block's tree it is not: the rules that need the block's total do not see it.
    coarsen = outcome("tree-coarsen", source, group_spec(lanes))
    assert not coarsen.applicable and f"reduces groups of {lanes} lanes, not the block" in coarsen.why


@pytest.mark.parametrize("change,why", [
    # Every lane reads its own slot afterwards: the slots other than the groups' first are read.
    ("if (lane == 0) y[row] = part[t];", "reads a slot other than the root"),
    # The row test split by lane: part of a warp would miss the shuffles.
    ("if (row < nrows) {", "that the threads of a warp may not share"),
    # Rows of 16 lanes under a row test: a warp holds two rows, which the test may part.
    ("lanes=16", "that the threads of a warp may not share"),
    # A group's first thread reads the next warp's slot: its group's tree does not reach there.
    ("y[row] = part[t];", "outside the block's slots"),
])
def test_a_tree_per_group_refuses_what_it_cannot_prove(change, why):
    source = group_tree(32)
    changed = {
        "if (lane == 0) y[row] = part[t];": source.replace("if (lane == 0) y[row] = part[t];", "y[row * 32 + lane] = part[t];"),
        "if (row < nrows) {": source.replace("if (row < nrows) {", "if (row < nrows && lane < 20) {"),
        "y[row] = part[t];": source.replace("y[row] = part[t];", "y[row] = part[t + 32];"),
        "lanes=16": group_tree(16).replace("blockIdx.x < (unsigned)(nrows * 16 / 256)", "row < nrows"),
    }[change]
    found = outcome("tree-to-shuffle", changed, group_spec(16 if change == "lanes=16" else 32))
    assert not found.applicable and why in found.why, found.why


@needs_nvcc
def test_the_shoc_csr_vector_tree_becomes_shuffles_and_compiles(tmp_path):
    source, spec, folder = corpus("shoc_spmv_csr_vector")
    (rw,) = outcome("tree-to-shuffle", source, spec).rewrites
    assert "decltype(+partialSums[0]) kl_v0 = partialSums[threadIdx.x];" in rw.source
    compiles(rw.source, tmp_path, folder)
