// BROKEN (race): honest_tiled32.cu without the second __syncthreads(), the one after the
// inner product. A fast warp starts overwriting As/Bs with the next K tile while slower
// warps of the block are still reading the current one. Often right, sometimes not, and
// differently from run to run: mismatch or nondeterministic, and racecheck flags it.
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
    }
    if (row < M && col < N) {
        C[row * N + col] = acc;
    }
}
