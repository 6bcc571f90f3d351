// BROKEN (compile error): a rewrite that uses an undeclared variable (`lane` is never
// defined) and a missing semicolon. nvcc fails; the verdict is compile_error with
// nvcc's message, before any GPU time.
extern "C" __global__ void chunk_sum(const float* in, float* out, int n, int chunk)
{
    long long begin = (long long)blockIdx.x * chunk;
    long long end = begin + chunk < n ? begin + chunk : n;
    float acc = 0.0f
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        acc += in[i];
    }
    if (lane == 0) {
        atomicAdd(&out[blockIdx.x], acc);
    }
}
