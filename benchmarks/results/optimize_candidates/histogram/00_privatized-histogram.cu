// Per-segment 256-bin histograms (e.g. per-tile histograms for local contrast
// equalization): hist[s*256 + v] counts the values v = data[i] & 255 for i in segment s,
// segments of `seg` elements, one block per segment. The block zeroes its own 256 bins,
// then every element does an atomicAdd on global memory: 64M atomics resolved in L2,
// each a round trip, with same-bin collisions serialized.
// Launch: block 256, one block per segment.
#define BINS 256

extern "C" __global__ void seg_histogram(const int* data, unsigned int* hist, int n, int seg)
{
    // Privatized bins: shared-memory atomics resolve in the SM; one flush per block.
    __shared__ unsigned int kl_bins[256];
    for (int kl_b = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)); kl_b < 256; kl_b += (blockDim.x * blockDim.y * blockDim.z)) {
        kl_bins[kl_b] = 0;
    }
    __syncthreads();

    unsigned int* h = hist + (long long)blockIdx.x * BINS;
    for (int b = threadIdx.x; b < BINS; b += blockDim.x) {
        h[b] = 0u;
    }
    // The barrier orders the zeroing before the block's atomics (same block, global memory).
    __syncthreads();
    long long begin = (long long)blockIdx.x * seg;
    long long end = begin + seg < n ? begin + seg : n;
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        atomicAdd(&kl_bins[data[i] & (BINS - 1)], 1u);
    }

    __syncthreads();
    for (int kl_b = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)); kl_b < 256; kl_b += (blockDim.x * blockDim.y * blockDim.z)) {
        if (kl_bins[kl_b] != 0) {
            atomicAdd(&h[kl_b], kl_bins[kl_b]);
        }
    }
}
