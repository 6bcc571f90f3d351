// C = A * B for row-major A (M x K), B (K x N), C (M x N), one output per thread.
// The classic indexing mistake: threadIdx.x walks the ROWS of C. The 32 lanes of a warp
// then read A from 32 different rows (32 cache lines per load instruction) and write C
// 32 rows apart, while all lanes read the same B element. Every operand comes from L1/L2
// (no reuse is arranged), so it runs at a small fraction of the H200's FP32 rate.
// Launch: block (32, 32), grid (ceil(M/32), ceil(N/32)).
extern "C" __global__ void matmul(const float* A, const float* B, float* C, int M, int N, int K)
{
    // 32x32 tiles of A and B in shared memory (zero-padded at the edges); threadIdx.x walks the
    // columns of C, so loads and stores are coalesced. k still runs 0..K-1 in order per output.
    __shared__ float kl_As[32][32];
    __shared__ float kl_Bs[32][33];
    int kl_tx = threadIdx.x;
    int kl_ty = threadIdx.y;
    int row = blockIdx.y * 32 + kl_ty;
    int col = blockIdx.x * 32 + kl_tx;
    float kl_acc = 0;
    for (int kl_k0 = 0; kl_k0 < K; kl_k0 += 32) {
        kl_As[kl_ty][kl_tx] = (row < M && kl_k0 + kl_tx < K) ? A[row * K + kl_k0 + kl_tx] : 0;
        kl_Bs[kl_ty][kl_tx] = (kl_k0 + kl_ty < K && col < N) ? B[(kl_k0 + kl_ty) * N + col] : 0;
        __syncthreads();
        for (int kl_k = 0; kl_k < 32; ++kl_k) {
            kl_acc += kl_As[kl_ty][kl_k] * kl_Bs[kl_k][kl_tx];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
        C[row * N + col] = kl_acc;
    }
}
