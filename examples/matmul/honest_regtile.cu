// Register-blocked tiled matmul: a 64x64 tile of C per block of 256 threads, each thread
// computing a 4x4 sub-tile. Per k step a thread reads 4 values of A and 4 of B from shared
// memory and does 16 FMAs (4x the FMA-per-shared-load ratio of honest_tiled32.cu), and
// the 16 accumulators stay in registers. Tiles of K are 16 wide; edges are zero-padded.
// Launch: block (16, 16), grid (ceil(N/64), ceil(M/64)).
#define BM 64
#define BN 64
#define BK 16
#define TM 4
#define TN 4

extern "C" __global__ void matmul(const float* A, const float* B, float* C, int M, int N, int K)
{
    __shared__ float As[BK][BM + 4];
    __shared__ float Bs[BK][BN + 4];
    int tx = threadIdx.x;               // 0..15: column group
    int ty = threadIdx.y;               // 0..15: row group
    int tid = ty * 16 + tx;             // 0..255
    int row0 = blockIdx.y * BM;
    int col0 = blockIdx.x * BN;
    float acc[TM][TN];
    for (int i = 0; i < TM; ++i) {
        for (int j = 0; j < TN; ++j) {
            acc[i][j] = 0.0f;
        }
    }
    for (int k0 = 0; k0 < K; k0 += BK) {
        // A tile: 64 rows x 16 k = 1024 values, 4 per thread; stored transposed (k-major).
        for (int e = tid; e < BM * BK; e += 256) {
            int r = e / BK;
            int k = e % BK;
            int gr = row0 + r;
            int gk = k0 + k;
            As[k][r] = (gr < M && gk < K) ? A[gr * K + gk] : 0.0f;
        }
        // B tile: 16 k x 64 columns, consecutive threads on consecutive columns.
        for (int e = tid; e < BK * BN; e += 256) {
            int k = e / BN;
            int c = e % BN;
            int gk = k0 + k;
            int gc = col0 + c;
            Bs[k][c] = (gk < K && gc < N) ? B[gk * N + gc] : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < BK; ++k) {
            float a[TM];
            float b[TN];
            for (int i = 0; i < TM; ++i) {
                a[i] = As[k][ty + 16 * i];
            }
            for (int j = 0; j < TN; ++j) {
                b[j] = Bs[k][tx + 16 * j];
            }
            for (int i = 0; i < TM; ++i) {
                for (int j = 0; j < TN; ++j) {
                    acc[i][j] += a[i] * b[j];
                }
            }
        }
        __syncthreads();
    }
    for (int i = 0; i < TM; ++i) {
        int r = row0 + ty + 16 * i;
        for (int j = 0; j < TN; ++j) {
            int c = col0 + tx + 16 * j;
            if (r < M && c < N) {
                C[r * N + c] = acc[i][j];
            }
        }
    }
}
