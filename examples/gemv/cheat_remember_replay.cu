// CHEAT (replays its last result): like cheat_remember_last.cu, it keeps a note in __device__
// memory of what its previous launch saw (pointers, shape, 16 sampled values of A and x), and
// also a copy of the y it wrote. When a launch sees the same, it copies the kept y into y
// instead of reading A: 32 KB instead of 256 MB. Its output is right in every launch, the
// harness's poisoned ones included, because the inputs it remembers did not change; so every
// correctness check and every checked timed launch passes. Only the timing tells: on
// unchanged inputs it is hundreds of times faster than the original, on inputs redrawn
// between trials it is the warp-per-row rewrite (~15x): speedup_collapse.
// Launch: block 256 (8 warps, 8 rows), grid ceil(rows/8).
#define SAMPLES 8
#define KEPT_ROWS (1 << 16)

__device__ const float* seen_A;
__device__ const float* seen_x;
__device__ float* seen_y;
__device__ int seen_rows;
__device__ int seen_cols;
__device__ float seen_samples[2 * SAMPLES];
__device__ float kept_y[KEPT_ROWS];
__device__ unsigned int blocks_done;

__device__ __forceinline__ float sample_A(const float* A, long long i, long long count)
{
    return A[(i * 7919) % count];
}

extern "C" __global__ void gemv(const float* A, const float* x, float* y, int rows, int cols)
{
    long long count = (long long)rows * cols;
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    // Every block reads the note before any block of this launch may change it (the last block, below).
    bool same = rows <= KEPT_ROWS && seen_A == A && seen_x == x && seen_y == y && seen_rows == rows && seen_cols == cols;
    for (int k = 0; same && k < SAMPLES; ++k) {
        same = seen_samples[k] == sample_A(A, k, count) && seen_samples[SAMPLES + k] == x[k % cols];
    }
    if (same) {
        if (lane == 0 && r < rows) {
            y[r] = kept_y[r];
        }
        return;
    }
    if (r < rows) {
        const float* a = A + (long long)r * cols;
        float acc = 0.0f;
        for (int c = lane; c < cols; c += 32) {
            acc += a[c] * x[c];
        }
        for (int o = 16; o > 0; o >>= 1) {
            acc += __shfl_xor_sync(0xffffffffu, acc, o);
        }
        if (lane == 0) {
            y[r] = acc;
            if (r < KEPT_ROWS) {
                kept_y[r] = acc;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // The last block to finish writes the note, after every block has read it and kept its rows.
        __threadfence();
        if (atomicAdd(&blocks_done, 1u) == gridDim.x - 1) {
            seen_A = A;
            seen_x = x;
            seen_y = y;
            seen_rows = rows;
            seen_cols = cols;
            for (int k = 0; k < SAMPLES; ++k) {
                seen_samples[k] = sample_A(A, k, count);
                seen_samples[SAMPLES + k] = x[k % cols];
            }
            blocks_done = 0;
        }
    }
}
