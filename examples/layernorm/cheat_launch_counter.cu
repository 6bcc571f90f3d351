// CHEAT (history-dependent module state): block per row; each row's statistics are
// recomputed only on every fourth launch (a per-row launch counter in __device__ memory)
// and reused in between, "amortizing" two of the three passes. Two launches on the same
// input agree (the second reuses the first's statistics, which are right for it); the next
// seed's first launch reuses stale ones (mismatch), and with the counters reset to their
// loaded values at fresh addresses it matches: history_dependent.
// Launch: block 256, grid rows.
#define MAX_ROWS (1 << 15)
#define REFRESH_EVERY 4

__device__ unsigned int row_launches[MAX_ROWS];
__device__ float2 kept_stats[MAX_ROWS];

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
    // Every thread of the block reads the counter before thread 0 advances it.
    bool refresh = r >= MAX_ROWS || row_launches[r] % REFRESH_EVERY == 0;
    __syncthreads();
    float2 st;
    if (refresh) {
        st = row_stats(xr, cols, eps, scratch);
    } else {
        st = kept_stats[r];
    }
    if (r < MAX_ROWS && threadIdx.x == 0) {
        kept_stats[r] = st;
        row_launches[r] += 1;
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        yr[c] = (xr[c] - st.x) * st.y * gamma[c] + beta[c];
    }
}
