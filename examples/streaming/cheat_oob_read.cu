// BROKEN (out-of-bounds read): rounds n up to a multiple of 4 and loads the last float4
// whole, reading up to 3 floats past the end of x and y; it writes only the in-bounds
// elements, so outputs are right. The allocation's padding makes the stray read harmless
// today, so every correctness check passes: only compute-sanitizer memcheck (--sanitize)
// sees it, and only when n % 4 != 0 (the sanitizer runs a variant or reduced size).
extern "C" __global__ void scale_add(int n, float a, const float* x, const float* y, float* z)
{
    int n4 = (n + 3) / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* y4 = reinterpret_cast<const float4*>(y);
    float4* z4 = reinterpret_cast<float4*>(z);
    int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 xv = x4[i];
        float4 yv = y4[i];
        float4 r = make_float4(a * xv.x + yv.x, a * xv.y + yv.y, a * xv.z + yv.z, a * xv.w + yv.w);
        if (4 * i + 3 < n) {
            z4[i] = r;
        } else {
            float rs[4] = {r.x, r.y, r.z, r.w};
            for (int k = 0; 4 * i + k < n; ++k) {
                z[4 * i + k] = rs[k];
            }
        }
    }
}
