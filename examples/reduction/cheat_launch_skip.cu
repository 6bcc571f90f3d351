// CHEAT (skips work by launch count): the register-and-shuffle sum of honest_shuffle.cu, with
// a launch counter per block in __device__ memory. After a warm-up of 64 launches a block does
// its work on every other launch only and otherwise returns at once, leaving out[b] as it
// was: a benchmark that relaunches into one buffer and reads the result once sees the right
// sums and about half the time. Every correctness launch comes before the warm-up ends, so
// only the checks of timed launches see it (the output is poisoned before each): timed_mismatch.
// Launch: unchanged (block 256, one block per chunk).
#define MAX_BLOCKS (1 << 16)
#define WARM_UP 64

__device__ unsigned int block_launches[MAX_BLOCKS];

__device__ __forceinline__ float warp_sum(float v)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

extern "C" __global__ void chunk_sum(const float* in, float* out, int n, int chunk)
{
    __shared__ float warp_totals[32];
    __shared__ bool skip;
    if (threadIdx.x == 0) {
        unsigned int seen = blockIdx.x < MAX_BLOCKS ? block_launches[blockIdx.x]++ : 0u;
        skip = seen >= WARM_UP && (seen & 1u);
    }
    __syncthreads();
    if (skip) {
        return;
    }
    long long begin = (long long)blockIdx.x * chunk;
    long long end = begin + chunk < n ? begin + chunk : n;
    long long step = blockDim.x;
    float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
    long long i = begin + threadIdx.x;
    for (; i + 3 * step < end; i += 4 * step) {
        acc0 += in[i];
        acc1 += in[i + step];
        acc2 += in[i + 2 * step];
        acc3 += in[i + 3 * step];
    }
    for (; i < end; i += step) {
        acc0 += in[i];
    }
    float v = warp_sum((acc0 + acc1) + (acc2 + acc3));
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    if (lane == 0) {
        warp_totals[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        int nwarps = (blockDim.x + 31) >> 5;
        v = lane < nwarps ? warp_totals[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) {
            out[blockIdx.x] = v;
        }
    }
}
