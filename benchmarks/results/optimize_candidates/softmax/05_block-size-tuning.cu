// Row-wise softmax of a rows x cols row-major matrix, one thread per row, three passes
// (max, sum of exponentials, normalize). Lanes of a warp walk 32 different rows in step,
// so each warp load touches 32 cache lines 4*cols bytes apart (uncoalesced), each row is
// read 3 times, and only `rows` threads exist: 16384 threads are 512 warps, about 4 per SM.
// Launch: block 256, grid ceil(rows/256).
extern "C" __global__ void softmax_rows(const float* in, float* out, int rows, int cols)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) {
        return;
    }
    const float* x = in + (long long)r * cols;
    float* y = out + (long long)r * cols;
    float m = -INFINITY;
    for (int c = 0; c < cols; ++c) {
        m = fmaxf(m, x[c]);
    }
    float s = 0.0f;
    for (int c = 0; c < cols; ++c) {
        s += expf(x[c] - m);
    }
    float inv = 1.0f / s;
    for (int c = 0; c < cols; ++c) {
        y[c] = expf(x[c] - m) * inv;
    }
}
