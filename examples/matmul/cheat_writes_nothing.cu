// BROKEN (writes nothing): a "rewrite" whose bounds test was inverted while refactoring,
// so no thread ever stores. The kernel is very fast and C keeps whatever it held: the
// harness poisons C with NaN before every launch, so the outputs are all poison:
// nan_or_inf (or mismatch), never a pass thanks to stale correct data.
#define TILE 32

extern "C" __global__ void matmul(const float* A, const float* B, float* C, int M, int N, int K)
{
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    if (row >= M && col >= N && row < M) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) {
            acc += A[row * K + k] * B[k * N + col];
        }
        C[row * N + col] = acc;
    }
}
