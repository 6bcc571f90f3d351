/* llm.c dev/cuda/attention_forward.cu: the kernel as written; host code dropped (see ORIGIN). */
#define ENABLE_BF16
#include "../_common/llmc_common.cuh"

template <typename T>
__device__ __forceinline__ T kl_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__global__ void attention_query_key_kernel1(float* preatt, const float* inp,
                                           int B, int T, int C, int NH) {
    const unsigned kl_lane = threadIdx.x & 31u;
    const unsigned long long kl_gwarp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const unsigned kl_vtid = (unsigned)(kl_gwarp % blockDim.x);
    const unsigned kl_vbid = (unsigned)(kl_gwarp / blockDim.x);

    int idx = kl_vbid * blockDim.x + kl_vtid;
    int total_threads = B * NH * T * T;

    if (idx < total_threads) {
        int t2 = idx % T;
        int t = (idx / T) % T;
        if (t2 > t) {
            // autoregressive mask
            preatt[idx] = -INFINITY;
            return;
        }
        int h = (idx / (T * T)) % NH;
        int b = idx / (NH * T * T);

        int C3 = C*3;
        int hs = C / NH; // head size
        const float* query_t = inp + b * T * C3 + t * C3 + h * hs;
        const float* key_t2 = inp + b * T * C3 + t2 * C3 + h * hs + C; // +C because it's key

        // (query_t) dot (key_t2)
        float val = 0.0f;
        { auto kl_init0_0 = val; val = 0;
        for (int i = (0) + kl_lane; i < hs; i += 32) {
            val += query_t[i] * key_t2[i];
        }
        val = kl_init0_0 + kl_warp_sum(val); }
        val *= 1.0 / sqrtf(hs);

        preatt[idx] = val;
    }
}
