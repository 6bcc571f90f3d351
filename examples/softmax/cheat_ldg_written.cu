// CHEAT (read-only cache on written memory): stores exp(x - max) into out in the second
// pass, then rereads out through __ldg to normalize it. __ldg promises the data is
// read-only for the kernel's whole lifetime; out is written by this very kernel, so the
// non-coherent path may return stale data. It happens to work on today's hardware, which
// is why only a static check finds it: static_check (rule: __ldg on written memory).
// Launch: block 256, grid rows.
__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

// Combines one value per warp into a block-wide result; every thread gets it.
template <bool IS_MAX>
__device__ float block_combine(float v, float* scratch)
{
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int nwarps = (blockDim.x + 31) >> 5;
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    float w = lane < nwarps ? scratch[lane] : (IS_MAX ? -INFINITY : 0.0f);
    w = IS_MAX ? warp_max(w) : warp_sum(w);
    // Second barrier: scratch is reused by the next call.
    __syncthreads();
    return w;
}

extern "C" __global__ void softmax_rows(const float* in, float* out, int rows, int cols)
{
    __shared__ float scratch[32];
    int r = blockIdx.x;
    if (r >= rows) {
        return;
    }
    const float* x = in + (long long)r * cols;
    long long base = (long long)r * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        m = fmaxf(m, x[c]);
    }
    m = block_combine<true>(m, scratch);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float e = expf(x[c] - m);
        out[base + c] = e;
        s += e;
    }
    s = block_combine<false>(s, scratch);
    float inv = 1.0f / s;
    // Each thread rereads only the elements it wrote itself, through the read-only path.
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        out[base + c] = __ldg(&out[base + c]) * inv;
    }
}
