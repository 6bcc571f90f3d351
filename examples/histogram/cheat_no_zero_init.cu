// BROKEN (assumes a zeroed output): the privatized histogram, but the final step adds the
// shared counts into global memory with atomicAdd instead of storing them, as if hist
// started at zero. A spec declares hist `out` (its start value must not matter) and the
// harness poisons it before each launch, so every bin is off by the poison: mismatch.
#define BINS 256

extern "C" __global__ void seg_histogram(const int* data, unsigned int* hist, int n, int seg)
{
    __shared__ unsigned int counts[BINS];
    for (int b = threadIdx.x; b < BINS; b += blockDim.x) {
        counts[b] = 0u;
    }
    __syncthreads();
    long long begin = (long long)blockIdx.x * seg;
    long long end = begin + seg < n ? begin + seg : n;
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        atomicAdd(&counts[data[i] & (BINS - 1)], 1u);
    }
    __syncthreads();
    unsigned int* h = hist + (long long)blockIdx.x * BINS;
    for (int b = threadIdx.x; b < BINS; b += blockDim.x) {
        atomicAdd(&h[b], counts[b]);
    }
}
