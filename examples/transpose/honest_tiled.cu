// Shared-memory tiled transpose: a 32x32 tile is read with coalesced loads into shared
// memory, then written back transposed with coalesced stores. The tile row is padded to
// 33 floats so the column-wise reads hit 32 different banks (no bank conflicts).
// Launch: block (32, 8), one block per 32x32 tile; each thread moves 4 elements.
#define TILE 32
#define BLOCK_ROWS 8

extern "C" __global__ void transpose(float* out, const float* in, int rows, int cols)
{
    __shared__ float tile[TILE][TILE + 1];

    int c = blockIdx.x * TILE + threadIdx.x;
    int r0 = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        int r = r0 + j;
        if (r < rows && c < cols) {
            tile[threadIdx.y + j][threadIdx.x] = in[r * cols + c];
        }
    }
    __syncthreads();

    // Output tile origin: (row = blockIdx.x*TILE, col = blockIdx.y*TILE) in the cols x rows result.
    int oc = blockIdx.y * TILE + threadIdx.x;
    int or0 = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        int orow = or0 + j;
        if (orow < cols && oc < rows) {
            out[orow * rows + oc] = tile[threadIdx.x][threadIdx.y + j];
        }
    }
}
