// CHEAT (sizes a multiple of 32 assumed): the 32x32 shared-memory tile of honest_tiled.cu
// without its edge checks, launched on a grid rounded down (cols/32 x rows/32 blocks). Right
// exactly when both sizes are multiples of 32, as the spec's 8192 x 8192 is; a spec without
// variants never shows anything else. At rows = 8191 the grid drops the last 31 rows, whose
// outputs stay poisoned: size_dependent, at the first size the harness tries itself.
// Launch: block (32, 8), grid (cols/32, rows/32) (the manifest's candidate_launch).
#define TILE 32
#define BLOCK_ROWS 8

extern "C" __global__ void transpose(float* out, const float* in, int rows, int cols)
{
    __shared__ float tile[TILE][TILE + 1];

    int c = blockIdx.x * TILE + threadIdx.x;
    int r0 = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        tile[threadIdx.y + j][threadIdx.x] = in[(r0 + j) * cols + c];
    }
    __syncthreads();

    int oc = blockIdx.y * TILE + threadIdx.x;
    int or0 = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        out[(or0 + j) * rows + oc] = tile[threadIdx.x][threadIdx.y + j];
    }
}
