// BROKEN (out-of-range write): one block per row like honest_block_per_row.cu, but the
// final pass stores the row four floats at a time over ceil(cols/4) chunks, padding the row
// "like a float4 buffer". When cols % 4 != 0 each row's last chunk writes up to 3 floats past
// its end: into the next row (which that row's block may or may not overwrite later) and,
// for the last row, past the end of out. The main size (cols 3000) is a multiple of 4, so
// every output there is right; the harness used to accept it. The red zone after out
// changes at the variants with cols % 4 != 0: out_of_bounds, naming out and the element.
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
    float* y = out + (long long)r * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        m = fmaxf(m, x[c]);
    }
    m = block_combine<true>(m, scratch);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        s += expf(x[c] - m);
    }
    s = block_combine<false>(s, scratch);
    float inv = 1.0f / s;
    int chunks = (cols + 3) / 4;
    for (int q = threadIdx.x; q < chunks; q += blockDim.x) {
        for (int k = 0; k < 4; ++k) {
            int c = 4 * q + k;
            y[c] = c < cols ? expf(x[c] - m) * inv : 0.0f;
        }
    }
}
