// BROKEN: the tiled transpose without the __syncthreads() between filling the tile and
// reading it transposed. Each warp reads a column of the tile that the other 3 warps of
// the block write; with no barrier it reads stale shared memory from an earlier block.
// Results depend on warp scheduling: wrong, and different from run to run.
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
    // (barrier omitted: a warp reads tile columns other warps may not have written yet)

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
