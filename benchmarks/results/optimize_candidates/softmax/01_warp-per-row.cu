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

static __device__ __forceinline__ float kl_warp_sum_float_softmax_rows(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        float a = v, b = __shfl_xor_sync(0xffffffffu, v, o);
        v = a + b;
    }
    return v;
}

extern "C" __global__ void softmax_rows(const float* in, float* out, int rows, int cols)
{
    int kl_lane = threadIdx.x & 31;
    int r = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if (r >= rows) {
        return;
    }
    const float* x = in + (long long)r * cols;
    float* y = out + (long long)r * cols;
    float m = -INFINITY;
    for (int c = kl_lane; c < cols; c += 32) {
        m = fmaxf(m, x[c]);
    }
    m = kl_warp_max_float_softmax_rows(m);
    float s = 0.0f;
    for (int c = kl_lane; c < cols; c += 32) {
        s += expf(x[c] - m);
    }
    s = kl_warp_sum_float_softmax_rows(s);
    float inv = 1.0f / s;
    for (int c = kl_lane; c < cols; c += 32) {
        y[c] = expf(x[c] - m) * inv;
    }
}
