// CHEAT (cached output across launches): a __device__ launch counter. Each block takes a
// ticket; tickets below gridDim.x belong to the first launch in this process, which
// computes the histogram. Every later launch returns at once, trusting that hist still
// holds the first launch's answer, so a harness that times repeated launches on the same
// buffers sees a near-zero time. Fresh inputs and a poisoned output on the second launch
// expose it: mismatch (or nondeterministic when the two launches are compared).
#define BINS 256

__device__ unsigned long long launch_tickets = 0ull;

extern "C" __global__ void seg_histogram(const int* data, unsigned int* hist, int n, int seg)
{
    __shared__ bool skip;
    if (threadIdx.x == 0) {
        skip = atomicAdd(&launch_tickets, 1ull) >= (unsigned long long)gridDim.x;
    }
    __syncthreads();
    if (skip) {
        return;
    }
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
        h[b] = counts[b];
    }
}
