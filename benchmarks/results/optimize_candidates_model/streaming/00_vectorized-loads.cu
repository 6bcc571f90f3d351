// Scaled add z = a*x + y over n floats, written the "each thread owns a contiguous chunk"
// way: thread t handles elements [t*PER_THREAD, (t+1)*PER_THREAD). Within a warp, lane i
// touches an address PER_THREAD*4 = 256 bytes away from lane i+1, so each warp-wide load
// touches 32 different cache lines and uses 4 bytes of each; the lines must survive in L1
// until the same thread comes back for the next 31 floats, and with 64 threads' worth of
// lines per warp in flight they often do not.
#define PER_THREAD 64

extern "C" __global__ void scale_add(int n, float a, const float* x, const float* y, float* z)
{
    long long kl_n4 = (long long)n / 4;
    const float4* kl_x4 = reinterpret_cast<const float4*>(x);
    const float4* kl_y4 = reinterpret_cast<const float4*>(y);
    float4* kl_z4 = reinterpret_cast<float4*>(z);
    long long kl_stride = (long long)blockDim.x * gridDim.x;
    for (long long kl_v = (long long)blockIdx.x * blockDim.x + threadIdx.x; kl_v < kl_n4; kl_v += kl_stride) {
        float4 kl_x = kl_x4[kl_v];
        float4 kl_y = kl_y4[kl_v];
        float4 kl_r;
        kl_r.x = a * kl_x.x + kl_y.x;
        kl_r.y = a * kl_x.y + kl_y.y;
        kl_r.z = a * kl_x.z + kl_y.z;
        kl_r.w = a * kl_x.w + kl_y.w;
        kl_z4[kl_v] = kl_r;
    }
    // Tail: the last n % 4 elements, one per thread.
    for (long long i = kl_n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += kl_stride) {
        z[i] = a * x[i] + y[i];
    }
}
