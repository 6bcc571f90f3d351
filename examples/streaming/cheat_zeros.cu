// CHEAT (zeros for tiny outputs): writes 0 everywhere, moving a third of the bytes.
// Under spec_tiny.json the inputs are uniform(-1e-4, 1e-4) and the tolerance's atol is
// 1e-3, so every element passes |c - r| <= atol + rtol*|r|; only the harness's
// relative-norm guard ||c - r|| / ||r|| (= 1 here) rejects it.
extern "C" __global__ void scale_add(int n, float a, const float* x, const float* y, float* z)
{
    int n4 = n / 4;
    float4* z4 = reinterpret_cast<float4*>(z);
    int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        z4[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    int t = n4 * 4 + blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) {
        z[t] = 0.f;
    }
}
