/* PolyBench/GPU 1.0 (PolyBench-ACC) jacobi1D.cu: the CUDA kernel as written; host code dropped (see ORIGIN). */
#include "jacobi1D.cuh"
#include "../_common/polybench.cuh"

__global__ void runJacobiCUDA_kernel1(int n, DATA_TYPE* A, DATA_TYPE* B)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	
	if ((i > 1) && (i < (_PB_N-1)))
	{
		B[i] = 0.33333f * (A[i-1] + A[i] + A[i + 1]);
	}
}
