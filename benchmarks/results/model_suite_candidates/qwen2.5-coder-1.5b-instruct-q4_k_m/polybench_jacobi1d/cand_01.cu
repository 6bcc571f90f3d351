/* PolyBench/GPU 1.0 (PolyBench-ACC) jacobi1D.cu: the CUDA kernel as written; host code dropped (see ORIGIN). */
#include "jacobi1D.cuh"
#include "../_common/polybench.cuh"

__global__ void runJacobiCUDA_kernel1(int n, DATA_TYPE* A, DATA_TYPE* B) { __ldg(&A[ threadIdx.x]); __ldg(&B[ threadIdx.x]); }
