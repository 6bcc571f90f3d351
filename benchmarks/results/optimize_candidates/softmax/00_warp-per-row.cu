// Row-wise softmax of a rows x cols row-major matrix, one thread per row, three passes
// (max, sum of exponentials, normalize). Lanes of a warp walk 32 different rows in step,
// so each warp load touches 32 cache lines 4*cols bytes apart (uncoalesced), each row is
// read 3 times, and only `rows` threads exist: 16384 threads are 512 warps, about 4 per SM.
// Launch: block 256, grid ceil(rows/256).
static __device__ __forceinline__ float kl_warp_max_float_softmax_rows(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        float a = v, b = __shfl_xor_sync(0xffffffffu, v, o);
        v = a > b ? a : b;
    }
    return v;
}

// Every thread gets the block's result; the trailing barrier lets the scratch be reused.
static __device__ float kl_block_max_float_softmax_rows(float v, float* scratch)
{
    v = kl_warp_max_float_softmax_rows(v);
    if ((threadIdx.x & 31) == 0) {
        scratch[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    int nwarps = (blockDim.x + 31) >> 5;
    float w = scratch[0];
    for (int i = 1; i < nwarps; ++i) {
        float a = w, b = scratch[i];
        w = a > b ? a : b;
    }
    __syncthreads();
    return w;
}

static __device__ __forceinline__ float kl_warp_sum_float_softmax_rows(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        float a = v, b = __shfl_xor_sync(0xffffffffu, v, o);
        v = a + b;
    }
    return v;
}

// Every thread gets the block's result; the trailing barrier lets the scratch be reused.
static __device__ float kl_block_sum_float_softmax_rows(float v, float* scratch)
{
    v = kl_warp_sum_float_softmax_rows(v);
    if ((threadIdx.x & 31) == 0) {
        scratch[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    int nwarps = (blockDim.x + 31) >> 5;
    float w = scratch[0];
    for (int i = 1; i < nwarps; ++i) {
        float a = w, b = scratch[i];
        w = a + b;
    }
    __syncthreads();
    return w;
}

extern "C" __global__ void softmax_rows(const float* in, float* out, int rows, int cols)
{
    __shared__ float kl_scratch_float[32];
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
    m = kl_block_max_float_softmax_rows(m, kl_scratch_float);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        s += expf(x[c] - m);
    }
    s = kl_block_sum_float_softmax_rows(s, kl_scratch_float);
    float inv = 1.0f / s;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        y[c] = expf(x[c] - m) * inv;
    }
}
