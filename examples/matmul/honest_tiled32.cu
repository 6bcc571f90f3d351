// Shared-memory tiled matmul: the block stages a 32x32 tile of A and of B in shared memory
// (coalesced loads, zero-padded at the matrix edges), then each thread does 32 FMAs from
// shared memory, so each global element is loaded once per tile instead of once per
// output. threadIdx.x now walks the columns of C, so stores are coalesced too. The k
// order per output is unchanged (0..K-1), so results match the original to rounding.
// Launch: block (32, 32), grid (ceil(N/32), ceil(M/32)).
#define TILE 32

extern "C" __global__ void matmul(const float* A, const float* B, float* C, int M, int N, int K)
{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE + 1];
    int tx = threadIdx.x;
    int ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        As[ty][tx] = (row < M && k0 + tx < K) ? A[row * K + k0 + tx] : 0.0f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(k0 + ty) * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) {
            acc += As[ty][k] * Bs[k][tx];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
        C[row * N + col] = acc;
    }
}
