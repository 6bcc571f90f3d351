// Scaled add z = a*x + y over n floats, written the "each thread owns a contiguous chunk"
// way: thread t handles elements [t*PER_THREAD, (t+1)*PER_THREAD). Within a warp, lane i
// touches an address PER_THREAD*4 = 256 bytes away from lane i+1, so each warp-wide load
// touches 32 different cache lines and uses 4 bytes of each; the lines must survive in L1
// until the same thread comes back for the next 31 floats, and with 64 threads' worth of
// lines per warp in flight they often do not.
#define PER_THREAD 64

extern "C" __global__ void scale_add(int n, float a, const float* x, const float* y, float* z)
{
    long long start = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * PER_THREAD;
    #pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        long long i = start + k;
        if (i < n) {
            z[i] = a * x[i] + y[i];
        }
    }
}
