// Naive out-of-place transpose: out[c][r] = in[r][c] for a rows x cols row-major matrix.
// One element per thread. Reads are coalesced (a warp reads 32 consecutive columns of one
// row), but writes are strided by `rows` floats: every lane of a warp writes a different
// 32-byte sector, so the write side moves 8x the useful bytes.
extern "C" __global__ void transpose(float* out, const float* in, int rows, int cols)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < rows && c < cols) {
        out[c * rows + r] = __ldg(&in[r * cols + c]);
    }
}
