// Chunked sum, bandwidth-bound version: each thread accumulates a strided slice of the
// chunk in a register (coalesced loads, no barriers in the loop, 4 independent
// accumulators for memory-level parallelism), then the block combines its 256 partials
// with warp shuffles (5 steps per warp) and one shared-memory exchange between warps.
// The summation order differs from the original's, so results differ by float32 rounding
// (well under the spec's rtol 1e-4 at the benchmark chunk size), and the order is fixed,
// so two runs give identical results. Launch: unchanged (block 256, one block per chunk).
__device__ __forceinline__ float warp_sum(float v)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

extern "C" __global__ void chunk_sum(const float* in, float* out, int n, int chunk)
{
    __shared__ float warp_totals[32];
    long long begin = (long long)blockIdx.x * chunk;
    long long end = begin + chunk < n ? begin + chunk : n;
    long long step = blockDim.x;
    float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
    long long i = begin + threadIdx.x;
    for (; i + 3 * step < end; i += 4 * step) {
        acc0 += in[i];
        acc1 += in[i + step];
        acc2 += in[i + 2 * step];
        acc3 += in[i + 3 * step];
    }
    for (; i < end; i += step) {
        acc0 += in[i];
    }
    float v = warp_sum((acc0 + acc1) + (acc2 + acc3));

    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    if (lane == 0) {
        warp_totals[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        int nwarps = (blockDim.x + 31) >> 5;
        v = lane < nwarps ? warp_totals[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) {
            out[blockIdx.x] = v;
        }
    }
}
