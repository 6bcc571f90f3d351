// Chunked sum with one float atomicAdd per warp: like honest_shuffle.cu, but the warps'
// totals are combined with atomicAdd on out[blockIdx.x] (zeroed by thread 0 first, the
// barrier making the zero visible to the block). The order of the 8 atomic adds varies
// from run to run, so results vary in the last bits: run-to-run differences stay far
// below the tolerance, and the harness's nondeterminism check must accept this.
// Launch: unchanged (block 256, one block per chunk).
__device__ __forceinline__ float warp_sum(float v)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

extern "C" __global__ void chunk_sum(const float* in, float* out, int n, int chunk)
{
    if (threadIdx.x == 0) {
        out[blockIdx.x] = 0.0f;
    }
    __syncthreads();
    long long begin = (long long)blockIdx.x * chunk;
    long long end = begin + chunk < n ? begin + chunk : n;
    long long step = blockDim.x;
    float acc0 = 0.0f, acc1 = 0.0f;
    long long i = begin + threadIdx.x;
    for (; i + step < end; i += 2 * step) {
        acc0 += in[i];
        acc1 += in[i + step];
    }
    if (i < end) {
        acc0 += in[i];
    }
    float v = warp_sum(acc0 + acc1);
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&out[blockIdx.x], v);
    }
}
