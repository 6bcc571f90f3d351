// C = A * B for row-major A (M x K), B (K x N), C (M x N), one output per thread.
// The classic indexing mistake: threadIdx.x walks the ROWS of C. The 32 lanes of a warp
// then read A from 32 different rows (32 cache lines per load instruction) and write C
// 32 rows apart, while all lanes read the same B element. Every operand comes from L1/L2
// (no reuse is arranged), so it runs at a small fraction of the H200's FP32 rate.
// Launch: block (32, 32), grid (ceil(M/32), ceil(N/32)).
extern "C" __global__ void matmul(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K)
{
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    int col = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < M && col < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) {
            acc += A[row * K + k] * B[k * N + col];
        }
        C[row * N + col] = acc;
    }
}
