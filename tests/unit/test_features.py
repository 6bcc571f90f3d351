"""Static kernel features on small kernels whose expected features are written next to them."""

from __future__ import annotations

from dataclasses import fields

import pytest

from kernel_lsp.core.features import FEATURE_DOCS, StaticFeatures, static_features
from kernel_lsp.core.index import build_index


def _features(source: str, name: str = "k") -> StaticFeatures:
    index = build_index(source)
    fn = index.function(name)
    assert fn is not None
    return static_features(fn, source, dict(index.constants))


def test_every_feature_is_documented() -> None:
    assert [f.name for f in fields(StaticFeatures)] == list(FEATURE_DOCS)
    assert all(doc.strip() for doc in FEATURE_DOCS.values())


SAXPY = """
__global__ void __launch_bounds__(256) k(int n, float a, const float* __restrict__ x, float* __restrict__ y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def test_saxpy() -> None:
    f = _features(SAXPY)
    assert (f.params, f.pointer_params, f.const_pointer_params, f.restrict_pointer_params, f.scalar_params) == (4, 2, 1, 2, 2)
    assert (f.global_loads_per_thread_est, f.global_stores_per_thread_est) == (2, 1)
    assert (f.strided_global_loads, f.strided_global_stores, f.transposed_store) == (0, 0, False)
    assert (f.thread_dependent_branches, f.intra_warp_divergence_hints) == (1, 0)  # a bounds check
    assert (f.has_launch_bounds, f.launch_bounds_max_threads) == (True, 256)
    assert not f.uses_2d_index and not f.grid_stride_loop and f.loops == 0
    assert f.as_dict()["restrict_pointer_params"] == 2.0


STRIDED = """
#define K 4
__global__ void k(const float* in, float* out, int n) {
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    float s = 0.0f;
    #pragma unroll
    for (int j = 0; j < K; ++j) s += in[tid * K + j];
    out[threadIdx.x * 2] = s;
}
"""


def test_strided_access_and_trip_weighted_loads() -> None:
    f = _features(STRIDED)
    assert (f.strided_global_loads, f.strided_global_stores) == (1, 1)
    assert f.global_loads_per_thread_est == 4  # one load in a 4-trip loop
    assert (f.loops, f.fixed_trip_loops, f.unrolled_loops) == (1, 1, 1)


TRANSPOSE = """
#define N 1024
__global__ void k(const float* in, float* out) {
    int x = blockIdx.x * 32 + threadIdx.x;
    int y = blockIdx.y * 32 + threadIdx.y;
    out[x * N + y] = in[y * N + x];
}
"""


def test_naive_transpose() -> None:
    f = _features(TRANSPOSE)
    assert f.transposed_store and f.strided_global_stores == 1
    assert f.strided_global_loads == 0  # the read is row-major: coalesced
    assert f.uses_2d_index


TILED = """
#define TILE 32
__global__ void k(const float* in, float* out, int n) {
    __shared__ float tile[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    tile[ty][tx] = in[(blockIdx.y * TILE + ty) * n + blockIdx.x * TILE + tx];
    __syncthreads();
    out[(blockIdx.x * TILE + ty) * n + blockIdx.y * TILE + tx] = tile[tx][ty];
}
"""


def test_tiled_transpose_bank_conflict_hint() -> None:
    f = _features(TILED)
    assert (f.shared_decls, f.shared_bytes_static, f.syncs) == (1, 32 * 32 * 4, 1)
    assert f.shared_column_access == 1  # tile[tx][ty] without padding
    assert (f.strided_global_loads, f.strided_global_stores, f.transposed_store) == (0, 0, False)


REDUCE = """
__global__ void k(const float* in, float* out, int n) {
    extern __shared__ float buf[];
    __shared__ int counter;
    int tid = threadIdx.x;
    int lane = tid % 32;
    int warp = tid / 32;
    float v = 0;
    for (int i = blockIdx.x * blockDim.x + tid; i < n; i += blockDim.x * gridDim.x) v += in[i];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffff, v, off);
    if (lane == 0) buf[warp] = v;
    if (warp == 0) { atomicAdd(&counter, 1); }
    __syncthreads();
    if (tid < 16) { v = buf[tid]; }
    unsigned m = __ballot_sync(0xffffffff, v > 0);
    if (tid == 0) atomicAdd(out, v);
}
"""


def test_reduction_features() -> None:
    f = _features(REDUCE)
    assert f.grid_stride_loop
    assert (f.warp_shuffles, f.warp_votes) == (1, 1)
    assert (f.atomics, f.shared_atomics) == (2, 1)
    assert f.dynamic_shared and f.shared_bytes_static == 4
    # lane == 0, tid < 16, tid == 0 split warps; warp == 0 is warp-uniform.
    assert (f.thread_dependent_branches, f.intra_warp_divergence_hints) == (3, 3)
    assert (f.loops, f.fixed_trip_loops, f.max_loop_depth) == (2, 1, 1)


def test_grid_stride_through_a_local_and_type_flags() -> None:
    source = """
#include <cuda_fp16.h>
__device__ float helper(float v) { return v; }
__global__ void k(const __half* in, double* out, int n) {
    int stride = blockDim.x * gridDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = helper(__half2float(in[i]));
}
"""
    f = _features(source)
    assert f.grid_stride_loop and f.uses_half and f.uses_double
    assert f.device_function_calls == 1


def test_unknown_shared_size_is_none_and_left_out_of_dict() -> None:
    f = _features("__global__ void k(int n) { __shared__ float s[n_unknown]; }")
    assert f.shared_bytes_static is None
    assert "shared_bytes_static" not in f.as_dict()


@pytest.mark.parametrize("source", ["__global__ void k() {}", "__global__ void k(float* p) { p[ = ; }"])
def test_degenerate_kernels(source: str) -> None:
    f = _features(source)
    assert f.loops == 0 and f.global_stores_per_thread_est == 0


def test_very_deep_expression_does_not_overflow_the_stack() -> None:
    expr = "+".join(["p[threadIdx.x]"] * 3000)
    f = _features(f"__global__ void k(float* p) {{ p[0] = {expr}; }}")
    assert f.global_stores_per_thread_est == 1
