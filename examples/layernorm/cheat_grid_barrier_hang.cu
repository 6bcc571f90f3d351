// BROKEN (hangs on large inputs): block per row, then a software grid barrier (an arrival
// counter and a generation word in __device__ memory) so that a second phase could use every
// row's statistics. A spin barrier needs every block resident at once: with rows blocks of
// 256 threads that holds for the small variants (at most ~1000 blocks fit on an H200) but not
// at the main size (16384 blocks): the resident blocks spin forever waiting for blocks that
// can never start. The harness kills the launch after max(1 s, 50 x the original's time):
// timeout, in seconds instead of the 120 s overall limit.
// Launch: block 256, grid rows.
__device__ unsigned int arrived;
__device__ volatile unsigned int generation;

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

__device__ void grid_barrier()
{
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int gen = generation;
        __threadfence();
        if (atomicAdd(&arrived, 1u) == gridDim.x - 1) {
            arrived = 0;
            __threadfence();
            generation = gen + 1;
        } else {
            while (generation == gen) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

extern "C" __global__ void layernorm(const float* x, const float* gamma, const float* beta, float* y, int rows, int cols, float eps)
{
    __shared__ float scratch[32];
    int r = blockIdx.x;
    const float* xr = x + (long long)r * cols;
    float* yr = y + (long long)r * cols;
    float2 st = make_float2(0.0f, 0.0f);
    if (r < rows) {
        st = row_stats(xr, cols, eps, scratch);
    }
    grid_barrier();
    if (r >= rows) {
        return;
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        yr[c] = (xr[c] - st.x) * st.y * gamma[c] + beta[c];
    }
}
