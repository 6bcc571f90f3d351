// Coalesced, vectorized scaled add: a grid-stride loop over float4 (16-byte loads and
// stores, consecutive lanes on consecutive 16 bytes, so each warp access is 512 contiguous
// bytes), then a scalar tail for the last n % 4 elements. cudaMalloc'd buffers are
// 256-byte aligned, so the float4 casts are aligned.
// Launch: block 256, grid min(ceil(n/1024), 8192) (grid-stride covers the rest).
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
    // Tail: at most 3 elements, handled by the first threads of block 0.
    int t = n4 * 4 + blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) {
        z[t] = a * x[t] + y[t];
    }
}
