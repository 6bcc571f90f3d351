// "Vector CSR": one warp per row. The 32 lanes read consecutive nonzeros of the row
// (coalesced vals/colidx loads), each keeps a partial sum, and a 5-step shuffle adds them.
// The summation order differs from the sequential original: float32 rounding only.
// Launch: block 256 (8 rows per block), grid ceil(rows/8).
extern "C" __global__ void spmv_csr(int rows, int cols, int k, const int* rowptr, const int* colidx,
                                    const float* vals, const float* x, float* y)
{
    int lane = threadIdx.x & 31;
    int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) {
        return;
    }
    int begin = rowptr[r];
    int end = rowptr[r + 1];
    float acc = 0.0f;
    for (int j = begin + lane; j < end; j += 32) {
        acc += vals[j] * x[colidx[j]];
    }
    for (int o = 16; o > 0; o >>= 1) {
        acc += __shfl_down_sync(0xffffffffu, acc, o);
    }
    if (lane == 0) {
        y[r] = acc;
    }
}
