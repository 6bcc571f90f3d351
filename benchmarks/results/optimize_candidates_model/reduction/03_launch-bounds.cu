// Chunked sum: out[b] = sum of in[b*chunk .. min((b+1)*chunk, n)), one block per chunk.
// Written as the textbook's first, naive shared-memory tree: the block loads 256 values
// into shared memory, halves them in an interleaved tree whose active threads are picked
// by `tid % (2*s) == 0` (an integer modulo by a non-constant, divergent warps, and a
// __syncthreads per step: 8 barriers per 256 floats), and adds the tile's total to a
// running sum held by thread 0. The arithmetic and barriers, not memory, set its speed.
// Launch: block 256 (a power of two; the tree assumes it), one block per chunk.
extern "C" __global__ void __launch_bounds__(256) chunk_sum(const float* in, float* out, int n, int chunk)
{
    extern __shared__ float buf[];
    unsigned int tid = threadIdx.x;
    long long begin = (long long)blockIdx.x * chunk;
    long long end = begin + chunk < n ? begin + chunk : n;
    float total = 0.0f;
    for (long long base = begin; base < end; base += blockDim.x) {
        long long i = base + tid;
        buf[tid] = i < end ? in[i] : 0.0f;
        __syncthreads();
        for (unsigned int s = 1; s < blockDim.x; s *= 2) {
            if (tid % (2 * s) == 0) {
                buf[tid] += buf[tid + s];
            }
            __syncthreads();
        }
        if (tid == 0) {
            total += buf[0];
        }
        __syncthreads();
    }
    if (tid == 0) {
        out[blockIdx.x] = total;
    }
}
