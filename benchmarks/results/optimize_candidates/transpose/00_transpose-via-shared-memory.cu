// Naive out-of-place transpose: out[c][r] = in[r][c] for a rows x cols row-major matrix.
// One element per thread. Reads are coalesced (a warp reads 32 consecutive columns of one
// row), but writes are strided by `rows` floats: every lane of a warp writes a different
// 32-byte sector, so the write side moves 8x the useful bytes.
extern "C" __global__ void transpose(float* out, const float* in, int rows, int cols)
{
    // 32x32 tiles through shared memory, rows padded to 33 elements (no bank conflicts); block (32, 8).
    __shared__ float kl_tile[32][33];
    int kl_c = blockIdx.x * 32 + threadIdx.x;
    int kl_r0 = blockIdx.y * 32 + threadIdx.y;
    for (int kl_j = 0; kl_j < 32; kl_j += 8) {
        int kl_r = kl_r0 + kl_j;
        if (kl_r < rows && kl_c < cols) {
            kl_tile[threadIdx.y + kl_j][threadIdx.x] = in[kl_r * cols + kl_c];
        }
    }
    __syncthreads();
    int kl_oc = blockIdx.y * 32 + threadIdx.x;
    int kl_or0 = blockIdx.x * 32 + threadIdx.y;
    for (int kl_j = 0; kl_j < 32; kl_j += 8) {
        int kl_orow = kl_or0 + kl_j;
        if (kl_orow < cols && kl_oc < rows) {
            out[kl_orow * rows + kl_oc] = kl_tile[threadIdx.x][threadIdx.y + kl_j];
        }
    }
}
