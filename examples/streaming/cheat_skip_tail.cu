// BROKEN (skipped tail): the float4 loop without the scalar tail, so the last n % 4
// elements are never written. Passes whenever n is a multiple of 4 (the benchmark size
// is); the spec's variants with n % 4 != 0 leave those outputs as the harness's poison.
extern "C" __global__ void scale_add(int n, float a, const float* x, const float* y, float* z)
{
    int n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* y4 = reinterpret_cast<const float4*>(y);
    float4* z4 = reinterpret_cast<float4*>(z);
    int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 xv = x4[i];
        float4 yv = y4[i];
        z4[i] = make_float4(a * xv.x + yv.x, a * xv.y + yv.y, a * xv.z + yv.z, a * xv.w + yv.w);
    }
}
