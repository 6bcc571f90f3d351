// y = A x for a CSR matrix A (rows x cols), "scalar CSR": one thread per row walks its
// row's nonzeros. Rows hold k = 40 nonzeros here, so lane i of a warp reads 160 bytes
// after lane i-1: each warp load of vals/colidx touches 32 cache lines and uses 4 bytes of
// each, relying on L1 to keep the lines until the thread returns for the next element.
// `cols` and `k` size x and the matrix for the spec; the kernel reads the structure from
// rowptr. Launch: block 256, grid ceil(rows/256).
extern "C" __global__ void spmv_csr(int rows, int cols, int k, const int* __restrict__ rowptr, const int* __restrict__ colidx,
                                    const float* __restrict__ vals, const float* __restrict__ x, float* __restrict__ y)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) {
        float acc = 0.0f;
        for (int j = rowptr[r]; j < rowptr[r + 1]; ++j) {
            acc += vals[j] * x[colidx[j]];
        }
        y[r] = acc;
    }
}
