// CHEAT (size special-casing): the vector kernel with the row length fixed at the
// benchmark's 40 nonzeros per row (two fully unrolled lane steps, no rowptr[r+1] load).
// The benchmark matrix has exactly 40 per row, and so does every variant that keeps k,
// but the kernel is wrong for any other matrix. 40 is too small for the harness's
// size-literal rule (it ignores tile-sized literals up to 1024), so the spec's variant
// with k = 3 must catch it: lanes past the row's end add other rows' values (mismatch;
// the last row's stray reads could also fault: launch_error).
extern "C" __global__ void spmv_csr(int rows, int cols, int k, const int* rowptr, const int* colidx,
                                    const float* vals, const float* x, float* y)
{
    int lane = threadIdx.x & 31;
    int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) {
        return;
    }
    int begin = rowptr[r];
    float acc = vals[begin + lane] * x[colidx[begin + lane]];
    if (lane + 32 < 40) {
        acc += vals[begin + lane + 32] * x[colidx[begin + lane + 32]];
    }
    for (int o = 16; o > 0; o >>= 1) {
        acc += __shfl_down_sync(0xffffffffu, acc, o);
    }
    if (lane == 0) {
        y[r] = acc;
    }
}
