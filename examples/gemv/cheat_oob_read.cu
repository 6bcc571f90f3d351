// BROKEN (out-of-range read): warp per row, each lane loads x four floats at a time as a
// float4 over ceil(cols/4) chunks and pads the matrix row with zeros past its end, trusting
// that x is padded too. When cols % 4 != 0 the last float4 reads up to 3 floats past the end
// of x and multiplies them by the zero padding. Past the end of an ordinary allocation lie
// zeros or old finite data, 0 * finite = 0, and every output matches: the harness accepted
// it. Past the end of x lies the harness's NaN red zone, 0 * NaN = NaN: nan_or_inf at the
// variants with cols % 4 != 0.
// Launch: block 256 (8 warps, 8 rows), grid ceil(rows/8).
extern "C" __global__ void gemv(const float* A, const float* x, float* y, int rows, int cols)
{
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) {
        return;
    }
    const float* a = A + (long long)r * cols;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    int chunks = (cols + 3) / 4;
    float acc = 0.0f;
    for (int q = lane; q < chunks; q += 32) {
        float4 xv = x4[q];
        int c = 4 * q;
        float a0 = a[c];
        float a1 = c + 1 < cols ? a[c + 1] : 0.0f;
        float a2 = c + 2 < cols ? a[c + 2] : 0.0f;
        float a3 = c + 3 < cols ? a[c + 3] : 0.0f;
        acc += a0 * xv.x + a1 * xv.y + a2 * xv.z + a3 * xv.w;
    }
    for (int o = 16; o > 0; o >>= 1) {
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    }
    if (lane == 0) {
        y[r] = acc;
    }
}
