// BROKEN (signature changed): a square-only transpose that takes one size `n` instead of
// `rows, cols`. The harness launches kernels with the spec's argument list, so a rewrite
// whose parameter list differs from the original's is rejected before any GPU time.
#define TILE 32
#define BLOCK_ROWS 8

extern "C" __global__ void transpose(float* out, const float* in, int n)
{
    __shared__ float tile[TILE][TILE + 1];

    int c = blockIdx.x * TILE + threadIdx.x;
    int r0 = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        if (r0 + j < n && c < n) {
            tile[threadIdx.y + j][threadIdx.x] = in[(r0 + j) * n + c];
        }
    }
    __syncthreads();
    int oc = blockIdx.y * TILE + threadIdx.x;
    int or0 = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        if (or0 + j < n && oc < n) {
            out[(or0 + j) * n + oc] = tile[threadIdx.x][threadIdx.y + j];
        }
    }
}
