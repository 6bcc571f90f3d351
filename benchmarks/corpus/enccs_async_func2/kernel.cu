/* ENCCS cuda examples/3.02_TaskParallelism/Async2/Solution/async_gpu_2.cu: the kernel as written, with the constant it uses; host code dropped (see ORIGIN). */
#define BLOCK_SIZE 256

static constexpr int numIterations = 100;

__global__ void func2_kernel(const float* in1, const float* in2, float* out, int numElements)
{
    int i = threadIdx.x + blockIdx.x*blockDim.x;
    if (i < numElements)
    {
        float value1 = in1[numElements - i - 1];
        float value2 = in2[i];
        for (int iter = 0; iter < numIterations; iter++)
        {
            value2 = -sinf(value2);
        }
        out[i] = value1 + value2;
    }
}
