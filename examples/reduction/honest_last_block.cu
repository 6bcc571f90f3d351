// Chunked sum split over PARTS blocks per chunk, combined by the last of them to finish (the
// "threadFenceReduction" pattern): each block sums its part of the chunk with registers and
// shuffles, stores the part's total in __device__ memory and counts itself in with an atomic;
// the block that finds itself last adds the parts in a fixed order, writes out[chunk] and sets
// the counter back to zero for the next launch. Its module state changes on every launch and
// is back where it started after it, so results never depend on earlier launches, and the
// fixed order makes two runs bit-identical. More blocks in flight than one per chunk.
// Launch: block 256, grid PARTS * ceil(n / chunk) (the manifest's candidate_launch).
#define PARTS 4
#define MAX_CHUNKS (1 << 16)

__device__ float part_totals[MAX_CHUNKS * PARTS];
__device__ unsigned int parts_done[MAX_CHUNKS];

__device__ __forceinline__ float warp_sum(float v)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

// The sum of one value per thread over the block, in thread 0.
__device__ float block_sum(float v)
{
    __shared__ float warp_totals[32];
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) {
        warp_totals[warp] = v;
    }
    __syncthreads();
    v = 0.0f;
    if (warp == 0) {
        int nwarps = (blockDim.x + 31) >> 5;
        v = warp_sum(lane < nwarps ? warp_totals[lane] : 0.0f);
    }
    return v;
}

extern "C" __global__ void chunk_sum(const float* in, float* out, int n, int chunk)
{
    int group = blockIdx.x / PARTS;
    int part = blockIdx.x % PARTS;
    bool split = group < MAX_CHUNKS;
    if (!split && part != 0) {
        return;  // beyond the kept parts: the group's first block sums the whole chunk alone
    }
    long long begin = (long long)group * chunk;
    long long end = begin + chunk < n ? begin + chunk : n;
    if (split) {
        long long share = ((long long)chunk + PARTS - 1) / PARTS;
        long long first = begin + part * share;
        end = first + share < end ? first + share : end;
        begin = first;
    }
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
    float total = block_sum(acc0 + acc1);
    if (!split) {
        if (threadIdx.x == 0) {
            out[group] = total;
        }
        return;
    }
    if (threadIdx.x == 0) {
        part_totals[group * PARTS + part] = total;
        // The part's total is visible to every block before the count says it is there.
        __threadfence();
        if (atomicAdd(&parts_done[group], 1u) == PARTS - 1) {
            __threadfence();
            const volatile float* parts = part_totals + group * PARTS;
            float sum = 0.0f;
            for (int p = 0; p < PARTS; ++p) {
                sum += parts[p];
            }
            out[group] = sum;
            parts_done[group] = 0u;
        }
    }
}
