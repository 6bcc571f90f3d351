/* llm.c dev/cuda/crossentropy_forward.cu: the kernel as written; host code dropped (see ORIGIN). */
#include "../_common/llmc_common.cuh"

__global__ void crossentropy_forward_kernel1(float* __restrict__ losses,
                            const float* __restrict__ probs, const int* __restrict__ targets,
                            int B, int T, int V) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < B * T) {
        int b = i / T;
        int t = i % T;
        const float* probs_bt = probs + b * T * V + t * V;
        int ix = targets[b * T + t];
        losses[b * T + t] = -logf(probs_bt[ix]);
    }
}
