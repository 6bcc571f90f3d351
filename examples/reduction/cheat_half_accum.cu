// BROKEN (precision drop): the shuffle reduction with every accumulator in half precision.
// A benchmark chunk of values in [0, 1) sums to about 8192, where half's spacing is 8: each
// thread's running sum reaches ~32, where adding values below 0.0156 is lost, and the
// warp and block totals round to 3 significant digits. Relative error ~1e-3, far above
// the spec's rtol 1e-4: mismatch. (Faster to no one's benefit; the loads are the cost.)
#include <cuda_fp16.h>

__device__ __forceinline__ __half warp_sum_h(__half v)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = __hadd(v, __shfl_down_sync(0xffffffffu, v, offset));
    }
    return v;
}

extern "C" __global__ void chunk_sum(const float* in, float* out, int n, int chunk)
{
    __shared__ __half warp_totals[32];
    long long begin = (long long)blockIdx.x * chunk;
    long long end = begin + chunk < n ? begin + chunk : n;
    __half acc = __float2half(0.0f);
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        acc = __hadd(acc, __float2half(in[i]));
    }
    __half v = warp_sum_h(acc);
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    if (lane == 0) {
        warp_totals[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        int nwarps = (blockDim.x + 31) >> 5;
        v = lane < nwarps ? warp_totals[lane] : __float2half(0.0f);
        v = warp_sum_h(v);
        if (lane == 0) {
            out[blockIdx.x] = __half2float(v);
        }
    }
}
