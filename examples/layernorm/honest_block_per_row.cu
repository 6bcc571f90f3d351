// One 256-thread block per row: consecutive threads read consecutive columns (coalesced),
// the sums are combined with warp shuffles and a 32-entry shared array, and the second and
// third passes over the row (6 KB at the main size) hit in L1. Sums are reordered: float
// rounding, ~1e-6 relative, inside rtol 1e-4.
// Launch: block 256, grid rows.
__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

// The sum of one value per thread over the block; every thread gets it.
__device__ float block_sum(float v, float* scratch)
{
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    float w = lane < nwarps ? scratch[lane] : 0.0f;
    w = warp_sum(w);
    // Second barrier: scratch is reused by the next call.
    __syncthreads();
    return w;
}

// Mean and reciprocal standard deviation of one row, two passes like the original.
__device__ float2 row_stats(const float* xr, int cols, float eps, float* scratch)
{
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        sum += xr[c];
    }
    float mean = block_sum(sum, scratch) / cols;
    float sq = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float d = xr[c] - mean;
        sq += d * d;
    }
    return make_float2(mean, rsqrtf(block_sum(sq, scratch) / cols + eps));
}

extern "C" __global__ void layernorm(const float* x, const float* gamma, const float* beta, float* y, int rows, int cols, float eps)
{
    __shared__ float scratch[32];
    int r = blockIdx.x;
    if (r >= rows) {
        return;
    }
    const float* xr = x + (long long)r * cols;
    float* yr = y + (long long)r * cols;
    float2 st = row_stats(xr, cols, eps, scratch);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        yr[c] = (xr[c] - st.x) * st.y * gamma[c] + beta[c];
    }
}
