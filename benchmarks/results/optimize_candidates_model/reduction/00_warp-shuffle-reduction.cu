// Chunked sum: out[b] = sum of in[b*chunk .. min((b+1)*chunk, n)), one block per chunk.
// Written as the textbook's first, naive shared-memory tree: the block loads 256 values
// into shared memory, halves them in an interleaved tree whose active threads are picked
// by `tid % (2*s) == 0` (an integer modulo by a non-constant, divergent warps, and a
// __syncthreads per step: 8 barriers per 256 floats), and adds the tile's total to a
// running sum held by thread 0. The arithmetic and barriers, not memory, set its speed.
// Launch: block 256 (a power of two; the tree assumes it), one block per chunk.
static __device__ __forceinline__ float kl_warp_sum_float_chunk_sum(float v)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

extern "C" __global__ void chunk_sum(const float* in, float* out, int n, int chunk)
{
    unsigned int tid = threadIdx.x;
    long long begin = (long long)blockIdx.x * chunk;
    long long end = begin + chunk < n ? begin + chunk : n;
    float total = 0.0f;
    // Each thread sums a strided slice in registers (4 independent accumulators), then
    // warps combine with shuffles and one shared-memory exchange between warps.
    __shared__ float kl_warp_totals[32];
    {
        float kl_a0 = 0, kl_a1 = 0, kl_a2 = 0, kl_a3 = 0;
        long long kl_step = blockDim.x;
        long long kl_i = begin + threadIdx.x;
        for (; kl_i + 3 * kl_step < end; kl_i += 4 * kl_step) {
            kl_a0 += in[kl_i];
            kl_a1 += in[kl_i + kl_step];
            kl_a2 += in[kl_i + 2 * kl_step];
            kl_a3 += in[kl_i + 3 * kl_step];
        }
        for (; kl_i < end; kl_i += kl_step) {
            kl_a0 += in[kl_i];
        }
        total = kl_warp_sum_float_chunk_sum((kl_a0 + kl_a1) + (kl_a2 + kl_a3));
    }
    if ((threadIdx.x & 31) == 0) {
        kl_warp_totals[threadIdx.x >> 5] = total;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        total = threadIdx.x < ((blockDim.x + 31) >> 5) ? kl_warp_totals[threadIdx.x] : 0;
        total = kl_warp_sum_float_chunk_sum(total);
        if (tid == 0) {
            out[blockIdx.x] = total;
        }
    }
}
