/* PolyBench-ACC CUDA/linear-algebra/kernels/bicg/bicg.cu: bicg_kernel2 as written; host code and bicg_kernel1 dropped. */
#include "bicg.cuh"
#include "polybench.cuh"

__global__ void bicg_kernel2(int nx, int ny, DATA_TYPE *A, DATA_TYPE *p, DATA_TYPE *q)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	
	if (i < _PB_NX)
	{
		q[i] = 0.0f;

		int j;
		for(j=0; j < _PB_NY; j++)
		{
			q[i] += A[i * NY + j] * p[j];
		}
	}
}
