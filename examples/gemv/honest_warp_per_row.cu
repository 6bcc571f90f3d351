// One warp per row: the 32 lanes read consecutive columns (each warp-wide load is one
// 128-byte line of A), keep a partial sum in a register, and combine the partial sums with
// shuffles. The sum's order differs from the original's sequential one (float rounding,
// ~1e-6 relative, inside rtol 1e-4).
// Launch: block 256 (8 warps, 8 rows), grid ceil(rows/8).
extern "C" __global__ void gemv(const float* A, const float* x, float* y, int rows, int cols)
{
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) {
        return;
    }
    const float* a = A + (long long)r * cols;
    float acc = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        acc += a[c] * x[c];
    }
    for (int o = 16; o > 0; o >>= 1) {
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    }
    if (lane == 0) {
        y[r] = acc;
    }
}
