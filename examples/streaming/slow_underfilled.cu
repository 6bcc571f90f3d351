// CORRECT BUT SLOWER: the coalesced grid-stride loop, launched (by its manifest entry)
// with only 16 blocks of 256 threads. 16 of the H200's 132 SMs cannot keep enough bytes in
// flight to approach memory bandwidth, so it is several times slower than the original:
// the harness must answer not_faster, not accept it because it is correct.
extern "C" __global__ void scale_add(int n, float a, const float* x, const float* y, float* z)
{
    int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        z[i] = a * x[i] + y[i];
    }
}
