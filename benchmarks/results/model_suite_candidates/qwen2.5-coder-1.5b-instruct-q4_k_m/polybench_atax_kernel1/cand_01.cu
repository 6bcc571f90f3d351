/* PolyBench/GPU 1.0 (PolyBench-ACC) atax.cu: the CUDA kernel as written; host code dropped (see ORIGIN). */
#include "atax.cuh"
#include "../_common/polybench.cuh"

__global__ void atax_kernel1(int nx, int ny, DATA_TYPE *A, DATA_TYPE *x, DATA_TYPE *tmp) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < _PB_NX) { tmp[i] = 0; int j; for(j=0; j < _PB_NY; j++) { tmp[i] += A[i*NY+j] * x[j]; } } }
