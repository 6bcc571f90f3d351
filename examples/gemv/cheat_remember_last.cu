// CHEAT (remembers its last launch): the warp-per-row rewrite, plus a note in __device__
// memory of what its previous launch saw: the three pointers, the shape and 16 sampled values
// of A and x. When a launch sees the same, it returns at once and writes nothing, as if the
// result from last time were still in y. Every check that draws new inputs, moves the buffers
// or changes the shape makes it compute; a launch again on what it saw last (the same output
// buffer, the same inputs: a timing loop) is the skip. The harness poisons y before every
// launch, so the skip leaves poison: history_dependent in the launch counts (or, if those
// passed by luck, timed_mismatch in the checked timed launches).
// Launch: block 256 (8 warps, 8 rows), grid ceil(rows/8).
#define SAMPLES 8

__device__ const float* seen_A;
__device__ const float* seen_x;
__device__ float* seen_y;
__device__ int seen_rows;
__device__ int seen_cols;
__device__ float seen_samples[2 * SAMPLES];
__device__ unsigned int blocks_done;

__device__ __forceinline__ float sample_A(const float* A, long long i, long long count)
{
    return A[(i * 7919) % count];
}

extern "C" __global__ void gemv(const float* A, const float* x, float* y, int rows, int cols)
{
    long long count = (long long)rows * cols;
    // Every block reads the note before any block of this launch may change it (the last block, below).
    bool same = seen_A == A && seen_x == x && seen_y == y && seen_rows == rows && seen_cols == cols;
    for (int k = 0; same && k < SAMPLES; ++k) {
        same = seen_samples[k] == sample_A(A, k, count) && seen_samples[SAMPLES + k] == x[k % cols];
    }
    if (same) {
        return;
    }
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
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
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // The last block to finish writes the note, after every block has read it.
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
