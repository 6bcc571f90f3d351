/* llm.c dev/cuda/gelu_forward.cu: the kernel as written; host code dropped (see ORIGIN). */
#define ENABLE_BF16
#include "../_common/llmc_common.cuh"

#include <math.h>
#define GELU_SCALING_FACTOR sqrtf(2.0f / M_PI)

__global__ void __launch_bounds__(256) gelu_forward_kernel1(floatX* out, const floatX* inp, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        float xi = inp[i];
        float cube = 0.044715f * xi * xi * xi;
        out[i] = 0.5f * xi * (1.0f + tanhf(GELU_SCALING_FACTOR * (xi + cube)));
    }
}
